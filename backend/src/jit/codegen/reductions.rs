//! Reductions: identities, and combining an element into an accumulator.

use super::*;

impl Gen<'_, '_> {
    pub(super) fn identity(&mut self, op: ReduceOp, dtype: DType) -> CValue {
        if dtype.is_float() {
            let x = match op {
                ReduceOp::Sum | ReduceOp::Mean => 0.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            };
            return self.float_const(dtype, x);
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
}
