//! Dead-code elimination: an instruction is dead when none of its results is used and it has
//! no effects (a `store`, a custom-op `call`, or such an op inside its regions). State stores
//! are never dead.

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::{Function, Inst, Module, Region, Value};
use std::collections::HashSet;

/// Dead-code elimination: instructions whose results nothing uses and that have no effects.
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut removed = 0;
        for func in &mut module.functions {
            let body = func.body();
            removed += dce_region(func, body);
        }
        Ok(Stats::default().with("removed", removed))
    }
}

/// Whether `inst` or anything in its regions has effects.
pub(crate) fn has_effects(func: &Function, inst: Inst) -> bool {
    let data = func.inst(inst);
    data.op.has_side_effects()
        || data
            .regions
            .iter()
            .any(|&r| func.region(r).insts.iter().any(|&i| has_effects(func, i)))
}

/// Removes the dead instructions of `region` (and, in live instructions, of their regions);
/// returns how many were removed.
pub(crate) fn dce_region(func: &mut Function, region: Region) -> usize {
    let mut used: HashSet<Value> = func.region(region).results.iter().copied().collect();
    let mut removed = 0;
    let mut live: Vec<Inst> = Vec::new();
    let insts = func.region(region).insts.clone();
    for &inst in insts.iter().rev() {
        let data = func.inst(inst);
        let needed = data.results.iter().any(|r| used.contains(r)) || has_effects(func, inst);
        if !needed {
            removed += 1;
            continue;
        }
        for r in func.inst(inst).regions.clone() {
            removed += dce_region(func, r);
            used.extend(func.free_values(r));
        }
        used.extend(func.inst(inst).args.iter().copied());
        live.push(inst);
    }
    live.reverse();
    func.region_mut(region).insts = live;
    removed
}
