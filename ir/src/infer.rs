//! Type and shape inference: the result types of an op from its operand types.
//!
//! One rule per op, in one `match`. The builder calls this to type new instructions, and the
//! verifier calls it to check every instruction's stored result types. Errors name the op and
//! the types involved; the caller adds where the op was built.

use crate::op::{AllReduceOp, AxisSlice, DTypeClass, Distribution, Op};
use crate::types::{DType, Dim, Shape, Type};
use crate::window::{Conv2dAttrs, ConvKind, NCHW_TO_NHWC, NHWC_TO_NCHW, Pool2dAttrs, PoolKind};
use std::fmt;

/// An op applied to operands it does not accept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct TypeError {
    /// The op, by its text-form name.
    pub op: &'static str,
    /// What is wrong, with the types involved.
    pub message: String,
}

/// The argument and yielded types of one region of the instruction being typed.
#[derive(Clone, Debug, Default)]
pub struct RegionTypes<'a> {
    /// The argument types of each region.
    pub args: Vec<&'a Type>,
    /// The types each region yields.
    pub results: Vec<&'a Type>,
}

/// The result types of `op` applied to operands of types `args`, with regions typed `regions`.
pub fn infer(op: &Op, args: &[&Type], regions: &[RegionTypes<'_>]) -> Result<Vec<Type>, TypeError> {
    let fail = |message: String| TypeError {
        op: op.name(),
        message,
    };
    check_counts(op, args, regions).map_err(fail)?;
    rule(op, args, regions).map_err(fail)
}

fn check_counts(op: &Op, args: &[&Type], regions: &[RegionTypes<'_>]) -> Result<(), String> {
    let arity = match op {
        Op::Const { .. } | Op::Iota { .. } | Op::Random { .. } | Op::Load { .. } => Some(0),
        Op::Unary(_)
        | Op::Cast { .. }
        | Op::Broadcast { .. }
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Reduce { .. }
        | Op::ArgReduce { .. }
        | Op::OneHot { .. }
        | Op::Store { .. }
        | Op::Cond => Some(1),
        Op::Binary(_)
        | Op::Compare(_)
        | Op::MatMul { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::Conv2d { .. } => Some(2),
        Op::UpdateSlice { .. } | Op::MatMulAcc { .. } => Some(3),
        Op::Pool2d { kind, .. } => Some(match kind {
            PoolKind::MaxGrad => 2,
            PoolKind::Max | PoolKind::Avg | PoolKind::AvgGrad { .. } => 1,
        }),
        Op::Select => Some(3),
        Op::Concat { .. }
        | Op::While
        | Op::Fused
        | Op::Call { .. }
        | Op::AllReduce { .. }
        | Op::ReduceScatter { .. }
        | Op::AllGather { .. }
        | Op::Shard { .. }
        | Op::CollectiveBroadcast { .. }
        | Op::Send { .. } => None,
        Op::Recv { .. } => Some(0),
    };
    if let Some(n) = arity
        && args.len() != n
    {
        return Err(format!(
            "takes {n} operand{}, found {}",
            if n == 1 { "" } else { "s" },
            args.len()
        ));
    }
    let labels = op.region_labels();
    if regions.len() != labels.len() {
        return Err(format!(
            "takes {} region{}, found {}",
            labels.len(),
            if labels.len() == 1 { "" } else { "s" },
            regions.len()
        ));
    }
    Ok(())
}

/// Formats operand types as `f32[2,3], f32[3]` for messages.
struct Types<'a>(&'a [&'a Type]);

impl fmt::Display for Types<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

fn require_dtype(op: &Op, class: crate::op::DTypeClass, t: &Type) -> Result<(), String> {
    if class.admits(t.dtype) {
        Ok(())
    } else {
        Err(format!(
            "operand type {t} is not accepted; `{}` needs {}",
            op.name(),
            class.describe()
        ))
    }
}

fn same_types(args: &[&Type]) -> Result<(), String> {
    if args.windows(2).all(|w| w[0] == w[1]) {
        Ok(())
    } else {
        Err(format!(
            "operand types differ: {}; elementwise operands must have one type (the builder \
             broadcasts them explicitly)",
            Types(args)
        ))
    }
}

fn check_axis(axis: usize, t: &Type) -> Result<(), String> {
    if axis < t.rank() {
        Ok(())
    } else {
        Err(format!(
            "axis {axis} is out of range for {t} (rank {})",
            t.rank()
        ))
    }
}

fn rule(op: &Op, args: &[&Type], regions: &[RegionTypes<'_>]) -> Result<Vec<Type>, String> {
    let one = |t: Type| Ok(vec![t]);
    match op {
        Op::Const { value, ty } => {
            if value.dtype() != ty.dtype {
                return Err(format!("a {} literal cannot have type {ty}", value.dtype()));
            }
            if value.len() != 1 {
                match ty.shape.num_elements() {
                    Some(n) if n == value.len() => {}
                    Some(n) => {
                        return Err(format!(
                            "the literal has {} elements but {ty} holds {n}",
                            value.len()
                        ));
                    }
                    None => {
                        return Err(format!(
                            "a literal of {} elements needs a static shape, found {ty}",
                            value.len()
                        ));
                    }
                }
            }
            one(ty.clone())
        }
        Op::Unary(u) => {
            require_dtype(op, u.operand_class(), args[0])?;
            one(args[0].clone())
        }
        Op::Binary(b) => {
            same_types(args)?;
            require_dtype(op, b.operand_class(), args[0])?;
            one(args[0].clone())
        }
        Op::Compare(c) => {
            same_types(args)?;
            require_dtype(op, c.operand_class(), args[0])?;
            one(args[0].with_dtype(DType::Bool))
        }
        Op::Select => {
            let (c, a, b) = (args[0], args[1], args[2]);
            if c.dtype != DType::Bool {
                return Err(format!("the condition must be bool, found {c}"));
            }
            same_types(&[a, b])?;
            if c.shape != a.shape {
                return Err(format!(
                    "the condition's shape differs from the operands': {}",
                    Types(args)
                ));
            }
            one(a.clone())
        }
        Op::Cast { to } => one(args[0].with_dtype(*to)),
        Op::Broadcast { shape } => {
            if !args[0].shape.broadcasts_to(shape) {
                return Err(format!(
                    "{} does not broadcast to {shape}: align on the right; each dimension must \
                     equal the target's or be 1",
                    args[0]
                ));
            }
            one(args[0].with_shape(shape.clone()))
        }
        Op::Reshape { shape } => {
            let from = &args[0].shape;
            if !same_element_count(from, shape) {
                return Err(format!(
                    "cannot reshape {} to {shape}: the element counts differ",
                    args[0]
                ));
            }
            one(args[0].with_shape(shape.clone()))
        }
        Op::Transpose { perm } => {
            let t = args[0];
            let mut seen = vec![false; t.rank()];
            let valid = perm.len() == t.rank()
                && perm
                    .iter()
                    .all(|&p| p < t.rank() && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return Err(format!(
                    "perm {perm:?} is not a permutation of the {} axes of {t}",
                    t.rank()
                ));
            }
            one(t.with_shape(Shape(perm.iter().map(|&p| t.shape.0[p].clone()).collect())))
        }
        Op::Slice { axes } => {
            let t = args[0];
            if axes.len() != t.rank() {
                return Err(format!(
                    "{} ranges given for {t}, which has rank {}",
                    axes.len(),
                    t.rank()
                ));
            }
            let mut dims = Vec::with_capacity(axes.len());
            for (axis, (range, dim)) in axes.iter().zip(t.shape.dims()).enumerate() {
                dims.push(match (*range, dim) {
                    (AxisSlice::Full, d) => d.clone(),
                    (AxisSlice::Range { .. }, Dim::Sym(s)) => {
                        return Err(format!(
                            "axis {axis} of {t} has symbolic size {s}; only `:` can slice it"
                        ));
                    }
                    (AxisSlice::Range { start, end, step }, &Dim::Fixed(size)) => {
                        if step == 0 || start > end || end > size {
                            return Err(format!(
                                "range {range} is invalid for axis {axis} of size {size} in {t}"
                            ));
                        }
                        Dim::Fixed(range.len(size))
                    }
                });
            }
            one(t.with_shape(Shape(dims)))
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            let t = args[0];
            if low.len() != t.rank() || high.len() != t.rank() || interior.len() != t.rank() {
                return Err(format!(
                    "`low`, `high` and `interior` need one entry per axis of {t}"
                ));
            }
            let mut dims = Vec::with_capacity(t.rank());
            for (axis, dim) in t.shape.dims().iter().enumerate() {
                let (lo, hi, mid) = (low[axis], high[axis], interior[axis]);
                dims.push(match dim {
                    Dim::Sym(_) if lo == 0 && hi == 0 && mid == 0 => dim.clone(),
                    Dim::Sym(s) => {
                        return Err(format!(
                            "axis {axis} of {t} has symbolic size {s} and cannot be padded"
                        ));
                    }
                    &Dim::Fixed(n) => Dim::Fixed(padded_size(n, lo, hi, mid).ok_or_else(|| {
                        format!("axis {axis} of {t} padded by ({lo}, {hi}) with interior {mid} has more elements than memory can address")
                    })?),
                });
            }
            one(t.with_shape(Shape(dims)))
        }
        Op::Concat { axis } => {
            let Some(first) = args.first() else {
                return Err("takes at least one operand".into());
            };
            check_axis(*axis, first)?;
            let compatible = args.iter().all(|t| {
                t.dtype == first.dtype
                    && t.rank() == first.rank()
                    && t.shape
                        .dims()
                        .iter()
                        .zip(first.shape.dims())
                        .enumerate()
                        .all(|(i, (d, e))| i == *axis || d == e)
            });
            if !compatible {
                return Err(format!(
                    "operands must agree in dtype, rank and every dimension but axis {axis}: {}",
                    Types(args)
                ));
            }
            let along = if args.len() == 1 {
                first.shape.0[*axis].clone()
            } else {
                let sizes: Option<Vec<usize>> =
                    args.iter().map(|t| t.shape.0[*axis].as_fixed()).collect();
                match sizes {
                    Some(sizes) => Dim::Fixed(
                        (sizes.iter().try_fold(0usize, |acc, &n| acc.checked_add(n)))
                            .ok_or_else(|| {
                                format!(
                                    "the sizes along axis {axis} add up to more than memory can address: {}",
                                    Types(args)
                                )
                            })?,
                    ),
                    None => {
                        return Err(format!(
                            "cannot concatenate along symbolic axis {axis}: {}",
                            Types(args)
                        ));
                    }
                }
            };
            let mut shape = first.shape.clone();
            shape.0[*axis] = along;
            one(first.with_shape(shape))
        }
        Op::Reduce {
            op: r,
            axes,
            keep_dims,
        } => {
            let t = args[0];
            require_dtype(op, r.operand_class(), t)?;
            let mut seen = vec![false; t.rank()];
            for &a in axes {
                check_axis(a, t)?;
                if std::mem::replace(&mut seen[a], true) {
                    return Err(format!("axis {a} is listed twice"));
                }
            }
            one(t.with_shape(reduced_shape(&t.shape, &seen, *keep_dims)))
        }
        Op::ArgReduce {
            op: r,
            axis,
            keep_dims,
        } => {
            let t = args[0];
            require_dtype(op, r.operand_class(), t)?;
            check_axis(*axis, t)?;
            let mut seen = vec![false; t.rank()];
            seen[*axis] = true;
            one(Type::new(
                DType::I64,
                reduced_shape(&t.shape, &seen, *keep_dims),
            ))
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => matmul_type(args[0], args[1], *transpose_a, *transpose_b).map(|t| vec![t]),
        Op::MatMulAcc {
            transpose_a,
            transpose_b,
            ..
        } => {
            let product = matmul_type(args[0], args[1], *transpose_a, *transpose_b)?;
            if !product.dtype.is_float() || *args[2] != product {
                return Err(format!(
                    "the product is {product}, and it accumulates onto {}: they must be the \
                     same float type",
                    args[2]
                ));
            }
            one(product)
        }
        Op::Gather { axis } => {
            let (table, idx) = (args[0], args[1]);
            check_axis(*axis, table)?;
            if !idx.dtype.is_int() {
                return Err(format!("indices must be i32 or i64, found {idx}"));
            }
            let dims = &table.shape.0;
            let mut shape = dims[..*axis].to_vec();
            shape.extend(idx.shape.0.iter().cloned());
            shape.extend(dims[axis + 1..].iter().cloned());
            one(table.with_shape(Shape(shape)))
        }
        Op::UpdateSlice { axis } => {
            let (array, value, idx) = (args[0], args[1], args[2]);
            check_axis(*axis, array)?;
            if !idx.dtype.is_int() || idx.rank() != 0 {
                return Err(format!(
                    "the index must be an i32 or i64 scalar, found {idx}"
                ));
            }
            let mut slice = array.shape.0.clone();
            slice.remove(*axis);
            if value.dtype != array.dtype || value.shape.0 != slice {
                return Err(format!(
                    "the value {value} does not fit a slice of {array} along axis {axis}: \
                     expected {}",
                    array.with_shape(Shape(slice))
                ));
            }
            one(array.clone())
        }
        Op::ScatterAdd { axis, shape } => {
            let (updates, idx) = (args[0], args[1]);
            if *axis >= shape.rank() {
                return Err(format!(
                    "axis {axis} is out of range for the result shape {shape}"
                ));
            }
            if !idx.dtype.is_int() {
                return Err(format!("indices must be i32 or i64, found {idx}"));
            }
            if !updates.dtype.is_numeric() {
                return Err(format!("updates must be numeric, found {updates}"));
            }
            let mut expected = shape.0[..*axis].to_vec();
            expected.extend(idx.shape.0.iter().cloned());
            expected.extend(shape.0[axis + 1..].iter().cloned());
            if updates.shape.0 != expected {
                return Err(format!(
                    "updates {updates} do not fit indices {idx} into {shape} along axis {axis}: \
                     expected updates of shape {}",
                    Shape(expected)
                ));
            }
            one(updates.with_shape(shape.clone()))
        }
        Op::Conv2d { kind, attrs } => {
            let activations = match kind {
                ConvKind::Forward | ConvKind::InputGrad { .. } => [true, false, true],
                ConvKind::FilterGrad { .. } => [true, true, false],
            };
            one(in_layout(attrs.channels_last, activations, args, |args| {
                conv2d_type(*kind, attrs, args)
            })?)
        }
        Op::Pool2d { kind, attrs } => {
            one(in_layout(attrs.channels_last, [true; 3], args, |args| {
                pool2d_type(*kind, attrs, args)
            })?)
        }
        Op::OneHot { depth, dtype } => {
            let labels = args[0];
            if !labels.dtype.is_int() {
                return Err(format!("labels must be i32 or i64, found {labels}"));
            }
            let mut shape = labels.shape.clone();
            shape.0.push(Dim::Fixed(*depth));
            one(Type::new(*dtype, shape))
        }
        Op::Iota { axis, ty } => {
            check_axis(*axis, ty)?;
            if !ty.dtype.is_numeric() {
                return Err(format!("the result must be numeric, found {ty}"));
            }
            one(ty.clone())
        }
        Op::Random { dist, ty, .. } => {
            if !ty.dtype.is_float() {
                return Err(format!("the result must be f32 or f64, found {ty}"));
            }
            let valid = match *dist {
                Distribution::Uniform { low, high } => {
                    low.0.is_finite() && high.0.is_finite() && low.0 <= high.0
                }
                Distribution::Normal { mean, std } => {
                    mean.0.is_finite() && std.0.is_finite() && std.0 >= 0.0
                }
            };
            if !valid {
                return Err(format!("invalid distribution parameters {dist:?}"));
            }
            one(ty.clone())
        }
        Op::Load { ty, .. } => one(ty.clone()),
        Op::Store { .. } => Ok(Vec::new()),
        Op::Cond => {
            let pred = args[0];
            if *pred != Type::scalar(DType::Bool) {
                return Err(format!("the predicate must be bool[], found {pred}"));
            }
            let (then, els) = (&regions[0], &regions[1]);
            if !then.args.is_empty() || !els.args.is_empty() {
                return Err("the `then` and `else` regions take no arguments".into());
            }
            if then.results != els.results {
                return Err(format!(
                    "the branches yield different types: then ({}) vs else ({})",
                    Types(&then.results),
                    Types(&els.results)
                ));
            }
            Ok(then.results.iter().map(|&t| t.clone()).collect())
        }
        Op::While => {
            let (cond, body) = (&regions[0], &regions[1]);
            for (label, region) in [("cond", cond), ("body", body)] {
                if region.args != args {
                    return Err(format!(
                        "the `{label}` region's arguments ({}) must match the carried values ({})",
                        Types(&region.args),
                        Types(args)
                    ));
                }
            }
            if cond.results != [&Type::scalar(DType::Bool)] {
                return Err(format!(
                    "the `cond` region must yield one bool[], found ({})",
                    Types(&cond.results)
                ));
            }
            if body.results != args {
                return Err(format!(
                    "the `body` region must yield the carried types ({}), found ({})",
                    Types(args),
                    Types(&body.results)
                ));
            }
            Ok(args.iter().map(|&t| t.clone()).collect())
        }
        Op::Fused => {
            let body = &regions[0];
            if body.args != args {
                return Err(format!(
                    "the `body` region's arguments ({}) must match the operands ({})",
                    Types(&body.args),
                    Types(args)
                ));
            }
            Ok(body.results.iter().map(|&t| t.clone()).collect())
        }
        Op::Call { results, .. } => Ok(results.clone()),
        Op::AllReduce { op, bf16 } => {
            if *bf16 && let Some(ty) = args.iter().find(|t| t.dtype != DType::F32) {
                return Err(format!(
                    "operand {ty} cannot travel as bf16; only f32 operands do"
                ));
            }
            let class = match op {
                AllReduceOp::Sum => DTypeClass::Numeric,
                AllReduceOp::Mean => DTypeClass::Float,
            };
            communicated(args, class)
        }
        Op::ReduceScatter { op, ranks } => {
            let class = match op {
                AllReduceOp::Sum => DTypeClass::Numeric,
                AllReduceOp::Mean => DTypeClass::Float,
            };
            split_among(&communicated(args, class)?, *ranks)
        }
        Op::Shard { ranks } => split_among(&communicated(args, DTypeClass::Any)?, *ranks),
        Op::AllGather { ranks } => {
            let types = communicated(args, DTypeClass::Any)?;
            (types.into_iter().enumerate())
                .map(|(i, ty)| {
                    let mut dims = leading_axis(&ty, i)?;
                    dims[0] = dims[0].checked_mul(*ranks).ok_or_else(|| {
                        format!("operand {i} is {ty}; {ranks} ranks' blocks overflow its size")
                    })?;
                    Ok(Type::new(ty.dtype, Shape::fixed(&dims)))
                })
                .collect()
        }
        Op::CollectiveBroadcast { .. } => communicated(args, DTypeClass::Any),
        Op::Send { .. } => communicated(args, DTypeClass::Any).map(|_| Vec::new()),
        Op::Recv { results, .. } if results.is_empty() => {
            Err("receives at least one value; state its type after the colon".into())
        }
        Op::Recv { results, .. } => {
            communicated(&results.iter().collect::<Vec<_>>(), DTypeClass::Any)
        }
    }
}

/// The types of a communication op's operands, which it also returns: at least one, of
/// fixed shapes (every rank must agree on the message's size before it is sent), of `class`.
fn communicated(args: &[&Type], class: DTypeClass) -> Result<Vec<Type>, String> {
    if args.is_empty() {
        return Err("takes at least one operand".into());
    }
    for (i, ty) in args.iter().enumerate() {
        if !class.admits(ty.dtype) {
            return Err(format!(
                "operand {i} is {ty}; it must be {}",
                class.describe()
            ));
        }
        if ty.shape.as_fixed().is_none() {
            return Err(format!(
                "operand {i} is {ty}; communicated values need fixed shapes"
            ));
        }
    }
    Ok(args.iter().map(|&t| t.clone()).collect())
}

/// Each type's first axis divided into `ranks` blocks: one block's type.
fn split_among(types: &[Type], ranks: usize) -> Result<Vec<Type>, String> {
    if ranks == 0 {
        return Err("needs `ranks` of at least 1".into());
    }
    (types.iter().enumerate())
        .map(|(i, ty)| {
            let mut dims = leading_axis(ty, i)?;
            if dims[0] % ranks != 0 {
                return Err(format!(
                    "operand {i} is {ty}; its first axis must split evenly into {ranks} blocks"
                ));
            }
            dims[0] /= ranks;
            Ok(Type::new(ty.dtype, Shape::fixed(&dims)))
        })
        .collect()
}

/// The fixed dims of operand `i`, which must have a first axis.
fn leading_axis(ty: &Type, i: usize) -> Result<Vec<usize>, String> {
    match ty.shape.as_fixed() {
        Some(dims) if !dims.is_empty() => Ok(dims.to_vec()),
        _ => Err(format!(
            "operand {i} is {ty}; it needs a first axis to split among the ranks"
        )),
    }
}

/// The shape after reducing the axes marked in `reduced`.
fn reduced_shape(shape: &Shape, reduced: &[bool], keep_dims: bool) -> Shape {
    Shape(
        shape
            .dims()
            .iter()
            .zip(reduced)
            .filter_map(|(d, &r)| match (r, keep_dims) {
                (false, _) => Some(d.clone()),
                (true, true) => Some(Dim::Fixed(1)),
                (true, false) => None,
            })
            .collect(),
    )
}

/// Equal element counts: equal products of fixed sizes and the same symbols, counted with
/// multiplicity. (So `[N,28,28]` reshapes to `[N,784]`, and `[N,4]` never to `[M,4]`.)
fn same_element_count(a: &Shape, b: &Shape) -> bool {
    let fixed = |s: &Shape| -> Option<u128> {
        s.dims()
            .iter()
            .filter_map(Dim::as_fixed)
            .try_fold(1u128, |acc, d| acc.checked_mul(d as u128))
    };
    let symbols = |s: &Shape| {
        let mut v: Vec<_> = s.symbols().cloned().collect();
        v.sort();
        v
    };
    let zero = |s: &Shape| s.dims().contains(&Dim::Fixed(0));
    if zero(a) || zero(b) {
        // Zero elements either way, whatever the symbols are.
        return zero(a) && zero(b);
    }
    // An overflowing product (`None`) matches nothing: such a type is refused anyway.
    fixed(a).is_some() && fixed(a) == fixed(b) && symbols(a) == symbols(b)
}

/// `n` elements with `interior` between neighbours, `low` before and `high` after, if that
/// size is a `usize`.
pub fn padded_size(n: usize, low: usize, high: usize, interior: usize) -> Option<usize> {
    let inside = match n {
        0 => 0,
        n => (n - 1).checked_mul(interior)?.checked_add(n)?,
    };
    inside.checked_add(low)?.checked_add(high)
}

/// The dimensions of an NCHW operand: `N` as it is, `C`, `H`, `W` fixed.
fn nchw(what: &str, t: &Type) -> Result<(Dim, [usize; 3]), String> {
    let dims = t.shape.dims();
    let fixed = |i: usize| dims[i].as_fixed();
    match dims {
        [n, ..] if dims.len() == 4 => match (fixed(1), fixed(2), fixed(3)) {
            (Some(c), Some(h), Some(w)) => Ok((n.clone(), [c, h, w])),
            _ => Err(format!(
                "the {what} {t} needs fixed channels, height and width"
            )),
        },
        _ => Err(format!("the {what} must be NCHW (rank 4), found {t}")),
    }
}

/// The type rule `rule` of a convolution or pooling op, whose activations (`activations`: each
/// operand's, then the result's) are laid out channels last (`[N, H, W, C]`) when
/// `channels_last`: the rule applied to the operands seen as NCHW, the result laid out
/// channels last again.
fn in_layout(
    channels_last: bool,
    activations: [bool; 3],
    args: &[&Type],
    rule: impl Fn(&[&Type]) -> Result<Type, String>,
) -> Result<Type, String> {
    if !channels_last {
        return rule(args);
    }
    let permuted = |t: &Type, perm: [usize; 4]| -> Result<Type, String> {
        match t.shape.dims() {
            dims if dims.len() == 4 => {
                Ok(t.with_shape(Shape(perm.map(|a| dims[a].clone()).into())))
            }
            _ => Err(format!(
                "a channels-last operand must be NHWC (rank 4), found {t}"
            )),
        }
    };
    let nchw: Vec<Type> = (args.iter().zip(activations))
        .map(|(t, activation)| match activation {
            true => permuted(t, NHWC_TO_NCHW),
            false => Ok((*t).clone()),
        })
        .collect::<Result<_, _>>()?;
    let result = rule(&nchw.iter().collect::<Vec<_>>())?;
    match activations[2] {
        true => permuted(&result, NCHW_TO_NHWC),
        false => Ok(result),
    }
}

/// The output size along both spatial axes, or an error naming the window and the input.
fn spatial_output(
    input: [usize; 2],
    size: impl Fn(usize, usize) -> Option<usize>,
    window: &str,
    padding: [(usize, usize); 2],
) -> Result<[usize; 2], String> {
    match (size(0, input[0]), size(1, input[1])) {
        (Some(h), Some(w)) => Ok([h, w]),
        _ => Err(format!(
            "the {window} is larger than the input {}x{} padded by {:?}",
            input[0], input[1], padding
        )),
    }
}

/// The type rule of `conv2d` and its two transposes.
fn conv2d_type(kind: ConvKind, attrs: &Conv2dAttrs, args: &[&Type]) -> Result<Type, String> {
    attrs.check().map_err(|e| e.to_string())?;
    let (a, b) = (args[0], args[1]);
    if !a.dtype.is_float() || a.dtype != b.dtype {
        return Err(format!(
            "operands must have one float dtype, found {a}, {b}"
        ));
    }
    let groups = attrs.groups;
    let forward = |x: &Type,
                   c: usize,
                   hw: [usize; 2],
                   w: &Type|
     -> Result<(usize, [usize; 2]), String> {
        let (o, [cg, kh, kw]) = match nchw("weights", w)? {
            (Dim::Fixed(o), dims) => (o, dims),
            _ => return Err(format!("the weights {w} need a fixed output-channel count")),
        };
        if !c.is_multiple_of(groups) || !o.is_multiple_of(groups) {
            return Err(format!(
                "groups={groups} must divide the input channels ({c}) and the output channels ({o})"
            ));
        }
        if cg != c / groups {
            return Err(format!(
                "the weights {w} take {cg} input channels per group, but the input {x} has {c} \
                 channels in {groups} group(s) ({} each)",
                c / groups
            ));
        }
        let size = |axis: usize, n: usize| attrs.output_size(axis, n, [kh, kw][axis]);
        let window = format!("kernel {kh}x{kw} dilated by {:?}", attrs.dilation);
        Ok((o, spatial_output(hw, size, &window, attrs.padding)?))
    };
    let dims = match kind {
        ConvKind::Forward => {
            let (n, [c, h, w]) = nchw("input", a)?;
            let (o, [h2, w2]) = forward(a, c, [h, w], b)?;
            vec![n, o.into(), h2.into(), w2.into()]
        }
        ConvKind::InputGrad { input } => {
            let (n, [o, h2, w2]) = nchw("gradient", a)?;
            let (_, [cg, _, _]) = nchw("weights", b)?;
            let c = cg.checked_mul(groups).ok_or_else(|| {
                format!("{cg} channels per group times {groups} groups overflows")
            })?;
            let x = Type::new(
                a.dtype,
                vec![n.clone(), c.into(), input[0].into(), input[1].into()],
            );
            let (o2, out) = forward(&x, c, input, b)?;
            if (o2, out) != (o, [h2, w2]) {
                return Err(format!(
                    "the gradient {a} is not the shape conv2d gives for an input {x} with weights {b}"
                ));
            }
            x.shape.0
        }
        ConvKind::FilterGrad { kernel } => {
            let (n, [c, h, w]) = nchw("input", a)?;
            let (n2, [o, h2, w2]) = nchw("gradient", b)?;
            if n != n2 {
                return Err(format!(
                    "the input {a} and the gradient {b} differ in batch size"
                ));
            }
            let wt = Type::new(
                a.dtype,
                vec![
                    o.into(),
                    (c / groups.max(1)).into(),
                    kernel[0].into(),
                    kernel[1].into(),
                ],
            );
            let (o2, out) = forward(a, c, [h, w], &wt)?;
            if (o2, out) != (o, [h2, w2]) {
                return Err(format!(
                    "the gradient {b} is not the shape conv2d gives for the input {a} with weights {wt}"
                ));
            }
            wt.shape.0
        }
    };
    Ok(Type::new(a.dtype, Shape(dims)))
}

/// The type rule of the pooling ops and their gradients.
fn pool2d_type(kind: PoolKind, attrs: &Pool2dAttrs, args: &[&Type]) -> Result<Type, String> {
    attrs.check().map_err(|e| e.to_string())?;
    let x = args[0];
    if !x.dtype.is_float() {
        return Err(format!("the operand must be a float type, found {x}"));
    }
    let window = format!("window {}x{}", attrs.window[0], attrs.window[1]);
    let size = |axis: usize, n: usize| attrs.output_size(axis, n);
    match kind {
        PoolKind::Max | PoolKind::Avg => {
            let (n, [c, h, w]) = nchw("input", x)?;
            let [h2, w2] = spatial_output([h, w], size, &window, attrs.padding)?;
            Ok(Type::new(x.dtype, vec![n, c.into(), h2.into(), w2.into()]))
        }
        PoolKind::MaxGrad => {
            let (_, [c, h, w]) = nchw("input", x)?;
            let [h2, w2] = spatial_output([h, w], size, &window, attrs.padding)?;
            let g = args[1];
            let mut expected = x.shape.0.clone();
            expected[1..].clone_from_slice(&[c.into(), h2.into(), w2.into()]);
            if g.dtype != x.dtype || g.shape.0 != expected {
                return Err(format!(
                    "the gradient {g} is not the shape max_pool2d gives for the input {x}"
                ));
            }
            Ok(x.clone())
        }
        PoolKind::AvgGrad { input } => {
            let (n, [c, h2, w2]) = nchw("gradient", x)?;
            let out = spatial_output(input, size, &window, attrs.padding)?;
            if out != [h2, w2] {
                return Err(format!(
                    "the gradient {x} is not the shape avg_pool2d gives for an input of {}x{}",
                    input[0], input[1]
                ));
            }
            Ok(Type::new(
                x.dtype,
                vec![n, c.into(), input[0].into(), input[1].into()],
            ))
        }
    }
}

/// `[..., M, K] @ [..., K, N] -> [..., M, N]`, batch dimensions broadcast.
fn matmul_type(a: &Type, b: &Type, transpose_a: bool, transpose_b: bool) -> Result<Type, String> {
    if a.rank() < 2 || b.rank() < 2 {
        return Err(format!(
            "operands need rank 2 or more (reshape vectors to matrices): {a}, {b}"
        ));
    }
    if a.dtype != b.dtype || !a.dtype.is_numeric() {
        return Err(format!("operands need one numeric dtype: {a}, {b}"));
    }
    let last_two = |t: &Type, transposed: bool| {
        let n = t.rank();
        let (r, c) = (t.shape.0[n - 2].clone(), t.shape.0[n - 1].clone());
        if transposed { (c, r) } else { (r, c) }
    };
    let (m, k) = last_two(a, transpose_a);
    let (k2, n) = last_two(b, transpose_b);
    if k != k2 {
        return Err(format!(
            "contraction dimensions differ: {a}{} @ {b}{} contracts {k} with {k2}",
            if transpose_a { "ᵀ" } else { "" },
            if transpose_b { "ᵀ" } else { "" },
        ));
    }
    let batch_a = Shape(a.shape.0[..a.rank() - 2].to_vec());
    let batch_b = Shape(b.shape.0[..b.rank() - 2].to_vec());
    let mut batch = Shape::broadcast(&batch_a, &batch_b).ok_or_else(|| {
        format!("batch dimensions {batch_a} and {batch_b} do not broadcast: {a} @ {b}")
    })?;
    batch.0.extend([m, n]);
    Ok(a.with_shape(batch))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::literal::Literal;
    use crate::op::{BinaryOp, CompareOp, ReduceOp, UnaryOp};
    use crate::types::ty;

    fn f32t<const R: usize>(dims: [Dim; R]) -> Type {
        ty(DType::F32, dims)
    }

    fn infer1(op: Op, args: &[&Type]) -> Result<Type, String> {
        infer(&op, args, &[])
            .map(|mut v| v.remove(0))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn elementwise_rules() {
        let x = f32t(["N".into(), 3.into()]);
        assert_eq!(infer1(Op::Unary(UnaryOp::Exp), &[&x]), Ok(x.clone()));
        assert_eq!(infer1(Op::Binary(BinaryOp::Add), &[&x, &x]), Ok(x.clone()));
        assert_eq!(
            infer1(Op::Compare(CompareOp::Lt), &[&x, &x]),
            Ok(x.with_dtype(DType::Bool))
        );
        let i = ty(DType::I32, [3.into()]);
        assert_eq!(
            infer1(Op::Unary(UnaryOp::Exp), &[&i]).unwrap_err(),
            "exp: operand type i32[3] is not accepted; `exp` needs a float type (f32, f64)"
        );
        let v = f32t([3.into()]);
        assert_eq!(
            infer1(Op::Binary(BinaryOp::Mul), &[&x, &v]).unwrap_err(),
            "mul: operand types differ: f32[N,3], f32[3]; elementwise operands must have one \
             type (the builder broadcasts them explicitly)"
        );
    }

    #[test]
    fn matmul_rules() {
        let a = f32t(["N".into(), 784.into()]);
        let w = f32t([784.into(), 512.into()]);
        let op = |ta, tb| Op::MatMul {
            transpose_a: ta,
            transpose_b: tb,
        };
        assert_eq!(
            infer1(op(false, false), &[&a, &w]),
            Ok(f32t(["N".into(), 512.into()]))
        );
        let wt = f32t([512.into(), 784.into()]);
        assert_eq!(
            infer1(op(false, true), &[&a, &wt]),
            Ok(f32t(["N".into(), 512.into()]))
        );
        let batched = f32t([4.into(), 7.into(), 784.into()]);
        assert_eq!(
            infer1(op(false, false), &[&batched, &w]),
            Ok(f32t([4.into(), 7.into(), 512.into()]))
        );
        assert_eq!(
            infer1(op(false, false), &[&a, &wt]).unwrap_err(),
            "matmul: contraction dimensions differ: f32[N,784] @ f32[512,784] contracts 784 with 512"
        );
    }

    #[test]
    fn layout_rules() {
        let x = f32t(["N".into(), 28.into(), 28.into()]);
        let flat = Shape(vec!["N".into(), 784.into()]);
        assert!(infer1(Op::Reshape { shape: flat }, &[&x]).is_ok());
        let bad = Shape(vec!["M".into(), 784.into()]);
        assert!(infer1(Op::Reshape { shape: bad }, &[&x]).is_err());
        assert_eq!(
            infer1(
                Op::Transpose {
                    perm: vec![2, 0, 1]
                },
                &[&x]
            ),
            Ok(f32t([28.into(), "N".into(), 28.into()]))
        );
        assert!(
            infer1(
                Op::Transpose {
                    perm: vec![0, 0, 1]
                },
                &[&x]
            )
            .is_err()
        );
        let sliced = Op::Slice {
            axes: vec![
                AxisSlice::Full,
                AxisSlice::Range {
                    start: 1,
                    end: 28,
                    step: 3,
                },
                AxisSlice::Range {
                    start: 4,
                    end: 4,
                    step: 1,
                },
            ],
        };
        assert_eq!(
            infer1(sliced, &[&x]),
            Ok(f32t(["N".into(), 9.into(), 0.into()]))
        );
        let reduce = Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0, 2],
            keep_dims: true,
        };
        assert_eq!(
            infer1(reduce, &[&x]),
            Ok(f32t([1.into(), 28.into(), 1.into()]))
        );
    }

    #[test]
    fn const_rules() {
        let splat = Op::Const {
            value: Literal::F32(vec![0.0]),
            ty: f32t(["N".into(), 2.into()]),
        };
        assert!(infer1(splat, &[]).is_ok());
        let dense = Op::Const {
            value: Literal::F32(vec![0.0, 1.0]),
            ty: f32t(["N".into(), 2.into()]),
        };
        assert_eq!(
            infer1(dense, &[]).unwrap_err(),
            "const: a literal of 2 elements needs a static shape, found f32[N,2]"
        );
    }
}
