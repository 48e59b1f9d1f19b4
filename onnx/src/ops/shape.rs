//! Shape and layout ops. Shapes, axes, pads and repeats must be known when importing (they
//! usually are: initializers, constants, or shape arithmetic the importer folds).

use crate::context::{Converted, Ctx, Fail, axis, check_elements, unsupported};
use crate::symbolic::Entry;
use crate::tensor;
use kiln_backend::Array;
use kiln_ir::{AxisSlice, DType, Dim, Literal, Shape, Type, Value};

/// The dimensions of `v`.
fn dims(c: &Ctx, v: Value) -> Vec<Dim> {
    c.b.value_type(v).shape.dims().to_vec()
}

/// The product of `dims`: fixed, or one symbol times 1s; `None` otherwise.
fn product(dims: &[Dim]) -> Option<Dim> {
    let fixed: usize = dims.iter().filter_map(Dim::as_fixed).product();
    let symbols: Vec<&Dim> = dims.iter().filter(|d| d.as_fixed().is_none()).collect();
    match (symbols.as_slice(), fixed) {
        ([], n) => Some(Dim::Fixed(n)),
        ([s], 1) => Some((*s).clone()),
        _ => None,
    }
}

/// The shape whose sizes are `entries` (none may be negative).
fn shape_of(entries: &[Entry]) -> Result<Shape, Fail> {
    let dims = (entries.iter())
        .map(|e| match e {
            Entry::Int(n) if *n >= 0 => Ok(Dim::Fixed(*n as usize)),
            Entry::Int(n) => Err(Fail::Invalid(format!("a size of {n}"))),
            Entry::Sym(s) => Ok(Dim::Sym(s.clone())),
        })
        .collect::<Result<_, _>>()?;
    Ok(Shape(dims))
}

/// `Reshape`: 0 copies the input's dimension (unless `allowzero`), −1 takes what is left.
pub(super) fn reshape(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let target: Vec<Entry> = match c.node.opset < 5 {
        true => (c
            .node
            .ints("shape")
            .ok_or("attribute shape is required")?
            .iter())
        .map(|&i| Entry::Int(i))
        .collect(),
        false => {
            c.known_shape(1, "the shape")?
                .ok_or("input shape is required")?
                .entries
        }
    };
    let allow_zero = c.node.int("allowzero", 0)? != 0;
    let input = dims(c, x);
    let mut out: Vec<Option<Dim>> = Vec::with_capacity(target.len());
    for (i, t) in target.iter().enumerate() {
        out.push(match *t {
            Entry::Sym(ref s) => Some(Dim::Sym(s.clone())),
            Entry::Int(-1) => None,
            Entry::Int(0) if !allow_zero => {
                Some((input.get(i).cloned()).ok_or("shape copies a dimension the input lacks")?)
            }
            Entry::Int(t) if t >= 0 => Some(Dim::Fixed(t as usize)),
            Entry::Int(t) => return Err(Fail::Invalid(format!("shape entry {t} is negative"))),
        });
    }
    let shape = resolve_inferred(&input, out)?;
    Ok(vec![c.b.reshape(x, Shape(shape))?])
}

/// Fills the one `None` of `out` so that it holds as many elements as `input`.
fn resolve_inferred(input: &[Dim], out: Vec<Option<Dim>>) -> Result<Vec<Dim>, Fail> {
    let unknown = out.iter().filter(|d| d.is_none()).count();
    if unknown > 1 {
        return Err("the shape has more than one -1".into());
    }
    if unknown == 0 {
        return Ok(out.into_iter().map(Option::unwrap).collect());
    }
    // Cancel the target's known dimensions against the input's, symbols by name.
    let mut rest: Vec<Dim> = input.to_vec();
    let mut divisor = 1usize;
    for d in out.iter().flatten() {
        match d.as_fixed() {
            Some(n) => {
                divisor = divisor.checked_mul(n).ok_or("the shape's size overflows")?;
            }
            None => match rest.iter().position(|r| r == d) {
                Some(p) => {
                    rest.remove(p);
                }
                None => return unsupported("a -1 in a reshape whose symbolic sizes do not cancel"),
            },
        }
    }
    let inferred = match product(&rest) {
        Some(Dim::Fixed(n)) if divisor > 0 && n % divisor == 0 => Dim::Fixed(n / divisor),
        Some(Dim::Fixed(n)) => {
            return Err(Fail::Invalid(format!(
                "{n} elements do not divide into the shape"
            )));
        }
        Some(sym) if divisor == 1 => sym,
        _ => return unsupported("a -1 in a reshape whose symbolic sizes do not cancel"),
    };
    Ok(out
        .into_iter()
        .map(|d| d.unwrap_or_else(|| inferred.clone()))
        .collect())
}

/// `Flatten(axis)`: `[prod(..axis), prod(axis..)]`.
pub(super) fn flatten(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = dims(c, x);
    let a = match c.node.int("axis", 1)? {
        a if a == d.len() as i64 => d.len(),
        a => axis(a, d.len())?,
    };
    let (outer, inner) = (product(&d[..a]), product(&d[a..]));
    let (Some(outer), Some(inner)) = (outer, inner) else {
        return unsupported("flattening several symbolic dimensions together");
    };
    Ok(vec![c.b.reshape(x, Shape(vec![outer, inner]))?])
}

/// `Concat(axis)`.
pub(super) fn concat(c: &mut Ctx) -> Converted {
    let xs = (0..c.count())
        .map(|i| c.input(i))
        .collect::<Result<Vec<_>, _>>()?;
    if xs.is_empty() {
        return Err("Concat needs at least one input".into());
    }
    let a = axis(
        c.node
            .int_opt("axis")?
            .ok_or("attribute axis is required")?,
        c.rank(xs[0]),
    )?;
    Ok(vec![c.b.concat(&xs, a)?])
}

/// `Transpose(perm)`, reversing the axes by default.
pub(super) fn transpose(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let rank = c.rank(x);
    let perm = match c.node.ints("perm") {
        Some(p) => p
            .iter()
            .map(|&a| axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).rev().collect(),
    };
    Ok(vec![c.b.transpose(x, perm)?])
}

/// The axes of an `Unsqueeze` or `Squeeze`: an attribute before opset 13, an input after.
fn axes_operand(c: &Ctx) -> Result<Option<Vec<i64>>, Fail> {
    match c.node.opset < 13 {
        true => Ok(c.node.ints("axes").map(<[i64]>::to_vec)),
        false => c.known_ints(1, "the axes"),
    }
}

/// The first axis `axes` names more than once.
fn repeated(axes: &[usize]) -> Option<usize> {
    (axes.iter().enumerate())
        .find(|&(i, a)| axes[..i].contains(a))
        .map(|(_, &a)| a)
}

/// `Unsqueeze(axes)`: axes of size 1 inserted (axes index the result).
pub(super) fn unsqueeze(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let mut d = dims(c, x);
    let given = axes_operand(c)?.ok_or("axes are required")?;
    let rank = d.len() + given.len();
    let mut axes = given
        .iter()
        .map(|&a| axis(a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    // Each axis is one new size-1 axis of the result: a repeat would leave it an axis short.
    if let Some(a) = repeated(&axes) {
        return Err(Fail::Invalid(format!(
            "the axes {given:?} name axis {a} of the rank-{rank} result twice"
        )));
    }
    axes.sort_unstable();
    for a in axes {
        d.insert(a, Dim::Fixed(1));
    }
    Ok(vec![c.b.reshape(x, Shape(d))?])
}

/// `Squeeze(axes)`: the given axes of size 1 removed, or every axis of size 1.
pub(super) fn squeeze(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = dims(c, x);
    let axes = match axes_operand(c)? {
        Some(axes) => axes
            .iter()
            .map(|&a| axis(a, d.len()))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..d.len()).filter(|&a| d[a].is_one()).collect(),
    };
    if let Some(&a) = axes.iter().find(|&&a| !d[a].is_one()) {
        // A symbolic size may be 1 when run (ONNX leaves that check to run time); Kiln cannot
        // drop an axis it does not know to be 1.
        return match d[a] {
            Dim::Fixed(n) => Err(Fail::Invalid(format!("axis {a} has size {n}, not 1"))),
            Dim::Sym(_) => unsupported(format!("squeezing axis {a} of symbolic size {}", d[a])),
        };
    }
    let kept = (0..d.len())
        .filter(|a| !axes.contains(a))
        .map(|a| d[a].clone())
        .collect();
    Ok(vec![c.b.reshape(x, Shape(kept))?])
}

/// `Gather(axis)`; negative indices count from the end.
pub(super) fn gather(c: &mut Ctx) -> Converted {
    let table = c.input(0)?;
    let d = dims(c, table);
    let a = axis(c.node.int("axis", 0)?, d.len())?;
    let indices = match (c.known(1), d[a].as_fixed()) {
        (Some(known), Some(size)) => {
            index_dtype(known.dtype())?;
            let shape = known.shape().to_vec();
            let mut fixed = Vec::with_capacity(known.len());
            for i in known.to_f64_vec() {
                let i = i as i64;
                let j = if i < 0 { i + size as i64 } else { i };
                if !(0..size as i64).contains(&j) {
                    return Err(Fail::Invalid(format!(
                        "index {i} is out of range for size {size}"
                    )));
                }
                fixed.push(j);
            }
            let ty = Type::new(DType::I64, Shape::fixed(&shape));
            c.b.constant(Literal::I64(fixed), ty)?
        }
        _ => {
            let idx = c.input(1)?;
            index_dtype(c.dtype(idx))?;
            let in_range = c.node.proto.doc_string.as_deref() == Some(crate::GATHER_IN_RANGE_DOC);
            match d[a].as_fixed() {
                Some(size) if !in_range => c.wrap_negative(idx, size)?,
                // A symbolic size, or Kiln's own `gather` exported: negative indices are
                // refused when run.
                _ => idx,
            }
        }
    };
    Ok(vec![c.b.gather(table, indices, a)?])
}

/// Refuses indices that are not int32 or int64, as ONNX's `Gather` does (float indices known
/// when importing would otherwise be truncated to integers).
fn index_dtype(dtype: DType) -> Result<(), Fail> {
    match dtype {
        DType::I32 | DType::I64 => Ok(()),
        other => Err(Fail::Invalid(format!(
            "the indices should be int32 or int64, not {other}"
        ))),
    }
}

/// `Shape(start, end)`: the input's dimensions, when static.
pub(super) fn shape(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = c.shape(x, "the shape")?;
    let rank = d.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
    let start = clamp(c.node.int("start", 0)?);
    let end = clamp(c.node.int("end", rank)?);
    let dims: Vec<i64> = d[start..end.max(start)].iter().map(|&n| n as i64).collect();
    Ok(vec![c.i64s(&dims)?])
}

/// `Size`: the input's element count.
pub(super) fn size(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let n: usize = c.shape(x, "the size")?.iter().product();
    Ok(vec![c.b.constant(
        Literal::I64(vec![n as i64]),
        Type::scalar(DType::I64),
    )?])
}

/// ONNX's rule for one slice bound: negative counts from the end, then clamped.
fn clamp_bound(v: i64, size: i64, step: i64, is_start: bool) -> i64 {
    let v = if v < 0 { v.saturating_add(size) } else { v };
    match (step > 0, is_start) {
        (true, _) => v.clamp(0, size),
        (false, true) if size == 0 => -1,
        (false, true) => v.clamp(0, size - 1),
        (false, false) => v.clamp(-1, size - 1),
    }
}

/// `Slice`: bounds as attributes (before opset 10) or inputs; negative steps reverse.
pub(super) fn slice(c: &mut Ctx) -> Converted {
    let mut x = c.input(0)?;
    let d = dims(c, x);
    let (starts, ends, axes, steps) = match c.node.opset < 10 {
        true => {
            let get = |n: &str| c.node.ints(n).map(<[i64]>::to_vec);
            (get("starts"), get("ends"), get("axes"), None)
        }
        false => (
            c.known_ints(1, "starts")?,
            c.known_ints(2, "ends")?,
            c.known_ints(3, "axes")?,
            c.known_ints(4, "steps")?,
        ),
    };
    let (starts, ends) = (
        starts.ok_or("starts are required")?,
        ends.ok_or("ends are required")?,
    );
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let wrapped = (axes.iter())
        .map(|&a| axis(a, d.len()))
        .collect::<Result<Vec<_>, _>>()?;
    // A repeated axis would be sliced twice, the second range applied to the first's result.
    if let Some(a) = repeated(&wrapped) {
        return Err(Fail::Invalid(format!(
            "the axes {axes:?} name axis {a} of the rank-{} input twice",
            d.len()
        )));
    }
    let mut ranges = vec![AxisSlice::Full; d.len()];
    let mut reversed = Vec::new();
    for (i, &a) in wrapped.iter().enumerate() {
        let size = d[a]
            .as_fixed()
            .ok_or_else(|| Fail::Unsupported(format!("slicing symbolic axis {a}")))?
            as i64;
        let step = steps[i];
        if step == 0 {
            return Err("a step of 0".into());
        }
        let (start, end) = (
            clamp_bound(starts[i], size, step, true),
            clamp_bound(ends[i], size, step, false),
        );
        if step > 0 {
            let end = end.max(start);
            ranges[a] = AxisSlice::Range {
                start: start as usize,
                end: end as usize,
                step: step as usize,
            };
        } else {
            // Walking backwards: the indices start, start+step, … while above end.
            let picked: Vec<i64> = (0..)
                .map_while(|k: i64| start.checked_add(k.checked_mul(step)?))
                .take_while(|&j| j > end)
                .collect();
            reversed.push((a, picked));
        }
    }
    if ranges.iter().any(|r| *r != AxisSlice::Full) {
        x = c.b.slice(x, ranges)?;
    }
    for (a, picked) in reversed {
        let idx = c.i64s(&picked)?;
        x = c.b.gather(x, idx, a)?;
    }
    Ok(vec![x])
}

/// `Split(axis, split | num_outputs)`.
pub(super) fn split(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = dims(c, x);
    let a = axis(c.node.int("axis", 0)?, d.len())?;
    let size = d[a]
        .as_fixed()
        .ok_or_else(|| Fail::Unsupported(format!("splitting symbolic axis {a}")))?;
    let parts = c.node.proto.output.len();
    // From opset 18 `num_outputs` counts the parts; the node's outputs must be those parts.
    if c.node.opset >= 18
        && let Some(n) = c.node.int_opt("num_outputs")?
        && n != parts as i64
    {
        return Err(Fail::Invalid(format!(
            "num_outputs={n}, but the node has {parts} outputs"
        )));
    }
    let sizes = match c.node.opset < 13 {
        true => c.node.ints("split").map(<[i64]>::to_vec),
        false => c.known_ints(1, "split")?,
    };
    let sizes: Vec<usize> = match sizes {
        Some(s) => s
            .iter()
            .map(|&n| usize::try_from(n).map_err(|_| "a negative split"))
            .collect::<Result<_, _>>()?,
        None => equal_parts(c, a, size, parts)?,
    };
    let total = sizes.iter().try_fold(0usize, |t, &n| t.checked_add(n));
    if total != Some(size) || sizes.len() != parts {
        return Err(Fail::Invalid(format!(
            "split sizes {sizes:?} do not cover axis {a} of size {size} in {parts} parts"
        )));
    }
    let mut start = 0;
    let mut outs = Vec::with_capacity(parts);
    for n in sizes {
        let mut ranges = vec![AxisSlice::Full; d.len()];
        ranges[a] = AxisSlice::Range {
            start,
            end: start + n,
            step: 1,
        };
        outs.push(c.b.slice(x, ranges)?);
        start += n;
    }
    Ok(outs)
}

/// The sizes of `parts` equal parts of axis `a` of `size`. Before opset 18 the parts must be
/// equal; from 18 the last may be smaller.
fn equal_parts(c: &Ctx, a: usize, size: usize, parts: usize) -> Result<Vec<usize>, Fail> {
    if c.node.opset < 18 && !size.is_multiple_of(parts.max(1)) {
        return Err(Fail::Invalid(format!(
            "axis {a} of size {size} does not split into {parts} equal parts, and no split \
             sizes are given"
        )));
    }
    let chunk = size.div_ceil(parts.max(1));
    Ok((0..parts)
        .map(|i| chunk.min(size.saturating_sub(i * chunk)))
        .collect())
}

/// `Expand(x, shape)`: broadcasting in both directions.
pub(super) fn expand(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let target = c
        .known_shape(1, "the shape")?
        .ok_or("input shape is required")?;
    let target = shape_of(&target.entries)?;
    let shape = Shape::broadcast(&c.ty(x).shape, &target)
        .ok_or_else(|| format!("{} does not broadcast with {target}", c.ty(x).shape))?;
    Ok(vec![c.b.broadcast_to(x, &shape)?])
}

/// `Tile(x, repeats)`: each axis `d` becomes `r·d` by a broadcast over a new axis.
pub(super) fn tile(c: &mut Ctx) -> Converted {
    let x = c.input(0)?;
    let d = c.shape(x, "the input")?;
    let repeats = c
        .known_ints(1, "repeats")?
        .ok_or("input repeats is required")?;
    if repeats.len() != d.len() || repeats.iter().any(|&r| r < 0) {
        return Err(Fail::Invalid(format!(
            "repeats {repeats:?} do not fit rank {}",
            d.len()
        )));
    }
    let interleaved: Vec<usize> = d.iter().flat_map(|&n| [1, n]).collect();
    let spread: Vec<usize> = d
        .iter()
        .zip(&repeats)
        .flat_map(|(&n, &r)| [r as usize, n])
        .collect();
    let tiled: Vec<usize> = (d.iter().zip(&repeats))
        .map(|(&n, &r)| (r as usize).checked_mul(n))
        .collect::<Option<_>>()
        .ok_or("the tiled size overflows")?;
    check_elements(&tiled)?;
    let y = c.b.reshape(x, Shape::fixed(&interleaved))?;
    let y = c.b.broadcast_to(y, &Shape::fixed(&spread))?;
    Ok(vec![c.b.reshape(y, Shape::fixed(&tiled))?])
}

/// `Pad(mode)`: constant (any value), edge, reflect or wrap; negative pads crop.
pub(super) fn pad(c: &mut Ctx) -> Converted {
    let mut x = c.input(0)?;
    let d = c.shape(x, "the input")?;
    let rank = d.len();
    let (pads, value) = match c.node.opset < 11 {
        true => (
            c.node
                .ints("pads")
                .map(<[i64]>::to_vec)
                .ok_or("attribute pads is required")?,
            c.node.float("value", 0.0)? as f64,
        ),
        false => (
            c.known_ints(1, "pads")?.ok_or("input pads is required")?,
            c.known_scalar(2, "the constant value")?.unwrap_or(0.0),
        ),
    };
    let axes = match c.known_ints(3, "axes")? {
        Some(a) => a
            .iter()
            .map(|&a| axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(Fail::Invalid(format!(
            "{} pads for {} axes",
            pads.len(),
            axes.len()
        )));
    }
    let mode = c.node.string("mode")?.unwrap_or_else(|| "constant".into());
    let (mut low, mut high) = (vec![0i64; rank], vec![0i64; rank]);
    for (k, &a) in axes.iter().enumerate() {
        (low[a], high[a]) = (pads[k], pads[k + axes.len()]);
        check_crop(a, d[a], low[a], high[a])?;
    }
    // Negative pads crop first.
    let crops: Vec<AxisSlice> = (0..rank)
        .map(|a| {
            let crop = |p: i64| p.saturating_neg().max(0) as usize;
            let (lo, hi) = (crop(low[a]), crop(high[a]));
            match lo + hi {
                0 => AxisSlice::Full,
                _ => AxisSlice::Range {
                    start: lo.min(d[a]),
                    end: d[a].saturating_sub(hi).max(lo.min(d[a])),
                    step: 1,
                },
            }
        })
        .collect();
    if crops.iter().any(|r| *r != AxisSlice::Full) {
        x = c.b.slice(x, crops)?;
    }
    let low: Vec<usize> = low.iter().map(|&p| p.max(0) as usize).collect();
    let high: Vec<usize> = high.iter().map(|&p| p.max(0) as usize).collect();
    let padded: Vec<usize> = (0..rank)
        .map(|a| d[a].checked_add(low[a])?.checked_add(high[a]))
        .collect::<Option<_>>()
        .ok_or("the padded size overflows")?;
    check_elements(&padded)?;
    match mode.as_str() {
        "constant" => pad_constant(c, x, low, high, value),
        "edge" | "reflect" | "wrap" => {
            let d = c.shape(x, "the input")?;
            for a in 0..rank {
                if low[a] + high[a] == 0 {
                    continue;
                }
                let idx = pad_indices(&mode, d[a], low[a], high[a])?;
                let idx = c.i64s(&idx)?;
                x = c.b.gather(x, idx, a)?;
            }
            Ok(vec![x])
        }
        other => Err(Fail::Invalid(format!("pad mode {other:?}"))),
    }
}

/// Refuses negative pads that crop more than axis `a` of `size` holds: a negative result size
/// is invalid, and a crop past the axis refilled by padding on its other side is not
/// implemented (the crop below stops at the axis, keeping too much).
fn check_crop(a: usize, size: usize, low: i64, high: i64) -> Result<(), Fail> {
    let crop = |p: i64| p.min(0).saturating_neg();
    if crop(low).saturating_add(crop(high)) <= size as i64 {
        return Ok(());
    }
    let result = (size as i64).saturating_add(low).saturating_add(high);
    match result < 0 {
        true => Err(Fail::Invalid(format!(
            "pads {low} and {high} on axis {a} of size {size} leave {result} elements"
        ))),
        false => unsupported(format!(
            "pads {low} and {high} that crop more than axis {a} of size {size} holds"
        )),
    }
}

/// Zero padding, then `value` where the padding went.
fn pad_constant(c: &mut Ctx, x: Value, low: Vec<usize>, high: Vec<usize>, value: f64) -> Converted {
    let interior = vec![0; low.len()];
    let padded = c.b.pad(x, low.clone(), high.clone(), interior.clone())?;
    if value == 0.0 {
        return Ok(vec![padded]);
    }
    let t = c.ty(x);
    let yes = c.scalar(DType::Bool, 1.0)?;
    let inside = c.b.broadcast_to(yes, &t.shape)?;
    let inside = c.b.pad(inside, low, high, interior)?;
    let fill = c.scalar(t.dtype, value)?;
    Ok(vec![c.b.select(inside, padded, fill)?])
}

/// The source index of each position of a padded axis.
fn pad_indices(mode: &str, size: usize, low: usize, high: usize) -> Result<Vec<i64>, Fail> {
    if size == 0 || (mode == "reflect" && size < 2 && low + high > 0) {
        return Err(Fail::Invalid(format!(
            "cannot {mode}-pad an axis of size {size}"
        )));
    }
    let n = size as i64;
    let source = |i: i64| -> i64 {
        match mode {
            "edge" => i.clamp(0, n - 1),
            "wrap" => i.rem_euclid(n),
            _ => {
                let period = 2 * (n - 1);
                let m = i.rem_euclid(period);
                if m < n { m } else { period - m }
            }
        }
    };
    Ok((0..(size + low + high) as i64)
        .map(|i| source(i - low as i64))
        .collect())
}

/// `Range(start, limit, delta)`, all known when importing.
pub(super) fn range(c: &mut Ctx) -> Converted {
    let Some(start) = c.known(0) else {
        return unsupported("a Range whose bounds are computed at run time");
    };
    let dtype = start.dtype();
    let get = |i: usize, what: &str| {
        c.known_scalar(i, what)?
            .ok_or_else(|| Fail::Invalid(format!("{what} is required")))
    };
    let (s, l, delta) = (get(0, "start")?, get(1, "limit")?, get(2, "delta")?);
    if delta == 0.0 {
        return Err("delta is 0".into());
    }
    let n = ((l - s) / delta).ceil().max(0.0);
    if !n.is_finite() || n > u32::MAX as f64 {
        return Err(Fail::Invalid(format!("a Range of {n} elements")));
    }
    let n = n as usize;
    check_elements(&[n])?;
    let values: Vec<f64> = (0..n).map(|i| s + i as f64 * delta).collect();
    let array = Array::F64(
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[n]), values).map_err(|e| e.to_string())?,
    );
    Ok(vec![c.constant(&array.cast(dtype))?])
}

/// `ConstantOfShape(value)`.
pub(super) fn constant_of_shape(c: &mut Ctx) -> Converted {
    let shape = c
        .known_shape(0, "the shape")?
        .ok_or("input shape is required")?;
    let shape = shape_of(&shape.entries)?;
    let value = match c.node.tensor("value")? {
        Some(t) => tensor::to_array(t, None)?,
        None => Array::zeros(DType::F32, &[1]),
    };
    if value.len() != 1 {
        return Err("value should have one element".into());
    }
    let scalar =
        c.b.constant(value.to_literal(), Type::scalar(value.dtype()))?;
    Ok(vec![c.b.broadcast_to(scalar, &shape)?])
}

/// `Constant(value | value_float | value_floats | value_int | value_ints)`.
pub(super) fn constant(c: &mut Ctx) -> Converted {
    let n = c.node;
    let array = if let Some(t) = n.tensor("value")? {
        tensor::to_array(t, None)?
    } else if n.attr("value_float").is_some() {
        vec_array(DType::F32, &[n.float("value_float", 0.0)? as f64], &[])
    } else if let Some(v) = n.floats("value_floats") {
        vec_array(
            DType::F32,
            &v.iter().map(|&x| x as f64).collect::<Vec<_>>(),
            &[v.len()],
        )
    } else if n.attr("value_int").is_some() {
        Array::I64(ndarray::arr0(n.int("value_int", 0)?).into_dyn())
    } else if let Some(v) = n.ints("value_ints") {
        Array::I64(
            ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[v.len()]), v.to_vec())
                .map_err(|e| e.to_string())?,
        )
    } else {
        return unsupported("a Constant that is not a dense numeric tensor");
    };
    Ok(vec![c.constant(&array)?])
}

fn vec_array(dtype: DType, values: &[f64], shape: &[usize]) -> Array {
    let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values.to_vec())
        .expect("shape fits");
    Array::F64(a).cast(dtype)
}

/// `DepthToSpace(blocksize, mode)` and `SpaceToDepth(blocksize)`: a reshape, a transpose and a
/// reshape.
pub(super) fn depth_space(c: &mut Ctx, to_space: bool) -> Converted {
    let x = c.input(0)?;
    let [n, ch, h, w]: [usize; 4] = c
        .shape(x, "the input")?
        .try_into()
        .map_err(|_| "the input should be [N, C, H, W]")?;
    let bs = c.node.positive("blocksize", None)?;
    if bs > ch.max(h).max(w).max(1) {
        return Err(Fail::Invalid(format!(
            "blocksize {bs} is larger than the input"
        )));
    }
    let (split, perm, out) = if to_space {
        if ch % (bs * bs) != 0 {
            return Err("channels do not divide by blocksize²".into());
        }
        let c2 = ch / (bs * bs);
        match c.node.string("mode")?.as_deref() {
            None | Some("DCR") => (
                vec![n, bs, bs, c2, h, w],
                vec![0, 3, 4, 1, 5, 2],
                [n, c2, h * bs, w * bs],
            ),
            Some("CRD") => (
                vec![n, c2, bs, bs, h, w],
                vec![0, 1, 4, 2, 5, 3],
                [n, c2, h * bs, w * bs],
            ),
            Some(m) => return Err(Fail::Invalid(format!("mode {m:?}"))),
        }
    } else {
        if h % bs != 0 || w % bs != 0 {
            return Err("height and width do not divide by blocksize".into());
        }
        let perm = match c.node.string("mode")?.as_deref() {
            None | Some("DCR") => vec![0, 3, 5, 1, 2, 4],
            Some("CRD") => vec![0, 1, 3, 5, 2, 4],
            Some(m) => return Err(Fail::Invalid(format!("mode {m:?}"))),
        };
        (
            vec![n, ch, h / bs, bs, w / bs, bs],
            perm,
            [n, ch * bs * bs, h / bs, w / bs],
        )
    };
    let y = c.b.reshape(x, Shape::fixed(&split))?;
    let y = c.b.transpose(y, perm)?;
    Ok(vec![c.b.reshape(y, Shape::fixed(&out))?])
}
