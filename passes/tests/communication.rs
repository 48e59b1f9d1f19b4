//! No pass removes, merges, folds or reorders a communication op: every rank must enter the
//! same collectives and messages in the same order, whatever one rank's passes would make of
//! them. One test per pass, and one for each pipeline.

use kiln_ir::{Function, Module, parse_and_verify, verify_module};
use kiln_passes::PassManager;
use kiln_passes::manager::pass_by_name;

/// Tempts every pass: a duplicate all-reduce (cse), one of a constant (fold), one whose result
/// is unused (dce), operands worth simplifying (simplify) and fusing (fuse), layout chains
/// (canonicalize), a message pair, and stores between them.
const PROGRAM: &str = r#"
module {
  state @w : f32[4] = constant(value=1.0)

  func @step(%x: f32[4]) -> f32[4] {
    %w = load @w : f32[4]
    %one = const 1.0 : f32[4]
    %zero = const 0.0 : f32[4]
    %a = mul %x, %one : f32[4]
    %b = add %a, %zero : f32[4]
    %s1 = all_reduce_sum %b : f32[4]
    %s2 = all_reduce_sum %b : f32[4]
    %c = const 2.0 : f32[4]
    %folded = all_reduce_mean %c : f32[4]
    %unused = all_reduce_sum %x : f32[4]
    %r = reshape %s1 : f32[2,2]
    %r2 = reshape %r : f32[4]
    %t = add %r2, %s2 : f32[4]
    %u = mul %t, %folded : f32[4]
    send %u {peer=1, tag=3}
    store @w, %u
    %v = recv {peer=1, tag=3} : f32[4]
    %e = exp %v : f32[4]
    %bw, %bx = collective_broadcast %e, %w {root=0} : f32[4], f32[4]
    %rs = reduce_scatter_mean %bw {ranks=2} : f32[2]
    %unused_rs = reduce_scatter_sum %x {ranks=2} : f32[2]
    %sh = shard %bx {ranks=2} : f32[2]
    %sum2 = add %rs, %sh : f32[2]
    %gathered = all_gather %sum2 {ranks=2} : f32[4]
    %out = add %gathered, %bx : f32[4]
    return %out
  }
}
"#;

/// The side-effecting instructions in order, as text without value names: what every rank
/// must do alike.
fn effects(func: &Function) -> Vec<String> {
    func.walk_insts()
        .into_iter()
        .filter(|&i| func.inst(i).op.has_side_effects())
        .map(|i| {
            let data = func.inst(i);
            let types: Vec<String> = (data.args.iter())
                .map(|&a| func.value_type(a).to_string())
                .collect();
            format!(
                "{} {:?} ({})",
                data.op.name(),
                data.op.attributes(),
                types.join(", ")
            )
        })
        .collect()
}

fn module() -> Module {
    parse_and_verify(PROGRAM).unwrap_or_else(|e| panic!("{e}"))
}

fn check_after(passes: &[&str]) {
    let mut m = module();
    let before = effects(&m.functions[0]);
    assert_eq!(before.len(), 12, "{before:#?}");
    let mut manager = PassManager::new();
    for name in passes {
        manager = manager.with_pass(pass_by_name(name).unwrap());
    }
    manager.run(&mut m).unwrap();
    verify_module(&m).unwrap();
    let after = effects(&m.functions[0]);
    assert_eq!(before, after, "after {passes:?}:\n{}", m);
    let comms = (m.functions[0].walk_insts().into_iter())
        .filter(|&i| matches!(m.functions[0].inst(i).op, kiln_ir::communication_op!()))
        .count();
    assert_eq!(comms, 11);
}

macro_rules! keeps_communication {
    ($($test:ident: $passes:expr;)*) => {$(
        #[test]
        fn $test() {
            check_after(&$passes);
        }
    )*};
}

keeps_communication! {
    place_constants: ["place_constants"];
    canonicalize: ["canonicalize"];
    fold: ["fold"];
    cse: ["cse"];
    simplify: ["simplify"];
    channels_last: ["channels_last"];
    loops: ["loops"];
    fold_updates: ["fold_updates"];
    dce: ["dce"];
    fuse: ["fuse"];
    order_epilogues: ["order_epilogues"];
    default_pipeline: ["place_constants", "canonicalize", "fold", "cse", "simplify", "channels_last", "canonicalize", "fold", "cse", "loops", "fold_updates", "place_constants", "dce", "fuse", "order_epilogues"];
}

#[test]
fn the_tests_cover_every_pass() {
    let tested = [
        "place_constants",
        "canonicalize",
        "fold",
        "cse",
        "simplify",
        "channels_last",
        "loops",
        "fold_updates",
        "dce",
        "fuse",
        "order_epilogues",
    ];
    for (name, _) in kiln_passes::manager::PASSES {
        assert!(
            tested.contains(name),
            "pass `{name}` has no communication test"
        );
    }
}
