//! Common-subexpression elimination: an instruction that applies the same op to the same
//! operands as one before it (in its region or an enclosing one) is replaced by that one.
//! Loads of one state and random draws with one seed are pure within a run, so they merge
//! too; stores, calls and ops with regions never do. A merged value's name goes to the value
//! that replaces it when that one has none (an output keeps the name it was given).

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::{Function, Inst, Module, Op, Region, Value};
use std::collections::HashMap;

/// Common-subexpression elimination.
pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut merged = 0;
        for func in &mut module.functions {
            let mut replace = HashMap::new();
            let mut scopes = Vec::new();
            let body = func.body();
            merged += cse_region(func, body, &mut scopes, &mut replace);
            func.replace_uses_map(&replace);
        }
        Ok(Stats::default().with("merged", merged))
    }
}

type Key = (Op, Vec<Value>);

fn resolve(replace: &HashMap<Value, Value>, v: Value) -> Value {
    let mut v = v;
    while let Some(&next) = replace.get(&v) {
        v = next;
    }
    v
}

/// Gives `kept` the name of `merged`, which it replaces, unless `kept` has a name.
fn keep_name(func: &mut Function, merged: Value, kept: Value) {
    if func.value_name(kept).is_none()
        && let Some(name) = func.value_name(merged).map(str::to_owned)
    {
        func.set_value_name(kept, Some(name));
    }
}

fn cse_region(
    func: &mut Function,
    region: Region,
    scopes: &mut Vec<HashMap<Key, Vec<Value>>>,
    replace: &mut HashMap<Value, Value>,
) -> usize {
    scopes.push(HashMap::new());
    let mut merged = 0;
    let mut kept: Vec<Inst> = Vec::new();
    for inst in func.region(region).insts.clone() {
        let data = func.inst(inst);
        let mergeable = data.regions.is_empty() && !data.op.has_side_effects();
        if !mergeable {
            for r in data.regions.clone() {
                merged += cse_region(func, r, scopes, replace);
            }
            kept.push(inst);
            continue;
        }
        let key: Key = (
            data.op.clone(),
            data.args.iter().map(|&a| resolve(replace, a)).collect(),
        );
        let earlier = scopes.iter().rev().find_map(|s| s.get(&key)).cloned();
        match earlier {
            Some(values) => {
                for (r, v) in data.results.clone().into_iter().zip(values) {
                    keep_name(func, r, v);
                    replace.insert(r, v);
                }
                merged += 1;
            }
            None => {
                let results = data.results.clone();
                scopes
                    .last_mut()
                    .expect("a scope is open")
                    .insert(key, results);
                kept.push(inst);
            }
        }
    }
    func.region_mut(region).insts = kept;
    scopes.pop();
    merged
}
