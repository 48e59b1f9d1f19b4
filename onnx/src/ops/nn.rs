//! Neural-network ops: convolution, pooling, normalisation, products and softmax. Kiln's
//! convolution and pooling are 2-D over NCHW; 1-D ones run as 2-D over a height of 1.

use crate::context::{Converted, Ctx, Fail, axis, unsupported};
use kiln_ir::{BinaryOp, Conv2dAttrs, ConvKind, DType, Dim, Pool2dAttrs, ReduceOp, Shape, Value};
use kiln_runtime::composite;

/// A window op's spatial attributes, for 2 spatial axes.
struct Window {
    strides: [usize; 2],
    dilations: [usize; 2],
    pads: [(usize, usize); 2],
}

fn pair(
    values: Option<&[i64]>,
    spatial: usize,
    default: usize,
    what: &str,
) -> Result<[usize; 2], Fail> {
    let Some(v) = values else {
        return Ok([default; 2]);
    };
    if v.len() != spatial || v.iter().any(|&x| x < 0) {
        return Err(Fail::Invalid(format!(
            "{what} {v:?} should be {spatial} non-negative numbers"
        )));
    }
    Ok(if spatial == 1 {
        [default, v[0] as usize]
    } else {
        [v[0] as usize, v[1] as usize]
    })
}

/// How far a kernel of `k` taps reaches with `dilation`: `(k − 1)·dilation + 1`.
fn span(k: usize, dilation: usize) -> Result<usize, Fail> {
    (k.saturating_sub(1).checked_mul(dilation))
        .and_then(|s| s.checked_add(1))
        .ok_or_else(|| Fail::Invalid(format!("a kernel of {k} dilated by {dilation} overflows")))
}

/// Reads kernel, strides, dilations and pads (with `auto_pad`) for `spatial` axes of sizes
/// `input` (1-D ops as 2-D over a height of 1).
fn window(c: &Ctx, spatial: usize, input: [usize; 2], kernel: [usize; 2]) -> Result<Window, Fail> {
    let n = c.node;
    let strides = pair(n.ints("strides"), spatial, 1, "strides")?;
    let dilations = pair(n.ints("dilations"), spatial, 1, "dilations")?;
    if strides.contains(&0) || dilations.contains(&0) || kernel.contains(&0) {
        return Err("strides, dilations and the kernel should be positive".into());
    }
    let mut pads = [(0, 0); 2];
    match n.string("auto_pad")?.as_deref().unwrap_or("NOTSET") {
        "NOTSET" => {
            if let Some(p) = n.ints("pads") {
                if p.len() != 2 * spatial || p.iter().any(|&x| x < 0) {
                    return Err(Fail::Invalid(format!(
                        "pads {p:?} should be {} non-negative numbers",
                        2 * spatial
                    )));
                }
                let first = 2 - spatial;
                for i in 0..spatial {
                    pads[first + i] = (p[i] as usize, p[i + spatial] as usize);
                }
            }
        }
        "VALID" => {}
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            for i in 0..2 {
                let span = span(kernel[i], dilations[i])?;
                let out = input[i].div_ceil(strides[i]);
                let reach = ((out.max(1) - 1).checked_mul(strides[i]))
                    .and_then(|r| r.checked_add(span))
                    .ok_or("the window's reach overflows")?;
                let total = reach.saturating_sub(input[i]);
                let small = total / 2;
                pads[i] = if mode == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
            }
        }
        other => return Err(Fail::Invalid(format!("auto_pad {other:?}"))),
    }
    Ok(Window {
        strides,
        dilations,
        pads,
    })
}

/// `x` (rank 3 or 4) as 4-D NCHW, the number of spatial axes it had, and its fixed `[C, H, W]`
/// (the batch may be symbolic).
fn as_2d(c: &mut Ctx, x: Value, what: &str) -> Result<(Value, usize, [usize; 3]), Fail> {
    let d = c.ty(x).shape.dims().to_vec();
    let fixed = |a: usize| {
        d[a].as_fixed()
            .ok_or_else(|| Fail::Unsupported(format!("{what} with symbolic axis {a} ({})", d[a])))
    };
    match d.len() {
        4 => Ok((x, 2, [fixed(1)?, fixed(2)?, fixed(3)?])),
        3 => {
            let (ch, len) = (fixed(1)?, fixed(2)?);
            let shape = Shape(vec![
                d[0].clone(),
                Dim::Fixed(ch),
                Dim::Fixed(1),
                Dim::Fixed(len),
            ]);
            Ok((c.b.reshape(x, shape)?, 1, [ch, 1, len]))
        }
        r => unsupported(format!(
            "{what} of rank {r} (Kiln's windows are 1-D or 2-D)"
        )),
    }
}

/// A 4-D result back to 3-D when the op was 1-D.
fn from_2d(c: &mut Ctx, y: Value, spatial: usize) -> Result<Value, Fail> {
    if spatial == 2 {
        return Ok(y);
    }
    let d = c.ty(y).shape.dims().to_vec();
    Ok(c.b.reshape(y, Shape(vec![d[0].clone(), d[1].clone(), d[3].clone()]))?)
}

/// The bias `[M]` added over channels of a 4-D result.
fn add_channel_bias(c: &mut Ctx, y: Value, bias: Option<Value>) -> Result<Value, Fail> {
    let Some(bias) = bias else { return Ok(y) };
    let m = c.shape(bias, "the bias")?;
    // One value per output channel: a single value would otherwise broadcast over them all.
    let channels = c.ty(y).shape.dims()[1].clone();
    if !matches!(m.as_slice(), [n] if Dim::Fixed(*n) == channels) {
        return Err(Fail::Invalid(format!(
            "the bias {m:?} should be 1-D with one value per output channel ({channels})"
        )));
    }
    let bias = c.b.reshape(bias, Shape::fixed(&[1, m[0], 1, 1]))?;
    Ok(c.b.add(y, bias)?)
}

/// Refuses weights whose rank is not the input's (a 1-D kernel would run over a 2-D input as
/// one of height 1), and a `kernel_shape` other than the weights' spatial sizes.
fn check_kernel(c: &Ctx, x: Value, w: Value) -> Result<(), Fail> {
    let (xs, ws) = (c.ty(x).shape, c.ty(w).shape);
    if xs.rank() != ws.rank() {
        return Err(Fail::Invalid(format!(
            "the weights {ws} should have the rank of the input {xs}"
        )));
    }
    let Some(kernel) = c.node.ints("kernel_shape") else {
        return Ok(());
    };
    let spatial = &ws.dims()[ws.rank().min(2)..];
    let fits = |(&k, d): (&i64, &Dim)| d.as_fixed().is_none_or(|n| n as i64 == k);
    if kernel.len() != spatial.len() || !kernel.iter().zip(spatial).all(fits) {
        return Err(Fail::Invalid(format!(
            "kernel_shape {kernel:?} is not the spatial sizes of the weights {ws}"
        )));
    }
    Ok(())
}

/// `Conv(X, W, B)`.
pub(super) fn conv(c: &mut Ctx) -> Converted {
    let (x, w) = (c.input(0)?, c.input(1)?);
    let bias = c.optional(2)?;
    check_kernel(c, x, w)?;
    let (x, spatial, [_, h, wd]) = as_2d(c, x, "the input")?;
    let (w, _, [_, kh, kw]) = as_2d(c, w, "the weights")?;
    let win = window(c, spatial, [h, wd], [kh, kw])?;
    let attrs = Conv2dAttrs {
        strides: win.strides,
        padding: win.pads,
        dilation: win.dilations,
        groups: c.node.positive("group", Some(1))?,
        channels_last: false,
    };
    let y = c.b.conv2d(x, w, attrs)?;
    let y = add_channel_bias(c, y, bias)?;
    Ok(vec![from_2d(c, y, spatial)?])
}

/// `ConvTranspose(X, W, B)`: the input gradient of a convolution whose weights are `W`.
pub(super) fn conv_transpose(c: &mut Ctx) -> Converted {
    let (x, w) = (c.input(0)?, c.input(1)?);
    let bias = c.optional(2)?;
    let (x, spatial, [_, h, wd]) = as_2d(c, x, "the input")?;
    let (w, _, [_, kh, kw]) = as_2d(c, w, "the weights")?;
    let n = c.node;
    let strides = pair(n.ints("strides"), spatial, 1, "strides")?;
    let dilations = pair(n.ints("dilations"), spatial, 1, "dilations")?;
    let extra = pair(n.ints("output_padding"), spatial, 0, "output_padding")?;
    let input = [h, wd];
    if input.contains(&0) {
        return Err("ConvTranspose of an empty input".into());
    }
    let mut covered = [0usize; 2];
    for i in 0..2 {
        let span = span([kh, kw][i], dilations[i])?;
        covered[i] = (strides[i].checked_mul(input[i] - 1))
            .and_then(|v| v.checked_add(extra[i]))
            .and_then(|v| v.checked_add(span))
            .ok_or("the output size overflows")?;
    }
    let full = |i: usize| covered[i];
    let mut pads = window(c, spatial, input, [kh, kw])?.pads;
    let auto = n.string("auto_pad")?.unwrap_or_default();
    let output_shape = pair(n.ints("output_shape"), spatial, 0, "output_shape")?;
    let out: [usize; 2] = if n.ints("output_shape").is_some() || auto.starts_with("SAME") {
        let mut out = [0; 2];
        for i in 0..2 {
            out[i] = if n.ints("output_shape").is_some() {
                output_shape[i].max(if spatial == 1 && i == 0 { 1 } else { 0 })
            } else {
                input[i]
                    .checked_mul(strides[i])
                    .ok_or("the output size overflows")?
            };
            // A larger output than the input covers gains zeros at the end.
            let total = full(i).saturating_sub(out[i]);
            let small = total / 2;
            pads[i] = if auto == "SAME_UPPER" {
                (small, total - small)
            } else {
                (total - small, small)
            };
        }
        out
    } else {
        let mut out = [0; 2];
        for i in 0..2 {
            out[i] = (full(i))
                .checked_sub(pads[i].0 + pads[i].1)
                .ok_or("the pads are larger than the output")?;
        }
        out
    };
    let groups = n.positive("group", Some(1))?;
    let attrs = Conv2dAttrs {
        strides,
        padding: pads,
        dilation: dilations,
        groups,
        channels_last: false,
    };
    let y = c.b.conv(ConvKind::InputGrad { input: out }, attrs, x, w)?;
    let y = add_channel_bias(c, y, bias)?;
    Ok(vec![from_2d(c, y, spatial)?])
}

/// `MaxPool` / `AveragePool`.
pub(super) fn pool(c: &mut Ctx, max: bool) -> Converted {
    if c.node.proto.output.get(1).is_some_and(|o| !o.is_empty()) {
        return unsupported("MaxPool's Indices output");
    }
    let x = c.input(0)?;
    let (x, spatial, [_, h, wd]) = as_2d(c, x, "the input")?;
    let kernel = pair(c.node.ints("kernel_shape"), spatial, 1, "kernel_shape")?;
    if c.node.ints("kernel_shape").is_none() {
        return Err("attribute kernel_shape is required".into());
    }
    let win = window(c, spatial, [h, wd], kernel)?;
    if win.dilations != [1, 1] {
        return unsupported("dilated pooling");
    }
    c.node.refuse_int("storage_order", 0)?;
    // ceil_mode: more padding at the end, so the last partial window is counted.
    let ceil = c.node.int("ceil_mode", 0)? != 0;
    let input = [h, wd];
    let mut extra = [0usize; 2];
    for i in 0..2 {
        let padded = input[i] + win.pads[i].0 + win.pads[i].1;
        let span = padded
            .checked_sub(kernel[i])
            .ok_or("the window is larger than the padded input")?;
        let mut out = span / win.strides[i] + 1;
        if ceil && span % win.strides[i] != 0 {
            out += 1;
            // PyTorch's and ONNX's rule: the last window starts inside the input or its left pad.
            if (out - 1) * win.strides[i] >= input[i] + win.pads[i].0 {
                out -= 1;
            }
        }
        extra[i] = ((out - 1) * win.strides[i] + kernel[i]).saturating_sub(padded);
    }
    let padding = [
        (win.pads[0].0, win.pads[0].1 + extra[0]),
        (win.pads[1].0, win.pads[1].1 + extra[1]),
    ];
    let attrs = Pool2dAttrs {
        window: kernel,
        strides: win.strides,
        padding,
        channels_last: false,
    };
    if max {
        let y = c.b.max_pool2d(x, attrs)?;
        return Ok(vec![from_2d(c, y, spatial)?]);
    }
    let include_pad = c.node.int("count_include_pad", 0)? != 0;
    let y = c.b.avg_pool2d(x, attrs)?;
    let counted = padding.iter().any(|&(lo, hi)| lo + hi > 0) && !(include_pad && extra == [0, 0]);
    let y = if counted {
        divide_by_counted(c, y, input, win.pads, attrs, include_pad)?
    } else {
        y
    };
    Ok(vec![from_2d(c, y, spatial)?])
}

/// An average over each window's counted positions: the input's, or also the explicit
/// padding's (`count_include_pad`), never the extra end padding of `ceil_mode`.
fn divide_by_counted(
    c: &mut Ctx,
    y: Value,
    input: [usize; 2],
    pads: [(usize, usize); 2],
    attrs: Pool2dAttrs,
    include_pad: bool,
) -> Result<Value, Fail> {
    let dtype = c.dtype(y);
    let one = c.scalar(dtype, 1.0)?;
    let counted = match include_pad {
        true => [
            1,
            1,
            input[0] + pads[0].0 + pads[0].1,
            input[1] + pads[1].0 + pads[1].1,
        ],
        false => [1, 1, input[0], input[1]],
    };
    let ones = c.b.broadcast_to(one, &Shape::fixed(&counted))?;
    let mask = match include_pad {
        // The counted region is the padded input: pool over it with only ceil_mode's extra.
        true => {
            let attrs = Pool2dAttrs {
                padding: [
                    (0, attrs.padding[0].1 - pads[0].1),
                    (0, attrs.padding[1].1 - pads[1].1),
                ],
                ..attrs
            };
            c.b.avg_pool2d(ones, attrs)?
        }
        false => c.b.avg_pool2d(ones, attrs)?,
    };
    Ok(c.b.div(y, mask)?)
}

/// `LpPool(p)`: `(Σ |x|ᵖ)^(1/p)` over each window, padding counted as zeros.
pub(super) fn lp_pool(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let (x, spatial, [_, h, wd]) = as_2d(c, x, "the input")?;
    if c.node.ints("kernel_shape").is_none() {
        return Err("attribute kernel_shape is required".into());
    }
    let kernel = pair(c.node.ints("kernel_shape"), spatial, 1, "kernel_shape")?;
    let win = window(c, spatial, [h, wd], kernel)?;
    if win.dilations != [1, 1] || c.node.int("ceil_mode", 0)? != 0 {
        return unsupported("dilated or ceil-mode LpPool");
    }
    let p = c.node.positive("p", Some(2))? as f64;
    let dtype = c.dtype(x);
    let a = c.b.abs(x)?;
    let power = c.scalar(dtype, p)?;
    let powered = c.b.pow(a, power)?;
    let attrs = Pool2dAttrs {
        window: kernel,
        strides: win.strides,
        padding: win.pads,
        channels_last: false,
    };
    let mean = c.b.avg_pool2d(powered, attrs)?;
    let area = c.scalar(dtype, (kernel[0] * kernel[1]) as f64)?;
    let sum = c.b.mul(mean, area)?;
    let root = c.scalar(dtype, 1.0 / p)?;
    let y = c.b.pow(sum, root)?;
    Ok(vec![from_2d(c, y, spatial)?])
}

/// `GlobalAveragePool` / `GlobalMaxPool`: over every spatial axis, kept with size 1.
pub(super) fn global_pool(c: &mut Ctx, op: ReduceOp) -> Converted {
    let x = c.input(0)?;
    let axes: Vec<usize> = (2..c.rank(x)).collect();
    Ok(vec![c.b.reduce(op, x, axes, true)?])
}

/// A per-channel vector `[C]` (named `what`) shaped to broadcast over `x`, `[N, C, ...]`.
fn per_channel(c: &mut Ctx, v: Value, x: Value, what: &str) -> Result<Value, Fail> {
    let xs = c.ty(x).shape;
    let Some(channels) = xs.dims().get(1).cloned() else {
        return Err(Fail::Invalid(format!(
            "the input {xs} should be [N, C, ...]"
        )));
    };
    let shape = c.shape(v, what)?;
    // One value per channel: a single value would otherwise broadcast over them all.
    if !matches!(shape.as_slice(), [n] if channels.as_fixed().is_none_or(|ch| ch == *n)) {
        return Err(Fail::Invalid(format!(
            "the {what} {shape:?} should have one value per channel ({channels})"
        )));
    }
    let mut dims = vec![1; xs.rank()];
    dims[1] = shape[0];
    Ok(c.b.reshape(v, Shape::fixed(&dims))?)
}

/// `BatchNormalization` at inference: `(x − mean) · scale / √(var + ε) + B`.
pub(super) fn batch_norm(c: &mut Ctx) -> Converted {
    if c.node.int("training_mode", 0)? != 0
        || c.node.proto.output.iter().skip(1).any(|o| !o.is_empty())
    {
        return unsupported("training-mode BatchNormalization");
    }
    // Before opset 9, spatial=0 gives the statistics one value per activation, not per channel.
    if c.node.opset < 9 && c.node.int("spatial", 1)? == 0 {
        return unsupported("BatchNormalization with spatial=0");
    }
    let x = c.input(0)?;
    let mut v = [x; 4];
    for (i, slot) in v.iter_mut().enumerate() {
        let input = c.input(i + 1)?;
        *slot = per_channel(c, input, x, ["scale", "bias", "mean", "variance"][i])?;
    }
    let [scale, bias, mean, var] = v;
    let eps = c.scalar(c.dtype(x), c.node.float("epsilon", 1e-5)? as f64)?;
    let ve = c.b.add(var, eps)?;
    let inv = c.b.rsqrt(ve)?;
    let k = c.b.mul(scale, inv)?;
    let centred = c.b.sub(x, mean)?;
    let y = c.b.mul(centred, k)?;
    Ok(vec![c.b.add(y, bias)?])
}

/// `(x − mean) / √(var + ε)` over `axes` (kept), with the mean and `1/√(var + ε)`.
fn normalize(c: &mut Ctx, x: Value, axes: Vec<usize>, eps: f64) -> Result<[Value; 3], Fail> {
    let mu = c.b.reduce(ReduceOp::Mean, x, axes.clone(), true)?;
    let d = c.b.sub(x, mu)?;
    let d2 = c.b.mul(d, d)?;
    let var = c.b.reduce(ReduceOp::Mean, d2, axes, true)?;
    let eps = c.scalar(c.dtype(x), eps)?;
    let ve = c.b.add(var, eps)?;
    let inv = c.b.rsqrt(ve)?;
    Ok([c.b.mul(d, inv)?, mu, inv])
}

/// `InstanceNormalization(epsilon)`: each channel of each example normalised over space.
pub(super) fn instance_norm(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let rank = c.rank(x);
    let (scale, bias) = (c.input(1)?, c.input(2)?);
    let scale = per_channel(c, scale, x, "scale")?;
    let bias = per_channel(c, bias, x, "bias")?;
    let [xhat, _, _] = normalize(
        c,
        x,
        (2..rank).collect(),
        c.node.float("epsilon", 1e-5)? as f64,
    )?;
    let y = c.b.mul(xhat, scale)?;
    Ok(vec![c.b.add(y, bias)?])
}

/// `LayerNormalization(axis, epsilon)`: over the axes from `axis` on; also the mean and
/// `1/√(var + ε)` when asked for.
pub(super) fn layer_norm(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let rank = c.rank(x);
    let first = axis(c.node.int("axis", -1)?, rank)?;
    let scale = c.input(1)?;
    let bias = c.optional(2)?;
    let xs = c.ty(x).shape;
    unidirectional(c, scale, &xs, "the scale", "the input")?;
    if let Some(bias) = bias {
        unidirectional(c, bias, &xs, "the bias", "the input")?;
    }
    let [xhat, mu, inv] = normalize(
        c,
        x,
        (first..rank).collect(),
        c.node.float("epsilon", 1e-5)? as f64,
    )?;
    let mut y = c.b.mul(xhat, scale)?;
    if let Some(bias) = bias {
        y = c.b.add(y, bias)?;
    }
    Ok(vec![y, mu, inv])
}

/// `LRN(alpha, beta, bias, size)`: `x / (bias + alpha/size · Σ x²)^beta`, the sum over `size`
/// neighbouring channels.
pub(super) fn lrn(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = c.shape(x, "the input")?;
    let size = c.node.positive("size", None)?;
    let dtype = c.dtype(x);
    let sq = c.b.mul(x, x)?;
    let rank = d.len();
    if rank < 2 {
        return Err(Fail::Invalid(format!(
            "LRN needs [N, C, ...], not rank {rank}"
        )));
    }
    // A window wider than the channels sees them all: only its part over them is summed
    // (the division below still uses `size`).
    let reach = d[1].saturating_sub(1);
    let (low, high) = (
        ((size - 1) / 2).min(reach),
        (size - 1).div_ceil(2).min(reach),
    );
    let mut lo = vec![0; rank];
    let mut hi = vec![0; rank];
    (lo[1], hi[1]) = (low, high);
    let padded = c.b.pad(sq, lo, hi, vec![0; rank])?;
    let mut windows = Vec::with_capacity(low + high + 1);
    for k in 0..=low + high {
        let mut ranges = vec![kiln_ir::AxisSlice::Full; rank];
        ranges[1] = kiln_ir::AxisSlice::Range {
            start: k,
            end: k + d[1],
            step: 1,
        };
        windows.push(c.b.slice(padded, ranges)?);
    }
    let sum = c
        .combine(BinaryOp::Add, windows)?
        .expect("the window has at least one channel");
    let alpha = c.node.float("alpha", 1e-4)? as f64;
    let k = c.scalar(dtype, alpha / size as f64)?;
    let bias = c.scalar(dtype, c.node.float("bias", 1.0)? as f64)?;
    let beta = c.scalar(dtype, c.node.float("beta", 0.75)? as f64)?;
    let scaled = c.b.mul(sum, k)?;
    let base = c.b.add(scaled, bias)?;
    let den = c.b.pow(base, beta)?;
    Ok(vec![c.b.div(x, den)?])
}

/// `Gemm(alpha, beta, transA, transB)`: `alpha · A'·B' + beta · C`.
pub(super) fn gemm(c: &mut Ctx) -> Converted {
    let (a, b) = (c.input(0)?, c.input(1)?);
    let bias = c.optional(2)?;
    // Matrices only: the builder's matmul would batch over leading axes.
    for (v, name) in [(a, "A"), (b, "B")] {
        if c.rank(v) != 2 {
            return Err(Fail::Invalid(format!(
                "{name} {} should be a matrix (2-D)",
                c.ty(v).shape
            )));
        }
    }
    let (ta, tb) = (c.node.int("transA", 0)? != 0, c.node.int("transB", 0)? != 0);
    let dtype = c.dtype(a);
    let mut y = c.b.matmul_t(a, b, ta, tb)?;
    let alpha = c.node.float("alpha", 1.0)? as f64;
    if alpha != 1.0 {
        let s = c.scalar(dtype, alpha)?;
        y = c.b.mul(y, s)?;
    }
    if let Some(bias) = bias {
        let ys = c.ty(y).shape;
        unidirectional(c, bias, &ys, "C", "the product A'·B'")?;
        let beta = c.node.float("beta", 1.0)? as f64;
        let bias = match beta {
            1.0 => bias,
            _ => {
                let s = c.scalar(dtype, beta)?;
                c.b.mul(bias, s)?
            }
        };
        y = c.b.add(y, bias)?;
    }
    Ok(vec![y])
}

/// Refuses `v` (named `what`) unless it broadcasts to `target` (named `onto`) without widening
/// it: ONNX's unidirectional broadcasting, where the builder's would also stretch `target`.
fn unidirectional(c: &Ctx, v: Value, target: &Shape, what: &str, onto: &str) -> Result<(), Fail> {
    let shape = c.ty(v).shape;
    match shape.broadcasts_to(target) {
        true => Ok(()),
        false => Err(Fail::Invalid(format!(
            "{what} {shape} does not broadcast to {onto} {target}"
        ))),
    }
}

/// `MatMul` with NumPy's rules: a 1-D operand gains an axis that the result then loses.
pub(super) fn matmul(c: &mut Ctx) -> Converted {
    let (mut a, mut b) = (c.input(0)?, c.input(1)?);
    let (ra, rb) = (c.rank(a), c.rank(b));
    if ra == 1 {
        let k = c.ty(a).shape.dims()[0].clone();
        a = c.b.reshape(a, Shape(vec![Dim::Fixed(1), k]))?;
    }
    if rb == 1 {
        let k = c.ty(b).shape.dims()[0].clone();
        b = c.b.reshape(b, Shape(vec![k, Dim::Fixed(1)]))?;
    }
    let mut y = c.b.matmul(a, b)?;
    if ra == 1 || rb == 1 {
        let mut d = c.ty(y).shape.dims().to_vec();
        let n = d.len();
        if rb == 1 {
            d.remove(n - 1);
        }
        if ra == 1 {
            d.remove(n - 2);
        }
        y = c.b.reshape(y, Shape(d))?;
    }
    Ok(vec![y])
}

/// Which softmax.
#[derive(Clone, Copy)]
pub(super) enum SoftmaxKind {
    /// `Softmax`.
    Softmax,
    /// `LogSoftmax`.
    LogSoftmax,
    /// `Hardmax`: one-hot of the first maximum.
    Hardmax,
}

/// `Softmax`, `LogSoftmax`, `Hardmax`: over one axis (opset 13 on), or before it over the
/// input flattened to 2-D at `axis` (default 1).
pub(super) fn softmax(c: &mut Ctx, kind: SoftmaxKind) -> Converted {
    let x = c.input(0)?;
    let d = c.ty(x).shape.dims().to_vec();
    let rank = d.len();
    if c.node.opset >= 13 {
        let a = axis(c.node.int("axis", -1)?, rank)?;
        return Ok(vec![softmax_along(c, x, a, kind)?]);
    }
    let a = match c.node.int("axis", 1)? {
        a if a == rank as i64 => rank,
        a => axis(a, rank)?,
    };
    let shape = c.shape(x, "the input")?;
    let (outer, inner) = (
        shape[..a].iter().product::<usize>(),
        shape[a..].iter().product::<usize>(),
    );
    let flat = c.b.reshape(x, Shape::fixed(&[outer, inner]))?;
    let y = softmax_along(c, flat, 1, kind)?;
    Ok(vec![c.b.reshape(y, Shape(d))?])
}

fn softmax_along(c: &mut Ctx, x: Value, a: usize, kind: SoftmaxKind) -> Result<Value, Fail> {
    Ok(match kind {
        SoftmaxKind::Softmax => composite::softmax(c.b, x, a)?,
        SoftmaxKind::LogSoftmax => composite::log_softmax(c.b, x, a)?,
        SoftmaxKind::Hardmax => {
            let i = c.b.arg_reduce(kiln_ir::ArgOp::ArgMax, x, a, true)?;
            let dtype = c.dtype(x);
            let t = c.ty(x);
            let positions = c.b.iota(t.with_dtype(DType::I64), a)?;
            let hit = c.b.eq(positions, i)?;
            c.b.cast(hit, dtype)?
        }
    })
}
