//! Constant placement: each `const` (and `iota`) moves to just before the first instruction
//! of its region that reads it (directly, or from inside that instruction's regions).
//!
//! A constant has no operands and no effects, so where it stands changes nothing a program
//! computes — but it changes the printed program, and which of two equal constants `cse`
//! keeps. Front ends put constants wherever they made them (ONNX's importer at the first use
//! of a `Constant` node, Kiln's composites where the composite starts); placing every constant
//! by one rule first makes a program print the same whichever front end built it, so an
//! exported model imported again is a fixed point of the pipeline.

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::{Function, Inst, Module, Op, Region, Value};
use std::collections::HashMap;

/// The constant-placement pass.
pub struct PlaceConstants;

impl Pass for PlaceConstants {
    fn name(&self) -> &'static str {
        "place_constants"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut moved = 0;
        for func in &mut module.functions {
            let body = func.body();
            moved += place_in_region(func, body);
        }
        Ok(Stats::default().with("constants moved", moved))
    }
}

/// Places the constants of `region` (and of the regions inside it); returns how many moved.
fn place_in_region(func: &mut Function, region: Region) -> usize {
    let mut moved = 0;
    for inst in func.region(region).insts.clone() {
        for r in func.inst(inst).regions.clone() {
            moved += place_in_region(func, r);
        }
    }
    let insts = func.region(region).insts.clone();
    let is_constant = |i: Inst| matches!(func.inst(i).op, Op::Const { .. } | Op::Iota { .. });
    let mut unplaced: HashMap<Value, Inst> = (insts.iter().copied())
        .filter(|&i| is_constant(i))
        .map(|i| (func.inst(i).results[0], i))
        .collect();
    let mut placed = Vec::with_capacity(insts.len());
    let take = |v: Value, placed: &mut Vec<Inst>, unplaced: &mut HashMap<Value, Inst>| {
        if let Some(c) = unplaced.remove(&v) {
            placed.push(c);
        }
    };
    for &inst in insts.iter().filter(|&&i| !is_constant(i)) {
        let data = func.inst(inst);
        let inner = data.regions.iter().flat_map(|&r| func.free_values(r));
        for v in data.args.clone().into_iter().chain(inner) {
            take(v, &mut placed, &mut unplaced);
        }
        placed.push(inst);
    }
    // What the region yields, then the constants nothing reads, in their first order.
    for &v in &func.region(region).results.clone() {
        take(v, &mut placed, &mut unplaced);
    }
    let unread = |i: &&Inst| is_constant(**i) && unplaced.contains_key(&func.inst(**i).results[0]);
    placed.extend(insts.iter().filter(unread));
    // A constant moved when what follows it changed.
    let next = |order: &[Inst]| -> HashMap<Inst, Option<Inst>> {
        (order.iter().enumerate())
            .map(|(k, &i)| (i, order.get(k + 1).copied()))
            .collect()
    };
    let (before, after) = (next(&insts), next(&placed));
    moved += (insts.iter())
        .filter(|&&i| is_constant(i) && before[&i] != after[&i])
        .count();
    func.region_mut(region).insts = placed;
    moved
}
