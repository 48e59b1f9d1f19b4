//! Planted kernel faults, to test the tools that find wrong kernels (`kiln diff`): with a
//! fault planted for an op, every fused kernel whose body holds that op adds 1 to the first
//! element of the value the op computes (or of its first output); with one planted in views,
//! every product that reads an operand through a view (a reshape or transpose it bypasses)
//! adds 1 to its first element — a fault only the plan of a program as the user runs it has,
//! since a value observed by `kiln diff` is a result and no product reads through it. Built
//! only in debug builds (`debug_assertions`: tests, never a release build); per thread, so other
//! runs are untouched.

use crate::Array;
use kiln_ir::{Function, Inst};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

thread_local! {
    static PLANTED: RefCell<Option<&'static str>> = const { RefCell::new(None) };
    static IN_VIEWS: Cell<bool> = const { Cell::new(false) };
}

/// Makes this thread's kernels holding `op` (its text name, `tanh`) wrong; `None` clears it.
pub fn plant(op: Option<&'static str>) {
    PLANTED.with(|p| *p.borrow_mut() = op);
}

/// Makes this thread's products that read an operand through a view wrong, or right again.
pub fn plant_in_views(on: bool) {
    IN_VIEWS.with(|p| p.set(on));
}

/// Applies the fault planted in views, if any, to a product's output.
pub(super) fn apply_to_view_product(out: &mut Array) {
    if IN_VIEWS.with(Cell::get)
        && let Array::F32(a) = out
        && let Some(x) = a.iter_mut().next()
    {
        *x += 1.0;
    }
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
