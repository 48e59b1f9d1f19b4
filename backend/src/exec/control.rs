//! Compiled control flow: the regions of a `while` or a `cond` become programs of their own
//! (each an [`Executable`] with its kernels and planned buffers), run by the step as many
//! times as the loop goes round or once for the branch taken. A region's program takes the
//! region's arguments, then the outer values it reads (`free`).
//!
//! A region that reads state or communicates stays with the interpreter (a top-level kernel
//! may have updated a state's buffer in place before the region reads it), as does one whose
//! sizes its arguments do not bind.

use super::schedule::{Step, StepKind, region_function};
use super::{Executable, Runtime};
use crate::InterpError;
use crate::interp::Interpreter;
use crate::{Array, StateStore};
use cranelift_entity::EntityRef;
use kiln_ir::{Function, Inst, Op, OpClass, Region, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// The step of a `while` or `cond` with compiled regions, or why its regions cannot be.
pub(super) fn compiled(func: &Function, inst: Inst) -> Result<StepKind, String> {
    let data = func.inst(inst);
    let mut free: Vec<Value> = Vec::new();
    for &r in &data.regions {
        for v in func.free_values(r) {
            if !free.contains(&v) {
                free.push(v);
            }
        }
    }
    let program = |k: usize, part: &str| -> Result<Arc<Executable>, String> {
        let name = format!("{}.{}{}.{part}", func.name(), data.op.name(), inst.index());
        region_program(func, data.regions[k], &free, &name).map(|f| Arc::new(Executable::new(&f)))
    };
    match data.op {
        Op::While => Ok(StepKind::While {
            cond: program(0, "cond")?,
            body: program(1, "body")?,
            free,
        }),
        Op::Cond => Ok(StepKind::Cond {
            branches: [program(0, "then")?, program(1, "else")?],
            free,
        }),
        _ => unreachable!("only `while` and `cond` have compiled regions"),
    }
}

/// `region` as a function of its arguments, then of `free`.
fn region_program(
    func: &Function,
    region: Region,
    free: &[Value],
    name: &str,
) -> Result<Function, String> {
    if let Some(op) = touches_state(func, region) {
        return Err(format!("its region has `{op}`"));
    }
    let program = region_function(func, region, free, name).map_err(|e| e.to_string())?;
    // Every size must come from an argument, as the executor binds them.
    let bound: HashSet<_> = (program.args().iter())
        .flat_map(|&a| program.value_type(a).shape.symbols())
        .collect();
    let walk = program.walk_insts();
    let values = walk.iter().flat_map(|&i| &program.inst(i).results);
    for &v in values {
        if let Some(s) = (program.value_type(v).shape.symbols()).find(|s| !bound.contains(s)) {
            return Err(format!("no argument of its region binds the size {s}"));
        }
    }
    Ok(program)
}

/// The first op in `region` (or nested in it) that reads or writes state or communicates.
fn touches_state(func: &Function, region: Region) -> Option<&'static str> {
    for &i in &func.region(region).insts {
        let data = func.inst(i);
        let uses_state = matches!(data.op, Op::Load { .. } | Op::Store { .. });
        if uses_state || data.op.class() == OpClass::Communication {
            return Some(data.op.name());
        }
        if let Some(op) = (data.regions.iter()).find_map(|&r| touches_state(func, r)) {
            return Some(op);
        }
    }
    None
}

impl Executable {
    /// The operands of a control-flow step: its own arguments, then the free values. An
    /// operand used here for the last time (and once) moves out of the run's values, so the
    /// regions may update its buffer in place.
    fn control_inputs(rt: &mut Runtime, step: &Step) -> Vec<Arc<Array>> {
        (step.inputs.iter())
            .map(|&v| {
                let dies = step.release.iter().any(|&(r, _)| r == v);
                let once = step.inputs.iter().filter(|&&u| u == v).count() == 1;
                match (dies && once).then(|| rt.env[v.index()].take()).flatten() {
                    Some(array) => array,
                    None => Self::value(rt, v).clone(),
                }
            })
            .collect()
    }

    /// Runs a `while` step: the condition's program on the carried values, then the body's,
    /// until the condition yields false (or the trip limit is reached).
    pub(super) fn run_while(
        &self,
        rt: &mut Runtime,
        step: &Step,
        [cond, body]: [&Executable; 2],
        state: &mut StateStore,
        interp: &Interpreter<'_>,
    ) -> Result<(), InterpError> {
        let mut carried = Self::control_inputs(rt, step);
        let free = carried.split_off(self.func.inst(step.inst).args.len());
        loop {
            let args = carried.iter().chain(&free).cloned().collect();
            let go = cond.run(args, state, interp, true)?;
            match go.first().and_then(|a| a.as_bool_scalar()) {
                Some(true) => {
                    crate::limits::count_trip().map_err(|message| self.fail(step.inst, message))?
                }
                Some(false) => break,
                None => {
                    let message = "the `cond` region did not yield a bool scalar";
                    return Err(self.fail(step.inst, message));
                }
            }
            // The carried values move into the body, so a buffer it updates in place (a
            // stack of states) is not shared.
            let args = carried.drain(..).chain(free.iter().cloned()).collect();
            // Not retained: a kept reference would make the next trip's stack shared.
            carried = body.run(args, state, interp, false)?;
        }
        for (&v, array) in step.outputs.iter().zip(carried) {
            rt.env[v.index()] = Some(array);
        }
        Ok(())
    }

    /// Runs a `cond` step: the program of the branch its predicate picks.
    pub(super) fn run_cond(
        &self,
        rt: &mut Runtime,
        step: &Step,
        branches: &[Arc<Executable>; 2],
        state: &mut StateStore,
        interp: &Interpreter<'_>,
    ) -> Result<(), InterpError> {
        let inputs = Self::control_inputs(rt, step);
        let Some(pred) = inputs[0].as_bool_scalar() else {
            return Err(self.fail(step.inst, "the predicate is not a bool scalar"));
        };
        let branch = &branches[usize::from(!pred)];
        let results = branch.run(inputs[1..].to_vec(), state, interp, true)?;
        for (&v, array) in step.outputs.iter().zip(results) {
            rt.env[v.index()] = Some(array);
        }
        Ok(())
    }
}
