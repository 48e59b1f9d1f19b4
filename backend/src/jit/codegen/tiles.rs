//! Vector routines on tiles: the vectorised part of a row walked in tiles of [`TILE`]
//! elements. For each tile, the arguments of the group's transcendental functions are
//! computed on f32x4 lanes into a scratch buffer on the stack, each is replaced in place by
//! its AVX-512/AVX2 routine ([`crate::vecmath`]), and the group's own loop then reads the
//! results back from the scratch buffer, which is still in L1:
//!
//! ```text
//! for tile in 0..vec_end step TILE:
//!     phase 1:  scratch[k] = argument of call k     (f32x4 Cranelift code)
//!               kiln_vector_tanh(scratch[k], len)   (one call per tile)
//!     phase 2:  … calls whose arguments read phase 1's results …
//!     the group's loop over the tile, calls' values loaded from scratch
//! ```
//!
//! The scalar tail keeps the Cranelift polynomials, which give the routines' bits.

use super::*;
use crate::vecmath;
use cranelift_codegen::isa::CallConv;

/// Elements per tile: 2 KiB of f32 per call, so a tile's scratch and its inputs sit in L1.
pub(super) const TILE: i64 = 512;

/// The scratch buffer of the current tile.
pub(super) struct Tile {
    /// The tile's first position along the row.
    start: CValue,
    /// The scratch buffer's address (64-byte aligned); call `k` owns `TILE` elements at
    /// `k·TILE`.
    scratch: CValue,
    calls: Vec<(Value, Mapping)>,
    /// Calls whose results the scratch buffer holds.
    ready: usize,
}

impl Gen<'_, '_> {
    /// The group's per-element transcendental functions that have a vector routine, in
    /// phases: a call's argument reads only calls of earlier phases.
    pub(super) fn routine_calls(&mut self, works: &[Work]) -> Vec<Vec<(Value, Mapping)>> {
        let isa = vecmath::isa();
        if isa == vecmath::Isa::Off {
            return Vec::new();
        }
        let mut roots = self.roots(works);
        roots.extend(self.stash_in.iter().map(|s| (s.value, s.map.clone())));
        let mut phase = HashMap::new();
        for (v, map) in roots {
            self.call_phase(v, &map, isa, &mut phase);
        }
        let depth = phase.values().map(|&(p, _)| p).max().unwrap_or(0);
        let mut phases = vec![Vec::new(); depth];
        for ((v, map), (p, is_call)) in phase {
            if is_call {
                phases[p - 1].push((v, map));
            }
        }
        // A stable order, so the same region compiles to the same code.
        phases.iter_mut().for_each(|p| p.sort());
        phases
    }

    /// How many routine calls deep `v` is (0 when it needs none), and whether it is one.
    fn call_phase(
        &mut self,
        v: Value,
        map: &Mapping,
        isa: vecmath::Isa,
        memo: &mut HashMap<(Value, Mapping), (usize, bool)>,
    ) -> usize {
        if let Some(&(p, _)) = memo.get(&(v, map.clone())) {
            return p;
        }
        let plan = self.plan;
        let stashed = self.stash_out.iter().any(|s| s.value == v && s.map == *map);
        if stashed || self.level(v, map) < Level::Inner || plan.is_leaf_in(v, self.stage) {
            return 0;
        }
        let mut depth = 0;
        for (x, m) in plan.operand_mappings(v, map) {
            depth = depth.max(self.call_phase(x, &m, isa, memo));
        }
        let is_call = self.dtype(v) == DType::F32
            && matches!(plan.op(v), Some((Op::Unary(u), _)) if vecmath::routine(*u, isa).is_some());
        let p = depth + usize::from(is_call);
        memo.insert((v, map.clone()), (p, is_call));
        p
    }

    /// The vectorised part of a row, `0..vec_end`, in tiles, with the calls of `phases` made
    /// by routines; `body` emits one vector step of the group at `self.inner` (`unroll` per
    /// trip).
    pub(super) fn tiled_vector_loop(
        &mut self,
        phases: &[Vec<(Value, Mapping)>],
        vec_end: CValue,
        unroll: i64,
        body: &mut dyn FnMut(&mut Self, u32),
    ) {
        let calls: Vec<(Value, Mapping)> = phases.concat();
        let bytes = calls.len() as u32 * TILE as u32 * 4 + 64;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes,
            4,
        ));
        let ptr = self.module.target_config().pointer_type();
        let raw = self.b.ins().stack_addr(ptr, slot, 0);
        let raw = self.b.ins().iadd_imm_s(raw, 63);
        let scratch = self.b.ins().band_imm_s(raw, !63);
        let (tiles, end, len) = self.begin_tiles(vec_end);
        let start = tiles.index;
        self.tile = Some(Tile {
            start,
            scratch,
            calls: calls.clone(),
            ready: 0,
        });
        let mut first = 0;
        for phase in phases {
            let l = self.begin_loop(start, end);
            for u in 0..unroll {
                self.scopes.push(HashMap::new());
                self.inner = Some(self.b.ins().iadd_imm_s(l.index, u * LANES));
                for (k, (v, map)) in phase.iter().enumerate() {
                    let (x, m) = self.plan.operand_mappings(*v, map).remove(0);
                    let arg = self.emit(x, &m, true);
                    let addr = self.scratch_address(first + k);
                    self.b.ins().store(flags(), arg, addr, 0);
                }
                self.scopes.pop();
            }
            self.end_loop(l, LANES * unroll);
            for (k, (v, _)) in phase.iter().enumerate() {
                let Some((Op::Unary(op), _)) = self.plan.op(*v) else {
                    unreachable!("a routine call is a unary op")
                };
                let at = self
                    .b
                    .ins()
                    .iadd_imm_s(scratch, (first + k) as i64 * TILE * 4);
                self.call_routine(*op, at, len);
            }
            first += phase.len();
            self.tile.as_mut().expect("a tile").ready = first;
        }
        let l = self.begin_loop(start, end);
        for u in 0..unroll {
            self.inner = Some(self.b.ins().iadd_imm_s(l.index, u * LANES));
            body(self, u as u32);
        }
        self.end_loop(l, LANES * unroll);
        self.tile = None;
        self.inner = None;
        self.end_loop(tiles, TILE);
        self.routines_called
            .extend(calls.iter().filter_map(|(v, _)| match self.plan.op(*v) {
                Some((Op::Unary(op), _)) => Some(op.name()),
                _ => None,
            }));
    }

    /// Opens the loop over the tiles of `0..vec_end`; returns it, the tile's end and its length.
    pub(super) fn begin_tiles(&mut self, vec_end: CValue) -> (Loop, CValue, CValue) {
        let zero = self.b.ins().iconst(types::I64, 0);
        let tiles = self.begin_loop(zero, vec_end);
        let full = self.b.ins().iadd_imm_s(tiles.index, TILE);
        let short = self.b.ins().icmp(IntCC::SignedLessThan, vec_end, full);
        let end = self.b.ins().select(short, vec_end, full);
        let len = self.b.ins().isub(end, tiles.index);
        (tiles, end, len)
    }

    /// Where call `k`'s result for the current inner position is.
    fn scratch_address(&mut self, k: usize) -> CValue {
        let tile = self.tile.as_ref().expect("a tile");
        let (start, scratch) = (tile.start, tile.scratch);
        let inner = self.inner.expect("an inner position");
        let offset = self.b.ins().isub(inner, start);
        let offset = self.b.ins().imul_imm_s(offset, 4);
        let base = self.b.ins().iadd(scratch, offset);
        self.b.ins().iadd_imm_s(base, k as i64 * TILE * 4)
    }

    /// The load of `v`'s vector at the current position, when a routine computed it.
    pub(super) fn tile_result(&mut self, v: Value, map: &Mapping, vector: bool) -> Option<CValue> {
        let tile = self.tile.as_ref()?;
        if !vector {
            return None;
        }
        let k = tile.calls[..tile.ready]
            .iter()
            .position(|(x, m)| *x == v && m == map)?;
        let addr = self.scratch_address(k);
        Some(self.b.ins().load(types::F32X4, flags(), addr, 0))
    }

    /// Calls `op`'s routine through its register-preserving trampoline.
    fn call_routine(&mut self, op: UnaryOp, data: CValue, len: CValue) {
        self.call_routine_symbol(&vecmath::symbol(op), data, len, false);
    }

    /// Calls the routine `symbol` (`fn(*mut _, i64)`): through its register-preserving
    /// trampoline, or (`direct`) in the platform's convention, where Cranelift saves only what
    /// is live across the call.
    pub(super) fn call_routine_symbol(
        &mut self,
        symbol: &str,
        data: CValue,
        len: CValue,
        direct: bool,
    ) {
        let name = match direct {
            true => symbol.to_string(),
            false => trampoline_name(symbol),
        };
        let callee = match self.imports.get(name.as_str()) {
            Some(&f) => f,
            None => {
                let (call_conv, linkage) = match direct {
                    true => (self.module.isa().default_call_conv(), Linkage::Import),
                    false => (CallConv::PreserveAll, Linkage::Local),
                };
                let sig = routine_signature(self.module, call_conv);
                let id = self
                    .module
                    .declare_function(&name, linkage, &sig)
                    .expect("a routine is declared with one signature");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.imports.insert(name, f);
                f
            }
        };
        self.b.ins().call(callee, &[data, len]);
    }
}

fn trampoline_name(symbol: &str) -> String {
    format!("{symbol}_preserving")
}

/// `fn(data: *mut f32, len: i64)` in `call_conv`.
fn routine_signature(module: &JITModule, call_conv: CallConv) -> cranelift_codegen::ir::Signature {
    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    sig.call_conv = call_conv;
    sig.params
        .extend([AbiParam::new(ptr), AbiParam::new(types::I64)]);
    sig
}

/// Defines, for each routine of the ISA in use, a trampoline that calls it and preserves
/// every register (`preserve_all`): a kernel's call then clobbers nothing, so its
/// accumulators and hoisted values stay in registers across the tile loop (with the routine's
/// own System V convention every vector register is the caller's to save, and Cranelift kept
/// them on the stack through the whole loop).
pub(crate) fn define_trampolines(
    module: &mut JITModule,
    ctx: &mut cranelift_codegen::Context,
    builder_ctx: &mut FunctionBuilderContext,
) -> Result<(), JitError> {
    let isa = vecmath::isa();
    let codegen = |e: &dyn std::fmt::Display| JitError::Codegen(e.to_string());
    let routines = (UnaryOp::ALL.iter())
        .filter(|&&op| vecmath::routine(op, isa).is_some())
        .map(|&op| vecmath::symbol(op));
    for symbol in routines {
        module.clear_context(ctx);
        let sig = routine_signature(module, CallConv::PreserveAll);
        let id = (module.declare_function(&trampoline_name(&symbol), Linkage::Local, &sig))
            .map_err(|e| codegen(&e))?;
        let target_sig = routine_signature(module, module.isa().default_call_conv());
        let target = (module.declare_function(&symbol, Linkage::Import, &target_sig))
            .map_err(|e| codegen(&e))?;
        ctx.func.signature = sig;
        ctx.func.name = cranelift_codegen::ir::UserFuncName::user(0, id.as_u32());
        let config = module.target_config();
        let mut b = FunctionBuilder::new(&mut ctx.func, builder_ctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let args = b.block_params(entry).to_vec();
        let callee = module.declare_func_in_func(target, b.func);
        b.ins().call(callee, &args);
        b.ins().return_(&[]);
        b.finalize(config);
        (module.define_function(id, ctx)).map_err(|e| codegen(&format!("{e:?}")))?;
        module.clear_context(ctx);
    }
    module.finalize_definitions().map_err(|e| codegen(&e))
}
