//! Ops composed of Kiln's primitives beyond the core set: `Mod`, hyperbolic functions, tests
//! for NaN and infinity, `Shrink`, `Swish`, `Trilu`, `EyeLike`, `OneHot`, `GatherElements`,
//! `CumSum`, RMS and Lp normalisation, and the two classification losses.

use crate::context::{Converted, Ctx, Fail, axis, unsupported};
use crate::tensor;
use kiln_ir::{AxisSlice, BinaryOp, CompareOp, DType, Dim, ReduceOp, Shape, Type, Value};

/// `op(a, b)` computed in f64 (exact for integers below 2⁵³, and f32's quotients stay exact),
/// then converted back.
fn through_f64(
    c: &mut Ctx,
    a: Value,
    b: Value,
    f: impl Fn(&mut Ctx, Value, Value) -> Result<Value, Fail>,
) -> Result<Value, Fail> {
    let dtype = c.dtype(a);
    if dtype == DType::F64 {
        return f(c, a, b);
    }
    let (fa, fb) = (c.b.cast(a, DType::F64)?, c.b.cast(b, DType::F64)?);
    let r = f(c, fa, fb)?;
    Ok(c.b.cast(r, dtype)?)
}

/// `Mod(fmod)`: the remainder with the divisor's sign (`fmod=0`) or the dividend's (`fmod=1`).
pub(super) fn modulo(c: &mut Ctx) -> Converted {
    let (a, b) = (c.input(0)?, c.input(1)?);
    let fmod = c.node.int("fmod", 0)? != 0;
    // Before opset 28, the divisor-signed remainder (fmod=0) is defined for integers only.
    if !fmod && c.dtype(a).is_float() && c.node.opset < 28 {
        return Err(Fail::Invalid(format!(
            "fmod=0 on {} inputs: before opset 28 floating-point Mod needs fmod=1",
            c.dtype(a)
        )));
    }
    let r = through_f64(c, a, b, |c, a, b| {
        let q = c.b.div(a, b)?;
        let q = match fmod {
            false => c.b.floor(q)?,
            true => {
                // trunc(q) = sign(q)·floor(|q|)
                let s = c.b.sign(q)?;
                let m = c.b.abs(q)?;
                let f = c.b.floor(m)?;
                c.b.mul(s, f)?
            }
        };
        let qb = c.b.mul(q, b)?;
        let r = c.b.sub(a, qb)?;
        // An infinite divisor leaves `a` (NumPy's rule), or gives the divisor when the signs
        // differ under the divisor-signed remainder.
        let dtype = c.dtype(a);
        let inf = c.scalar(dtype, f64::INFINITY)?;
        let magnitude = c.b.abs(b)?;
        let infinite = c.b.eq(magnitude, inf)?;
        let at_infinity = match fmod {
            true => a,
            false => {
                let (sa, sb) = (c.b.sign(a)?, c.b.sign(b)?);
                let same = c.b.eq(sa, sb)?;
                let zero = c.scalar(dtype, 0.0)?;
                let is_zero = c.b.eq(a, zero)?;
                let keep = c.b.or(same, is_zero)?;
                c.b.select(keep, a, b)?
            }
        };
        Ok(c.b.select(infinite, at_infinity, r)?)
    })?;
    Ok(vec![r])
}

/// `Sinh`, `Cosh` (`(eˣ ∓ e⁻ˣ)/2`), `Tan` (`sin/cos`), `Asinh`, `Acosh`, `Atanh` (logarithms).
pub(super) fn trig(c: &mut Ctx, which: &str) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    let half = c.scalar(dtype, 0.5)?;
    let one = c.scalar(dtype, 1.0)?;
    let y = match which {
        "Sinh" | "Cosh" => {
            let e = c.b.exp(x)?;
            let n = c.b.neg(x)?;
            let en = c.b.exp(n)?;
            let op = if which == "Sinh" {
                BinaryOp::Sub
            } else {
                BinaryOp::Add
            };
            let s = c.b.binary(op, e, en)?;
            c.b.mul(s, half)?
        }
        "Tan" => {
            let (s, co) = (c.b.sin(x)?, c.b.cos(x)?);
            c.b.div(s, co)?
        }
        "Asinh" => {
            // sign(x)·log(|x| + √(x² + 1)): no cancellation for negative x.
            let ax = c.b.abs(x)?;
            let x2 = c.b.mul(ax, ax)?;
            let r = c.b.add(x2, one)?;
            let r = c.b.sqrt(r)?;
            let s = c.b.add(ax, r)?;
            let l = c.b.log(s)?;
            let sign = c.b.sign(x)?;
            c.b.mul(sign, l)?
        }
        "Acosh" => {
            let x2 = c.b.mul(x, x)?;
            let r = c.b.sub(x2, one)?;
            let r = c.b.sqrt(r)?;
            let s = c.b.add(x, r)?;
            c.b.log(s)?
        }
        _ => {
            let (p, m) = (c.b.add(one, x)?, c.b.sub(one, x)?);
            let q = c.b.div(p, m)?;
            let l = c.b.log(q)?;
            c.b.mul(l, half)?
        }
    };
    Ok(vec![y])
}

/// `IsNaN`: `x ≠ x`.
pub(super) fn is_nan(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    Ok(vec![c.b.ne(x, x)?])
}

/// `IsInf(detect_positive, detect_negative)`.
pub(super) fn is_inf(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    let (pos, neg) = (
        c.node.int("detect_positive", 1)? != 0,
        c.node.int("detect_negative", 1)? != 0,
    );
    let (inf, minus) = (
        c.scalar(dtype, f64::INFINITY)?,
        c.scalar(dtype, f64::NEG_INFINITY)?,
    );
    let (p, n) = (c.b.eq(x, inf)?, c.b.eq(x, minus)?);
    let y = match (pos, neg) {
        (true, true) => c.b.or(p, n)?,
        (true, false) => p,
        (false, true) => n,
        (false, false) => {
            let no = c.scalar(DType::Bool, 0.0)?;
            let t = c.ty(p);
            c.b.broadcast_to(no, &t.shape)?
        }
    };
    Ok(vec![y])
}

/// `Shrink(bias, lambd)`: `x + bias` below `−lambd`, `x − bias` above `lambd`, else 0.
pub(super) fn shrink(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    let (bias, lambd) = (
        c.node.float("bias", 0.0)? as f64,
        c.node.float("lambd", 0.5)? as f64,
    );
    let (l, nl, b, zero) = (
        c.scalar(dtype, lambd)?,
        c.scalar(dtype, -lambd)?,
        c.scalar(dtype, bias)?,
        c.scalar(dtype, 0.0)?,
    );
    let (below, above) = (c.b.lt(x, nl)?, c.b.gt(x, l)?);
    let (up, down) = (c.b.add(x, b)?, c.b.sub(x, b)?);
    let y = c.b.select(above, down, zero)?;
    Ok(vec![c.b.select(below, up, y)?])
}

/// `Swish(alpha)`: `x · σ(alpha · x)`.
pub(super) fn swish(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let alpha = c.scalar(c.dtype(x), c.node.float("alpha", 1.0)? as f64)?;
    let ax = c.b.mul(x, alpha)?;
    let s = c.b.sigmoid(ax)?;
    Ok(vec![c.b.mul(x, s)?])
}

/// `Trilu(upper, k)`: the upper or lower triangle of the last two axes, from diagonal `k`.
pub(super) fn trilu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let k = c.known_scalar(1, "k")?.unwrap_or(0.0) as i64;
    let upper = c.node.int("upper", 1)? != 0;
    let t = c.ty(x);
    let rank = t.rank();
    if rank < 2 {
        return Err("Trilu needs at least 2 axes".into());
    }
    let positions = t.with_dtype(DType::I64);
    let (rows, cols) = (
        c.b.iota(positions.clone(), rank - 2)?,
        c.b.iota(positions, rank - 1)?,
    );
    let offset = c.b.sub(cols, rows)?;
    let k = c.scalar(DType::I64, k as f64)?;
    let keep =
        c.b.compare(if upper { CompareOp::Ge } else { CompareOp::Le }, offset, k)?;
    let zero = c.scalar(t.dtype, 0.0)?;
    Ok(vec![c.b.select(keep, x, zero)?])
}

/// `EyeLike(dtype, k)`: ones on diagonal `k` of a matrix shaped like the input.
pub(super) fn eye_like(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let t = c.ty(x);
    let dtype = match c.node.int_opt("dtype")? {
        Some(d) => tensor::dtype(d as i32).map_err(Fail::Unsupported)?,
        None => t.dtype,
    };
    if t.rank() != 2 {
        return Err("EyeLike needs a matrix".into());
    }
    let positions = t.with_dtype(DType::I64);
    let (rows, cols) = (c.b.iota(positions.clone(), 0)?, c.b.iota(positions, 1)?);
    let offset = c.b.sub(cols, rows)?;
    let k = c.scalar(DType::I64, c.node.int("k", 0)? as f64)?;
    let on = c.b.eq(offset, k)?;
    Ok(vec![c.b.cast(on, dtype)?])
}

/// `OneHot(indices, depth, values; axis)`: `values[1]` where the position along the new axis
/// is the index (negative ones count from `depth`), else `values[0]`.
pub(super) fn one_hot(c: &mut Ctx) -> Converted {
    let idx = c.input(0)?;
    let depth = one_hot_depth(c)?;
    let values = c.input(2)?;
    // [off, on]: a longer vector's tail would otherwise be ignored.
    let vt = c.ty(values);
    if !matches!(vt.shape.dims(), [d] if d.as_fixed().is_none_or(|n| n == 2)) {
        return Err(Fail::Invalid(format!(
            "the values {} should be exactly two elements, [off, on]",
            vt.shape
        )));
    }
    let idx = c.b.cast(idx, DType::I64)?;
    let t = c.ty(idx);
    let rank = t.rank() + 1;
    let a = axis(c.node.int("axis", -1)?, rank)?;
    let idx = c.wrap_negative(idx, depth)?;
    let mut dims = t.shape.dims().to_vec();
    dims.insert(a, Dim::Fixed(1));
    let idx = c.b.reshape(idx, Shape(dims.clone()))?;
    dims[a] = Dim::Fixed(depth);
    let positions = c.b.iota(Type::new(DType::I64, Shape(dims)), a)?;
    let hit = c.b.eq(positions, idx)?;
    let pick = |c: &mut Ctx, i: usize| -> Result<Value, Fail> {
        let ranges = vec![AxisSlice::Range {
            start: i,
            end: i + 1,
            step: 1,
        }];
        let v = c.b.slice(values, ranges)?;
        Ok(c.b.reshape(v, Shape::scalar())?)
    };
    let (off, on) = (pick(c, 0)?, pick(c, 1)?);
    Ok(vec![c.b.select(hit, on, off)?])
}

/// `OneHot`'s depth: one number (a scalar or a 1-element vector), cast to an integer, not
/// negative (it is the size of the new axis).
fn one_hot_depth(c: &Ctx) -> Result<usize, Fail> {
    let depth = c
        .known_scalar(1, "depth")?
        .ok_or("input depth is required")?;
    let rank = c.known(1).map_or(0, |a| a.shape().len());
    if rank > 1 {
        return Err(Fail::Invalid(format!(
            "depth should be a scalar or a 1-element vector, not of rank {rank}"
        )));
    }
    usize::try_from(depth as i64)
        .map_err(|_| Fail::Invalid(format!("depth {depth} should not be negative")))
}

/// `GatherElements(axis)`: `out[..., i, ...] = data[..., index[..., i, ...], ...]`, as one gather
/// from the flattened data at computed linear positions.
pub(super) fn gather_elements(c: &mut Ctx) -> Converted {
    let data = c.input(0)?;
    let dshape = c.shape(data, "the data")?;
    let index = c.input(1)?;
    let ishape = c.shape(index, "the indices")?;
    let a = axis(c.node.int("axis", 0)?, dshape.len())?;
    if !matches!(c.dtype(index), DType::I32 | DType::I64) {
        return Err(format!(
            "the indices should be int32 or int64, not {}",
            c.dtype(index)
        )
        .into());
    }
    let fits =
        ishape.len() == dshape.len() && (0..dshape.len()).all(|d| d == a || ishape[d] <= dshape[d]);
    if !fits {
        return Err(format!(
            "the indices {ishape:?} should have the data's rank and no axis but {a} longer \
             than the data's {dshape:?}"
        )
        .into());
    }
    let index = c.b.cast(index, DType::I64)?;
    let index = c.wrap_negative(index, dshape[a])?;
    let index = c.in_range(index, dshape[a])?;
    let positions = Type::new(DType::I64, Shape::fixed(&ishape));
    let mut terms = Vec::with_capacity(dshape.len());
    let mut stride = 1usize;
    for d in (0..dshape.len()).rev() {
        let coordinate = if d == a {
            index
        } else {
            c.b.iota(positions.clone(), d)?
        };
        let s = c.scalar(DType::I64, stride as f64)?;
        terms.push(c.b.mul(coordinate, s)?);
        stride *= dshape[d];
    }
    let linear = c
        .combine(BinaryOp::Add, terms)?
        .ok_or("GatherElements needs an axis")?;
    let flat = c.b.reshape(data, Shape::fixed(&[stride]))?;
    Ok(vec![c.b.gather(flat, linear, 0)?])
}

/// `CumSum(x, axis; exclusive, reverse)`: running sums along one axis of static length.
pub(super) fn cumsum(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = c.shape(x, "the input")?;
    let a = axis(
        c.known_scalar(1, "axis")?.ok_or("input axis is required")? as i64,
        d.len(),
    )?;
    let (exclusive, reverse) = (
        c.node.int("exclusive", 0)? != 0,
        c.node.int("reverse", 0)? != 0,
    );
    let n = d[a];
    if n > 1024 {
        return unsupported(format!("CumSum over {n} elements (unrolled; at most 1024)"));
    }
    let mut slice_shape = d.clone();
    slice_shape[a] = 1;
    let zero = c.scalar(c.dtype(x), 0.0)?;
    let zeros = c.b.broadcast_to(zero, &Shape::fixed(&slice_shape))?;
    let order: Vec<usize> = if reverse {
        (0..n).rev().collect()
    } else {
        (0..n).collect()
    };
    let mut sums = vec![zeros; n];
    let mut acc = zeros;
    for i in order {
        let mut ranges = vec![AxisSlice::Full; d.len()];
        ranges[a] = AxisSlice::Range {
            start: i,
            end: i + 1,
            step: 1,
        };
        let xi = c.b.slice(x, ranges)?;
        let next = c.b.add(acc, xi)?;
        sums[i] = if exclusive { acc } else { next };
        acc = next;
    }
    if n == 0 {
        return Ok(vec![x]);
    }
    Ok(vec![c.b.concat(&sums, a)?])
}

/// `RMSNormalization(axis, epsilon)`: `x / √(mean(x²) + ε) · scale` over the axes from `axis`.
pub(super) fn rms_norm(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let scale = c.input(1)?;
    let rank = c.rank(x);
    let first = axis(c.node.int("axis", -1)?, rank)?;
    let sq = c.b.mul(x, x)?;
    let ms =
        c.b.reduce(ReduceOp::Mean, sq, (first..rank).collect(), true)?;
    let eps = c.scalar(c.dtype(x), c.node.float("epsilon", 1e-5)? as f64)?;
    let ms = c.b.add(ms, eps)?;
    let inv = c.b.rsqrt(ms)?;
    let y = c.b.mul(x, inv)?;
    Ok(vec![c.b.mul(y, scale)?])
}

/// `LpNormalization(axis, p)`: `x` over its L1 or L2 norm along one axis.
pub(super) fn lp_norm(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let a = axis(c.node.int("axis", -1)?, c.rank(x))?;
    let norm = match c.node.int("p", 2)? {
        1 => {
            let m = c.b.abs(x)?;
            c.b.reduce(ReduceOp::Sum, m, vec![a], true)?
        }
        2 => {
            let sq = c.b.mul(x, x)?;
            let s = c.b.reduce(ReduceOp::Sum, sq, vec![a], true)?;
            c.b.sqrt(s)?
        }
        p => return Err(Fail::Invalid(format!("p={p} (1 or 2)"))),
    };
    // A zero vector stays zero (ONNX's 0/0 is 0 here).
    let zero = c.scalar(c.dtype(x), 0.0)?;
    let empty = c.b.eq(norm, zero)?;
    let q = c.b.div(x, norm)?;
    let t = c.ty(q);
    let empty = c.b.broadcast_to(empty, &t.shape)?;
    Ok(vec![c.b.select(empty, zero, q)?])
}

/// Scores `[N, C, d…]`, integer targets `[N, d…]` and weights `[C]`, as the loss ops require.
fn check_loss_shapes(
    c: &Ctx,
    scores: Value,
    target: Value,
    weight: Option<Value>,
) -> Result<(), Fail> {
    let (st, tt) = (c.ty(scores), c.ty(target));
    let mut expected = st.shape.dims().to_vec();
    let classes = (expected.len() >= 2).then(|| expected.remove(1));
    let Some(classes) = classes.filter(|_| tt.shape.dims() == expected) else {
        return Err(format!(
            "the scores {st} should be [N, C, d…] and the target {tt} [N, d…] without the \
             classes"
        )
        .into());
    };
    if !tt.dtype.is_int() {
        return Err(format!("the target {tt} should hold integers").into());
    }
    if let Some(w) = weight
        .map(|w| c.ty(w))
        .filter(|w| w.shape.dims() != [classes.clone()])
    {
        return Err(format!("the weights {w} should be one per class ({classes})").into());
    }
    Ok(())
}

/// Each example's score of its target class, `[N, d…]` from scores `[N, C, d…]` (zero where the
/// target is `ignore_index`), and the per-example weights (0 where ignored).
fn picked(
    c: &mut Ctx,
    scores: Value,
    target: Value,
    weight: Option<Value>,
) -> Result<(Value, Value), Fail> {
    let st = c.ty(scores);
    let dtype = st.dtype;
    check_loss_shapes(c, scores, target, weight)?;
    let target = c.b.cast(target, DType::I64)?;
    let ignore = c.node.int_opt("ignore_index")?;
    let valid = match ignore {
        Some(i) => {
            let i = c.scalar(DType::I64, i as f64)?;
            Some(c.b.ne(target, i)?)
        }
        None => None,
    };
    let safe = match valid {
        Some(v) => {
            let zero = c.scalar(DType::I64, 0.0)?;
            c.b.select(v, target, zero)?
        }
        None => target,
    };
    let Some(classes) = st.shape.dims().get(1).and_then(|d| d.as_fixed()) else {
        return unsupported("scores with a symbolic number of classes");
    };
    // A class out of range picks no score: the row would count as if it were ignored.
    let safe = c.in_range(safe, classes)?;
    let mut dims = c.ty(safe).shape.dims().to_vec();
    dims.insert(1, Dim::Fixed(1));
    let t1 = c.b.reshape(safe, Shape(dims))?;
    let positions = c.b.iota(st.with_dtype(DType::I64), 1)?;
    let hit = c.b.eq(positions, t1)?;
    let zero = c.scalar(dtype, 0.0)?;
    let chosen = c.b.select(hit, scores, zero)?;
    let score = c.b.reduce(ReduceOp::Sum, chosen, vec![1], false)?;
    let w = match weight {
        Some(w) => c.b.gather(w, safe, 0)?,
        None => {
            let one = c.scalar(dtype, 1.0)?;
            let t = c.ty(score);
            c.b.broadcast_to(one, &t.shape)?
        }
    };
    let w = match valid {
        Some(v) => c.b.select(v, w, zero)?,
        None => w,
    };
    Ok((score, w))
}

/// `−score·w` reduced as `reduction` asks: none, sum, or mean (over the weights' sum).
fn reduced_loss(c: &mut Ctx, score: Value, w: Value) -> Result<Value, Fail> {
    let sw = c.b.mul(score, w)?;
    let loss = c.b.neg(sw)?;
    let rank = c.rank(loss);
    let all: Vec<usize> = (0..rank).collect();
    Ok(
        match c.node.string("reduction")?.as_deref().unwrap_or("mean") {
            "none" => loss,
            "sum" => c.b.reduce(ReduceOp::Sum, loss, all, false)?,
            "mean" => {
                let total = c.b.reduce(ReduceOp::Sum, loss, all.clone(), false)?;
                let weights = c.b.reduce(ReduceOp::Sum, w, all, false)?;
                c.b.div(total, weights)?
            }
            other => return Err(Fail::Invalid(format!("reduction {other:?}"))),
        },
    )
}

/// `NegativeLogLikelihoodLoss(input, target, weight; ignore_index, reduction)`.
pub(super) fn nll_loss(c: &mut Ctx) -> Converted {
    let (input, target) = (c.input(0)?, c.input(1)?);
    let weight = c.optional(2)?;
    let (score, w) = picked(c, input, target, weight)?;
    Ok(vec![reduced_loss(c, score, w)?])
}

/// `SoftmaxCrossEntropyLoss(scores, labels, weights; ignore_index, reduction)`: the NLL of
/// the log-softmax over the class axis, which is the second output when asked for.
pub(super) fn softmax_cross_entropy(c: &mut Ctx) -> Converted {
    let (scores, target) = (c.input(0)?, c.input(1)?);
    let weight = c.optional(2)?;
    let log_prob = kiln_runtime::composite::log_softmax(c.b, scores, 1)?;
    let (score, w) = picked(c, log_prob, target, weight)?;
    Ok(vec![reduced_loss(c, score, w)?, log_prob])
}
