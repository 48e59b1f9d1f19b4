//! Reductions: identities, combining an element into an accumulator, and horizontal
//! reduction of a vector accumulator.

use super::*;

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
