//! LSTM and GRU layers written back as ONNX's `LSTM` and `GRU`: the steps that
//! `runtime::composite::lstm` and `gru` unroll, found from the last step's hidden state back
//! to the zero state, and written as one node whose weights are reordered to ONNX's gates.
//!
//! Kiln's layers follow PyTorch: weights `[D, G·H]` and `[H, G·H]` (rows times gates), gates
//! `i, f, g, o` (LSTM) and `r, z, n` (GRU, the reset gate applied after the recurrent product:
//! ONNX's `linear_before_reset=1`). ONNX wants `[1, G·H, D]` and `[1, G·H, H]` in gate order
//! `i, o, f, c` and `z, r, h`, both biases `[1, 2·G·H]`, and (onnxruntime has no batch-first
//! recurrent ops) the sequence `[T, N, D]`.

use super::composites::Matcher;
use super::graph::{Graph, attr_int, attr_ints, attr_tensor};
use crate::tensor;
use kiln_ir::{AxisSlice, BinaryOp, Inst, Literal, Op, Shape, Type, UnaryOp, Value};
use std::collections::HashSet;

/// Which layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cell {
    Lstm,
    Gru,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }

    /// ONNX's gates as indices of Kiln's (`i, o, f, c` of `i, f, g, o`; `z, r, h` of `r, z, n`).
    fn onnx_gate_order(self) -> &'static [i64] {
        match self {
            Cell::Lstm => &[0, 3, 1, 2],
            Cell::Gru => &[1, 0, 2],
        }
    }
}

/// A recurrent layer over every step of `x` `[N, T, D]`, from zero states. Its root is the
/// instruction giving the last hidden state `[N, H]`.
#[derive(Clone, Debug)]
pub(super) struct Recurrent {
    layer: Layer,
    /// Every step's hidden state stacked `[N, T, H]`, where something reads it.
    sequence: Option<Value>,
    /// The LSTM's last cell state `[N, H]`, where something reads it.
    cell_state: Option<Value>,
}

/// One step as matched: its index, its incoming states and (LSTM) its cell state.
struct Step {
    t: usize,
    h_prev: Value,
    c_prev: Option<Value>,
    c: Option<Value>,
}

/// What every step of one layer shares.
#[derive(Clone, Debug, PartialEq)]
struct Layer {
    cell: Cell,
    x: Value,
    /// `w_ih` `[D, G·H]` and `w_hh` `[H, G·H]`.
    weights: [Value; 2],
    /// LSTM: one bias `[4H]`; GRU: `b_ih` and `b_hh` `[3H]`.
    biases: Vec<Value>,
    hidden: usize,
}

fn binary(op: BinaryOp) -> impl Fn(&Op) -> bool {
    move |o| *o == Op::Binary(op)
}

fn unary(op: UnaryOp) -> impl Fn(&Op) -> bool {
    move |o| *o == Op::Unary(op)
}

fn broadcast(op: &Op) -> bool {
    matches!(op, Op::Broadcast { .. })
}

fn plain_matmul(op: &Op) -> bool {
    *op == Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    }
}

impl Matcher<'_> {
    /// The LSTM or GRU whose last hidden state `root` gives. Its instructions' values are read
    /// only by each other but for the last hidden and cell states and the stacked sequence,
    /// whose other readers come after `root`.
    pub(super) fn recurrent(&self, root: Inst) -> Option<(Recurrent, Vec<Inst>)> {
        let h_last = *self.func.inst(root).results.first()?;
        let mut parts = Vec::new();
        let (layer, mut step) = self.step(h_last, &mut parts)?;
        (step.t + 1 == self.steps_of(layer.x)? && self.sizes_fit(&layer)).then_some(())?;
        let c_last = step.c;
        let mut hs = vec![h_last];
        while step.t > 0 {
            let (before, previous) = self.step(step.h_prev, &mut parts)?;
            let chained = before == layer && previous.t + 1 == step.t && previous.c == step.c_prev;
            chained.then_some(())?;
            hs.push(step.h_prev);
            step = previous;
        }
        self.zero_state(step.h_prev, &mut parts)?;
        if let Some(c0) = step.c_prev {
            self.zero_state(c0, &mut parts)?;
        }
        hs.reverse();
        let sequence = self.stacked(&hs, &mut parts);
        let parts = self.closed(root, parts, &[Some(h_last), c_last, sequence])?;
        let found = Recurrent {
            layer,
            sequence,
            cell_state: c_last.filter(|&c| self.read_outside(c, &parts)),
        };
        Some((found, parts))
    }

    /// The LSTM or GRU step giving hidden state `h`.
    fn step(&self, h: Value, parts: &mut Vec<Inst>) -> Option<(Layer, Step)> {
        (self.lstm_step(h, parts)).or_else(|| self.gru_step(h, parts))
    }

    /// `composite::lstm`'s step giving `h`: `z = x_t·w_ih + h·w_hh + bias`,
    /// `c = σ(f)·c + σ(i)·tanh(g)`, `h = σ(o)·tanh(c)`.
    fn lstm_step(&self, h: Value, parts: &mut Vec<Inst>) -> Option<(Layer, Step)> {
        let mut mine = Vec::new();
        let [o, tc] = self.args_of(h, binary(BinaryOp::Mul), &mut mine)?;
        let [c] = self.args_of(tc, unary(UnaryOp::Tanh), &mut mine)?;
        let [fc, ig] = self.args_of(c, binary(BinaryOp::Add), &mut mine)?;
        let [f, c_prev] = self.args_of(fc, binary(BinaryOp::Mul), &mut mine)?;
        let [i, g] = self.args_of(ig, binary(BinaryOp::Mul), &mut mine)?;
        let gates = [
            (i, UnaryOp::Sigmoid),
            (f, UnaryOp::Sigmoid),
            (g, UnaryOp::Tanh),
            (o, UnaryOp::Sigmoid),
        ];
        let mut z = None;
        for (k, (gate, act)) in gates.into_iter().enumerate() {
            let [pre] = self.args_of(gate, unary(act), &mut mine)?;
            let (of, hidden) = self.gate_slice(pre, k, &mut mine)?;
            (z.is_none_or(|z| z == (of, hidden))).then_some(())?;
            z = Some((of, hidden));
        }
        let (z, hidden) = z?;
        let [z0, bias_b] = self.args_of(z, binary(BinaryOp::Add), &mut mine)?;
        let [bias] = self.args_of(bias_b, broadcast, &mut mine)?;
        let [zx, zh] = self.args_of(z0, binary(BinaryOp::Add), &mut mine)?;
        let [xt, w_ih] = self.args_of(zx, plain_matmul, &mut mine)?;
        let [h_prev, w_hh] = self.args_of(zh, plain_matmul, &mut mine)?;
        let (x, t) = self.step_input(xt, &mut mine)?;
        parts.extend(mine);
        let layer = Layer {
            cell: Cell::Lstm,
            x,
            weights: [w_ih, w_hh],
            biases: vec![bias],
            hidden,
        };
        let step = Step {
            t,
            h_prev,
            c_prev: Some(c_prev),
            c: Some(c),
        };
        Some((layer, step))
    }

    /// `composite::gru`'s step giving `h`: `r = σ(x_r + h_r)`, `z = σ(x_z + h_z)`,
    /// `n = tanh(x_n + r·h_n)`, `h = (1 − z)·n + z·h`, where `x_* = x_t·w_ih + b_ih` and
    /// `h_* = h·w_hh + b_hh` by gate.
    fn gru_step(&self, h: Value, parts: &mut Vec<Inst>) -> Option<(Layer, Step)> {
        let mut mine = Vec::new();
        let [new, old] = self.args_of(h, binary(BinaryOp::Add), &mut mine)?;
        let [keep, n] = self.args_of(new, binary(BinaryOp::Mul), &mut mine)?;
        let [z, h_prev] = self.args_of(old, binary(BinaryOp::Mul), &mut mine)?;
        let [one_b, z_again] = self.args_of(keep, binary(BinaryOp::Sub), &mut mine)?;
        (z_again == z).then_some(())?;
        let [one] = self.args_of(one_b, broadcast, &mut mine)?;
        (self.constant_of(one, &mut mine)? == 1.0).then_some(())?;
        let [n_pre] = self.args_of(n, unary(UnaryOp::Tanh), &mut mine)?;
        let [xn, rn] = self.args_of(n_pre, binary(BinaryOp::Add), &mut mine)?;
        let [r, hn] = self.args_of(rn, binary(BinaryOp::Mul), &mut mine)?;
        let mut sums = Vec::new();
        for gate in [r, z] {
            let [pre] = self.args_of(gate, unary(UnaryOp::Sigmoid), &mut mine)?;
            let [from_x, from_h] = self.args_of(pre, binary(BinaryOp::Add), &mut mine)?;
            sums.push((from_x, from_h));
        }
        sums.push((xn, hn));
        let (mut zx, mut zh) = (None, None);
        for (k, (from_x, from_h)) in sums.into_iter().enumerate() {
            for (slice, whole) in [(from_x, &mut zx), (from_h, &mut zh)] {
                let found = self.gate_slice(slice, k, &mut mine)?;
                (whole.is_none_or(|w| w == found)).then_some(())?;
                *whole = Some(found);
            }
        }
        let ((zx, hidden), (zh, hidden_h)) = (zx?, zh?);
        (hidden == hidden_h).then_some(())?;
        let [x_product, b_ih_b] = self.args_of(zx, binary(BinaryOp::Add), &mut mine)?;
        let [b_ih] = self.args_of(b_ih_b, broadcast, &mut mine)?;
        let [h_product, b_hh_b] = self.args_of(zh, binary(BinaryOp::Add), &mut mine)?;
        let [b_hh] = self.args_of(b_hh_b, broadcast, &mut mine)?;
        let [xt, w_ih] = self.args_of(x_product, plain_matmul, &mut mine)?;
        let [h_again, w_hh] = self.args_of(h_product, plain_matmul, &mut mine)?;
        (h_again == h_prev).then_some(())?;
        let (x, t) = self.step_input(xt, &mut mine)?;
        parts.extend(mine);
        let layer = Layer {
            cell: Cell::Gru,
            x,
            weights: [w_ih, w_hh],
            biases: vec![b_ih, b_hh],
            hidden,
        };
        let step = Step {
            t,
            h_prev,
            c_prev: None,
            c: None,
        };
        Some((layer, step))
    }

    /// The operands of the instruction defining `v` when its op passes `is`.
    fn args_of<const K: usize>(
        &self,
        v: Value,
        is: impl Fn(&Op) -> bool,
        parts: &mut Vec<Inst>,
    ) -> Option<[Value; K]> {
        let inst = self.func.producer(v)?;
        let data = self.func.inst(inst);
        is(&data.op).then_some(())?;
        parts.push(inst);
        data.args.clone().try_into().ok()
    }

    /// Gate `k` of `v`: columns `k·H .. (k+1)·H` of a matrix; returns the matrix and `H`.
    fn gate_slice(&self, v: Value, k: usize, parts: &mut Vec<Inst>) -> Option<(Value, usize)> {
        let (inst, matrix, [start, end]) = self.range_slice(v, 1, 2)?;
        let hidden = end.checked_sub(start)?;
        (hidden > 0 && start == k * hidden).then_some(())?;
        parts.push(inst);
        Some((matrix, hidden))
    }

    /// Step `t` of a sequence `[N, T, D]` as `composite::lstm` reads it: `[N, D]` reshaped
    /// from `x[:, t:t+1, :]`. Returns `x` and `t`.
    fn step_input(&self, v: Value, parts: &mut Vec<Inst>) -> Option<(Value, usize)> {
        let [s] = self.args_of(v, |op| matches!(op, Op::Reshape { .. }), parts)?;
        let (inst, x, [start, end]) = self.range_slice(s, 1, 3)?;
        (end == start + 1).then_some(())?;
        parts.push(inst);
        Some((x, start))
    }

    /// The `slice` defining `v` that takes `start..end` (step 1) of axis `axis` and all of
    /// the other axes of a rank-`rank` operand: the instruction, the operand, the range.
    fn range_slice(&self, v: Value, axis: usize, rank: usize) -> Option<(Inst, Value, [usize; 2])> {
        let inst = self.func.producer(v)?;
        let data = self.func.inst(inst);
        let Op::Slice { axes } = &data.op else {
            return None;
        };
        (axes.len() == rank).then_some(())?;
        let full = |i: usize| i == axis || axes[i] == AxisSlice::Full;
        (0..rank).all(full).then_some(())?;
        let AxisSlice::Range {
            start,
            end,
            step: 1,
        } = axes[axis]
        else {
            return None;
        };
        Some((inst, data.args[0], [start, end]))
    }

    /// The number of steps of a sequence `[N, T, D]`, `T` fixed.
    fn steps_of(&self, x: Value) -> Option<usize> {
        match self.func.value_type(x).shape.dims() {
            [_, t, _] => t.as_fixed().filter(|&t| t > 0),
            _ => None,
        }
    }

    /// The weights are `[D, G·H]` and `[H, G·H]`, the biases `[G·H]`, for the hidden size
    /// the gates were sliced by: what ONNX's op assumes.
    fn sizes_fit(&self, layer: &Layer) -> bool {
        let width = layer.cell.gates() * layer.hidden;
        let dims = |v: Value| self.func.value_type(v).shape.as_fixed();
        let [w_ih, w_hh] = layer.weights.map(dims);
        let float = self.func.value_type(layer.x).dtype.is_float();
        float
            && w_ih.is_some_and(|w| w.len() == 2 && w[1] == width)
            && w_hh.is_some_and(|w| w == [layer.hidden, width])
            && (layer.biases.iter()).all(|&b| dims(b).is_some_and(|b| b == [width]))
    }

    /// The one value of a one-element constant defining `v`.
    fn constant_of(&self, v: Value, parts: &mut Vec<Inst>) -> Option<f64> {
        let inst = self.func.producer(v)?;
        let Op::Const { value, .. } = &self.func.inst(inst).op else {
            return None;
        };
        (value.len() == 1).then_some(())?;
        parts.push(inst);
        Some(value.get_f64(0))
    }

    /// `v` is a zero state: a broadcast zero.
    fn zero_state(&self, v: Value, parts: &mut Vec<Inst>) -> Option<()> {
        let [zero] = self.args_of(v, broadcast, parts)?;
        (self.constant_of(zero, parts)? == 0.0).then_some(())
    }

    /// The hidden states `hs` stacked as `composite::lstm` stacks them: each reshaped to
    /// `[N, 1, H]`, concatenated along axis 1.
    fn stacked(&self, hs: &[Value], parts: &mut Vec<Inst>) -> Option<Value> {
        let last = *hs.last()?;
        let readers = self.readers.get(&last)?;
        let concat = readers.iter().flatten().find_map(|&r| {
            let data = self.func.inst(r);
            matches!(data.op, Op::Reshape { .. }).then_some(())?;
            let [stacked] = self.readers.get(&data.results[0])?[..] else {
                return None;
            };
            let stacked = stacked?;
            (self.func.inst(stacked).op == Op::Concat { axis: 1 }).then_some(stacked)
        })?;
        let data = self.func.inst(concat);
        (data.args.len() == hs.len()).then_some(())?;
        let mut mine = vec![concat];
        for (&arg, &h) in data.args.iter().zip(hs) {
            let [of] = self.args_of(arg, |op| matches!(op, Op::Reshape { .. }), &mut mine)?;
            (of == h).then_some(())?;
        }
        parts.extend(mine);
        Some(data.results[0])
    }

    /// `parts` without repeats or `root`, when nothing outside them reads their values but
    /// for `outputs`, whose outside readers follow `root`.
    fn closed(&self, root: Inst, parts: Vec<Inst>, outputs: &[Option<Value>]) -> Option<Vec<Inst>> {
        let mut seen = HashSet::new();
        let parts: Vec<Inst> = parts.into_iter().filter(|&p| seen.insert(p)).collect();
        for &p in &parts {
            for &r in &self.func.inst(p).results {
                let readers = self.readers.get(&r).map_or(&[][..], Vec::as_slice);
                let output = outputs.contains(&Some(r));
                let allowed = |reader: &Option<Inst>| match reader {
                    Some(i) if seen.contains(i) => true,
                    Some(i) => output && self.order[i] > self.order[&root],
                    None => output,
                };
                readers.iter().all(allowed).then_some(())?;
            }
        }
        Some(parts.into_iter().filter(|&p| p != root).collect())
    }

    /// Something that is not one of `parts` reads `v`.
    fn read_outside(&self, v: Value, parts: &[Inst]) -> bool {
        let readers = self.readers.get(&v).map_or(&[][..], Vec::as_slice);
        readers
            .iter()
            .any(|r| r.is_none_or(|i| !parts.contains(&i)))
    }
}

/// Writes `layer` as one ONNX `LSTM` or `GRU` node; `y` names the last hidden state.
pub(super) fn write(g: &mut Graph, found: &Recurrent, y: &str) {
    let layer = &found.layer;
    let (cell, hidden) = (layer.cell, layer.hidden as i64);
    let dtype = g.func.value_type(layer.x).dtype;
    let x = g.name(layer.x);
    let x = g.op(
        "Transpose",
        &[&x],
        "steps_first",
        vec![attr_ints("perm", &[1, 0, 2])],
    );
    let w_ih = g.name(layer.weights[0]);
    let w_hh = g.name(layer.weights[1]);
    let w = onnx_weights(g, cell, &w_ih, hidden);
    let r = onnx_weights(g, cell, &w_hh, hidden);
    let b = match &layer.biases[..] {
        [bias] => {
            let bias = g.name(*bias);
            let bias = onnx_bias(g, cell, &bias, hidden);
            let shape = g.ints(&[1, cell.gates() as i64 * hidden]);
            let zero = Type::new(dtype, Shape::fixed(&[1]));
            let zero = tensor::from_literal(&Literal::scalar(dtype, 0.0), &zero, None);
            let zeros = g.op(
                "ConstantOfShape",
                &[&shape],
                "zeros",
                vec![attr_tensor("value", zero)],
            );
            g.op(
                "Concat",
                &[&bias, &zeros],
                "bias",
                vec![attr_int("axis", 1)],
            )
        }
        biases => {
            let names: Vec<String> = biases.iter().map(|&v| g.name(v)).collect();
            let parts: Vec<String> = (names.iter())
                .map(|n| onnx_bias(g, cell, n, hidden))
                .collect();
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            g.op("Concat", &parts, "bias", vec![attr_int("axis", 1)])
        }
    };
    let (op, mut attrs) = match cell {
        Cell::Lstm => ("LSTM", vec![]),
        Cell::Gru => ("GRU", vec![attr_int("linear_before_reset", 1)]),
    };
    attrs.push(attr_int("hidden_size", hidden));
    let every = g.fresh("every_h");
    let last_h = g.fresh("last_h");
    let mut outputs = vec![every.clone(), last_h.clone()];
    if cell == Cell::Lstm {
        outputs.push(g.fresh("last_c"));
    }
    let outs: Vec<&str> = outputs.iter().map(String::as_str).collect();
    g.node(op, &[&x, &w, &r, &b], &outs, attrs);
    let axis0 = g.ints(&[0]);
    g.node("Squeeze", &[&last_h, &axis0], &[y], vec![]);
    if let Some(c) = found.cell_state {
        let c = g.name(c);
        g.node("Squeeze", &[&outputs[2], &axis0], &[&c], vec![]);
    }
    if let Some(sequence) = found.sequence {
        let axis1 = g.ints(&[1]);
        let steps = g.op("Squeeze", &[&every, &axis1], "every_h", vec![]);
        let sequence = g.name(sequence);
        let perm = attr_ints("perm", &[1, 0, 2]);
        g.node("Transpose", &[&steps], &[&sequence], vec![perm]);
    }
}

/// Weights `[rows, G·H]` as ONNX's `[1, G·H, rows]`, gates reordered.
fn onnx_weights(g: &mut Graph, cell: Cell, w: &str, hidden: i64) -> String {
    let perm = attr_ints("perm", &[1, 0]);
    let t = g.op("Transpose", &[w], "gates_first", vec![perm]);
    onnx_gates(g, cell, &t, hidden, &[-1])
}

/// A bias `[G·H]` as `[1, G·H]`, gates reordered.
fn onnx_bias(g: &mut Graph, cell: Cell, b: &str, hidden: i64) -> String {
    onnx_gates(g, cell, b, hidden, &[])
}

/// `x` `[G·H, rest…]` as `[1, G·H, rest…]` with its gates in ONNX's order.
fn onnx_gates(g: &mut Graph, cell: Cell, x: &str, hidden: i64, rest: &[i64]) -> String {
    let gates = cell.gates() as i64;
    let by_gate = g.ints(&[&[gates, hidden], rest].concat());
    let t = g.op("Reshape", &[x, &by_gate], "by_gate", vec![]);
    let order = g.ints(cell.onnx_gate_order());
    let axis0 = vec![attr_int("axis", 0)];
    let t = g.op("Gather", &[&t, &order], "onnx_gates", axis0);
    let shape = g.ints(&[&[1, gates * hidden], rest].concat());
    g.op("Reshape", &[&t, &shape], "onnx_gates", vec![])
}
