//! Errors of the runtime layer. Each names what the user asked for and what exists.

use crate::checkpoint::CheckpointError;
use kiln_backend::InterpError;
use kiln_ir::{BuildError, Type};
use kiln_passes::AutodiffError;

/// Why a static-program operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A placeholder the run needs was not fed.
    #[error("missing feed for placeholder `{name}`: {ty}")]
    MissingFeed {
        /// The name.
        name: String,
        /// Its type.
        ty: Box<Type>,
    },
    /// A fed array does not fit the placeholder or value it feeds.
    #[error("feed {name}: the {kind} is {expected}, but the fed array is {found} ({reason})")]
    FeedMismatch {
        /// The placeholder or value, as errors name it (`` `x` ``).
        name: String,
        /// `placeholder` or `value`.
        kind: &'static str,
        /// Its type.
        expected: Box<Type>,
        /// The array's type.
        found: Box<Type>,
        /// What does not fit.
        reason: String,
    },
    /// A feed names no placeholder and no named value.
    #[error(
        "feed `{name}`: no placeholder or named value has that name; the placeholders are: {available}"
    )]
    UnknownFeed {
        /// The name.
        name: String,
        /// What there is, listed.
        available: String,
    },
    /// A fed value lies between a state that a fetched target updates and the target's loss,
    /// so feeding it would cut the gradient path of that update.
    #[error(
        "feed {name}: the value is computed from @{state}, which target `{target}` updates; \
         feeding it would cut that update's gradient path (fetch the target without this feed)"
    )]
    FeedCutsUpdate {
        /// The fed value.
        name: String,
        /// The state it depends on.
        state: String,
        /// The target that updates the state.
        target: String,
    },
    /// A fed value lies between the value a fetched gradient is taken with respect to and its
    /// loss, so feeding it would cut the path that gradient differentiates.
    #[error(
        "feed {name}: the value lies between {wrt} and {loss}, and the run needs the gradient \
         of {loss} with respect to {wrt}; feeding it would cut the path that gradient \
         differentiates (feed {wrt} or what it is computed from instead)"
    )]
    FeedCutsGradient {
        /// The fed value.
        name: String,
        /// What the gradient is taken with respect to.
        wrt: String,
        /// The differentiated value.
        loss: String,
    },
    /// Two feeds of one run give the same value.
    #[error("{name} is fed twice in one run (by {first} and by {second})")]
    FedTwice {
        /// The value.
        name: String,
        /// The first feed's key.
        first: String,
        /// The second's.
        second: String,
    },
    /// A feed is keyed by a value inside a `cond` or `while` body, or by no value of the
    /// program.
    #[error("feed {name}: {reason}")]
    Unfeedable {
        /// The value.
        name: String,
        /// Why it cannot be fed.
        reason: &'static str,
    },
    /// A fetch names nothing in the program.
    #[error(
        "fetch `{name}`: nothing in the program has that name; named values and targets: {available}"
    )]
    UnknownFetch {
        /// The name.
        name: String,
        /// What there is, listed.
        available: String,
    },
    /// A name is declared twice.
    #[error("`{name}` is already declared in this program")]
    Duplicate {
        /// The name.
        name: String,
    },
    /// A parameter's shape is not static.
    #[error("parameter `{name}` needs a static shape, found {ty}")]
    DynamicParameter {
        /// The name.
        name: String,
        /// Its type.
        ty: Box<Type>,
    },
    /// A state value is missing or wrong.
    #[error("state `{name}`: {message}")]
    State {
        /// The name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A state is declared again, differently.
    #[error(transparent)]
    StateConflict(#[from] kiln_ir::StateConflict),
    /// Building an op failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Deriving gradients failed.
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    /// A pruned program does not verify (a bug in Kiln).
    #[error("the pruned program does not verify (this is a bug in Kiln):\n{0}")]
    Verify(String),
    /// The optimisation pipeline failed.
    #[error("the optimisation pipeline failed: {0}")]
    Pass(#[from] kiln_passes::PassError),
    /// A run failed.
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// Saving or loading a checkpoint failed.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The built-in data could not be read.
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// Communication with the other ranks failed.
    #[error(transparent)]
    Comm(#[from] kiln_backend::comm::CommError),
    /// A request that cannot be met as asked.
    #[error("{0}")]
    Usage(String),
}

/// The result of a static-program operation.
pub type RuntimeResult<T> = Result<T, RuntimeError>;
