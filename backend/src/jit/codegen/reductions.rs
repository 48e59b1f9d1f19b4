//! Reductions: identities, combining an element into an accumulator, and horizontal
//! reduction of a vector accumulator.

use super::*;
use cranelift_codegen::ir::Endianness;

impl Gen<'_, '_> {
    pub(super) fn identity(&mut self, op: ReduceOp, dtype: DType, vector: bool) -> CValue {
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

    pub(super) fn combine(&mut self, op: ReduceOp, dtype: DType, acc: CValue, x: CValue) -> CValue {
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
    pub(super) fn horizontal(&mut self, op: ReduceOp, v: CValue) -> CValue {
        let lane = |g: &mut Self, i: u8| g.b.ins().extractlane(v, i);
        let (a, b, c, d) = (lane(self, 0), lane(self, 1), lane(self, 2), lane(self, 3));
        let ab = self.combine(op, DType::F32, a, b);
        let cd = self.combine(op, DType::F32, c, d);
        self.combine(op, DType::F32, ab, cd)
    }
}

/// A reduction's accumulators in a vectorised loop: [`REDUCE_UNROLL`] f32x4 partials (element
/// `i` of a block into partial `i mod 16`) and, for an f32 sum, the f64x2 totals its blocks'
/// partials are added into (partial `4u + l` into lane `l mod 2` of `wide[2u + l / 2]`).
pub(super) struct VectorAccs {
    pub(super) partials: Vec<Variable>,
    pub(super) wide: Vec<Variable>,
}

impl Gen<'_, '_> {
    /// Whether work `w` is an f32 sum, accumulated in f64 ([`KernelPlan::sums_wide`]).
    pub(super) fn sums_wide(&self, w: Work) -> bool {
        matches!(w, Work::Reduce(v) | Work::ReduceInto(v) | Work::Combine(v) if self.plan.sums_wide(v))
    }

    /// The accumulators of reduction work `w` in a vectorised loop, at their identities.
    pub(super) fn vector_accs(&mut self, w: Work) -> VectorAccs {
        let (op, _) = self.plan.reduce_op(w.value()).expect("a reduction");
        let init = self.identity(op, DType::F32, true);
        let partials = (0..REDUCE_UNROLL)
            .map(|_| self.var(types::F32X4, init))
            .collect();
        let wide = match self.sums_wide(w) {
            true => {
                let zero = self.wide_zero();
                (0..2 * REDUCE_UNROLL)
                    .map(|_| self.var(types::F64X2, zero))
                    .collect()
            }
            false => Vec::new(),
        };
        VectorAccs { partials, wide }
    }

    fn var(&mut self, ty: ClType, init: CValue) -> Variable {
        let var = self.b.declare_var(ty);
        self.b.def_var(var, init);
        var
    }

    fn wide_zero(&mut self) -> CValue {
        let zero = self.b.ins().f64const(0.0);
        self.b.ins().splat(types::F64X2, zero)
    }

    /// Adds a block's f32 partials into the f64 totals and starts the next block at zero.
    pub(super) fn fold_block(&mut self, accs: &VectorAccs) {
        let zero = self.identity(ReduceOp::Sum, DType::F32, true);
        for (u, &partial) in accs.partials.iter().enumerate() {
            let x = self.b.use_var(partial);
            let low = self.b.ins().fvpromote_low(x);
            let high = self.promote_high(x);
            for (k, half) in [low, high].into_iter().enumerate() {
                let total = self.b.use_var(accs.wide[2 * u + k]);
                let sum = self.b.ins().fadd(total, half);
                self.b.def_var(accs.wide[2 * u + k], sum);
            }
            self.b.def_var(partial, zero);
        }
    }

    /// Lanes 2 and 3 of f32x4 `x` as an f64x2.
    fn promote_high(&mut self, x: CValue) -> CValue {
        let bytes: Vec<u8> = (8..16).chain(8..16).collect();
        let mask = (self.b.func.dfg.immediates).push(ConstantData::from(bytes.as_slice()));
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let bytes = self.b.ins().bitcast(types::I8X16, little, x);
        let high = self.b.ins().shuffle(bytes, bytes, mask);
        let high = self.b.ins().bitcast(types::F32X4, little, high);
        self.b.ins().fvpromote_low(high)
    }

    /// The f64 total of a sum's 16 f64 partials: lanes 0 and 1 of every partial vector summed,
    /// lanes 2 and 3 summed, then `(l0 + l1) + (l2 + l3)` — the order of [`Gen::horizontal`],
    /// which the tile runner's partials are summed in too.
    pub(super) fn wide_total(&mut self, wide: &[Variable]) -> CValue {
        let mut halves = [None, None];
        for (k, &var) in wide.iter().enumerate() {
            let x = self.b.use_var(var);
            let half = &mut halves[k % 2];
            *half = Some(match *half {
                Some(acc) => self.b.ins().fadd(acc, x),
                None => x,
            });
        }
        let mut lanes = Vec::new();
        for half in halves.into_iter().flatten() {
            lanes.push(self.b.ins().extractlane(half, 0));
            lanes.push(self.b.ins().extractlane(half, 1));
        }
        let low = self.b.ins().fadd(lanes[0], lanes[1]);
        let high = self.b.ins().fadd(lanes[2], lanes[3]);
        self.b.ins().fadd(low, high)
    }

    /// `x` (f32 or f32x4) added into the f64 accumulator at `addr`.
    pub(super) fn add_wide(&mut self, addr: CValue, x: CValue, vector: bool) {
        if !vector {
            let wide = self.b.ins().fpromote(types::F64, x);
            let old = self.b.ins().load(types::F64, flags(), addr, 0);
            let new = self.b.ins().fadd(old, wide);
            self.b.ins().store(flags(), new, addr, 0);
            return;
        }
        let low = self.b.ins().fvpromote_low(x);
        let high = self.promote_high(x);
        for (k, half) in [low, high].into_iter().enumerate() {
            let offset = 16 * k as i32;
            let old = self.b.ins().load(types::F64X2, flags(), addr, offset);
            let new = self.b.ins().fadd(old, half);
            self.b.ins().store(flags(), new, addr, offset);
        }
    }
}
