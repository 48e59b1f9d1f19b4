//! Tile programs in kernels: a group whose per-element work is f32 (and bool) ops with a
//! vector body in [`tile_program`], reading and writing buffers with unit stride along the
//! row, becomes a program of whole-tile instructions, and the group's inner loop becomes one
//! call of the runner per tile — the row's last tile shorter:
//!
//! ```text
//! per row:   scalars[k] = row-level operand k;  partials = identities
//! per tile:  registers[b] = buffer b at the tile's start;  start = the tile's position
//!            kiln_tile_program(frame, len)      (one call: every instruction, full width)
//! after:     each reduction's 16 partials folded, in a fixed order, into its total
//! ```
//!
//! Stores to the group's destinations (and stashes) are the program's last instructions, so
//! an output that shares its buffer with an input is written after the tile's last read.
//! Every other group runs one element at a time in Cranelift's scalar code.

use super::*;
use crate::tile_program::{
    self, BLOCK_ROWS, FRAME_HEADER, Instr, MAX_REGISTERS, Operand, PARTIALS, TILE, word,
};

/// What a program register points at.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Register {
    /// A tile of scratch (virtual until [`Program::assign_scratch`] numbers them).
    Scratch(usize),
    /// A buffer (under a mapping, unit stride along the row) from the tile's first element.
    Buffer(usize, Mapping),
    /// No instruction uses it any more.
    Unused,
}

/// Where a program's scalar operand comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Scalar {
    /// A row-level (or entry-level) value, f32 or bool.
    Value(Value, Mapping),
    /// A constant the program needs itself (a cast's `0.0`), by its bits.
    Const(u32),
}

/// A group's tile program, and what the kernel fills its frame with.
pub(super) struct Program {
    instrs: Vec<Instr>,
    registers: Vec<Register>,
    /// Row-level operands and constants, by scalar index.
    scalars: Vec<Scalar>,
    /// The group's reductions by accumulator: the work's position in the group, and its op.
    reductions: Vec<(usize, ReduceOp)>,
    memo: HashMap<(Value, Mapping), Operand>,
    scratch_tiles: usize,
}

/// `first` and `reader`, the only reader of `first`'s result, as one instruction: two cheap
/// binary ops as a fused pair ([`Instr::Fused`]), or a fused pair and a product of its result
/// by a scalar as the pair with that scale.
fn fused_with(first: Instr, reader: Instr) -> Option<Instr> {
    match (first, reader) {
        (
            Instr::Binary {
                op: first,
                dst: r,
                a,
                b,
            },
            Instr::Binary {
                op: then,
                dst,
                a: x,
                b: y,
            },
        ) if tile_program::fusable(first, then) => {
            let (c, swap) = match x == Operand::Tile(r) {
                true => (y, false),
                false => (x, true),
            };
            Some(Instr::Fused {
                first,
                then,
                swap,
                dst,
                a,
                b,
                c,
                scale: None,
            })
        }
        (
            Instr::Fused {
                first,
                then,
                swap,
                a,
                b,
                c,
                scale: None,
                ..
            },
            Instr::Binary {
                op: BinaryOp::Mul,
                dst,
                a: x,
                b: y,
            },
        ) => {
            let ((Operand::Scalar(s), _) | (_, Operand::Scalar(s))) = (x, y) else {
                return None;
            };
            Some(Instr::Fused {
                first,
                then,
                swap,
                dst,
                a,
                b,
                c,
                scale: Some(s),
            })
        }
        _ => None,
    }
}

/// `x`'s index in `all`, added at the end if it is not there.
fn index_in<T: PartialEq>(all: &mut Vec<T>, x: T) -> u16 {
    let at = all.iter().position(|y| *y == x).unwrap_or_else(|| {
        all.push(x);
        all.len() - 1
    });
    at as u16
}

impl Program {
    fn register(&mut self, r: Register) -> u16 {
        index_in(&mut self.registers, r)
    }

    fn scratch(&mut self) -> u16 {
        let k = self.registers.len();
        self.register(Register::Scratch(k))
    }

    fn scalar(&mut self, s: Scalar) -> Operand {
        Operand::Scalar(index_in(&mut self.scalars, s))
    }

    fn constant(&mut self, x: f32) -> Operand {
        self.scalar(Scalar::Const(x.to_bits()))
    }

    /// Appends the instruction `make(dst)` writing a new scratch register; returns it.
    fn push(&mut self, make: impl FnOnce(u16) -> Instr) -> Operand {
        let dst = self.scratch();
        self.instrs.push(make(dst));
        Operand::Tile(dst)
    }

    /// The tile registers `i` reads.
    fn reads(i: &Instr) -> Vec<u16> {
        let tile = |o: &Operand| match o {
            Operand::Tile(r) => Some(*r),
            Operand::Scalar(_) => None,
        };
        match i {
            Instr::Copy { a, .. } | Instr::Unary { a, .. } | Instr::Reduce { a, .. } => {
                tile(a).into_iter().collect()
            }
            Instr::Binary { a, b, .. } | Instr::Compare { a, b, .. } => {
                tile(a).into_iter().chain(tile(b)).collect()
            }
            Instr::Fused { a, b, c, .. } | Instr::Select { a, b, c, .. } => {
                [a, b, c].into_iter().filter_map(tile).collect()
            }
            Instr::Iota { .. } => Vec::new(),
        }
    }

    /// The register an instruction computes, if it computes one (a copy stores a value
    /// computed before).
    fn defines(i: &Instr) -> Option<u16> {
        match i {
            Instr::Copy { .. } => None,
            _ => i.destination(),
        }
    }

    /// How many times register `r` is read, by instructions and by `stores`.
    fn read_count(&self, r: u16, stores: &[(u16, Operand)]) -> usize {
        let by_instrs = self.instrs.iter().flat_map(Self::reads).filter(|&x| x == r);
        let by_stores = stores.iter().filter(|(_, a)| *a == Operand::Tile(r));
        by_instrs.count() + by_stores.count()
    }

    /// The instruction after the `k`th that reads register `r`, when it is `r`'s only
    /// reader (no store reads `r` either).
    fn sole_reader(&self, k: usize, r: u16, stores: &[(u16, Operand)]) -> Option<usize> {
        let reader =
            (k + 1..self.instrs.len()).find(|&j| Self::reads(&self.instrs[j]).contains(&r));
        reader.filter(|_| self.read_count(r, stores) == 1)
    }

    /// Merges an instruction into its only reader where the two make one instruction
    /// ([`fused_with`]): `x·a + b` reads and writes the tile once, not twice, and gelu's
    /// `0.5·(x·(1 + tanh u))` is one pass.
    fn fuse(&mut self, stores: &[(u16, Operand)]) {
        // A reader that updates a buffer in place (a combine into its output) stays as it
        // is: its one-pass form over the same tile is `binary`'s in-place loop.
        let updates_in_place =
            |i: &Instr| (i.destination()).is_some_and(|d| Self::reads(i).contains(&d));
        let mut k = 0;
        while k < self.instrs.len() {
            let merged = Self::defines(&self.instrs[k])
                .and_then(|r| self.sole_reader(k, r, stores))
                .filter(|&j| !updates_in_place(&self.instrs[j]))
                .and_then(|j| Some((j, fused_with(self.instrs[k], self.instrs[j])?)));
            match merged {
                Some((j, instr)) => {
                    self.instrs[j] = instr;
                    self.instrs.remove(k);
                }
                None => k += 1,
            }
        }
    }

    /// Lets the instruction that computes a stored value write it to its destination, saving
    /// a copy, where that is safe: when no later instruction reads a buffer (an output may
    /// share its buffer with an input, and must not be written before the input's last read).
    fn write_results_in_place(&mut self, stores: &mut Vec<(u16, Operand)>) {
        for s in 0..stores.len() {
            let (to, Operand::Tile(r)) = stores[s] else {
                continue;
            };
            let computed = (self.instrs.iter()).position(|i| Self::defines(i) == Some(r));
            let Some(k) = computed else { continue };
            let is_buffer = |x: u16| matches!(self.registers[x as usize], Register::Buffer(..));
            let later_reads_buffer = (self.instrs[k + 1..].iter())
                .flat_map(Self::reads)
                .any(|x| x != r && is_buffer(x));
            if later_reads_buffer || !matches!(self.registers[r as usize], Register::Scratch(_)) {
                continue;
            }
            for i in &mut self.instrs[k..] {
                i.rename(r, to);
            }
            for (_, a) in stores.iter_mut() {
                if *a == Operand::Tile(r) {
                    *a = Operand::Tile(to);
                }
            }
        }
        stores.retain(|&(to, a)| a != Operand::Tile(to));
    }

    /// Gives the scratch registers tiles, sharing a tile between registers whose lives do
    /// not overlap, so that a long program's scratch stays in L1.
    fn assign_scratch(&mut self) {
        let mut last_read = vec![0; self.registers.len()];
        for (k, i) in self.instrs.iter().enumerate() {
            for r in Self::reads(i) {
                last_read[r as usize] = k;
            }
        }
        let mut free: Vec<usize> = Vec::new();
        let mut tiles = 0;
        let mut assigned = vec![false; self.registers.len()];
        for (k, i) in self.instrs.iter().enumerate() {
            // A register written again keeps its tile.
            if let Some(dst) = Self::defines(i)
                && let Register::Scratch(_) = self.registers[dst as usize]
                && !std::mem::replace(&mut assigned[dst as usize], true)
            {
                let tile = free.pop().unwrap_or_else(|| {
                    tiles += 1;
                    tiles - 1
                });
                self.registers[dst as usize] = Register::Scratch(tile);
            }
            // Each register once: `t·t` reads `t` twice, and freeing its tile twice let two
            // live values share it.
            let mut reads = Self::reads(i);
            reads.sort_unstable();
            reads.dedup();
            for r in reads {
                if last_read[r as usize] == k
                    && let Register::Scratch(t) = self.registers[r as usize]
                {
                    free.push(t);
                }
            }
        }
        self.scratch_tiles = tiles;
        // Registers whose instructions were fused or renamed away.
        for (r, assigned) in assigned.into_iter().enumerate() {
            if !assigned && matches!(self.registers[r], Register::Scratch(_)) {
                self.registers[r] = Register::Unused;
            }
        }
    }

    /// The transcendental functions the program applies.
    pub(super) fn functions(&self) -> Vec<&'static str> {
        (self.instrs.iter())
            .filter_map(|i| match i {
                Instr::Unary { op, .. } if plan::is_transcendental(&Op::Unary(*op)) => {
                    Some(op.name())
                }
                _ => None,
            })
            .collect()
    }
}

impl Gen<'_, '_> {
    /// The group's tile program, if every per-element op of it has a vector body and every
    /// buffer it reads or writes along the row has unit stride.
    pub(super) fn tile_program(&mut self, works: &[Work]) -> Option<Program> {
        let mut p = Program {
            instrs: Vec::new(),
            registers: Vec::new(),
            scalars: Vec::new(),
            reductions: Vec::new(),
            memo: HashMap::new(),
            scratch_tiles: 0,
        };
        let mut stores = Vec::new();
        for (index, &w) in works.iter().enumerate() {
            if self.dtype(w.value()) != DType::F32 {
                return None;
            }
            let (root, map) = self.root(w);
            let x = self.program_operand(&mut p, root, &map)?;
            // What a program writes along the row, it writes with unit stride (a reduction
            // into another buffer writes once per row, after it).
            let destinations = self.work_destinations(w);
            let along_row = matches!(w, Work::Store(_) | Work::Combine(_));
            for (slot, map) in &destinations {
                if along_row && !self.inner_stride_is_unit(*slot, map) {
                    return None;
                }
            }
            match w {
                Work::Store(_) => {
                    for (slot, m) in destinations {
                        stores.push((p.register(Register::Buffer(slot, m)), x));
                    }
                }
                Work::Reduce(v) | Work::ReduceInto(v) => {
                    let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                    let acc = p.reductions.len() as u16;
                    p.instrs.push(Instr::Reduce { op, acc, a: x });
                    p.reductions.push((index, op));
                }
                Work::Combine(v) => {
                    let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                    let (slot, m) = destinations.into_iter().next().expect("its buffer");
                    let out = p.register(Register::Buffer(slot, m));
                    let op = match op {
                        ReduceOp::Sum | ReduceOp::Mean => BinaryOp::Add,
                        ReduceOp::Max => BinaryOp::Max,
                        ReduceOp::Min => BinaryOp::Min,
                    };
                    let a = Operand::Tile(out);
                    p.instrs.push(Instr::Binary {
                        op,
                        dst: out,
                        a,
                        b: x,
                    });
                }
            }
        }
        for stash in self.stash_in.clone() {
            let x = self.program_operand(&mut p, stash.value, &stash.map)?;
            if !self.inner_stride_is_unit(stash.slot, &stash.slot_map) {
                return None;
            }
            let to = p.register(Register::Buffer(stash.slot, stash.slot_map));
            stores.push((to, x));
        }
        p.fuse(&stores);
        p.write_results_in_place(&mut stores);
        (p.instrs).extend(stores.into_iter().map(|(dst, a)| Instr::Copy { dst, a }));
        p.assign_scratch();
        (p.registers.len() <= MAX_REGISTERS).then_some(p)
    }

    /// Where the program finds `v`'s tile (bools as `0.0` and `1.0`), adding the instructions
    /// that compute it.
    fn program_operand(&mut self, p: &mut Program, v: Value, map: &Mapping) -> Option<Operand> {
        if let Some(&o) = p.memo.get(&(v, map.clone())) {
            return Some(o);
        }
        let plan = self.plan;
        let dtype = self.dtype(v);
        if !matches!(dtype, DType::F32 | DType::Bool) {
            return None;
        }
        let stashed = (self.stash_out.iter())
            .find(|s| s.value == v && s.map == *map)
            .map(|s| (s.slot, s.slot_map.clone()));
        let o = if self.level(v, map) < Level::Inner {
            p.scalar(Scalar::Value(v, map.clone()))
        } else if let Some((slot, slot_map)) = stashed {
            Operand::Tile(p.register(Register::Buffer(slot, slot_map)))
        } else if plan.is_leaf_in(v, self.stage) {
            let slot = plan.slot(plan.source[&v]);
            if dtype != DType::F32 || !self.inner_stride_is_unit(slot, map) {
                return None;
            }
            Operand::Tile(p.register(Register::Buffer(slot, map.clone())))
        } else {
            self.program_op(p, v, map)?
        };
        p.memo.insert((v, map.clone()), o);
        Some(o)
    }

    /// The instructions of `v`'s op (at the inner level), if it has a vector body.
    fn program_op(&mut self, p: &mut Program, v: Value, map: &Mapping) -> Option<Operand> {
        let plan = self.plan;
        let (op, args) = plan.op(v).expect("an op");
        let operands = plan.operand_mappings(v, map);
        let arg = |g: &mut Self, p: &mut Program, i: usize| {
            let (x, m) = &operands[i];
            g.program_operand(p, *x, m)
        };
        let bool_operand = args.first().is_some_and(|&a| self.dtype(a) == DType::Bool);
        Some(match op {
            Op::Broadcast { .. } | Op::Reshape { .. } => arg(self, p, 0)?,
            Op::Unary(op) if tile_program::has_vector_body(*op) => {
                let a = arg(self, p, 0)?;
                p.push(|dst| Instr::Unary { op: *op, dst, a })
            }
            Op::Binary(op) if op.vector_form() == VectorForm::Tile => {
                let (a, b) = (arg(self, p, 0)?, arg(self, p, 1)?);
                p.push(|dst| Instr::Binary { op: *op, dst, a, b })
            }
            Op::Compare(op) => {
                let (a, b) = (arg(self, p, 0)?, arg(self, p, 1)?);
                p.push(|dst| Instr::Compare { op: *op, dst, a, b })
            }
            Op::Select => {
                let (c, a, b) = (arg(self, p, 0)?, arg(self, p, 1)?, arg(self, p, 2)?);
                p.push(|dst| Instr::Select { dst, c, a, b })
            }
            // A bool is already its f32 value; an f32 is true where it is nonzero (or NaN).
            Op::Cast { to } => {
                let a = arg(self, p, 0)?;
                match (bool_operand, *to) {
                    (false, DType::Bool) => {
                        let zero = p.constant(0.0);
                        p.push(|dst| Instr::Compare {
                            op: CompareOp::Ne,
                            dst,
                            a,
                            b: zero,
                        })
                    }
                    _ => a,
                }
            }
            Op::Iota { .. } => {
                let index = p.push(|dst| Instr::Iota { dst });
                if self.dtype(v) == DType::Bool {
                    let zero = p.constant(0.0);
                    p.push(|dst| Instr::Compare {
                        op: CompareOp::Ne,
                        dst,
                        a: index,
                        b: zero,
                    })
                } else {
                    index
                }
            }
            _ => return None,
        })
    }

    /// Fills, before the rows, what a program's frame keeps from row to row: the program,
    /// the header, the scratch tiles' addresses. The frame has room for [`BLOCK_ROWS`] rows.
    pub(super) fn prepare_frame(&mut self, program: Program) -> Frame {
        let ptr = self.module.target_config().pointer_type();
        let slot = |g: &mut Self, bytes: usize| {
            let data = StackSlotData::new(StackSlotKind::ExplicitSlot, bytes.max(16) as u32, 6);
            let s = g.b.create_sized_stack_slot(data);
            g.b.ins().stack_addr(ptr, s, 0)
        };
        let p = &program;
        if crate::debug::level() >= 2 {
            eprintln!("// tile program of a group of stage {}:", self.stage);
            for (r, register) in p.registers.iter().enumerate() {
                eprintln!("//   register {r}: {register:?}");
            }
            for (k, scalar) in p.scalars.iter().enumerate() {
                eprintln!("//   scalar {k}: {scalar:?}");
            }
            for i in &p.instrs {
                eprintln!("//   {i:?}");
            }
        }
        let mut words = Vec::new();
        for i in &p.instrs {
            i.encode(&mut words);
        }
        let (registers, scalar_count) = (p.registers.len(), p.scalars.len());
        let reductions = p.reductions.len();
        let program_at = (FRAME_HEADER + BLOCK_ROWS * registers) * 8;
        let frame = slot(self, program_at + words.len() * 8);
        let scalars = slot(self, BLOCK_ROWS * scalar_count * 4);
        let partials = slot(self, BLOCK_ROWS * reductions * PARTIALS * 4);
        let scratch = slot(self, p.scratch_tiles * TILE * 4);
        for (k, &w) in words.iter().enumerate() {
            let word = self.b.ins().iconst(types::I64, w as i64);
            self.b
                .ins()
                .store(flags(), word, frame, (program_at + 8 * k) as i32);
        }
        let code = self.b.ins().iadd_imm_s(frame, program_at as i64);
        let buffers = (p.registers.iter().enumerate())
            .filter(|(_, r)| matches!(r, Register::Buffer(..)))
            .fold(0u64, |mask, (r, _)| mask | 1 << r);
        let streamed = self.streamed_buffers(p);
        let constants = [
            (word::COUNT, words.len() as u64),
            (word::STREAMED, streamed),
            (word::BUFFERS, buffers),
            (word::REGISTERS, registers as u64),
            (word::SCALARS_PER_ROW, scalar_count as u64),
            (word::REDUCTIONS, reductions as u64),
        ];
        for (k, x) in constants {
            let x = self.b.ins().iconst(types::I64, x as i64);
            self.b.ins().store(flags(), x, frame, 8 * k as i32);
        }
        let addresses = [
            (word::PROGRAM, code),
            (word::SCALARS, scalars),
            (word::PARTIALS, partials),
        ];
        for (k, x) in addresses {
            self.b.ins().store(flags(), x, frame, 8 * k as i32);
        }
        for (r, register) in p.registers.iter().enumerate() {
            if let Register::Scratch(t) = register {
                let at = self.b.ins().iadd_imm_s(scratch, (t * TILE * 4) as i64);
                self.b
                    .ins()
                    .store(flags(), at, frame, ((FRAME_HEADER + r) * 8) as i32);
            }
        }
        Frame {
            program,
            frame,
            scalars,
            partials,
        }
    }

    /// The mask of the buffer registers a call prefetches the next tile of: those streamed
    /// from row to row. A buffer the same for every row (a broadcast bias, say) stays in
    /// cache from row to row and is left out.
    fn streamed_buffers(&mut self, p: &Program) -> u64 {
        let rows = self.dims.len() - 1;
        let mut mask = 0u64;
        for (r, register) in p.registers.iter().enumerate() {
            if let Register::Buffer(slot, map) = register
                && !(self.strides(*slot, map)[..rows].iter()).all(|s| matches!(s, Stride::Zero))
            {
                mask |= 1 << r;
            }
        }
        mask
    }

    /// The current row (decomposed) by the prepared program `f`; returns each reduction's
    /// total, by work (as [`Gen::scalar_loop`] does).
    pub(super) fn run_program(
        &mut self,
        f: &Frame,
        works: usize,
        n: CValue,
    ) -> Vec<Option<Variable>> {
        let first = self.b.ins().iconst(types::I64, 0);
        let one = self.b.ins().iconst(types::I64, 1);
        self.fill_program_row(f, first);
        self.call_program(f, one, n);
        self.program_totals(f, works, first, n)
    }

    /// Fills row `i` of the frame for the current row: its scalars and its buffers' row starts
    /// (the runner sets the reductions' partials to their identities).
    pub(super) fn fill_program_row(&mut self, f: &Frame, i: CValue) {
        let p = &f.program;
        let at = |g: &mut Self, base: CValue, bytes: usize| {
            let offset = g.b.ins().imul_imm_s(i, bytes as i64);
            g.b.ins().iadd(base, offset)
        };
        let scalars = at(self, f.scalars, p.scalars.len() * 4);
        for (k, scalar) in p.scalars.iter().enumerate() {
            let x = match scalar {
                Scalar::Value(v, map) if self.dtype(*v) == DType::Bool => {
                    let b = self.emit(*v, map);
                    let wide = self.b.ins().uextend(types::I32, b);
                    self.b.ins().fcvt_from_uint(types::F32, wide)
                }
                Scalar::Value(v, map) => self.emit(*v, map),
                Scalar::Const(bits) => self.b.ins().f32const(f32::from_bits(*bits)),
            };
            self.b.ins().store(flags(), x, scalars, 4 * k as i32);
        }
        let registers = at(self, f.frame, p.registers.len() * 8);
        for (r, register) in p.registers.iter().enumerate() {
            if let Register::Buffer(slot, map) = register {
                let base = self.base(*slot, map);
                let offset = ((FRAME_HEADER + r) * 8) as i32;
                self.b.ins().store(flags(), base, registers, offset);
            }
        }
    }

    /// Runs the program over the `rows` rows the frame holds, `n` elements each: one call per
    /// tile of a long row (one row), or one call for a block of short rows.
    pub(super) fn call_program(&mut self, f: &Frame, rows: CValue, n: CValue) {
        let frame = f.frame;
        self.b
            .ins()
            .store(flags(), rows, frame, (word::ROWS * 8) as i32);
        (self.b.ins()).store(flags(), n, frame, (word::ROW_LENGTH * 8) as i32);
        let zero = self.b.ins().iconst(types::I64, 0);
        let tiles = self.begin_loop(zero, n);
        let full = self.b.ins().iadd_imm_s(tiles.index, TILE as i64);
        let short = self.b.ins().icmp(IntCC::SignedLessThan, n, full);
        let end = self.b.ins().select(short, n, full);
        let len = self.b.ins().isub(end, tiles.index);
        self.b
            .ins()
            .store(flags(), tiles.index, frame, (word::START * 8) as i32);
        self.call_runner(frame, len);
        self.end_loop(tiles, TILE as i64);
        self.program_ops.extend(f.program.functions());
        self.program_ops.push("tile program");
    }

    /// Row `i`'s reductions' totals, by work: each folded into its first partial by the
    /// runner, or the identity where the row is empty (and the runner was not called).
    pub(super) fn program_totals(
        &mut self,
        f: &Frame,
        works: usize,
        i: CValue,
        n: CValue,
    ) -> Vec<Option<Variable>> {
        let p = &f.program;
        let offset = self
            .b
            .ins()
            .imul_imm_s(i, (p.reductions.len() * PARTIALS * 4) as i64);
        let partials = self.b.ins().iadd(f.partials, offset);
        let empty = self.b.ins().icmp_imm_s(IntCC::Equal, n, 0);
        let mut totals = vec![None; works];
        for (k, &(work, op)) in p.reductions.iter().enumerate() {
            let at = (k * PARTIALS * 4) as i32;
            let folded = self.b.ins().load(types::F32, flags(), partials, at);
            let identity = self.identity(op, DType::F32);
            let total = self.b.ins().select(empty, identity, folded);
            let var = self.b.declare_var(types::F32);
            self.b.def_var(var, total);
            totals[work] = Some(var);
        }
        totals
    }

    /// Calls the runner in the platform's convention: only the loop's few addresses are live
    /// across it, and they stay in callee-saved registers.
    fn call_runner(&mut self, frame: CValue, len: CValue) {
        let symbol = tile_program::SYMBOL;
        let callee = match self.imports.get(symbol) {
            Some(&f) => f,
            None => {
                let ptr = self.module.target_config().pointer_type();
                let mut sig = self.module.make_signature();
                sig.params
                    .extend([AbiParam::new(ptr), AbiParam::new(types::I64)]);
                let id = (self.module)
                    .declare_function(symbol, Linkage::Import, &sig)
                    .expect("the runner is declared with one signature");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.imports.insert(symbol.to_string(), f);
                f
            }
        };
        self.b.ins().call(callee, &[frame, len]);
    }
}

/// A program and its frame's stack slots, filled before the rows.
pub(super) struct Frame {
    program: Program,
    frame: CValue,
    scalars: CValue,
    partials: CValue,
}
