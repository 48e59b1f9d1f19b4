//! The training loop, written once: [`Trainer`] runs a [`Learner`] over a [`DataLoader`] for
//! some epochs — events with callbacks, metrics (loss, accuracy, top-k), a progress bar with
//! rate and ETA, validation, checkpoints (atomic, mid-epoch too) and `resume`, early stopping —
//! and keeps a [`History`] that plots to SVG.

mod learner;
mod metrics;

pub use learner::{EagerClassifier, Learner, StaticClassifier, Step};
pub use metrics::{ConfusionMatrix, Metrics};

use indicatif::{ProgressBar, ProgressStyle};
use kiln_backend::Array;
use kiln_ir::{DType, Shape, Type};
use kiln_runtime::RuntimeError;
use kiln_runtime::checkpoint::{self, CheckpointError};
use kiln_runtime::data::text::TextBatches;
use kiln_runtime::data::{Batch, DataError, DataLoader};
use kiln_runtime::eager::EagerError;
use metrics::Running;
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Where a trainer's batches come from, epoch by epoch: a [`DataLoader`] over a dataset, or
/// [`TextBatches`] of token windows (an epoch is a stretch of steps).
pub trait BatchSource {
    /// Batches in an epoch.
    fn batches_per_epoch(&self) -> usize;

    /// The batches of `epoch` from its `first` on: where a run resumed mid-epoch goes on.
    fn epoch_from(&self, epoch: usize, first: usize) -> Result<BatchIter<'_>, DataError>;
}

/// An epoch's batches, as a [`BatchSource`] gives them.
pub type BatchIter<'a> = Box<dyn Iterator<Item = Result<Batch, DataError>> + 'a>;

impl BatchSource for DataLoader {
    fn batches_per_epoch(&self) -> usize {
        self.len()
    }

    fn epoch_from(&self, epoch: usize, first: usize) -> Result<BatchIter<'_>, DataError> {
        Ok(Box::new(DataLoader::epoch_from(self, epoch, first)?))
    }
}

impl BatchSource for TextBatches {
    fn batches_per_epoch(&self) -> usize {
        self.steps()
    }

    fn epoch_from(&self, epoch: usize, first: usize) -> Result<BatchIter<'_>, DataError> {
        Ok(Box::new(
            (first..self.steps()).map(move |i| self.batch(epoch, i)),
        ))
    }
}

/// Why training stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Reading or batching data failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Running a static program failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Running eager code failed.
    #[error(transparent)]
    Eager(#[from] EagerError),
    /// Writing or reading a checkpoint failed (a failed write leaves the previous one).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// Drawing a plot failed.
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    /// A checkpoint that is not this trainer's.
    #[error("{0}")]
    Invalid(String),
}

impl From<TrainError> for RuntimeError {
    fn from(e: TrainError) -> RuntimeError {
        match e {
            TrainError::Runtime(e) => e,
            TrainError::Data(e) => RuntimeError::Data(e),
            other => RuntimeError::Usage(other.to_string()),
        }
    }
}

/// What happens, in order, as the trainer runs; callbacks see each one.
#[derive(Clone, Copy, Debug)]
pub enum Event<'a> {
    /// An epoch (from 0) begins.
    EpochBegin {
        /// The epoch.
        epoch: usize,
    },
    /// A step is about to run on batch `step` (from 0) of `epoch`.
    StepBegin {
        /// The epoch.
        epoch: usize,
        /// The batch within the epoch.
        step: usize,
    },
    /// The step ran.
    StepEnd {
        /// The epoch.
        epoch: usize,
        /// The batch within the epoch.
        step: usize,
        /// The batch's mean loss.
        loss: f64,
    },
    /// An epoch ended (after validation).
    EpochEnd {
        /// What it measured.
        record: &'a EpochRecord,
    },
}

/// What a callback tells the trainer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Go on.
    Continue,
    /// Stop after this event (`fit` returns; a later `fit` goes on from here).
    Stop,
}

/// One epoch's measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochRecord {
    /// The epoch, from 0.
    pub epoch: usize,
    /// On the training batches, as they were trained on.
    pub train: Metrics,
    /// On the validation set, after the epoch (when there is one).
    pub validation: Option<Metrics>,
    /// Seconds the epoch took (training and validation).
    pub seconds: f64,
}

/// Every epoch's measurements and every step's loss.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// One record per finished epoch.
    pub epochs: Vec<EpochRecord>,
    /// The loss of each step.
    pub step_losses: Vec<f64>,
    /// Why `fit` stopped before its last epoch, if it did.
    pub stopped: Option<String>,
}

impl History {
    /// Draws the loss and accuracy per epoch (training and validation) as an SVG.
    pub fn plot(&self, path: &Path) -> Result<(), TrainError> {
        Ok(crate::plot::history(path, self)?)
    }
}

/// Stop when the validation loss (the training loss without validation) has not improved by
/// `min_delta` for `patience` epochs.
#[derive(Clone, Copy, Debug)]
pub struct EarlyStopping {
    /// Epochs without improvement before stopping.
    pub patience: usize,
    /// The least decrease that counts as an improvement.
    pub min_delta: f64,
}

/// Where training stands: the next batch to train on, and the sums of the epoch so far.
#[derive(Clone, Debug, Default, PartialEq)]
struct Position {
    epoch: usize,
    step: usize,
    running: Running,
}

type Callback<'a> = Box<dyn FnMut(&Event) -> Control + 'a>;

/// Trains a [`Learner`]; see the module's documentation.
///
/// ```
/// use kiln::runtime::data::{self, DataLoader};
/// use kiln::runtime::eager::{self, nn::{Linear, Relu, Sequential, Layer}, EagerOptimizer};
/// use kiln::runtime::Adam;
/// use kiln::train::{EagerClassifier, Trainer};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let (train, test) = data::digits()?.split(0.2, 0)?;
/// eager::manual_seed(0);
/// let model = Sequential::new()
///     .push(Linear::new("fc1", 64, 32)?)
///     .push(Relu)
///     .push(Linear::new("fc2", 32, 10)?);
/// let optimizer = EagerOptimizer::new(Adam::new(0.01), model.parameters())?;
/// let mut trainer = Trainer::new(EagerClassifier::new(model, optimizer))
///     .validate_on(DataLoader::new(test.clone(), 256))
///     .progress(false);
/// let history = trainer.fit(&DataLoader::new(train, 32).shuffle(1), 3)?;
/// assert!(history.epochs[2].validation.as_ref().unwrap().accuracy > 0.85);
/// # Ok(()) }
/// ```
pub struct Trainer<'a, L: Learner> {
    learner: L,
    callbacks: Vec<Callback<'a>>,
    validation: Option<Box<dyn BatchSource + 'a>>,
    checkpoint: Option<PathBuf>,
    checkpoint_every: Option<usize>,
    early_stopping: Option<EarlyStopping>,
    progress: bool,
    top_k: usize,
    history: History,
    position: Position,
}

impl<'a, L: Learner> Trainer<'a, L> {
    /// A trainer of `learner`, with a progress bar on a terminal and top-5 accuracy.
    pub fn new(learner: L) -> Trainer<'a, L> {
        Trainer {
            learner,
            callbacks: Vec::new(),
            validation: None,
            checkpoint: None,
            checkpoint_every: None,
            early_stopping: None,
            progress: true,
            top_k: 5,
            history: History::default(),
            position: Position::default(),
        }
    }

    /// Calls `callback` on every [`Event`].
    pub fn on(mut self, callback: impl FnMut(&Event) -> Control + 'a) -> Trainer<'a, L> {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Measures the model on `data` after each epoch (every batch of its epoch 0).
    pub fn validate_on(mut self, data: impl BatchSource + 'a) -> Trainer<'a, L> {
        self.validation = Some(Box::new(data));
        self
    }

    /// Writes a checkpoint to `path` (atomically) after each epoch: the learner's state, where
    /// training stands and the history.
    pub fn checkpoint(mut self, path: impl Into<PathBuf>) -> Trainer<'a, L> {
        self.checkpoint = Some(path.into());
        self
    }

    /// Also writes the checkpoint every `steps` steps within an epoch.
    pub fn checkpoint_every(mut self, steps: usize) -> Trainer<'a, L> {
        self.checkpoint_every = Some(steps.max(1));
        self
    }

    /// Stops early as [`EarlyStopping`] says.
    pub fn early_stopping(mut self, rule: EarlyStopping) -> Trainer<'a, L> {
        self.early_stopping = Some(rule);
        self
    }

    /// Draws a progress bar (on a terminal only).
    pub fn progress(mut self, show: bool) -> Trainer<'a, L> {
        self.progress = show;
        self
    }

    /// The `k` of top-k accuracy.
    pub fn top_k(mut self, k: usize) -> Trainer<'a, L> {
        self.top_k = k.max(1);
        self
    }

    /// The learner, when training is over.
    pub fn into_learner(self) -> L {
        self.learner
    }

    /// The learner.
    pub fn learner(&mut self) -> &mut L {
        &mut self.learner
    }

    /// What training measured so far.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The epoch training goes on with (the number of epochs finished).
    pub fn epoch(&self) -> usize {
        self.position.epoch
    }

    fn emit(&mut self, event: Event) -> Control {
        let mut control = Control::Continue;
        for callback in &mut self.callbacks {
            if callback(&event) == Control::Stop {
                control = Control::Stop;
            }
        }
        control
    }

    fn bar(&self, len: usize, first: usize, epoch: usize, epochs: usize) -> ProgressBar {
        if !self.progress {
            return ProgressBar::hidden();
        }
        let style = ProgressStyle::with_template(
            "epoch {prefix} [{bar:24}] {pos}/{len} {msg} {per_sec} ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        ProgressBar::new(len as u64)
            .with_style(style)
            .with_prefix(format!("{}/{epochs}", epoch + 1))
            .with_position(first as u64)
    }

    /// Trains until `epochs` epochs are done (counting those before a resume), validating and
    /// checkpointing after each; returns early when a callback or early stopping says so.
    pub fn fit(&mut self, train: &dyn BatchSource, epochs: usize) -> Result<&History, TrainError> {
        self.history.stopped = None;
        while self.position.epoch < epochs {
            let (epoch, first) = (self.position.epoch, self.position.step);
            let started = Instant::now();
            if first == 0 && self.emit(Event::EpochBegin { epoch }) == Control::Stop {
                return self.stop("a callback stopped training");
            }
            let bar = self.bar(train.batches_per_epoch(), first, epoch, epochs);
            for (i, batch) in train.epoch_from(epoch, first)?.enumerate() {
                let step = first + i;
                let batch = batch?;
                let mut control = self.emit(Event::StepBegin { epoch, step });
                let out = self.learner.train_step(&batch)?;
                let rows = metrics::label_ranks(&out.logits, &batch.y);
                self.position.running.add(out.loss, &rows, self.top_k);
                self.history.step_losses.push(out.loss);
                self.position.step = step + 1;
                bar.inc(1);
                if !bar.is_hidden() {
                    let running = self.position.running.finish(self.top_k);
                    bar.set_message(format!(
                        "loss {:.4} accuracy {:.1} %",
                        running.loss,
                        100.0 * running.accuracy
                    ));
                }
                if self.emit(Event::StepEnd {
                    epoch,
                    step,
                    loss: out.loss,
                }) == Control::Stop
                {
                    control = Control::Stop;
                }
                if self.checkpoint_every.is_some_and(|n| (step + 1) % n == 0) {
                    self.save_checkpoint()?;
                }
                if control == Control::Stop {
                    bar.abandon();
                    return self.stop("a callback stopped training");
                }
            }
            bar.finish_and_clear();
            let validation = match self.validation.take() {
                Some(data) => {
                    let measured = self.measure(data.as_ref(), None);
                    self.validation = Some(data);
                    Some(measured?)
                }
                None => None,
            };
            let record = EpochRecord {
                epoch,
                train: self.position.running.finish(self.top_k),
                validation,
                seconds: started.elapsed().as_secs_f64(),
            };
            self.history.epochs.push(record.clone());
            self.position = Position {
                epoch: epoch + 1,
                ..Position::default()
            };
            if self.checkpoint.is_some() {
                self.save_checkpoint()?;
            }
            if self.emit(Event::EpochEnd { record: &record }) == Control::Stop {
                return self.stop("a callback stopped training");
            }
            if let Some(reason) = self.should_stop_early() {
                return self.stop(&reason);
            }
        }
        Ok(&self.history)
    }

    fn stop(&mut self, reason: &str) -> Result<&History, TrainError> {
        self.history.stopped = Some(reason.to_owned());
        Ok(&self.history)
    }

    fn should_stop_early(&self) -> Option<String> {
        let rule = self.early_stopping?;
        let losses: Vec<f64> = (self.history.epochs.iter())
            .map(|e| e.validation.as_ref().unwrap_or(&e.train).loss)
            .collect();
        let best_at = (0..losses.len()).fold(0, |b, i| {
            if losses[i] < losses[b] - rule.min_delta {
                i
            } else {
                b
            }
        });
        let since = losses.len() - 1 - best_at;
        (since >= rule.patience).then(|| {
            format!(
                "early stopping: no improvement for {since} epochs (best loss {:.4} after \
                 epoch {})",
                losses[best_at],
                best_at + 1
            )
        })
    }

    /// Measures the model on every batch of `data` (epoch 0's order), changing nothing: the
    /// metrics and the confusion matrix.
    pub fn evaluate(
        &mut self,
        data: &DataLoader,
    ) -> Result<(Metrics, ConfusionMatrix), TrainError> {
        let mut confusion = ConfusionMatrix::new(data.dataset().classes);
        let metrics = self.measure(data, Some(&mut confusion))?;
        Ok((metrics, confusion))
    }

    /// The metrics of every batch of `data`'s epoch 0, changing nothing; each row counted
    /// into `confusion` too when given.
    fn measure(
        &mut self,
        data: &dyn BatchSource,
        mut confusion: Option<&mut ConfusionMatrix>,
    ) -> Result<Metrics, TrainError> {
        let mut running = Running::default();
        for batch in data.epoch_from(0, 0)? {
            let batch = batch?;
            let out = self.learner.eval_step(&batch)?;
            let rows = metrics::label_ranks(&out.logits, &batch.y);
            running.add(out.loss, &rows, self.top_k);
            if let Some(confusion) = confusion.as_deref_mut() {
                confusion.add_rows(&rows);
            }
        }
        Ok(running.finish(self.top_k))
    }

    /// Writes the checkpoint now (see [`Trainer::checkpoint`]).
    pub fn save_checkpoint(&self) -> Result<(), TrainError> {
        let Some(path) = &self.checkpoint else {
            return Err(TrainError::Invalid("no checkpoint file was set".into()));
        };
        let mut tensors = self.learner.state()?;
        for (name, array) in self.trainer_state() {
            tensors.insert(name.to_owned(), array);
        }
        checkpoint::save(tensors.iter().map(|(n, a)| (n.as_str(), a)), path)?;
        Ok(())
    }

    /// Goes on from the checkpoint at `path` when it exists (returns whether it did): the
    /// learner's state, the position (mid-epoch too) and the history, so that `fit` ends
    /// where an uninterrupted run would have. Nothing changes on error.
    pub fn resume(&mut self, path: &Path) -> Result<bool, TrainError> {
        if !path.exists() {
            return Ok(false);
        }
        let sizes = BTreeMap::from([(POSITION.to_owned(), vector_type(DType::I64, 4))]);
        let position = checkpoint::load(path, &sizes)?[POSITION].to_f64_vec();
        let (epochs, steps) = (position[2] as usize, position[3] as usize);
        let mut declared = self.learner.state_types()?;
        declared.insert(POSITION.into(), vector_type(DType::I64, 4));
        declared.insert(RUNNING.into(), vector_type(DType::F64, 4));
        declared.insert(STEP_LOSSES.into(), vector_type(DType::F64, steps));
        declared.insert(
            EPOCHS.into(),
            Type::new(DType::F64, Shape::fixed(&[epochs, EPOCH_COLUMNS])),
        );
        let mut values = checkpoint::load(path, &declared)?;
        let mut take = |name: &str| values.remove(name).expect("loaded").to_f64_vec();
        let running = Running::from_slice(&take(RUNNING));
        let step_losses = take(STEP_LOSSES);
        let epochs = take(EPOCHS);
        values.remove(POSITION);
        self.learner.set_state(values)?;
        self.position = Position {
            epoch: position[0] as usize,
            step: position[1] as usize,
            running,
        };
        self.history = History {
            epochs: epochs.chunks(EPOCH_COLUMNS).map(record_from_row).collect(),
            step_losses,
            stopped: None,
        };
        Ok(true)
    }

    fn trainer_state(&self) -> Vec<(&'static str, Array)> {
        let p = &self.position;
        let position = [
            p.epoch,
            p.step,
            self.history.epochs.len(),
            self.history.step_losses.len(),
        ];
        let rows: Vec<f64> = self.history.epochs.iter().flat_map(record_to_row).collect();
        let f64s = |v: Vec<f64>, shape: &[usize]| {
            Array::F64(ArrayD::from_shape_vec(IxDyn(shape), v).expect("sized"))
        };
        vec![
            (
                POSITION,
                Array::I64(
                    ArrayD::from_shape_vec(IxDyn(&[4]), position.map(|v| v as i64).to_vec())
                        .expect("4"),
                ),
            ),
            (RUNNING, f64s(p.running.to_vec(), &[4])),
            (
                STEP_LOSSES,
                f64s(
                    self.history.step_losses.clone(),
                    &[self.history.step_losses.len()],
                ),
            ),
            (
                EPOCHS,
                f64s(rows, &[self.history.epochs.len(), EPOCH_COLUMNS]),
            ),
        ]
    }
}

const POSITION: &str = "trainer.position";
const RUNNING: &str = "trainer.running";
const STEP_LOSSES: &str = "trainer.step_losses";
const EPOCHS: &str = "trainer.epochs";
/// epoch, seconds, then loss, accuracy, top-k, k, examples for training and for validation.
const EPOCH_COLUMNS: usize = 12;

fn vector_type(dtype: DType, n: usize) -> Type {
    Type::new(dtype, Shape::fixed(&[n]))
}

fn metrics_to_row(m: Option<&Metrics>) -> [f64; 5] {
    m.map_or([f64::NAN; 5], |m| {
        [m.loss, m.accuracy, m.top_k, m.k as f64, m.examples as f64]
    })
}

fn metrics_from_row(r: &[f64]) -> Option<Metrics> {
    (!r[3].is_nan()).then(|| Metrics {
        loss: r[0],
        accuracy: r[1],
        top_k: r[2],
        k: r[3] as usize,
        examples: r[4] as usize,
    })
}

fn record_to_row(e: &EpochRecord) -> Vec<f64> {
    let mut row = vec![e.epoch as f64, e.seconds];
    row.extend(metrics_to_row(Some(&e.train)));
    row.extend(metrics_to_row(e.validation.as_ref()));
    row
}

fn record_from_row(r: &[f64]) -> EpochRecord {
    EpochRecord {
        epoch: r[0] as usize,
        seconds: r[1],
        train: metrics_from_row(&r[2..7]).unwrap_or_default(),
        validation: metrics_from_row(&r[7..12]),
    }
}
