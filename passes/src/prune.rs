//! Pruning: the part of a function that some outputs and some stores need.
//!
//! A static program is one graph function holding every op the user built; a `Session::run`
//! executes only the slice its fetches need. The slice keeps the instructions the outputs and
//! the chosen stores depend on (an instruction with regions counts with everything its regions
//! use), drops every other instruction, store and argument, and keeps names and source
//! locations as they were.

use kiln_ir::{Function, Inst, Op, Symbol, Value};
use std::collections::{HashMap, HashSet};

/// The slice of `graph` (top level) computing `outputs` and performing `stores`, as a new
/// function `name` returning `outputs`. Arguments it does not need are removed.
pub fn prune(graph: &Function, name: &str, outputs: &[Value], stores: &[Inst]) -> Function {
    prune_fed(graph, name, outputs, stores, &[]).0
}

/// Like [`prune`], with `fed` values cut loose from what computes them: each fed value the
/// slice needs becomes an argument of the function (with the name given), and nothing upstream of it
/// is kept unless something else needs it. An instruction is dropped only when every result
/// the slice needs from it is fed. Returns the function and, for each of its arguments, the
/// value of `graph` it stands for (a placeholder kept, or a fed value).
pub fn prune_fed(
    graph: &Function,
    name: &str,
    outputs: &[Value],
    stores: &[Inst],
    fed: &[(Value, Option<String>)],
) -> (Function, Vec<Value>) {
    let is_fed = |v: &Value| fed.iter().any(|(f, _)| f == v);
    let mut needed: HashSet<Value> = outputs.iter().copied().collect();
    let keep_store: HashSet<Inst> = stores.iter().copied().collect();
    let body = graph.body();
    let mut kept: Vec<Inst> = Vec::new();
    for &inst in graph.region(body).insts.iter().rev() {
        let data = graph.inst(inst);
        // Stores and sends have no results: they are kept when chosen.
        let wanted = match data.op {
            Op::Store { .. } | Op::Send { .. } => keep_store.contains(&inst),
            _ => data
                .results
                .iter()
                .any(|r| needed.contains(r) && !is_fed(r)),
        };
        if wanted {
            kept.push(inst);
            needed.extend(data.args.iter().copied());
            for &r in &data.regions {
                needed.extend(graph.free_values(r));
            }
        }
    }
    kept.reverse();
    keep_arguments_binding_symbols(graph, &kept, fed, &mut needed);
    let mut f = graph.clone();
    f.set_name(name);
    f.region_mut(body).insts = kept;
    f.retain_region_args(body, |v| needed.contains(&v) && !is_fed(&v));
    let mut replace = HashMap::new();
    let mut stands_for: Vec<Value> = f.args().to_vec();
    for (v, feed) in fed {
        if needed.contains(v) && !graph.args().contains(v) {
            let arg = f.append_region_arg(body, graph.value_type(*v).clone(), feed.clone());
            replace.insert(*v, arg);
            stands_for.push(*v);
        }
    }
    f.replace_uses_map(&replace);
    let outputs: Vec<Value> = outputs
        .iter()
        .map(|v| *replace.get(v).unwrap_or(v))
        .collect();
    f.set_region_results(body, outputs.clone());
    f.set_result_types(outputs.iter().map(|&v| f.value_type(v).clone()).collect());
    (f, stands_for)
}

/// Marks as needed the arguments whose symbolic sizes the slice's types use when no needed
/// argument or fed value binds them: a gradient of a mean over `[N, 2]` reads no element of
/// the placeholder that fixes `N`, but it needs `N`.
fn keep_arguments_binding_symbols(
    graph: &Function,
    kept: &[Inst],
    fed: &[(Value, Option<String>)],
    needed: &mut HashSet<Value>,
) {
    let mut used: HashSet<Symbol> = HashSet::new();
    let mut stack: Vec<Inst> = kept.to_vec();
    while let Some(inst) = stack.pop() {
        let data = graph.inst(inst);
        for &r in &data.results {
            used.extend(graph.value_type(r).shape.symbols().cloned());
        }
        for &region in &data.regions {
            stack.extend(graph.region(region).insts.iter().copied());
        }
    }
    let is_fed = |v: &Value| fed.iter().any(|(f, _)| f == v);
    let mut bound: HashSet<Symbol> = (graph.args().iter())
        .filter(|v| needed.contains(v) && !is_fed(v))
        .chain(fed.iter().map(|(v, _)| v))
        .flat_map(|&v| {
            graph
                .value_type(v)
                .shape
                .symbols()
                .cloned()
                .collect::<Vec<_>>()
        })
        .collect();
    for &arg in graph.args() {
        let symbols: Vec<Symbol> = graph.value_type(arg).shape.symbols().cloned().collect();
        if !needed.contains(&arg)
            && symbols
                .iter()
                .any(|s| used.contains(s) && !bound.contains(s))
        {
            needed.insert(arg);
            bound.extend(symbols);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, FunctionBuilder, Initializer, Module, StateDecl, Type, verify_module};

    #[test]
    fn keeps_what_outputs_and_chosen_stores_need() {
        let w = StateDecl {
            name: "w".into(),
            ty: Type::scalar(DType::F32),
            init: Initializer::constant(0.0),
        };
        let mut module = Module::new();
        module.declare_state(w.clone()).unwrap();
        let mut b = FunctionBuilder::new("graph");
        let x = b.arg("x", Type::scalar(DType::F32));
        let y = b.arg("y", Type::scalar(DType::F32));
        let wv = b.load(&w).unwrap();
        let sx = b.mul(x, wv).unwrap();
        let sy = b.exp(y).unwrap();
        let store_x = b.store(&w, sx).unwrap();
        let _store_y = b.store(&w, sy).unwrap();
        let graph = b.finish(&[]).unwrap();

        let only_y = prune(&graph, "f", &[sy], &[]);
        assert_eq!(only_y.args().len(), 1);
        assert_eq!(only_y.num_insts(), 1);
        let update = prune(&graph, "g", &[], &[store_x]);
        let names: Vec<&str> = update
            .walk_insts()
            .iter()
            .map(|&i| update.inst(i).op.name())
            .collect();
        assert_eq!(names, ["load", "mul", "store"]);
        assert_eq!(update.value_name(update.args()[0]), Some("x"));
        module.add_function(only_y);
        module.add_function(update);
        verify_module(&module).unwrap();
    }
}
