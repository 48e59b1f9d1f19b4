//! The `loops` pass: what it moves out of `while` bodies (IR text in, IR text out), what it
//! leaves, and that the interpreter gives the same results before and after.

mod common;

use common::ramp;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{Module, parse_and_verify};
use ndarray::{ArrayD, IxDyn};

fn after_loops(input: &str) -> Module {
    common::optimised(input, &["loops", "dce"])
}

/// Runs `@f` of `before` and of the module the pass made on the same inputs: the results
/// agree (to rounding: a batched product may sum in another order).
fn same_results(before: &str, after: &Module, inputs: Vec<Array>) {
    let before = parse_and_verify(before).unwrap();
    let run = |m: &Module| {
        let mut state = StateStore::initialize(m).unwrap();
        Interpreter::new(m)
            .run("f", inputs.clone(), &mut state)
            .unwrap()
    };
    for (x, y) in run(&before).iter().zip(run(after)) {
        let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
        assert_eq!(x.len(), y.len());
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
        }
    }
}

const RNN: &str = r#"module {
  func @f(%xs: f32[4,2,3], %w: f32[3,3], %u: f32[3,3], %b: f32[3], %n: i32[]) -> (f32[2,3], i32[]) {
    %zero = const 0 : i32[]
    %h0 = const 0.0 : f32[2,3]
    %i_end, %h = while %zero, %h0 : i32[], f32[2,3] cond(%i: i32[], %s: f32[2,3]) {
      %four = const 4 : i32[]
      %more = lt %i, %four : bool[]
      yield %more
    } body(%j: i32[], %x: f32[2,3]) {
      %row = gather %xs, %j {axis=0} : f32[2,3]
      %xw = matmul %row, %w : f32[2,3]
      %hu = matmul %x, %u {transpose_b=true} : f32[2,3]
      %b2 = add %b, %b : f32[3]
      %bb = broadcast %b2 : f32[2,3]
      %q = div %n, %n : i32[]
      %qf = cast %q : f32[]
      %qb = broadcast %qf : f32[2,3]
      %s1 = add %xw, %hu : f32[2,3]
      %s2 = add %s1, %qb : f32[2,3]
      %s3 = add %s2, %bb : f32[2,3]
      %next = tanh %s3 : f32[2,3]
      %one = const 1 : i32[]
      %k = add %j, %one : i32[]
      yield %k, %next
    }
    return %h, %i_end
  }
}"#;

/// A recurrent cell: the bias sum and its broadcast move before the loop, the transposed
/// state weight gets a transposed copy made there, and the input projection becomes one
/// product of the whole sequence. The integer division stays (it could fail), and so do
/// the float ops that read it and the constants.
#[test]
fn a_recurrent_cell_is_optimised() {
    let after = after_loops(RNN);
    let text = after.to_string();
    let body = text.split("body(").nth(1).unwrap();
    let prelude = text.split("= while").next().unwrap();
    assert!(prelude.contains("add %b, %b : f32[3]"), "{text}");
    assert!(
        prelude.contains("transpose %u {perm=[1, 0]} : f32[3,3]"),
        "{text}"
    );
    assert!(prelude.contains("reshape %xs : f32[8,3]"), "{text}");
    assert!(
        prelude.contains(": f32[8,3]\n") && prelude.contains("f32[4,2,3]"),
        "{text}"
    );
    assert_eq!(body.matches("matmul").count(), 1, "{text}");
    assert!(!body.contains("transpose_b"), "{text}");
    assert!(
        body.contains("div %n, %n") && body.contains("cast %q"),
        "{text}"
    );
    assert!(body.contains("const 1 : i32[]"), "{text}");
    let n = Array::I32(ArrayD::from_elem(IxDyn(&[]), 1));
    let inputs = vec![
        ramp(&[4, 2, 3], 0.1),
        ramp(&[3, 3], 0.2),
        ramp(&[3, 3], -0.15),
        ramp(&[3], 0.05),
        n,
    ];
    same_results(RNN, &after, inputs);
}

/// No batched projection where it could compute rows for nothing: a loop whose trip count
/// is not a constant, or a sequence with more than twice the rows the loop reads.
#[test]
fn projections_stay_per_trip_when_rows_would_be_wasted() {
    for (bound, rows) in [("%n", 4), ("%four", 10)] {
        let program = RNN
            .replace(
                "%four = const 4 : i32[]",
                "%four = const 4 : i32[]\n      %nn = add %n, %four : i32[]",
            )
            .replace(
                "%more = lt %i, %four",
                &format!(
                    "%more = lt %i, {}",
                    if bound == "%n" { "%nn" } else { "%four" }
                ),
            )
            .replace("%xs: f32[4,2,3]", &format!("%xs: f32[{rows},2,3]"));
        let after = after_loops(&program);
        let text = after.to_string();
        let body = text.split("body(").nth(1).unwrap();
        assert!(body.contains("matmul %row, %w"), "{text}");
        assert!(!text.contains("reshape %xs"), "{text}");
        let n = Array::I32(ArrayD::from_elem(IxDyn(&[]), -1));
        let inputs = vec![
            ramp(&[rows, 2, 3], 0.1),
            ramp(&[3, 3], 0.2),
            ramp(&[3, 3], -0.15),
            ramp(&[3], 0.05),
            n,
        ];
        same_results(&program, &after, inputs);
    }
}
