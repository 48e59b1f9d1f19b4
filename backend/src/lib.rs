//! `kiln-backend`: running Kiln IR.
//!
//! - [`interp`]: the reference interpreter — the oracle every compiled kernel is tested against.
//! - [`array`]: host arrays of every Kiln dtype; [`state`]: the values of a module's state.
//! - [`random`]: counter-based random numbers, the same whichever backend draws them.
//! - [`jit`]: Cranelift kernels for `fused` regions (plan, code generation).
//! - `lanes`: each f32 op's body, written once, that kernels emit inline and the runner
//!   compiles per ISA; [`tile_program`]: that runner, a fused group's work over L1 tiles at
//!   AVX-512 or AVX2 width.
//! - [`exec`]: the compiled executor — a schedule of kernels, gemm matmuls and interpreter
//!   steps over planned, reused buffers.
//! - [`comm`]: communicators between ranks (threads of one process, or MPI processes) that
//!   collective and point-to-point ops run on.
//! - [`team`]: the threads kernels split their work over (helpers that spin between regions).
//! - [`limits`]: the memory a run may ask for and the trips a loop may make.
//! - [`subnormals`]: what compiled runs do with subnormal floats (flushed by default).
//! - [`settings`]: Kiln's environment variables (`KILN_DEBUG`, `KILN_PROFILE`, …), read in one
//!   place.
//!
//! Architecture invariant: the interpreter defines the semantics. A faster backend is correct
//! when it agrees with the interpreter (exactly for integers and layout ops, within stated
//! tolerances for floats).

pub mod array;
pub mod comm;
mod error;
pub mod exec;
pub mod interp;
pub mod jit;
pub mod limits;
pub mod random;
pub mod settings;
pub mod state;
pub mod subnormals;
pub mod team;

pub use array::{Array, Element};
pub use error::InterpError;
pub use interp::{CustomOpError, CustomOps, Env, Interpreter, unshare};
pub use state::StateStore;
