//! Control flow that works in both modes. Eagerly, `cond` runs one branch and `while_loop`
//! loops in Rust, and the tape records what ran, so gradients flow through it. While tracing,
//! they build `cond` and `while` regions, whose gradients the autodiff pass derives.

use super::{EagerError, EagerResult, Tensor, with};
use kiln_ir::{Op, Region, Type, Value};

/// `if pred { then_branch() } else { else_branch() }` on a bool scalar tensor. Both branches
/// return tensors of the same types.
pub fn cond(
    pred: &Tensor,
    then_branch: impl FnOnce() -> EagerResult<Vec<Tensor>>,
    else_branch: impl FnOnce() -> EagerResult<Vec<Tensor>>,
) -> EagerResult<Vec<Tensor>> {
    if !pred.is_traced() {
        return if pred.item()? != 0.0 {
            then_branch()
        } else {
            else_branch()
        };
    }
    let p = with(|cx| trace_value(cx, pred))?;
    let then_region = region(&[], |_| then_branch())?;
    let else_region = region(&[], |_| else_branch())?;
    finish(Op::Cond, &[p], vec![then_region, else_region])
}

/// `while cond(values) { values = body(values) }` from `init`; returns the final values.
/// `cond` returns a bool scalar tensor; `body` returns tensors of the carried types.
pub fn while_loop(
    init: &[Tensor],
    cond: impl Fn(&[Tensor]) -> EagerResult<Tensor>,
    body: impl Fn(&[Tensor]) -> EagerResult<Vec<Tensor>>,
) -> EagerResult<Vec<Tensor>> {
    let tracing = init.iter().any(Tensor::is_traced) || with(|cx| Ok(cx.trace.is_some()))?;
    if !tracing {
        let mut values = init.to_vec();
        while cond(&values)?.item()? != 0.0 {
            let next = body(&values)?;
            if next.len() != values.len() {
                return Err(EagerError::Usage(format!(
                    "while_loop: the body returned {} values for {} carried",
                    next.len(),
                    values.len()
                )));
            }
            values = next;
        }
        return Ok(values);
    }
    let init_values: Vec<Value> = with(|cx| init.iter().map(|t| trace_value(cx, t)).collect())?;
    let types: Vec<Type> = init.iter().map(Tensor::ty).collect();
    let cond_region = region(&types, |args| Ok(vec![cond(args)?]))?;
    let body_region = region(&types, body)?;
    finish(Op::While, &init_values, vec![cond_region, body_region])
}

fn trace_value(cx: &mut super::Context, t: &Tensor) -> EagerResult<Value> {
    let trace = cx.trace.as_mut().ok_or_else(|| {
        EagerError::Usage("a traced tensor was used outside its `to_static` call".into())
    })?;
    trace.value_of(t)
}

/// Opens a region of the trace with arguments of `types`, fills it with `fill` (user code,
/// run with no borrow of the context held), and closes it.
fn region(
    types: &[Type],
    fill: impl FnOnce(&[Tensor]) -> EagerResult<Vec<Tensor>>,
) -> EagerResult<Region> {
    let (region, args) = with(|cx| {
        let trace = cx
            .trace
            .as_mut()
            .ok_or_else(|| EagerError::Usage("no trace is open".into()))?;
        let (region, values) = trace.program.begin_region(types);
        let args: Vec<Tensor> = values.iter().map(|&v| trace.tensor(v)).collect();
        Ok((region, args))
    })?;
    let filled = fill(&args);
    with(|cx| {
        let trace = cx
            .trace
            .as_mut()
            .ok_or_else(|| EagerError::Usage("no trace is open".into()))?;
        let yields = filled.and_then(|ts| {
            ts.iter()
                .map(|t| trace.value_of(t))
                .collect::<EagerResult<Vec<_>>>()
        });
        match yields {
            Ok(values) => {
                trace.program.end_region(region, &values)?;
                Ok(region)
            }
            Err(e) => {
                trace.program.abandon_region(region);
                Err(e)
            }
        }
    })
}

fn finish(op: Op, args: &[Value], regions: Vec<Region>) -> EagerResult<Vec<Tensor>> {
    with(|cx| {
        let trace = cx
            .trace
            .as_mut()
            .ok_or_else(|| EagerError::Usage("no trace is open".into()))?;
        let results = trace.program.insert_with_regions(op, args, regions)?;
        Ok(results.iter().map(|&v| trace.tensor(v)).collect())
    })
}
