//! Kiln's errors as Python exceptions: `KilnError` and a subclass per kind a caller may want
//! to catch. The message is the Rust error's, unchanged.

use kiln::backend::InterpError;
use kiln::backend::comm::CommError;
use kiln::ir::{BuildError, Loc, SourceError};
use kiln::runtime::RuntimeError;
use kiln::runtime::checkpoint::CheckpointError;
use kiln::runtime::data::DataError;
use kiln::runtime::eager::EagerError;
use kiln::train::TrainError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError};
use pyo3::prelude::*;

create_exception!(kiln, KilnError, PyException, "Every error Kiln reports.");
create_exception!(
    kiln,
    ShapeError,
    KilnError,
    "An op built with operands of the wrong shape or dtype: names the op, both shapes and where it was built."
);
create_exception!(
    kiln,
    FeedError,
    KilnError,
    "A missing, unknown or mis-shaped feed: names the placeholder."
);
create_exception!(
    kiln,
    RunError,
    KilnError,
    "An op that failed while running: names the instruction."
);
create_exception!(
    kiln,
    CheckpointFileError,
    KilnError,
    "A checkpoint that could not be saved or loaded (the previous file is intact)."
);
create_exception!(
    kiln,
    IrError,
    KilnError,
    "Malformed or ill-typed text IR: the line, the column and what was expected."
);
create_exception!(
    kiln,
    CommunicationError,
    KilnError,
    "Communication between ranks failed."
);

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KilnError", py.get_type::<KilnError>())?;
    m.add("ShapeError", py.get_type::<ShapeError>())?;
    m.add("FeedError", py.get_type::<FeedError>())?;
    m.add("RunError", py.get_type::<RunError>())?;
    m.add("CheckpointError", py.get_type::<CheckpointFileError>())?;
    m.add("IrError", py.get_type::<IrError>())?;
    m.add("CommunicationError", py.get_type::<CommunicationError>())?;
    Ok(())
}

/// A Kiln error as the Python exception of its kind.
pub(crate) trait IntoPyErr {
    fn into_py_err(self) -> PyErr;
}

impl IntoPyErr for RuntimeError {
    fn into_py_err(self) -> PyErr {
        let message = self.to_string();
        match self {
            RuntimeError::MissingFeed { .. }
            | RuntimeError::FeedMismatch { .. }
            | RuntimeError::UnknownFeed { .. }
            | RuntimeError::FeedCutsUpdate { .. }
            | RuntimeError::FeedCutsGradient { .. }
            | RuntimeError::FedTwice { .. }
            | RuntimeError::Unfeedable { .. } => FeedError::new_err(message),
            RuntimeError::Build(e) => e.into_py_err(),
            RuntimeError::Interp(e) => e.into_py_err(),
            RuntimeError::Checkpoint(_) => CheckpointFileError::new_err(message),
            RuntimeError::Comm(_) => CommunicationError::new_err(message),
            _ => KilnError::new_err(message),
        }
    }
}

impl IntoPyErr for EagerError {
    fn into_py_err(self) -> PyErr {
        match self {
            EagerError::Runtime(e) => e.into_py_err(),
            EagerError::Build(e) => e.into_py_err(),
            EagerError::Run(e) => e.into_py_err(),
            EagerError::Index(message) => PyIndexError::new_err(message),
            other => KilnError::new_err(other.to_string()),
        }
    }
}

impl IntoPyErr for BuildError {
    /// The op and the shapes, and where the user's Python code built it (the binding's own
    /// Rust line would say nothing to them).
    fn into_py_err(self) -> PyErr {
        let place = Python::attach(|py| python_caller(py).ok().flatten());
        match place {
            Some(place) => ShapeError::new_err(format!("{} (built at {place})", self.error)),
            None => ShapeError::new_err(self.error.to_string()),
        }
    }
}

/// An eager composite's error (a loss, a function of `kiln.nn.functional`) under the name the
/// user called, not that of the op inside it that failed (`one_hot` for a label out of range).
pub(crate) fn composite_error(name: &str, e: EagerError) -> PyErr {
    match e {
        EagerError::Run(InterpError::Op { message, .. }) => {
            let place = Python::attach(|py| python_caller(py).ok().flatten())
                .unwrap_or_else(|| "an unknown place".into());
            RunError::new_err(format!("{name} failed at {place}: {message}"))
        }
        other => other.into_py_err(),
    }
}

/// `file:line` of the innermost Python frame outside the `kiln` package.
pub(crate) fn python_caller(py: Python<'_>) -> PyResult<Option<String>> {
    let package = std::path::Path::new(
        &py.import("kiln")?
            .getattr("__file__")?
            .extract::<String>()?,
    )
    .parent()
    .map(|p| p.to_string_lossy().into_owned())
    .unwrap_or_default();
    let mut frame = py.import("sys")?.call_method1("_getframe", (0,))?;
    while !frame.is_none() {
        let code = frame.getattr("f_code")?;
        let file: String = code.getattr("co_filename")?.extract()?;
        if !file.starts_with(&package) {
            let line: usize = frame.getattr("f_lineno")?.extract()?;
            return Ok(Some(format!("{file}:{line}")));
        }
        frame = frame.getattr("f_back")?;
    }
    Ok(None)
}

impl IntoPyErr for InterpError {
    /// An op's failure at the user's Python line (the Rust line of the binding or the
    /// runtime, where the op was built for them, would say nothing to them).
    fn into_py_err(self) -> PyErr {
        match self {
            InterpError::Op {
                op,
                loc: Loc::Rust(_),
                line,
                message,
                ..
            } => {
                let place = Python::attach(|py| python_caller(py).ok().flatten())
                    .unwrap_or_else(|| "an unknown place".into());
                RunError::new_err(format!(
                    "`{op}` failed at {place}: {message}\n    in: {line}"
                ))
            }
            other => RunError::new_err(other.to_string()),
        }
    }
}

impl IntoPyErr for CheckpointError {
    fn into_py_err(self) -> PyErr {
        CheckpointFileError::new_err(self.to_string())
    }
}

impl IntoPyErr for DataError {
    fn into_py_err(self) -> PyErr {
        KilnError::new_err(self.to_string())
    }
}

impl IntoPyErr for TrainError {
    fn into_py_err(self) -> PyErr {
        match self {
            TrainError::Runtime(e) => e.into_py_err(),
            TrainError::Eager(e) => e.into_py_err(),
            TrainError::Checkpoint(e) => e.into_py_err(),
            other => KilnError::new_err(other.to_string()),
        }
    }
}

impl IntoPyErr for SourceError {
    fn into_py_err(self) -> PyErr {
        IrError::new_err(self.to_string())
    }
}

impl IntoPyErr for CommError {
    fn into_py_err(self) -> PyErr {
        CommunicationError::new_err(self.to_string())
    }
}

/// `result` with its error as the Python exception of its kind; or, when Python code that
/// Kiln called (a PyLayer) raised, that exception itself, with its traceback.
pub(crate) fn kiln_ok<T, E: IntoPyErr>(result: Result<T, E>) -> PyResult<T> {
    result.map_err(|e| {
        let kiln_error = e.into_py_err();
        match RAISED.with(|r| r.borrow_mut().take()) {
            Some(raised) => {
                Python::attach(|py| raised.set_cause(py, Some(kiln_error)));
                raised
            }
            None => kiln_error,
        }
    })
}

thread_local! {
    /// The exception Python code raised inside a Kiln call, until the call's error returns.
    static RAISED: std::cell::RefCell<Option<PyErr>> = const { std::cell::RefCell::new(None) };
}

/// Keeps `e`, raised by Python code Kiln called, to raise it again when Kiln's error
/// reaches Python.
pub(crate) fn stash(e: PyErr) {
    RAISED.with(|r| *r.borrow_mut() = Some(e));
}
