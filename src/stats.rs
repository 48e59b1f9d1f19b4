//! `kiln stats`: what a program holds — op counts, parameters and their sizes, fused kernels
//! and an estimate of the memory traffic of one call — as written and after the default pass
//! pipeline, side by side.

use kiln_ir::{Dim, Function, Module, Op, SymbolBindings, Type};
use kiln_passes::{PassError, PassManager};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One function's figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionStats {
    /// Instructions, those inside regions included.
    pub instructions: usize,
    /// Instructions by op name, regions included.
    pub ops: BTreeMap<&'static str, usize>,
    /// Per `fused` region: (inputs, outputs, instructions in its body).
    pub kernels: Vec<(usize, usize, usize)>,
    /// Bytes read and written by the top-level instructions in one call: every operand read
    /// once and every result written once (a fused kernel's body moves nothing to memory).
    /// Loads, stores, constants and reshapes count nothing.
    /// Saturating: a huge `--bind` gives a huge figure, never a wrapped one.
    pub traffic_bytes: u128,
}

/// The size in bytes of a value of `ty`, with symbolic sizes taken from `bindings` (1 when
/// unbound).
fn bytes(ty: &Type, bindings: &SymbolBindings) -> u128 {
    elements(ty, bindings).saturating_mul(ty.dtype.size_bytes() as u128)
}

fn elements(ty: &Type, bindings: &SymbolBindings) -> u128 {
    (ty.shape.dims().iter())
        .map(|d| match d {
            Dim::Fixed(n) => *n as u128,
            Dim::Sym(s) => bindings.get(s).map_or(1, |&n| n as u128),
        })
        .fold(1, u128::saturating_mul)
}

fn saturating_sum(values: impl Iterator<Item = u128>) -> u128 {
    values.fold(0, u128::saturating_add)
}

/// The statistics of `func` with its symbols bound by `bindings`.
pub fn function_stats(func: &Function, bindings: &SymbolBindings) -> FunctionStats {
    let mut stats = FunctionStats::default();
    for inst in func.walk_insts() {
        stats.instructions += 1;
        *stats.ops.entry(func.inst(inst).op.name()).or_default() += 1;
    }
    for &inst in &func.region(func.body()).insts {
        let data = func.inst(inst);
        if data.op == Op::Fused {
            let body: usize = (data.regions.iter())
                .map(|&r| func.region(r).insts.len())
                .sum();
            stats
                .kernels
                .push((data.args.len(), data.results.len(), body));
        }
        let moves = !matches!(
            data.op,
            Op::Load { .. } | Op::Store { .. } | Op::Const { .. } | Op::Reshape { .. }
        );
        if moves {
            let values = data.args.iter().chain(&data.results);
            let moved = saturating_sum(values.map(|&v| bytes(func.value_type(v), bindings)));
            stats.traffic_bytes = stats.traffic_bytes.saturating_add(moved);
        }
    }
    stats
}

fn human(bytes: u128) -> String {
    match bytes {
        u128::MAX => "more than 2^128 B".to_owned(),
        b if b >= 1 << 40 => format!("{:.1} TiB", b as f64 / (1u64 << 40) as f64),
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// The report `kiln stats` prints.
pub fn report(module: &Module, bindings: &SymbolBindings) -> Result<String, PassError> {
    let mut optimized = module.clone();
    PassManager::pipeline("default")?.run(&mut optimized)?;
    let mut out = String::new();
    let total = saturating_sum(module.states.iter().map(|s| elements(&s.ty, bindings)));
    let total_bytes = saturating_sum(module.states.iter().map(|s| bytes(&s.ty, bindings)));
    let _ = writeln!(
        out,
        "state: {} values, {total} elements, {}",
        module.states.len(),
        human(total_bytes)
    );
    for s in &module.states {
        let _ = writeln!(
            out,
            "  @{:<28} {:<16} {:>10}",
            s.name,
            s.ty.to_string(),
            human(bytes(&s.ty, bindings))
        );
    }
    for (func, opt) in module.functions.iter().zip(&optimized.functions) {
        let (a, b) = (
            function_stats(func, bindings),
            function_stats(opt, bindings),
        );
        let args: Vec<String> = (func.args().iter())
            .map(|&v| func.value_type(v).to_string())
            .collect();
        let _ = writeln!(out, "\n@{}({})", func.name(), args.join(", "));
        let _ = writeln!(out, "  {:<28} {:>12} {:>12}", "", "as written", "optimised");
        let row = |out: &mut String, label: &str, x: String, y: String| {
            let _ = writeln!(out, "  {label:<28} {x:>12} {y:>12}");
        };
        row(
            &mut out,
            "instructions",
            a.instructions.to_string(),
            b.instructions.to_string(),
        );
        row(
            &mut out,
            "fused kernels",
            a.kernels.len().to_string(),
            b.kernels.len().to_string(),
        );
        row(
            &mut out,
            "memory traffic (estimated)",
            human(a.traffic_bytes),
            human(b.traffic_bytes),
        );
        let _ = writeln!(out, "  ops");
        let names: std::collections::BTreeSet<&str> =
            a.ops.keys().chain(b.ops.keys()).copied().collect();
        for name in names {
            let count = |s: &FunctionStats| s.ops.get(name).copied().unwrap_or(0).to_string();
            row(&mut out, &format!("  {name}"), count(&a), count(&b));
        }
        if !b.kernels.is_empty() {
            let _ = writeln!(
                out,
                "  kernels after the pipeline (inputs → outputs, body ops)"
            );
            for (i, (ins, outs, body)) in b.kernels.iter().enumerate() {
                let _ = writeln!(out, "    #{:<3} {ins:>2} → {outs:<2} {body:>4} ops", i + 1);
            }
        }
    }
    let unbound: Vec<String> = (module.functions.iter())
        .flat_map(|f| f.args().iter().map(|&v| f.value_type(v).clone()))
        .flat_map(|t| t.shape.symbols().cloned().collect::<Vec<_>>())
        .filter(|s| !bindings.contains_key(s))
        .map(|s| s.as_str().to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !unbound.is_empty() {
        let _ = writeln!(
            out,
            "\nsymbolic sizes counted as 1: {} (set them with --bind {}=256)",
            unbound.join(", "),
            unbound[0]
        );
    }
    Ok(out)
}
