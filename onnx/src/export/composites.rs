//! Composites written back as ONNX's own ops: the instruction groups that Kiln's builder and
//! importer make of `Gemm` with its `C`, `Conv` with its bias, `LayerNormalization` and
//! (opset 23 on) `Attention`, found before writing so that each becomes one node. A group is
//! taken only when nothing outside it reads its intermediate values. LSTM and GRU layers are
//! found first ([`super::recurrent`]): their steps hold products that would each be a `Gemm`.
//! Also found here: the broadcasts ONNX's implicit broadcasting makes unnecessary.

use super::recurrent::Recurrent;
use kiln_ir::{BinaryOp, ConvKind, Function, Inst, InstData, Op, ReduceOp, UnaryOp, Value};
use std::collections::{HashMap, HashSet};

/// One composite, at the instruction that gives its result (its root).
#[derive(Clone, Debug)]
pub(super) enum Composite {
    /// `matmul(a, b) + c`, `c` broadcast: `Gemm(a, b, c)`.
    Gemm { product: Inst, c: Value },
    /// `conv2d(x, w) + broadcast(reshape(bias))`: `Conv(x, w, bias)`.
    Conv { conv: Inst, bias: Value },
    /// Scaled dot-product attention over `[B, H, S, D]` heads, `softmax(q·kᵀ·scale + mask)·v`
    /// (`composite::attend`): `Attention(q, k, v, mask)`, opset 23 on.
    Attention {
        q: Value,
        k: Value,
        v: Value,
        mask: Option<Value>,
        scale: f64,
    },
    /// Kiln's `layer_norm` over the last axis: `LayerNormalization(x, scale, bias)`.
    LayerNorm {
        x: Value,
        scale: Value,
        bias: Value,
        eps: f64,
    },
    /// `composite::lstm` or `composite::gru` over a whole sequence: `LSTM` or `GRU`.
    Recurrent(Recurrent),
}

/// The composites of a function, and the instructions they absorb (written by their roots).
#[derive(Default)]
pub(super) struct Composites {
    pub(super) roots: HashMap<Inst, Composite>,
    pub(super) absorbed: HashSet<Inst>,
    /// Broadcasts left to ONNX's implicit (NumPy) broadcasting: every reader is an
    /// elementwise op that broadcasts its operands, beside an operand of the result's shape.
    /// (The importer makes the same `broadcast` of them again.)
    pub(super) implicit: HashSet<Inst>,
}

/// Finds every composite of `func` that `opset` has, in all its regions.
pub(super) fn find(func: &Function, opset: i64) -> Composites {
    let m = Matcher::new(func, opset);
    let mut found = Composites::default();
    let recurrent = |inst| (m.recurrent(inst)).map(|(r, parts)| (Composite::Recurrent(r), parts));
    for inst in func.walk_insts() {
        found.take(inst, recurrent(inst));
    }
    for inst in func.walk_insts() {
        found.take(inst, m.composite(inst));
    }
    found.implicit = m.implicit_broadcasts();
    found
}

impl Composites {
    /// Takes `composite`, rooted at `root`, unless it overlaps one taken before.
    fn take(&mut self, root: Inst, composite: Option<(Composite, Vec<Inst>)>) {
        let Some((composite, parts)) = composite else {
            return;
        };
        let taken = |i: &Inst| self.absorbed.contains(i) || self.roots.contains_key(i);
        if taken(&root) || parts.iter().any(taken) {
            return;
        }
        self.absorbed.extend(parts);
        self.roots.insert(root, composite);
    }
}

/// Reads instruction groups: who defines a value, and who reads it (`None`: a region's or
/// the function's results).
pub(super) struct Matcher<'f> {
    pub(super) func: &'f Function,
    opset: i64,
    pub(super) readers: HashMap<Value, Vec<Option<Inst>>>,
    /// Each instruction's place in the function, nested regions in line.
    pub(super) order: HashMap<Inst, usize>,
}

/// The first opset with `Attention`.
const ATTENTION_OPSET: i64 = 23;

impl<'f> Matcher<'f> {
    fn new(func: &'f Function, opset: i64) -> Matcher<'f> {
        let mut readers: HashMap<Value, Vec<Option<Inst>>> = HashMap::new();
        let mut read = |v: Value, by| readers.entry(v).or_default().push(by);
        for inst in func.walk_insts() {
            let data = func.inst(inst);
            data.args.iter().for_each(|&a| read(a, Some(inst)));
            for &r in &data.regions {
                func.region(r).results.iter().for_each(|&v| read(v, None));
            }
        }
        func.results().iter().for_each(|&v| read(v, None));
        let order = (func.walk_insts().into_iter().enumerate())
            .map(|(i, inst)| (inst, i))
            .collect();
        Matcher {
            func,
            opset,
            readers,
            order,
        }
    }

    /// The instruction defining `v` when nothing else reads `v`.
    fn sole(&self, v: Value) -> Option<(Inst, &'f InstData)> {
        self.read_by(v, 1)
    }

    /// How many places read `v`.
    fn read_count(&self, v: Value) -> usize {
        self.readers.get(&v).map_or(0, Vec::len)
    }

    /// The instruction defining `v` when exactly `n` places read `v`.
    fn read_by(&self, v: Value, n: usize) -> Option<(Inst, &'f InstData)> {
        let inst = self.func.producer(v)?;
        (self.read_count(v) == n).then(|| (inst, self.func.inst(inst)))
    }

    /// The broadcasts whose readers all broadcast implicitly in ONNX (`Add`, `Equal`,
    /// `Where`, …), each beside an operand that has the result's shape and is no broadcast
    /// itself.
    fn implicit_broadcasts(&self) -> HashSet<Inst> {
        let func = self.func;
        let is_broadcast = |v: Value| {
            (func.producer(v)).is_some_and(|p| matches!(func.inst(p).op, Op::Broadcast { .. }))
        };
        let implicit_reader = |reader: Option<Inst>, b: Value| {
            let Some(r) = reader else { return false };
            let data = func.inst(r);
            let elementwise = matches!(data.op, Op::Binary(_) | Op::Compare(_) | Op::Select);
            let full = &func.value_type(data.results[0]).shape;
            let beside_full = (data.args.iter())
                .any(|&o| o != b && !is_broadcast(o) && func.value_type(o).shape == *full);
            elementwise && beside_full
        };
        (func.walk_insts().into_iter())
            .filter(|&i| matches!(func.inst(i).op, Op::Broadcast { .. }))
            .filter(|&i| {
                let b = func.inst(i).results[0];
                let rs = self.readers.get(&b).map_or(&[][..], Vec::as_slice);
                !rs.is_empty() && rs.iter().all(|&r| implicit_reader(r, b))
            })
            .collect()
    }

    fn composite(&self, root: Inst) -> Option<(Composite, Vec<Inst>)> {
        let data = self.func.inst(root);
        if matches!(data.op, Op::MatMul { .. }) && self.opset >= ATTENTION_OPSET {
            return self.attention(root);
        }
        if data.op != Op::Binary(BinaryOp::Add) {
            return None;
        }
        let [p, q] = data.args[..] else { return None };
        (self.gemm(p, q).or_else(|| self.gemm(q, p)))
            .or_else(|| self.conv(p, q).or_else(|| self.conv(q, p)))
            .or_else(|| self.layer_norm(p, q))
    }

    /// `product + broadcast(c)` (or `+ c` of the product's shape), a product of matrices.
    fn gemm(&self, product: Value, c: Value) -> Option<(Composite, Vec<Inst>)> {
        let (inst, data) = self.sole(product)?;
        matches!(data.op, Op::MatMul { .. }).then_some(())?;
        let ty = |i: usize| self.func.value_type(data.args[i]);
        // onnxruntime has no integer Gemm.
        let float_matrices = ty(0).dtype.is_float() && ty(0).rank() == 2 && ty(1).rank() == 2;
        float_matrices.then_some(())?;
        let mut parts = vec![inst];
        let c = match self.sole(c) {
            Some((b, bd)) if matches!(bd.op, Op::Broadcast { .. }) => {
                parts.push(b);
                bd.args[0]
            }
            _ => c,
        };
        Some((Composite::Gemm { product: inst, c }, parts))
    }

    /// `conv2d(x, w) + broadcast(reshape(bias))`, the bias a vector reshaped to `[1, M, 1, 1]`.
    fn conv(&self, y: Value, added: Value) -> Option<(Composite, Vec<Inst>)> {
        let (conv, data) = self.sole(y)?;
        let Op::Conv2d { kind, attrs } = &data.op else {
            return None;
        };
        if *kind != ConvKind::Forward || attrs.channels_last {
            return None;
        }
        let (broadcast, bd) = self.sole(added)?;
        let (reshape, rd) = self.sole(*bd.args.first()?)?;
        if !matches!(bd.op, Op::Broadcast { .. }) || !matches!(rd.op, Op::Reshape { .. }) {
            return None;
        }
        let bias = rd.args[0];
        (self.func.value_type(bias).rank() == 1).then_some(())?;
        Some((
            Composite::Conv { conv, bias },
            vec![conv, broadcast, reshape],
        ))
    }

    /// `layer_norm`'s instructions (`runtime::composite::layer_norm`), from its last add:
    /// `(x − mean(x)) · rsqrt(mean((x − mean(x))²) + eps) · scale + bias`, over the last axis.
    fn layer_norm(&self, scaled: Value, bias_b: Value) -> Option<(Composite, Vec<Inst>)> {
        let mut parts = Vec::new();
        let bias = self.broadcast_of(bias_b, &mut parts)?;
        let [xhat, scale_b] = self.binary(scaled, BinaryOp::Mul, &mut parts)?;
        let scale = self.broadcast_of(scale_b, &mut parts)?;
        // `d` is read twice by `d · d` and once by `d · inv`: not a sole value.
        let [d, inv_b] = self.binary(xhat, BinaryOp::Mul, &mut parts)?;
        let inv = self.broadcast_of(inv_b, &mut parts)?;
        let ve = self.unary(inv, UnaryOp::Rsqrt, &mut parts)?;
        let [var, eps_b] = self.binary(ve, BinaryOp::Add, &mut parts)?;
        let eps = self.scalar_constant(eps_b, &mut parts)?;
        let d2 = self.reduce_last(var, ReduceOp::Mean, &mut parts)?;
        let (d2_inst, d2_data) = self.sole(d2)?;
        (d2_data.op == Op::Binary(BinaryOp::Mul) && d2_data.args == [d, d]).then_some(())?;
        parts.push(d2_inst);
        (self.read_count(d) == 3).then_some(())?;
        let d_inst = self.func.producer(d)?;
        let d_data = self.func.inst(d_inst);
        (d_data.op == Op::Binary(BinaryOp::Sub)).then_some(())?;
        parts.push(d_inst);
        let [x, mu_b] = [d_data.args[0], d_data.args[1]];
        let mu = self.broadcast_of(mu_b, &mut parts)?;
        let mean_of = self.reduce_last(mu, ReduceOp::Mean, &mut parts)?;
        (mean_of == x).then_some(())?;
        let rank = self.func.value_type(x).rank();
        let vector = |v: Value| self.func.value_type(v).rank() == 1;
        (rank >= 1 && vector(scale) && vector(bias)).then_some(())?;
        let composite = Composite::LayerNorm {
            x,
            scale,
            bias,
            eps,
        };
        Some((composite, parts))
    }

    /// `softmax(q·kᵀ·c [+ mask])·v` from its last product (`composite::attend`'s
    /// instructions: the softmax shifted by its stopped maximum, over the last axis).
    fn attention(&self, root: Inst) -> Option<(Composite, Vec<Inst>)> {
        let data = self.func.inst(root);
        let plain = Op::MatMul {
            transpose_a: false,
            transpose_b: false,
        };
        (data.op == plain).then_some(())?;
        let [p, v] = data.args[..] else { return None };
        let mut parts = Vec::new();
        let [e, sum_b] = self.binary(p, BinaryOp::Div, &mut parts)?;
        let sum = self.broadcast_of(sum_b, &mut parts)?;
        (self.reduce_last(sum, ReduceOp::Sum, &mut parts)? == e).then_some(())?;
        let (e_inst, e_data) = self.read_by(e, 2)?;
        (e_data.op == Op::Unary(UnaryOp::Exp)).then_some(())?;
        parts.push(e_inst);
        let [x, max_b] = self.binary(e_data.args[0], BinaryOp::Sub, &mut parts)?;
        let max_sg = self.broadcast_of(max_b, &mut parts)?;
        let max = self.unary(max_sg, UnaryOp::StopGradient, &mut parts)?;
        (self.reduce_last(max, ReduceOp::Max, &mut parts)? == x).then_some(())?;
        let (x_inst, x_data) = self.read_by(x, 2)?;
        let (scores, mask) = match x_data.op {
            Op::Binary(BinaryOp::Add) => {
                parts.push(x_inst);
                (x_data.args[0], Some(x_data.args[1]))
            }
            _ => (x, None),
        };
        let (scaled, sd) = match mask {
            Some(_) => self.sole(scores)?,
            None => (x_inst, x_data),
        };
        (sd.op == Op::Binary(BinaryOp::Mul)).then_some(())?;
        parts.push(scaled);
        let scale = self.scalar_constant(sd.args[1], &mut parts)?;
        let (product, pd) = self.sole(sd.args[0])?;
        let transposed_keys = Op::MatMul {
            transpose_a: false,
            transpose_b: true,
        };
        (pd.op == transposed_keys).then_some(())?;
        parts.push(product);
        let [q, k] = [pd.args[0], pd.args[1]];
        let heads = |x: Value| {
            let t = self.func.value_type(x);
            t.rank() == 4 && t.dtype.is_float()
        };
        (heads(q) && heads(k) && heads(v)).then_some(())?;
        let composite = Composite::Attention {
            q,
            k,
            v,
            mask,
            scale,
        };
        Some((composite, parts))
    }

    /// The operand of a reduction `op` over the last axis, dimensions kept, defining `v`.
    fn reduce_last(&self, v: Value, op: ReduceOp, parts: &mut Vec<Inst>) -> Option<Value> {
        let (inst, data) = self.sole(v)?;
        let rank = self.func.value_type(*data.args.first()?).rank();
        let last = Op::Reduce {
            op,
            axes: vec![rank - 1],
            keep_dims: true,
        };
        (data.op == last).then_some(())?;
        parts.push(inst);
        Some(data.args[0])
    }

    fn binary(&self, v: Value, op: BinaryOp, parts: &mut Vec<Inst>) -> Option<[Value; 2]> {
        let (inst, data) = self.sole(v)?;
        (data.op == Op::Binary(op)).then_some(())?;
        parts.push(inst);
        Some([data.args[0], data.args[1]])
    }

    fn unary(&self, v: Value, op: UnaryOp, parts: &mut Vec<Inst>) -> Option<Value> {
        let (inst, data) = self.sole(v)?;
        (data.op == Op::Unary(op)).then_some(())?;
        parts.push(inst);
        Some(data.args[0])
    }

    /// The operand of a `broadcast` defining `v`.
    fn broadcast_of(&self, v: Value, parts: &mut Vec<Inst>) -> Option<Value> {
        let (inst, data) = self.sole(v)?;
        matches!(data.op, Op::Broadcast { .. }).then_some(())?;
        parts.push(inst);
        Some(data.args[0])
    }

    /// The value of a one-element constant, broadcast or not, defining `v`.
    fn scalar_constant(&self, v: Value, parts: &mut Vec<Inst>) -> Option<f64> {
        let (inst, data) = self.sole(v)?;
        let (inst, data) = match &data.op {
            Op::Broadcast { .. } => {
                parts.push(inst);
                self.sole(data.args[0])?
            }
            _ => (inst, data),
        };
        let Op::Const { value, .. } = &data.op else {
            return None;
        };
        (value.len() == 1).then_some(())?;
        parts.push(inst);
        Some(value.get_f64(0))
    }
}
