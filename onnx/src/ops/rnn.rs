//! `RNN`, `GRU` and `LSTM` with ONNX's gate orders (`iofc` for LSTM, `zrh` for GRU), both
//! biases, initial states, peepholes, `clip`, every direction and both layouts — unrolled over
//! the sequence, whose length must be static. The input projection of all steps is one matrix
//! product per direction.

use crate::context::{Converted, Ctx, Fail, unsupported};
use kiln_ir::{AxisSlice, Dim, Shape, Value};

/// The longest sequence unrolled: about 27 instructions a step, so 1.8 M instructions, which
/// the default pipeline takes about a minute over (BENCHMARKS.md, "Regions too large"). A
/// longer one is refused by name rather than exhausting memory while it is unrolled.
const MAX_UNROLLED_STEPS: usize = 65_536;

/// Which recurrent op.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Cell {
    /// `RNN`: one gate.
    Rnn,
    /// `GRU`: gates z, r, h.
    Gru,
    /// `LSTM`: gates i, o, f, c.
    Lstm,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// The attributes and shapes every step needs.
struct Setup {
    cell: Cell,
    hidden: usize,
    batch: Dim,
    clip: Option<f64>,
    activations: Vec<String>,
    linear_before_reset: bool,
    /// 1 when the states are `[N, D, H]` rather than `[D, N, H]`.
    layout: i64,
}

/// Rows `[from, from + n)` of `x`'s axis `axis`.
fn rows(c: &mut Ctx, x: Value, axis: usize, from: usize, n: usize) -> Result<Value, Fail> {
    let mut ranges = vec![AxisSlice::Full; c.rank(x)];
    ranges[axis] = AxisSlice::Range {
        start: from,
        end: from + n,
        step: 1,
    };
    Ok(c.b.slice(x, ranges)?)
}

/// `x[d]` of a `[directions, ...]` input, without its first axis.
fn direction(c: &mut Ctx, x: Value, d: usize) -> Result<Value, Fail> {
    let s = rows(c, x, 0, d, 1)?;
    let dims = c.ty(s).shape.dims()[1..].to_vec();
    Ok(c.b.reshape(s, Shape(dims))?)
}

fn activation(c: &mut Ctx, name: &str, x: Value) -> Result<Value, Fail> {
    Ok(match name {
        "Sigmoid" => c.b.sigmoid(x)?,
        "Tanh" => c.b.tanh(x)?,
        "Relu" => c.b.relu(x)?,
        other => return unsupported(format!("the recurrent activation {other}")),
    })
}

fn clipped(c: &mut Ctx, x: Value, clip: Option<f64>) -> Result<Value, Fail> {
    let Some(limit) = clip else { return Ok(x) };
    let dtype = c.dtype(x);
    let (lo, hi) = (c.scalar(dtype, -limit)?, c.scalar(dtype, limit)?);
    let x = c.b.maximum(x, lo)?;
    Ok(c.b.minimum(x, hi)?)
}

/// Gate `g` of a `[batch, gates·H]` value.
fn gate(c: &mut Ctx, z: Value, g: usize, hidden: usize) -> Result<Value, Fail> {
    rows(c, z, 1, g * hidden, hidden)
}

/// `f(gate g of xw + gate g of hr (+ extra))`, clipped first.
fn gate_act(
    c: &mut Ctx,
    s: &Setup,
    sums: [Value; 2],
    g: usize,
    act: usize,
    extra: Option<Value>,
) -> Result<Value, Fail> {
    let (a, b) = (
        gate(c, sums[0], g, s.hidden)?,
        gate(c, sums[1], g, s.hidden)?,
    );
    let mut z = c.b.add(a, b)?;
    if let Some(e) = extra {
        z = c.b.add(z, e)?;
    }
    let z = clipped(c, z, s.clip)?;
    activation(c, &s.activations[act].clone(), z)
}

/// One step: the new hidden (and cell) state from the projected input `xw` `[batch, G·H]`.
fn step(
    c: &mut Ctx,
    s: &Setup,
    xw: Value,
    weights: &Recurrent,
    h: Value,
    cell: Value,
) -> Result<(Value, Value), Fail> {
    let (hidden, Recurrent { r, rb, peep }) = (s.hidden, *weights);
    let hr = c.b.matmul_t(h, r, false, true)?;
    let hr = c.b.add(hr, rb)?;
    match s.cell {
        Cell::Rnn => Ok((gate_act(c, s, [xw, hr], 0, 0, None)?, cell)),
        Cell::Lstm => {
            let p = |c: &mut Ctx, k: usize, state: Value| -> Result<Option<Value>, Fail> {
                let Some(peep) = peep else { return Ok(None) };
                let pk = rows(c, peep, 0, k * hidden, hidden)?;
                Ok(Some(c.b.mul(pk, state)?))
            };
            let pi = p(c, 0, cell)?;
            let i = gate_act(c, s, [xw, hr], 0, 0, pi)?;
            let pf = p(c, 2, cell)?;
            let f = gate_act(c, s, [xw, hr], 2, 0, pf)?;
            let g = gate_act(c, s, [xw, hr], 3, 1, None)?;
            let fc = c.b.mul(f, cell)?;
            let ig = c.b.mul(i, g)?;
            let cell = c.b.add(fc, ig)?;
            let po = p(c, 1, cell)?;
            let o = gate_act(c, s, [xw, hr], 1, 0, po)?;
            let hc = activation(c, &s.activations[2].clone(), cell)?;
            Ok((c.b.mul(o, hc)?, cell))
        }
        Cell::Gru => {
            let z = gate_act(c, s, [xw, hr], 0, 0, None)?;
            let rg = gate_act(c, s, [xw, hr], 1, 0, None)?;
            let xh = gate(c, xw, 2, hidden)?;
            let hh = match s.linear_before_reset {
                true => {
                    let hh = gate(c, hr, 2, hidden)?;
                    c.b.mul(rg, hh)?
                }
                false => {
                    let rh = c.b.mul(rg, h)?;
                    let rn = rows(c, r, 0, 2 * hidden, hidden)?;
                    let rbn = rows(c, rb, 0, 2 * hidden, hidden)?;
                    let p = c.b.matmul_t(rh, rn, false, true)?;
                    c.b.add(p, rbn)?
                }
            };
            let pre = c.b.add(xh, hh)?;
            let pre = clipped(c, pre, s.clip)?;
            let n = activation(c, &s.activations[1].clone(), pre)?;
            let one = c.scalar(c.dtype(z), 1.0)?;
            let keep = c.b.sub(one, z)?;
            let new = c.b.mul(keep, n)?;
            let old = c.b.mul(z, h)?;
            Ok((c.b.add(new, old)?, cell))
        }
    }
}

/// A direction's recurrent weights `[G·H, H]`, their bias and the LSTM's peepholes.
#[derive(Clone, Copy)]
struct Recurrent {
    r: Value,
    rb: Value,
    peep: Option<Value>,
}

/// Values `[batch, H]` stacked along a new first axis.
fn stack(c: &mut Ctx, values: &[Value], s: &Setup) -> Result<Value, Fail> {
    let shape = Shape(vec![Dim::Fixed(1), s.batch.clone(), Dim::Fixed(s.hidden)]);
    let parts = values
        .iter()
        .map(|&v| c.b.reshape(v, shape.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(c.b.concat(&parts, 0)?)
}

/// `RNN`, `GRU` or `LSTM`.
pub(super) fn recurrent(c: &mut Ctx, cell: Cell) -> Converted {
    let mut x = c.input(0)?;
    let layout = c.node.int("layout", 0)?;
    if layout == 1 {
        x = c.b.transpose(x, vec![1, 0, 2])?;
    }
    let d = c.ty(x).shape.dims().to_vec();
    if d.len() != 3 {
        return Err(Fail::Invalid(format!(
            "X should be [T, N, D], not rank {}",
            d.len()
        )));
    }
    let steps = d[0]
        .as_fixed()
        .ok_or_else(|| Fail::Unsupported("a symbolic sequence length".into()))?;
    if steps > MAX_UNROLLED_STEPS {
        return Err(Fail::Unsupported(format!(
            "a sequence of {steps} steps (the sequence is unrolled; at most \
             {MAX_UNROLLED_STEPS} steps are)"
        )));
    }
    let hidden = hidden_size(c)?;
    if let Some(lens) = c.known(4) {
        if lens.to_f64_vec().iter().any(|&l| l as usize != steps) {
            return unsupported("sequence_lens shorter than the sequence");
        }
    } else if c.has(4) {
        return unsupported("sequence_lens computed at run time");
    }
    c.node.refuse_int("input_forget", 0)?;
    let directions: &[bool] = match c.node.string("direction")?.as_deref().unwrap_or("forward") {
        "forward" => &[false],
        "reverse" => &[true],
        "bidirectional" => &[false, true],
        other => return Err(Fail::Invalid(format!("direction {other:?}"))),
    };
    check_shapes(c, cell, hidden, directions.len(), &d, layout)?;
    let mut activations: Vec<String> = match c.node.attr("activations") {
        Some(a) => a
            .strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        None => Vec::new(),
    };
    if activations.is_empty() {
        for _ in directions {
            activations.extend(cell.default_activations().iter().map(|s| s.to_string()));
        }
    }
    let per_direction = cell.default_activations().len();
    if activations.len() != per_direction * directions.len() {
        return Err(Fail::Invalid(format!(
            "{} activations for {} directions",
            activations.len(),
            directions.len()
        )));
    }
    if c.node.floats("activation_alpha").is_some() || c.node.floats("activation_beta").is_some() {
        return unsupported("activation_alpha and activation_beta");
    }
    let clip = c.node.attr("clip").and_then(|a| a.f).map(f64::from);
    let linear_before_reset = c.node.int("linear_before_reset", 0)? != 0;
    let (mut ys, mut hs, mut cs) = (Vec::new(), Vec::new(), Vec::new());
    for (k, &reverse) in directions.iter().enumerate() {
        let setup = Setup {
            cell,
            hidden,
            batch: d[1].clone(),
            clip,
            activations: activations[k * per_direction..(k + 1) * per_direction].to_vec(),
            linear_before_reset,
            layout,
        };
        let (y, h, cl) = run_direction(c, &setup, x, k, reverse, steps)?;
        ys.push(y);
        hs.push(h);
        cs.push(cl);
    }
    finish(c, &ys, &hs, &cs, layout, cell, hidden, &d[1])
}

/// `hidden_size`, or (as ONNX allows it left out) the last size of R `[D, G·H, H]`.
fn hidden_size(c: &mut Ctx) -> Result<usize, Fail> {
    if c.node.attr("hidden_size").is_some() {
        return c.node.positive("hidden_size", None);
    }
    match input_shape(c, 2)?.as_deref() {
        Some([_, _, Dim::Fixed(h)]) if *h > 0 => Ok(*h),
        _ => unsupported("hidden_size left out, with R not of static shape [D, G·H, H]"),
    }
}

/// The shape of optional input `i`, read from a known array without making it a value.
fn input_shape(c: &mut Ctx, i: usize) -> Result<Option<Vec<Dim>>, Fail> {
    if let Some(a) = c.known(i) {
        return Ok(Some(a.shape().iter().map(|&n| Dim::Fixed(n)).collect()));
    }
    Ok(c.optional(i)?.map(|v| c.ty(v).shape.dims().to_vec()))
}

/// Refuses weights, biases and states not of ONNX's shapes: the lowering slices gates and
/// directions out of them by position, so a wrong size would give wrong gates (or directions)
/// rather than an error. `x` is X's `[T, N, D]` (in layout 0).
fn check_shapes(
    c: &mut Ctx,
    cell: Cell,
    hidden: usize,
    dirs: usize,
    x: &[Dim],
    layout: i64,
) -> Result<(), Fail> {
    let (f, gh, n) = (Dim::Fixed, cell.gates() * hidden, x[1].clone());
    // The states are [N, D, H] in layout 1.
    let state = match layout {
        1 => vec![n.clone(), f(dirs), f(hidden)],
        _ => vec![f(dirs), n.clone(), f(hidden)],
    };
    let mut expected = vec![
        (1, "W", vec![f(dirs), f(gh), x[2].clone()]),
        (2, "R", vec![f(dirs), f(gh), f(hidden)]),
        (3, "B", vec![f(dirs), f(2 * gh)]),
        (4, "sequence_lens", vec![n]),
        (5, "initial_h", state.clone()),
    ];
    if cell == Cell::Lstm {
        expected.push((6, "initial_c", state));
        expected.push((7, "P", vec![f(dirs), f(3 * hidden)]));
    }
    for (i, what, want) in expected {
        let Some(got) = input_shape(c, i)? else {
            continue;
        };
        if !same_shape(&got, &want) {
            return Err(Fail::Invalid(format!(
                "{what} {} should be {} (for {dirs} direction(s), {} gate(s) and \
                 hidden_size {hidden})",
                Shape(got),
                Shape(want),
                cell.gates()
            )));
        }
    }
    Ok(())
}

/// Whether `got` can be `want`: the same rank, and no two static sizes that differ (a symbolic
/// size is checked when the model runs).
fn same_shape(got: &[Dim], want: &[Dim]) -> bool {
    got.len() == want.len()
        && (got.iter().zip(want)).all(|(g, w)| match (g.as_fixed(), w.as_fixed()) {
            (Some(g), Some(w)) => g == w,
            _ => true,
        })
}

/// Stacks the directions' outputs: `Y` `[T, D, N, H]`, `Y_h` and `Y_c` `[D, N, H]` (layout 0).
#[allow(clippy::too_many_arguments)]
fn finish(
    c: &mut Ctx,
    ys: &[Value],
    hs: &[Value],
    cs: &[Value],
    layout: i64,
    cell: Cell,
    hidden: usize,
    batch: &Dim,
) -> Converted {
    let parts = (ys.iter())
        .map(|&y| {
            let mut dims = c.ty(y).shape.dims().to_vec();
            dims.insert(1, Dim::Fixed(1));
            c.b.reshape(y, Shape(dims))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut y = c.b.concat(&parts, 1)?;
    let setup_shape = Shape(vec![Dim::Fixed(1), batch.clone(), Dim::Fixed(hidden)]);
    let stack_states = |c: &mut Ctx, v: &[Value]| -> Result<Value, Fail> {
        let parts = v
            .iter()
            .map(|&s| c.b.reshape(s, setup_shape.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(c.b.concat(&parts, 0)?)
    };
    let mut h = stack_states(c, hs)?;
    let mut cl = stack_states(c, cs)?;
    if layout == 1 {
        y = c.b.transpose(y, vec![2, 0, 1, 3])?;
        h = c.b.transpose(h, vec![1, 0, 2])?;
        cl = c.b.transpose(cl, vec![1, 0, 2])?;
    }
    Ok(match cell {
        Cell::Lstm => vec![y, h, cl],
        _ => vec![y, h],
    })
}

/// One direction over the whole sequence: every step's `h` `[T, N, H]`, the last `h` and `c`.
fn run_direction(
    c: &mut Ctx,
    s: &Setup,
    x: Value,
    k: usize,
    reverse: bool,
    steps: usize,
) -> Result<(Value, Value, Value), Fail> {
    let gh = s.cell.gates() * s.hidden;
    let w = c.input(1)?;
    let w = direction(c, w, k)?;
    let r = c.input(2)?;
    let r = direction(c, r, k)?;
    let dtype = c.dtype(x);
    let (wb, rb) = match c.optional(3)? {
        Some(b) => {
            let b = direction(c, b, k)?;
            (rows(c, b, 0, 0, gh)?, rows(c, b, 0, gh, gh)?)
        }
        None => {
            let zero = c.scalar(dtype, 0.0)?;
            let z = c.b.broadcast_to(zero, &Shape::fixed(&[gh]))?;
            (z, z)
        }
    };
    let state_shape = Shape(vec![s.batch.clone(), Dim::Fixed(s.hidden)]);
    let initial = |c: &mut Ctx, i: usize| -> Result<Value, Fail> {
        match c.optional(i)? {
            Some(v) if s.layout == 1 => {
                let v = c.b.transpose(v, vec![1, 0, 2])?;
                direction(c, v, k)
            }
            Some(v) => direction(c, v, k),
            None => {
                let zero = c.scalar(dtype, 0.0)?;
                Ok(c.b.broadcast_to(zero, &state_shape)?)
            }
        }
    };
    let mut h = initial(c, 5)?;
    let mut cell = if s.cell == Cell::Lstm {
        initial(c, 6)?
    } else {
        h
    };
    let peep = match (s.cell, c.optional(7)?) {
        (Cell::Lstm, Some(p)) => Some(direction(c, p, k)?),
        _ => None,
    };
    // Every step's input projection at once: [T, N, D] · Wᵀ + Wb.
    let xw = c.b.matmul_t(x, w, false, true)?;
    let xw = c.b.add(xw, wb)?;
    let mut outputs = vec![h; steps];
    let order: Vec<usize> = if reverse {
        (0..steps).rev().collect()
    } else {
        (0..steps).collect()
    };
    for t in order {
        let xt = rows(c, xw, 0, t, 1)?;
        let xt =
            c.b.reshape(xt, Shape(vec![s.batch.clone(), Dim::Fixed(gh)]))?;
        (h, cell) = step(c, s, xt, &Recurrent { r, rb, peep }, h, cell)?;
        outputs[t] = h;
    }
    Ok((stack(c, &outputs, s)?, h, cell))
}
