//! The op table: what each op computes, its name in the text form, its attributes.
//!
//! Every other place that must know about ops — shape inference (`infer.rs`), the interpreter,
//! autodiff, the code generator — matches on [`Op`] exhaustively, so adding an op makes the
//! compiler list every place that must learn about it. The checklist for a new op:
//!
//! 1. a variant here (or a line in one of the elementwise tables), with its attributes in
//!    [`Op::attributes`] and [`Op::from_parts`];
//! 2. its type rule in `infer.rs`;
//! 3. its kernel in the reference interpreter (`kiln-backend`);
//! 4. its gradient rule, or an entry in the list of ops without one;
//! 5. tests: shape inference, an interpreter test, a gradient check, a round trip.

use crate::literal::Literal;
use crate::types::{DType, Shape, Type};
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
    pub fn admits(self, dtype: DType) -> bool {
        match self {
            DTypeClass::Float => dtype.is_float(),
            DTypeClass::Numeric => dtype.is_numeric(),
            DTypeClass::Bool => dtype == DType::Bool,
            DTypeClass::Any => true,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            DTypeClass::Float => "a float type (f32, f64)",
            DTypeClass::Numeric => "a numeric type (f32, f64, i32, i64)",
            DTypeClass::Bool => "bool",
            DTypeClass::Any => "any type",
        }
    }
}

/// Declares a table of simple ops: variant, text name and accepted operand dtypes, one per line.
macro_rules! op_table {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $text:literal, $class:ident;)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            pub fn from_name(name: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|op| op.name() == name)
            }

            /// The operand dtypes this op accepts.
            pub fn operand_class(self) -> DTypeClass {
                match self { $($name::$variant => DTypeClass::$class),* }
            }
        }
    };
}

op_table! {
    /// Elementwise functions of one operand; the result has the operand's type.
    UnaryOp {
        Neg = "neg", Numeric;
        Abs = "abs", Numeric;
        Sign = "sign", Numeric;
        Relu = "relu", Numeric;
        Exp = "exp", Float;
        Log = "log", Float;
        Sqrt = "sqrt", Float;
        Rsqrt = "rsqrt", Float;
        Recip = "recip", Float;
        Tanh = "tanh", Float;
        Sigmoid = "sigmoid", Float;
        Erf = "erf", Float;
        Sin = "sin", Float;
        Cos = "cos", Float;
        Floor = "floor", Float;
        Ceil = "ceil", Float;
        Round = "round", Float;
        Not = "not", Bool;
    }
}

op_table! {
    /// Elementwise functions of two operands of one type; the result has that type.
    BinaryOp {
        Add = "add", Numeric;
        Sub = "sub", Numeric;
        Mul = "mul", Numeric;
        Div = "div", Numeric;
        Max = "max", Numeric;
        Min = "min", Numeric;
        Pow = "pow", Float;
        And = "and", Bool;
        Or = "or", Bool;
        Xor = "xor", Bool;
    }
}

op_table! {
    /// Elementwise comparisons of two operands of one type; the result is bool.
    CompareOp {
        Eq = "eq", Any;
        Ne = "ne", Any;
        Lt = "lt", Numeric;
        Le = "le", Numeric;
        Gt = "gt", Numeric;
        Ge = "ge", Numeric;
    }
}

op_table! {
    /// Reductions over a set of axes.
    ReduceOp {
        Sum = "reduce_sum", Numeric;
        Mean = "reduce_mean", Float;
        Max = "reduce_max", Numeric;
        Min = "reduce_min", Numeric;
    }
}

op_table! {
    /// Index of the extreme element along one axis; the result is i64.
    ArgOp {
        ArgMax = "argmax", Numeric;
        ArgMin = "argmin", Numeric;
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
    Uniform { low: F64Attr, high: F64Attr },
    Normal { mean: F64Attr, std: F64Attr },
}

/// The range a `slice` takes along one axis: `start..end` by `step`, or the whole axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AxisSlice {
    Full,
    Range {
        start: usize,
        end: usize,
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

/// What an instruction computes. Operands, results and regions live in the instruction.
/// Ops are ordered (totally, consistently with `==`) so they can be e-graph operators.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// A constant: one element (splat) or every element of a static shape.
    Const {
        value: Literal,
        ty: Type,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    /// `select %cond, %on_true, %on_false`, elementwise; all three have one shape.
    Select,
    /// Converts the element type; floats to integers saturate (NaN gives 0).
    Cast {
        to: DType,
    },
    /// Stretches dimensions of size 1 and prepends dimensions, NumPy-style, to `shape`.
    Broadcast {
        shape: Shape,
    },
    /// Same elements in row-major order, new shape.
    Reshape {
        shape: Shape,
    },
    /// Result axis `i` is operand axis `perm[i]`.
    Transpose {
        perm: Vec<usize>,
    },
    Slice {
        axes: Vec<AxisSlice>,
    },
    /// Zero padding: `low` before, `high` after, and `interior` between the elements of each
    /// axis (so a strided slice's gradient is a pad).
    Pad {
        low: Vec<usize>,
        high: Vec<usize>,
        interior: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keep_dims: bool,
    },
    ArgReduce {
        op: ArgOp,
        axis: usize,
        keep_dims: bool,
    },
    /// `[..., M, K] @ [..., K, N]`; batch dimensions broadcast NumPy-style; the flags transpose
    /// the last two axes of an operand first.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// `table[..., indices, ...]` along `axis`: result shape
    /// `table[..axis] ++ indices ++ table[axis+1..]`.
    Gather {
        axis: usize,
    },
    /// The transpose of `gather`: zeros of `shape` with `updates` added at `indices` along
    /// `axis` (repeated indices accumulate). Operands: updates, indices.
    ScatterAdd {
        axis: usize,
        shape: Shape,
    },
    /// Integer labels to one-hot vectors along a new last axis of size `depth`.
    OneHot {
        depth: usize,
        dtype: DType,
    },
    /// The index along `axis`, for every element of `ty`.
    Iota {
        axis: usize,
        ty: Type,
    },
    /// Seeded samples. The same seed gives the same numbers within one run; the runtime
    /// advances a run counter so that successive runs draw fresh numbers, reproducibly.
    Random {
        dist: Distribution,
        seed: u64,
        ty: Type,
    },
    /// Reads a state variable as it was when the function was called.
    Load {
        state: String,
        ty: Type,
    },
    /// Writes a state variable; stores take effect when the function returns.
    Store {
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
        callee: String,
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
    Reduction,
    Contraction,
    /// Reads elements at data-dependent positions.
    Indexing,
    /// No operands: constants, iota, random, loads.
    Source,
    /// Side effects: stores.
    Effect,
    /// Ops with regions.
    Control,
    Call,
}

/// An attribute value in the text form: `{axes=[0,1], keep_dims=true}`.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// Wide enough for every i64 and u64 (seeds).
    Int(i128),
    Float(f64),
    Bool(bool),
    Ints(Vec<i64>),
    Slices(Vec<AxisSlice>),
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
    pub name: &'a str,
    pub symbol: Option<&'a str>,
    pub attrs: &'a [(String, Attr)],
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
            Op::Gather { .. } => "gather",
            Op::ScatterAdd { .. } => "scatter_add",
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
        }
    }

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
            Op::MatMul { .. } => OpClass::Contraction,
            Op::Gather { .. } | Op::ScatterAdd { .. } | Op::OneHot { .. } => OpClass::Indexing,
            Op::Const { .. } | Op::Iota { .. } | Op::Random { .. } | Op::Load { .. } => {
                OpClass::Source
            }
            Op::Store { .. } => OpClass::Effect,
            Op::Cond | Op::While | Op::Fused => OpClass::Control,
            Op::Call { .. } => OpClass::Call,
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

    /// Whether the op has effects beyond its results, so it is never dead.
    pub fn has_side_effects(&self) -> bool {
        matches!(self, Op::Store { .. } | Op::Call { .. })
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
            | Op::Call { .. } => Vec::new(),
        }
    }

    /// Rebuilds an op from its text-form pieces. `Err` says what is missing or malformed.
    pub fn from_parts(parts: &OpParts<'_>) -> Result<Op, String> {
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
                "gather" => Op::Gather {
                    axis: attrs.usize("axis")?,
                },
                "scatter_add" => Op::ScatterAdd {
                    axis: attrs.usize("axis")?,
                    shape: single_result()?.shape,
                },
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

    /// Every op name the text form knows, for error messages and completions.
    pub fn all_names() -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        names.extend(UnaryOp::ALL.iter().map(|o| o.name()));
        names.extend(BinaryOp::ALL.iter().map(|o| o.name()));
        names.extend(CompareOp::ALL.iter().map(|o| o.name()));
        names.extend(ReduceOp::ALL.iter().map(|o| o.name()));
        names.extend(ArgOp::ALL.iter().map(|o| o.name()));
        names.extend([
            "const",
            "select",
            "cast",
            "broadcast",
            "reshape",
            "transpose",
            "slice",
            "pad",
            "concat",
            "matmul",
            "gather",
            "scatter_add",
            "one_hot",
            "iota",
            "random_uniform",
            "random_normal",
            "load",
            "store",
            "cond",
            "while",
            "fused",
            "call",
        ]);
        names
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
