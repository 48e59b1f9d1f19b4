//! The op table: what each op computes, its name in the text form, its attributes, and every
//! per-op fact the rest of Kiln needs.
//!
//! Elementwise ops are rows of the tables [`with_unary_ops!`], [`with_binary_ops!`] and
//! [`with_compare_ops!`]: a row gives the text name, the shorthand method, the operand dtypes,
//! the [`Cost`], the f32 [`VectorForm`] and the scalar [`Helper`]. Parsing, printing, dtype
//! rules, the e-graph language, the builder's and eager tensors' shorthand methods, kernel cost
//! models, vectorisation and the JIT's helper symbols are all derived from the row. Every other
//! place matches on [`Op`] (or the table's enum) exhaustively, so a new op that the table knows
//! but a backend does not is a compile error.
//!
//! The checklist for a new elementwise op (what a transcendental such as `softplus` touches):
//!
//! 1. its row in the table here;
//! 2. its scalar function in the interpreter (`kiln-backend`, `interp/kernels.rs`; the JIT's
//!    helper symbols call the same function) — a compile error until written;
//! 3. its gradient rule (`kiln-passes`, `autodiff/rules.rs`) — a compile error until written;
//! 4. its one vector body, unless its row says `F32AndF64` helpers: the arm of
//!    `kiln-backend`'s `jit::bodies::unary` (or `binary`), written over the `Lanes` trait — the same
//!    body becomes Cranelift's inline code (f32x4, f32 and f64 scalars) and the tile-program
//!    runner's at AVX-512/AVX2 width (f64 uses the same body unless the row names an f64
//!    helper, so a body built on f32 bit patterns, as exp's, needs its row to say `F64`);
//!    and, for an op the table accepts on integers, its
//!    integer code in `jit/codegen/elementwise.rs` (else its name in that match's list of
//!    float-only ops) — each a compile error until written;
//! 5. tests: hand values in `backend/tests/interp_ops.rs`, its domain in the exhaustive match of
//!    `passes/tests/grad_check.rs` (a compile error until added), and for a new approximation
//!    its ULP bound in `backend/tests/math_ulp.rs`. The JIT differential tests iterate the
//!    table (each op against the interpreter on both compiled forms, and the two forms bit for
//!    bit), so they cover it already.
//!
//! `scripts/checklist_op.sh` (run by CI) proves it: it adds a throwaway op, `cube`, to a copy of
//! the workspace by these steps and checks that after each the compiler names exactly the
//! places of the next, and at the end that the op's kernels match the interpreter on every
//! path and its gradient matches finite differences.
//!
//! Any other op: a variant of [`Op`] with its attributes in [`Op::attributes`],
//! [`Op::from_parts`] and [`Op::all_names`]; then the compiler lists the exhaustive matches
//! that must learn it (type rule in `infer.rs`, cost, class, interpreter, gradient, extraction,
//! executor). A region, a call or a communication op joins [`opaque_op!`] (and a
//! communication op [`communication_op!`]), the one list the passes, the schedule and the
//! interpreter match such ops by.

use crate::literal::Literal;
use crate::types::{DType, Shape, Type};
use crate::window::{Conv2dAttrs, ConvKind, Pool2dAttrs, PoolKind};
use std::fmt;
use std::hash::{Hash, Hasher};

/// Which element types an elementwise op accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeClass {
    /// f32, f64
    Float,
    /// floats and integers
    Numeric,
    /// bool only
    Bool,
    /// every dtype
    Any,
}

impl DTypeClass {
    /// Whether `dtype` is in the class.
    pub fn admits(self, dtype: DType) -> bool {
        match self {
            DTypeClass::Float => dtype.is_float(),
            DTypeClass::Numeric => dtype.is_numeric(),
            DTypeClass::Bool => dtype == DType::Bool,
            DTypeClass::Any => true,
        }
    }

    /// The class in words, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            DTypeClass::Float => "a float type (f32, f64)",
            DTypeClass::Numeric => "a numeric type (f32, f64, i32, i64)",
            DTypeClass::Bool => "bool",
            DTypeClass::Any => "any type",
        }
    }
}

/// What an op costs per element, for kernel cost models, extraction and stashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cost {
    /// About one instruction: add, compare, select, abs, a cast.
    Cheap,
    /// One instruction of many cycles' latency: a division, a square root, a rounding.
    Slow,
    /// A polynomial, a rational approximation or a call: an order of magnitude above arithmetic.
    Transcendental,
    /// Reads many elements per result.
    Reduction,
    /// Moves or replicates elements without arithmetic.
    DataMovement,
    /// Multiply-accumulates over a contracted axis (matmul).
    Contraction,
    /// Regions, calls, state: not an elementwise cost at all.
    Opaque,
}

/// Whether an f32 elementwise op has a four-lane form in compiled kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorForm {
    /// Computed on f32x4 lanes.
    F32x4,
    /// Computed one element at a time (a scalar helper call): the whole inner loop runs scalar.
    Scalar,
}

/// Which float dtypes compiled kernels compute by calling the op's scalar helper
/// ([`UnaryOp::helper_symbol`]) instead of inline instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    /// Inline for every dtype.
    None,
    /// A polynomial inline for f32; `kiln_<name>` for f64.
    F64,
    /// `kiln_<name>f` for f32 and `kiln_<name>` for f64.
    F32AndF64,
}

/// Declares one elementwise table's enum from its rows (see [`with_unary_ops!`] for the columns).
macro_rules! op_table {
    ($(#[$meta:meta])* $name:ident {
        $($variant:ident = $text:literal, $method:ident, $class:ident, $cost:ident, $vector:ident, $helper:ident;)*
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $(#[doc = concat!("`", $text, "`")] $variant),* }

        impl $name {
            /// Every op of the table, in table order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The op's name in the text form.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            /// The op whose text-form name is `name`.
            pub fn from_name(name: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|op| op.name() == name)
            }

            /// The name of the builder's and eager tensors' shorthand method.
            pub fn method(self) -> &'static str {
                match self { $($name::$variant => stringify!($method)),* }
            }

            /// The operand dtypes this op accepts.
            pub fn operand_class(self) -> DTypeClass {
                match self { $($name::$variant => DTypeClass::$class),* }
            }

            /// What the op costs per element.
            pub fn cost(self) -> Cost {
                match self { $($name::$variant => Cost::$cost),* }
            }

            /// Whether compiled kernels compute the op on f32x4 lanes.
            pub fn vector_form(self) -> VectorForm {
                match self { $($name::$variant => VectorForm::$vector),* }
            }

            /// Which float dtypes call the op's scalar helper in compiled kernels.
            pub fn helper(self) -> Helper {
                match self { $($name::$variant => Helper::$helper),* }
            }

            /// The symbol compiled kernels call for `dtype`, where they call one:
            /// `kiln_<name>f` (f32) or `kiln_<name>` (f64).
            pub fn helper_symbol(self, dtype: DType) -> Option<&'static str> {
                match (self, dtype, self.helper()) {
                    $(
                        ($name::$variant, DType::F32, Helper::F32AndF64) => {
                            Some(concat!("kiln_", $text, "f"))
                        }
                        ($name::$variant, DType::F64, Helper::F64 | Helper::F32AndF64) => {
                            Some(concat!("kiln_", $text))
                        }
                    )*
                    _ => None,
                }
            }
        }
    };
}

/// The table of elementwise functions of one operand, one row per op, handed to `$m!`:
///
/// `Variant = "text name", shorthand method, operand dtypes, cost, f32 vector form, helper;`
///
/// - *shorthand method*: `FunctionBuilder::tanh`, `Tensor::tanh`, … are generated from it;
/// - *operand dtypes*: a [`DTypeClass`]; *cost*: a [`Cost`]; *f32 vector form*: a
///   [`VectorForm`]; *helper*: a [`Helper`] (the symbols are `kiln_<name>` and `kiln_<name>f`).
///
/// Every per-op fact lives here; the other tables below have the same columns.
#[macro_export]
macro_rules! with_unary_ops {
    ($m:ident) => {
        $m! {
            /// Elementwise functions of one operand; the result has the operand's type.
            UnaryOp {
                Neg = "neg", neg, Numeric, Cheap, F32x4, None;
                Abs = "abs", abs, Numeric, Cheap, F32x4, None;
                Sign = "sign", sign, Numeric, Cheap, F32x4, None;
                Relu = "relu", relu, Numeric, Cheap, F32x4, None;
                Exp = "exp", exp, Float, Transcendental, F32x4, F64;
                Log = "log", log, Float, Transcendental, F32x4, F64;
                Sqrt = "sqrt", sqrt, Float, Slow, F32x4, None;
                Rsqrt = "rsqrt", rsqrt, Float, Slow, F32x4, None;
                Recip = "recip", recip, Float, Slow, F32x4, None;
                Tanh = "tanh", tanh, Float, Transcendental, F32x4, F64;
                Sigmoid = "sigmoid", sigmoid, Float, Transcendental, F32x4, F64;
                Softplus = "softplus", softplus, Float, Transcendental, F32x4, F64;
                Erf = "erf", erf, Float, Transcendental, F32x4, F64;
                Sin = "sin", sin, Float, Transcendental, Scalar, F32AndF64;
                Cos = "cos", cos, Float, Transcendental, Scalar, F32AndF64;
                Floor = "floor", floor, Float, Slow, F32x4, None;
                Ceil = "ceil", ceil, Float, Slow, F32x4, None;
                Round = "round", round, Float, Slow, F32x4, None;
                Not = "not", not, Bool, Cheap, F32x4, None;
                StopGradient = "stop_gradient", stop_gradient, Float, Cheap, F32x4, None;
            }
        }
    };
}

/// The table of elementwise functions of two operands (columns as in [`with_unary_ops!`]).
#[macro_export]
macro_rules! with_binary_ops {
    ($m:ident) => {
        $m! {
            /// Elementwise functions of two operands of one type; the result has that type.
            BinaryOp {
                Add = "add", add, Numeric, Cheap, F32x4, None;
                Sub = "sub", sub, Numeric, Cheap, F32x4, None;
                Mul = "mul", mul, Numeric, Cheap, F32x4, None;
                Div = "div", div, Numeric, Slow, F32x4, None;
                Max = "max", maximum, Numeric, Cheap, F32x4, None;
                Min = "min", minimum, Numeric, Cheap, F32x4, None;
                Pow = "pow", pow, Float, Transcendental, Scalar, F32AndF64;
                And = "and", and, Bool, Cheap, F32x4, None;
                Or = "or", or, Bool, Cheap, F32x4, None;
                Xor = "xor", xor, Bool, Cheap, F32x4, None;
            }
        }
    };
}

/// The table of elementwise comparisons (columns as in [`with_unary_ops!`]).
#[macro_export]
macro_rules! with_compare_ops {
    ($m:ident) => {
        $m! {
            /// Elementwise comparisons of two operands of one type; the result is bool.
            CompareOp {
                Eq = "eq", eq, Any, Cheap, F32x4, None;
                Ne = "ne", ne, Any, Cheap, F32x4, None;
                Lt = "lt", lt, Numeric, Cheap, F32x4, None;
                Le = "le", le, Numeric, Cheap, F32x4, None;
                Gt = "gt", gt, Numeric, Cheap, F32x4, None;
                Ge = "ge", ge, Numeric, Cheap, F32x4, None;
            }
        }
    };
}

with_unary_ops!(op_table);
with_binary_ops!(op_table);
with_compare_ops!(op_table);

op_table! {
    /// Reductions over a set of axes.
    ReduceOp {
        Sum = "reduce_sum", sum, Numeric, Reduction, F32x4, None;
        Mean = "reduce_mean", mean, Float, Reduction, F32x4, None;
        Max = "reduce_max", max, Numeric, Reduction, F32x4, None;
        Min = "reduce_min", min, Numeric, Reduction, F32x4, None;
    }
}

op_table! {
    /// Index of the extreme element along one axis; the result is i64.
    ArgOp {
        ArgMax = "argmax", argmax, Numeric, Reduction, Scalar, None;
        ArgMin = "argmin", argmin, Numeric, Reduction, Scalar, None;
    }
}

/// An f64 attribute compared and hashed by bits, so ops can be `Eq` and `Hash` (for CSE).
#[derive(Clone, Copy, Debug)]
pub struct F64Attr(pub f64);

impl PartialEq for F64Attr {
    fn eq(&self, other: &F64Attr) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for F64Attr {}

impl Ord for F64Attr {
    fn cmp(&self, other: &F64Attr) -> std::cmp::Ordering {
        self.0.to_bits().cmp(&other.0.to_bits())
    }
}

impl PartialOrd for F64Attr {
    fn partial_cmp(&self, other: &F64Attr) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for F64Attr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// The distribution a `random_*` op samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Distribution {
    /// Uniform samples in [`low`, `high`).
    Uniform {
        /// The lower bound.
        low: F64Attr,
        /// The upper bound.
        high: F64Attr,
    },
    /// Normal samples of `mean` and `std`.
    Normal {
        /// The mean.
        mean: F64Attr,
        /// The standard deviation.
        std: F64Attr,
    },
}

/// How an `all_reduce` combines the ranks' operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllReduceOp {
    /// `all_reduce_sum`: the sum over ranks.
    Sum,
    /// `all_reduce_mean`: the sum over ranks divided by their number (floats only).
    Mean,
}

/// The range a `slice` takes along one axis: `start..end` by `step`, or the whole axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AxisSlice {
    /// The whole axis.
    Full,
    /// `start..end` by `step` (the text form writes `start:end:step`).
    Range {
        /// The first index.
        start: usize,
        /// One past the last index.
        end: usize,
        /// The distance between indices (at least 1).
        step: usize,
    },
}

impl AxisSlice {
    /// The number of elements the slice selects from an axis of `size` (already checked).
    pub fn len(self, size: usize) -> usize {
        match self {
            AxisSlice::Full => size,
            AxisSlice::Range { start, end, step } => (end.saturating_sub(start)).div_ceil(step),
        }
    }
}

impl fmt::Display for AxisSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AxisSlice::Full => f.write_str(":"),
            AxisSlice::Range {
                start,
                end,
                step: 1,
            } => write!(f, "{start}:{end}"),
            AxisSlice::Range { start, end, step } => write!(f, "{start}:{end}:{step}"),
        }
    }
}

/// The ops that move data between ranks, as a pattern: `communication_op!() => …`. Declared
/// once, so that the passes, the schedule and the interpreter that treat them alike list them
/// alike; a new op outside it still has to be named in every exhaustive `match`.
#[macro_export]
macro_rules! communication_op {
    () => {
        $crate::Op::AllReduce { .. }
            | $crate::Op::ReduceScatter { .. }
            | $crate::Op::AllGather { .. }
            | $crate::Op::Shard { .. }
            | $crate::Op::CollectiveBroadcast { .. }
            | $crate::Op::Send { .. }
            | $crate::Op::Recv { .. }
    };
}

/// The ops the optimising passes do not look inside, as a pattern: regions (`cond`, `while`,
/// `fused`), calls and communication. No elementwise cost, no fusion, no rewrite, no local
/// gradient rule (a region's gradient is the sweep's, a call's its custom op's).
#[macro_export]
macro_rules! opaque_op {
    () => {
        $crate::Op::Cond
            | $crate::Op::While
            | $crate::Op::Fused
            | $crate::Op::Call { .. }
            | $crate::communication_op!()
    };
}

/// What an instruction computes. Operands, results and regions live in the instruction.
/// Ops are ordered (totally, consistently with `==`) so they can be e-graph operators.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// A constant: one element (splat) or every element of a static shape.
    Const {
        /// The elements.
        value: Literal,
        /// The constant's type.
        ty: Type,
    },
    /// An elementwise function of one operand (a row of the unary table).
    Unary(UnaryOp),
    /// An elementwise function of two operands (a row of the binary table).
    Binary(BinaryOp),
    /// An elementwise comparison (a row of the comparison table).
    Compare(CompareOp),
    /// `select %cond, %on_true, %on_false`, elementwise; all three have one shape.
    Select,
    /// Converts the element type; floats to integers saturate (NaN gives 0).
    Cast {
        /// The target dtype.
        to: DType,
    },
    /// Stretches dimensions of size 1 and prepends dimensions, NumPy-style, to `shape`.
    Broadcast {
        /// The result shape.
        shape: Shape,
    },
    /// Same elements in row-major order, new shape.
    Reshape {
        /// The result shape.
        shape: Shape,
    },
    /// Result axis `i` is operand axis `perm[i]`.
    Transpose {
        /// The permutation of the axes.
        perm: Vec<usize>,
    },
    /// A range of each axis.
    Slice {
        /// The range taken along each axis.
        axes: Vec<AxisSlice>,
    },
    /// Zero padding: `low` before, `high` after, and `interior` between the elements of each
    /// axis (so a strided slice's gradient is a pad).
    Pad {
        /// Zeros before each axis.
        low: Vec<usize>,
        /// Zeros after each axis.
        high: Vec<usize>,
        /// Zeros between the elements of each axis.
        interior: Vec<usize>,
    },
    /// Operands joined along an axis.
    Concat {
        /// The axis joined along.
        axis: usize,
    },
    /// A reduction over a set of axes.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The axes reduced.
        axes: Vec<usize>,
        /// Whether the reduced axes stay, with size 1.
        keep_dims: bool,
    },
    /// The index of the extreme element along one axis.
    ArgReduce {
        /// Which extreme.
        op: ArgOp,
        /// The axis searched.
        axis: usize,
        /// Whether the axis stays, with size 1.
        keep_dims: bool,
    },
    /// `[..., M, K] @ [..., K, N]`; batch dimensions broadcast NumPy-style; the flags transpose
    /// the last two axes of an operand first.
    MatMul {
        /// Whether the left operand's last two axes are swapped first.
        transpose_a: bool,
        /// Whether the right operand's last two axes are swapped first.
        transpose_b: bool,
    },
    /// `c + scale · (a @ b)` (operands `a`, `b`, `c`; flags as [`Op::MatMul`]'s): a product
    /// accumulated onto `c`, of `c`'s type — gemm's `c ← c + α·a·b`. The
    /// `fold-updates-into-products` pass makes it of an update `w − lr·g` whose gradient `g`
    /// is a product nothing else reads, so the gradient is never written and the update
    /// takes no pass of its own over `w`.
    MatMulAcc {
        /// Whether the left operand's last two axes are swapped first.
        transpose_a: bool,
        /// Whether the right operand's last two axes are swapped first.
        transpose_b: bool,
        /// The product's factor.
        scale: F64Attr,
    },
    /// `table[..., indices, ...]` along `axis`: result shape
    /// `table[..axis] ++ indices ++ table[axis+1..]`.
    Gather {
        /// The axis indexed.
        axis: usize,
    },
    /// `array` with its slice at the scalar `index` along `axis` replaced by `value` (whose
    /// shape is `array`'s without `axis`); an index out of range is an error. Operands: array,
    /// value, index. The compiled executor writes the slice in place when `array` dies here, so
    /// a loop that fills a stack of its states does O(state) work per step.
    UpdateSlice {
        /// The axis indexed.
        axis: usize,
    },
    /// The transpose of `gather`: zeros of `shape` with `updates` added at `indices` along
    /// `axis` (repeated indices accumulate). Operands: updates, indices.
    ScatterAdd {
        /// The axis indexed.
        axis: usize,
        /// The result shape.
        shape: Shape,
    },
    /// A 2-D convolution over NCHW with OIHW weights, or one of its transposes (see
    /// [`ConvKind`]).
    Conv2d {
        /// The convolution or a transpose.
        kind: ConvKind,
        /// Strides, padding, dilation, groups.
        attrs: Conv2dAttrs,
    },
    /// 2-D max or average pooling over NCHW, or the gradient of one (see [`PoolKind`]).
    Pool2d {
        /// Which pooling op.
        kind: PoolKind,
        /// Window, strides, padding.
        attrs: Pool2dAttrs,
    },
    /// Integer labels to one-hot vectors along a new last axis of size `depth`.
    OneHot {
        /// The size of the new last axis.
        depth: usize,
        /// The result dtype.
        dtype: DType,
    },
    /// The index along `axis`, for every element of `ty`.
    Iota {
        /// The axis whose index each element holds.
        axis: usize,
        /// The result type.
        ty: Type,
    },
    /// Seeded samples. The same seed gives the same numbers within one run; the runtime
    /// advances a run counter so that successive runs draw fresh numbers, reproducibly.
    Random {
        /// The distribution sampled.
        dist: Distribution,
        /// The seed.
        seed: u64,
        /// The result type.
        ty: Type,
    },
    /// Reads a state variable as it was when the function was called.
    Load {
        /// The state read.
        state: String,
        /// Its type.
        ty: Type,
    },
    /// Writes a state variable; stores take effect when the function returns.
    Store {
        /// The state written.
        state: String,
    },
    /// `cond %pred` with regions `then` and `else`, each yielding the results.
    Cond,
    /// `while %init...` with regions `cond` (yields a bool) and `body` (yields the next values),
    /// both taking the loop-carried values as arguments.
    While,
    /// A group of ops that runs as one kernel: its region's arguments are the operands, and
    /// it yields the results. Made by the fusion pass.
    Fused,
    /// A registered custom op, with its result types stated.
    Call {
        /// The registered name of the custom op.
        callee: String,
        /// Its result types.
        results: Vec<Type>,
    },
    /// Every rank's operands combined elementwise; each rank gets the same results, one per
    /// operand. Several operands make one message (a gradient bucket). Without peers (one
    /// rank) the results are the operands.
    AllReduce {
        /// Sum or mean.
        op: AllReduceOp,
        /// f32 operands travel as bfloat16 (half the bytes): each rank's rounded to bf16,
        /// summed in f32 in rank order, the sum rounded to bf16 (`bf16=true`).
        bf16: bool,
    },
    /// Every rank's operands combined elementwise, and each rank given its part: the
    /// operands' first axis, `ranks` times each result's, split into `ranks` blocks, block
    /// `r` to rank `r` (ZeRO's gradient sharding). Several operands make one message.
    ReduceScatter {
        /// Sum or mean.
        op: AllReduceOp,
        /// How many ranks the program is built for (the results' types depend on it).
        ranks: usize,
    },
    /// Every rank's operands, concatenated along the first axis in rank order, on every rank
    /// (the inverse of [`Op::ReduceScatter`]'s split).
    AllGather {
        /// How many ranks the program is built for.
        ranks: usize,
    },
    /// This rank's block of each operand: the first axis split into `ranks` blocks, block `r`
    /// on rank `r` (what [`Op::ReduceScatter`] gives, without communicating).
    Shard {
        /// How many ranks the program is built for.
        ranks: usize,
    },
    /// The `root` rank's operands, on every rank (XLA's `collective-broadcast`; `broadcast`
    /// is the shape op).
    CollectiveBroadcast {
        /// The rank whose values every rank gets.
        root: usize,
    },
    /// Sends the operands to rank `peer`; no results. Matched by the peer's `recv` of the
    /// same `tag`, in order.
    Send {
        /// The receiving rank.
        peer: usize,
        /// Pairs the send with its `recv`.
        tag: u64,
    },
    /// Receives values of the stated types from rank `peer`'s `send` of the same `tag`.
    Recv {
        /// The sending rank.
        peer: usize,
        /// Pairs the receive with its `send`.
        tag: u64,
        /// The received values' types.
        results: Vec<Type>,
    },
}

/// The broad class of an op: what fusion, scheduling and cost models care about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpClass {
    /// One result element from the same-index elements of the operands.
    Elementwise,
    /// Moves or replicates elements without arithmetic.
    Layout,
    /// Reads many elements per result.
    Reduction,
    /// Multiply-accumulates over a contracted axis.
    Contraction,
    /// Reads elements at data-dependent positions.
    Indexing,
    /// No operands: constants, iota, random, loads.
    Source,
    /// Side effects: stores.
    Effect,
    /// Ops with regions.
    Control,
    /// Custom-op calls.
    Call,
    /// Collectives and point-to-point messages between ranks: never fused, reordered
    /// against each other, or removed.
    Communication,
}

/// An attribute value in the text form: `{axes=[0,1], keep_dims=true}`.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// Wide enough for every i64 and u64 (seeds).
    Int(i128),
    /// A number with a fraction or exponent.
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// A list of integers: `[0, 1]`.
    Ints(Vec<i64>),
    /// A list of ranges: `[0:2, :]`.
    Slices(Vec<AxisSlice>),
    /// A list of pairs: `[(1, 1), (0, 2)]` (padding as low and high per axis).
    Pairs(Vec<(i64, i64)>),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            Attr::Float(v) => {
                let mut s = String::new();
                Literal::F64(vec![*v]).fmt_element(0, &mut s)?;
                f.write_str(&s)
            }
            Attr::Bool(v) => write!(f, "{v}"),
            Attr::Ints(v) => write_list(f, v),
            Attr::Slices(v) => write_list(f, v),
            Attr::Pairs(v) => {
                let pairs: Vec<String> = v.iter().map(|(a, b)| format!("({a}, {b})")).collect();
                write!(f, "[{}]", pairs.join(", "))
            }
        }
    }
}

fn write_list<T: fmt::Display>(f: &mut fmt::Formatter<'_>, items: &[T]) -> fmt::Result {
    f.write_str("[")?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{item}")?;
    }
    f.write_str("]")
}

/// The pieces of an op as the text form spells them, from which [`Op::from_parts`] rebuilds it.
/// `const` is the one op with a literal; the parser builds it directly.
pub struct OpParts<'a> {
    /// The op's name.
    pub name: &'a str,
    /// The `@name` after it, if any.
    pub symbol: Option<&'a str>,
    /// The attributes in braces.
    pub attrs: &'a [(String, Attr)],
    /// The result types after the colon.
    pub result_types: &'a [Type],
}

impl Op {
    /// The op's name in the text form.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Const { .. } => "const",
            Op::Unary(op) => op.name(),
            Op::Binary(op) => op.name(),
            Op::Compare(op) => op.name(),
            Op::Select => "select",
            Op::Cast { .. } => "cast",
            Op::Broadcast { .. } => "broadcast",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Pad { .. } => "pad",
            Op::Concat { .. } => "concat",
            Op::Reduce { op, .. } => op.name(),
            Op::ArgReduce { op, .. } => op.name(),
            Op::MatMul { .. } => "matmul",
            Op::MatMulAcc { .. } => "matmul_acc",
            Op::Gather { .. } => "gather",
            Op::UpdateSlice { .. } => "update_slice",
            Op::ScatterAdd { .. } => "scatter_add",
            Op::Conv2d { kind, .. } => match kind {
                ConvKind::Forward => "conv2d",
                ConvKind::InputGrad { .. } => "conv2d_input_grad",
                ConvKind::FilterGrad { .. } => "conv2d_filter_grad",
            },
            Op::Pool2d { kind, .. } => match kind {
                PoolKind::Max => "max_pool2d",
                PoolKind::Avg => "avg_pool2d",
                PoolKind::MaxGrad => "max_pool2d_grad",
                PoolKind::AvgGrad { .. } => "avg_pool2d_grad",
            },
            Op::OneHot { .. } => "one_hot",
            Op::Iota { .. } => "iota",
            Op::Random {
                dist: Distribution::Uniform { .. },
                ..
            } => "random_uniform",
            Op::Random {
                dist: Distribution::Normal { .. },
                ..
            } => "random_normal",
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::Cond => "cond",
            Op::While => "while",
            Op::Fused => "fused",
            Op::Call { .. } => "call",
            Op::AllReduce { op, .. } => match op {
                AllReduceOp::Sum => "all_reduce_sum",
                AllReduceOp::Mean => "all_reduce_mean",
            },
            Op::ReduceScatter { op, .. } => match op {
                AllReduceOp::Sum => "reduce_scatter_sum",
                AllReduceOp::Mean => "reduce_scatter_mean",
            },
            Op::AllGather { .. } => "all_gather",
            Op::Shard { .. } => "shard",
            Op::CollectiveBroadcast { .. } => "collective_broadcast",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
        }
    }

    /// The op's broad class.
    pub fn class(&self) -> OpClass {
        match self {
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. } => {
                OpClass::Elementwise
            }
            Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concat { .. } => OpClass::Layout,
            Op::Reduce { .. } | Op::ArgReduce { .. } => OpClass::Reduction,
            Op::MatMul { .. } | Op::MatMulAcc { .. } | Op::Conv2d { .. } => OpClass::Contraction,
            Op::Pool2d { .. } => OpClass::Reduction,
            Op::Gather { .. }
            | Op::UpdateSlice { .. }
            | Op::ScatterAdd { .. }
            | Op::OneHot { .. } => OpClass::Indexing,
            Op::Const { .. } | Op::Iota { .. } | Op::Random { .. } | Op::Load { .. } => {
                OpClass::Source
            }
            Op::Store { .. } => OpClass::Effect,
            Op::Cond | Op::While | Op::Fused => OpClass::Control,
            Op::Call { .. } => OpClass::Call,
            communication_op!() => OpClass::Communication,
        }
    }

    /// What the op costs per element; elementwise ops take theirs from their table row.
    pub fn cost(&self) -> Cost {
        match self {
            Op::Unary(op) => op.cost(),
            Op::Binary(op) => op.cost(),
            Op::Compare(op) => op.cost(),
            Op::Const { .. } | Op::Select | Op::Cast { .. } | Op::Iota { .. } => Cost::Cheap,
            // A hash per element, and a logarithm and a cosine for normal samples.
            Op::Random { .. } => Cost::Transcendental,
            Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Pad { .. }
            | Op::Concat { .. }
            | Op::Gather { .. }
            | Op::UpdateSlice { .. }
            | Op::ScatterAdd { .. }
            | Op::OneHot { .. } => Cost::DataMovement,
            Op::Reduce { .. } | Op::ArgReduce { .. } | Op::Pool2d { .. } => Cost::Reduction,
            Op::MatMul { .. } | Op::MatMulAcc { .. } | Op::Conv2d { .. } => Cost::Contraction,
            Op::Load { .. } | Op::Store { .. } | opaque_op!() => Cost::Opaque,
        }
    }

    /// The labels of the op's regions, in order, as the text form writes them.
    pub fn region_labels(&self) -> &'static [&'static str] {
        match self {
            Op::Cond => &["then", "else"],
            Op::While => &["cond", "body"],
            Op::Fused => &["body"],
            _ => &[],
        }
    }

    /// Whether the op's regions take arguments (printed even when there are none).
    pub fn regions_take_args(&self) -> bool {
        matches!(self, Op::While | Op::Fused)
    }

    /// The `@name` the op refers to: state for load/store, the callee for call.
    pub fn symbol(&self) -> Option<&str> {
        match self {
            Op::Load { state, .. } | Op::Store { state } => Some(state),
            Op::Call { callee, .. } => Some(callee),
            _ => None,
        }
    }

    /// Whether the op has effects beyond its results, so it is never dead, merged or
    /// evaluated ahead of time. Communication counts: every rank must take part in the same
    /// collectives in the same order, whatever one rank's passes would make of them.
    pub fn has_side_effects(&self) -> bool {
        matches!(self, Op::Store { .. } | Op::Call { .. }) || self.class() == OpClass::Communication
    }

    /// The attributes the text form prints in braces. Attributes that the result type already
    /// states (a cast's target, a reshape's shape, …) are not repeated.
    pub fn attributes(&self) -> Vec<(&'static str, Attr)> {
        let ints = |v: &[usize]| Attr::Ints(v.iter().map(|&x| x as i64).collect());
        match self {
            Op::Transpose { perm } => vec![("perm", ints(perm))],
            Op::Slice { axes } => vec![("ranges", Attr::Slices(axes.clone()))],
            Op::Pad {
                low,
                high,
                interior,
            } => vec![
                ("low", ints(low)),
                ("high", ints(high)),
                ("interior", ints(interior)),
            ],
            Op::Concat { axis }
            | Op::Gather { axis }
            | Op::UpdateSlice { axis }
            | Op::ScatterAdd { axis, .. }
            | Op::Iota { axis, .. } => {
                vec![("axis", Attr::Int(*axis as i128))]
            }
            Op::Reduce {
                axes, keep_dims, ..
            } => {
                vec![("axes", ints(axes)), ("keep_dims", Attr::Bool(*keep_dims))]
            }
            Op::ArgReduce {
                axis, keep_dims, ..
            } => vec![
                ("axis", Attr::Int(*axis as i128)),
                ("keep_dims", Attr::Bool(*keep_dims)),
            ],
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => {
                let mut attrs = Vec::new();
                if *transpose_a {
                    attrs.push(("transpose_a", Attr::Bool(true)));
                }
                if *transpose_b {
                    attrs.push(("transpose_b", Attr::Bool(true)));
                }
                attrs
            }
            Op::MatMulAcc {
                transpose_a,
                transpose_b,
                scale,
            } => {
                let mut attrs = (Op::MatMul {
                    transpose_a: *transpose_a,
                    transpose_b: *transpose_b,
                })
                .attributes();
                attrs.push(("scale", Attr::Float(scale.0)));
                attrs
            }
            Op::Conv2d { attrs, .. } => attrs.attributes(),
            Op::Pool2d { attrs, .. } => attrs.attributes(),
            Op::CollectiveBroadcast { root } => vec![("root", Attr::Int(*root as i128))],
            Op::AllReduce { bf16: true, .. } => vec![("bf16", Attr::Bool(true))],
            Op::ReduceScatter { ranks, .. } | Op::AllGather { ranks } | Op::Shard { ranks } => {
                vec![("ranks", Attr::Int(*ranks as i128))]
            }
            Op::Send { peer, tag } | Op::Recv { peer, tag, .. } => vec![
                ("peer", Attr::Int(*peer as i128)),
                ("tag", Attr::Int(*tag as i128)),
            ],
            Op::Random { dist, seed, .. } => {
                let (a, b) = match dist {
                    Distribution::Uniform { low, high } => (("low", low), ("high", high)),
                    Distribution::Normal { mean, std } => (("mean", mean), ("std", std)),
                };
                vec![
                    (a.0, Attr::Float(a.1.0)),
                    (b.0, Attr::Float(b.1.0)),
                    ("seed", Attr::Int(*seed as i128)),
                ]
            }
            Op::Const { .. }
            | Op::Unary(_)
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Broadcast { .. }
            | Op::Reshape { .. }
            | Op::OneHot { .. }
            | Op::Load { .. }
            | Op::Store { .. }
            | Op::Cond
            | Op::While
            | Op::Fused
            | Op::Call { .. }
            | Op::AllReduce { .. } => Vec::new(),
        }
    }

    /// Rebuilds an op from its text-form pieces. `Err` says what is missing or malformed.
    pub(crate) fn from_parts(parts: &OpParts<'_>) -> Result<Op, String> {
        let attrs = AttrReader::new(parts.attrs);
        let symbol = || {
            parts
                .symbol
                .map(str::to_owned)
                .ok_or_else(|| format!("`{}` needs a `@name`", parts.name))
        };
        let single_result = || match parts.result_types {
            [t] => Ok(t.clone()),
            other => Err(format!(
                "`{}` has one result, found {} result types",
                parts.name,
                other.len()
            )),
        };
        let op = if let Some(op) = UnaryOp::from_name(parts.name) {
            Op::Unary(op)
        } else if let Some(op) = BinaryOp::from_name(parts.name) {
            Op::Binary(op)
        } else if let Some(op) = CompareOp::from_name(parts.name) {
            Op::Compare(op)
        } else if let Some(op) = ReduceOp::from_name(parts.name) {
            Op::Reduce {
                op,
                axes: attrs.usizes("axes")?,
                keep_dims: attrs.bool_or("keep_dims", false)?,
            }
        } else if let Some(op) = ArgOp::from_name(parts.name) {
            Op::ArgReduce {
                op,
                axis: attrs.usize("axis")?,
                keep_dims: attrs.bool_or("keep_dims", false)?,
            }
        } else {
            match parts.name {
                "select" => Op::Select,
                "cast" => Op::Cast {
                    to: single_result()?.dtype,
                },
                "broadcast" => Op::Broadcast {
                    shape: single_result()?.shape,
                },
                "reshape" => Op::Reshape {
                    shape: single_result()?.shape,
                },
                "transpose" => Op::Transpose {
                    perm: attrs.usizes("perm")?,
                },
                "slice" => Op::Slice {
                    axes: attrs.slices("ranges")?,
                },
                "pad" => Op::Pad {
                    low: attrs.usizes("low")?,
                    high: attrs.usizes("high")?,
                    interior: attrs.usizes("interior")?,
                },
                "concat" => Op::Concat {
                    axis: attrs.usize("axis")?,
                },
                "matmul" => Op::MatMul {
                    transpose_a: attrs.bool_or("transpose_a", false)?,
                    transpose_b: attrs.bool_or("transpose_b", false)?,
                },
                "matmul_acc" => Op::MatMulAcc {
                    transpose_a: attrs.bool_or("transpose_a", false)?,
                    transpose_b: attrs.bool_or("transpose_b", false)?,
                    scale: F64Attr(attrs.f64("scale")?),
                },
                "gather" => Op::Gather {
                    axis: attrs.usize("axis")?,
                },
                "update_slice" => Op::UpdateSlice {
                    axis: attrs.usize("axis")?,
                },
                "scatter_add" => Op::ScatterAdd {
                    axis: attrs.usize("axis")?,
                    shape: single_result()?.shape,
                },
                "conv2d" => Op::Conv2d {
                    kind: ConvKind::Forward,
                    attrs: attrs.conv2d(parts.name)?,
                },
                "conv2d_input_grad" => {
                    let attrs = attrs.conv2d(parts.name)?;
                    let input = spatial(&single_result()?, attrs.channels_last)?;
                    Op::Conv2d {
                        kind: ConvKind::InputGrad { input },
                        attrs,
                    }
                }
                "conv2d_filter_grad" => Op::Conv2d {
                    kind: ConvKind::FilterGrad {
                        kernel: spatial(&single_result()?, false)?,
                    },
                    attrs: attrs.conv2d(parts.name)?,
                },
                "max_pool2d" | "avg_pool2d" | "max_pool2d_grad" | "avg_pool2d_grad" => {
                    let attrs = attrs.pool2d(parts.name)?;
                    let kind = match parts.name {
                        "max_pool2d" => PoolKind::Max,
                        "avg_pool2d" => PoolKind::Avg,
                        "max_pool2d_grad" => PoolKind::MaxGrad,
                        _ => PoolKind::AvgGrad {
                            input: spatial(&single_result()?, attrs.channels_last)?,
                        },
                    };
                    Op::Pool2d { kind, attrs }
                }
                "one_hot" => {
                    let ty = single_result()?;
                    let depth = ty.shape.dims().last().and_then(|d| d.as_fixed()).ok_or(
                        "`one_hot` needs a result type whose last dimension is a fixed depth",
                    )?;
                    Op::OneHot {
                        depth,
                        dtype: ty.dtype,
                    }
                }
                "iota" => Op::Iota {
                    axis: attrs.usize("axis")?,
                    ty: single_result()?,
                },
                "random_uniform" => Op::Random {
                    dist: Distribution::Uniform {
                        low: F64Attr(attrs.f64("low")?),
                        high: F64Attr(attrs.f64("high")?),
                    },
                    seed: attrs.u64("seed")?,
                    ty: single_result()?,
                },
                "random_normal" => Op::Random {
                    dist: Distribution::Normal {
                        mean: F64Attr(attrs.f64("mean")?),
                        std: F64Attr(attrs.f64("std")?),
                    },
                    seed: attrs.u64("seed")?,
                    ty: single_result()?,
                },
                "load" => Op::Load {
                    state: symbol()?,
                    ty: single_result()?,
                },
                "store" => Op::Store { state: symbol()? },
                "cond" => Op::Cond,
                "while" => Op::While,
                "fused" => Op::Fused,
                "call" => Op::Call {
                    callee: symbol()?,
                    results: parts.result_types.to_vec(),
                },
                "all_reduce_sum" => Op::AllReduce {
                    op: AllReduceOp::Sum,
                    bf16: attrs.bool_or("bf16", false)?,
                },
                "all_reduce_mean" => Op::AllReduce {
                    op: AllReduceOp::Mean,
                    bf16: attrs.bool_or("bf16", false)?,
                },
                "reduce_scatter_sum" => Op::ReduceScatter {
                    op: AllReduceOp::Sum,
                    ranks: attrs.usize("ranks")?,
                },
                "reduce_scatter_mean" => Op::ReduceScatter {
                    op: AllReduceOp::Mean,
                    ranks: attrs.usize("ranks")?,
                },
                "all_gather" => Op::AllGather {
                    ranks: attrs.usize("ranks")?,
                },
                "shard" => Op::Shard {
                    ranks: attrs.usize("ranks")?,
                },
                "collective_broadcast" => Op::CollectiveBroadcast {
                    root: attrs.usize("root")?,
                },
                "send" => Op::Send {
                    peer: attrs.usize("peer")?,
                    tag: attrs.u64("tag")?,
                },
                "recv" => Op::Recv {
                    peer: attrs.usize("peer")?,
                    tag: attrs.u64("tag")?,
                    results: parts.result_types.to_vec(),
                },
                "const" => return Err("`const` takes a literal value: `const 1.0 : f32[]`".into()),
                other => {
                    let hint = closest(other, &Op::all_names())
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    return Err(format!("unknown op `{other}`{hint}"));
                }
            }
        };
        attrs.finish(parts.name)?;
        if parts.symbol.is_some() && op.symbol().is_none() {
            return Err(format!("`{}` takes no `@name`", parts.name));
        }
        Ok(op)
    }

    /// Every op name the text form knows, for error messages, completions and coverage
    /// tests: the names of [`Op::representatives`], so a new op cannot be left out.
    pub fn all_names() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for op in Op::representatives() {
            if !names.contains(&op.name()) {
                names.push(op.name());
            }
        }
        names
    }

    /// One op of every name: each variant, with each kind a variant has under its own name
    /// (every unary, binary, compare, reduce and arg op of the tables, each convolution and
    /// pooling kind, each distribution and all-reduce). The exhaustive `match` below makes a
    /// new variant a compile error here until it has a representative.
    pub fn representatives() -> Vec<Op> {
        let scalar = Type::new(DType::F32, Shape::fixed(&[]));
        let shape = Shape::fixed(&[]);
        let uniform = Distribution::Uniform {
            low: F64Attr(0.0),
            high: F64Attr(1.0),
        };
        let normal = Distribution::Normal {
            mean: F64Attr(0.0),
            std: F64Attr(1.0),
        };
        let conv = |kind| Op::Conv2d {
            kind,
            attrs: Conv2dAttrs::default(),
        };
        let pool = |kind| Op::Pool2d {
            kind,
            attrs: Pool2dAttrs::new([1, 1], [1, 1]),
        };
        let mut ops: Vec<Op> = Vec::new();
        ops.extend(UnaryOp::ALL.iter().map(|&o| Op::Unary(o)));
        ops.extend(BinaryOp::ALL.iter().map(|&o| Op::Binary(o)));
        ops.extend(CompareOp::ALL.iter().map(|&o| Op::Compare(o)));
        ops.extend(ReduceOp::ALL.iter().map(|&op| Op::Reduce {
            op,
            axes: vec![],
            keep_dims: false,
        }));
        ops.extend(ArgOp::ALL.iter().map(|&op| Op::ArgReduce {
            op,
            axis: 0,
            keep_dims: false,
        }));
        ops.extend([
            Op::Const {
                value: Literal::F32(vec![0.0]),
                ty: scalar.clone(),
            },
            Op::Select,
            Op::Cast { to: DType::F32 },
            Op::Broadcast {
                shape: shape.clone(),
            },
            Op::Reshape {
                shape: shape.clone(),
            },
            Op::Transpose { perm: vec![] },
            Op::Slice { axes: vec![] },
            Op::Pad {
                low: vec![],
                high: vec![],
                interior: vec![],
            },
            Op::Concat { axis: 0 },
            Op::MatMul {
                transpose_a: false,
                transpose_b: false,
            },
            Op::MatMulAcc {
                transpose_a: false,
                transpose_b: false,
                scale: F64Attr(1.0),
            },
            Op::Gather { axis: 0 },
            Op::UpdateSlice { axis: 0 },
            Op::ScatterAdd { axis: 0, shape },
            conv(ConvKind::Forward),
            conv(ConvKind::InputGrad { input: [1, 1] }),
            conv(ConvKind::FilterGrad { kernel: [1, 1] }),
            pool(PoolKind::Max),
            pool(PoolKind::Avg),
            pool(PoolKind::MaxGrad),
            pool(PoolKind::AvgGrad { input: [1, 1] }),
            Op::OneHot {
                depth: 1,
                dtype: DType::F32,
            },
            Op::Iota {
                axis: 0,
                ty: scalar.clone(),
            },
            Op::Random {
                dist: uniform,
                seed: 0,
                ty: scalar.clone(),
            },
            Op::Random {
                dist: normal,
                seed: 0,
                ty: scalar.clone(),
            },
            Op::Load {
                state: String::new(),
                ty: scalar,
            },
            Op::Store {
                state: String::new(),
            },
            Op::Cond,
            Op::While,
            Op::Fused,
            Op::Call {
                callee: String::new(),
                results: vec![],
            },
            Op::AllReduce {
                op: AllReduceOp::Sum,
                bf16: false,
            },
            Op::AllReduce {
                op: AllReduceOp::Mean,
                bf16: false,
            },
            Op::ReduceScatter {
                op: AllReduceOp::Sum,
                ranks: 1,
            },
            Op::ReduceScatter {
                op: AllReduceOp::Mean,
                ranks: 1,
            },
            Op::AllGather { ranks: 1 },
            Op::Shard { ranks: 1 },
            Op::CollectiveBroadcast { root: 0 },
            Op::Send { peer: 0, tag: 0 },
            Op::Recv {
                peer: 0,
                tag: 0,
                results: vec![],
            },
        ]);
        // No wildcard: a new variant fails to compile here, next to the list it joins.
        for op in &ops {
            match op {
                Op::Const { .. }
                | Op::Unary(_)
                | Op::Binary(_)
                | Op::Compare(_)
                | Op::Select
                | Op::Cast { .. }
                | Op::Broadcast { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Pad { .. }
                | Op::Concat { .. }
                | Op::Reduce { .. }
                | Op::ArgReduce { .. }
                | Op::MatMul { .. }
                | Op::MatMulAcc { .. }
                | Op::Gather { .. }
                | Op::UpdateSlice { .. }
                | Op::ScatterAdd { .. }
                | Op::Conv2d { .. }
                | Op::Pool2d { .. }
                | Op::OneHot { .. }
                | Op::Iota { .. }
                | Op::Random { .. }
                | Op::Load { .. }
                | Op::Store { .. }
                | opaque_op!() => {}
            }
        }
        ops
    }
}

/// The fixed spatial size `(H, W)` of an NCHW type (a result type that states it).
/// The height and width of `ty` (rank 4), at [`crate::window::spatial_axes`] of
/// `channels_last`.
fn spatial(ty: &Type, channels_last: bool) -> Result<[usize; 2], String> {
    let [h, w] = crate::window::spatial_axes(channels_last);
    match ty.shape.dims() {
        dims @ [_, _, _, _] => match (dims[h].as_fixed(), dims[w].as_fixed()) {
            (Some(h), Some(w)) => Ok([h, w]),
            _ => Err(format!(
                "the result type must state fixed spatial sizes, found {ty}"
            )),
        },
        _ => Err(format!(
            "the result type must have rank 4 (NCHW or NHWC), found {ty}"
        )),
    }
}

/// The candidate nearest to `word` by edit distance, if it is near enough to be a likely typo.
pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (strsim::levenshtein(word, c), *c))
        .filter(|&(d, c)| d <= 2.max(c.len() / 4))
        .min()
        .map(|(_, c)| c)
}

/// Reads attributes by name, remembering which were used so unknown ones are reported.
struct AttrReader<'a> {
    attrs: &'a [(String, Attr)],
    used: std::cell::RefCell<Vec<bool>>,
}

impl<'a> AttrReader<'a> {
    fn new(attrs: &'a [(String, Attr)]) -> Self {
        AttrReader {
            attrs,
            used: std::cell::RefCell::new(vec![false; attrs.len()]),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Attr> {
        let i = self.attrs.iter().position(|(k, _)| k == key)?;
        self.used.borrow_mut()[i] = true;
        Some(&self.attrs[i].1)
    }

    fn require(&self, key: &str) -> Result<&'a Attr, String> {
        self.get(key)
            .ok_or_else(|| format!("missing attribute `{key}`"))
    }

    fn usize(&self, key: &str) -> Result<usize, String> {
        self.u64(key).and_then(|v| {
            usize::try_from(v).map_err(|_| format!("attribute `{key}` is too large: {v}"))
        })
    }

    fn u64(&self, key: &str) -> Result<u64, String> {
        match self.require(key)? {
            Attr::Int(v) if u64::try_from(*v).is_ok() => Ok(*v as u64),
            other => Err(format!(
                "attribute `{key}` must be a non-negative integer, found `{other}`"
            )),
        }
    }

    fn f64(&self, key: &str) -> Result<f64, String> {
        match self.require(key)? {
            Attr::Float(v) => Ok(*v),
            Attr::Int(v) => Ok(*v as f64),
            other => Err(format!(
                "attribute `{key}` must be a number, found `{other}`"
            )),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key) {
            None => Ok(default),
            Some(Attr::Bool(v)) => Ok(*v),
            Some(other) => Err(format!(
                "attribute `{key}` must be `true` or `false`, found `{other}`"
            )),
        }
    }

    fn usizes(&self, key: &str) -> Result<Vec<usize>, String> {
        match self.require(key)? {
            Attr::Ints(v) if v.iter().all(|&x| x >= 0) => {
                Ok(v.iter().map(|&x| x as usize).collect())
            }
            other => Err(format!(
                "attribute `{key}` must be a list of non-negative integers, found `{other}`"
            )),
        }
    }

    fn slices(&self, key: &str) -> Result<Vec<AxisSlice>, String> {
        match self.require(key)? {
            Attr::Slices(v) => Ok(v.clone()),
            // `[]` parses as an empty integer list: the ranges of a scalar.
            Attr::Ints(v) if v.is_empty() => Ok(Vec::new()),
            other => Err(format!(
                "attribute `{key}` must be a list of ranges like `[0:2, :]`, found `{other}`"
            )),
        }
    }

    /// Two non-negative integers, one per spatial axis.
    fn usize2(&self, key: &str) -> Result<[usize; 2], String> {
        match self.usizes(key)?[..] {
            [a, b] => Ok([a, b]),
            _ => Err(format!(
                "attribute `{key}` must list two values, one per spatial axis"
            )),
        }
    }

    fn usize2_or(&self, key: &str, default: [usize; 2]) -> Result<[usize; 2], String> {
        if self.attrs.iter().any(|(k, _)| k == key) {
            self.usize2(key)
        } else {
            Ok(default)
        }
    }

    /// `[(low, high), (low, high)]`, one pair per spatial axis; zeros when absent.
    fn padding(&self, key: &str) -> Result<[(usize, usize); 2], String> {
        let pair = |(a, b): (i64, i64)| Some((usize::try_from(a).ok()?, usize::try_from(b).ok()?));
        match self.get(key) {
            None => Ok([(0, 0), (0, 0)]),
            Some(Attr::Pairs(v)) if v.len() == 2 => match (pair(v[0]), pair(v[1])) {
                (Some(h), Some(w)) => Ok([h, w]),
                _ => Err(format!("attribute `{key}` must hold non-negative sizes")),
            },
            Some(other) => Err(format!(
                "attribute `{key}` must be two (low, high) pairs like `[(1, 1), (1, 1)]`, found `{other}`"
            )),
        }
    }

    fn conv2d(&self, op: &str) -> Result<Conv2dAttrs, String> {
        let attrs = Conv2dAttrs {
            strides: self.usize2_or("strides", [1, 1])?,
            padding: self.padding("padding")?,
            dilation: self.usize2_or("dilation", [1, 1])?,
            groups: match self.get("groups") {
                None => 1,
                Some(_) => self.usize("groups")?,
            },
            channels_last: self.bool_or("channels_last", false)?,
        };
        attrs.check().map_err(|e| format!("`{op}`: {e}"))?;
        Ok(attrs)
    }

    fn pool2d(&self, op: &str) -> Result<Pool2dAttrs, String> {
        let window = self.usize2("window")?;
        let attrs = Pool2dAttrs {
            window,
            strides: self.usize2_or("strides", window)?,
            padding: self.padding("padding")?,
            channels_last: self.bool_or("channels_last", false)?,
        };
        attrs.check().map_err(|e| format!("`{op}`: {e}"))?;
        Ok(attrs)
    }

    fn finish(&self, op: &str) -> Result<(), String> {
        let used = self.used.borrow();
        match self.attrs.iter().zip(used.iter()).find(|(_, used)| !**used) {
            Some(((key, _), _)) => Err(format!("`{op}` has no attribute `{key}`")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_name_is_unique_and_known() {
        let names = Op::all_names();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "duplicate op names");
        for op in UnaryOp::ALL {
            assert_eq!(UnaryOp::from_name(op.name()), Some(*op));
        }
        for op in BinaryOp::ALL {
            assert_eq!(BinaryOp::from_name(op.name()), Some(*op));
        }
    }

    #[test]
    fn unknown_attribute_is_reported() {
        let attrs = vec![
            ("axis".to_string(), Attr::Int(0)),
            ("bogus".into(), Attr::Int(1)),
        ];
        let err = Op::from_parts(&OpParts {
            name: "concat",
            symbol: None,
            attrs: &attrs,
            result_types: &[],
        })
        .unwrap_err();
        assert_eq!(err, "`concat` has no attribute `bogus`");
    }
}
