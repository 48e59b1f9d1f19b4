//! Data: datasets in memory (the built-in digits, arrays, `.npy`, CSV and IDX files such as
//! MNIST and Fashion-MNIST), splits, and the [`DataLoader`] that shuffles, transforms and
//! batches them on a background thread; and [`text`] for language models.
//!
//! A [`Dataset`] holds one row of `f32` features per example with the shape of one example
//! (`[64]` for the digits, `[1, 28, 28]` for MNIST-format images) and an integer class label.
//! Orders are seeded: the same seed gives the same batches on every run and every machine.

mod files;
mod idx;
mod loader;
pub mod text;
mod transform;

pub use files::{csv, npy};
pub use idx::{
    FASHION_MNIST_DIR, FASHION_MNIST_HINT, ImageSource, Images, digit_images, images, mnist,
    read_idx,
};
pub use loader::{Batches, DataLoader};
pub use transform::{Normalize, RandomCrop, RandomHorizontalFlip, Transform};

use kiln_backend::Array;
use kiln_backend::random::Stream;
use ndarray::{Array2, ArrayD, Axis, IxDyn};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The UCI handwritten digits (8×8 images, 1,797 of them), compiled into the library.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// Why data could not be read or batched.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// Decompression failed.
    #[error("cannot decompress the digits data: {0}")]
    Decompress(#[from] std::io::Error),
    /// A line is malformed.
    #[error("digits data, line {line}: {message}")]
    Parse {
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A file that is missing, unreadable, truncated or not what it should be.
    #[error("{}: {message}", path.display())]
    File {
        /// The file (or folder).
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Arrays that do not make a dataset (counts or labels that disagree).
    #[error("{0}")]
    Invalid(String),
    /// A global batch that the ranks cannot share equally.
    #[error(
        "a global batch of {global} rows does not split evenly over {ranks} ranks; \
         choose a multiple of {ranks}"
    )]
    UnevenShards {
        /// The global batch size.
        global: usize,
        /// The number of ranks.
        ranks: usize,
    },
}

impl DataError {
    fn file(path: &Path, message: impl std::fmt::Display) -> DataError {
        DataError::File {
            path: path.to_owned(),
            message: message.to_string(),
        }
    }
}

/// Examples in memory: one row of `f32` features per example, with the shape of one example,
/// and an integer class label each.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// One row of features per example (an example's values in row-major order).
    pub features: Array2<f32>,
    /// The shape of one example: `[64]` for the digits, `[1, 28, 28]` for MNIST images.
    pub sample_shape: Vec<usize>,
    /// The label of each example, in `0..classes`.
    pub labels: Vec<i64>,
    /// The number of classes.
    pub classes: usize,
}

/// One batch, ready to feed: features `f32[b, ...sample_shape]`, labels `i64[b]`.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The features.
    pub x: Array,
    /// The labels.
    pub y: Array,
}

impl Batch {
    /// The number of examples.
    pub fn len(&self) -> usize {
        self.y.shape().first().copied().unwrap_or(0)
    }

    /// Whether the batch holds no examples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The digits: pixel counts scaled to [0, 1], labels 0..9, each example `[64]` (see
/// [`Dataset::with_sample_shape`] for `[1, 8, 8]` images).
pub fn digits() -> Result<Dataset, DataError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS_CSV_GZ).read_to_string(&mut text)?;
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split(',').collect();
        let parse_error = |message: String| DataError::Parse {
            line: i + 1,
            message,
        };
        if fields.len() != 65 {
            return Err(parse_error(format!("{} fields, expected 65", fields.len())));
        }
        for f in &fields[..64] {
            let v: f32 = f
                .trim()
                .parse()
                .map_err(|_| parse_error(format!("`{f}` is not a number")))?;
            pixels.push(v / 16.0);
        }
        let label: i64 = fields[64]
            .trim()
            .parse()
            .map_err(|_| parse_error(format!("label `{}`", fields[64])))?;
        labels.push(label);
    }
    let features = ArrayD::from_shape_vec(IxDyn(&[labels.len(), 64]), pixels)
        .map_err(|e| DataError::Invalid(e.to_string()))?;
    Dataset::new(features, labels, Some(10))
}

/// A seeded Fisher–Yates shuffle of `0..n`.
pub(crate) fn permutation(n: usize, seed: u64) -> Vec<usize> {
    let stream = Stream::new(seed, 0);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (stream.bits(i as u64) % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

impl Dataset {
    /// A dataset of `features` (`[n, ...]`: `n` examples of shape `...`) and their `labels`,
    /// in `0..classes` (by default, one more than the largest label). Counts that differ, or a
    /// label outside the classes, are errors naming the first such example.
    pub fn new(
        features: ArrayD<f32>,
        labels: Vec<i64>,
        classes: Option<usize>,
    ) -> Result<Dataset, DataError> {
        let (&n, sample_shape) = features.shape().split_first().ok_or_else(|| {
            DataError::Invalid("features need a leading example axis, got a scalar".into())
        })?;
        if n != labels.len() {
            return Err(DataError::Invalid(format!(
                "{n} examples of features but {} labels",
                labels.len()
            )));
        }
        let classes =
            classes.unwrap_or_else(|| labels.iter().max().map_or(0, |&m| m.max(-1) + 1) as usize);
        if let Some((i, l)) =
            (labels.iter().enumerate()).find(|(_, l)| !(0..classes as i64).contains(l))
        {
            return Err(DataError::Invalid(format!(
                "label {l} of example {i} is outside the {classes} classes 0..{classes}"
            )));
        }
        let sample_shape = sample_shape.to_vec();
        let width: usize = sample_shape.iter().product();
        let features = features
            .as_standard_layout()
            .into_owned()
            .into_shape_with_order((n, width))
            .map_err(|e| DataError::Invalid(e.to_string()))?;
        Ok(Dataset {
            features,
            sample_shape,
            labels,
            classes,
        })
    }

    /// The same examples seen with another shape (`[1, 8, 8]` for the digits as images); the
    /// number of values per example must stay the same.
    pub fn with_sample_shape(mut self, shape: &[usize]) -> Result<Dataset, DataError> {
        if shape.iter().product::<usize>() != self.features.ncols() {
            return Err(DataError::Invalid(format!(
                "an example has {} values ({:?}); it cannot be seen as {shape:?}",
                self.features.ncols(),
                self.sample_shape
            )));
        }
        self.sample_shape = shape.to_vec();
        Ok(self)
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no examples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The rows at `rows`, in that order.
    pub fn select(&self, rows: &[usize]) -> Dataset {
        Dataset {
            features: self.features.select(Axis(0), rows),
            sample_shape: self.sample_shape.clone(),
            labels: rows.iter().map(|&r| self.labels[r]).collect(),
            classes: self.classes,
        }
    }

    /// A shuffled split into (train, test) with `test_fraction` of the rows in test.
    pub fn split(&self, test_fraction: f64, seed: u64) -> Result<(Dataset, Dataset), DataError> {
        if !(0.0..=1.0).contains(&test_fraction) {
            return Err(DataError::Invalid(format!(
                "split: the test fraction {test_fraction} must be between 0 and 1"
            )));
        }
        let order = permutation(self.len(), seed);
        let n_test = (self.len() as f64 * test_fraction).round() as usize;
        Ok((self.select(&order[n_test..]), self.select(&order[..n_test])))
    }

    /// Every row as one batch.
    pub fn all(&self) -> Batch {
        self.batch(&(0..self.len()).collect::<Vec<_>>())
    }

    /// The rows at `rows` as one batch: `x` of shape `[rows.len(), ...sample_shape]`.
    pub fn batch(&self, rows: &[usize]) -> Batch {
        let mut shape = vec![rows.len()];
        shape.extend(&self.sample_shape);
        let x = self
            .features
            .select(Axis(0), rows)
            .into_shape_with_order(IxDyn(&shape))
            .expect("a row holds one example");
        let labels = rows.iter().map(|&r| self.labels[r]).collect();
        let y = ArrayD::from_shape_vec(IxDyn(&[rows.len()]), labels).expect("one label per row");
        Batch {
            x: Array::F32(x),
            y: Array::I64(y),
        }
    }

    /// Batches of `size` rows (the last may be smaller), shuffled with `seed` when given.
    /// [`DataLoader`] does the same with transforms, prefetching and sharding.
    pub fn batches(&self, size: usize, seed: Option<u64>) -> Vec<Batch> {
        let order = match seed {
            Some(s) => permutation(self.len(), s),
            None => (0..self.len()).collect(),
        };
        order
            .chunks(size.max(1))
            .map(|rows| self.batch(rows))
            .collect()
    }

    /// Rank `rank`'s shares of global batches of `global` rows, for data-parallel training
    /// over `ranks` ranks: each global batch (shuffled with `seed` when given, as
    /// [`Dataset::batches`]) split into `ranks` equal, consecutive shares. The mean of the
    /// ranks' mean gradients is then the global batch's mean gradient. A last global batch
    /// with fewer than `global` rows is dropped (its shares could not be equal), and a
    /// `global` that is not a multiple of `ranks` is an error.
    pub fn shards(
        &self,
        global: usize,
        rank: usize,
        ranks: usize,
        seed: Option<u64>,
    ) -> Result<Vec<Batch>, DataError> {
        let order = match seed {
            Some(s) => permutation(self.len(), s),
            None => (0..self.len()).collect(),
        };
        let share = shard_share(global, rank, ranks)?;
        Ok(order
            .chunks_exact(global)
            .map(|rows| self.batch(&rows[share.clone()]))
            .collect())
    }
}

/// The positions of rank `rank`'s share within a global batch of `global` rows.
pub(crate) fn shard_share(
    global: usize,
    rank: usize,
    ranks: usize,
) -> Result<std::ops::Range<usize>, DataError> {
    if ranks == 0 || global == 0 || !global.is_multiple_of(ranks) || rank >= ranks {
        return Err(DataError::UnevenShards { global, ranks });
    }
    let share = global / ranks;
    Ok(rank * share..(rank + 1) * share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_load_and_split() {
        let d = digits().unwrap();
        assert_eq!(d.len(), 1797);
        assert_eq!(d.features.dim(), (1797, 64));
        assert!(d.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(d.labels.iter().all(|&l| (0..10).contains(&l)));
        let (train, test) = d.split(0.2, 7).unwrap();
        assert_eq!((train.len(), test.len()), (1438, 359));
        let batches = train.batches(100, Some(1));
        assert_eq!(batches.len(), 15);
        assert_eq!(batches[14].x.shape(), &[38, 64]);
        let mut order = permutation(50, 3);
        order.sort();
        assert_eq!(order, (0..50).collect::<Vec<_>>());
    }
}
