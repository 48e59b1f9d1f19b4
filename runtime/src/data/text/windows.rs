//! [`TextDataset`]: a token sequence split into training and validation parts, and batches of
//! windows drawn from either as nanoGPT's `get_batch` draws them.

use super::super::{Batch, DataError};
use kiln_backend::Array;
use kiln_backend::random::Stream;
use ndarray::{ArrayD, IxDyn};
use std::ops::Range;
use std::sync::Arc;

/// A token sequence for next-token prediction: the first part trains, the rest validates.
///
/// A window is `block_size` tokens `x` starting anywhere in a part, and `y` the same window
/// one token later. Batch `step` of a part draws its window starts from `Stream(seed, step)`:
/// the same batches on every run and machine, and a run resumed at step `s` sees what the
/// uninterrupted run saw (the position is the step, nothing else).
///
/// ```
/// use kiln_runtime::data::text::{self, TextDataset, Tokenizer};
/// let corpus = text::sonnets()?;
/// let tokenizer = Tokenizer::chars(&corpus.text);
/// let data = TextDataset::new(tokenizer.encode(&corpus.text)?, 64, 0.1)?;
/// let batch = data.train().batch(12, 1337, 0)?;
/// assert_eq!(batch.x.shape(), &[12, 64]);
/// # Ok::<(), kiln_runtime::data::DataError>(())
/// ```
#[derive(Clone, Debug)]
pub struct TextDataset {
    tokens: Arc<[u32]>,
    block_size: usize,
    split: usize,
}

/// One part of a [`TextDataset`]: its tokens and the window length.
#[derive(Clone, Debug)]
pub struct TokenWindows {
    tokens: Arc<[u32]>,
    range: Range<usize>,
    block_size: usize,
}

impl TextDataset {
    /// `tokens`, the last `validation_fraction` of them validating (nanoGPT: 0.1), in windows
    /// of `block_size`. Each part must hold at least one window and its next token.
    pub fn new(
        tokens: Vec<u32>,
        block_size: usize,
        validation_fraction: f64,
    ) -> Result<TextDataset, DataError> {
        if !(0.0..1.0).contains(&validation_fraction) {
            return Err(DataError::Invalid(format!(
                "a validation fraction of {validation_fraction}: it must be in [0, 1)"
            )));
        }
        let n = tokens.len();
        let split = n - (n as f64 * validation_fraction).round() as usize;
        let dataset = TextDataset {
            tokens: tokens.into(),
            block_size,
            split,
        };
        let too_short = |part: &TokenWindows| part.range.len() <= block_size;
        if block_size == 0 || too_short(&dataset.train()) {
            return Err(DataError::Invalid(format!(
                "{n} tokens leave {split} to train on: windows of {block_size} need at least {}",
                block_size + 1
            )));
        }
        let validation = dataset.validation();
        if !validation.range.is_empty() && too_short(&validation) {
            return Err(DataError::Invalid(format!(
                "{n} tokens leave {} to validate on: windows of {block_size} need at least {}",
                validation.range.len(),
                block_size + 1
            )));
        }
        Ok(dataset)
    }

    /// The window length.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// All the tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The training part (the first tokens).
    pub fn train(&self) -> TokenWindows {
        self.part(0..self.split)
    }

    /// The validation part (the last tokens; empty with a validation fraction of 0).
    pub fn validation(&self) -> TokenWindows {
        self.part(self.split..self.tokens.len())
    }

    fn part(&self, range: Range<usize>) -> TokenWindows {
        TokenWindows {
            tokens: self.tokens.clone(),
            range,
            block_size: self.block_size,
        }
    }
}

impl TokenWindows {
    /// The part's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens[self.range.clone()]
    }

    /// How many windows start in the part (each needs its next token too).
    pub fn starts(&self) -> usize {
        self.range.len().saturating_sub(self.block_size)
    }

    /// Batch `step` of `batch_size` windows at starts drawn uniformly from `Stream(seed, step)`:
    /// `x` and `y` are `i64[batch_size, block_size]`, `y` one token later than `x`. An empty
    /// part (a validation fraction of 0) has no window to draw: an error.
    pub fn batch(&self, batch_size: usize, seed: u64, step: u64) -> Result<Batch, DataError> {
        let starts = self.starts() as u64;
        if starts == 0 {
            return Err(DataError::Invalid(
                "no window to draw: this part of the text dataset is empty".into(),
            ));
        }
        let stream = Stream::new(seed, step);
        let at: Vec<usize> = (0..batch_size as u64)
            .map(|i| (stream.bits(i) % starts) as usize)
            .collect();
        Ok(self.windows_at(&at))
    }

    /// The windows at `starts` (offsets into the part), as [`TokenWindows::batch`] gives them;
    /// `starts` must be below [`TokenWindows::starts`].
    pub fn windows_at(&self, starts: &[usize]) -> Batch {
        let tokens = self.tokens();
        let window = |offset: usize| {
            starts.iter().flat_map(move |&s| {
                tokens[s + offset..s + offset + self.block_size]
                    .iter()
                    .map(|&t| i64::from(t))
            })
        };
        let shape = IxDyn(&[starts.len(), self.block_size]);
        let array = |values: Vec<i64>| {
            let values = ArrayD::from_shape_vec(shape.clone(), values);
            Array::I64(values.expect("batch × block values"))
        };
        Batch {
            x: array(window(0).collect()),
            y: array(window(1).collect()),
        }
    }

    /// The part cut into consecutive windows (the last partial one dropped), `batch_size` at a
    /// time: every token predicted once, for a validation loss that does not sample.
    pub fn sequential(&self, batch_size: usize) -> impl Iterator<Item = Batch> + '_ {
        let windows = self.range.len().saturating_sub(1) / self.block_size;
        let per_batch = batch_size.max(1);
        (0..windows).step_by(per_batch).map(move |first| {
            let last = (first + per_batch).min(windows);
            let starts: Vec<usize> = (first..last).map(|w| w * self.block_size).collect();
            self.windows_at(&starts)
        })
    }
}

/// A part's windows as a trainer reads them: `steps` batches an epoch, batch `i` of epoch `e`
/// drawn as [`TokenWindows::batch`] draws step `e·steps + i` — so an epoch is a stretch of
/// steps, and a run resumed mid-epoch sees the batches an uninterrupted one saw. For
/// validation, [`TextBatches::same_each_epoch`] measures every epoch on the same batches.
#[derive(Clone, Debug)]
pub struct TextBatches {
    windows: TokenWindows,
    batch_size: usize,
    steps: usize,
    seed: u64,
    repeat: bool,
}

impl TextBatches {
    /// `steps` batches of `batch_size` windows of `windows` an epoch, drawn with `seed`.
    pub fn new(windows: TokenWindows, batch_size: usize, steps: usize, seed: u64) -> TextBatches {
        TextBatches {
            windows,
            batch_size,
            steps,
            seed,
            repeat: false,
        }
    }

    /// The same batches every epoch (those of epoch 0).
    pub fn same_each_epoch(self) -> TextBatches {
        TextBatches {
            repeat: true,
            ..self
        }
    }

    /// Batches an epoch.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Batch `index` of `epoch`.
    pub fn batch(&self, epoch: usize, index: usize) -> Result<Batch, DataError> {
        let epoch = if self.repeat { 0 } else { epoch };
        let step = (epoch * self.steps + index) as u64;
        self.windows.batch(self.batch_size, self.seed, step)
    }
}
