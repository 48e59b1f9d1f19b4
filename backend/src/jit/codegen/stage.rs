//! A stage's loops: rows, inner loops (vector and scalar), accumulations, stashes, and
//! how each value's work is stored or reduced.

use super::*;

impl Gen<'_, '_> {
    /// Opens `for index in start..end` (stepping by `step` at `end_loop`).
    pub(super) fn begin_loop(&mut self, start: CValue, end: CValue) -> Loop {
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

    pub(super) fn end_loop(&mut self, l: Loop, step: i64) {
        let next = self.b.ins().iadd_imm_s(l.index, step);
        self.b.def_var(l.var, next);
        self.b.ins().jump(l.header, &[]);
        self.b.seal_block(l.header);
        self.b.switch_to_block(l.exit);
        self.b.seal_block(l.exit);
    }

    /// Returns status 2 at once when a max or min reduction has nothing to reduce.
    pub(super) fn check_empty_reductions(&mut self) {
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
                .iconst(types::I32, crate::jit::Status::EmptyReduction as i64);
            self.b.ins().return_(&[code]);
            self.b.switch_to_block(go_on);
            self.b.seal_block(go_on);
        }
    }

    /// The number of elements reduced into each result (over the domain's `axes`); over every
    /// axis but the last, the number of rows.
    pub(super) fn reduced_count(&mut self, axes: &[usize]) -> CValue {
        let mut count = self.b.ins().iconst(types::I64, 1);
        for &a in axes {
            count = self.b.ins().imul(count, self.extents[a]);
        }
        count
    }

    pub(super) fn decompose_row(&mut self, r: CValue) {
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

    pub(super) fn roots(&self, works: &[Work]) -> Vec<(Value, Mapping)> {
        works.iter().map(|w| self.root(*w)).collect()
    }

    /// The expression a work item evaluates per element.
    pub(super) fn root(&self, w: Work) -> (Value, Mapping) {
        let v = match w {
            Work::Store(v) => v,
            Work::Reduce(v) | Work::ReduceInto(v) | Work::Combine(v) => {
                self.plan.reduction(v).expect("a reduction").0
            }
        };
        (v, KernelPlan::identity_mapping(&self.plan.ty(v).shape))
    }

    pub(super) fn rows(&mut self, begin: CValue, end: CValue) {
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
        let mut programs = self.prepare_programs(&segments, &stashes);
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
                    self.use_stashes(&stashes, index);
                    self.inner_loop(works, programs[index].take());
                    self.use_stashes(&[], index);
                }
            }
        }
        self.scopes.pop();
        self.row_index.clear();
        self.end_loop(l, 1);
    }

    /// Sets the stashes group `index` stores and loads.
    fn use_stashes(&mut self, stashes: &[Stash], index: usize) {
        self.stash_in = stashes.iter().filter(|s| s.by == index).cloned().collect();
        self.stash_out = (stashes.iter())
            .filter(|s| s.for_group == index)
            .cloned()
            .collect();
    }

    /// Makes tile programs of the groups that can be ones (in the stage's code for long rows:
    /// every vectorised group whose ops a program has, so that it runs at the CPU's width),
    /// their frames filled before the rows; by segment.
    fn prepare_programs(
        &mut self,
        segments: &[Segment],
        stashes: &[Stash],
    ) -> Vec<Option<programs::Frame>> {
        let mut frames: Vec<_> = segments.iter().map(|_| None).collect();
        if !self.programs {
            return frames;
        }
        for (index, segment) in segments.iter().enumerate() {
            let Segment::Group(works) = segment else {
                continue;
            };
            self.use_stashes(stashes, index);
            if self.vectorizable(works)
                && let Some(program) = self.tile_program(works)
            {
                frames[index] = Some(self.prepare_frame(program));
            }
            self.use_stashes(&[], index);
        }
        frames
    }

    /// The stage's values in the order they are computed along a row: groups of values that
    /// share one inner loop, and row values between them. A value that reads a reduction of
    /// the current group starts the next group.
    pub(super) fn segments(&self) -> Vec<Segment> {
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
    pub(super) fn stashes(&mut self, segments: &[Segment]) -> Vec<Stash> {
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
    pub(super) fn inner_nodes(&mut self, roots: &[(Value, Mapping)]) -> HashSet<(Value, Mapping)> {
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
    pub(super) fn expensive(&mut self, v: Value, map: &Mapping) -> bool {
        (self.inner_nodes(&[(v, map.clone())]).iter()).any(|(x, _)| {
            self.plan
                .op(*x)
                .is_some_and(|(op, _)| plan::is_transcendental(op))
        })
    }

    /// An accumulate stage over rows `begin..end`, or — by columns — over every row, for the
    /// columns `begin..end` of the last axis (and only those columns' results: the inner
    /// loops and [`Gen::begin_results`] read the range from `self.columns`).
    pub(super) fn accumulate(&mut self, begin: CValue, end: CValue) {
        let plan = self.plan;
        let v = plan.stages[self.stage].values[0];
        let (input, axes) = plan.reduction(v).expect("an accumulate stage reduces");
        let (op, _) = plan.reduce_op(v).expect("a reduction");
        let wide = plan.sums_wide(v);
        // Accumulated in `acc_dtype` in the accumulator, then (wide, or a mean) finished into
        // every destination.
        let acc_dtype = if wide { DType::F64 } else { self.dtype(v) };
        let primary = plan.slot(plan.accumulator(v));
        let size = acc_dtype.size_bytes() as i64;
        let root = self.root(Work::Combine(v));
        self.hoist(std::slice::from_ref(&root), Level::Entry, false);
        let rows = if plan.stages[self.stage].by_columns {
            self.columns = Some((begin, end));
            let first = self.b.ins().iconst(types::I64, 0);
            let row_axes: Vec<usize> = (0..self.dims.len() - 1).collect();
            (first, self.reduced_count(&row_axes))
        } else {
            (begin, end)
        };
        // Start from the identity.
        let identity = self.identity(op, acc_dtype, false);
        let (loops, index) = self.begin_results(v);
        let addr = self.element_address(primary, index, size);
        self.b.ins().store(flags(), identity, addr, 0);
        self.end_loops(loops);

        let rank = plan.ty(input).rank();
        let inner_reduced = rank >= 1 && axes.contains(&(rank - 1));
        let work = if inner_reduced {
            Work::ReduceInto(v)
        } else {
            Work::Combine(v)
        };
        if plan.combines_in_blocks(v, self.stage) {
            self.accumulate_in_blocks(v, rows, primary);
        } else {
            self.accumulate_rows(work, rows.0, rows.1);
        }

        // Finish: the mean's division, rounding a wide sum to f32, and copies to the
        // destinations.
        let others: Vec<usize> = (plan.destinations(v).into_iter())
            .map(|d| plan.slot(d))
            .filter(|&s| s != primary)
            .collect();
        if op == ReduceOp::Mean || !others.is_empty() {
            let count = self.reduced_count(&axes);
            let count = self.b.ins().fcvt_from_sint(clif_type(acc_dtype), count);
            let (loops, index) = self.begin_results(v);
            let addr = self.element_address(primary, index, size);
            let mut x = self.b.ins().load(clif_type(acc_dtype), flags(), addr, 0);
            if op == ReduceOp::Mean {
                x = self.b.ins().fdiv(x, count);
                if !wide {
                    self.b.ins().store(flags(), x, addr, 0);
                }
            }
            if wide {
                x = self.b.ins().fdemote(types::F32, x);
            }
            let out_size = self.dtype(v).size_bytes() as i64;
            for &slot in &others {
                let addr = self.element_address(slot, index, out_size);
                self.b.ins().store(flags(), x, addr, 0);
            }
            self.end_loops(loops);
        }
    }

    /// Combines rows `begin..end` of the stage's domain by `work`.
    fn accumulate_rows(&mut self, work: Work, begin: CValue, end: CValue) {
        let l = self.begin_loop(begin, end);
        self.scopes.push(HashMap::new());
        self.decompose_row(l.index);
        self.inner_loop(&[work], None);
        self.scopes.pop();
        self.row_index.clear();
        self.end_loop(l, 1);
    }

    /// Sums `rows` into `v`'s own buffer [`plan::ROW_BLOCK`] rows at a time, adding each
    /// block's sums into the f64 accumulator at `wide` (and starting the next at zero).
    fn accumulate_in_blocks(&mut self, v: Value, rows: (CValue, CValue), wide: usize) {
        let own = self.plan.slot(self.plan.source[&v]);
        let zero = self.identity(ReduceOp::Sum, DType::F32, false);
        let (loops, index) = self.begin_results(v);
        let addr = self.element_address(own, index, 4);
        self.b.ins().store(flags(), zero, addr, 0);
        self.end_loops(loops);
        let blocks = self.begin_loop(rows.0, rows.1);
        let full = self.b.ins().iadd_imm_s(blocks.index, plan::ROW_BLOCK);
        let short = self.b.ins().icmp(IntCC::SignedLessThan, rows.1, full);
        let block_end = self.b.ins().select(short, rows.1, full);
        self.accumulate_rows(Work::Combine(v), blocks.index, block_end);
        self.fold_columns(own, wide);
        self.end_loop(blocks, plan::ROW_BLOCK);
    }

    /// Adds the f32 sums of this call's columns in buffer slot `own` into the f64 ones in
    /// slot `wide` and sets them to zero: four at a time, then one at a time.
    fn fold_columns(&mut self, own: usize, wide: usize) {
        let (first, end) = self.columns.expect("a sum by columns");
        let len = self.b.ins().isub(end, first);
        let whole = self.b.ins().band_imm_s(len, !(LANES - 1));
        let vec_end = self.b.ins().iadd(first, whole);
        for (start, stop, vector) in [(first, vec_end, true), (vec_end, end, false)] {
            let l = self.begin_loop(start, stop);
            let (at_own, at_wide) = (
                self.element_address(own, l.index, 4),
                self.element_address(wide, l.index, 8),
            );
            let ty = if vector { types::F32X4 } else { types::F32 };
            let block = self.b.ins().load(ty, flags(), at_own, 0);
            self.add_wide(at_wide, block, vector);
            let zero = self.identity(ReduceOp::Sum, DType::F32, vector);
            self.b.ins().store(flags(), zero, at_own, 0);
            self.end_loop(l, if vector { LANES } else { 1 });
        }
    }

    /// Opens the loops over the elements of accumulated result `v` this call owns — all of
    /// them, or by columns those in its columns (the result's last axis is the domain's) —
    /// and returns them with the element's index.
    fn begin_results(&mut self, v: Value) -> (Vec<Loop>, CValue) {
        let Some((first, end)) = self.columns else {
            let len = self.value_len(v);
            let l = self.begin_loop_from_zero(len);
            let index = l.index;
            return (vec![l], index);
        };
        let dims = self.plan.ty(v).shape.0.clone();
        let (last, outer) = dims.split_last().expect("a result keeping the last axis");
        let mut count = self.b.ins().iconst(types::I64, 1);
        for d in outer {
            let e = self.extent(d);
            count = self.b.ins().imul(count, e);
        }
        let columns = self.extent(last);
        let row = self.begin_loop_from_zero(count);
        let start = self.b.ins().imul(row.index, columns);
        let column = self.begin_loop(first, end);
        let index = self.b.ins().iadd(start, column.index);
        (vec![row, column], index)
    }

    fn end_loops(&mut self, loops: Vec<Loop>) {
        for l in loops.into_iter().rev() {
            self.end_loop(l, 1);
        }
    }

    pub(super) fn begin_loop_from_zero(&mut self, end: CValue) -> Loop {
        let zero = self.b.ins().iconst(types::I64, 0);
        self.begin_loop(zero, end)
    }

    pub(super) fn value_len(&mut self, v: Value) -> CValue {
        let dims = self.plan.ty(v).shape.0.clone();
        let mut len = self.b.ins().iconst(types::I64, 1);
        for d in &dims {
            let e = self.extent(d);
            len = self.b.ins().imul(len, e);
        }
        len
    }

    pub(super) fn element_address(&mut self, slot: usize, index: CValue, size: i64) -> CValue {
        let offset = self.b.ins().imul_imm_s(index, size);
        self.b.ins().iadd(self.buffers[slot], offset)
    }

    /// The mapping of a reduction's output buffer over its input's domain.
    pub(super) fn output_mapping(&self, v: Value) -> Mapping {
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
    /// can be — by the group's tile `program` when it has one — then a scalar tail.
    pub(super) fn inner_loop(&mut self, works: &[Work], program: Option<programs::Frame>) {
        if works.is_empty() {
            return;
        }
        // The row's positions: all, or an accumulate stage's columns.
        let (first, n) = match self.columns {
            Some((first, end)) => (Some(first), end),
            None => (None, self.extents[self.dims.len() - 1]),
        };
        let roots = self.roots(works);
        let vector = self.vectorizable(works);
        self.hoist(&roots, Level::Row, vector);
        for &w in works {
            for (slot, map) in self.work_destinations(w) {
                self.base(slot, &map);
            }
        }
        let (start, scalar_accs) = if vector {
            self.vector_part(works, program, first, n)
        } else {
            let start = first.unwrap_or_else(|| self.b.ins().iconst(types::I64, 0));
            (start, self.scalar_accumulators(works))
        };
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
        self.finish_works(works, &scalar_accs, n);
    }

    /// The vectorised part of the row: by the tile `program` (all of `0..n` unless the group
    /// reduces), or Cranelift's unrolled loop (`0..n`, or `first..n` for an accumulate
    /// stage's columns, rounded down to whole trips). Returns where the scalar tail starts
    /// and each reduction's accumulator, folded to a scalar.
    fn vector_part(
        &mut self,
        works: &[Work],
        program: Option<programs::Frame>,
        first: Option<CValue>,
        n: CValue,
    ) -> (CValue, Vec<Option<Variable>>) {
        let plan = self.plan;
        let zero = self.b.ins().iconst(types::I64, 0);
        let mut scalar_accs: Vec<Option<Variable>> = Vec::new();
        let reduces = (works.iter()).any(|w| matches!(w, Work::Reduce(_) | Work::ReduceInto(_)));
        let unroll = if reduces { REDUCE_UNROLL } else { UNROLL };
        let step = LANES * unroll;
        // A program that does not reduce takes the whole row, its tail included; a reduction's
        // tail stays in Cranelift's scalar code, added after the 16 partials as on its path.
        let vec_end = match (&program, first) {
            (Some(_), _) if !reduces => n,
            (_, None) => self.b.ins().band_imm_s(n, !(step - 1)),
            (_, Some(first)) => {
                let len = self.b.ins().isub(n, first);
                let whole = self.b.ins().band_imm_s(len, !(step - 1));
                self.b.ins().iadd(first, whole)
            }
        };
        let vector_accs: Vec<Option<VectorAccs>> = (works.iter())
            .map(|&w| {
                matches!(w, Work::Reduce(_) | Work::ReduceInto(_)).then(|| self.vector_accs(w))
            })
            .collect();
        let start = first.unwrap_or(zero);
        if let Some(program) = program {
            self.run_program(&program, vec_end, &vector_accs);
        } else if (works.iter()).any(|&w| self.sums_wide(w) && !matches!(w, Work::Combine(_))) {
            // Blocks of `SUM_BLOCK` elements (a program's tiles), each sum's partials added
            // into its f64 totals after each.
            let blocks = self.begin_loop(start, vec_end);
            let full = self.b.ins().iadd_imm_s(blocks.index, plan::SUM_BLOCK);
            let short = self.b.ins().icmp(IntCC::SignedLessThan, vec_end, full);
            let block_end = self.b.ins().select(short, vec_end, full);
            self.vector_loop(works, &vector_accs, blocks.index, block_end, unroll);
            for accs in vector_accs.iter().flatten().filter(|a| !a.wide.is_empty()) {
                self.fold_block(accs);
            }
            self.end_loop(blocks, plan::SUM_BLOCK);
        } else {
            self.vector_loop(works, &vector_accs, start, vec_end, unroll);
        }
        for (&w, accs) in works.iter().zip(&vector_accs) {
            let Some(accs) = accs else {
                scalar_accs.push(None);
                continue;
            };
            let total = if accs.wide.is_empty() {
                let (op, _) = plan.reduce_op(w.value()).expect("a reduction");
                let mut acc = self.b.use_var(accs.partials[0]);
                for &other in &accs.partials[1..] {
                    let x = self.b.use_var(other);
                    acc = self.combine(op, DType::F32, acc, x);
                }
                self.horizontal(op, acc)
            } else {
                self.wide_total(&accs.wide)
            };
            let ty = self.b.func.dfg.value_type(total);
            let var = self.b.declare_var(ty);
            self.b.def_var(var, total);
            scalar_accs.push(Some(var));
        }
        (vec_end, scalar_accs)
    }

    /// Cranelift's unrolled vector loop over `start..end`: one vector step of `works` per
    /// unrolled copy, each reduction into its partials.
    fn vector_loop(
        &mut self,
        works: &[Work],
        accs: &[Option<VectorAccs>],
        start: CValue,
        end: CValue,
        unroll: i64,
    ) {
        let l = self.begin_loop(start, end);
        for u in 0..unroll {
            self.inner = Some(self.b.ins().iadd_imm_s(l.index, u * LANES));
            self.scopes.push(HashMap::new());
            for (&w, accs) in works.iter().zip(accs) {
                let acc = accs.as_ref().map(|a| a.partials[u as usize]);
                self.element(w, acc, true);
            }
            self.store_stashes(true);
            self.scopes.pop();
        }
        self.end_loop(l, LANES * unroll);
    }

    /// A scalar accumulator per reduction of `works`, at its identity (`None` for the rest).
    fn scalar_accumulators(&mut self, works: &[Work]) -> Vec<Option<Variable>> {
        let plan = self.plan;
        let mut scalar_accs = Vec::new();
        for &w in works {
            scalar_accs.push(match w {
                Work::Reduce(v) | Work::ReduceInto(v) => {
                    let (op, _) = plan.reduce_op(v).expect("a reduction");
                    let dtype = if self.sums_wide(w) {
                        DType::F64
                    } else {
                        self.dtype(v)
                    };
                    let init = self.identity(op, dtype, false);
                    let var = self.b.declare_var(clif_type(dtype));
                    self.b.def_var(var, init);
                    Some(var)
                }
                _ => None,
            });
        }
        scalar_accs
    }

    /// After the row's loops: each reduction finished and stored, or combined into its
    /// buffer.
    fn finish_works(&mut self, works: &[Work], scalar_accs: &[Option<Variable>], n: CValue) {
        let plan = self.plan;
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
                    let dtype = if self.sums_wide(w) {
                        DType::F64
                    } else {
                        self.dtype(v)
                    };
                    let total = self.b.use_var(scalar_accs[i].expect("an accumulator"));
                    let map = self.output_mapping(v);
                    let slot = plan.slot(plan.accumulator(v));
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
    pub(super) fn store_stashes(&mut self, vector: bool) {
        for stash in self.stash_in.clone() {
            let x = self.emit(stash.value, &stash.map, vector);
            let addr = self.address(stash.slot, &stash.slot_map, self.dtype(stash.value));
            self.b.ins().store(flags(), x, addr, 0);
        }
    }

    /// The buffers (and mappings) a work item writes.
    pub(super) fn work_destinations(&self, w: Work) -> Vec<(usize, Mapping)> {
        let plan = self.plan;
        match w {
            Work::Store(v) => {
                let map = KernelPlan::identity_mapping(&plan.ty(v).shape);
                plan.destinations(v)
                    .into_iter()
                    .map(|d| (plan.slot(d), map.clone()))
                    .collect()
            }
            Work::Combine(v) => {
                vec![(
                    plan.slot(plan.combined_into(v, self.stage)),
                    self.output_mapping(v),
                )]
            }
            Work::ReduceInto(v) => {
                vec![(plan.slot(plan.accumulator(v)), self.output_mapping(v))]
            }
            Work::Reduce(_) => Vec::new(),
        }
    }

    /// The work of one element (or one vector of elements) at the current inner position.
    pub(super) fn element(&mut self, w: Work, acc: Option<Variable>, vector: bool) {
        let (root, map) = self.root(w);
        let x = self.emit(root, &map, vector);
        match w {
            Work::Store(v) => self.store_to_destinations(v, &map, x, vector),
            Work::Reduce(v) | Work::ReduceInto(v) => {
                let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                let var = acc.expect("an accumulator");
                let old = self.b.use_var(var);
                let new = match self.sums_wide(w) && !vector {
                    true => {
                        let x = self.b.ins().fpromote(types::F64, x);
                        self.b.ins().fadd(old, x)
                    }
                    false => self.combine(op, self.dtype(v), old, x),
                };
                self.b.def_var(var, new);
            }
            Work::Combine(v)
                if self.sums_wide(w) && !self.plan.combines_in_blocks(v, self.stage) =>
            {
                let slot = self.plan.slot(self.plan.accumulator(v));
                let out_map = self.output_mapping(v);
                let addr = self.address(slot, &out_map, DType::F64);
                self.add_wide(addr, x, vector);
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

    pub(super) fn store_to_destinations(
        &mut self,
        v: Value,
        map: &Mapping,
        x: CValue,
        _vector: bool,
    ) {
        let plan = self.plan;
        let dtype = self.dtype(v);
        for d in plan.destinations(v) {
            let addr = self.address(plan.slot(d), map, dtype);
            self.b.ins().store(flags(), x, addr, 0);
        }
    }

    pub(super) fn finish_reduction(&mut self, v: Value, acc: Variable, n: CValue) -> CValue {
        let total = self.b.use_var(acc);
        let dtype = self.dtype(v);
        if self.plan.sums_wide(v) {
            // An f64 total, divided in f64 for a mean, rounded to f32 once.
            let total = match self.plan.reduce_op(v) {
                Some((ReduceOp::Mean, _)) => {
                    let count = self.b.ins().fcvt_from_sint(types::F64, n);
                    self.b.ins().fdiv(total, count)
                }
                _ => total,
            };
            return self.b.ins().fdemote(types::F32, total);
        }
        match self.plan.reduce_op(v) {
            Some((ReduceOp::Mean, _)) => {
                let ty = clif_type(dtype);
                let count = self.b.ins().fcvt_from_sint(ty, n);
                self.b.ins().fdiv(total, count)
            }
            // A max or min is the same in any order but for a NaN's sign and payload: one
            // NaN, so that a tile program (which combines in its own order) gives these bits.
            Some((ReduceOp::Max | ReduceOp::Min, _)) if dtype.is_float() => {
                let nan = self.float_const(dtype, f64::NAN, false);
                let is_nan = self.b.ins().fcmp(FloatCC::Unordered, total, total);
                self.b.ins().select(is_nan, nan, total)
            }
            _ => total,
        }
    }
}
