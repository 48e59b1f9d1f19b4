//! Planning a kernel: which values are materialised, in which stages, in which buffers.
//!
//! A kernel is a function of fusible ops (elementwise, broadcast, splat constants, iota,
//! reductions, reshapes that only add or drop axes of size 1). Elementwise values are
//! recomputed where they are used; *materialised* values — the outputs and the reductions —
//! are computed in stages, each a walk over a **domain** shape: its rows (every axis but the
//! last, flattened) and, inside each row, its last axis.
//!
//! - A **rows** stage computes, row by row, values of the domain's shape, values of its row
//!   shape, and reductions of its last axis, which stay in a register for the rest of the row.
//!   Softmax, layer norm and cross-entropy are one rows stage: each row is read once from
//!   memory and stays in cache. Rows are independent, so a rows stage runs split across threads.
//! - An **accumulate** stage computes one reduction over other axes: it walks its input's
//!   domain and combines each element into the output buffer. When the reduction keeps the
//!   last axis (a bias's gradient, layer norm's γ and β) its code takes *columns*: each
//!   thread may walk every row over its own run of that axis, every result combined in the
//!   same order as on one thread (the executor splits it when its operand costs a
//!   transcendental function an element to compute: `Kernel::split`). Otherwise it runs on
//!   one thread.
//!
//! An f32 sum (or mean) accumulates in f64 wherever it runs long ([`KernelPlan::sums_wide`]):
//! along a row in 16 f32 partials for at most [`SUM_BLOCK`] elements at a time, each block's
//! partials then added into 16 f64 ones; over rows, into an f64 accumulator buffer of the
//! result's shape (a scratch buffer of the kernel) — by columns, in f32 for [`ROW_BLOCK`]
//! rows at a time first — rounded to f32 once at the end. So its
//! error grows like a blocked sum's, not like a running f32 sum's (a running f32 sum of 2²²
//! values near 1000 was 2 % off).
//!
//! A value is read under a [`Mapping`]: for each of its axes, the domain axis that indexes it,
//! or none (the axis has size 1, or was broadcast). Addresses follow from the mapping, so
//! broadcasting costs nothing but a zero stride.

use crate::jit::JitError;
use kiln_ir::{Cost, DType, Dim, Function, Op, ReduceOp, Shape, Symbol, Type, Value, ValueDef};
use std::collections::{BTreeSet, HashMap, HashSet};

/// A kernel buffer: inputs, then outputs, then scratch, numbered in that order in the ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buffer {
    Input(usize),
    Output(usize),
    Scratch(usize),
}

/// The elements an f32 sum adds in its 16 f32 partials before it adds them into its f64
/// ones: a tile program's tile, so that both compiled forms add in the same order.
pub(crate) const SUM_BLOCK: i64 = 512;

/// The rows a sum by columns adds in f32 before it adds them into its f64 accumulator: as
/// many as each of a row sum's 16 partials takes in a block ([`SUM_BLOCK`] / 16).
pub(crate) const ROW_BLOCK: i64 = 32;

/// A buffer only the kernel uses: a materialised value a later stage reads, or an
/// accumulated reduction's accumulator (in f64 for an f32 sum).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scratch {
    pub value: Value,
    pub dtype: DType,
}

/// For each axis of a value, the domain axis that indexes it (`None`: always index 0).
pub(crate) type Mapping = Vec<Option<u8>>;

#[derive(Clone, Debug)]
pub struct Stage {
    pub domain: Shape,
    /// The materialised values computed, in order.
    pub values: Vec<Value>,
    /// One reduction accumulated into its buffer, over all rows at once.
    pub accumulate: bool,
    /// An accumulate stage whose reduction keeps the domain's last axis: its code takes a
    /// range of that axis's positions (columns), not of rows, and walks every row over them.
    pub by_columns: bool,
}

impl Stage {
    /// The number of rows (the product of every domain axis but the last).
    pub fn rows(&self, plan: &KernelPlan, sizes: &[i64]) -> i64 {
        let rank = self.domain.rank();
        self.domain.0[..rank.saturating_sub(1)]
            .iter()
            .map(|d| plan.extent(d, sizes))
            .fold(1, i64::saturating_mul)
    }

    /// The length of each row (1 for a scalar domain).
    pub fn row_len(&self, plan: &KernelPlan, sizes: &[i64]) -> i64 {
        self.domain.0.last().map_or(1, |d| plan.extent(d, sizes))
    }
}

#[derive(Clone, Debug)]
pub struct KernelPlan {
    pub func: Function,
    /// Symbolic dimensions, in the order of the `sizes` array the kernel receives.
    pub symbols: Vec<Symbol>,
    pub outputs: Vec<Value>,
    pub scratch: Vec<Scratch>,
    /// The f64 accumulator of each f32 sum accumulated over rows: its scratch index.
    pub accumulators: HashMap<Value, usize>,
    /// Where each readable value lives: inputs, and materialised values other stages read.
    pub source: HashMap<Value, Buffer>,
    pub stages: Vec<Stage>,
    /// The stage computing each materialised value.
    pub stage_of: HashMap<Value, usize>,
}

/// Ops a kernel computes.
pub(crate) fn supported(func: &Function, op: &Op, args: &[Value], result: Value) -> bool {
    match op {
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. } => true,
        Op::Broadcast { .. } | Op::Iota { .. } | Op::Reduce { .. } => true,
        Op::Const { value, .. } => value.len() == 1,
        Op::Reshape { .. } => is_unit_reshape(
            &func.value_type(args[0]).shape,
            &func.value_type(result).shape,
        ),
        _ => false,
    }
}

/// Whether a reshape from `from` to `to` only inserts or removes axes of size 1.
pub(crate) fn is_unit_reshape(from: &Shape, to: &Shape) -> bool {
    let non_unit = |s: &Shape| {
        s.0.iter()
            .filter(|d| !d.is_one())
            .cloned()
            .collect::<Vec<_>>()
    };
    non_unit(from) == non_unit(to)
}

impl KernelPlan {
    pub fn new(func: Function) -> Result<KernelPlan, JitError> {
        let body = func.region(func.body());
        for &inst in &body.insts {
            let data = func.inst(inst);
            if data.results.len() != 1 || !supported(&func, &data.op, &data.args, data.results[0]) {
                return Err(JitError::Unsupported(format!(
                    "`{}` in a kernel",
                    data.op.name()
                )));
            }
        }
        let mut symbols: BTreeSet<Symbol> = BTreeSet::new();
        for (_, v) in func.all_values() {
            symbols.extend(v.ty.shape.symbols().cloned());
        }
        let outputs: Vec<Value> = body.results.clone();
        let mut materialised: Vec<Value> = Vec::new();
        for &v in func.args() {
            if outputs.contains(&v) {
                materialised.push(v);
            }
        }
        for &inst in &body.insts {
            let r = func.inst(inst).results[0];
            let is_reduce = matches!(func.inst(inst).op, Op::Reduce { .. });
            if (is_reduce || outputs.contains(&r)) && !materialised.contains(&r) {
                materialised.push(r);
            }
        }

        let mut plan = KernelPlan {
            func,
            symbols: symbols.into_iter().collect(),
            outputs,
            scratch: Vec::new(),
            accumulators: HashMap::new(),
            source: HashMap::new(),
            stages: Vec::new(),
            stage_of: HashMap::new(),
        };
        for &v in &materialised {
            plan.place(v);
        }
        plan.assign_buffers();
        Ok(plan)
    }

    /// Adds materialised value `v` to the current rows stage when it fits, else to a new stage.
    fn place(&mut self, v: Value) {
        let reduce = self.reduction(v);
        let (domain, accumulate, by_columns) = match &reduce {
            Some((input, axes)) => {
                let input_shape = self.ty(*input).shape.clone();
                let rank = input_shape.rank();
                let last_only = rank >= 1 && *axes == [rank - 1];
                let keeps_last = rank >= 2 && !axes.contains(&(rank - 1));
                (input_shape, !last_only, keeps_last)
            }
            None => (self.ty(v).shape.clone(), false, false),
        };
        if !accumulate && let Some(index) = self.stages.len().checked_sub(1) {
            let stage = &self.stages[index];
            let fits = !stage.accumulate
                && match reduce {
                    Some(_) => domain == stage.domain,
                    None => self.row_role(v, &stage.domain).is_some(),
                };
            if fits && self.reads_registers_canonically(v, index) {
                self.stages[index].values.push(v);
                self.stage_of.insert(v, index);
                return;
            }
        }
        self.stage_of.insert(v, self.stages.len());
        self.stages.push(Stage {
            domain,
            values: vec![v],
            accumulate,
            by_columns,
        });
    }

    /// Inputs are readable from their buffers; a materialised value gets a buffer when it is an
    /// output, when a later stage reads it, or when it is accumulated (in its buffer).
    fn assign_buffers(&mut self) {
        for (i, &a) in self.func.args().iter().enumerate() {
            self.source.insert(a, Buffer::Input(i));
        }
        for (i, &o) in self.outputs.iter().enumerate() {
            self.source.entry(o).or_insert(Buffer::Output(i));
        }
        for s in 0..self.stages.len() {
            for v in self.stages[s].values.clone() {
                let accumulate = self.stages[s].accumulate;
                if accumulate && self.sums_wide(v) {
                    self.accumulators.insert(v, self.scratch.len());
                    self.add_scratch(v, DType::F64);
                }
                if self.source.contains_key(&v) {
                    continue;
                }
                let read_later = self.stages[s + 1..]
                    .iter()
                    .flat_map(|stage| &stage.values)
                    .any(|&m| self.reads(m).iter().any(|(x, _)| *x == v));
                if read_later || accumulate {
                    self.source.insert(v, Buffer::Scratch(self.scratch.len()));
                    self.add_scratch(v, self.ty(v).dtype);
                }
            }
        }
    }

    fn add_scratch(&mut self, value: Value, dtype: DType) {
        self.scratch.push(Scratch { value, dtype });
    }

    /// Whether reduction `v` is an f32 sum or mean, which accumulates in f64 (the module's
    /// top: blocked partials along rows, an f64 accumulator over rows).
    pub fn sums_wide(&self, v: Value) -> bool {
        self.ty(v).dtype == DType::F32
            && matches!(self.reduce_op(v), Some((ReduceOp::Sum | ReduceOp::Mean, _)))
    }

    /// The buffer accumulated reduction `v` ends in before it is finished into its own: its
    /// f64 accumulator, or its own.
    pub fn accumulator(&self, v: Value) -> Buffer {
        match self.accumulators.get(&v) {
            Some(&i) => Buffer::Scratch(i),
            None => self.source[&v],
        }
    }

    /// Whether accumulated f32 sum `v` adds each element into its own (f32) buffer for a
    /// block of [`ROW_BLOCK`] rows, then the block's sums into its f64 accumulator: a sum by
    /// columns whose results are its columns alone (a bias's gradient), where adding every
    /// element into f64 cost a sum of `x·y` over `[2048, 1024]` half again its time.
    pub fn combines_in_blocks(&self, v: Value, stage: usize) -> bool {
        let dims = &self.ty(v).shape.0;
        self.accumulators.contains_key(&v)
            && self.stages[stage].by_columns
            && dims[..dims.len().saturating_sub(1)].iter().all(Dim::is_one)
    }

    /// The buffer each element of accumulated reduction `v` is combined into.
    pub fn combined_into(&self, v: Value, stage: usize) -> Buffer {
        match self.combines_in_blocks(v, stage) {
            true => self.source[&v],
            false => self.accumulator(v),
        }
    }

    /// The type of scratch buffer `i`.
    pub fn scratch_type(&self, i: usize) -> Type {
        let s = &self.scratch[i];
        Type::new(s.dtype, self.ty(s.value).shape.clone())
    }

    /// The type of the buffer in ABI position `slot`.
    pub fn slot_type(&self, slot: usize) -> Type {
        let (inputs, outputs) = (self.func.args().len(), self.outputs.len());
        match slot {
            s if s < inputs => self.ty(self.func.args()[s]).clone(),
            s if s < inputs + outputs => self.ty(self.outputs[s - inputs]).clone(),
            s => self.scratch_type(s - inputs - outputs),
        }
    }

    pub fn ty(&self, v: Value) -> &Type {
        self.func.value_type(v)
    }

    /// The instruction computing `v`, or `None` for an argument.
    pub fn op(&self, v: Value) -> Option<(&Op, &[Value])> {
        match self.func.value(v).def {
            ValueDef::Result(inst, _) => {
                let data = self.func.inst(inst);
                Some((&data.op, &data.args[..]))
            }
            ValueDef::Arg(..) => None,
        }
    }

    /// `(input, axes)` when `v` is a reduction.
    pub fn reduction(&self, v: Value) -> Option<(Value, Vec<usize>)> {
        match self.op(v)? {
            (Op::Reduce { axes, .. }, args) => Some((args[0], axes.clone())),
            _ => None,
        }
    }

    pub fn reduce_op(&self, v: Value) -> Option<(ReduceOp, bool)> {
        match self.op(v)? {
            (Op::Reduce { op, keep_dims, .. }, _) => Some((*op, *keep_dims)),
            _ => None,
        }
    }

    /// Every buffer a materialised value is written to: each of its output positions, or its
    /// scratch buffer.
    pub fn destinations(&self, v: Value) -> Vec<Buffer> {
        let mut out: Vec<Buffer> = (self.outputs.iter().enumerate())
            .filter(|(_, o)| **o == v)
            .map(|(i, _)| Buffer::Output(i))
            .collect();
        if let Some(&Buffer::Scratch(i)) = self.source.get(&v) {
            out.push(Buffer::Scratch(i));
        }
        out
    }

    /// Whether `v` is read from a buffer in stage `stage`: an input, or a value materialised
    /// in an earlier stage.
    pub fn is_leaf_in(&self, v: Value, stage: usize) -> bool {
        self.func.args().contains(&v) || self.stage_of.get(&v).is_some_and(|&s| s < stage)
    }

    /// The position of buffer `b` in the ABI's buffer array.
    pub fn slot(&self, b: Buffer) -> usize {
        let inputs = self.func.args().len();
        match b {
            Buffer::Input(i) => i,
            Buffer::Output(i) => inputs + i,
            Buffer::Scratch(i) => inputs + self.outputs.len() + i,
        }
    }

    pub fn buffer_count(&self) -> usize {
        self.func.args().len() + self.outputs.len() + self.scratch.len()
    }

    pub fn symbol_index(&self, s: &Symbol) -> usize {
        self.symbols
            .iter()
            .position(|x| x == s)
            .expect("every symbol of the kernel is listed")
    }

    pub fn extent(&self, d: &Dim, sizes: &[i64]) -> i64 {
        match d {
            Dim::Fixed(n) => *n as i64,
            Dim::Sym(s) => sizes[self.symbol_index(s)],
        }
    }

    /// The element count of `v` under the symbol sizes `sizes`.
    pub fn len_of(&self, v: Value, sizes: &[i64]) -> i64 {
        self.ty(v)
            .shape
            .0
            .iter()
            .map(|d| self.extent(d, sizes))
            .product()
    }

    /// How a materialised value sits in a rows stage over `domain`.
    pub fn row_role(&self, v: Value, domain: &Shape) -> Option<RowRole> {
        let shape = &self.ty(v).shape;
        if let Some((input, axes)) = self.reduction(v) {
            let rank = domain.rank();
            let last_only = rank >= 1 && axes == [rank - 1];
            return (last_only && self.ty(input).shape == *domain).then_some(RowRole::Reduce);
        }
        if shape == domain {
            return Some(RowRole::Element);
        }
        let rank = domain.rank();
        if rank == 0 {
            return None;
        }
        let row = &domain.0[..rank - 1];
        let is_row = shape.0 == row
            || (shape.0.len() == rank && shape.0[..rank - 1] == *row && shape.0[rank - 1].is_one());
        is_row.then_some(RowRole::Row)
    }

    /// How a value is read where it is computed: axis `a` by domain axis `a` (a row value's
    /// axes are the domain's leading axes), except axes of size 1.
    pub fn identity_mapping(shape: &Shape) -> Mapping {
        shape
            .0
            .iter()
            .enumerate()
            .map(|(a, d)| (!d.is_one()).then_some(a as u8))
            .collect()
    }

    /// The operands of `v`, each with the mapping under which reading `v` under `map` reads it.
    /// Empty for leaves (arguments, constants, iota, reductions).
    pub fn operand_mappings(&self, v: Value, map: &Mapping) -> Vec<(Value, Mapping)> {
        let Some((op, args)) = self.op(v) else {
            return Vec::new();
        };
        match op {
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. } => {
                args.iter().map(|&a| (a, map.clone())).collect()
            }
            Op::Broadcast { .. } => {
                let from = &self.ty(args[0]).shape;
                let offset = map.len() - from.rank();
                let m = (0..from.rank())
                    .map(|a| {
                        if from.0[a].is_one() {
                            None
                        } else {
                            map[a + offset]
                        }
                    })
                    .collect();
                vec![(args[0], m)]
            }
            Op::Reshape { .. } => {
                // Non-unit axes correspond in order.
                let from = &self.ty(args[0]).shape;
                let to = &self.ty(v).shape;
                let mut targets = (0..to.rank())
                    .filter(|&a| !to.0[a].is_one())
                    .map(|a| map[a]);
                let m = (0..from.rank())
                    .map(|a| {
                        if from.0[a].is_one() {
                            None
                        } else {
                            targets.next().flatten()
                        }
                    })
                    .collect();
                vec![(args[0], m)]
            }
            _ => Vec::new(),
        }
    }

    /// What computing materialised `v` in its stage reads from buffers or registers: each
    /// leaf or same-stage reduction with its mapping, through the elementwise ops in between.
    pub fn reads(&self, v: Value) -> Vec<(Value, Mapping)> {
        let stage = self.stage_of[&v];
        self.reads_in(v, stage)
    }

    fn reads_in(&self, v: Value, stage: usize) -> Vec<(Value, Mapping)> {
        let start = match self.reduction(v) {
            Some((input, _)) => (input, Self::identity_mapping(&self.ty(input).shape)),
            None => (v, Self::identity_mapping(&self.ty(v).shape)),
        };
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut stack = vec![start];
        while let Some((x, map)) = stack.pop() {
            if !seen.insert((x, map.clone())) {
                continue;
            }
            // Reductions are placed before what reads them: in an earlier stage (a leaf) or
            // in this one (a register).
            if self.is_leaf_in(x, stage) || self.reduction(x).is_some() {
                out.push((x, map));
                continue;
            }
            stack.extend(self.operand_mappings(x, &map));
        }
        out
    }

    /// Whether output `output` may be written over the buffer of input `input`: the output's
    /// stage is a rows stage of elementwise values only, reading the input only at the element
    /// being written, and reading it in the output's own computation — so each element is
    /// loaded before it is overwritten, and later reads in the same iteration reuse the loaded
    /// value — and no later stage reads the input. (Earlier stages, such as the scalars of an
    /// optimizer step, have read it by then.)
    pub fn can_update_in_place(&self, input: usize, output: usize) -> bool {
        let arg = self.func.args()[input];
        let out = self.outputs[output];
        if self.ty(arg) != self.ty(out) || self.func.args().contains(&out) {
            return false;
        }
        let Some(&home) = self.stage_of.get(&out) else {
            return false;
        };
        let reads_arg = |v: Value| self.reads(v).iter().any(|(x, _)| *x == arg);
        if (self.stages[home + 1..].iter()).any(|later| later.values.iter().any(|&v| reads_arg(v)))
        {
            return false;
        }
        let stage = &self.stages[home];
        let elementwise = (stage.values.iter())
            .all(|&v| self.row_role(v, &stage.domain) == Some(RowRole::Element));
        if stage.accumulate || !elementwise {
            return false;
        }
        let identity = Self::identity_mapping(&self.ty(arg).shape);
        let aligned = (stage.values.iter()).all(|&v| {
            self.reads(v)
                .iter()
                .all(|(x, map)| *x != arg || *map == identity)
        });
        aligned && reads_arg(out)
    }

    /// Whether a call can fail: integer division (by zero) or a max/min over an empty axis.
    pub fn can_fail(&self) -> bool {
        self.func
            .region(self.func.body())
            .insts
            .iter()
            .any(|&inst| {
                let data = self.func.inst(inst);
                let int_div = data.op == Op::Binary(kiln_ir::BinaryOp::Div)
                    && !self.ty(data.results[0]).dtype.is_float();
                let extreme = matches!(
                    data.op,
                    Op::Reduce {
                        op: ReduceOp::Max | ReduceOp::Min,
                        ..
                    }
                );
                int_div || extreme
            })
    }

    /// A rough cost of one element of stage `stage`: 1 per op, more for transcendentals.
    pub fn cost_per_element(&self, stage: usize) -> i64 {
        let mut seen = HashSet::new();
        let mut stack: Vec<Value> = self.stages[stage].values.clone();
        let mut cost = 1;
        while let Some(v) = stack.pop() {
            if !seen.insert(v) || self.is_leaf_in(v, stage) {
                continue;
            }
            let Some((op, args)) = self.op(v) else {
                continue;
            };
            cost += match op {
                op if is_transcendental(op) => 16,
                Op::Broadcast { .. } | Op::Reshape { .. } | Op::Const { .. } => 0,
                _ => 1,
            };
            stack.extend(args.iter().copied());
        }
        cost
    }

    /// Whether `v`, placed in stage `index`, reads that stage's reductions only in their own
    /// row (so their registers hold what it needs).
    fn reads_registers_canonically(&self, v: Value, index: usize) -> bool {
        self.reads_in(v, index).into_iter().all(|(x, map)| {
            self.stage_of.get(&x) != Some(&index)
                || map == Self::identity_mapping(&self.ty(x).shape)
        })
    }
}

/// Whether `op` evaluates a transcendental function per element (a polynomial or a call),
/// which costs an order of magnitude more than arithmetic: the op table's cost class.
pub(crate) fn is_transcendental(op: &Op) -> bool {
    op.cost() == Cost::Transcendental
}

/// How a materialised value sits in a rows stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowRole {
    /// The domain's shape: computed along each row.
    Element,
    /// A reduction of the domain's last axis: accumulated along each row.
    Reduce,
    /// The row shape (with or without a trailing axis of size 1): one value per row.
    Row,
}
