//! Cranelift code for one stage of a [`KernelPlan`].
//!
//! A stage function loops over rows `begin..end` of its domain; inside a row it runs *inner
//! loops* along the last axis, each computing a group of the stage's values:
//!
//! ```text
//! entry:  buffer pointers, sizes, strides, constants          (Level::Entry)
//! row r:  row indices, row base addresses, row-invariant ops  (Level::Row)
//!         inner loop, f32x4 × UNROLL: loads, ops, stores, vector accumulators
//!         inner loop, scalar tail
//!         reductions finished: registers for the rest of the row
//! ```
//!
//! Every expression is emitted at the outermost level where its inputs are known
//! ([`Gen::hoist`]), and memoised per scope, so a broadcast operand is loaded once per row and
//! a constant once per call. f32 groups are vectorised when every op in them has a vector form;
//! everything else (f64, integers, bool in memory, ops whose table row says `Scalar`) runs scalar.

use super::JitError;
use super::math::{self, Lanes};
use super::plan::{self, KernelPlan, Mapping, RowRole};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, Block, FuncRef, InstBuilder, MemFlagsData, Type as ClType, Value as CValue, types,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{Linkage, Module};
use kiln_ir::{BinaryOp, CompareOp, DType, Dim, Literal, Op, ReduceOp, UnaryOp, Value, VectorForm};
use std::collections::{HashMap, HashSet};

/// f32 lanes per vector (Cranelift's vectors are 128-bit on x86_64).
const LANES: i64 = 4;
/// Vector iterations per inner-loop trip.
const UNROLL: i64 = 2;

/// Where an expression can be computed: once per call, once per row, or per element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Entry,
    Row,
    Inner,
}

/// A buffer's stride along one domain axis, in elements.
#[derive(Clone, Copy)]
enum Stride {
    Zero,
    Const(i64),
    Dyn(CValue),
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Memo {
    /// A value read under a mapping, scalar or vector.
    Value(Value, Mapping, bool),
    /// The address of a buffer's element at the current row and inner position 0.
    Base(usize, Mapping),
}

/// What an inner loop does with a value of its group.
#[derive(Clone, Copy)]
enum Work {
    /// Computes a value of the domain's shape and stores it to its destinations.
    Store(Value),
    /// Reduces the row into a register (then stored to the reduction's destinations).
    Reduce(Value),
    /// Reduces the row into a register, then combines it into the reduction's buffer.
    ReduceInto(Value),
    /// Combines each element into the reduction's buffer.
    Combine(Value),
}

impl Work {
    fn value(self) -> Value {
        match self {
            Work::Store(v) | Work::Reduce(v) | Work::ReduceInto(v) | Work::Combine(v) => v,
        }
    }
}

/// Builds stage `stage` of `plan` into `func`, whose signature is the kernel ABI.
pub fn build_stage(
    module: &mut JITModule,
    func: &mut cranelift_codegen::ir::Function,
    builder_ctx: &mut FunctionBuilderContext,
    plan: &KernelPlan,
    stage: usize,
) -> Result<(), JitError> {
    let config = module.target_config();
    let mut b = FunctionBuilder::new(func, builder_ctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let params = b.block_params(entry).to_vec();
    let (buffer_array, size_array, begin, end) = (params[0], params[1], params[2], params[3]);
    let ptr = config.pointer_type();
    let ptr_bytes = ptr.bytes() as i32;
    let buffers = (0..plan.buffer_count())
        .map(|slot| {
            b.ins()
                .load(ptr, flags(), buffer_array, slot as i32 * ptr_bytes)
        })
        .collect();
    let sizes = (0..plan.symbols.len())
        .map(|i| b.ins().load(types::I64, flags(), size_array, i as i32 * 8))
        .collect();
    let status = b.declare_var(types::I32);
    let zero = b.ins().iconst(types::I32, 0);
    b.def_var(status, zero);
    let domain = &plan.stages[stage].domain;
    let dims = if domain.rank() == 0 {
        vec![Dim::Fixed(1)]
    } else {
        domain.0.clone()
    };
    let mut g = Gen {
        b,
        module,
        plan,
        stage,
        dims,
        buffers,
        sizes,
        extents: Vec::new(),
        strides: HashMap::new(),
        status,
        row_index: Vec::new(),
        inner: None,
        scopes: vec![HashMap::new()],
        levels: HashMap::new(),
        imports: HashMap::new(),
        stash_in: Vec::new(),
        stash_out: Vec::new(),
    };
    g.extents = g.dims.clone().iter().map(|d| g.extent(d)).collect();
    g.run(begin, end);
    g.b.finalize(config);
    Ok(())
}

fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

fn clif_type(dtype: DType) -> ClType {
    match dtype {
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::Bool => types::I8,
    }
}

struct Gen<'a, 'f> {
    b: FunctionBuilder<'f>,
    module: &'a mut JITModule,
    plan: &'a KernelPlan,
    stage: usize,
    /// The domain (a scalar domain is `[1]`).
    dims: Vec<Dim>,
    buffers: Vec<CValue>,
    sizes: Vec<CValue>,
    extents: Vec<CValue>,
    strides: HashMap<(usize, Mapping), Vec<Stride>>,
    status: Variable,
    /// The current row's index along each row axis.
    row_index: Vec<CValue>,
    /// The current position along the last axis.
    inner: Option<CValue>,
    scopes: Vec<HashMap<Memo, CValue>>,
    levels: HashMap<(Value, Mapping), Level>,
    imports: HashMap<&'static str, FuncRef>,
    /// Stashes the current inner loop writes, and those it reads back.
    stash_in: Vec<Stash>,
    stash_out: Vec<Stash>,
}

/// A part of a rows stage's work along one row.
enum Segment {
    /// Values sharing one inner loop.
    Group(Vec<Work>),
    /// A value of the row shape, computed once per row.
    Row(Value),
}

/// An expression one inner loop stores in an output's row for the next loop to load.
#[derive(Clone)]
struct Stash {
    value: Value,
    map: Mapping,
    slot: usize,
    slot_map: Mapping,
    /// The segment that computes and stores it, and the one that loads it.
    by: usize,
    for_group: usize,
}

/// A counted loop under construction: the builder is inside its body.
struct Loop {
    var: Variable,
    header: Block,
    exit: Block,
    index: CValue,
}

impl Gen<'_, '_> {
    fn run(&mut self, begin: CValue, end: CValue) {
        self.precompute_strides();
        self.check_empty_reductions();
        if self.plan.stages[self.stage].accumulate {
            self.accumulate(begin, end);
        } else {
            self.rows(begin, end);
        }
        let status = self.b.use_var(self.status);
        self.b.ins().return_(&[status]);
    }

    fn inner_axis(&self) -> u8 {
        (self.dims.len() - 1) as u8
    }

    fn dtype(&self, v: Value) -> DType {
        self.plan.ty(v).dtype
    }

    fn extent(&mut self, d: &Dim) -> CValue {
        match d {
            Dim::Fixed(n) => self.b.ins().iconst(types::I64, *n as i64),
            Dim::Sym(s) => self.sizes[self.plan.symbol_index(s)],
        }
    }

    // ----- structure -----

    /// Opens `for index in start..end` (stepping by `step` at `end_loop`).
    fn begin_loop(&mut self, start: CValue, end: CValue) -> Loop {
        let var = self.b.declare_var(types::I64);
        self.b.def_var(var, start);
        let header = self.b.create_block();
        let body = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(header, &[]);
        self.b.switch_to_block(header);
        let index = self.b.use_var(var);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, index, end);
        self.b.ins().brif(more, body, &[], exit, &[]);
        self.b.switch_to_block(body);
        self.b.seal_block(body);
        Loop {
            var,
            header,
            exit,
            index,
        }
    }

    fn end_loop(&mut self, l: Loop, step: i64) {
        let next = self.b.ins().iadd_imm_s(l.index, step);
        self.b.def_var(l.var, next);
        self.b.ins().jump(l.header, &[]);
        self.b.seal_block(l.header);
        self.b.switch_to_block(l.exit);
        self.b.seal_block(l.exit);
    }

    /// Returns status 2 at once when a max or min reduction has nothing to reduce.
    fn check_empty_reductions(&mut self) {
        let plan = self.plan;
        let stage = &plan.stages[self.stage];
        for &v in &stage.values {
            let Some((ReduceOp::Max | ReduceOp::Min, _)) = plan.reduce_op(v) else {
                continue;
            };
            let (_, axes) = plan.reduction(v).expect("a reduction");
            let count = self.reduced_count(&axes);
            let empty = self.b.ins().icmp_imm_s(IntCC::Equal, count, 0);
            let fail = self.b.create_block();
            let go_on = self.b.create_block();
            self.b.ins().brif(empty, fail, &[], go_on, &[]);
            self.b.switch_to_block(fail);
            self.b.seal_block(fail);
            let code = self
                .b
                .ins()
                .iconst(types::I32, super::Status::EmptyReduction as i64);
            self.b.ins().return_(&[code]);
            self.b.switch_to_block(go_on);
            self.b.seal_block(go_on);
        }
    }

    /// The number of elements reduced into each result (over the domain's `axes`).
    fn reduced_count(&mut self, axes: &[usize]) -> CValue {
        let mut count = self.b.ins().iconst(types::I64, 1);
        for &a in axes {
            count = self.b.ins().imul(count, self.extents[a]);
        }
        count
    }

    fn decompose_row(&mut self, r: CValue) {
        let row_axes = self.dims.len() - 1;
        let mut index = vec![r; row_axes];
        let mut rest = r;
        for k in (1..row_axes).rev() {
            index[k] = self.b.ins().urem(rest, self.extents[k]);
            rest = self.b.ins().udiv(rest, self.extents[k]);
        }
        if row_axes > 0 {
            index[0] = rest;
        }
        self.row_index = index;
    }

    fn roots(&self, works: &[Work]) -> Vec<(Value, Mapping)> {
        works.iter().map(|w| self.root(*w)).collect()
    }

    /// The expression a work item evaluates per element.
    fn root(&self, w: Work) -> (Value, Mapping) {
        let v = match w {
            Work::Store(v) => v,
            Work::Reduce(v) | Work::ReduceInto(v) | Work::Combine(v) => {
                self.plan.reduction(v).expect("a reduction").0
            }
        };
        (v, KernelPlan::identity_mapping(&self.plan.ty(v).shape))
    }

    fn rows(&mut self, begin: CValue, end: CValue) {
        let plan = self.plan;
        let stage = &plan.stages[self.stage];
        let domain = stage.domain.clone();
        let all: Vec<(Value, Mapping)> = stage
            .values
            .iter()
            .map(|&v| match plan.row_role(v, &domain) {
                Some(RowRole::Reduce) => self.root(Work::Reduce(v)),
                _ => self.root(Work::Store(v)),
            })
            .collect();
        self.hoist(&all, Level::Entry, false);
        let segments = self.segments();
        let stashes = self.stashes(&segments);
        let l = self.begin_loop(begin, end);
        self.scopes.push(HashMap::new());
        self.decompose_row(l.index);
        for (index, segment) in segments.iter().enumerate() {
            match segment {
                Segment::Row(v) => {
                    let map = KernelPlan::identity_mapping(&plan.ty(*v).shape);
                    let x = self.emit(*v, &map, false);
                    self.store_to_destinations(*v, &map, x, false);
                }
                Segment::Group(works) => {
                    self.stash_in = stashes.iter().filter(|s| s.by == index).cloned().collect();
                    self.stash_out = stashes
                        .iter()
                        .filter(|s| s.for_group == index)
                        .cloned()
                        .collect();
                    self.inner_loop(works);
                    self.stash_in.clear();
                    self.stash_out.clear();
                }
            }
        }
        self.scopes.pop();
        self.row_index.clear();
        self.end_loop(l, 1);
    }

    /// The stage's values in the order they are computed along a row: groups of values that
    /// share one inner loop, and row values between them. A value that reads a reduction of
    /// the current group starts the next group.
    fn segments(&self) -> Vec<Segment> {
        let plan = self.plan;
        let stage = &plan.stages[self.stage];
        let mut segments = Vec::new();
        let mut group: Vec<Work> = Vec::new();
        for &v in &stage.values {
            match plan.row_role(v, &stage.domain) {
                Some(RowRole::Row) | None => {
                    if !group.is_empty() {
                        segments.push(Segment::Group(std::mem::take(&mut group)));
                    }
                    segments.push(Segment::Row(v));
                }
                Some(role) => {
                    let reads_group =
                        (plan.reads(v).iter()).any(|(x, _)| group.iter().any(|w| w.value() == *x));
                    if reads_group {
                        segments.push(Segment::Group(std::mem::take(&mut group)));
                    }
                    group.push(if role == RowRole::Reduce {
                        Work::Reduce(v)
                    } else {
                        Work::Store(v)
                    });
                }
            }
        }
        if !group.is_empty() {
            segments.push(Segment::Group(group));
        }
        segments
    }

    /// Expensive expressions (with a transcendental) that a group computes and the next group
    /// needs again: the first group stores each into the row of an output the second group
    /// writes, and the second loads it back instead of computing it again — softmax computes
    /// `exp(x − max)` once.
    fn stashes(&mut self, segments: &[Segment]) -> Vec<Stash> {
        let plan = self.plan;
        let groups: Vec<usize> = (0..segments.len())
            .filter(|&i| matches!(segments[i], Segment::Group(_)))
            .collect();
        let mut stashes = Vec::new();
        for pair in groups.windows(2) {
            let (Segment::Group(first), Segment::Group(second)) =
                (&segments[pair[0]], &segments[pair[1]])
            else {
                continue;
            };
            let computed = self.inner_nodes(&self.roots(first));
            for &w in second {
                let Work::Store(y) = w else { continue };
                let Some(&dest) = plan.destinations(y).first() else {
                    continue;
                };
                let y_map = KernelPlan::identity_mapping(&plan.ty(y).shape);
                // The largest expensive subexpression of `y` that the first group computed.
                let mut stack = vec![(y, y_map.clone())];
                let mut seen = HashSet::new();
                while let Some((v, map)) = stack.pop() {
                    if !seen.insert((v, map.clone()))
                        || self.level(v, &map) < Level::Inner
                        || plan.is_leaf_in(v, self.stage)
                    {
                        continue;
                    }
                    if v != y
                        && computed.contains(&(v, map.clone()))
                        && self.expensive(v, &map)
                        && self.dtype(v) == self.dtype(y)
                    {
                        stashes.push(Stash {
                            value: v,
                            map,
                            slot: plan.slot(dest),
                            slot_map: y_map.clone(),
                            by: pair[0],
                            for_group: pair[1],
                        });
                        break;
                    }
                    stack.extend(plan.operand_mappings(v, &map));
                }
            }
        }
        stashes
    }

    /// The per-element nodes of the expressions `roots`.
    fn inner_nodes(&mut self, roots: &[(Value, Mapping)]) -> HashSet<(Value, Mapping)> {
        let mut out = HashSet::new();
        let mut stack = roots.to_vec();
        while let Some((v, map)) = stack.pop() {
            if self.level(v, &map) < Level::Inner
                || !out.insert((v, map.clone()))
                || self.plan.is_leaf_in(v, self.stage)
            {
                continue;
            }
            stack.extend(self.plan.operand_mappings(v, &map));
        }
        out
    }

    /// Whether computing `v` per element involves a transcendental function.
    fn expensive(&mut self, v: Value, map: &Mapping) -> bool {
        (self.inner_nodes(&[(v, map.clone())]).iter()).any(|(x, _)| {
            self.plan
                .op(*x)
                .is_some_and(|(op, _)| plan::is_transcendental(op))
        })
    }

    fn accumulate(&mut self, begin: CValue, end: CValue) {
        let plan = self.plan;
        let v = plan.stages[self.stage].values[0];
        let (input, axes) = plan.reduction(v).expect("an accumulate stage reduces");
        let (op, _) = plan.reduce_op(v).expect("a reduction");
        let dtype = self.dtype(v);
        let primary = plan.slot(plan.source[&v]);
        let size = dtype.size_bytes() as i64;
        let out_len = self.value_len(v);
        let root = self.root(Work::Combine(v));
        self.hoist(std::slice::from_ref(&root), Level::Entry, false);
        // Start from the identity.
        let identity = self.identity(op, dtype, false);
        let l = self.begin_loop_from_zero(out_len);
        let addr = self.element_address(primary, l.index, size);
        self.b.ins().store(flags(), identity, addr, 0);
        self.end_loop(l, 1);

        let rank = plan.ty(input).rank();
        let inner_reduced = rank >= 1 && axes.contains(&(rank - 1));
        let work = if inner_reduced {
            Work::ReduceInto(v)
        } else {
            Work::Combine(v)
        };
        let l = self.begin_loop(begin, end);
        self.scopes.push(HashMap::new());
        self.decompose_row(l.index);
        self.inner_loop(&[work]);
        self.scopes.pop();
        self.row_index.clear();
        self.end_loop(l, 1);

        // Finish: the mean's division, and copies to further destinations.
        let others: Vec<usize> = (plan.destinations(v).into_iter())
            .map(|d| plan.slot(d))
            .filter(|&s| s != primary)
            .collect();
        if op == ReduceOp::Mean || !others.is_empty() {
            let count = self.reduced_count(&axes);
            let count = self.b.ins().fcvt_from_sint(clif_type(dtype), count);
            let l = self.begin_loop_from_zero(out_len);
            let addr = self.element_address(primary, l.index, size);
            let mut x = self.b.ins().load(clif_type(dtype), flags(), addr, 0);
            if op == ReduceOp::Mean {
                x = self.b.ins().fdiv(x, count);
                self.b.ins().store(flags(), x, addr, 0);
            }
            for &slot in &others {
                let addr = self.element_address(slot, l.index, size);
                self.b.ins().store(flags(), x, addr, 0);
            }
            self.end_loop(l, 1);
        }
    }

    fn begin_loop_from_zero(&mut self, end: CValue) -> Loop {
        let zero = self.b.ins().iconst(types::I64, 0);
        self.begin_loop(zero, end)
    }

    fn value_len(&mut self, v: Value) -> CValue {
        let dims = self.plan.ty(v).shape.0.clone();
        let mut len = self.b.ins().iconst(types::I64, 1);
        for d in &dims {
            let e = self.extent(d);
            len = self.b.ins().imul(len, e);
        }
        len
    }

    fn element_address(&mut self, slot: usize, index: CValue, size: i64) -> CValue {
        let offset = self.b.ins().imul_imm_s(index, size);
        self.b.ins().iadd(self.buffers[slot], offset)
    }

    /// The mapping of a reduction's output buffer over its input's domain.
    fn output_mapping(&self, v: Value) -> Mapping {
        let (input, axes) = self.plan.reduction(v).expect("a reduction");
        let (_, keep_dims) = self.plan.reduce_op(v).expect("a reduction");
        let in_shape = &self.plan.ty(input).shape;
        let kept = (0..in_shape.rank()).filter(|a| !axes.contains(a));
        if keep_dims {
            (0..in_shape.rank())
                .map(|a| (!axes.contains(&a) && !in_shape.0[a].is_one()).then_some(a as u8))
                .collect()
        } else {
            kept.map(|a| (!in_shape.0[a].is_one()).then_some(a as u8))
                .collect()
        }
    }

    /// One inner loop computing `works` along the current row: vectorised (unrolled) when it
    /// can be, then a scalar tail.
    fn inner_loop(&mut self, works: &[Work]) {
        if works.is_empty() {
            return;
        }
        let plan = self.plan;
        let n = self.extents[self.dims.len() - 1];
        let roots = self.roots(works);
        let vector = self.vectorizable(works);
        self.hoist(&roots, Level::Row, vector);
        for &w in works {
            for (slot, map) in self.work_destinations(w) {
                self.base(slot, &map);
            }
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        // One accumulator per reduction (per unrolled copy when vectorised).
        let mut scalar_accs: Vec<Option<Variable>> = Vec::new();
        let mut start = zero;
        if vector {
            let step = LANES * UNROLL;
            let vec_end = self.b.ins().band_imm_s(n, !(step - 1));
            let mut vector_accs: Vec<Vec<Variable>> = Vec::new();
            for &w in works {
                let accs = match w {
                    Work::Reduce(v) | Work::ReduceInto(v) => {
                        let (op, _) = plan.reduce_op(v).expect("a reduction");
                        let init = self.identity(op, DType::F32, true);
                        (0..UNROLL)
                            .map(|_| {
                                let var = self.b.declare_var(types::F32X4);
                                self.b.def_var(var, init);
                                var
                            })
                            .collect()
                    }
                    _ => Vec::new(),
                };
                vector_accs.push(accs);
            }
            let l = self.begin_loop(zero, vec_end);
            for u in 0..UNROLL {
                self.scopes.push(HashMap::new());
                self.inner = Some(self.b.ins().iadd_imm_s(l.index, u * LANES));
                for (i, &w) in works.iter().enumerate() {
                    let acc = vector_accs[i].get(u as usize).copied();
                    self.element(w, acc, true);
                }
                self.store_stashes(true);
                self.scopes.pop();
            }
            self.end_loop(l, step);
            for (i, &w) in works.iter().enumerate() {
                if let Work::Reduce(v) | Work::ReduceInto(v) = w {
                    let (op, _) = plan.reduce_op(v).expect("a reduction");
                    let mut acc = self.b.use_var(vector_accs[i][0]);
                    for &other in &vector_accs[i][1..] {
                        let x = self.b.use_var(other);
                        acc = self.combine(op, DType::F32, acc, x);
                    }
                    let total = self.horizontal(op, acc);
                    let var = self.b.declare_var(types::F32);
                    self.b.def_var(var, total);
                    scalar_accs.push(Some(var));
                } else {
                    scalar_accs.push(None);
                }
            }
            start = vec_end;
        } else {
            for &w in works {
                scalar_accs.push(match w {
                    Work::Reduce(v) | Work::ReduceInto(v) => {
                        let (op, _) = plan.reduce_op(v).expect("a reduction");
                        let dtype = self.dtype(v);
                        let init = self.identity(op, dtype, false);
                        let var = self.b.declare_var(clif_type(dtype));
                        self.b.def_var(var, init);
                        Some(var)
                    }
                    _ => None,
                });
            }
        }
        let l = self.begin_loop(start, n);
        self.scopes.push(HashMap::new());
        self.inner = Some(l.index);
        for (i, &w) in works.iter().enumerate() {
            self.element(w, scalar_accs[i], false);
        }
        self.store_stashes(false);
        self.scopes.pop();
        self.inner = None;
        self.end_loop(l, 1);
        for (i, &w) in works.iter().enumerate() {
            match w {
                Work::Reduce(v) => {
                    let total =
                        self.finish_reduction(v, scalar_accs[i].expect("an accumulator"), n);
                    let map = KernelPlan::identity_mapping(&plan.ty(v).shape);
                    self.scopes
                        .last_mut()
                        .expect("a row scope")
                        .insert(Memo::Value(v, map.clone(), false), total);
                    self.store_to_destinations(v, &map, total, false);
                }
                Work::ReduceInto(v) => {
                    let (op, _) = plan.reduce_op(v).expect("a reduction");
                    let dtype = self.dtype(v);
                    let total = self.b.use_var(scalar_accs[i].expect("an accumulator"));
                    let map = self.output_mapping(v);
                    let slot = plan.slot(plan.source[&v]);
                    let addr = self.base(slot, &map);
                    let old = self.b.ins().load(clif_type(dtype), flags(), addr, 0);
                    let new = self.combine(op, dtype, old, total);
                    self.b.ins().store(flags(), new, addr, 0);
                }
                Work::Store(_) | Work::Combine(_) => {}
            }
        }
    }

    /// Stores this iteration's stashed expressions for the next inner loop.
    fn store_stashes(&mut self, vector: bool) {
        for stash in self.stash_in.clone() {
            let x = self.emit(stash.value, &stash.map, vector);
            let addr = self.address(stash.slot, &stash.slot_map, self.dtype(stash.value));
            self.b.ins().store(flags(), x, addr, 0);
        }
    }

    /// The buffers (and mappings) a work item writes.
    fn work_destinations(&self, w: Work) -> Vec<(usize, Mapping)> {
        let plan = self.plan;
        match w {
            Work::Store(v) => {
                let map = KernelPlan::identity_mapping(&plan.ty(v).shape);
                plan.destinations(v)
                    .into_iter()
                    .map(|d| (plan.slot(d), map.clone()))
                    .collect()
            }
            Work::Combine(v) | Work::ReduceInto(v) => {
                vec![(plan.slot(plan.source[&v]), self.output_mapping(v))]
            }
            Work::Reduce(_) => Vec::new(),
        }
    }

    /// The work of one element (or one vector of elements) at the current inner position.
    fn element(&mut self, w: Work, acc: Option<Variable>, vector: bool) {
        let (root, map) = self.root(w);
        let x = self.emit(root, &map, vector);
        match w {
            Work::Store(v) => self.store_to_destinations(v, &map, x, vector),
            Work::Reduce(v) | Work::ReduceInto(v) => {
                let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                let var = acc.expect("an accumulator");
                let old = self.b.use_var(var);
                let new = self.combine(op, self.dtype(v), old, x);
                self.b.def_var(var, new);
            }
            Work::Combine(v) => {
                let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                let dtype = self.dtype(v);
                let slot = self.plan.slot(self.plan.source[&v]);
                let out_map = self.output_mapping(v);
                let addr = self.address(slot, &out_map, dtype);
                let ty = if vector {
                    types::F32X4
                } else {
                    clif_type(dtype)
                };
                let old = self.b.ins().load(ty, flags(), addr, 0);
                let new = self.combine(op, dtype, old, x);
                self.b.ins().store(flags(), new, addr, 0);
            }
        }
    }

    fn store_to_destinations(&mut self, v: Value, map: &Mapping, x: CValue, _vector: bool) {
        let plan = self.plan;
        let dtype = self.dtype(v);
        for d in plan.destinations(v) {
            let addr = self.address(plan.slot(d), map, dtype);
            self.b.ins().store(flags(), x, addr, 0);
        }
    }

    fn finish_reduction(&mut self, v: Value, acc: Variable, n: CValue) -> CValue {
        let total = self.b.use_var(acc);
        match self.plan.reduce_op(v) {
            Some((ReduceOp::Mean, _)) => {
                let ty = clif_type(self.dtype(v));
                let count = self.b.ins().fcvt_from_sint(ty, n);
                self.b.ins().fdiv(total, count)
            }
            _ => total,
        }
    }

    // ----- addresses -----

    /// Strides of every buffer the stage reads or writes, computed once in the entry block.
    fn precompute_strides(&mut self) {
        let plan = self.plan;
        let stage = &plan.stages[self.stage];
        let mut uses: Vec<(usize, Mapping)> = Vec::new();
        for &v in &stage.values {
            for (x, map) in plan.reads(v) {
                if let Some(&buffer) = plan.source.get(&x)
                    && plan.is_leaf_in(x, self.stage)
                {
                    uses.push((plan.slot(buffer), map));
                }
            }
            let works = if stage.accumulate {
                vec![Work::Combine(v)]
            } else {
                vec![Work::Store(v)]
            };
            for w in works {
                uses.extend(self.work_destinations(w));
            }
        }
        for (slot, map) in uses {
            if !self.strides.contains_key(&(slot, map.clone())) {
                let strides = self.compute_strides(slot, &map);
                self.strides.insert((slot, map), strides);
            }
        }
    }

    /// The value held in buffer slot `slot`.
    fn slot_value(&self, slot: usize) -> Value {
        let plan = self.plan;
        let inputs = plan.func.args().len();
        if slot < inputs {
            plan.func.args()[slot]
        } else if slot < inputs + plan.outputs.len() {
            plan.outputs[slot - inputs]
        } else {
            plan.scratch[slot - inputs - plan.outputs.len()]
        }
    }

    fn compute_strides(&mut self, slot: usize, map: &Mapping) -> Vec<Stride> {
        let shape = self.plan.ty(self.slot_value(slot)).shape.clone();
        let mut out = vec![Stride::Zero; self.dims.len()];
        // Row-major strides, from the last axis.
        let mut stride = Stride::Const(1);
        for a in (0..shape.rank()).rev() {
            if let Some(k) = map[a] {
                out[k as usize] = self.add_stride(out[k as usize], stride);
            }
            stride = match (&shape.0[a], stride) {
                (Dim::Fixed(n), Stride::Const(s)) => Stride::Const(s * *n as i64),
                (d, s) => {
                    let e = self.extent(d);
                    let s = self.stride_value(s);
                    Stride::Dyn(self.b.ins().imul(s, e))
                }
            };
        }
        out
    }

    fn add_stride(&mut self, a: Stride, b: Stride) -> Stride {
        match (a, b) {
            (Stride::Zero, s) | (s, Stride::Zero) => s,
            (Stride::Const(x), Stride::Const(y)) => Stride::Const(x + y),
            (x, y) => {
                let (x, y) = (self.stride_value(x), self.stride_value(y));
                Stride::Dyn(self.b.ins().iadd(x, y))
            }
        }
    }

    fn stride_value(&mut self, s: Stride) -> CValue {
        match s {
            Stride::Zero => self.b.ins().iconst(types::I64, 0),
            Stride::Const(c) => self.b.ins().iconst(types::I64, c),
            Stride::Dyn(v) => v,
        }
    }

    fn strides(&mut self, slot: usize, map: &Mapping) -> Vec<Stride> {
        match self.strides.get(&(slot, map.clone())) {
            Some(s) => s.clone(),
            // Not precomputed (every use should be): correct, only slower.
            None => self.compute_strides(slot, map),
        }
    }

    /// The address of the buffer's element at the current row, inner position 0.
    fn base(&mut self, slot: usize, map: &Mapping) -> CValue {
        let key = Memo::Base(slot, map.clone());
        if let Some(x) = self.lookup(&key) {
            return x;
        }
        let size = self.plan.ty(self.slot_value(slot)).dtype.size_bytes() as i64;
        let strides = self.strides(slot, map);
        let mut offset: Option<CValue> = None;
        for (k, &stride) in strides.iter().enumerate().take(self.dims.len() - 1) {
            let term = match stride {
                Stride::Zero => continue,
                Stride::Const(c) => self.b.ins().imul_imm_s(self.row_index[k], c * size),
                Stride::Dyn(s) => {
                    let t = self.b.ins().imul(self.row_index[k], s);
                    self.b.ins().imul_imm_s(t, size)
                }
            };
            offset = Some(match offset {
                Some(o) => self.b.ins().iadd(o, term),
                None => term,
            });
        }
        let x = match offset {
            Some(o) => self.b.ins().iadd(self.buffers[slot], o),
            None => self.buffers[slot],
        };
        self.memoise(key, x);
        x
    }

    /// The address of the buffer's element at the current row and inner position.
    fn address(&mut self, slot: usize, map: &Mapping, dtype: DType) -> CValue {
        let base = self.base(slot, map);
        let inner = self.strides(slot, map)[self.dims.len() - 1];
        let size = dtype.size_bytes() as i64;
        let Some(j) = self.inner else {
            return base;
        };
        match inner {
            Stride::Zero => base,
            Stride::Const(c) => {
                let offset = self.b.ins().imul_imm_s(j, c * size);
                self.b.ins().iadd(base, offset)
            }
            Stride::Dyn(s) => {
                let t = self.b.ins().imul(j, s);
                let offset = self.b.ins().imul_imm_s(t, size);
                self.b.ins().iadd(base, offset)
            }
        }
    }

    fn inner_stride_is_unit(&mut self, slot: usize, map: &Mapping) -> bool {
        matches!(
            self.strides(slot, map)[self.dims.len() - 1],
            Stride::Const(1)
        )
    }

    // ----- memo and levels -----

    fn lookup(&self, key: &Memo) -> Option<CValue> {
        self.scopes.iter().rev().find_map(|s| s.get(key).copied())
    }

    fn memoise(&mut self, key: Memo, x: CValue) {
        self.scopes.last_mut().expect("a scope").insert(key, x);
    }

    fn level(&mut self, v: Value, map: &Mapping) -> Level {
        if let Some(&l) = self.levels.get(&(v, map.clone())) {
            return l;
        }
        let plan = self.plan;
        let inner = self.inner_axis();
        let axis_level = |m: Option<u8>| match m {
            None => Level::Entry,
            Some(k) if k == inner => Level::Inner,
            Some(_) => Level::Row,
        };
        let level = if plan.is_leaf_in(v, self.stage) {
            map.iter()
                .map(|&m| axis_level(m))
                .max()
                .unwrap_or(Level::Entry)
        } else {
            match plan.op(v) {
                Some((Op::Reduce { .. }, _)) => Level::Row,
                Some((Op::Const { .. }, _)) => Level::Entry,
                Some((Op::Iota { axis, .. }, _)) => axis_level(map[*axis]),
                // Only where an element is computed can a division by zero be reported.
                Some((Op::Binary(BinaryOp::Div), _)) if !self.dtype(v).is_float() => Level::Inner,
                _ => {
                    let mut l = Level::Entry;
                    for (x, m) in plan.operand_mappings(v, map) {
                        l = l.max(self.level(x, &m));
                    }
                    l
                }
            }
        };
        self.levels.insert((v, map.clone()), level);
        level
    }

    /// Emits, at the current position, every part of the `roots` expressions that is known at
    /// `up_to` (and, at row level, the base addresses of the per-element loads).
    fn hoist(&mut self, roots: &[(Value, Mapping)], up_to: Level, vector: bool) {
        let plan = self.plan;
        let mut seen = HashSet::new();
        let mut stack = roots.to_vec();
        while let Some((v, map)) = stack.pop() {
            if !seen.insert((v, map.clone())) {
                continue;
            }
            if self.level(v, &map) <= up_to {
                // Constants stay where they are used: Cranelift rematerialises them, where a
                // hoisted one would hold a register (or a spill slot) through the loop.
                if !matches!(plan.op(v), Some((Op::Const { .. }, _))) {
                    self.emit(v, &map, vector);
                }
                continue;
            }
            if plan.is_leaf_in(v, self.stage) {
                if up_to == Level::Row {
                    self.base(plan.slot(plan.source[&v]), &map);
                }
                continue;
            }
            stack.extend(plan.operand_mappings(v, &map));
        }
    }

    /// Whether every op of the group's per-element work has an f32x4 form.
    fn vectorizable(&mut self, works: &[Work]) -> bool {
        let plan = self.plan;
        for &w in works {
            if self.dtype(w.value()) != DType::F32 {
                return false;
            }
            for (slot, map) in self.work_destinations(w) {
                if !self.inner_stride_is_unit(slot, &map) {
                    return false;
                }
            }
        }
        let mut seen = HashSet::new();
        let mut stack = self.roots(works);
        while let Some((v, map)) = stack.pop() {
            if !seen.insert((v, map.clone())) {
                continue;
            }
            let dtype = self.dtype(v);
            if self.level(v, &map) < Level::Inner {
                if !matches!(dtype, DType::F32 | DType::Bool) {
                    return false;
                }
                continue;
            }
            if plan.is_leaf_in(v, self.stage) {
                let slot = plan.slot(plan.source[&v]);
                if dtype != DType::F32 || !self.inner_stride_is_unit(slot, &map) {
                    return false;
                }
                continue;
            }
            let (op, args) = plan.op(v).expect("an op");
            let operand = args.first().map(|&a| self.dtype(a));
            let ok = match (dtype, op) {
                (_, Op::Broadcast { .. } | Op::Reshape { .. }) => true,
                (DType::F32, Op::Unary(u)) => u.vector_form() == VectorForm::F32x4,
                (DType::F32, Op::Binary(b)) => b.vector_form() == VectorForm::F32x4,
                (DType::F32, Op::Iota { .. } | Op::Select) => true,
                (DType::F32 | DType::Bool, Op::Cast { .. }) => {
                    matches!(operand, Some(DType::F32 | DType::Bool))
                }
                (DType::Bool, Op::Compare(c)) => {
                    operand == Some(DType::F32) || matches!(c, CompareOp::Eq | CompareOp::Ne)
                }
                (DType::Bool, Op::Unary(UnaryOp::Not) | Op::Binary(_) | Op::Select) => true,
                _ => false,
            };
            if !ok {
                return false;
            }
            stack.extend(plan.operand_mappings(v, &map));
        }
        true
    }

    // ----- values -----

    fn emit(&mut self, v: Value, map: &Mapping, vector: bool) -> CValue {
        let key = Memo::Value(v, map.clone(), vector);
        if let Some(x) = self.lookup(&key) {
            return x;
        }
        let stashed = self
            .stash_out
            .iter()
            .find(|s| s.value == v && s.map == *map)
            .map(|s| (s.slot, s.slot_map.clone()));
        let x = if let Some((slot, slot_map)) = stashed {
            let addr = self.address(slot, &slot_map, self.dtype(v));
            let ty = if vector {
                types::F32X4
            } else {
                clif_type(self.dtype(v))
            };
            self.b.ins().load(ty, flags(), addr, 0)
        } else if vector && self.level(v, map) < Level::Inner {
            let s = self.emit(v, map, false);
            self.splat(self.dtype(v), s)
        } else {
            self.compute(v, map, vector)
        };
        self.memoise(key, x);
        x
    }

    fn compute(&mut self, v: Value, map: &Mapping, vector: bool) -> CValue {
        let plan = self.plan;
        let dtype = self.dtype(v);
        if plan.is_leaf_in(v, self.stage) {
            let slot = plan.slot(plan.source[&v]);
            let addr = self.address(slot, map, dtype);
            let ty = if vector {
                types::F32X4
            } else {
                clif_type(dtype)
            };
            return self.b.ins().load(ty, flags(), addr, 0);
        }
        let (op, args) = plan.op(v).expect("only arguments have no op");
        let operands = plan.operand_mappings(v, map);
        let arg = |g: &mut Self, i: usize| {
            let (x, m) = &operands[i];
            g.emit(*x, m, vector)
        };
        match op {
            Op::Reduce { .. } => {
                panic!("kernel codegen: a reduction is read before it is computed")
            }
            Op::Const { value, .. } => self.constant(value, vector),
            Op::Iota { axis, .. } => self.iota(map[*axis], dtype, vector),
            Op::Broadcast { .. } | Op::Reshape { .. } => arg(self, 0),
            Op::Unary(u) => {
                let x = arg(self, 0);
                self.unary(*u, dtype, x, vector)
            }
            Op::Binary(o) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.binary(*o, dtype, x, y, vector)
            }
            Op::Compare(c) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.compare(*c, self.dtype(args[0]), x, y, vector)
            }
            Op::Select => {
                let (c, x, y) = (arg(self, 0), arg(self, 1), arg(self, 2));
                if !vector {
                    self.b.ins().select(c, x, y)
                } else if dtype == DType::Bool {
                    self.b.ins().bitselect(c, x, y)
                } else {
                    let mask = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), c);
                    self.b.ins().bitselect(mask, x, y)
                }
            }
            Op::Cast { to } => {
                let x = arg(self, 0);
                self.cast(self.dtype(args[0]), *to, x, vector)
            }
            other => panic!("kernel codegen: `{}` is not a kernel op", other.name()),
        }
    }

    fn splat(&mut self, dtype: DType, s: CValue) -> CValue {
        match dtype {
            DType::F32 => self.b.ins().splat(types::F32X4, s),
            DType::Bool => {
                let wide = self.b.ins().uextend(types::I32, s);
                let mask = self.b.ins().ineg(wide);
                self.b.ins().splat(types::I32X4, mask)
            }
            other => panic!("kernel codegen: no vector form for {other}"),
        }
    }

    fn constant(&mut self, value: &Literal, vector: bool) -> CValue {
        let ins = self.b.ins();
        let s = match value {
            Literal::F32(v) => ins.f32const(v[0]),
            Literal::F64(v) => ins.f64const(v[0]),
            Literal::I32(v) => ins.iconst(types::I32, i64::from(v[0])),
            Literal::I64(v) => ins.iconst(types::I64, v[0]),
            Literal::Bool(v) => ins.iconst(types::I8, i64::from(v[0])),
        };
        if vector {
            self.splat(value.dtype(), s)
        } else {
            s
        }
    }

    fn iota(&mut self, axis: Option<u8>, dtype: DType, vector: bool) -> CValue {
        let index = match axis {
            None => self.b.ins().iconst(types::I64, 0),
            Some(k) if k == self.inner_axis() => self.inner.expect("inside an inner loop"),
            Some(k) => self.row_index[k as usize],
        };
        let s = self.index_as(index, dtype);
        if !vector {
            return s;
        }
        // Lane i holds index + i.
        let base = self.b.ins().splat(types::F32X4, s);
        let bytes: Vec<u8> = [0.0f32, 1.0, 2.0, 3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let c = self.b.func.dfg.constants.insert(bytes.into());
        let lanes = self.b.ins().vconst(types::F32X4, c);
        self.b.ins().fadd(base, lanes)
    }

    fn index_as(&mut self, index: CValue, dtype: DType) -> CValue {
        match dtype {
            DType::F32 | DType::F64 => self.b.ins().fcvt_from_sint(clif_type(dtype), index),
            DType::I32 => self.b.ins().ireduce(types::I32, index),
            DType::I64 => index,
            DType::Bool => self.b.ins().icmp_imm_s(IntCC::NotEqual, index, 0),
        }
    }

    fn float_const(&mut self, dtype: DType, x: f64, vector: bool) -> CValue {
        match dtype {
            DType::F64 => self.b.ins().f64const(x),
            _ => Lanes { vector }.c(&mut self.b, x as f32),
        }
    }

    fn unary(&mut self, op: UnaryOp, dtype: DType, x: CValue, vector: bool) -> CValue {
        let lanes = Lanes { vector };
        if dtype == DType::Bool {
            return if vector {
                self.b.ins().bnot(x)
            } else {
                self.b.ins().bxor_imm_s(x, 1)
            };
        }
        if !dtype.is_float() {
            let ty = clif_type(dtype);
            return match op {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs => self.b.ins().iabs(x),
                UnaryOp::Relu => {
                    let zero = self.b.ins().iconst(ty, 0);
                    self.b.ins().smax(x, zero)
                }
                UnaryOp::Sign => {
                    let pos = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                    let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                    let pos = self.b.ins().uextend(ty, pos);
                    let neg = self.b.ins().uextend(ty, neg);
                    self.b.ins().isub(pos, neg)
                }
                other => panic!("kernel codegen: `{}` on integers", other.name()),
            };
        }
        if let Some(symbol) = op.helper_symbol(dtype) {
            return self.call(symbol, &[x], clif_type(dtype));
        }
        let zero = self.float_const(dtype, 0.0, vector);
        let one = self.float_const(dtype, 1.0, vector);
        match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Floor => self.b.ins().floor(x),
            UnaryOp::Ceil => self.b.ins().ceil(x),
            UnaryOp::Round => self.b.ins().nearest(x),
            UnaryOp::Recip => self.b.ins().fdiv(one, x),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(x);
                self.b.ins().fdiv(one, s)
            }
            UnaryOp::Relu => {
                let keep = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, x, zero);
                self.float_select(keep, x, zero, vector)
            }
            UnaryOp::Sign => {
                // Ordered and not equal (f32x4 has no `one` compare): below or above zero.
                let below = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                let above = self.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
                let nonzero = self.b.ins().bor(below, above);
                let signed_one = if vector {
                    let bits = lanes.to_int(&mut self.b, x);
                    let sign_mask = lanes.ci(&mut self.b, i32::MIN);
                    let sign = self.b.ins().band(bits, sign_mask);
                    let one_bits = lanes.to_int(&mut self.b, one);
                    let s = self.b.ins().bor(sign, one_bits);
                    lanes.to_float(&mut self.b, s)
                } else {
                    self.b.ins().fcopysign(one, x)
                };
                self.float_select(nonzero, signed_one, x, vector)
            }
            // f32 only: f64 calls the helper the table names (above).
            UnaryOp::Exp => math::exp(&mut self.b, lanes, x),
            UnaryOp::Log => math::log(&mut self.b, lanes, x),
            UnaryOp::Tanh => math::tanh(&mut self.b, lanes, x),
            UnaryOp::Sigmoid => math::sigmoid(&mut self.b, lanes, x),
            UnaryOp::Softplus => math::softplus(&mut self.b, lanes, x),
            UnaryOp::Erf => math::erf(&mut self.b, lanes, x),
            UnaryOp::Sin | UnaryOp::Cos => {
                unreachable!("`{}` calls its helper for every float dtype", op.name())
            }
            UnaryOp::Not => panic!("kernel codegen: `not` on floats"),
        }
    }

    fn float_select(&mut self, cond: CValue, x: CValue, y: CValue, vector: bool) -> CValue {
        if vector {
            Lanes { vector }.select(&mut self.b, cond, x, y)
        } else {
            self.b.ins().select(cond, x, y)
        }
    }

    fn binary(&mut self, op: BinaryOp, dtype: DType, x: CValue, y: CValue, vector: bool) -> CValue {
        let ins = self.b.ins();
        match (op, dtype) {
            (BinaryOp::And, _) => ins.band(x, y),
            (BinaryOp::Or, _) => ins.bor(x, y),
            (BinaryOp::Xor, _) => ins.bxor(x, y),
            (BinaryOp::Add, d) if d.is_float() => ins.fadd(x, y),
            (BinaryOp::Sub, d) if d.is_float() => ins.fsub(x, y),
            (BinaryOp::Mul, d) if d.is_float() => ins.fmul(x, y),
            (BinaryOp::Div, d) if d.is_float() => ins.fdiv(x, y),
            (BinaryOp::Max, d) if d.is_float() => ins.fmax(x, y),
            (BinaryOp::Min, d) if d.is_float() => ins.fmin(x, y),
            (BinaryOp::Pow, d) => {
                let symbol = op
                    .helper_symbol(d)
                    .expect("`pow` has a helper for each float type");
                self.call(symbol, &[x, y], clif_type(d))
            }
            (BinaryOp::Add, _) => ins.iadd(x, y),
            (BinaryOp::Sub, _) => ins.isub(x, y),
            (BinaryOp::Mul, _) => ins.imul(x, y),
            (BinaryOp::Max, _) => ins.smax(x, y),
            (BinaryOp::Min, _) => ins.smin(x, y),
            (BinaryOp::Div, _) => {
                debug_assert!(!vector);
                self.checked_div(dtype, x, y)
            }
        }
    }

    /// Truncating division that wraps `MIN / -1` and reports a zero divisor in the status.
    fn checked_div(&mut self, dtype: DType, x: CValue, d: CValue) -> CValue {
        let ty = clif_type(dtype);
        let zero = self.b.ins().icmp_imm_s(IntCC::Equal, d, 0);
        let flag = self.b.ins().uextend(types::I32, zero);
        let status = self.b.use_var(self.status);
        let status = self.b.ins().bor(status, flag);
        self.b.def_var(self.status, status);
        let minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, d, -1);
        let one = self.b.ins().iconst(ty, 1);
        let safe = self.b.ins().select(zero, one, d);
        let safe = self.b.ins().select(minus_one, one, safe);
        let q = self.b.ins().sdiv(x, safe);
        let negated = self.b.ins().ineg(x);
        self.b.ins().select(minus_one, negated, q)
    }

    fn compare(
        &mut self,
        op: CompareOp,
        operand: DType,
        x: CValue,
        y: CValue,
        vector: bool,
    ) -> CValue {
        if operand.is_float() {
            let cc = match op {
                CompareOp::Eq => FloatCC::Equal,
                CompareOp::Ne => FloatCC::NotEqual,
                CompareOp::Lt => FloatCC::LessThan,
                CompareOp::Le => FloatCC::LessThanOrEqual,
                CompareOp::Gt => FloatCC::GreaterThan,
                CompareOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            return self.b.ins().fcmp(cc, x, y);
        }
        if vector {
            // Masks of bools: only equality has a vector form.
            let differ = self.b.ins().bxor(x, y);
            return match op {
                CompareOp::Ne => differ,
                _ => self.b.ins().bnot(differ),
            };
        }
        let unsigned = operand == DType::Bool;
        let cc = match (op, unsigned) {
            (CompareOp::Eq, _) => IntCC::Equal,
            (CompareOp::Ne, _) => IntCC::NotEqual,
            (CompareOp::Lt, false) => IntCC::SignedLessThan,
            (CompareOp::Le, false) => IntCC::SignedLessThanOrEqual,
            (CompareOp::Gt, false) => IntCC::SignedGreaterThan,
            (CompareOp::Ge, false) => IntCC::SignedGreaterThanOrEqual,
            (CompareOp::Lt, true) => IntCC::UnsignedLessThan,
            (CompareOp::Le, true) => IntCC::UnsignedLessThanOrEqual,
            (CompareOp::Gt, true) => IntCC::UnsignedGreaterThan,
            (CompareOp::Ge, true) => IntCC::UnsignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, x, y)
    }

    fn cast(&mut self, from: DType, to: DType, x: CValue, vector: bool) -> CValue {
        if from == to {
            return x;
        }
        if vector {
            return match (from, to) {
                (DType::Bool, DType::F32) => {
                    let lanes = Lanes { vector };
                    let one = lanes.ci(&mut self.b, 1.0f32.to_bits() as i32);
                    let bits = self.b.ins().band(x, one);
                    lanes.to_float(&mut self.b, bits)
                }
                (DType::F32, DType::Bool) => {
                    let zero = Lanes { vector }.c(&mut self.b, 0.0);
                    self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
                }
                _ => panic!("kernel codegen: no vector cast from {from} to {to}"),
            };
        }
        let (cf, ct) = (clif_type(from), clif_type(to));
        let ins = self.b.ins();
        match (
            from.is_float(),
            from == DType::Bool,
            to.is_float(),
            to == DType::Bool,
        ) {
            // float → float
            (true, _, true, _) if to == DType::F64 => ins.fpromote(ct, x),
            (true, _, true, _) => ins.fdemote(ct, x),
            // float → bool: non-zero (NaN included)
            (true, _, _, true) => {
                let zero = self.float_const(from, 0.0, false);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            // float → integer: saturating, NaN gives 0
            (true, _, false, false) => ins.fcvt_to_sint_sat(ct, x),
            // bool → number
            (false, true, true, _) => {
                let w = ins.uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(ct, w)
            }
            (false, true, false, _) => ins.uextend(ct, x),
            // integer → bool
            (false, false, _, true) => ins.icmp_imm_s(IntCC::NotEqual, x, 0),
            // integer → float
            (false, false, true, _) => ins.fcvt_from_sint(ct, x),
            // integer → integer
            (false, false, false, false) if ct.bits() > cf.bits() => ins.sextend(ct, x),
            (false, false, false, false) => ins.ireduce(ct, x),
        }
    }

    // ----- reductions -----

    fn identity(&mut self, op: ReduceOp, dtype: DType, vector: bool) -> CValue {
        if dtype.is_float() {
            let x = match op {
                ReduceOp::Sum | ReduceOp::Mean => 0.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            };
            return self.float_const(dtype, x, vector);
        }
        let (min, max) = match dtype {
            DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
            _ => (i64::MIN, i64::MAX),
        };
        let x = match op {
            ReduceOp::Sum | ReduceOp::Mean => 0,
            ReduceOp::Max => min,
            ReduceOp::Min => max,
        };
        self.b.ins().iconst(clif_type(dtype), x)
    }

    fn combine(&mut self, op: ReduceOp, dtype: DType, acc: CValue, x: CValue) -> CValue {
        let ins = self.b.ins();
        match (op, dtype.is_float()) {
            (ReduceOp::Sum | ReduceOp::Mean, true) => ins.fadd(acc, x),
            (ReduceOp::Max, true) => ins.fmax(acc, x),
            (ReduceOp::Min, true) => ins.fmin(acc, x),
            (ReduceOp::Sum | ReduceOp::Mean, false) => ins.iadd(acc, x),
            (ReduceOp::Max, false) => ins.smax(acc, x),
            (ReduceOp::Min, false) => ins.smin(acc, x),
        }
    }

    /// Reduces the four lanes of an f32x4 accumulator.
    fn horizontal(&mut self, op: ReduceOp, v: CValue) -> CValue {
        let lane = |g: &mut Self, i: u8| g.b.ins().extractlane(v, i);
        let (a, b, c, d) = (lane(self, 0), lane(self, 1), lane(self, 2), lane(self, 3));
        let ab = self.combine(op, DType::F32, a, b);
        let cd = self.combine(op, DType::F32, c, d);
        self.combine(op, DType::F32, ab, cd)
    }

    /// Calls an imported scalar function (registered with the JIT in [`math`]).
    fn call(&mut self, name: &'static str, args: &[CValue], ty: ClType) -> CValue {
        let callee = match self.imports.get(name) {
            Some(&f) => f,
            None => {
                let mut sig = self.module.make_signature();
                sig.params.extend(args.iter().map(|_| AbiParam::new(ty)));
                sig.returns.push(AbiParam::new(ty));
                let id = self
                    .module
                    .declare_function(name, Linkage::Import, &sig)
                    .expect("an imported function is declared with one signature");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.imports.insert(name, f);
                f
            }
        };
        let call = self.b.ins().call(callee, args);
        self.b.inst_results(call)[0]
    }
}
