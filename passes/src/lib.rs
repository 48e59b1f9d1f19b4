//! `kiln-passes`: transformations of Kiln IR.
//!
//! - [`autodiff`]: reverse-mode gradients as a pass; one vector-Jacobian rule per op.
//!
//! Architecture invariant: a pass takes verified IR to verified IR with the same meaning
//! (checked against the reference interpreter in tests).

pub mod autodiff;

pub use autodiff::{AutodiffError, append_gradients};
