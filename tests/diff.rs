//! `kiln diff` names the planted fault: a wrong rewrite rule (the pass it ran in) and a wrong
//! kernel (the compiled code), each at the instruction it broke.

use kiln::backend::StateStore;
// Planted faults exist in debug builds only.
#[cfg(debug_assertions)]
use kiln::backend::exec::fault;
use kiln::diff::{Stage, Tolerance, diff};
use kiln::ir::{Module, parse_and_verify};
use kiln::passes::PassManager;
use kiln::passes::manager::{PIPELINES, pass_by_name};
use kiln::passes::simplify::{Simplify, rules};

const PROGRAM: &str = "module {
  func @f(%x: f32[4,8]) -> f32[4,8] {
    %a = mul %x, %x : f32[4,8]
    %t = tanh %a : f32[4,8]
    %s = sub %t, %x : f32[4,8]
    %y = mul %s, %s : f32[4,8]
    return %y
  }
}
";

fn program() -> Module {
    parse_and_verify(PROGRAM).expect("the test program")
}

fn input() -> kiln::backend::Array {
    let values = (0..32).map(|i| (i as f32 - 15.5) / 8.0).collect();
    kiln::backend::Array::F32(ndarray::ArrayD::from_shape_vec(vec![4, 8], values).unwrap())
}

/// The default pipeline with `simplify` running `extra` rules besides its own.
fn pipeline_with(
    extra: Vec<
        egg::Rewrite<kiln::passes::simplify::lang::Node, kiln::passes::simplify::lang::Typing>,
    >,
) -> PassManager {
    let (_, names) = PIPELINES.iter().find(|(n, _)| *n == "default").unwrap();
    let mut extra = Some(extra);
    names
        .iter()
        .fold(PassManager::new(), |pm, &name| match name {
            // The pipeline's first simplify gets the extra rules.
            "simplify" if extra.is_some() => {
                let mut all = rules::all();
                all.extend(extra.take().unwrap());
                pm.with_pass(Box::new(Simplify::with_rules(all)))
            }
            _ => pm.with_pass(pass_by_name(name).unwrap()),
        })
}

/// `kiln diff` of `module`'s `@f` on `args` through `pipeline`, at the default tolerance.
fn compare(
    module: &Module,
    args: &[kiln::backend::Array],
    pipeline: &mut PassManager,
) -> Result<kiln::diff::Report, kiln::diff::DiffError> {
    diff(
        module,
        "f",
        args,
        &StateStore::new(),
        pipeline,
        Tolerance::default(),
    )
}

#[test]
fn the_runs_agree_without_a_fault() {
    let mut pipeline = PassManager::pipeline("default").unwrap();
    let report = compare(&program(), &[input()], &mut pipeline).unwrap();
    assert!(report.agrees(), "{}", kiln::diff::render(&report, true));
    assert!(report.differences.is_empty());
    assert_eq!(report.compared, 4);
    assert_eq!(report.stage, None);
}

#[test]
fn a_planted_wrong_rewrite_rule_is_named_with_its_pass_and_instruction() {
    // tanh(x) = x: wrong, and cheaper, so extraction takes it.
    let wrong = egg::rewrite!("wrong-tanh"; "(tanh ?x)" => "?x");
    let mut pipeline = pipeline_with(vec![wrong]);
    let report = compare(&program(), &[input()], &mut pipeline).unwrap();
    let text = kiln::diff::render(&report, false);
    assert!(!report.agrees(), "{text}");
    let first = report.first_wrong().unwrap();
    assert_eq!(first.value, "%t", "{text}");
    assert_eq!(first.inst, "%t = tanh %a : f32[4,8]");
    assert_eq!(first.loc.to_string(), "line 4, column 10");
    assert_eq!(
        report.stage,
        Some(Stage::Pass {
            index: 4,
            name: "simplify".into()
        }),
        "{text}"
    );
    // Downstream values differ too, but only because %t does: each, redone on the operands
    // the pipeline's program computed, gives that program's value.
    let y = report
        .differences
        .iter()
        .find(|d| d.value == "%y")
        .expect("%y differs");
    assert!(y.amplified, "{text}");
    let wrong: Vec<&str> = (report.differences.iter())
        .filter(|d| !d.amplified)
        .map(|d| d.value.as_str())
        .collect();
    assert_eq!(wrong, ["%t"], "{text}");
    assert!(
        text.contains("first wrong after: pass `simplify` (pass 5 of the pipeline)"),
        "{text}"
    );
}

#[test]
#[cfg(debug_assertions)]
fn a_planted_wrong_kernel_is_named_with_its_instruction_and_kernel() {
    fault::plant(Some("tanh"));
    let mut pipeline = PassManager::pipeline("default").unwrap();
    let report = compare(&program(), &[input()], &mut pipeline);
    fault::plant(None);
    let report = report.unwrap();
    let text = kiln::diff::render(&report, false);
    let first = report.first_wrong().expect("a wrong value");
    assert_eq!(first.value, "%t", "{text}");
    let (index, interpreted, compiled) = first.worst.clone().unwrap();
    assert_eq!(index, [0, 0]);
    assert!((compiled - interpreted - 1.0).abs() < 1e-5, "{text}");
    assert!(
        first
            .kernel
            .as_deref()
            .unwrap()
            .starts_with("fused kernel 1 of @f"),
        "{text}"
    );
    assert_eq!(report.stage, Some(Stage::Kernels), "{text}");
    let wrong = report.differences.iter().filter(|d| !d.amplified).count();
    assert_eq!(wrong, 1, "{text}");
}

#[test]
fn the_first_non_finite_value_of_each_run_is_named() {
    let module = parse_and_verify(
        "module {
  func @f(%x: f32[4]) -> f32[4] {
    %a = abs %x : f32[4]
    %l = log %x : f32[4]
    %y = add %l, %a : f32[4]
    return %y
  }
}
",
    )
    .unwrap();
    let x = kiln::backend::Array::F32(ndarray::arr1(&[1.0f32, -1.0, 2.0, 0.0]).into_dyn());
    let mut pipeline = PassManager::pipeline("default").unwrap();
    let report = compare(&module, &[x], &mut pipeline).unwrap();
    let text = kiln::diff::render(&report, false);
    assert!(report.agrees(), "{text}");
    let runs: Vec<(&str, &str, String)> = (report.non_finite.iter())
        .map(|(run, value, loc)| (*run, value.as_str(), loc.to_string()))
        .collect();
    let at = "line 4, column 10".to_owned();
    assert_eq!(
        runs,
        [("interpreted", "%l", at.clone()), ("compiled", "%l", at)],
        "{text}"
    );
    assert!(text.contains("non-finite: the first value of the compiled run holding NaN or infinity: %l at line 4, column 10"), "{text}");
}

/// A product reading a transpose through a view is a plan only the program as run has: with
/// the transpose observed it is a result, and the product reads its buffer.
#[test]
#[cfg(debug_assertions)]
fn a_fault_only_the_program_as_run_has_is_reported_with_its_results() {
    let module = parse_and_verify(
        "module {
  func @f(%x: f32[1,6,4], %w: f32[4,3]) -> f32[6,1,3] {
    %t = transpose %x {perm=[1, 0, 2]} : f32[6,1,4]
    %y = matmul %t, %w : f32[6,1,3]
    return %y
  }
}
",
    )
    .unwrap();
    let array = |shape: Vec<usize>| {
        let n = shape.iter().product::<usize>();
        let values = (0..n).map(|i| (i as f32 - 5.0) / 7.0).collect();
        kiln::backend::Array::F32(ndarray::ArrayD::from_shape_vec(shape, values).unwrap())
    };
    let args = [array(vec![1, 6, 4]), array(vec![4, 3])];
    let mut pipeline = PassManager::pipeline("default").unwrap();
    assert!(compare(&module, &args, &mut pipeline).unwrap().agrees());

    fault::plant_in_views(true);
    let report = compare(&module, &args, &mut pipeline);
    fault::plant_in_views(false);
    let report = report.unwrap();
    let text = kiln::diff::render(&report, false);
    assert!(!report.agrees(), "{text}");
    assert!(
        report.first_wrong().is_none(),
        "observed, every value agrees: {text}"
    );
    let wrong = report.first_wrong_as_run().expect("a wrong result as run");
    assert_eq!(wrong.value, "%y", "{text}");
    assert_eq!(wrong.inst, "%y = matmul %t, %w : f32[6,1,3]");
    assert_eq!(report.stage, Some(Stage::Plan), "{text}");
    assert!(
        text.starts_with("differ: @f: 1 of its results and states are wrong as the program runs"),
        "{text}"
    );
    assert!(
        text.contains("first wrong after: the compiled plan of the program as run"),
        "{text}"
    );
}
