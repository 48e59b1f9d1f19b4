//! Reductions and arg-reductions.

use crate::context::{Converted, Ctx, Fail, axis, unsupported};
use kiln_ir::{ArgOp, AxisSlice, BinaryOp, DType, Dim, ReduceOp, Shape, Type, Value};

/// How a `Reduce*` op combines: a Kiln reduction, with work before and after.
#[derive(Clone, Copy)]
pub(super) enum Reduction {
    /// A Kiln reduction of the input itself.
    Plain(ReduceOp),
    /// `sum(|x|)`.
    L1,
    /// `sqrt(sum(x²))`.
    L2,
    /// `sum(x²)`.
    SumSquare,
    /// `log(sum(x))`.
    LogSum,
    /// `log(sum(exp(x)))`, shifted by the maximum for stability.
    LogSumExp,
    /// The product, by multiplying slices (Kiln has no product reduction).
    Prod,
}

/// The reduced axes: an attribute, or an input from opset 13 (`ReduceSum`) or 18 (the rest);
/// none means every axis unless `noop_with_empty_axes`.
fn reduced_axes(c: &Ctx, rank: usize, input_since: i64) -> Result<Option<Vec<usize>>, Fail> {
    let axes = match c.node.opset < input_since {
        true => c.node.ints("axes").map(<[i64]>::to_vec),
        false => c.known_ints(1, "the axes")?,
    };
    match axes {
        Some(a) if !a.is_empty() => Ok(Some(
            a.iter().map(|&a| axis(a, rank)).collect::<Result<_, _>>()?,
        )),
        _ if c.node.int("noop_with_empty_axes", 0)? != 0 => Ok(None),
        _ => Ok(Some((0..rank).collect())),
    }
}

/// A `Reduce*` op.
pub(super) fn reduce(c: &mut Ctx, how: Reduction) -> Converted {
    let x = c.input(0)?;
    let since = if c.node.op_type() == "ReduceSum" {
        13
    } else {
        18
    };
    let Some(axes) = reduced_axes(c, c.rank(x), since)? else {
        return Ok(vec![x]);
    };
    let keep = c.node.int("keepdims", 1)? != 0;
    let d = c.ty(x).shape.dims().to_vec();
    if axes.iter().any(|&a| d[a].as_fixed() == Some(0)) {
        return Ok(vec![empty_reduction(c, x, how, &axes, keep)?]);
    }
    if c.dtype(x) == DType::Bool {
        // max and min of booleans are `or` and `and`: reduce them as integers.
        let i = c.b.cast(x, DType::I32)?;
        let y = c.b.reduce(plain(how)?, i, axes, keep)?;
        return Ok(vec![c.b.cast(y, DType::Bool)?]);
    }
    let y = match how {
        Reduction::Plain(op) => c.b.reduce(op, x, axes, keep)?,
        Reduction::Prod => product(c, x, &axes, keep)?,
        Reduction::L1 => {
            let a = c.b.abs(x)?;
            c.b.reduce(ReduceOp::Sum, a, axes, keep)?
        }
        Reduction::L2 | Reduction::SumSquare => {
            let sq = c.b.mul(x, x)?;
            let s = c.b.reduce(ReduceOp::Sum, sq, axes, keep)?;
            match how {
                Reduction::L2 => sqrt_any(c, s)?,
                _ => s,
            }
        }
        Reduction::LogSum => {
            let s = c.b.reduce(ReduceOp::Sum, x, axes, keep)?;
            c.b.log(s)?
        }
        Reduction::LogSumExp => {
            let m = c.b.reduce(ReduceOp::Max, x, axes.clone(), true)?;
            let z = c.b.sub(x, m)?;
            let e = c.b.exp(z)?;
            let s = c.b.reduce(ReduceOp::Sum, e, axes, keep)?;
            let l = c.b.log(s)?;
            let m = match keep {
                true => m,
                false => {
                    let shape = c.ty(l).shape;
                    c.b.reshape(m, shape)?
                }
            };
            c.b.add(l, m)?
        }
    };
    Ok(vec![y])
}

fn plain(how: Reduction) -> Result<ReduceOp, Fail> {
    match how {
        Reduction::Plain(op @ (ReduceOp::Max | ReduceOp::Min)) => Ok(op),
        _ => Err("this reduction of booleans".into()),
    }
}

/// A reduction over no elements: its identity (0 for sums, −∞ for max and log-sums, +∞ for
/// min, NaN for a mean), in the result's shape.
fn empty_reduction(
    c: &mut Ctx,
    x: Value,
    how: Reduction,
    axes: &[usize],
    keep: bool,
) -> Result<Value, Fail> {
    let t = c.ty(x);
    let value = match how {
        Reduction::Plain(ReduceOp::Max) | Reduction::LogSum | Reduction::LogSumExp => {
            f64::NEG_INFINITY
        }
        Reduction::Plain(ReduceOp::Min) => f64::INFINITY,
        Reduction::Plain(ReduceOp::Mean) => f64::NAN,
        Reduction::Prod => 1.0,
        _ => 0.0,
    };
    let value = match (t.dtype, value) {
        (DType::Bool, v) => (v > 0.0) as i32 as f64,
        (DType::I32, v) if v.is_infinite() => {
            if v > 0.0 {
                i32::MAX as f64
            } else {
                i32::MIN as f64
            }
        }
        (DType::I64, v) if v.is_infinite() => {
            if v > 0.0 {
                i64::MAX as f64
            } else {
                i64::MIN as f64
            }
        }
        (_, v) => v,
    };
    let dims: Vec<Dim> = (t.shape.dims().iter().enumerate())
        .filter_map(|(a, d)| match (axes.contains(&a), keep) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Fixed(1)),
            (true, false) => None,
        })
        .collect();
    let v = c.scalar(t.dtype, value)?;
    Ok(c.b.broadcast_to(v, &Shape(dims))?)
}

/// The product over `axes`: the reduced axes moved last and flattened into one of at most
/// 1024 factors, whose slices are multiplied in order.
fn product(c: &mut Ctx, x: Value, axes: &[usize], keep: bool) -> Result<Value, Fail> {
    let d = c.shape(x, "the input")?;
    let kept: Vec<usize> = (0..d.len()).filter(|a| !axes.contains(a)).collect();
    let n: usize = axes.iter().map(|&a| d[a]).product();
    if n > 1024 {
        return unsupported(format!(
            "ReduceProd over {n} elements (unrolled; at most 1024)"
        ));
    }
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let y = c.b.transpose(x, perm)?;
    let mut flat: Vec<usize> = kept.iter().map(|&a| d[a]).collect();
    flat.push(n);
    let y = c.b.reshape(y, Shape::fixed(&flat))?;
    let last = flat.len() - 1;
    let mut factors = Vec::with_capacity(n);
    for i in 0..n {
        let mut ranges = vec![AxisSlice::Full; flat.len()];
        ranges[last] = AxisSlice::Range {
            start: i,
            end: i + 1,
            step: 1,
        };
        factors.push(c.b.slice(y, ranges)?);
    }
    let acc = c.combine(BinaryOp::Mul, factors)?;
    let out: Vec<usize> = (0..d.len())
        .filter_map(|a| match axes.contains(&a) {
            true => keep.then_some(1),
            false => Some(d[a]),
        })
        .collect();
    Ok(c.b.reshape(acc.expect("no empty axis reaches here"), Shape::fixed(&out))?)
}

/// `sqrt(x)`, through f64 for integers.
fn sqrt_any(c: &mut Ctx, x: Value) -> Result<Value, Fail> {
    let dtype = c.dtype(x);
    if dtype.is_float() {
        return Ok(c.b.sqrt(x)?);
    }
    let f = c.b.cast(x, DType::F64)?;
    let r = c.b.sqrt(f)?;
    Ok(c.b.cast(r, dtype)?)
}

/// `ArgMax` / `ArgMin(axis, keepdims, select_last_index)`.
pub(super) fn arg(c: &mut Ctx, op: ArgOp) -> Converted {
    let x = c.input(0)?;
    let rank = c.rank(x);
    let a = axis(c.node.int("axis", 0)?, rank)?;
    let keep = c.node.int("keepdims", 1)? != 0;
    if c.node.int("select_last_index", 0)? == 0 {
        return Ok(vec![c.b.arg_reduce(op, x, a, keep)?]);
    }
    // The last extreme is the first one of the reversed axis.
    let n = c.shape(x, "the input")?[a];
    // `n − 1 − iota`, not a constant: its size is the input's, which may be past any memory.
    let positions = c.b.iota(Type::new(DType::I64, Shape::fixed(&[n])), 0)?;
    let end = c.scalar(DType::I64, (n as f64) - 1.0)?;
    let idx = c.b.sub(end, positions)?;
    let flipped = c.b.gather(x, idx, a)?;
    let i = c.b.arg_reduce(op, flipped, a, keep)?;
    let last = c.scalar(c.dtype(i), (n as f64) - 1.0)?;
    Ok(vec![c.b.sub(last, i)?])
}
