//! `kiln.Trainer`'s native half: Rust's trainer (`kiln::train`) driving a step written in
//! Python — its loop, metrics, progress bar, checkpoints, resume, early stopping and plots are
//! the same code the Rust API runs.

use crate::array::{from_py, to_py};
use crate::data::PyDataLoader;
use crate::eager::PyTensor;
use crate::errors::{kiln_ok, stash};
use crate::graph::{PySession, session_mut, session_ref};
use crate::thread::ThreadBound;
use kiln::backend::Array;
use kiln::runtime::data::Batch;
use kiln::train::{
    ConfusionMatrix, Control, EarlyStopping, EpochRecord, Event, History, Learner, Metrics, Step,
    TrainError, Trainer,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTrainer>()?;
    Ok(())
}

/// Where a Python learner's state lives: this thread's eager scope, or a session's.
enum StateOf {
    Eager,
    Session(Py<PySession>),
}

/// A step written in Python: `train(x, y)` and `evaluate(x, y)` return `(loss, logits)`.
struct PyLearner {
    train: Py<PyAny>,
    evaluate: Py<PyAny>,
    state_of: StateOf,
}

/// A Python exception raised in a step: kept (to be raised again with its traceback) and
/// reported to the trainer.
fn raised(e: PyErr) -> TrainError {
    stash(e);
    TrainError::Invalid("the Python step raised an exception".into())
}

impl PyLearner {
    fn call(&self, f: &Py<PyAny>, batch: &Batch) -> Result<Step, TrainError> {
        Python::attach(|py| {
            let x = to_py(py, batch.x.clone());
            let y = to_py(py, batch.y.clone());
            let out = f.call1(py, (x, y)).map_err(raised)?;
            let (loss, logits): (f64, Bound<'_, PyAny>) = out.extract(py).map_err(|e| {
                raised(pyo3::exceptions::PyTypeError::new_err(format!(
                    "a training step returns (loss, logits): {e}"
                )))
            })?;
            let logits = match logits.extract::<PyRef<'_, PyTensor>>() {
                Ok(t) => t.0.to_array()?,
                Err(_) => from_py(&logits).map_err(raised)?,
            };
            Ok(Step { loss, logits })
        })
    }
}

impl Learner for PyLearner {
    fn train_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        self.call(&self.train, batch)
    }

    fn eval_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        self.call(&self.evaluate, batch)
    }

    fn state(&self) -> Result<BTreeMap<String, Array>, TrainError> {
        match &self.state_of {
            StateOf::Eager => Ok(kiln::runtime::eager::scope()?.values()),
            StateOf::Session(s) => Python::attach(|py| Ok(session_ref(s.bind(py)).state_values())),
        }
    }

    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<(), TrainError> {
        match &self.state_of {
            StateOf::Eager => {
                for (name, value) in state {
                    kiln::runtime::eager::set_state(&name, value)?;
                }
                Ok(())
            }
            StateOf::Session(s) => {
                Python::attach(|py| Ok(session_mut(s.bind(py)).set_states(state)?))
            }
        }
    }
}

/// The trainer behind `kiln.Trainer` (see its documentation).
#[pyclass(name = "NativeTrainer", module = "kiln")]
pub(crate) struct PyTrainer {
    trainer: ThreadBound<Option<Trainer<'static, PyLearner>>>,
    /// An exception a callback raised, raised again when `fit` returns.
    callback_error: Arc<Mutex<Option<PyErr>>>,
}

fn metrics_dict<'py>(py: Python<'py>, m: &Metrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("loss", m.loss)?;
    d.set_item("accuracy", m.accuracy)?;
    d.set_item("top_k", m.top_k)?;
    d.set_item("k", m.k)?;
    d.set_item("examples", m.examples)?;
    Ok(d)
}

/// An epoch's record into `d`: `epoch`, `seconds`, `train` and `validation` metrics.
fn record_into(py: Python<'_>, d: &Bound<'_, PyDict>, record: &EpochRecord) -> PyResult<()> {
    d.set_item("epoch", record.epoch)?;
    d.set_item("seconds", record.seconds)?;
    d.set_item("train", metrics_dict(py, &record.train)?)?;
    let validation = match &record.validation {
        Some(m) => Some(metrics_dict(py, m)?),
        None => None,
    };
    d.set_item("validation", validation)
}

fn history_dict<'py>(py: Python<'py>, h: &History) -> PyResult<Bound<'py, PyDict>> {
    let epochs = PyList::empty(py);
    for e in &h.epochs {
        let d = PyDict::new(py);
        record_into(py, &d, e)?;
        epochs.append(d)?;
    }
    let d = PyDict::new(py);
    d.set_item("epochs", epochs)?;
    d.set_item("step_losses", h.step_losses.clone())?;
    d.set_item("stopped", h.stopped.clone())?;
    Ok(d)
}

fn event_dict<'py>(py: Python<'py>, event: &Event) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match *event {
        Event::EpochBegin { epoch } => {
            d.set_item("kind", "epoch_begin")?;
            d.set_item("epoch", epoch)?;
        }
        Event::StepBegin { epoch, step } => {
            d.set_item("kind", "step_begin")?;
            d.set_item("epoch", epoch)?;
            d.set_item("step", step)?;
        }
        Event::StepEnd { epoch, step, loss } => {
            d.set_item("kind", "step_end")?;
            d.set_item("epoch", epoch)?;
            d.set_item("step", step)?;
            d.set_item("loss", loss)?;
        }
        Event::EpochEnd { record } => {
            d.set_item("kind", "epoch_end")?;
            record_into(py, &d, record)?;
        }
    }
    Ok(d)
}

impl PyTrainer {
    fn trainer(&mut self) -> PyResult<&mut Trainer<'static, PyLearner>> {
        Ok(self
            .trainer
            .get_mut()?
            .as_mut()
            .expect("a trainer is always present between calls"))
    }

    fn raise_callback_error(&self) -> PyResult<()> {
        let mut failed = self
            .callback_error
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[pymethods]
impl PyTrainer {
    #[new]
    #[pyo3(signature = (
        train_step, eval_step, session = None, validation = None, checkpoint = None,
        checkpoint_every = None, patience = None, min_delta = 0.0, progress = true, top_k = 5
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        train_step: Py<PyAny>,
        eval_step: Py<PyAny>,
        session: Option<Py<PySession>>,
        validation: Option<PyRef<'_, PyDataLoader>>,
        checkpoint: Option<PathBuf>,
        checkpoint_every: Option<usize>,
        patience: Option<usize>,
        min_delta: f64,
        progress: bool,
        top_k: usize,
    ) -> PyTrainer {
        let learner = PyLearner {
            train: train_step,
            evaluate: eval_step,
            state_of: session.map_or(StateOf::Eager, StateOf::Session),
        };
        let mut trainer = Trainer::new(learner).progress(progress).top_k(top_k);
        if let Some(v) = validation {
            trainer = trainer.validate_on(v.loader.clone());
        }
        if let Some(path) = checkpoint {
            trainer = trainer.checkpoint(path);
        }
        if let Some(steps) = checkpoint_every {
            trainer = trainer.checkpoint_every(steps);
        }
        if let Some(patience) = patience {
            trainer = trainer.early_stopping(EarlyStopping {
                patience,
                min_delta,
            });
        }
        PyTrainer {
            trainer: ThreadBound::new(Some(trainer), "a kiln.Trainer"),
            callback_error: Arc::default(),
        }
    }

    /// Calls `callback(event)` on every event (a dict with `kind`); a true result stops.
    fn on(&mut self, callback: Py<PyAny>) -> PyResult<()> {
        let failed = self.callback_error.clone();
        let slot = self.trainer.get_mut()?;
        let trainer = slot.take().expect("present");
        *slot = Some(trainer.on(move |event| {
            Python::attach(|py| {
                let result = event_dict(py, event)
                    .and_then(|d| callback.call1(py, (d,)))
                    .and_then(|r| r.is_truthy(py));
                match result {
                    Ok(true) => Control::Stop,
                    Ok(false) => Control::Continue,
                    Err(e) => {
                        *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        Control::Stop
                    }
                }
            })
        }));
        Ok(())
    }

    /// Trains until `epochs` epochs are done; returns the history (a dict).
    fn fit<'py>(
        &mut self,
        py: Python<'py>,
        train: &PyDataLoader,
        epochs: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let result = self.trainer()?.fit(&train.loader, epochs).cloned();
        self.raise_callback_error()?;
        history_dict(py, &kiln_ok(result)?)
    }

    /// `(metrics, confusion)` on every batch of `data`.
    fn evaluate<'py>(
        &mut self,
        py: Python<'py>,
        data: &PyDataLoader,
    ) -> PyResult<(Bound<'py, PyDict>, Vec<Vec<usize>>)> {
        let (metrics, confusion) = kiln_ok(self.trainer()?.evaluate(&data.loader))?;
        Ok((metrics_dict(py, &metrics)?, confusion.counts))
    }

    /// The history so far (a dict).
    fn history<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        history_dict(py, self.trainer()?.history())
    }

    /// The epoch training goes on with.
    fn epoch(&mut self) -> PyResult<usize> {
        Ok(self.trainer()?.epoch())
    }

    /// Goes on from the checkpoint at `path` if it exists; returns whether it did.
    fn resume(&mut self, path: PathBuf) -> PyResult<bool> {
        kiln_ok(self.trainer()?.resume(&path))
    }

    /// Writes the checkpoint now.
    fn save_checkpoint(&mut self) -> PyResult<()> {
        kiln_ok(self.trainer()?.save_checkpoint())
    }

    /// Draws the loss and accuracy per epoch as an SVG.
    fn plot_history(&mut self, path: PathBuf) -> PyResult<()> {
        kiln_ok(self.trainer()?.history().plot(&path))
    }

    /// Draws a confusion matrix (from `evaluate`) as an SVG.
    #[staticmethod]
    #[pyo3(signature = (path, counts, class_names = Vec::new()))]
    fn plot_confusion(
        path: PathBuf,
        counts: Vec<Vec<usize>>,
        class_names: Vec<String>,
    ) -> PyResult<()> {
        let matrix = ConfusionMatrix { counts };
        kiln_ok(
            kiln::plot::confusion_matrix(&path, &matrix, &class_names).map_err(TrainError::from),
        )
    }
}
