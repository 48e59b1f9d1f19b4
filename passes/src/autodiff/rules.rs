//! The vector-Jacobian rule of every op, in one `match`.
//!
//! A rule receives the adjoint `g` of the op's result and returns the contribution to each
//! active operand. Notation in the comments: `x`, `a`, `b` operands, `y` the result.

use super::{AutodiffError, Sweep, zeros};
use kiln_ir::{
    AllReduceOp, AxisSlice, BinaryOp, BuildError, CompareOp, ConvKind, Dim, FunctionBuilder, Inst,
    Op, PoolKind, ReduceOp, Shape, Type, UnaryOp, Value,
};

type Contributions = Vec<(Value, Value)>;

pub(super) fn vjp(
    s: &Sweep<'_>,
    b: &mut FunctionBuilder,
    inst: Inst,
    grads: &[Option<Value>],
) -> Result<Contributions, AutodiffError> {
    let data = s.src.inst(inst);
    let args = &data.args;
    let x = |i: usize| s.fwd(args[i]);
    let y = |i: usize| s.fwd(data.results[i]);
    let active = |i: usize| s.wants_gradient(inst, i);
    let no_rule = || AutodiffError::NoRule {
        op: data.op.name(),
        line: kiln_ir::print::inst_line(s.src, inst),
    };
    if let Op::Call { callee, .. } = &data.op {
        return call(s, b, inst, callee, grads);
    }
    if let Op::AllReduce { op, bf16 } = &data.op {
        return all_reduce(s, b, inst, *op, *bf16, grads);
    }
    // Every op with a rule below has one result; `grads` has at least one adjoint.
    let g = grads.first().copied().flatten();
    let Some(g) = g else {
        return Err(no_rule());
    };
    let mut out: Contributions = Vec::new();
    match &data.op {
        Op::Unary(op) => {
            if active(0) {
                out.push((args[0], unary(b, *op, x(0), y(0), g)?));
            }
        }
        Op::Binary(op) => {
            let (ga, gb) = binary(b, *op, x(0), x(1), y(0), g, (active(0), active(1)))?;
            out.extend(ga.map(|v| (args[0], v)));
            out.extend(gb.map(|v| (args[1], v)));
        }
        Op::Select => {
            let zero = zeros(b, s.ty(args[1]))?;
            if active(1) {
                out.push((args[1], b.select(x(0), g, zero)?));
            }
            if active(2) {
                out.push((args[2], b.select(x(0), zero, g)?));
            }
        }
        Op::Cast { .. } => {
            let from = s.ty(args[0]).dtype;
            if active(0) && from.is_float() {
                out.push((args[0], b.cast(g, from)?));
            }
        }
        Op::Broadcast { .. } => {
            if active(0) {
                out.push((args[0], unbroadcast(b, g, &s.ty(args[0]).shape)?));
            }
        }
        Op::Reshape { .. } => {
            if active(0) {
                out.push((args[0], b.reshape(g, s.ty(args[0]).shape.clone())?));
            }
        }
        Op::Transpose { perm } => {
            if active(0) {
                let mut inverse = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i;
                }
                out.push((args[0], b.transpose(g, inverse)?));
            }
        }
        Op::Slice { axes } => {
            // dx = g placed back where the slice took it from: a pad.
            if active(0) {
                let dims = s.ty(args[0]).shape.dims();
                let (mut low, mut high, mut interior) = (Vec::new(), Vec::new(), Vec::new());
                for (range, dim) in axes.iter().zip(dims) {
                    let (lo, hi, mid) = match (*range, dim.as_fixed()) {
                        (AxisSlice::Full, _) | (_, None) => (0, 0, 0),
                        (AxisSlice::Range { start, end, step }, Some(n)) => {
                            let taken = range.len(n);
                            let last = if taken == 0 {
                                start
                            } else {
                                start + (taken - 1) * step + 1
                            };
                            let _ = end;
                            (start, n - last, step - 1)
                        }
                    };
                    low.push(lo);
                    high.push(hi);
                    interior.push(mid);
                }
                out.push((args[0], b.pad(g, low, high, interior)?));
            }
        }
        Op::Pad { low, interior, .. } => {
            // dx = the elements of g that came from x: a strided slice.
            if active(0) {
                let dims = s.ty(args[0]).shape.dims();
                let axes = dims
                    .iter()
                    .enumerate()
                    .map(|(a, d)| match d.as_fixed() {
                        None => AxisSlice::Full,
                        Some(n) => {
                            // Saturating: a step past the end is never taken (n = 1).
                            let step = interior[a].saturating_add(1);
                            let end = if n == 0 {
                                low[a]
                            } else {
                                low[a] + (n - 1) * step + 1
                            };
                            AxisSlice::Range {
                                start: low[a],
                                end,
                                step,
                            }
                        }
                    })
                    .collect();
                out.push((args[0], b.slice(g, axes)?));
            }
        }
        Op::Concat { axis } => {
            let mut offset = 0;
            for (i, &arg) in args.iter().enumerate() {
                let dims = s.ty(arg).shape.dims();
                let width = dims[*axis].as_fixed();
                if active(i) {
                    let piece = if args.len() == 1 {
                        g
                    } else {
                        let width = width.expect("concat of several operands has fixed widths");
                        let axes = (0..dims.len())
                            .map(|a| {
                                if a == *axis {
                                    AxisSlice::Range {
                                        start: offset,
                                        end: offset + width,
                                        step: 1,
                                    }
                                } else {
                                    AxisSlice::Full
                                }
                            })
                            .collect();
                        b.slice(g, axes)?
                    };
                    out.push((arg, piece));
                }
                offset += width.unwrap_or(0);
            }
        }
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => {
            if active(0) {
                let dx = reduce(b, s.ty(args[0]), *op, axes, *keep_dims, x(0), y(0), g)?;
                out.push((args[0], dx));
            }
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => matmul(s, b, inst, g, [*transpose_a, *transpose_b], &mut out)?,
        Op::MatMulAcc {
            transpose_a,
            transpose_b,
            scale,
        } => {
            // Y = C + k·op(A) op(B): dC = g, and the product's rule with k·g.
            if active(2) {
                out.push((args[2], g));
            }
            if active(0) || active(1) {
                let k = b.scalar(s.ty(args[2]).dtype, scale.0)?;
                let k = b.broadcast_to(k, &s.ty(args[2]).shape)?;
                let scaled = b.mul(g, k)?;
                matmul(s, b, inst, scaled, [*transpose_a, *transpose_b], &mut out)?;
            }
        }
        Op::Gather { axis } => {
            if active(0) {
                let shape = s.ty(args[0]).shape.clone();
                out.push((args[0], b.scatter_add(g, x(1), *axis, shape)?));
            }
        }
        Op::ScatterAdd { axis, .. } => {
            if active(0) {
                out.push((args[0], b.gather(g, x(1), *axis)?));
            }
        }
        // The slice written comes from `value`; the rest of the result from `array`.
        Op::UpdateSlice { axis } => {
            if active(0) {
                let hole = zeros(b, s.ty(args[1]))?;
                out.push((args[0], b.update_slice(g, hole, x(2), *axis)?));
            }
            if active(1) {
                out.push((args[1], b.gather(g, x(2), *axis)?));
            }
        }
        Op::Conv2d { kind, attrs } => {
            let (a, c) = (x(0), x(1));
            let spatial = |i: usize| spatial_of(s.ty(args[i]), i == 0 && attrs.channels_last);
            // ⟨g, conv(x, w)⟩ = ⟨x, input_grad(g, w)⟩ = ⟨w, filter_grad(x, g)⟩: each op's
            // adjoints are the other two.
            let (da, dc) = match kind {
                ConvKind::Forward => (
                    (ConvKind::InputGrad { input: spatial(0) }, g, c),
                    (ConvKind::FilterGrad { kernel: spatial(1) }, a, g),
                ),
                ConvKind::InputGrad { .. } => (
                    (ConvKind::Forward, g, c),
                    (ConvKind::FilterGrad { kernel: spatial(1) }, g, a),
                ),
                ConvKind::FilterGrad { .. } => (
                    (ConvKind::InputGrad { input: spatial(0) }, c, g),
                    (ConvKind::Forward, a, g),
                ),
            };
            if active(0) {
                out.push((args[0], b.conv(da.0, *attrs, da.1, da.2)?));
            }
            if active(1) {
                out.push((args[1], b.conv(dc.0, *attrs, dc.1, dc.2)?));
            }
        }
        Op::Pool2d { kind, attrs } => match kind {
            PoolKind::Max if active(0) => {
                out.push((args[0], b.pool(PoolKind::MaxGrad, *attrs, &[x(0), g])?));
            }
            PoolKind::Avg if active(0) => {
                let input = spatial_of(s.ty(args[0]), attrs.channels_last);
                out.push((args[0], b.pool(PoolKind::AvgGrad { input }, *attrs, &[g])?));
            }
            PoolKind::AvgGrad { .. } if active(0) => {
                out.push((args[0], b.pool(PoolKind::Avg, *attrs, &[g])?));
            }
            // Routing by the arg-max is piecewise constant in `x`; the gradient with respect
            // to the routed values (second order) has no op yet.
            PoolKind::MaxGrad if active(1) => return Err(no_rule()),
            _ => {}
        },
        // Ops whose results are integers, booleans or independent of their operands.
        Op::Compare(_)
        | Op::ArgReduce { .. }
        | Op::OneHot { .. }
        | Op::Const { .. }
        | Op::Iota { .. }
        | Op::Random { .. }
        | Op::Load { .. }
        | Op::Store { .. } => {}
        // `cond` and `while` are handled by the sweep (their gradients have regions of their
        // own); `call` above.
        // A broadcast's or a message's adjoint flows back to another rank: no local rule.
        kiln_ir::opaque_op!() => return Err(no_rule()),
    }
    Ok(out)
}

/// The spatial size `(H, W)` of an NCHW type (fixed: the type rules require it).
/// The height and width of an activation (`channels_last`) or of weights.
fn spatial_of(ty: &Type, channels_last: bool) -> [usize; 2] {
    let d = ty.shape.dims();
    let fixed = |i: usize| d.get(i).and_then(Dim::as_fixed).unwrap_or(0);
    kiln_ir::spatial_axes(channels_last).map(fixed)
}

/// A custom op's gradient comes from the op's own backward, which the runtime registers as
/// `<name>.grad`: it takes the inputs, the outputs and the outputs' adjoints (zeros where a
/// result has none) and returns one gradient per input.
fn call(
    s: &Sweep<'_>,
    b: &mut FunctionBuilder,
    inst: Inst,
    callee: &str,
    grads: &[Option<Value>],
) -> Result<Contributions, AutodiffError> {
    let data = s.src.inst(inst);
    let mut args: Vec<Value> = data.args.iter().map(|&a| s.fwd(a)).collect();
    args.extend(data.results.iter().map(|&r| s.fwd(r)));
    for (&r, g) in data.results.iter().zip(grads) {
        args.push(match g {
            Some(g) => *g,
            None => zeros(b, s.ty(r))?,
        });
    }
    let input_types = data.args.iter().map(|&a| s.ty(a).clone()).collect();
    let input_grads = b.call(&format!("{callee}.grad"), &args, input_types)?;
    Ok(data
        .args
        .iter()
        .zip(input_grads)
        .filter(|(a, _)| s.is_active(**a) && s.ty(**a).dtype.is_float())
        .map(|(&a, g)| (a, g))
        .collect())
}

/// `y_r = Σ_q x_q` on every rank r, so `∂L/∂x_q = Σ_r g_r`: the adjoints all-reduced the same
/// way (a mean's `1/n` applies to both). One op for every adjoint, as every rank must agree.
fn all_reduce(
    s: &Sweep<'_>,
    b: &mut FunctionBuilder,
    inst: Inst,
    op: AllReduceOp,
    bf16: bool,
    grads: &[Option<Value>],
) -> Result<Contributions, AutodiffError> {
    let data = s.src.inst(inst);
    let flowing: Vec<(Value, Value)> = (data.args.iter().zip(grads))
        .filter_map(|(&a, g)| Some((a, (*g)?)))
        .filter(|(a, _)| s.is_active(*a))
        .collect();
    if flowing.is_empty() {
        return Ok(Vec::new());
    }
    let adjoints: Vec<Value> = flowing.iter().map(|&(_, g)| g).collect();
    let reduced = b.all_reduce_on_wire(op, &adjoints, bf16)?;
    Ok(flowing.iter().map(|&(a, _)| a).zip(reduced).collect())
}

fn zeros_like(b: &mut FunctionBuilder, v: Value) -> Result<Value, BuildError> {
    let ty = b.value_type(v).clone();
    zeros(b, &ty)
}

/// `c` as a scalar constant of `x`'s dtype, broadcast by the builder where it is used.
fn scalar(b: &mut FunctionBuilder, like: Value, c: f64) -> Result<Value, BuildError> {
    let dtype = b.value_type(like).dtype;
    b.scalar(dtype, c)
}

fn unary(
    b: &mut FunctionBuilder,
    op: UnaryOp,
    x: Value,
    y: Value,
    g: Value,
) -> Result<Value, BuildError> {
    Ok(match op {
        UnaryOp::Neg => b.neg(g)?,
        // d|x| = sign(x)
        UnaryOp::Abs => {
            let sign = b.unary(UnaryOp::Sign, x)?;
            b.mul(g, sign)?
        }
        // Piecewise constant: zero almost everywhere.
        UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => zeros_like(b, x)?,
        // The identity gradients do not flow through (JAX's `stop_gradient`): its result is
        // never active (`activity`); a loop or branch body that yields it still gives it an
        // adjoint, which stops here.
        UnaryOp::StopGradient => zeros_like(b, x)?,
        // d relu = [x > 0] = [y > 0]: reading the output, which the next layer keeps anyway,
        // lets the input die after the forward pass (one activation fewer kept and written).
        UnaryOp::Relu => {
            let zero = scalar(b, y, 0.0)?;
            let positive = b.compare(CompareOp::Gt, y, zero)?;
            let zeros_g = zeros_like(b, g)?;
            b.select(positive, g, zeros_g)?
        }
        // d exp = y
        UnaryOp::Exp => b.mul(g, y)?,
        // d log = 1/x
        UnaryOp::Log => b.div(g, x)?,
        // d sqrt = 1 / (2 y)
        UnaryOp::Sqrt => {
            let two = scalar(b, y, 2.0)?;
            let twice = b.mul(y, two)?;
            b.div(g, twice)?
        }
        // d x^(-1/2) = -y³/2
        UnaryOp::Rsqrt => {
            let y2 = b.mul(y, y)?;
            let y3 = b.mul(y2, y)?;
            let minus_half = scalar(b, y, -0.5)?;
            let dy = b.mul(y3, minus_half)?;
            b.mul(g, dy)?
        }
        // d 1/x = -y²
        UnaryOp::Recip => {
            let y2 = b.mul(y, y)?;
            let gy2 = b.mul(g, y2)?;
            b.neg(gy2)?
        }
        // d tanh = 1 - y²
        UnaryOp::Tanh => {
            let y2 = b.mul(y, y)?;
            let one = scalar(b, y, 1.0)?;
            let dy = b.sub(one, y2)?;
            b.mul(g, dy)?
        }
        // d sigmoid = y (1 - y)
        UnaryOp::Sigmoid => {
            let one = scalar(b, y, 1.0)?;
            let rest = b.sub(one, y)?;
            let dy = b.mul(y, rest)?;
            b.mul(g, dy)?
        }
        // d softplus = sigmoid(x)
        UnaryOp::Softplus => {
            let s = b.sigmoid(x)?;
            b.mul(g, s)?
        }
        // d erf = 2/√π · exp(-x²)
        UnaryOp::Erf => {
            let x2 = b.mul(x, x)?;
            let neg = b.neg(x2)?;
            let e = b.exp(neg)?;
            let c = scalar(b, x, std::f64::consts::FRAC_2_SQRT_PI)?;
            let dy = b.mul(e, c)?;
            b.mul(g, dy)?
        }
        UnaryOp::Sin => {
            let c = b.unary(UnaryOp::Cos, x)?;
            b.mul(g, c)?
        }
        UnaryOp::Cos => {
            let sn = b.unary(UnaryOp::Sin, x)?;
            let gs = b.mul(g, sn)?;
            b.neg(gs)?
        }
        UnaryOp::Not => unreachable!("bool values are never active"),
    })
}

type Pair = (Option<Value>, Option<Value>);

fn binary(
    b: &mut FunctionBuilder,
    op: BinaryOp,
    x: Value,
    z: Value,
    y: Value,
    g: Value,
    (want_x, want_z): (bool, bool),
) -> Result<Pair, BuildError> {
    // Emits `build` only when that operand wants a gradient.
    let when = |want: bool,
                b: &mut FunctionBuilder,
                build: &dyn Fn(&mut FunctionBuilder) -> Result<Value, BuildError>|
     -> Result<Option<Value>, BuildError> {
        if want { build(b).map(Some) } else { Ok(None) }
    };
    Ok(match op {
        BinaryOp::Add => (want_x.then_some(g), want_z.then_some(g)),
        BinaryOp::Sub => (want_x.then_some(g), when(want_z, b, &|b| b.neg(g))?),
        BinaryOp::Mul => (
            when(want_x, b, &|b| b.mul(g, z))?,
            when(want_z, b, &|b| b.mul(g, x))?,
        ),
        // d(x/z) = (1/z, -y/z)
        BinaryOp::Div => {
            let gx = when(want_x, b, &|b| b.div(g, z))?;
            let gz = if want_z {
                let gy = b.mul(g, y)?;
                let q = b.div(gy, z)?;
                Some(b.neg(q)?)
            } else {
                None
            };
            (gx, gz)
        }
        // The larger operand takes the gradient; a tie splits it in halves (as JAX does).
        BinaryOp::Max | BinaryOp::Min => {
            let wins = if op == BinaryOp::Max {
                CompareOp::Gt
            } else {
                CompareOp::Lt
            };
            let x_wins = b.compare(wins, x, z)?;
            let tie = b.compare(CompareOp::Eq, x, z)?;
            let half = scalar(b, g, 0.5)?;
            let half_g = b.mul(g, half)?;
            let zero = zeros_like(b, g)?;
            let tied_x = b.select(tie, half_g, zero)?;
            let tied_z = b.select(tie, half_g, g)?;
            let gx = when(want_x, b, &|b| b.select(x_wins, g, tied_x))?;
            let gz = when(want_z, b, &|b| b.select(x_wins, zero, tied_z))?;
            (gx, gz)
        }
        // d x^z = (z x^(z-1), y log x), the second taken as 0 where x <= 0.
        BinaryOp::Pow => {
            let gx = if want_x {
                let one = scalar(b, z, 1.0)?;
                let zm1 = b.sub(z, one)?;
                let p = b.binary(BinaryOp::Pow, x, zm1)?;
                let d = b.mul(z, p)?;
                Some(b.mul(g, d)?)
            } else {
                None
            };
            let gz = if want_z {
                let zero = scalar(b, x, 0.0)?;
                let positive = b.compare(CompareOp::Gt, x, zero)?;
                let one = scalar(b, x, 1.0)?;
                let safe = b.select(positive, x, one)?;
                let log = b.log(safe)?;
                let d = b.mul(y, log)?;
                let gd = b.mul(g, d)?;
                let zeros_g = zeros_like(b, g)?;
                Some(b.select(positive, gd, zeros_g)?)
            } else {
                None
            };
            (gx, gz)
        }
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => (None, None),
    })
}

/// Sums `g` over the dimensions that broadcasting added or stretched, back to `shape`.
pub(super) fn unbroadcast(
    b: &mut FunctionBuilder,
    g: Value,
    shape: &Shape,
) -> Result<Value, BuildError> {
    let g_shape = b.value_type(g).shape.clone();
    if g_shape == *shape {
        return Ok(g);
    }
    let offset = g_shape.rank() - shape.rank();
    let axes: Vec<usize> = (0..g_shape.rank())
        .filter(|&a| a < offset || (shape.0[a - offset].is_one() && !g_shape.0[a].is_one()))
        .collect();
    let summed = if axes.is_empty() {
        g
    } else {
        b.reduce(ReduceOp::Sum, g, axes, true)?
    };
    b.reshape(summed, shape.clone())
}

/// The gradient of `w` in `[..., M, K] @ w` (or `@ wᵀ`) when `w` is 2-D, shared by the batch,
/// and the shapes are fixed: the batch's contributions summed are one product of the stacked
/// rows, `[B·M, K]ᵀ · [B·M, N]`, where a batch of products and a sum over it would write `B`
/// weight-sized matrices (a transformer's dense layers: 16 of `[1024, 256]`).
fn stacked_weight_gradient(
    b: &mut FunctionBuilder,
    [a_ty, w_ty]: [&Type; 2],
    [a, g]: [Value; 2],
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Option<Value>, BuildError> {
    if transpose_a || w_ty.rank() != 2 || a_ty.rank() <= 2 {
        return Ok(None);
    }
    let g_ty = b.value_type(g).clone();
    let (Some(a_dims), Some(g_dims)) = (a_ty.shape.as_fixed(), g_ty.shape.as_fixed()) else {
        return Ok(None);
    };
    let rows: usize = a_dims[..a_dims.len() - 1].iter().product();
    let [k, n] = [a_dims[a_dims.len() - 1], g_dims[g_dims.len() - 1]];
    let a2 = b.reshape(a, Shape::fixed(&[rows, k]))?;
    let g2 = b.reshape(g, Shape::fixed(&[rows, n]))?;
    Ok(Some(match transpose_b {
        false => b.matmul_t(a2, g2, true, false)?,
        true => b.matmul_t(g2, a2, true, false)?,
    }))
}

/// The gradient of a reduction over `axes` of `x` (type `x_ty`) giving `y`.
#[allow(clippy::too_many_arguments)]
fn reduce(
    b: &mut FunctionBuilder,
    x_ty: &Type,
    op: ReduceOp,
    axes: &[usize],
    keep_dims: bool,
    x: Value,
    y: Value,
    g: Value,
) -> Result<Value, BuildError> {
    // Shapes with the reduced axes kept as 1, so they broadcast against x.
    let kept = Shape(
        x_ty.shape
            .dims()
            .iter()
            .enumerate()
            .map(|(a, d)| {
                if axes.contains(&a) {
                    Dim::Fixed(1)
                } else {
                    d.clone()
                }
            })
            .collect(),
    );
    let g_kept = if keep_dims {
        g
    } else {
        b.reshape(g, kept.clone())?
    };
    let spread = b.broadcast_to(g_kept, &x_ty.shape)?;
    Ok(match op {
        ReduceOp::Sum => spread,
        ReduceOp::Mean => {
            let count = element_count(b, x_ty, axes)?;
            b.div(spread, count)?
        }
        // The extreme elements share the gradient equally (as JAX does).
        ReduceOp::Max | ReduceOp::Min => {
            let y_kept = if keep_dims { y } else { b.reshape(y, kept)? };
            let y_spread = b.broadcast_to(y_kept, &x_ty.shape)?;
            let hit = b.compare(CompareOp::Eq, x, y_spread)?;
            let hit_f = b.cast(hit, x_ty.dtype)?;
            let hits = b.reduce(ReduceOp::Sum, hit_f, axes.to_vec(), true)?;
            let share = b.div(g_kept, hits)?;
            let share_spread = b.broadcast_to(share, &x_ty.shape)?;
            b.mul(share_spread, hit_f)?
        }
    })
}

/// The number of elements a reduction over `axes` combines, as a scalar of `ty`'s dtype:
/// a constant for fixed sizes, counted at run time for symbolic ones.
fn element_count(b: &mut FunctionBuilder, ty: &Type, axes: &[usize]) -> Result<Value, BuildError> {
    let dims: Vec<Dim> = axes.iter().map(|&a| ty.shape.0[a].clone()).collect();
    let fixed: Option<usize> = dims.iter().map(Dim::as_fixed).product();
    match fixed {
        Some(n) => b.scalar(ty.dtype, n as f64),
        None => {
            let ones = b.constant(
                kiln_ir::Literal::scalar(ty.dtype, 1.0),
                Type::new(ty.dtype, Shape(dims.clone())),
            )?;
            b.reduce(ReduceOp::Sum, ones, (0..dims.len()).collect(), false)
        }
    }
}

/// The product `C = op(A) op(B)`'s contributions for the adjoint `g` of `C`.
fn matmul(
    s: &Sweep<'_>,
    b: &mut FunctionBuilder,
    inst: Inst,
    g: Value,
    [transpose_a, transpose_b]: [bool; 2],
    out: &mut Contributions,
) -> Result<(), AutodiffError> {
    let args = &s.src.inst(inst).args;
    let x = |i: usize| s.fwd(args[i]);
    let active = |i: usize| s.wants_gradient(inst, i);
    // C = op(A) op(B): d op(A) = g op(B)ᵀ and d op(B) = op(A)ᵀ g, each transposed back
    // when the operand was transposed, then summed over broadcast batch dimensions.
    let (a, bm) = (x(0), x(1));
    if active(0) {
        let da = match (transpose_a, transpose_b) {
            (false, false) => b.matmul_t(g, bm, false, true)?,
            (false, true) => b.matmul_t(g, bm, false, false)?,
            (true, false) => b.matmul_t(bm, g, false, true)?,
            (true, true) => b.matmul_t(bm, g, true, true)?,
        };
        out.push((args[0], unbroadcast(b, da, &s.ty(args[0]).shape)?));
    }
    if active(1) {
        let (a_ty, w_ty) = (s.ty(args[0]), s.ty(args[1]));
        let stacked = stacked_weight_gradient(b, [a_ty, w_ty], [a, g], transpose_a, transpose_b)?;
        let db = match stacked {
            Some(db) => db,
            None => {
                let db = match (transpose_a, transpose_b) {
                    (false, false) => b.matmul_t(a, g, true, false)?,
                    (false, true) => b.matmul_t(g, a, true, false)?,
                    (true, false) => b.matmul_t(a, g, false, false)?,
                    (true, true) => b.matmul_t(g, a, true, true)?,
                };
                unbroadcast(b, db, &w_ty.shape)?
            }
        };
        out.push((args[1], db));
    }
    Ok(())
}
