//! Shape-op canonicalisation: chains of layout ops become one op, and layout ops that change
//! nothing disappear.
//!
//! - `reshape(reshape(x))` → `reshape(x)`; a reshape to `x`'s own shape → `x`
//! - `transpose(transpose(x, p), q)` → `transpose(x, p∘q)`; the identity permutation → `x`
//! - `broadcast(broadcast(x))` → `broadcast(x)`; a broadcast to `x`'s own shape → `x`
//! - `cast(x)` to `x`'s own dtype → `x`; `slice` of every whole axis → `x`
//!
//! Instructions are rewritten in place; the ones left unused are removed by `dce`.

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::{AxisSlice, Function, Module, Op, Region, Value};
use std::collections::HashMap;

/// The canonicalisation pass: operands of commutative ops in a fixed order, identities removed.
pub struct Canonicalize;

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut rewritten = 0;
        for func in &mut module.functions {
            let mut replace = HashMap::new();
            let body = func.body();
            rewritten += canonicalize_region(func, body, &mut replace);
            func.replace_uses_map(&replace);
        }
        Ok(Stats::default().with("rewritten", rewritten))
    }
}

fn canonicalize_region(
    func: &mut Function,
    region: Region,
    replace: &mut HashMap<Value, Value>,
) -> usize {
    let mut rewritten = 0;
    for inst in func.region(region).insts.clone() {
        for r in func.inst(inst).regions.clone() {
            rewritten += canonicalize_region(func, r, replace);
        }
        let resolve = |v: Value, replace: &HashMap<Value, Value>| {
            let mut v = v;
            while let Some(&n) = replace.get(&v) {
                v = n;
            }
            v
        };
        let data = func.inst(inst);
        let (Some(&x), &[result]) = (data.args.first(), &data.results[..]) else {
            continue;
        };
        let x = resolve(x, replace);
        let x_ty = func.value_type(x).clone();
        let result_ty = func.value_type(result).clone();
        let inner = func.producer(x).map(|i| func.inst(i).clone());
        let same_type = x_ty == result_ty;
        match (&data.op, inner.as_ref().map(|d| &d.op)) {
            (Op::Reshape { .. } | Op::Broadcast { .. } | Op::Cast { .. }, _) if same_type => {
                replace.insert(result, x);
                rewritten += 1;
            }
            (Op::Slice { axes }, _) if same_type && axes.iter().all(|a| *a == AxisSlice::Full) => {
                replace.insert(result, x);
                rewritten += 1;
            }
            (Op::Transpose { perm }, _) if perm.iter().enumerate().all(|(i, &p)| i == p) => {
                replace.insert(result, x);
                rewritten += 1;
            }
            (Op::Reshape { .. }, Some(Op::Reshape { .. }))
            | (Op::Broadcast { .. }, Some(Op::Broadcast { .. })) => {
                let source = resolve(inner.as_ref().expect("matched").args[0], replace);
                func.inst_mut(inst).args[0] = source;
                rewritten += 1;
            }
            (Op::Transpose { perm: outer }, Some(Op::Transpose { perm: inner_perm })) => {
                // Result axis i is the inner result's axis outer[i], which is x's axis
                // inner[outer[i]].
                let composed: Vec<usize> = outer.iter().map(|&o| inner_perm[o]).collect();
                let source = resolve(inner.as_ref().expect("matched").args[0], replace);
                if composed.iter().enumerate().all(|(i, &p)| i == p) {
                    replace.insert(result, source);
                } else {
                    let data = func.inst_mut(inst);
                    data.args[0] = source;
                    data.op = Op::Transpose { perm: composed };
                }
                rewritten += 1;
            }
            _ => {}
        }
    }
    rewritten
}
