//! Dygraph: eager tensors that compute at once, record a tape for `backward()`, and trace into
//! static programs with `to_static`.
//!
//! There is one list of ops, one set of shape rules, one set of kernels and one set of gradient
//! rules, shared with the static front end:
//! - every tensor op is a call of the IR builder (`FunctionBuilder`), so it is typed by the same
//!   inference rules and reports shape errors the same way;
//! - eagerly, the instructions an op adds are evaluated at once by the reference interpreter's
//!   kernels; when gradients are needed they stay on a *tape* — itself an IR function — and
//!   `backward()` runs the autodiff pass over it and evaluates the gradient instructions;
//! - while tracing (`to_static`), the same calls build a [`Program`](crate::Program) instead,
//!   with no evaluation; parameters become `load`s of state, so the compiled function reads the
//!   same parameters as the eager code.
//!
//! The context — parameter scope, tape, trace, accumulated gradients — is per thread. A tensor
//! refers to its tape value by id; the tape is cleared after `backward()`, and when no tensor
//! recorded on it is alive any more.

pub mod control;
pub mod custom;
pub mod diff;
pub mod gpt;
mod index;
pub mod kv_cache;
pub mod nn;
pub mod optim;
mod tape;
mod tensor;
mod trace;

pub use control::{cond, while_loop};
pub use custom::{CustomOp, register as register_custom_op};
pub use diff::{diff, diff_located};
pub use gpt::{Gpt, GptConfig};
pub use index::Index;
pub use kiln_backend::CustomOpError;
pub use kv_cache::{Generator, KvCache};
pub use nn::Parameter;
pub use optim::EagerOptimizer;
pub use tensor::{Tensor, compose};
pub use trace::{Gradients, StaticFunction, to_static};

use crate::error::RuntimeError;
use crate::scope::Scope;
use kiln_backend::{Array, InterpError};
use kiln_ir::{BuildError, Module};
use kiln_passes::AutodiffError;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

/// Why an eager operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EagerError {
    /// Building the op failed (a shape or dtype error).
    #[error(transparent)]
    Build(#[from] BuildError),
    /// Computing it failed.
    #[error(transparent)]
    Run(#[from] InterpError),
    /// A static-program operation failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// Deriving gradients failed.
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    /// A traced tensor's value was read while tracing.
    #[error(
        "cannot read the value of {value} while tracing with `to_static`: it is not known until \
         the compiled function runs. To branch or loop on a tensor, use `kiln::eager::cond` or \
         `kiln::eager::while_loop`, which trace into `cond` and `while` ops"
    )]
    TracedRead {
        /// The value.
        value: String,
    },
    /// The API was used in a way it does not allow.
    #[error("{0}")]
    Usage(String),
    /// An index does not fit the tensor (out of range, too many, of the wrong dtype).
    #[error("{0}")]
    Index(String),
    /// A tensor, parameter or compiled function of one thread was used in another (or in
    /// its own thread after [`reset`]).
    #[error(
        "{0} belongs to another thread (or to this one before a reset): gradients, parameters \
         and traces live in the thread that made them; pass a detached tensor, or its array, \
         between threads"
    )]
    OtherThread(String),
}

impl From<kiln_backend::comm::CommError> for EagerError {
    fn from(e: kiln_backend::comm::CommError) -> EagerError {
        EagerError::Runtime(e.into())
    }
}

/// The result of an eager operation.
pub type EagerResult<T> = Result<T, EagerError>;

/// Identifies a tensor whose gradient is accumulated (a parameter, or `requires_grad()`), in
/// the context (thread) that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeafId {
    context: u64,
    index: u64,
}

/// Numbers contexts and traces across threads, so that a tensor, parameter or trace of one
/// thread is never mistaken for one of another.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(crate) struct Context {
    /// Unique across threads: what a thread-bound tensor or parameter records.
    pub id: u64,
    /// Parameter values, shared with compiled functions and static programs.
    pub scope: Scope,
    /// Declarations of the parameters created eagerly.
    pub states: Module,
    /// The leaf of each parameter.
    pub param_leaves: HashMap<String, LeafId>,
    pub tape: tape::Tape,
    pub trace: Option<trace::Trace>,
    pub grad_enabled: bool,
    pub grads: HashMap<LeafId, Arc<Array>>,
    next_leaf: u64,
    /// Mixed into eager random ops' seeds; advanced by each op that draws.
    pub rng_counter: u64,
    /// Mixed into parameter initializers' seeds.
    pub seed: u64,
    /// While [`diff`] runs a function: each tensor op's location and results, in order.
    pub recording: Option<diff::Recording>,
}

impl Context {
    fn new() -> Context {
        Context {
            id: next_id(),
            scope: Scope::new(),
            states: Module::new(),
            param_leaves: HashMap::new(),
            tape: tape::Tape::new(),
            trace: None,
            grad_enabled: true,
            grads: HashMap::new(),
            next_leaf: 0,
            rng_counter: 0,
            seed: 0,
            recording: None,
        }
    }

    pub(crate) fn new_leaf(&mut self) -> LeafId {
        self.next_leaf += 1;
        LeafId {
            context: self.id,
            index: self.next_leaf,
        }
    }

    pub(crate) fn new_trace_id(&mut self) -> u64 {
        next_id()
    }

    /// An error unless `owner` is this context: state of another thread (its gradients, its
    /// tape, its parameters' values) is not visible here, and using it would be silently wrong.
    pub(crate) fn check_owner(&self, owner: u64, what: &str) -> EagerResult<()> {
        if owner == self.id {
            return Ok(());
        }
        Err(EagerError::OtherThread(what.to_owned()))
    }
}

thread_local! {
    static CONTEXT: RefCell<Context> = RefCell::new(Context::new());
}

/// Runs `f` with this thread's context. Tensor code never calls it re-entrantly; a custom op
/// that calls tensor ops from its forward or backward gets an error, not a panic.
pub(crate) fn with<R>(f: impl FnOnce(&mut Context) -> EagerResult<R>) -> EagerResult<R> {
    CONTEXT.with(|cell| match cell.try_borrow_mut() {
        Ok(mut cx) => f(&mut cx),
        Err(_) => Err(EagerError::Usage(
            "a tensor op ran inside another (a custom op's forward or backward must work on \
             arrays, not tensors)"
                .into(),
        )),
    })
}

/// Forgets every parameter, gradient and recorded op of this thread: a fresh start.
pub fn reset() {
    CONTEXT.with(|cell| {
        if let Ok(mut cx) = cell.try_borrow_mut() {
            *cx = Context::new();
        }
    });
}

/// Seeds parameter initializers (with each parameter's name) and eager random ops.
pub fn manual_seed(seed: u64) {
    let _ = with(|cx| {
        cx.seed = seed;
        cx.rng_counter = 0;
        Ok(())
    });
}

/// A copy of this thread's parameter scope: to save it, or to serve it from a `Session`.
pub fn scope() -> EagerResult<Scope> {
    with(|cx| Ok(cx.scope.clone()))
}

/// The declarations of every parameter created eagerly in this thread.
pub fn parameters_module() -> EagerResult<Module> {
    with(|cx| Ok(cx.states.clone()))
}

/// Declares in this thread's scope the state `module` declares (an optimizer's moments, a
/// compiled step's), at its initial values, keeping the values already there: so that a
/// checkpoint can be restored before the first step.
pub fn declare_states(module: &Module) -> EagerResult<()> {
    with(|cx| Ok(cx.scope.declare(module)?))
}

/// Sets this thread's state `name` (a parameter or an optimizer's moment) to `value`, which
/// must have its declared type.
pub fn set_state(name: &str, value: Array) -> EagerResult<()> {
    with(|cx| Ok(cx.scope.set(name, value)?))
}

/// Saves every parameter (and optimizer state) of this thread as a safetensors checkpoint.
pub fn save_parameters(path: &std::path::Path) -> EagerResult<()> {
    with(|cx| Ok(cx.scope.save(path).map_err(RuntimeError::from)?))
}

/// Loads parameter values from a checkpoint; nothing changes on error.
pub fn load_parameters(path: &std::path::Path) -> EagerResult<()> {
    with(|cx| Ok(cx.scope.load(path).map_err(RuntimeError::from)?))
}

/// Loads the parameter values a checkpoint has and keeps the rest (say, an optimizer's moments
/// when the file holds parameters only); returns the names it skipped. Nothing changes on
/// error.
pub fn load_parameters_present(path: &std::path::Path) -> EagerResult<Vec<String>> {
    with(|cx| Ok(cx.scope.load_present(path).map_err(RuntimeError::from)?))
}

/// Sends every parameter and optimizer state of this thread from rank `root` to the other
/// ranks of the current communicator (nothing without one): data-parallel eager training
/// starts from one set of values, as static sessions do. Every rank must call it after
/// creating the same parameters.
pub fn broadcast_parameters(root: usize) -> EagerResult<()> {
    with(|cx| {
        let names: Vec<String> = cx.scope.iter().map(|(n, _)| n.to_owned()).collect();
        crate::distributed::broadcast_scope(&mut cx.scope, &names, root)?;
        Ok(())
    })
}

/// How many instructions the tape holds (0 once no recorded tensor is alive): for
/// inspecting memory use.
pub fn tape_len() -> usize {
    with(|cx| Ok(cx.tape.len())).unwrap_or(0)
}

/// While alive, ops record nothing for gradients (inference, updates).
pub struct NoGradGuard {
    previous: bool,
    /// The context it disabled recording in: dropped in another (another thread's, or this
    /// thread's after a reset), it leaves that one alone.
    context: u64,
}

/// Disables gradient recording until the guard is dropped.
pub fn no_grad() -> NoGradGuard {
    let (previous, context) =
        with(|cx| Ok((std::mem::replace(&mut cx.grad_enabled, false), cx.id))).unwrap_or((true, 0));
    NoGradGuard { previous, context }
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        let (previous, context) = (self.previous, self.context);
        let _ = with(|cx| {
            if cx.id == context {
                cx.grad_enabled = previous;
            }
            Ok(())
        });
    }
}
