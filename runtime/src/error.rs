//! Errors of the runtime layer. Each names what the user asked for and what exists.

use crate::checkpoint::CheckpointError;
use kiln_backend::InterpError;
use kiln_ir::{BuildError, Type};
use kiln_passes::AutodiffError;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("missing feed for placeholder `{name}`: {ty}")]
    MissingFeed { name: String, ty: Box<Type> },
    #[error(
        "feed `{name}`: the placeholder is {expected}, but the fed array is {found} ({reason})"
    )]
    FeedMismatch {
        name: String,
        expected: Box<Type>,
        found: Box<Type>,
        reason: String,
    },
    #[error("feed `{name}`: no placeholder has that name; the placeholders are: {available}")]
    UnknownFeed { name: String, available: String },
    #[error(
        "fetch `{name}`: nothing in the program has that name; named values and targets: {available}"
    )]
    UnknownFetch { name: String, available: String },
    #[error("`{name}` is already declared in this program")]
    Duplicate { name: String },
    #[error("parameter `{name}` needs a static shape, found {ty}")]
    DynamicParameter { name: String, ty: Box<Type> },
    #[error("state `{name}`: {message}")]
    State { name: String, message: String },
    #[error(transparent)]
    StateConflict(#[from] kiln_ir::StateConflict),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    #[error("the pruned program does not verify (this is a bug in Kiln):\n{0}")]
    Verify(String),
    #[error("the optimisation pipeline failed: {0}")]
    Pass(#[from] kiln_passes::PassError),
    #[error(transparent)]
    Interp(#[from] InterpError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

pub type RuntimeResult<T> = Result<T, RuntimeError>;
