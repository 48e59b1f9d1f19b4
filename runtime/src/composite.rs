//! Composite ops, each written once over the IR builder: activations, softmax and its log,
//! the losses, layer normalisation, accuracy.
//!
//! Static layers ([`crate::layers`]) call them on a [`crate::Program`] (which dereferences to
//! the builder); eager tensors and layers ([`crate::eager`]) call them through `apply`, so
//! eager, traced and static code build the same IR. Inputs they cannot take (a scalar where a
//! batch is needed, a class count that is not fixed) are errors that name the composite and
//! the type, with the caller's line.

use kiln_ir::{
    ArgOp, BinaryOp, BuildError, BuildResult, CompareOp, Conv2dAttrs, DType, Dim, FunctionBuilder,
    Loc, ReduceOp, Shape, Type, TypeError, Value,
};

/// An elementwise activation applied after a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x`.
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `log(1 + exp(x))`.
    Softplus,
    /// `x · Φ(x)` with the exact normal CDF, `Φ(x) = (1 + erf(x/√2)) / 2`.
    Gelu,
}

/// `act(x)`.
#[track_caller]
pub fn activation(b: &mut FunctionBuilder, x: Value, act: Activation) -> BuildResult<Value> {
    match act {
        Activation::Identity => Ok(x),
        Activation::Relu => b.relu(x),
        Activation::Tanh => b.tanh(x),
        Activation::Sigmoid => b.sigmoid(x),
        Activation::Softplus => b.softplus(x),
        Activation::Gelu => gelu(b, x),
    }
}

/// `x · (1 + erf(x/√2)) / 2`: GELU with the exact normal CDF.
#[track_caller]
pub fn gelu(b: &mut FunctionBuilder, x: Value) -> BuildResult<Value> {
    let dtype = b.value_type(x).dtype;
    let inv_sqrt2 = b.scalar(dtype, std::f64::consts::FRAC_1_SQRT_2)?;
    let half = b.scalar(dtype, 0.5)?;
    let one = b.scalar(dtype, 1.0)?;
    let z = b.mul(x, inv_sqrt2)?;
    let e = b.erf(z)?;
    let cdf = b.add(one, e)?;
    let cdf = b.mul(cdf, half)?;
    b.mul(x, cdf)
}

/// `exp(x - max) / sum(exp(x - max))` along `axis`.
#[track_caller]
pub fn softmax(b: &mut FunctionBuilder, x: Value, axis: usize) -> BuildResult<Value> {
    let (_, e, s) = shifted_exp_sum(b, "softmax", x, axis)?;
    b.div(e, s)
}

/// `log(softmax(x))` along `axis`, computed stably as `x - max - log(sum(exp(x - max)))`.
#[track_caller]
pub fn log_softmax(b: &mut FunctionBuilder, x: Value, axis: usize) -> BuildResult<Value> {
    let (z, _, s) = shifted_exp_sum(b, "log_softmax", x, axis)?;
    let lse = b.log(s)?;
    b.sub(z, lse)
}

/// `z = x - max`, `exp(z)` and its sum along `axis` (kept as an axis of size 1).
#[track_caller]
fn shifted_exp_sum(
    b: &mut FunctionBuilder,
    composite: &'static str,
    x: Value,
    axis: usize,
) -> BuildResult<(Value, Value, Value)> {
    let ty = b.value_type(x);
    if axis >= ty.rank() {
        let message = format!("axis {axis} is out of range for the input {ty}");
        return Err(error(composite, message));
    }
    let m = b.reduce(ReduceOp::Max, x, vec![axis], true)?;
    let z = b.sub(x, m)?;
    let e = b.exp(z)?;
    let s = b.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    Ok((z, e, s))
}

/// Mean softmax cross-entropy of `logits` `[..., C]` against integer `labels` `[...]`; `C`
/// must be a fixed size.
#[track_caller]
pub fn softmax_cross_entropy(
    b: &mut FunctionBuilder,
    logits: Value,
    labels: Value,
) -> BuildResult<Value> {
    const NAME: &str = "softmax_cross_entropy";
    let ty = b.value_type(logits).clone();
    let last = last_axis(NAME, "logits", &ty)?;
    let classes = fixed_last_dim(NAME, "logits", &ty)?;
    let logp = log_softmax(b, logits, last)?;
    let onehot = b.one_hot(labels, classes, ty.dtype)?;
    let picked = b.mul(logp, onehot)?;
    let per_row = b.reduce(ReduceOp::Sum, picked, vec![last], false)?;
    let m = mean_all(b, per_row)?;
    b.neg(m)
}

/// Mean binary cross-entropy of `sigmoid(logits)` against `targets` in [0, 1], computed
/// stably as `max(x, 0) - x·z + log(1 + exp(-|x|))`.
#[track_caller]
pub fn sigmoid_cross_entropy(
    b: &mut FunctionBuilder,
    logits: Value,
    targets: Value,
) -> BuildResult<Value> {
    let dtype = b.value_type(logits).dtype;
    let zero = b.scalar(dtype, 0.0)?;
    let one = b.scalar(dtype, 1.0)?;
    let pos = b.binary(BinaryOp::Max, logits, zero)?;
    let xz = b.mul(logits, targets)?;
    let a = b.abs(logits)?;
    let na = b.neg(a)?;
    let e = b.exp(na)?;
    let e1 = b.add(one, e)?;
    let soft = b.log(e1)?;
    let l = b.sub(pos, xz)?;
    let l = b.add(l, soft)?;
    mean_all(b, l)
}

/// Mean squared error.
#[track_caller]
pub fn mse(b: &mut FunctionBuilder, prediction: Value, target: Value) -> BuildResult<Value> {
    let d = b.sub(prediction, target)?;
    let d2 = b.mul(d, d)?;
    mean_all(b, d2)
}

/// The mean over every axis: a scalar.
#[track_caller]
pub fn mean_all(b: &mut FunctionBuilder, x: Value) -> BuildResult<Value> {
    let axes = (0..b.value_type(x).rank()).collect();
    b.reduce(ReduceOp::Mean, x, axes, false)
}

/// The fraction of rows of `logits` whose arg-max equals the label, as an f32 scalar.
#[track_caller]
pub fn accuracy(b: &mut FunctionBuilder, logits: Value, labels: Value) -> BuildResult<Value> {
    let ty = b.value_type(logits).clone();
    let last = last_axis("accuracy", "logits", &ty)?;
    let pred = b.arg_reduce(ArgOp::ArgMax, logits, last, false)?;
    let labels = b.cast(labels, DType::I64)?;
    let hit = b.compare(CompareOp::Eq, pred, labels)?;
    let hit = b.cast(hit, DType::F32)?;
    mean_all(b, hit)
}

/// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) · gamma + beta`.
#[track_caller]
pub fn layer_norm(
    b: &mut FunctionBuilder,
    x: Value,
    gamma: Value,
    beta: Value,
    eps: f64,
) -> BuildResult<Value> {
    let ty = b.value_type(x).clone();
    let last = last_axis("layer_norm", "input", &ty)?;
    let mu = b.reduce(ReduceOp::Mean, x, vec![last], true)?;
    let d = b.sub(x, mu)?;
    let d2 = b.mul(d, d)?;
    let var = b.reduce(ReduceOp::Mean, d2, vec![last], true)?;
    let eps = b.scalar(ty.dtype, eps)?;
    let ve = b.add(var, eps)?;
    let inv = b.rsqrt(ve)?;
    let xhat = b.mul(d, inv)?;
    let scaled = b.mul(xhat, gamma)?;
    b.add(scaled, beta)
}

/// `conv2d(x, w) + bias`, the bias `[O]` broadcast over the batch and spatial axes.
#[track_caller]
pub fn conv2d_bias(
    b: &mut FunctionBuilder,
    x: Value,
    w: Value,
    bias: Value,
    attrs: Conv2dAttrs,
) -> BuildResult<Value> {
    let y = b.conv2d(x, w, attrs)?;
    let ty = b.value_type(bias).clone();
    let channels = fixed_last_dim("conv2d", "bias", &ty)?;
    let bias = b.reshape(bias, Shape::fixed(&[1, channels, 1, 1]))?;
    b.add(y, bias)
}

/// `[N, d1, d2, …]` → `[N, d1·d2·…]`: every axis but the first in one (fixed sizes).
#[track_caller]
pub fn flatten(b: &mut FunctionBuilder, x: Value) -> BuildResult<Value> {
    let ty = b.value_type(x).clone();
    let dims = ty.shape.dims();
    let rest: Option<usize> = dims.iter().skip(1).map(Dim::as_fixed).product();
    match (dims.first(), rest) {
        (Some(n), Some(rest)) if dims.len() >= 2 => {
            b.reshape(x, Shape(vec![n.clone(), Dim::Fixed(rest)]))
        }
        _ => Err(error(
            "flatten",
            format!("the input needs a batch axis and fixed sizes after it, found {ty}"),
        )),
    }
}

/// The mean over the spatial axes of NCHW `x`: `[N, C]`.
#[track_caller]
pub fn global_avg_pool(b: &mut FunctionBuilder, x: Value) -> BuildResult<Value> {
    let ty = b.value_type(x);
    if ty.rank() != 4 {
        let message = format!("the input must be NCHW (rank 4), found {ty}");
        return Err(error("global_avg_pool", message));
    }
    b.reduce(ReduceOp::Mean, x, vec![2, 3], false)
}

/// The index of `ty`'s last axis; an error naming `composite` for a scalar.
#[track_caller]
pub fn last_axis(composite: &'static str, what: &str, ty: &Type) -> BuildResult<usize> {
    ty.rank().checked_sub(1).ok_or_else(|| {
        error(
            composite,
            format!("the {what} must have an axis, found {ty}"),
        )
    })
}

/// The size of `ty`'s last axis, which must be fixed; an error naming `composite` otherwise.
#[track_caller]
pub fn fixed_last_dim(composite: &'static str, what: &str, ty: &Type) -> BuildResult<usize> {
    match ty.shape.dims().last().map(|d| d.as_fixed()) {
        Some(Some(n)) if n > 0 => Ok(n),
        Some(Some(_)) => Err(error(
            composite,
            format!("the last dimension of the {what} must not be empty, found {ty}"),
        )),
        Some(None) => Err(error(
            composite,
            format!("the last dimension of the {what} must be a fixed size, found {ty}"),
        )),
        None => Err(error(
            composite,
            format!("the {what} must have an axis, found {ty}"),
        )),
    }
}

/// A build error raised by `composite`, at the caller's line.
#[track_caller]
pub fn error(composite: &'static str, message: String) -> BuildError {
    BuildError {
        error: TypeError {
            op: composite,
            message,
        },
        loc: Loc::caller(),
    }
}
