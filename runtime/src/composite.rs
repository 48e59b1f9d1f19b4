//! Composite ops, each written once over the IR builder: activations, softmax and its log,
//! the losses, layer normalisation, accuracy.
//!
//! Static layers ([`crate::layers`]) call them on a [`crate::Program`] (which dereferences to
//! the builder); eager tensors and layers ([`crate::eager`]) call them through `apply`, so
//! eager, traced and static code build the same IR. Inputs they cannot take (a scalar where a
//! batch is needed, a class count that is not fixed) are errors that name the composite and
//! the type, with the caller's line.

use kiln_ir::{
    ArgOp, AxisSlice, BinaryOp, BuildError, BuildResult, CompareOp, Conv2dAttrs, DType, Dim,
    FunctionBuilder, Loc, ReduceOp, Shape, Type, TypeError, Value,
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

/// `z = x - max`, `exp(z)` and its sum along `axis` (kept as an axis of size 1). The maximum
/// is a constant shift that changes nothing but the range, so no gradient flows through it
/// (as JAX's and PyTorch's softmaxes): its adjoint would be zero up to rounding, at the cost
/// of comparisons and two more reductions in the backward pass.
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
    let m = b.stop_gradient(m)?;
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
    check_labels(NAME, &ty, b.value_type(labels))?;
    let logp = log_softmax(b, logits, last)?;
    let onehot = b.one_hot(labels, classes, ty.dtype)?;
    let picked = b.mul(logp, onehot)?;
    let per_row = b.reduce(ReduceOp::Sum, picked, vec![last], false)?;
    let m = mean_all(b, per_row)?;
    b.neg(m)
}

/// Checks that `labels` hold one integer class per row of `logits` (every axis but the
/// last): a loss that broadcast them instead would be silently wrong.
#[track_caller]
fn check_labels(composite: &'static str, logits: &Type, labels: &Type) -> BuildResult<()> {
    let rows = &logits.shape.dims()[..logits.rank().saturating_sub(1)];
    let integer = matches!(labels.dtype, DType::I32 | DType::I64);
    if integer && same_dims(rows, labels.shape.dims()) {
        return Ok(());
    }
    let want = Type::new(DType::I64, Shape(rows.to_vec()));
    Err(error(
        composite,
        format!("labels {labels} do not fit logits {logits}: one integer class per row ({want})"),
    ))
}

/// Whether two shapes can be the same: equal ranks, and equal sizes where both are fixed (a
/// symbolic size is checked when the program runs).
fn same_dims(a: &[Dim], b: &[Dim]) -> bool {
    a.len() == b.len()
        && (a.iter().zip(b)).all(|(x, y)| match (x.as_fixed(), y.as_fixed()) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        })
}

/// Checks that a loss's two operands have one shape (not shapes that broadcast: `[N, 1]`
/// against `[N]` would average an `[N, N]` table, silently).
#[track_caller]
fn check_same_shape(
    composite: &'static str,
    what: [&str; 2],
    a: &Type,
    b: &Type,
) -> BuildResult<()> {
    if same_dims(a.shape.dims(), b.shape.dims()) {
        return Ok(());
    }
    Err(error(
        composite,
        format!(
            "the {} {a} and the {} {b} must have one shape",
            what[0], what[1]
        ),
    ))
}

/// Mean binary cross-entropy of `sigmoid(logits)` against `targets` in [0, 1], computed
/// stably as `max(x, 0) - x·z + log(1 + exp(-|x|))`.
#[track_caller]
pub fn sigmoid_cross_entropy(
    b: &mut FunctionBuilder,
    logits: Value,
    targets: Value,
) -> BuildResult<Value> {
    let (lt, tt) = (b.value_type(logits), b.value_type(targets));
    check_same_shape("sigmoid_cross_entropy", ["logits", "targets"], lt, tt)?;
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
    let (pt, tt) = (b.value_type(prediction), b.value_type(target));
    check_same_shape("mse", ["prediction", "target"], pt, tt)?;
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
    check_labels("accuracy", b.value_type(logits), b.value_type(labels))?;
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

/// The axes batch normalisation reduces over: every axis but the channel axis (1).
#[track_caller]
fn batch_axes(b: &FunctionBuilder, x: Value) -> BuildResult<Vec<usize>> {
    let ty = b.value_type(x);
    if ty.rank() < 2 {
        let message = format!("the input needs a batch and a channel axis, found {ty}");
        return Err(error("batch_norm", message));
    }
    Ok((0..ty.rank()).filter(|&a| a != 1).collect())
}

/// `v` `[C]` shaped to broadcast against `x` `[N, C, …]`: `[1, C, 1, …]`.
#[track_caller]
fn per_channel(b: &mut FunctionBuilder, v: Value, x: Value) -> BuildResult<Value> {
    let rank = b.value_type(x).rank();
    let c = b.value_type(x).shape.dims()[1].clone();
    let mut dims = vec![Dim::Fixed(1); rank];
    dims[1] = c;
    b.reshape(v, Shape(dims))
}

/// The batch statistics of `x` `[N, C, …]` per channel: the mean, the biased variance (what
/// normalisation uses) and the unbiased one (what running averages keep, as PyTorch), `[C]`.
#[track_caller]
pub fn batch_moments(b: &mut FunctionBuilder, x: Value) -> BuildResult<[Value; 3]> {
    let axes = batch_axes(b, x)?;
    let mean = b.reduce(ReduceOp::Mean, x, axes.clone(), false)?;
    let centred = per_channel(b, mean, x)?;
    let d = b.sub(x, centred)?;
    let d2 = b.mul(d, d)?;
    let var = b.reduce(ReduceOp::Mean, d2, axes.clone(), false)?;
    let dtype = b.value_type(x).dtype;
    let one = b.scalar(dtype, 1.0)?;
    let ones = b.broadcast_to(one, &b.value_type(x).shape.clone())?;
    let count = b.reduce(ReduceOp::Sum, ones, axes, false)?;
    let count_less_one = b.sub(count, one)?;
    let scale = b.div(count, count_less_one)?;
    let unbiased = b.mul(var, scale)?;
    Ok([mean, var, unbiased])
}

/// `(x − mean) / √(var + eps) · gamma + beta` with per-channel `[C]` statistics and
/// parameters over `x` `[N, C, …]`.
#[track_caller]
pub fn batch_norm(
    b: &mut FunctionBuilder,
    x: Value,
    [mean, var]: [Value; 2],
    [gamma, beta]: [Value; 2],
    eps: f64,
) -> BuildResult<Value> {
    batch_axes(b, x)?;
    let dtype = b.value_type(x).dtype;
    let eps = b.scalar(dtype, eps)?;
    let ve = b.add(var, eps)?;
    let inv = b.rsqrt(ve)?;
    let scale = b.mul(gamma, inv)?;
    let scale = per_channel(b, scale, x)?;
    let mean = per_channel(b, mean, x)?;
    let beta = per_channel(b, beta, x)?;
    let d = b.sub(x, mean)?;
    let y = b.mul(d, scale)?;
    b.add(y, beta)
}

/// A running average's next value: `(1 − momentum)·running + momentum·batch`.
#[track_caller]
pub fn running_average(
    b: &mut FunctionBuilder,
    running: Value,
    batch: Value,
    momentum: f64,
) -> BuildResult<Value> {
    let dtype = b.value_type(running).dtype;
    let keep = b.scalar(dtype, 1.0 - momentum)?;
    let take = b.scalar(dtype, momentum)?;
    let old = b.mul(running, keep)?;
    let new = b.mul(batch, take)?;
    b.add(old, new)
}

/// The parameters of a self-attention layer `name` of `features` in and out and `dim`
/// inside: `<name>.wq`, `.wk`, `.wv` `[features, dim]` and `.wo` `[dim, features]`, in the
/// order [`self_attention`] takes them. The static and eager layers both declare these.
pub fn attention_weights(name: &str, features: usize, dim: usize) -> [(String, [usize; 2]); 4] {
    let inward = [features, dim];
    [
        ("wq", inward),
        ("wk", inward),
        ("wv", inward),
        ("wo", [dim, features]),
    ]
    .map(|(suffix, shape)| (format!("{name}.{suffix}"), shape))
}

/// Single-head self-attention over `x` `[N, T, D]`: `softmax(q·kᵀ/√d)·v·w_o` with
/// `q, k, v = x·w_q, x·w_k, x·w_v` (`[D, d]` each) and `w_o` `[d, D]`.
#[track_caller]
pub fn self_attention(
    b: &mut FunctionBuilder,
    x: Value,
    [wq, wk, wv, wo]: [Value; 4],
) -> BuildResult<Value> {
    let ty = b.value_type(x).clone();
    if ty.rank() != 3 {
        let message = format!("the input must be [N, T, D] (batch, tokens, features), found {ty}");
        return Err(error("self_attention", message));
    }
    let q = b.matmul(x, wq)?;
    let k = b.matmul(x, wk)?;
    let v = b.matmul(x, wv)?;
    let context = scaled_dot_product_attention(b, q, k, v, false)?;
    b.matmul(context, wo)
}

/// `softmax(q·kᵀ/√d)·v` over `[..., T, d]` queries, keys and values (any batch axes in front).
/// With `causal`, query `i` sees only keys `j ≤ i` (the others' scores are −∞), as a decoder's
/// self-attention does; the number of queries and keys must then be fixed and equal.
#[track_caller]
pub fn scaled_dot_product_attention(
    b: &mut FunctionBuilder,
    q: Value,
    k: Value,
    v: Value,
    causal: bool,
) -> BuildResult<Value> {
    let scores = attention_scores(b, q, k)?;
    let bias = match causal {
        true => Some(causal_bias(b, &b.value_type(scores).clone())?),
        false => None,
    };
    attend(b, scores, bias, v)
}

/// `q·kᵀ/√d` for `[..., d]` queries and keys.
#[track_caller]
fn attention_scores(b: &mut FunctionBuilder, q: Value, k: Value) -> BuildResult<Value> {
    let ty = b.value_type(q).clone();
    let d = fixed_last_dim("attention", "queries", &ty)?;
    let scores = b.matmul_t(q, k, false, true)?;
    let scale = b.scalar(ty.dtype, 1.0 / (d as f64).sqrt())?;
    b.mul(scores, scale)
}

/// `softmax(scores + bias)·v` over the scores' last axis.
#[track_caller]
fn attend(
    b: &mut FunctionBuilder,
    scores: Value,
    bias: Option<Value>,
    v: Value,
) -> BuildResult<Value> {
    let scores = match bias {
        Some(bias) => b.add(scores, bias)?,
        None => scores,
    };
    let last = b.value_type(scores).rank() - 1;
    let weights = softmax(b, scores, last)?;
    b.matmul(weights, v)
}

/// Causal attention's `[T, T]` additive mask for scores of type `scores` (`[..., T, T]`):
/// 0 where query `i` may see key `j` (`j ≤ i`), −∞ elsewhere. Added rather than selected, as
/// PyTorch's `attn_mask` is: it depends on no input, so fusion computes it once in its own
/// kernel, and the softmax's gradient needs no mask.
#[track_caller]
fn causal_bias(b: &mut FunctionBuilder, scores: &Type) -> BuildResult<Value> {
    let dims = scores.shape.dims();
    let (queries, keys) = (
        dims[dims.len() - 2].as_fixed(),
        dims[dims.len() - 1].as_fixed(),
    );
    let t = match (queries, keys) {
        (Some(q), Some(k)) if q == k => q,
        _ => {
            let message = format!(
                "causal attention needs as many fixed queries as keys, scores are {scores}"
            );
            return Err(error("attention", message));
        }
    };
    let square = Type::new(DType::I64, Shape::fixed(&[t, t]));
    let query = b.iota(square.clone(), 0)?;
    let key = b.iota(square, 1)?;
    let seen = b.compare(CompareOp::Le, key, query)?;
    let (zero, hidden) = (
        b.scalar(scores.dtype, 0.0)?,
        b.scalar(scores.dtype, f64::NEG_INFINITY)?,
    );
    b.select(seen, zero, hidden)
}

/// The additive mask `[N, 1, T, S]` of rows padded on the left: 0 where the query at slot
/// `queries[t]` may see the key at slot `keys[s]` — a key at or before the query, past row
/// `n`'s `pads[n]` slots of padding — and −∞ elsewhere. A query in the padding sees the keys
/// before it, padding too, so that what it computes stays finite (a row of −∞ alone would
/// make its softmax NaN, and a NaN key poisons every score beside it). `queries` `[T]`,
/// `keys` `[S]` and `pads` `[N]` are i64.
#[track_caller]
fn padded_causal_bias(
    b: &mut FunctionBuilder,
    dtype: DType,
    [queries, keys, pads]: [Value; 3],
) -> BuildResult<Value> {
    let length = |b: &FunctionBuilder, v: Value, what: &str| match b.value_type(v).shape.dims() {
        [n] => n.as_fixed().ok_or_else(|| {
            error(
                "attention",
                format!("{what} must have a fixed length, found {}", b.value_type(v)),
            )
        }),
        _ => Err(error(
            "attention",
            format!("{what} must be [N], found {}", b.value_type(v)),
        )),
    };
    let [t, s, n] = [
        length(b, queries, "the query slots")?,
        length(b, keys, "the key slots")?,
        length(b, pads, "the pads")?,
    ];
    let query = b.reshape(queries, Shape::fixed(&[1, 1, t, 1]))?;
    let key = b.reshape(keys, Shape::fixed(&[1, 1, 1, s]))?;
    let pad = b.reshape(pads, Shape::fixed(&[n, 1, 1, 1]))?;
    let causal = b.compare(CompareOp::Le, key, query)?;
    let past_padding = b.compare(CompareOp::Ge, key, pad)?;
    let padding_query = b.compare(CompareOp::Lt, query, pad)?;
    let open = b.or(past_padding, padding_query)?;
    let seen = b.and(causal, open)?;
    let (zero, hidden) = (b.scalar(dtype, 0.0)?, b.scalar(dtype, f64::NEG_INFINITY)?);
    b.select(seen, zero, hidden)
}

/// Causal attention over `[N, H, T, d]` queries, keys and values whose rows are padded on
/// the left, row `n` by `pads[n]` (i64 `[N]`) slots: each query sees the keys at or before
/// it past its row's padding ([`padded_causal_bias`]); with no padding, causal
/// [`scaled_dot_product_attention`].
#[track_caller]
pub fn padded_causal_attention(
    b: &mut FunctionBuilder,
    [q, k, v]: [Value; 3],
    pads: Value,
) -> BuildResult<Value> {
    let ty = b.value_type(q).clone();
    let Some(t) = ty.shape.dims().get(2).and_then(Dim::as_fixed) else {
        let message = format!("the queries must be [N, H, T, d] with T fixed, found {ty}");
        return Err(error("padded_causal_attention", message));
    };
    let scores = attention_scores(b, q, k)?;
    let slots = b.iota(Type::new(DType::I64, Shape::fixed(&[t])), 0)?;
    let bias = padded_causal_bias(b, ty.dtype, [slots, slots, pads])?;
    attend(b, scores, Some(bias), v)
}

/// One new token's attention over a cache: queries `q` `[N, H, 1, d]` against keys and values
/// `[N, H, S, d]` of which slots `pads[n]..=pos` of row `n` are filled (`pos` an integer
/// scalar, `pads` i64 `[N]`: each row's padding on the left); the other slots are masked out
/// as [`padded_causal_attention`] masks them, so the result equals row `pos` of it over the
/// first `pos + 1` slots.
#[track_caller]
pub fn cached_attention(
    b: &mut FunctionBuilder,
    q: Value,
    [k, v]: [Value; 2],
    pos: Value,
    pads: Value,
) -> BuildResult<Value> {
    let ty = b.value_type(k).clone();
    let slots = match ty.shape.dims() {
        [_, _, s, _] => s.as_fixed(),
        _ => None,
    };
    let Some(slots) = slots else {
        let message = format!("the cache must be [N, H, S, d] with S fixed, found {ty}");
        return Err(error("cached_attention", message));
    };
    let scores = attention_scores(b, q, k)?;
    let keys = b.iota(Type::new(DType::I64, Shape::fixed(&[slots])), 0)?;
    let pos = b.cast(pos, DType::I64)?;
    let query = b.reshape(pos, Shape::fixed(&[1]))?;
    let bias = padded_causal_bias(b, ty.dtype, [query, keys, pads])?;
    attend(b, scores, Some(bias), v)
}

/// Multi-head attention's core over `q`, `k`, `v` `[N, T, D]` (already projected): each of
/// `heads` heads attends with its `D/heads` features ([`scaled_dot_product_attention`]), and
/// the heads' outputs are joined back into `[N, T, D]`.
#[track_caller]
pub fn multi_head_attention(
    b: &mut FunctionBuilder,
    [q, k, v]: [Value; 3],
    heads: usize,
    causal: bool,
) -> BuildResult<Value> {
    let ty = b.value_type(q).clone();
    let (n, [t, d]) = match ty.shape.dims() {
        [n, t, d] => match (t.as_fixed(), d.as_fixed()) {
            (Some(t), Some(d)) if heads > 0 && d % heads == 0 => (n.clone(), [t, d]),
            _ => {
                let message = format!(
                    "{heads} heads need fixed tokens and features divisible by them, found {ty}"
                );
                return Err(error("multi_head_attention", message));
            }
        },
        _ => {
            let message =
                format!("the input must be [N, T, D] (batch, tokens, features), found {ty}");
            return Err(error("multi_head_attention", message));
        }
    };
    let split = Shape(vec![n.clone(), t.into(), heads.into(), (d / heads).into()]);
    let mut per_head = Vec::with_capacity(3);
    for x in [q, k, v] {
        let x = b.reshape(x, split.clone())?;
        per_head.push(b.transpose(x, vec![0, 2, 1, 3])?);
    }
    let context = scaled_dot_product_attention(b, per_head[0], per_head[1], per_head[2], causal)?;
    let context = b.transpose(context, vec![0, 2, 1, 3])?;
    b.reshape(context, Shape(vec![n, t.into(), d.into()]))
}

/// The sizes of a recurrent layer's input `[N, T, D]`: `T` and `D` fixed.
#[track_caller]
fn sequence_dims(
    b: &FunctionBuilder,
    layer: &'static str,
    x: Value,
) -> BuildResult<(Dim, [usize; 2])> {
    let ty = b.value_type(x);
    match ty.shape.dims() {
        [n, t, d] => match (t.as_fixed(), d.as_fixed()) {
            (Some(t), Some(d)) if t > 0 => Ok((n.clone(), [t, d])),
            _ => Err(error(
                layer,
                format!("the input needs fixed steps and features, found {ty}"),
            )),
        },
        _ => Err(error(
            layer,
            format!("the input must be [N, T, D] (batch, steps, features), found {ty}"),
        )),
    }
}

/// Step `t` of a sequence `[N, T, D]`: `[N, D]`.
#[track_caller]
fn step_of(b: &mut FunctionBuilder, x: Value, t: usize, n: &Dim, d: usize) -> BuildResult<Value> {
    let ranges = vec![
        AxisSlice::Full,
        AxisSlice::Range {
            start: t,
            end: t + 1,
            step: 1,
        },
        AxisSlice::Full,
    ];
    let xt = b.slice(x, ranges)?;
    b.reshape(xt, Shape(vec![n.clone(), Dim::Fixed(d)]))
}

/// Columns `k·h .. (k+1)·h` of `[N, G·h]` (one gate's pre-activation).
#[track_caller]
fn gate(b: &mut FunctionBuilder, z: Value, k: usize, h: usize) -> BuildResult<Value> {
    let ranges = vec![
        AxisSlice::Full,
        AxisSlice::Range {
            start: k * h,
            end: (k + 1) * h,
            step: 1,
        },
    ];
    b.slice(z, ranges)
}

/// Zeros `[N, h]` for a batch of `n` (symbolic or not).
#[track_caller]
fn zero_state(b: &mut FunctionBuilder, n: &Dim, h: usize, dtype: DType) -> BuildResult<Value> {
    let zero = b.scalar(dtype, 0.0)?;
    b.broadcast_to(zero, &Shape(vec![n.clone(), Dim::Fixed(h)]))
}

/// Stacks `[N, h]` states into `[N, T, h]`.
#[track_caller]
fn stack_steps(b: &mut FunctionBuilder, states: &[Value], n: &Dim, h: usize) -> BuildResult<Value> {
    let shape = Shape(vec![n.clone(), Dim::Fixed(1), Dim::Fixed(h)]);
    let steps = states
        .iter()
        .map(|&s| b.reshape(s, shape.clone()))
        .collect::<BuildResult<Vec<_>>>()?;
    b.concat(&steps, 1)
}

/// An LSTM over `x` `[N, T, D]`, unrolled over its `T` steps (PyTorch's gate order i, f, g, o):
/// `z = x_t·w_ih + h·w_hh + bias`, `c = σ(f)·c + σ(i)·tanh(g)`, `h = σ(o)·tanh(c)`, from zero
/// states. Weights `w_ih` `[D, 4H]`, `w_hh` `[H, 4H]`, `bias` `[4H]`. Returns every step's
/// `h` `[N, T, H]`, and the last `h` and the last cell state `c` (`[N, H]` each).
#[track_caller]
pub fn lstm(
    b: &mut FunctionBuilder,
    x: Value,
    w_ih: Value,
    w_hh: Value,
    bias: Value,
) -> BuildResult<(Value, [Value; 2])> {
    let (n, [steps, d]) = sequence_dims(b, "lstm", x)?;
    let hidden = fixed_last_dim("lstm", "recurrent weights", &b.value_type(w_hh).clone())? / 4;
    let dtype = b.value_type(x).dtype;
    let mut h = zero_state(b, &n, hidden, dtype)?;
    let mut c = h;
    let mut outputs = Vec::with_capacity(steps);
    for t in 0..steps {
        let xt = step_of(b, x, t, &n, d)?;
        let zx = b.matmul(xt, w_ih)?;
        let zh = b.matmul(h, w_hh)?;
        let z = b.add(zx, zh)?;
        let z = b.add(z, bias)?;
        let i = gate(b, z, 0, hidden)?;
        let i = b.sigmoid(i)?;
        let f = gate(b, z, 1, hidden)?;
        let f = b.sigmoid(f)?;
        let g = gate(b, z, 2, hidden)?;
        let g = b.tanh(g)?;
        let o = gate(b, z, 3, hidden)?;
        let o = b.sigmoid(o)?;
        let fc = b.mul(f, c)?;
        let ig = b.mul(i, g)?;
        c = b.add(fc, ig)?;
        let tc = b.tanh(c)?;
        h = b.mul(o, tc)?;
        outputs.push(h);
    }
    Ok((stack_steps(b, &outputs, &n, hidden)?, [h, c]))
}

/// A GRU over `x` `[N, T, D]`, unrolled (PyTorch's gates r, z, n): `r = σ(x·W_r + b_ir +
/// h·U_r + b_hr)`, `z` likewise, `n = tanh(x·W_n + b_in + r·(h·U_n + b_hn))`,
/// `h = (1 − z)·n + z·h`, from a zero state. Weights `w_ih` `[D, 3H]`, `w_hh` `[H, 3H]`,
/// biases `b_ih`, `b_hh` `[3H]`. Returns every step's `h` `[N, T, H]` and the last `[N, H]`.
#[track_caller]
pub fn gru(
    b: &mut FunctionBuilder,
    x: Value,
    [w_ih, w_hh]: [Value; 2],
    [b_ih, b_hh]: [Value; 2],
) -> BuildResult<(Value, Value)> {
    let (n, [steps, d]) = sequence_dims(b, "gru", x)?;
    let hidden = fixed_last_dim("gru", "recurrent weights", &b.value_type(w_hh).clone())? / 3;
    let dtype = b.value_type(x).dtype;
    let mut h = zero_state(b, &n, hidden, dtype)?;
    let one = b.scalar(dtype, 1.0)?;
    let mut outputs = Vec::with_capacity(steps);
    for t in 0..steps {
        let xt = step_of(b, x, t, &n, d)?;
        let zx = b.matmul(xt, w_ih)?;
        let zx = b.add(zx, b_ih)?;
        let zh = b.matmul(h, w_hh)?;
        let zh = b.add(zh, b_hh)?;
        let (xr, hr) = (gate(b, zx, 0, hidden)?, gate(b, zh, 0, hidden)?);
        let r = b.add(xr, hr)?;
        let r = b.sigmoid(r)?;
        let (xz, hz) = (gate(b, zx, 1, hidden)?, gate(b, zh, 1, hidden)?);
        let z = b.add(xz, hz)?;
        let z = b.sigmoid(z)?;
        let (xn, hn) = (gate(b, zx, 2, hidden)?, gate(b, zh, 2, hidden)?);
        let rn = b.mul(r, hn)?;
        let nn = b.add(xn, rn)?;
        let nn = b.tanh(nn)?;
        let keep = b.sub(one, z)?;
        let new = b.mul(keep, nn)?;
        let old = b.mul(z, h)?;
        h = b.add(new, old)?;
        outputs.push(h);
    }
    Ok((stack_steps(b, &outputs, &n, hidden)?, h))
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
