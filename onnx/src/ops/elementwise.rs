//! Elementwise ops: ONNX's multidirectional broadcasting is the builder's NumPy broadcasting.

use crate::context::{Converted, Ctx, Fail, unsupported};
use crate::tensor;
use kiln_ir::{BinaryOp, CompareOp, DType, UnaryOp, Value};
use kiln_runtime::composite::gelu as gelu_exact;

/// `op(x)`.
pub(super) fn unary(c: &mut Ctx, op: UnaryOp) -> Converted {
    let x = c.input(0)?;
    Ok(vec![c.b.unary(op, x)?])
}

/// `op(a, b)`.
pub(super) fn binary(c: &mut Ctx, op: BinaryOp) -> Converted {
    refuse_legacy_broadcast(c)?;
    let (a, b) = (c.input(0)?, c.input(1)?);
    Ok(vec![c.b.binary(op, a, b)?])
}

/// Before opset 7, `broadcast=1` with `axis` aligned the second operand from that axis, not
/// from the right: refused rather than broadcast NumPy's way.
fn refuse_legacy_broadcast(c: &Ctx) -> Result<(), Fail> {
    match c.node.opset < 7 && c.node.int("broadcast", 0)? != 0 {
        true => unsupported("the legacy broadcast attribute (opset below 7)"),
        false => Ok(()),
    }
}

/// The comparison `op(a, b)`.
pub(super) fn compare(c: &mut Ctx, op: CompareOp) -> Converted {
    refuse_legacy_broadcast(c)?;
    let (a, b) = (c.input(0)?, c.input(1)?);
    Ok(vec![c.b.compare(op, a, b)?])
}

/// `Max`, `Min`, `Sum`: `op` over every input.
pub(super) fn variadic(c: &mut Ctx, op: BinaryOp) -> Converted {
    let mut acc = c.input(0)?;
    for i in 1..c.count() {
        let x = c.input(i)?;
        acc = c.b.binary(op, acc, x)?;
    }
    Ok(vec![acc])
}

/// `Mean`: the sum of the inputs over their count.
pub(super) fn mean(c: &mut Ctx) -> Converted {
    let sum = variadic(c, BinaryOp::Add)?[0];
    let n = c.scalar(c.dtype(sum), c.count() as f64)?;
    Ok(vec![c.b.div(sum, n)?])
}

/// `Pow`: the exponent takes the base's dtype; integer powers are computed in f64.
pub(super) fn pow(c: &mut Ctx) -> Converted {
    let (base, exponent) = (c.input(0)?, c.input(1)?);
    let dtype = c.dtype(base);
    if dtype.is_float() {
        let exponent = c.b.cast(exponent, dtype)?;
        return Ok(vec![c.b.pow(base, exponent)?]);
    }
    let (fb, fe) = (c.b.cast(base, DType::F64)?, c.b.cast(exponent, DType::F64)?);
    let p = c.b.pow(fb, fe)?;
    Ok(vec![c.b.cast(p, dtype)?])
}

/// `Where(cond, x, y)`.
pub(super) fn where_(c: &mut Ctx) -> Converted {
    let (cond, x, y) = (c.input(0)?, c.input(1)?, c.input(2)?);
    Ok(vec![c.b.select(cond, x, y)?])
}

/// `Cast(to)`.
pub(super) fn cast(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let to = c.node.int_opt("to")?.ok_or("attribute to is required")?;
    let to = tensor::dtype(to as i32).map_err(Fail::Unsupported)?;
    Ok(vec![c.b.cast(x, to)?])
}

/// `CastLike(x, like)`.
pub(super) fn cast_like(c: &mut Ctx) -> Converted {
    let (x, like) = (c.input(0)?, c.input(1)?);
    let to = c.dtype(like);
    Ok(vec![c.b.cast(x, to)?])
}

/// `Identity`; Kiln's `stop_gradient` where the exporter marked it so.
pub(super) fn identity(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    match c.node.proto.doc_string.as_deref() {
        Some(crate::STOP_GRADIENT_DOC) => Ok(vec![c.b.unary(UnaryOp::StopGradient, x)?]),
        _ => Ok(vec![x]),
    }
}

/// `Dropout` at inference: the input, and a mask of ones when asked for.
pub(super) fn dropout(c: &mut Ctx) -> Converted {
    if c.node.opset < 7 {
        c.node
            .refuse_int("is_test", 1)
            .or_else(|_| unsupported("training-mode Dropout"))?;
    }
    if let Some(training) = c.known_scalar(2, "training_mode")?
        && training != 0.0
    {
        return unsupported("training-mode Dropout");
    }
    let x = c.input(0)?;
    let t = c.ty(x);
    let yes = c.scalar(DType::Bool, 1.0)?;
    let mask = c.b.broadcast_to(yes, &t.shape)?;
    Ok(vec![x, mask])
}

/// `Clip`: bounds as attributes (before opset 11) or optional inputs.
pub(super) fn clip(c: &mut Ctx) -> Converted {
    let mut x = c.input(0)?;
    let dtype = c.dtype(x);
    let (low, high) = match c.node.opset < 11 {
        true => {
            let low = c.node.float("min", f32::NEG_INFINITY)?;
            let high = c.node.float("max", f32::INFINITY)?;
            (
                Some(c.scalar(dtype, low as f64)?),
                Some(c.scalar(dtype, high as f64)?),
            )
        }
        false => (clip_bound(c, 1, "min")?, clip_bound(c, 2, "max")?),
    };
    if let Some(low) = low {
        x = c.b.maximum(x, low)?;
    }
    if let Some(high) = high {
        x = c.b.minimum(x, high)?;
    }
    Ok(vec![x])
}

/// Clip's optional bound `i`: a scalar (a one-element tensor is taken as one). A larger tensor
/// would clip elementwise and could broadcast `x` to a larger shape.
fn clip_bound(c: &mut Ctx, i: usize, what: &str) -> Result<Option<Value>, Fail> {
    let Some(v) = c.optional(i)? else {
        return Ok(None);
    };
    let shape = c.shape(v, what)?;
    match shape.iter().product::<usize>() {
        1 if shape.is_empty() => Ok(Some(v)),
        1 => Ok(Some(c.b.reshape(v, kiln_ir::Shape::scalar())?)),
        _ => Err(Fail::Invalid(format!(
            "{what} {shape:?} should be a scalar"
        ))),
    }
}

/// `x < 0 ? negative : x`.
fn piecewise(c: &mut Ctx, x: Value, negative: Value, strict: bool) -> Result<Value, Fail> {
    let zero = c.scalar(c.dtype(x), 0.0)?;
    let op = if strict { CompareOp::Lt } else { CompareOp::Le };
    let is_negative = c.b.compare(op, x, zero)?;
    Ok(c.b.select(is_negative, negative, x)?)
}

/// `alpha · (exp(x) − 1)`.
fn exp_minus_one(c: &mut Ctx, x: Value, alpha: f64) -> Result<Value, Fail> {
    let dtype = c.dtype(x);
    let e = c.b.exp(x)?;
    let one = c.scalar(dtype, 1.0)?;
    let em1 = c.b.sub(e, one)?;
    let alpha = c.scalar(dtype, alpha)?;
    Ok(c.b.mul(alpha, em1)?)
}

/// `LeakyRelu(alpha)`.
pub(super) fn leaky_relu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let alpha = c.scalar(c.dtype(x), c.node.float("alpha", 0.01)? as f64)?;
    let scaled = c.b.mul(x, alpha)?;
    Ok(vec![piecewise(c, x, scaled, true)?])
}

/// `PRelu(x, slope)`.
pub(super) fn prelu(c: &mut Ctx) -> Converted {
    let (x, slope) = (c.input(0)?, c.input(1)?);
    let scaled = c.b.mul(x, slope)?;
    let t = c.ty(scaled);
    let x = c.b.broadcast_to(x, &t.shape)?;
    Ok(vec![piecewise(c, x, scaled, true)?])
}

/// `Elu(alpha)`.
pub(super) fn elu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let negative = exp_minus_one(c, x, c.node.float("alpha", 1.0)? as f64)?;
    Ok(vec![piecewise(c, x, negative, true)?])
}

/// `Selu(alpha, gamma)`.
pub(super) fn selu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let alpha = c.node.float("alpha", 1.673_263_2)? as f64;
    let gamma = c.node.float("gamma", 1.050_701)? as f64;
    let negative = exp_minus_one(c, x, alpha)?;
    let y = piecewise(c, x, negative, false)?;
    let gamma = c.scalar(c.dtype(x), gamma)?;
    Ok(vec![c.b.mul(y, gamma)?])
}

/// `Celu(alpha)`: `max(0, x) + min(0, alpha · (exp(x / alpha) − 1))`.
pub(super) fn celu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    let alpha = c.node.float("alpha", 1.0)? as f64;
    let inv = c.scalar(dtype, 1.0 / alpha)?;
    let scaled = c.b.mul(x, inv)?;
    let negative = exp_minus_one(c, scaled, alpha)?;
    let zero = c.scalar(dtype, 0.0)?;
    let (pos, neg) = (c.b.maximum(x, zero)?, c.b.minimum(negative, zero)?);
    Ok(vec![c.b.add(pos, neg)?])
}

/// `clamp(alpha · x + beta, 0, 1)`.
fn hard_sigmoid_of(c: &mut Ctx, x: Value, alpha: f64, beta: f64) -> Result<Value, Fail> {
    let dtype = c.dtype(x);
    let (a, b0) = (c.scalar(dtype, alpha)?, c.scalar(dtype, beta)?);
    let ax = c.b.mul(x, a)?;
    let y = c.b.add(ax, b0)?;
    let (zero, one) = (c.scalar(dtype, 0.0)?, c.scalar(dtype, 1.0)?);
    let y = c.b.minimum(y, one)?;
    Ok(c.b.maximum(y, zero)?)
}

/// `HardSigmoid(alpha, beta)`.
pub(super) fn hard_sigmoid(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let (alpha, beta) = (c.node.float("alpha", 0.2)?, c.node.float("beta", 0.5)?);
    Ok(vec![hard_sigmoid_of(c, x, alpha as f64, beta as f64)?])
}

/// `HardSwish`: `x · HardSigmoid(x; 1/6, 1/2)`.
pub(super) fn hard_swish(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let gate = hard_sigmoid_of(c, x, 1.0 / 6.0, 0.5)?;
    Ok(vec![c.b.mul(x, gate)?])
}

/// `Softsign`: `x / (1 + |x|)`.
pub(super) fn softsign(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let one = c.scalar(c.dtype(x), 1.0)?;
    let a = c.b.abs(x)?;
    let d = c.b.add(one, a)?;
    Ok(vec![c.b.div(x, d)?])
}

/// `ThresholdedRelu(alpha)`: `x > alpha ? x : 0`.
pub(super) fn thresholded_relu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    let alpha = c.scalar(dtype, c.node.float("alpha", 1.0)? as f64)?;
    let above = c.b.gt(x, alpha)?;
    let zero = c.scalar(dtype, 0.0)?;
    Ok(vec![c.b.select(above, x, zero)?])
}

/// `Mish`: `x · tanh(softplus(x))`.
pub(super) fn mish(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let s = c.b.softplus(x)?;
    let t = c.b.tanh(s)?;
    Ok(vec![c.b.mul(x, t)?])
}

/// `Gelu(approximate)`: exact (erf) or tanh's approximation.
pub(super) fn gelu(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dtype = c.dtype(x);
    match c.node.string("approximate")?.as_deref() {
        None | Some("none") => Ok(vec![gelu_exact(c.b, x)?]),
        Some("tanh") => {
            // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
            let x3 = c.b.mul(x, x)?;
            let x3 = c.b.mul(x3, x)?;
            let k = c.scalar(dtype, 0.044715)?;
            let inner = c.b.mul(x3, k)?;
            let inner = c.b.add(x, inner)?;
            let s = c.scalar(dtype, (2.0 / std::f64::consts::PI).sqrt())?;
            let inner = c.b.mul(inner, s)?;
            let t = c.b.tanh(inner)?;
            let one = c.scalar(dtype, 1.0)?;
            let t = c.b.add(t, one)?;
            let half = c.scalar(dtype, 0.5)?;
            let hx = c.b.mul(x, half)?;
            Ok(vec![c.b.mul(hx, t)?])
        }
        Some(other) => Err(Fail::Invalid(format!(
            "approximate={other:?} is not none or tanh"
        ))),
    }
}
