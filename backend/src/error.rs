//! `InterpError`, why a run failed: the one error of the interpreter, the executor and the
//! state store (kept apart from all three, so that none depends on another for it).

use crate::limits::MemoryLimitExceeded;
use kiln_ir::{Loc, Type};

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("no function @{name} in the module; it has: {available}")]
    /// No function of that name.
    UnknownFunction {
        /// The name asked for.
        name: String,
        /// The functions there are.
        available: String,
    },
    /// A function called with the wrong number of arguments.
    #[error("@{func} takes {expected} argument(s), {found} given")]
    ArgCount {
        /// The function.
        func: String,
        /// How many it takes.
        expected: usize,
        /// How many were given.
        found: usize,
    },
    /// An argument whose dtype or shape does not fit the function's type.
    #[error("argument {arg} of @{func}: expected {expected}, found {found}: {reason}")]
    ArgMismatch {
        /// The function.
        func: String,
        /// The argument, by name.
        arg: String,
        /// Its type in the function.
        expected: Box<Type>,
        /// The array's type.
        found: Box<Type>,
        /// What does not fit.
        reason: String,
    },
    #[error("state @{name}: {message}")]
    /// A state value is missing or does not fit its declaration.
    StateMismatch {
        /// The state.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A value or the state needs more memory than the limit (see [`crate::limits`]).
    #[error(transparent)]
    MemoryLimit(Box<MemoryLimitExceeded>),
    /// An op failed.
    #[error("in @{func}, `{op}` at {loc} failed: {message}\n    in: {line}")]
    Op {
        /// The function.
        func: String,
        /// The op's name.
        op: &'static str,
        /// Where the op was built or parsed.
        loc: Loc,
        /// The instruction, as text.
        line: String,
        /// What went wrong.
        message: String,
    },
}

impl From<MemoryLimitExceeded> for InterpError {
    fn from(e: MemoryLimitExceeded) -> InterpError {
        InterpError::MemoryLimit(Box::new(e))
    }
}
