//! A value that must stay in the thread that made it, inside a class Python may hand to any
//! thread. pyo3's `unsendable` classes panic when touched from another thread (a
//! `PanicException`, which `except Exception` does not catch); this raises `KilnError`.

use crate::errors::KilnError;
use pyo3::PyResult;
use std::mem::ManuallyDrop;
use std::thread::{self, ThreadId};

pub(crate) struct ThreadBound<T> {
    thread: ThreadId,
    value: ManuallyDrop<T>,
    /// What the value is, for the error.
    what: &'static str,
}

// SAFETY: the value is reached only through `get_mut`, which checks that the caller runs on
// the thread that made it, and it is dropped only there (leaked elsewhere, as pyo3 does for
// an `unsendable` class); so it is never touched by two threads.
unsafe impl<T> Send for ThreadBound<T> {}
// SAFETY: as above; a shared reference gives no access without the thread check.
unsafe impl<T> Sync for ThreadBound<T> {}

impl<T> ThreadBound<T> {
    pub(crate) fn new(value: T, what: &'static str) -> ThreadBound<T> {
        ThreadBound {
            thread: thread::current().id(),
            value: ManuallyDrop::new(value),
            what,
        }
    }

    /// The value, on the thread that made it; else a `KilnError`.
    pub(crate) fn get_mut(&mut self) -> PyResult<&mut T> {
        if thread::current().id() == self.thread {
            return Ok(&mut self.value);
        }
        Err(KilnError::new_err(format!(
            "{} belongs to the thread that made it; make one in this thread",
            self.what
        )))
    }
}

impl<T> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        if thread::current().id() == self.thread {
            // SAFETY: dropped once, here, on the owning thread.
            unsafe { ManuallyDrop::drop(&mut self.value) }
        }
    }
}
