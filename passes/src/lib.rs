//! `kiln-passes`: transformations of Kiln IR.
//!
//! - [`autodiff`]: reverse-mode gradients as a pass; one vector-Jacobian rule per op.
//! - [`prune`]: the slice of a function that chosen outputs and stores need.
//!
//! Architecture invariant: a pass takes verified IR to verified IR with the same meaning
//! (checked against the reference interpreter in tests).

pub mod autodiff;
pub mod prune;

pub use autodiff::{AutodiffError, Wrt, append_gradients, gradient_function};
pub use prune::prune;
