//! `kiln._kiln`: the native half of the `kiln` Python package. The Python half (`kiln/`) adds
//! the API users write against (`kiln.nn.Layer`, `kiln.PyLayer`, `kiln.to_static`, …) on top
//! of these classes. Every Kiln error becomes a `kiln.KilnError` (or a subclass) with the
//! message Rust gives.
//!
//! Threads: gradients, parameters and compiled functions belong to the thread that made them
//! (Kiln's eager context is per thread); the runtime refuses them elsewhere with an error
//! naming them, and a plain tensor (no gradient) works in any thread. A trainer is bound to
//! its thread ([`thread::ThreadBound`]). No class is pyo3-`unsendable`, whose check panics.
//! Programs and sessions are plain data; `kiln.Session`'s runs from several threads take
//! turns (a lock in Python, so that pyo3's borrow flag never refuses one).

mod array;
mod data;
mod eager;
mod errors;
mod gpt;
mod graph;
mod options;
mod text;
mod thread;
mod train;

use pyo3::prelude::*;

#[pymodule]
fn _kiln(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    eager::register(m)?;
    graph::register(m)?;
    data::register(m)?;
    text::register(m)?;
    train::register(m)?;
    Ok(())
}
