//! `kiln-runtime`: running Kiln programs.
//!
//! - [`program`]: static programs — placeholders, parameters, ops, targets.
//! - [`composite`]: softmax, losses, normalisation, activations — written once over the
//!   builder, used by static layers and eager code alike.
//! - [`layers`], [`init`], [`optim`]: layers, initializers and optimizers for them
//!   ([`optimizer_options`]: optimizers by PyTorch's option names, checked);
//!   [`layer_kind`]: the one table of layer kinds every front end dispatches on.
//! - [`session`]: runs any part of a program with feeds and fetches, over one [`scope`];
//!   [`custom_ops`]: the registry of user ops its runs and eager code call.
//! - [`eager`]: dygraph — eager tensors with a tape, layers, custom ops, control flow, and
//!   `to_static` tracing into static programs.
//! - [`distributed`]: data parallelism and parameter servers over a communicator's ranks.
//! - [`checkpoint`]: state as safetensors files; [`data`]: the built-in datasets.
//!
//! Architecture invariant: a `Session` runs only verified slices of its program, and every
//! state update goes through the scope, which checks types; a failed run or load changes
//! nothing.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod compare;
pub mod composite;
pub mod custom_ops;
pub mod data;
pub mod distributed;
pub mod eager;
pub mod error;
pub mod init;
pub mod layer_kind;
pub mod layers;
pub mod npy;
pub mod optim;
pub mod optimizer_options;
pub mod program;
pub mod sampling;
pub mod scope;
pub mod session;

pub use error::{RuntimeError, RuntimeResult};
pub use init::Init;
pub use layer_kind::{LayerForm, LayerKind, LayerKindError};
pub use optim::{Adam, ClipGradNorm, LearningRate, Momentum, Optimizer, Schedule, Sgd};
pub use optimizer_options::{OptimizerError, OptimizerOptions, OptionValue};
pub use program::{Param, Program, Target};
pub use sampling::Sampling;
pub use scope::Scope;
pub use session::{Backend, Feed, Fetch, KerasFunction, Runner, Session};
