//! Tile programs in kernels: a vectorised group whose per-element work is all ops that
//! [`tile_program`] has (f32 values, and bools as masks) becomes a program of whole-tile
//! instructions, and the group's vector loop becomes one call of the runner per tile:
//!
//! ```text
//! per row:   scalars[k] = row-level operand k;  partials = identities
//! per tile:  registers[b] = buffer b at the tile's start
//!            kiln_tile_program(frame, len)      (one call: every instruction, full width)
//! after:     the accumulators loaded from the partials (an f32 sum's: its 16 f64 totals,
//!            to which the runner adds each tile's 16 f32 partials); a reduction's scalar
//!            tail (a program that does not reduce takes the whole row)
//! ```
//!
//! Stores to the group's destinations (and stashes) are the program's last instructions, so
//! an output that shares its buffer with an input is written after the tile's last read.

use super::*;
use crate::jit::tile_program::{self, FRAME_HEADER, Instr, Operand, PARTIALS};

/// Elements per tile: 2 KiB of f32 per call, so a tile's scratch and its inputs sit in L1.
pub(super) const TILE: i64 = 512;

const _: () = assert!(PARTIALS == (LANES * REDUCE_UNROLL) as usize);
// A sum adds its tiles' partials into its f64 totals as Cranelift's loop adds its blocks'.
const _: () = assert!(plan::SUM_BLOCK == TILE);

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

/// A group's tile program, and what the kernel fills its frame with.
pub(super) struct Program {
    instrs: Vec<Instr>,
    registers: Vec<Register>,
    /// Row-level operands, by scalar index.
    scalars: Vec<(Value, Mapping)>,
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

    fn scalar(&mut self, v: Value, map: &Mapping) -> u16 {
        index_in(&mut self.scalars, (v, map.clone()))
    }

    /// The tile registers `i` reads.
    fn reads(i: &Instr) -> Vec<u16> {
        let tile = |o: &Operand| match o {
            Operand::Tile(r) => Some(*r),
            Operand::Scalar(_) => None,
        };
        match i {
            Instr::Copy { a, .. }
            | Instr::Unary { a, .. }
            | Instr::Reduce { a, .. }
            | Instr::Cast { a, .. } => tile(a).into_iter().collect(),
            Instr::Binary { a, b, .. } | Instr::Compare { a, b, .. } => {
                tile(a).into_iter().chain(tile(b)).collect()
            }
            Instr::Fused { a, b, c, .. } | Instr::Select { a, b, c, .. } => {
                [a, b, c].into_iter().filter_map(tile).collect()
            }
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
        let mut k = 0;
        while k < self.instrs.len() {
            let merged = Self::defines(&self.instrs[k])
                .and_then(|r| self.sole_reader(k, r, stores))
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

    /// Lets a unary op run over its operand's tile where nothing else reads that tile: one
    /// scratch tile fewer in L1.
    fn unary_in_place(&mut self, stores: &mut [(u16, Operand)]) {
        for k in 0..self.instrs.len() {
            let Instr::Unary {
                dst,
                a: Operand::Tile(r),
                ..
            } = self.instrs[k]
            else {
                continue;
            };
            let scratch = matches!(self.registers[r as usize], Register::Scratch(_));
            if !scratch || self.read_count(r, stores) != 1 {
                continue;
            }
            for i in &mut self.instrs[k..] {
                i.rename(dst, r);
            }
            for (_, a) in stores.iter_mut() {
                if *a == Operand::Tile(dst) {
                    *a = Operand::Tile(r);
                }
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
            // A unary op that rewrites the value in place runs over L1 scratch, then the value is
            // copied out, unless another instruction reads it too (W10's 64×256 tanh stage took
            // 14.3 µs over the output, a slice of its states' stack, and 8.2–9.3 µs over
            // scratch; softmax's exp, which the sum reads, is faster written to the output).
            let rewrites = |i: &Instr| Self::defines(i) == Some(r);
            let rewritten = self.instrs[k + 1..].iter().any(rewrites);
            let read_elsewhere =
                (self.instrs[k + 1..].iter()).any(|i| !rewrites(i) && Self::reads(i).contains(&r));
            if later_reads_buffer
                || (rewritten && !read_elsewhere)
                || !matches!(self.registers[r as usize], Register::Scratch(_))
            {
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
            // A register gets its tile where it is first written (a unary op in place writes
            // it again).
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
    /// The group's tile program, if every per-element op of it has one (f32 and mask values,
    /// f32 stores and plain reductions).
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
            let (root, map) = self.root(w);
            // Bools are masks in tiles, and bytes in memory.
            if self.dtype(root) != DType::F32 {
                return None;
            }
            let x = self.program_operand(&mut p, root, &map)?;
            match w {
                Work::Store(_) => {
                    for (slot, m) in self.work_destinations(w) {
                        stores.push((p.register(Register::Buffer(slot, m)), x));
                    }
                }
                Work::Reduce(v) => {
                    let (op, _) = self.plan.reduce_op(v).expect("a reduction");
                    let acc = p.reductions.len() as u16;
                    p.instrs.push(Instr::Reduce { op, acc, a: x });
                    p.reductions.push((index, op));
                }
                Work::ReduceInto(_) | Work::Combine(_) => return None,
            }
        }
        for stash in self.stash_in.clone() {
            if self.dtype(stash.value) != DType::F32 {
                return None;
            }
            let x = self.program_operand(&mut p, stash.value, &stash.map)?;
            let to = p.register(Register::Buffer(stash.slot, stash.slot_map));
            stores.push((to, x));
        }
        p.fuse(&stores);
        p.unary_in_place(&mut stores);
        p.write_results_in_place(&mut stores);
        (p.instrs).extend(stores.into_iter().map(|(dst, a)| Instr::Copy { dst, a }));
        p.assign_scratch();
        Some(p)
    }

    /// Where the program finds `v`'s tile, adding the instructions that compute it.
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
            Operand::Scalar(p.scalar(v, map))
        } else if let Some((slot, slot_map)) = stashed {
            if dtype != DType::F32 {
                return None;
            }
            Operand::Tile(p.register(Register::Buffer(slot, slot_map)))
        } else if plan.is_leaf_in(v, self.stage) {
            if dtype != DType::F32 {
                return None;
            }
            let slot = plan.slot(plan.source[&v]);
            Operand::Tile(p.register(Register::Buffer(slot, map.clone())))
        } else if self.passes_through(v) {
            let (x, m) = &plan.operand_mappings(v, map)[0];
            self.program_operand(p, *x, m)?
        } else {
            let instr = self.program_instruction(p, v, map)?;
            let dst = p.scratch();
            p.instrs.push(instr.with_destination(dst));
            Operand::Tile(dst)
        };
        p.memo.insert((v, map.clone()), o);
        Some(o)
    }

    /// Whether `v` is its operand's value: a broadcast, a reshape, a cast to its own type.
    fn passes_through(&self, v: Value) -> bool {
        match self.plan.op(v).expect("an op") {
            (Op::Broadcast { .. } | Op::Reshape { .. }, _) => true,
            (Op::Cast { to }, args) => self.dtype(args[0]) == *to,
            _ => false,
        }
    }

    /// The instruction computing `v` from its operands' tiles (its destination still to be
    /// given), if a program has one for its op.
    fn program_instruction(&mut self, p: &mut Program, v: Value, map: &Mapping) -> Option<Instr> {
        let plan = self.plan;
        let operands = plan.operand_mappings(v, map);
        let mut tile = |g: &mut Self, k: usize| {
            let (x, m) = &operands[k];
            g.program_operand(p, *x, m)
        };
        let f32 = self.dtype(v) == DType::F32;
        Some(match plan.op(v).expect("an op").0 {
            Op::Unary(op) if f32 && op.vector_form() == VectorForm::F32x4 => {
                let a = tile(self, 0)?;
                Instr::Unary { op: *op, dst: 0, a }
            }
            Op::Unary(op @ UnaryOp::Not) => {
                let a = tile(self, 0)?;
                Instr::Unary { op: *op, dst: 0, a }
            }
            Op::Binary(op) if f32 && op.vector_form() == VectorForm::F32x4 => {
                let (a, b) = (tile(self, 0)?, tile(self, 1)?);
                Instr::Binary {
                    op: *op,
                    dst: 0,
                    a,
                    b,
                }
            }
            Op::Binary(op @ (BinaryOp::And | BinaryOp::Or | BinaryOp::Xor)) => {
                let (a, b) = (tile(self, 0)?, tile(self, 1)?);
                Instr::Binary {
                    op: *op,
                    dst: 0,
                    a,
                    b,
                }
            }
            Op::Compare(op) if self.dtype(operands[0].0) == DType::F32 => {
                let (a, b) = (tile(self, 0)?, tile(self, 1)?);
                Instr::Compare {
                    op: *op,
                    dst: 0,
                    a,
                    b,
                }
            }
            Op::Select => {
                let (c, a, b) = (tile(self, 0)?, tile(self, 1)?, tile(self, 2)?);
                Instr::Select { dst: 0, c, a, b }
            }
            Op::Cast { to } => {
                let to_f32 = match (self.dtype(operands[0].0), *to) {
                    (DType::Bool, DType::F32) => true,
                    (DType::F32, DType::Bool) => false,
                    _ => return None,
                };
                let a = tile(self, 0)?;
                Instr::Cast { to_f32, dst: 0, a }
            }
            _ => return None,
        })
    }

    /// Fills, before the rows, what a program's frame keeps from row to row: the program,
    /// the header, the scratch tiles' addresses.
    pub(super) fn prepare_frame(&mut self, program: Program) -> Frame {
        let ptr = self.module.target_config().pointer_type();
        let slot = |g: &mut Self, bytes: usize| {
            let data = StackSlotData::new(StackSlotKind::ExplicitSlot, bytes.max(16) as u32, 6);
            let s = g.b.create_sized_stack_slot(data);
            g.b.ins().stack_addr(ptr, s, 0)
        };
        let p = &program;
        if crate::settings::debug_level() >= 2 {
            eprintln!("// tile program of a group of stage {}:", self.stage);
            for (r, register) in p.registers.iter().enumerate() {
                eprintln!("//   register {r}: {register:?}");
            }
            for i in &p.instrs {
                eprintln!("//   {i:?}");
            }
        }
        let mut words = Vec::new();
        for i in &p.instrs {
            i.encode(&mut words);
        }
        let program_at = (FRAME_HEADER + p.registers.len()) * 8;
        let frame = slot(self, program_at + words.len() * 8);
        let scalars = slot(self, p.scalars.len() * 4);
        let partials = slot(self, p.reductions.len() * PARTIALS * 8);
        let scratch = slot(self, p.scratch_tiles * TILE as usize * 4);
        for (k, &w) in words.iter().enumerate() {
            let word = self.b.ins().iconst(types::I64, w as i64);
            self.b
                .ins()
                .store(flags(), word, frame, (program_at + 8 * k) as i32);
        }
        let code = self.b.ins().iadd_imm_s(frame, program_at as i64);
        let count = self.b.ins().iconst(types::I64, words.len() as i64);
        let streamed = self.streamed_buffers(p);
        let mask = self.b.ins().iconst(types::I64, streamed as i64);
        for (k, x) in [code, count, scalars, partials, mask]
            .into_iter()
            .enumerate()
        {
            self.b.ins().store(flags(), x, frame, 8 * k as i32);
        }
        for (r, register) in p.registers.iter().enumerate() {
            if let Register::Scratch(t) = register {
                let at = self
                    .b
                    .ins()
                    .iadd_imm_s(scratch, (t * TILE as usize * 4) as i64);
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
        for (r, register) in p.registers.iter().enumerate().take(64) {
            if let Register::Buffer(slot, map) = register
                && !(self.strides(*slot, map)[..rows].iter()).all(|s| matches!(s, Stride::Zero))
            {
                mask |= 1 << r;
            }
        }
        mask
    }

    /// The vectorised part of the row, `0..vec_end`, by the prepared program `f`; leaves each
    /// reduction's accumulators (`accs`, by work) as Cranelift's own loop would.
    pub(super) fn run_program(&mut self, f: &Frame, vec_end: CValue, accs: &[Option<VectorAccs>]) {
        let (p, frame, partials) = (&f.program, f.frame, f.partials);
        for (k, (v, map)) in p.scalars.iter().enumerate() {
            let mut x = self.emit(*v, map, false);
            if self.dtype(*v) == DType::Bool {
                // A mask, as tiles hold bools.
                let wide = self.b.ins().uextend(types::I32, x);
                x = self.b.ins().ineg(wide);
            }
            self.b.ins().store(flags(), x, f.scalars, 4 * k as i32);
        }
        // Each reduction's 16 partials, 8 bytes each: an f32 sum's f64 totals start at zero
        // (whose bits are f32 zeros), a max's or min's f32 partials (the first 64 bytes) at
        // its identity.
        for (k, &(_, op)) in p.reductions.iter().enumerate() {
            let identity = self.identity(op, DType::F32, true);
            for u in 0..2 * REDUCE_UNROLL as usize {
                let at = (k * PARTIALS + u * LANES as usize / 2) * 8;
                self.b.ins().store(flags(), identity, partials, at as i32);
            }
        }
        let mut buffers = Vec::new();
        for (r, register) in p.registers.iter().enumerate() {
            if let Register::Buffer(slot, map) = register {
                buffers.push((self.base(*slot, map), ((FRAME_HEADER + r) * 8) as i32));
            }
        }
        let (tiles, _, len) = self.begin_tiles(vec_end);
        let offset = self.b.ins().imul_imm_s(tiles.index, 4);
        for &(base, at) in &buffers {
            let x = self.b.ins().iadd(base, offset);
            self.b.ins().store(flags(), x, frame, at);
        }
        self.call_runner(frame, len);
        self.end_loop(tiles, TILE);
        for (k, &(work, _)) in p.reductions.iter().enumerate() {
            let accs = accs[work].as_ref().expect("a reduction's accumulators");
            let (vars, ty) = match accs.wide.is_empty() {
                true => (&accs.partials, types::F32X4),
                false => (&accs.wide, types::F64X2),
            };
            for (u, &var) in vars.iter().enumerate() {
                let at = (k * PARTIALS * 8 + u * 16) as i32;
                let x = self.b.ins().load(ty, flags(), partials, at);
                self.b.def_var(var, x);
            }
        }
        self.in_programs.extend(p.functions());
        self.in_programs.push("tile program");
    }

    /// Opens the loop over the tiles of `0..vec_end`; returns it, the tile's end and its length.
    fn begin_tiles(&mut self, vec_end: CValue) -> (Loop, CValue, CValue) {
        let zero = self.b.ins().iconst(types::I64, 0);
        let tiles = self.begin_loop(zero, vec_end);
        let full = self.b.ins().iadd_imm_s(tiles.index, TILE);
        let short = self.b.ins().icmp(IntCC::SignedLessThan, vec_end, full);
        let end = self.b.ins().select(short, vec_end, full);
        let len = self.b.ins().isub(end, tiles.index);
        (tiles, end, len)
    }

    /// Calls the runner on a tile, in the platform's convention: only the loop's few
    /// addresses are live across the call, and they stay in callee-saved registers.
    fn call_runner(&mut self, frame: CValue, len: CValue) {
        let name = tile_program::SYMBOL;
        let callee = match self.imports.get(name) {
            Some(&f) => f,
            None => {
                let ptr = self.module.target_config().pointer_type();
                let mut sig = self.module.make_signature();
                sig.params
                    .extend([AbiParam::new(ptr), AbiParam::new(types::I64)]);
                let id = (self.module.declare_function(name, Linkage::Import, &sig))
                    .expect("the runner is declared with one signature");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.imports.insert(name.to_owned(), f);
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
