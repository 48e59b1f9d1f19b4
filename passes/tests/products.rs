//! The product passes: `fold_updates` turns an SGD update of a product's gradient into
//! `matmul_acc` (IR text in, IR text out), leaves every other form, and the interpreter gives
//! the same results, bit for bit, before and after.

mod common;

use common::ramp;
use kiln_backend::{Interpreter, StateStore};
use kiln_ir::{Module, parse_and_verify};
use kiln_passes::PassManager;

const SGD: &str = "module {
  state @w : f32[4,3] = uniform(low=-1.0, high=1.0, seed=3)
  func @f(%x: f32[8,4], %g: f32[8,3]) -> f32[4,3] {
    %w = load @w : f32[4,3]
    %d = matmul %x, %g {transpose_a=true} : f32[4,3]
    %c = const 0.1 : f32[4,3]
    %m = mul %d, %c : f32[4,3]
    %n = sub %w, %m : f32[4,3]
    store @w, %n
    return %n
  }
}";

fn after(input: &str) -> Module {
    common::optimised(input, &["fold_updates", "dce"])
}

/// `@f` of `before` and of `after` on the same inputs: equal results and equal state, bit
/// for bit (the accumulated form rounds as the update it replaces).
fn same_results(before: &str, after: &Module) {
    let before = parse_and_verify(before).unwrap();
    let inputs = vec![ramp(&[8, 4], 0.3), ramp(&[8, 3], 0.7)];
    let run = |m: &Module| {
        let mut state = StateStore::initialize(m).unwrap();
        let out = Interpreter::new(m)
            .run("f", inputs.clone(), &mut state)
            .unwrap();
        (out, state.get("w").cloned())
    };
    assert_eq!(run(&before), run(after));
}

#[test]
fn an_sgd_update_of_a_products_gradient_accumulates_onto_the_weights() {
    let module = after(SGD);
    let text = module.to_string();
    assert!(
        // The f32 constant's value, exactly.
        text.contains(
            "%n = matmul_acc %x, %g, %w {transpose_a=true, scale=-0.10000000149011612} : f32[4,3]"
        ),
        "{text}"
    );
    assert!(
        !text.contains("%d = matmul"),
        "the gradient is not written: {text}"
    );
    same_results(SGD, &module);
    let added = SGD.replace("%n = sub %w, %m", "%n = add %m, %w");
    let text = after(&added).to_string();
    assert!(text.contains("scale=0.10000000149011612}"), "{text}");
    same_results(&added, &after(&added));
}

#[test]
fn other_forms_stay_as_they_were() {
    let cases = [
        // The gradient is returned too, so it must be written.
        SGD.replace("-> f32[4,3] {", "-> (f32[4,3], f32[4,3]) {")
            .replace("return %n", "return %n, %d"),
        // Not a constant's multiple.
        SGD.replace("%m = mul %d, %c", "%m = mul %d, %d"),
        // Not `w ± c·g`.
        SGD.replace("%n = sub %w, %m", "%n = sub %m, %w"),
        // The product reads the buffer it would accumulate onto.
        SGD.replace(
            "%d = matmul %x, %g {transpose_a=true} : f32[4,3]",
            "%d = matmul %w, %e : f32[4,3]",
        )
        .replace(
            "%w = load @w : f32[4,3]",
            "%w = load @w : f32[4,3]\n    %e = const 1.0 : f32[3,3]",
        ),
        // A rate of inf, NaN or 0: gemm scales each term, so 0·inf terms would give NaN where
        // `w − inf·g` gives ±inf (a fuzzer finding), and a zero scale may skip the product.
        SGD.replace("const 0.1", "const inf"),
        SGD.replace("const 0.1", "const -inf"),
        SGD.replace("const 0.1", "const nan"),
        SGD.replace("const 0.1", "const 0.0"),
    ];
    for case in cases {
        let text = after(&case).to_string();
        assert!(!text.contains("matmul_acc"), "{case}\n→\n{text}");
    }
}

#[test]
fn the_pass_explains_what_it_folded() {
    let mut module = parse_and_verify(SGD).unwrap();
    let mut pm = PassManager::from_names(&["fold_updates"])
        .unwrap()
        .explain(true);
    let reports = pm.run(&mut module).unwrap();
    assert_eq!(reports[0].stats.get("updates folded"), Some("1"));
    let explained = reports[0].explanations.join("\n");
    assert!(
        explained.contains("`%n = sub %w, %m : f32[4,3]` becomes `%n = matmul_acc"),
        "{explained}"
    );
}
