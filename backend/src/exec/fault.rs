//! Planted kernel faults, to test the tools that find wrong kernels (`kiln diff`): with a
//! fault planted for an op, every fused kernel whose body holds that op adds 1 to the first
//! element of the value the op computes (or of its first output). Built only with the
//! `fault-injection` feature; per thread, so other runs are untouched.

use crate::Array;
use kiln_ir::{Function, Inst};
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    static PLANTED: RefCell<Option<&'static str>> = const { RefCell::new(None) };
}

/// Makes this thread's kernels holding `op` (its text name, `tanh`) wrong; `None` clears it.
pub fn plant(op: Option<&'static str>) {
    PLANTED.with(|p| *p.borrow_mut() = op);
}

/// Applies the planted fault, if any, to the outputs of fused kernel `inst` of `func`.
pub(super) fn apply(func: &Function, inst: Inst, outputs: &mut [Arc<Array>]) {
    let Some(op) = PLANTED.with(|p| *p.borrow()) else {
        return;
    };
    let data = func.inst(inst);
    let Some(&body) = data.regions.first() else {
        return;
    };
    let Some(planted) = (func.region(body).insts.iter()).find(|&&i| func.inst(i).op.name() == op)
    else {
        return;
    };
    let computed = func.inst(*planted).results[0];
    let output = (func.region(body).results.iter())
        .position(|&v| v == computed)
        .unwrap_or(0);
    if let Some(Array::F32(a)) = outputs.get_mut(output).and_then(Arc::get_mut)
        && let Some(x) = a.iter_mut().next()
    {
        *x += 1.0;
    }
}
