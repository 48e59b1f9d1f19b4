//! `kiln-ir`: the one typed SSA IR that Kiln's static programs and traced dygraph code lower into.
//!
//! - [`types`]: dtypes, shapes with fixed and symbolic dimensions, tensor types.
//! - [`op`]: the op table — every op declared once; everything else matches on it.
//! - [`function`], [`module`]: arena storage with typed ids ([`Value`], [`Inst`], [`Region`]).
//! - [`builder`]: building functions in Rust, typed as you go, errors with the caller's line.
//! - [`infer`]: the type rule of every op. [`verify`]: the verifier.
//! - [`print`], [`parse`]: the text form; `parse(print(m)) == m` for every module.
//!
//! Architecture invariants:
//! - Control flow is structured: `cond` and `while` own regions, so dominance is lexical.
//! - A function reads state as of its call; its stores take effect when it returns.
//! - Elementwise ops take operands of one type: broadcasting is an explicit `broadcast` op.
//! - No panics on user input: parsing, building and verifying return errors with locations.

#![forbid(unsafe_code)]

pub mod builder;
pub mod diagnostic;
pub mod entities;
pub mod function;
pub mod infer;
pub mod literal;
pub mod loc;
pub mod module;
pub mod op;
pub mod parse;
pub mod print;
pub mod types;
pub mod verify;
pub mod window;

pub use builder::{BuildError, BuildResult, FunctionBuilder, identifier};
pub use diagnostic::{SourceError, parse_and_verify};
pub use entities::{Inst, Region, Value};
pub use function::{Function, InstData, MAX_REGION_DEPTH, RegionData, ValueData, ValueDef};
pub use infer::TypeError;
pub use literal::Literal;
pub use loc::{Loc, SourceNode};
pub use module::{InitialValuesError, Initializer, Module, StateConflict, StateDecl};
pub use op::{
    AllReduceOp, ArgOp, AxisSlice, BinaryOp, CompareOp, Cost, DTypeClass, Distribution, F64Attr,
    Helper, Op, OpClass, ReduceOp, UnaryOp, VectorForm,
};
pub use parse::{ParseError, parse_module};
pub use types::{BindError, DType, Dim, Shape, Symbol, SymbolBindings, TooLarge, Type};
pub use verify::{VerifyError, VerifyErrors, verify_module};
pub use window::{
    Conv2dAttrs, ConvKind, NCHW_TO_NHWC, NHWC_TO_NCHW, Pool2dAttrs, PoolKind, WindowError,
    spatial_axes,
};
