//! `Resize` (and the older `Upsample`) for static shapes: each resized axis in turn, nearest by
//! one gather, linear by two and cubic by four, with constant weights — separable, as ONNX's
//! reference computes them.

use crate::context::{Converted, Ctx, Fail, axis, check_elements, unsupported};
use kiln_ir::{BinaryOp, DType, Literal, Shape, Type, Value};

/// How output positions map to input coordinates, and how they are sampled.
struct Sampling {
    mode: String,
    transform: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
}

/// The input coordinate of output position `y` along an axis of `len_in` → `len_out`.
fn source(s: &Sampling, y: usize, scale: f64, len_in: usize, len_out: usize) -> Result<f64, Fail> {
    let y = y as f64;
    Ok(match s.transform.as_str() {
        "half_pixel" => (y + 0.5) / scale - 0.5,
        "pytorch_half_pixel" if len_out > 1 => (y + 0.5) / scale - 0.5,
        "pytorch_half_pixel" => 0.0,
        "align_corners" if len_out == 1 => 0.0,
        // ONNX divides by the unrounded resized length, `len_in · scale`.
        "align_corners" => y * (len_in as f64 - 1.0) / (len_in as f64 * scale - 1.0),
        "asymmetric" => y / scale,
        "half_pixel_symmetric" => {
            let adjustment = len_out as f64 / (scale * len_in as f64);
            let center = len_in as f64 / 2.0;
            center * (1.0 - adjustment) + (y + 0.5) / scale - 0.5
        }
        other => return unsupported(format!("coordinate_transformation_mode {other}")),
    })
}

fn nearest(s: &Sampling, x: f64) -> Result<i64, Fail> {
    let frac = x - x.floor();
    Ok(match s.nearest.as_str() {
        "round_prefer_floor" if frac == 0.5 => x.floor(),
        "round_prefer_ceil" if frac == 0.5 => x.ceil(),
        "round_prefer_floor" | "round_prefer_ceil" => x.round(),
        "floor" => x.floor(),
        "ceil" => x.ceil(),
        other => return Err(Fail::Invalid(format!("nearest_mode {other:?}"))),
    } as i64)
}

/// Keys's cubic kernel with parameter `a`, at distance `t`.
fn cubic(a: f64, t: f64) -> f64 {
    let t = t.abs();
    match t {
        t if t <= 1.0 => ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0,
        t if t < 2.0 => ((a * t - 5.0 * a) * t + 8.0 * a) * t - 4.0 * a,
        _ => 0.0,
    }
}

/// For each output position, the input taps and their weights.
fn taps(
    s: &Sampling,
    scale: f64,
    len_in: usize,
    len_out: usize,
) -> Result<Vec<Vec<(i64, f64)>>, Fail> {
    let last = len_in as i64 - 1;
    (0..len_out)
        .map(|y| {
            let x = source(s, y, scale, len_in, len_out)?;
            Ok(match s.mode.as_str() {
                "nearest" => vec![(nearest(s, x)?.clamp(0, last), 1.0)],
                "linear" => {
                    let x = x.clamp(0.0, last as f64);
                    let x0 = x.floor();
                    let w1 = x - x0;
                    vec![(x0 as i64, 1.0 - w1), ((x0 as i64 + 1).min(last), w1)]
                }
                "cubic" => {
                    let x0 = x.floor();
                    let mut t: Vec<(i64, f64)> = (-1..=2)
                        .map(|k| (x0 as i64 + k, cubic(s.cubic_a, x - (x0 + k as f64))))
                        .collect();
                    if s.exclude_outside {
                        t.retain(|&(i, _)| (0..=last).contains(&i));
                        let total: f64 = t.iter().map(|&(_, w)| w).sum();
                        t.iter_mut().for_each(|(_, w)| *w /= total);
                    }
                    t.into_iter().map(|(i, w)| (i.clamp(0, last), w)).collect()
                }
                other => return Err(Fail::Invalid(format!("mode {other:?}"))),
            })
        })
        .collect()
}

/// Resamples axis `a` of `x` to `len_out` positions.
fn resample(
    c: &mut Ctx,
    s: &Sampling,
    x: Value,
    a: usize,
    scale: f64,
    len_out: usize,
) -> Result<Value, Fail> {
    let dims = c.shape(x, "the input")?;
    let table = taps(s, scale, dims[a], len_out)?;
    let width = table.iter().map(Vec::len).max().unwrap_or(0);
    let mut terms = Vec::with_capacity(width);
    for k in 0..width {
        let (idx, w): (Vec<i64>, Vec<f64>) = table
            .iter()
            .map(|t| t.get(k).copied().unwrap_or((0, 0.0)))
            .unzip();
        let idx = c.i64s(&idx)?;
        let g = c.b.gather(x, idx, a)?;
        if s.mode == "nearest" {
            return Ok(g);
        }
        let mut shape = vec![1; dims.len()];
        shape[a] = len_out;
        let dtype = c.dtype(x);
        let literal = Literal::F64(w);
        let weights =
            c.b.constant(literal, Type::new(DType::F64, Shape::fixed(&shape)))?;
        let weights = c.b.cast(weights, dtype)?;
        terms.push(c.b.mul(g, weights)?);
    }
    c.combine(BinaryOp::Add, terms)?
        .ok_or_else(|| "nothing to resample".into())
}

/// `Resize`: scales or sizes for every axis (or `axes`), the input's shape static.
pub(super) fn resize(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dims = c.shape(x, "the input")?;
    let n = c.node;
    if n.int("antialias", 0)? != 0 {
        return unsupported("antialias");
    }
    if n.string("keep_aspect_ratio_policy")?
        .is_some_and(|p| p != "stretch")
    {
        return unsupported("keep_aspect_ratio_policy other than stretch");
    }
    let s = Sampling {
        mode: n.string("mode")?.unwrap_or_else(|| "nearest".into()),
        transform: n
            .string("coordinate_transformation_mode")?
            .unwrap_or_else(|| "half_pixel".into()),
        nearest: n
            .string("nearest_mode")?
            .unwrap_or_else(|| "round_prefer_floor".into()),
        cubic_a: n.float("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: n.int("exclude_outside", 0)? != 0,
    };
    if n.opset < 11 {
        return resize_10(c, x, &dims, s.mode);
    }
    refuse_integer_interpolation(c, x, &s.mode)?;
    let axes: Vec<usize> = match n.ints("axes") {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, dims.len()))
            .collect::<Result<_, _>>()?,
        None => (0..dims.len()).collect(),
    };
    let (scales_at, sizes_at) = if n.opset < 11 {
        (1, usize::MAX)
    } else {
        (2, 3)
    };
    let sizes = c.known_ints(sizes_at, "sizes")?;
    if let Some(sizes) = &sizes {
        check_sizes(c, scales_at, sizes, &dims, &axes)?;
    }
    let scales: Vec<f64> = match (&sizes, c.known(scales_at)) {
        (Some(sizes), _) => axes
            .iter()
            .zip(sizes)
            .map(|(&a, &o)| o as f64 / dims[a] as f64)
            .collect(),
        (None, Some(sc)) if !sc.is_empty() => sc.to_f64_vec(),
        _ if c.has(scales_at) => return unsupported("scales computed at run time"),
        _ => return Err("Resize needs scales or sizes".into()),
    };
    if scales.len() != axes.len() {
        return Err(Fail::Invalid(format!(
            "{} scales for {} axes",
            scales.len(),
            axes.len()
        )));
    }
    resize_axes(c, &s, x, &dims, &axes, &scales, sizes.as_deref())
}

/// ONNX takes `sizes` only with `scales` left out or empty — which one to follow would be a
/// guess — and one size per axis resized: extra sizes were dropped and missing ones reported as
/// missing scales.
fn check_sizes(
    c: &mut Ctx,
    scales_at: usize,
    sizes: &[i64],
    dims: &[usize],
    axes: &[usize],
) -> Result<(), Fail> {
    let scales = match c.known(scales_at) {
        Some(sc) => Some(sc.shape().to_vec()),
        None => (c.optional(scales_at)?).and_then(|v| c.ty(v).shape.as_fixed()),
    };
    if let Some(sc) = scales.filter(|sc| sc.iter().product::<usize>() != 0) {
        return Err(Fail::Invalid(format!(
            "scales {sc:?} and sizes {sizes:?} are both given: ONNX takes one or the other"
        )));
    }
    if sizes.len() != axes.len() {
        let of = match c.node.ints("axes") {
            Some(a) => format!("the axes {a:?}"),
            None => format!("the rank-{} input {dims:?}", dims.len()),
        };
        return Err(Fail::Invalid(format!(
            "sizes {sizes:?} should have one entry per axis of {of}"
        )));
    }
    Ok(())
}

fn resize_axes(
    c: &mut Ctx,
    s: &Sampling,
    mut x: Value,
    dims: &[usize],
    axes: &[usize],
    scales: &[f64],
    sizes: Option<&[i64]>,
) -> Converted {
    for (k, &a) in axes.iter().enumerate() {
        let len_out = match sizes {
            Some(sz) => sz[k].max(0) as usize,
            None => (dims[a] as f64 * scales[k]).floor() as usize,
        };
        let mut out = c.shape(x, "the input")?;
        out[a] = len_out;
        check_elements(&out)?;
        if len_out == dims[a] && scales[k] == 1.0 {
            continue;
        }
        x = resample(c, s, x, a, scales[k], len_out)?;
    }
    Ok(vec![x])
}

/// Linear and cubic weights are fractions: an integer input would truncate them.
fn refuse_integer_interpolation(c: &Ctx, x: Value, mode: &str) -> Result<(), Fail> {
    match mode != "nearest" && !c.dtype(x).is_float() {
        true => unsupported(format!("{mode} resizing of {} values", c.dtype(x).name())),
        false => Ok(()),
    }
}

/// `Resize` before opset 11 and `Upsample`: asymmetric coordinates; nearest floors when
/// enlarging and rounds up when shrinking (onnxruntime's rule).
fn resize_10(c: &mut Ctx, x: Value, dims: &[usize], mode: String) -> Converted {
    let scales: Vec<f64> = match c.node.floats("scales") {
        Some(f) => f.iter().map(|&v| v as f64).collect(),
        None => match c.known(1) {
            Some(scales) => scales.to_f64_vec(),
            None => return unsupported("scales computed at run time"),
        },
    };
    if scales.len() != dims.len() {
        return Err(Fail::Invalid(format!(
            "{} scales for rank {}",
            scales.len(),
            dims.len()
        )));
    }
    refuse_integer_interpolation(c, x, &mode)?;
    let mut x = x;
    for (a, &scale) in scales.iter().enumerate() {
        let s = Sampling {
            mode: mode.clone(),
            transform: "asymmetric".into(),
            nearest: if scale >= 1.0 { "floor" } else { "ceil" }.into(),
            cubic_a: -0.75,
            exclude_outside: false,
        };
        x = resize_axes(c, &s, x, dims, &[a], &[scale], None)?[0];
    }
    Ok(vec![x])
}

/// `Upsample(mode)` (opsets 7 to 9): `Resize` of opset 10.
pub(super) fn upsample(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let dims = c.shape(x, "the input")?;
    let mode = c.node.string("mode")?.unwrap_or_else(|| "nearest".into());
    // Upsample only enlarges: ONNX asks for scales of at least 1.
    let scales = match c.node.floats("scales") {
        Some(f) => f.iter().map(|&v| v as f64).collect(),
        None => c.known(1).map(|s| s.to_f64_vec()).unwrap_or_default(),
    };
    if let Some(s) = scales.iter().find(|&&s| s < 1.0 || s.is_nan()) {
        return Err(Fail::Invalid(format!(
            "the scales {scales:?} of the input {dims:?} include {s}: Upsample's scales should \
             be at least 1"
        )));
    }
    resize_10(c, x, &dims, mode)
}
