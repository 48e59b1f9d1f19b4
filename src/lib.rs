//! Kiln: a deep-learning compiler and runtime.
//!
//! Static programs and eager ("dygraph") code lower into one typed SSA IR ([`ir`]); passes
//! ([`passes`]) transform it; backends ([`backend`]) run it — the reference interpreter today.
//! This crate re-exports the layers and holds the tools around them: [`npy`] array files and
//! [`dot`] drawings. The `kiln` command-line tool is built from this crate.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let module = parse_module(r#"
//! module {
//!   func @double(%x: f32[N]) -> f32[N] {
//!     %y = add %x, %x : f32[N]
//!     return %y
//!   }
//! }"#).unwrap();
//! verify_module(&module).unwrap();
//!
//! let x = Array::F32(ndarray::arr1(&[1.0f32, 2.5]).into_dyn());
//! let mut state = StateStore::initialize(&module).unwrap();
//! let y = Interpreter::new(&module).run("double", vec![x], &mut state).unwrap();
//! assert_eq!(y[0].to_f64_vec(), [2.0, 5.0]);
//! ```

pub use kiln_backend as backend;
pub use kiln_ir as ir;
pub use kiln_passes as passes;
pub use kiln_runtime as runtime;

pub mod demos;
pub mod dot;
pub mod npy;
pub mod plot;
pub mod serve;
pub mod stats;
pub mod workloads;

/// The names most programs need.
pub mod prelude {
    pub use kiln_backend::{Array, Interpreter, StateStore};
    pub use kiln_ir::{
        DType, Dim, Function, FunctionBuilder, Initializer, Module, Shape, StateDecl, Type, Value,
        parse_module, verify_module,
    };
}
