//! Compiled control flow and native gathers, scatters, one-hots and random draws: programs
//! that use them run with nothing left to the interpreter, and agree with it.

use kiln::backend::exec::Executable;
use kiln::backend::{Array, Interpreter, StateStore};
use kiln::ir::{Module, parse_module};
use kiln::passes::PassManager;
use ndarray::{ArrayD, IxDyn};
use std::sync::Arc;

/// A recurrent cell in a `while` loop: step `t` reads row `t` of the inputs (a gather) and
/// the weights (free values of the body), `h ← tanh(x_t·W + h·U + b)`; then a `cond` on the
/// result's sum, and a one-hot, a scatter-add and a random draw beside it.
const PROGRAM: &str = r#"
module {
  func @rnn(%xs: f32[8,N,16], %w: f32[16,32], %u: f32[32,32], %b: f32[32], %labels: i64[N]) -> (f32[N,32], f32[N,32], f32[N,4], f32[8,16], f32[N,32]) {
    %zero = const 0 : i32[]
    %h0 = const 0.0 : f32[N,32]
    %t_end, %h = while %zero, %h0 : i32[], f32[N,32] cond(%tc: i32[], %hc: f32[N,32]) {
      %steps = const 8 : i32[]
      %more = lt %tc, %steps : bool[]
      yield %more
    } body(%t: i32[], %hb: f32[N,32]) {
      %x = gather %xs, %t {axis=0} : f32[N,16]
      %xw = matmul %x, %w : f32[N,32]
      %hu = matmul %hb, %u : f32[N,32]
      %s = add %xw, %hu : f32[N,32]
      %bb = broadcast %b : f32[N,32]
      %z = add %s, %bb : f32[N,32]
      %h_next = tanh %z : f32[N,32]
      %one = const 1 : i32[]
      %t_next = add %t, %one : i32[]
      yield %t_next, %h_next
    }
    %total = reduce_sum %h {axes=[0, 1], keep_dims=false} : f32[]
    %origin = const 0.0 : f32[]
    %positive = gt %total, %origin : bool[]
    %picked = cond %positive : f32[N,32] then {
      %e = exp %h : f32[N,32]
      yield %e
    } else {
      %n = neg %h : f32[N,32]
      yield %n
    }
    %hot = one_hot %labels : f32[N,4]
    %first = gather %xs, %labels {axis=1} : f32[8,N,16]
    %row = reduce_sum %first {axes=[1], keep_dims=false} : f32[8,16]
    %spread = scatter_add %h, %labels {axis=0} : f32[N,32]
    %noise = random_normal {mean=0.0, std=1.0, seed=7} : f32[N,32]
    %noisy = add %spread, %noise : f32[N,32]
    return %h, %picked, %hot, %row, %noisy
  }
}
"#;

fn f32_array(shape: &[usize], seed: u64) -> Array {
    let n: usize = shape.iter().product();
    let values = (0..n)
        .map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 1000.0 - 0.5) * 0.8)
        .collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

fn inputs(n: usize) -> Vec<Array> {
    let labels = (0..n as i64).map(|i| (i * 3) % 4).collect();
    vec![
        f32_array(&[8, n, 16], 1),
        f32_array(&[16, 32], 2),
        f32_array(&[32, 32], 3),
        f32_array(&[32], 4),
        Array::I64(ArrayD::from_shape_vec(IxDyn(&[n]), labels).unwrap()),
    ]
}

fn optimised(text: &str) -> Module {
    let mut module = parse_module(text).unwrap();
    PassManager::pipeline("default")
        .unwrap()
        .run(&mut module)
        .unwrap();
    module
}

fn assert_agree(compiled: &[Arc<Array>], interpreted: &[Arc<Array>]) {
    assert_eq!(compiled.len(), interpreted.len());
    for (k, (c, i)) in compiled.iter().zip(interpreted).enumerate() {
        assert_eq!(c.shape(), i.shape(), "result {k}");
        for (x, y) in c.to_f64_vec().iter().zip(i.to_f64_vec()) {
            assert!(
                (x - y).abs() <= 1e-5 + 1e-5 * y.abs(),
                "result {k}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn loops_branches_gathers_and_draws_run_compiled_and_agree() {
    let module = optimised(PROGRAM);
    let func = module.function("rnn").unwrap();
    let executable = Executable::new(func);
    for n in [5, 64] {
        let args = inputs(n);
        let interp = Interpreter::new(&module).with_rng_counter(3);
        let shared: Vec<Arc<Array>> = args.into_iter().map(Arc::new).collect();
        let want = interp
            .run_shared(func, shared.clone(), &mut StateStore::default())
            .unwrap();
        let got = executable
            .run(shared, &mut StateStore::default(), &interp, false)
            .unwrap();
        assert_agree(&got, &want);
    }
    let stats = executable.stats();
    assert_eq!(stats.interpreted, 0, "something fell back: {stats:?}");
    assert!(stats.kernels > 0, "{stats:?}");
}

/// A region that reads state stays with the interpreter (a top-level kernel may update a
/// state's buffer in place before the loop reads it), and still agrees.
#[test]
fn a_loop_that_reads_state_falls_back_and_agrees() {
    let text = r#"
module {
  state @step : f32[] = constant(value=0.5)
  func @count(%n: i32[], %x: f32[]) -> f32[] {
    %zero = const 0 : i32[]
    %end, %total = while %zero, %x : i32[], f32[] cond(%i: i32[], %t: f32[]) {
      %more = lt %i, %n : bool[]
      yield %more
    } body(%j: i32[], %u: f32[]) {
      %s = load @step : f32[]
      %u_next = add %u, %s : f32[]
      %k = const 1 : i32[]
      %next = add %j, %k : i32[]
      yield %next, %u_next
    }
    return %total
  }
}
"#;
    let module = optimised(text);
    let func = module.function("count").unwrap();
    let executable = Executable::new(func);
    let args = vec![
        Arc::new(Array::I32(ArrayD::from_elem(IxDyn(&[]), 4))),
        Arc::new(Array::F32(ArrayD::from_elem(IxDyn(&[]), 1.0))),
    ];
    let interp = Interpreter::new(&module);
    let mut s1 = StateStore::initialize(&module).unwrap();
    let mut s2 = s1.clone();
    let want = interp.run_shared(func, args.clone(), &mut s1).unwrap();
    let got = executable.run(args, &mut s2, &interp, false).unwrap();
    assert_agree(&got, &want);
    assert_eq!(got[0].to_f64_vec(), [3.0]);
    assert!(executable.stats().interpreted > 0);
}

/// Products large enough to split across threads (by runs of columns, or gemm's own split for
/// a transposed left operand), with widths that are no multiple of the runs, agree with the
/// interpreter.
#[test]
fn large_products_split_across_threads_agree() {
    let text = r#"
module {
  func @products(%a: f32[300,260], %b: f32[260,250], %bt: f32[250,260], %at: f32[260,300]) -> (f32[300,250], f32[300,250], f32[300,250]) {
    %plain = matmul %a, %b : f32[300,250]
    %right = matmul %a, %bt {transpose_b=true} : f32[300,250]
    %left = matmul %at, %b {transpose_a=true} : f32[300,250]
    return %plain, %right, %left
  }
}
"#;
    let module = parse_module(text).unwrap();
    let func = module.function("products").unwrap();
    let args: Vec<Arc<Array>> = [[300, 260], [260, 250], [250, 260], [260, 300]]
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(f32_array(s, i as u64)))
        .collect();
    let interp = Interpreter::new(&module);
    let want = interp
        .run_shared(func, args.clone(), &mut StateStore::default())
        .unwrap();
    let got = Executable::new(func)
        .run(args, &mut StateStore::default(), &interp, false)
        .unwrap();
    assert_agree(&got, &want);
}

/// A loop that keeps its states in a stack (what the gradient of a counted loop builds):
/// compiled, each trip writes its slice in place.
#[test]
fn a_stack_filled_by_a_loop_is_updated_in_place() {
    let text = r#"
module {
  func @states(%x: f32[4,8]) -> f32[6,4,8] {
    %zero = const 0 : i64[]
    %empty = const 0.0 : f32[6,4,8]
    %first = update_slice %empty, %x, %zero {axis=0} : f32[6,4,8]
    %t_end, %h, %stack = while %zero, %x, %first : i64[], f32[4,8], f32[6,4,8] cond(%tc: i64[], %hc: f32[4,8], %sc: f32[6,4,8]) {
      %five = const 5 : i64[]
      %more = lt %tc, %five : bool[]
      yield %more
    } body(%t: i64[], %hb: f32[4,8], %sb: f32[6,4,8]) {
      %h_next = tanh %hb : f32[4,8]
      %one = const 1 : i64[]
      %t_next = add %t, %one : i64[]
      %s_next = update_slice %sb, %h_next, %t_next {axis=0} : f32[6,4,8]
      yield %t_next, %h_next, %s_next
    }
    return %stack
  }
}
"#;
    let module = optimised(text);
    let func = module.function("states").unwrap();
    let args = vec![Arc::new(f32_array(&[4, 8], 9))];
    let interp = Interpreter::new(&module);
    let want = interp
        .run_shared(func, args.clone(), &mut StateStore::default())
        .unwrap();
    let executable = Executable::new(func);
    let got = executable
        .run(args, &mut StateStore::default(), &interp, false)
        .unwrap();
    assert_agree(&got, &want);
    let stats = executable.stats();
    assert_eq!(stats.interpreted, 0, "{stats:?}");
    // Every trip's slice goes into the carried stack's own buffer.
    assert!(stats.in_place >= 5, "{stats:?}");
}
