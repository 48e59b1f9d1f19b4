//! Kiln: a deep-learning compiler and runtime for the CPU.
//!
//! Static programs and eager ("dygraph") code lower into one typed SSA IR ([`ir`]) with a
//! text form; passes ([`passes`]) derive gradients, simplify with e-graphs and fuse ops into
//! kernels; the backend ([`backend`]) runs programs as Cranelift-compiled kernels, gemm
//! matrix products and planned buffers, with the reference interpreter as the oracle. The
//! runtime ([`runtime`]) holds programs, sessions, layers, optimizers, eager tensors and
//! checkpoints. This crate re-exports those layers and adds [`serve`] (a saved program as a
//! Rust function), [`stats`], [`dot`] drawings, [`npy`] files, [`plot`] and the [`demos`].
//!
//! # A static program, trained in a session
//!
//! ```
//! use kiln::backend::Array;
//! use kiln::ir::{DType, Dim};
//! use kiln::runtime::layers::{self, Activation};
//! use kiln::runtime::{Adam, Fetch, Optimizer, Program, Session};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut p = Program::with_seed(0);
//! let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(4)])?;
//! let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
//! let h = layers::dense(&mut p, "fc1", x, 8, Activation::Relu)?;
//! let logits = layers::dense(&mut p, "fc2", h, 3, Activation::Identity)?;
//! let loss = layers::softmax_cross_entropy(&mut p, logits, y)?;
//! let train = Adam::new(0.05).minimize(&mut p, loss)?; // gradient and update ops
//!
//! let xs = Array::F32(ndarray::arr2(&[[1.0f32, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]]).into_dyn());
//! let ys = Array::I64(ndarray::arr1(&[0i64, 2]).into_dyn());
//! let feeds = [("x", xs), ("y", ys)];
//! let mut session = Session::new(&p)?; // runs compiled: passes, JIT kernels
//! let before = session.run(&[loss.into()], &feeds)?[0].to_f64_vec()[0];
//! for _ in 0..30 {
//!     session.run(&[Fetch::Target(train)], &feeds)?;
//! }
//! let after = session.run(&[loss.into()], &feeds)?[0].to_f64_vec()[0];
//! assert!(after < before / 2.0);
//! # Ok(()) }
//! ```
//!
//! # Eager code, and the same code compiled with `to_static`
//!
//! ```
//! use kiln::backend::Array;
//! use kiln::ir::{DType, Dim, Shape, Type};
//! use kiln::runtime::eager::{self, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let x = Tensor::new(Array::F32(ndarray::arr1(&[0.5f32, -1.0, 2.0]).into_dyn()));
//! let x = x.requires_grad()?;
//! let y = (&x * &x).tanh()?.sum_all()?; // computed at once
//! y.backward()?;
//! let dx = x.grad().expect("x requires a gradient").to_f64_vec()?;
//! let want = |v: f64| 2.0 * v * (1.0 - (v * v).tanh().powi(2));
//! assert!((dx[2] - want(2.0)).abs() < 1e-5);
//!
//! // Traced into a static program (a symbolic length), run compiled, same value.
//! let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N")]));
//! let mut f = eager::to_static(&[("x", ty)], |t| Ok(vec![(&t[0] * &t[0]).tanh()?.sum_all()?]))?;
//! let traced = f.call(&[&x])?[0].item()?;
//! assert!((traced - y.item()?).abs() < 1e-6);
//! # Ok(()) }
//! ```
//!
//! # A custom op with its own forward and backward
//!
//! ```
//! use kiln::backend::Array;
//! use kiln::runtime::eager::{self, CustomOp, CustomOpError, Tensor};
//! use std::sync::Arc;
//!
//! /// x³, computed by hand.
//! struct Cube;
//!
//! impl CustomOp for Cube {
//!     fn name(&self) -> &str {
//!         "cube"
//!     }
//!     fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>, CustomOpError> {
//!         match &inputs[0] {
//!             Array::F32(x) => Ok(vec![Array::F32(x.mapv(|v| v * v * v))]),
//!             other => Err(format!("cube takes f32, not {}", other.dtype()).into()),
//!         }
//!     }
//!     fn backward(&self, inputs: &[Array], _: &[Array], grads: &[Array]) -> Result<Vec<Array>, CustomOpError> {
//!         match (&inputs[0], &grads[0]) {
//!             (Array::F32(x), Array::F32(g)) => Ok(vec![Array::F32(x.mapv(|v| 3.0 * v * v) * g)]),
//!             _ => Err("cube takes f32".into()),
//!         }
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! eager::register_custom_op(Arc::new(Cube))?;
//! let x = Tensor::new(Array::F32(ndarray::arr1(&[2.0f32]).into_dyn())).requires_grad()?;
//! let y = eager::custom::call("cube", &[&x])?.remove(0);
//! y.sum_all()?.backward()?;
//! assert_eq!(y.item()?, 8.0);
//! assert_eq!(x.grad().unwrap().item()?, 12.0); // its own backward: 3·2²
//! # Ok(()) }
//! ```
//!
//! # Embedding: a saved program as a Rust function
//!
//! ```
//! use kiln::backend::Array;
//! use kiln::ir::{DType, Dim};
//! use kiln::runtime::layers::{self, Activation};
//! use kiln::runtime::{Program, Session, checkpoint};
//! use kiln::serve::Predictor;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Save a model: the prediction program as text IR, its parameters as safetensors.
//! let mut p = Program::with_seed(0);
//! let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(4)])?;
//! let logits = layers::dense(&mut p, "fc", x, 3, Activation::Identity)?;
//! let session = Session::new(&p)?;
//! let dir = std::env::temp_dir().join(format!("kiln-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! checkpoint::save_module(&p.export_module(&[("predict", &[logits])])?, &dir.join("predict.kir"))?;
//! session.scope().save(&dir.join("params.safetensors"))?;
//!
//! // Serve it: load, compile once, call.
//! let mut model = Predictor::load(&dir.join("predict.kir"), &dir.join("params.safetensors"))?;
//! let batch = Array::F32(ndarray::Array2::<f32>::ones((2, 4)).into_dyn());
//! let out = model.predict(vec![batch])?;
//! assert_eq!(out[0].shape(), &[2, 3]);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

pub use kiln_backend as backend;
pub use kiln_ir as ir;
pub use kiln_onnx as onnx;
pub use kiln_passes as passes;
pub use kiln_runtime as runtime;

pub mod book;
/// The examples' and the tour's code, shared with the tests that run them small (not API).
#[doc(hidden)]
pub mod demos;
pub mod diff;
pub mod dot;
pub use kiln_runtime::eager;
pub mod fuzz;
pub mod lm;
pub use kiln_runtime::npy;
pub mod plot;
pub mod report;
pub mod serve;
pub mod stats;
pub mod train;
/// The peers' benchmark workloads, shared by `benches/` and `examples/peer_workloads.rs`
/// (not API).
#[doc(hidden)]
pub mod workloads;

/// The names most programs need.
pub mod prelude {
    pub use kiln_backend::{Array, Interpreter, StateStore};
    pub use kiln_ir::{
        DType, Dim, Function, FunctionBuilder, Initializer, Module, Shape, StateDecl, Type, Value,
        parse_module, verify_module,
    };
}

/// The README's and the book's Rust samples (`docs/src`), compiled and run as doc-tests.
#[cfg(doctest)]
mod book_samples {
    #[doc = include_str!("../README.md")]
    mod readme {}

    macro_rules! chapters {
        ($($name:ident = $path:literal;)*) => {$(
            #[doc = include_str!(concat!("../docs/src/", $path))]
            mod $name {}
        )*};
    }
    chapters! {
        static_programs = "guides/static-programs.md";
        eager = "guides/eager.md";
        custom_ops = "guides/custom-ops.md";
        control_flow = "guides/control-flow.md";
        layers = "guides/layers.md";
        training = "guides/training.md";
        language_model = "guides/language-model.md";
        distributed = "guides/distributed.md";
        embedding = "guides/embedding.md";
        inspecting = "guides/inspecting.md";
        onnx = "guides/onnx.md";
        compiled_execution = "contributing/compiled-execution.md";
    }
}
