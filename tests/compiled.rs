//! Differential testing of the compiled executor: 2,000 seeded random programs (every op of
//! the IR, every dtype, symbolic and size-0 dimensions, regions, state, custom calls), each
//! run three ways — the interpreter, the interpreter after the default pass pipeline, and the
//! compiled executor after the pipeline — on the same arguments and state. The compiled run
//! must fail exactly when the interpreted optimised run fails, and otherwise agree with it:
//! exactly for integers and bools, within float rounding (and the JIT's f32 approximations)
//! otherwise.

mod common;

use common::random_programs::{Gen, random_module};
use kiln::backend::exec::Executable;
use kiln::backend::{Array, CustomOpError, CustomOps, Interpreter, StateStore};
use kiln::ir::{DType, Module};
use kiln::passes::manager::PassManager;
use kiln::runtime::compare::flushed_subnormal;
use std::sync::Arc;

struct Identity;

impl CustomOps for Identity {
    fn call(&self, _: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        Ok(vec![args[0].clone()])
    }
}

fn arguments(module: &Module, name: &str, g: &mut Gen) -> Vec<Array> {
    let func = module.function(name).unwrap();
    let (n, m) = (g.below(4), g.below(4));
    func.arg_types()
        .map(|t| {
            let dims: Vec<usize> = (t.shape.dims().iter())
                .map(|d| {
                    d.as_fixed()
                        .unwrap_or(if d.to_string() == "N" { n } else { m })
                })
                .collect();
            let count: usize = dims.iter().product();
            let values: Vec<f64> = (0..count)
                .map(|_| match t.dtype {
                    DType::F32 | DType::F64 => g.below(8001) as f64 / 1000.0 - 4.0,
                    _ => g.below(9) as f64 - 4.0,
                })
                .collect();
            Array::F64(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&dims), values).unwrap())
                .cast(t.dtype)
        })
        .collect()
}

fn close(x: f64, y: f64, tol: f64) -> bool {
    (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()))
}

/// Equal types and elements within `tol` (relative) for f32, within 1e-9 for f64 (f64 is
/// not held to f32's tolerance) unless both elements are f32 values (an f32 result cast to
/// f64: computed in f32, held to f32's), exactly for integers and bools; an interpreted
/// subnormal matches a compiled zero (compiled runs flush them: `flushed_subnormal`).
fn agree(a: &Array, b: &Array, tol: f64) -> bool {
    let is_f32 = |x: f64| x as f32 as f64 == x;
    let tol_of = |x: f64, y: f64| match a.dtype() {
        DType::F32 => tol,
        DType::F64 if is_f32(x) && is_f32(y) => tol,
        DType::F64 => tol.min(1e-9),
        _ => 0.0,
    };
    a.ty() == b.ty()
        && a.to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .all(|(x, y)| close(*x, y, tol_of(*x, y)) || flushed_subnormal(a.dtype(), *x, y))
}

/// What the runs of one program exercised.
#[derive(Default)]
struct Tally {
    kernel_steps: u64,
    /// Functions whose runs succeeded and were compared.
    compared: u64,
    /// Functions whose runs both failed (as they must together).
    failed: u64,
}

/// Runs program `seed` three ways; returns an error describing any disagreement.
fn check_program(seed: u64) -> Result<Tally, String> {
    let size = 1 + (seed % 24) as usize;
    check_module(&random_module(seed, size), seed)
}

fn check_module(module: &Module, seed: u64) -> Result<Tally, String> {
    check_module_in("default", module, seed)
}

/// [`check_module`] through the pass pipeline `pipeline`.
fn check_module_in(pipeline: &str, module: &Module, seed: u64) -> Result<Tally, String> {
    let module = module.clone();
    let mut tally = Tally::default();
    let mut optimised = module.clone();
    PassManager::pipeline(pipeline)
        .unwrap()
        .run(&mut optimised)
        .map_err(|e| format!("the pipeline failed: {e}\n{module}"))?;
    let mut g = Gen::new(seed ^ 0x5eed);
    for func in &module.functions {
        let args = arguments(&module, func.name(), &mut g);
        let initial = StateStore::initialize(&module).unwrap();
        let interp_original = Interpreter::new(&module).with_custom_ops(&Identity);
        let interp_optimised = Interpreter::new(&optimised).with_custom_ops(&Identity);
        let (mut s1, mut s2, mut s3) = (initial.clone(), initial.clone(), initial);
        let original = interp_original.run(func.name(), args.clone(), &mut s1);
        let interpreted = interp_optimised.run(func.name(), args.clone(), &mut s2);
        let optimised_func = optimised.function(func.name()).unwrap();
        let executable = Executable::new(optimised_func);
        let shared: Vec<Arc<Array>> = args.into_iter().map(Arc::new).collect();
        let compiled = executable.run(shared, &mut s3, &interp_optimised, false);
        if let Some((op, how)) = (executable.fallbacks().into_iter())
            .find(|&(op, how)| !kiln::backend::exec::expected_fallback(op, how))
        {
            return Err(format!(
                "`{op}` ran as {how:?} in a compiled run\n{}",
                module
            ));
        }
        let stats = executable.stats();
        tally.kernel_steps += stats.kernels as u64 * stats.runs;
        let context = || {
            format!(
                "@{}\noriginal:\n{module}\noptimised:\n{optimised}",
                func.name()
            )
        };
        match (&interpreted, &compiled) {
            (Ok(i), Ok(c)) => {
                tally.compared += 1;
                for (a, b) in i.iter().zip(c) {
                    if !agree(a, b, 2e-4) {
                        return Err(format!(
                            "results differ: interpreted {a}, compiled {b}\n{}",
                            context()
                        ));
                    }
                }
                for (name, value) in s2.iter() {
                    if !agree(value, s3.get(name).unwrap(), 2e-4) {
                        return Err(format!("state @{name} differs\n{}", context()));
                    }
                }
            }
            (Err(_), Err(_)) => tally.failed += 1,
            (i, c) => {
                return Err(format!(
                    "one run failed: interpreted {:?}, compiled {:?}\n{}",
                    i.as_ref().err().map(ToString::to_string),
                    c.as_ref().err().map(ToString::to_string),
                    context()
                ));
            }
        }
        if let (Ok(o), Ok(i)) = (&original, &interpreted) {
            for (a, b) in o.iter().zip(i) {
                if !agree(a, b, 1e-5) {
                    return Err(format!(
                        "the pipeline changed a result: {a} vs {b}\n{}",
                        context()
                    ));
                }
            }
        }
    }
    Ok(tally)
}

#[test]
fn random_programs_agree_three_ways() {
    let count: u64 = std::env::var("KILN_RANDOM_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let mut failures = Vec::new();
    let mut total = Tally::default();
    for seed in 0..count {
        match check_program(seed) {
            Ok(t) => {
                total.kernel_steps += t.kernel_steps;
                total.compared += t.compared;
                total.failed += t.failed;
            }
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!(
        "{count} programs: {} functions compared, {} failed alike, {} compiled kernel steps",
        total.compared, total.failed, total.kernel_steps
    );
    // The compiled path must really have been taken, on runs that succeed.
    assert!(
        total.kernel_steps >= count,
        "only {} kernel steps ran",
        total.kernel_steps
    );
    assert!(
        total.compared >= count,
        "only {} functions ran to completion",
        total.compared
    );
    assert!(
        failures.is_empty(),
        "{} of {count} programs disagree; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// A random program made for the kernel compiler: chains of elementwise ops, broadcasts and
/// reductions over row/column shapes with a symbolic batch, so that fusion builds kernels of
/// several stages (rows, accumulations, scratch) with several outputs.
fn fusion_program(seed: u64) -> Module {
    use kiln::ir::{
        BinaryOp, CompareOp, Dim, FunctionBuilder, ReduceOp, Shape, Type, UnaryOp, Value,
    };
    let mut g = Gen::new(seed);
    let c = Dim::Fixed(g.pick(&[1, 3, 8, 13]));
    let n = Dim::sym("N");
    let shapes = [
        Shape(vec![n.clone(), c.clone()]),
        Shape(vec![n.clone(), Dim::Fixed(1)]),
        Shape(vec![c.clone()]),
        Shape(vec![n.clone()]),
        Shape(vec![]),
    ];
    let dtype = g.pick(&[DType::F32, DType::F32, DType::F32, DType::F64, DType::I32]);
    let mut b = FunctionBuilder::new("f");
    let mut pool: Vec<Value> = Vec::new();
    for i in 0..1 + g.below(3) {
        // The first argument binds N.
        let shape = if i == 0 {
            shapes[0].clone()
        } else {
            g.pick(&shapes[..3])
        };
        pool.push(b.arg(&format!("x{i}"), Type::new(dtype, shape)));
    }
    for _ in 0..4 + g.below(24) {
        let x = g.pick(&pool);
        let y = g.pick(&pool);
        let made = match g.below(10) {
            0..=2 => {
                let safe = [
                    UnaryOp::Neg,
                    UnaryOp::Abs,
                    UnaryOp::Relu,
                    UnaryOp::Exp,
                    UnaryOp::Tanh,
                    UnaryOp::Sigmoid,
                    UnaryOp::Sign,
                ];
                b.unary(g.pick(&safe), x)
            }
            3..=5 => {
                let ops = [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Max,
                    BinaryOp::Min,
                ];
                b.binary(g.pick(&ops), x, y)
            }
            6 => b
                .compare(g.pick(CompareOp::ALL), x, y)
                .and_then(|m| b.select(m, x, y)),
            7 | 8 => {
                let rank = b.value_type(x).rank();
                let axes: Vec<usize> = (0..rank).filter(|_| g.chance(50)).collect();
                let op = if dtype == DType::I32 {
                    ReduceOp::Sum
                } else {
                    g.pick(&[ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max])
                };
                let ty = b.value_type(x).clone();
                let empty = ty.shape.dims().iter().any(|d| d.as_fixed() == Some(0));
                if empty {
                    continue;
                }
                b.reduce(op, x, axes, g.chance(50))
            }
            _ => {
                let target = g.pick(&shapes[..2]);
                b.broadcast_to(x, &target)
            }
        };
        if let Ok(v) = made {
            pool.push(v);
        }
    }
    let results: Vec<Value> = (0..1 + g.below(3)).map(|_| g.pick(&pool)).collect();
    let mut module = Module::new();
    module.add_function(b.finish(&results).expect("pool values are visible"));
    let _ = CompareOp::Eq;
    module
}

#[test]
fn fusion_heavy_programs_agree_three_ways() {
    let count: u64 = std::env::var("KILN_FUSION_PROGRAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut failures = Vec::new();
    let mut kernel_steps = 0;
    for seed in 0..count {
        let module = fusion_program(seed);
        match check_module(&module, seed) {
            Ok(t) => kernel_steps += t.kernel_steps,
            Err(e) => failures.push(format!("seed {seed}: {e}")),
        }
    }
    eprintln!("{count} fusion-heavy programs: {kernel_steps} compiled kernel steps");
    assert!(
        failures.is_empty(),
        "{} of {count} programs disagree; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// Products read reshaped operands from the reshapes' sources (no copy): both operands,
/// transposed or not, a symbolic batch, and a reshape that is also a result (so it still
/// runs). Each agrees with the interpreter.
#[test]
fn products_read_reshaped_operands_in_place() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%x: f32[4,3,5], %w: f32[5,6], %g: f32[4,3,6], %v: f32[2,15], %s: f32[N,3,5], %u: f32[15,6]) -> (f32[4,3,6], f32[5,6], f32[6,5], f32[2,6], f32[N,6], f32[12,5]) {
    %flat = reshape %x : f32[12,5]
    %y = matmul %flat, %w : f32[12,6]
    %y3 = reshape %y : f32[4,3,6]
    %gflat = reshape %g : f32[12,6]
    %dw = matmul %flat, %gflat {transpose_a=true} : f32[5,6]
    %dwt = matmul %gflat, %flat {transpose_a=true} : f32[6,5]
    %vm = reshape %v : f32[6,5]
    %vy = matmul %vm, %w : f32[6,6]
    %v2 = reshape %vy : f32[2,18]
    %v3 = slice %v2 {ranges=[:, 0:6]} : f32[2,6]
    %rows = reshape %s : f32[N,15]
    %su = matmul %rows, %u : f32[N,6]
    return %y3, %dw, %dwt, %v3, %su, %flat
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 7).unwrap();
    assert_eq!(tally.compared, 1);
    // The reshapes only products read are not steps of the schedule.
    let (text, steps, insts) = scheduled(&module);
    let reshapes = text.matches("= reshape").count();
    assert_eq!(steps, insts - (reshapes - 3), "{text}");
}

/// Products read a slice of their operand's leading rows from the operand's own buffer (no
/// copy): an RNN's states stack cut to the trips' rows, flattened, as a weight gradient's
/// left operand; the same slice without a reshape, of a batch of matrices; a slice that is
/// also a result (so it still runs); and slices that are not a prefix (rows from 1, a column
/// range), which are copied. Each agrees with the interpreter.
#[test]
fn products_read_leading_row_slices_in_place() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%h: f32[5,2,3], %g: f32[4,2,3], %s: f32[3,3,4], %w: f32[4,2]) -> (f32[3,3], f32[2,3,2], f32[2,3,4], f32[3,3], f32[3,2]) {
    %states = slice %h {ranges=[0:4, :, :]} : f32[4,2,3]
    %a = reshape %states : f32[8,3]
    %b = reshape %g : f32[8,3]
    %dw = matmul %a, %b {transpose_a=true} : f32[3,3]
    %first = slice %s {ranges=[0:2, :, :]} : f32[2,3,4]
    %p = matmul %first, %w : f32[2,3,2]
    %late = slice %h {ranges=[1:5, :, :]} : f32[4,2,3]
    %la = reshape %late : f32[8,3]
    %dl = matmul %la, %b {transpose_a=true} : f32[3,3]
    %cols = slice %w {ranges=[:, 0:1]} : f32[4,1]
    %s0 = slice %s {ranges=[0:1, :, :]} : f32[1,3,4]
    %m = reshape %s0 : f32[3,4]
    %q = matmul %m, %w : f32[3,2]
    return %dw, %p, %first, %dl, %q
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 17).unwrap();
    assert_eq!(tally.compared, 1);
    // The slices and reshapes only products read are not steps of the schedule: `%states`
    // with `%a`, `%b`, `%la` (its slice from row 1, `%late`, is copied), `%s0` with `%m`;
    // `%first` is a result and runs.
    let (text, steps, insts) = scheduled(&module);
    assert_eq!(steps, insts - 6, "{text}");
}

/// Products read transposed operands through strides (no copy): attention's heads, a reshape
/// then a transpose of `[N, T, H·d]` into `[N, H, T, d]`, as the left operand, as the right one
/// transposed again by the product, over a symbolic batch; a transpose swapping the matrix
/// axes; and a transpose that is also a result (so it still runs). A product whose only
/// reader is a transpose keeping the last axis last writes the transposed result itself (the
/// heads joined back, and a permutation that is not its own inverse); one with another
/// reader, or under a transpose moving the last axis, does not. Each agrees with the
/// interpreter, and the transposes folded into products are not steps of the schedule.
#[test]
fn products_read_transposed_operands_through_strides() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%q: f32[N,5,6], %k: f32[N,5,6], %v: f32[N,3,5,2], %w: f32[7,4], %x: f32[4,3]) -> (f32[N,3,5,5], f32[N,5,3,2], f32[3,7], f32[3,4], f32[N,5,3,5], f32[N,5,3,5], f32[3,5,N,5]) {
    %q4 = reshape %q : f32[N,5,3,2]
    %qh = transpose %q4 {perm=[0, 2, 1, 3]} : f32[N,3,5,2]
    %k4 = reshape %k : f32[N,5,3,2]
    %kh = transpose %k4 {perm=[0, 2, 1, 3]} : f32[N,3,5,2]
    %s = matmul %qh, %kh {transpose_b=true} : f32[N,3,5,5]
    %c = matmul %s, %v : f32[N,3,5,2]
    %back = transpose %c {perm=[0, 2, 1, 3]} : f32[N,5,3,2]
    %wt = transpose %w {perm=[1, 0]} : f32[4,7]
    %y = matmul %x, %wt {transpose_a=true} : f32[3,7]
    %xt = transpose %x {perm=[1, 0]} : f32[3,4]
    %z = matmul %xt, %wt : f32[3,7]
    %sum = add %y, %z : f32[3,7]
    %ss = matmul %s, %s : f32[N,3,5,5]
    %cols = transpose %ss {perm=[0, 3, 1, 2]} : f32[N,5,3,5]
    %sback = transpose %s {perm=[0, 2, 1, 3]} : f32[N,5,3,5]
    %d = matmul %s, %s {transpose_b=true} : f32[N,3,5,5]
    %rot = transpose %d {perm=[1, 2, 0, 3]} : f32[3,5,N,5]
    return %s, %back, %sum, %xt, %cols, %sback, %rot
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 17).unwrap();
    assert_eq!(tally.compared, 1);
    let (text, steps, insts) = scheduled(&module);
    let (reshapes, transposes) = (
        text.matches("= reshape").count(),
        text.matches("= transpose").count(),
    );
    // Every reshape and transpose but `%xt` (a result), `%cols` (moves the last axis) and
    // `%sback` (its product has another reader).
    assert_eq!(steps, insts - (reshapes + transposes - 3), "{text}");
}

/// Attention's heads joined by their product (written through the transpose), then reshaped
/// twice: for the next layer (a result) and as rows for a weight gradient's product, which
/// reads the first reshape's result while that reshape moves the heads' buffer. Agrees with
/// the interpreter.
#[test]
fn joined_heads_reshaped_for_a_layer_and_a_weight_gradient_agree() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%s: f32[2,3,5,5], %v: f32[2,3,5,4], %g: f32[2,5,7]) -> (f32[2,5,12], f32[12,7]) {
    %c = matmul %s, %v : f32[2,3,5,4]
    %back = transpose %c {perm=[0, 2, 1, 3]} : f32[2,5,3,4]
    %joined = reshape %back : f32[2,5,12]
    %rows = reshape %back : f32[10,12]
    %grows = reshape %g : f32[10,7]
    %w = matmul %rows, %grows {transpose_a=true} : f32[12,7]
    return %joined, %w
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 23).unwrap();
    assert_eq!(tally.compared, 1);
}

/// `module` through the default pipeline.
fn optimised(module: &Module) -> Module {
    let mut optimised = module.clone();
    PassManager::pipeline("default")
        .unwrap()
        .run(&mut optimised)
        .unwrap();
    optimised
}

/// `module`'s function `@f` after the default pipeline: its text, the steps of its schedule,
/// and its instructions.
fn scheduled(module: &kiln::ir::Module) -> (String, usize, usize) {
    let optimised = optimised(module);
    let func = optimised.function("f").unwrap();
    let steps = Executable::new(func).stats().steps;
    (
        func.to_string(),
        steps,
        func.region(func.body()).insts.len(),
    )
}

/// Products large enough to split across threads (by rows when the left operand is
/// transposed over a short sum, by columns otherwise — `%u` and the update of `@v` sum over
/// 1,100 and have 270 columns, 32 a thread for up to 8 threads), with sizes that are no
/// multiple of the split's granularity, each transpose, and SGD-style updates folded into
/// products. Each agrees with the interpreter.
#[test]
fn large_products_split_across_threads_agree() {
    let module = kiln::ir::parse_module(
        "module {
  state @w : f32[200,70] = constant(value=0.25)
  state @v : f32[40,270] = constant(value=0.5)
  func @f(%a: f32[200,300], %at: f32[300,200], %b: f32[300,70], %bt: f32[70,300], %long: f32[1100,40], %lb: f32[1100,270]) -> (f32[200,70], f32[200,70], f32[200,70], f32[200,70], f32[40,270]) {
    %p = matmul %a, %b : f32[200,70]
    %q = matmul %at, %b {transpose_a=true} : f32[200,70]
    %r = matmul %a, %bt {transpose_b=true} : f32[200,70]
    %s = matmul %at, %bt {transpose_a=true, transpose_b=true} : f32[200,70]
    %w = load @w : f32[200,70]
    %g = matmul %at, %b {transpose_a=true} : f32[200,70]
    %lr = const 0.01 : f32[200,70]
    %step = mul %g, %lr : f32[200,70]
    %next = sub %w, %step : f32[200,70]
    store @w, %next
    %u = matmul %long, %lb {transpose_a=true} : f32[40,270]
    %v = load @v : f32[40,270]
    %lbn = neg %lb : f32[1100,270]
    %h = matmul %long, %lbn {transpose_a=true} : f32[40,270]
    %lr2 = const 0.01 : f32[40,270]
    %vstep = mul %h, %lr2 : f32[40,270]
    %vnext = sub %v, %vstep : f32[40,270]
    store @v, %vnext
    return %p, %q, %r, %s, %u
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 11).unwrap();
    assert_eq!(tally.compared, 1);
}

/// Products of two plain matrices (a dense layer's; the path with no batch and no views):
/// each transpose, an empty contraction (zeros, over a buffer an earlier run filled), and a
/// small SGD update folded into its product. Each agrees with the interpreter.
#[test]
fn plain_matrix_products_agree() {
    let module = kiln::ir::parse_module(
        "module {
  state @w : f32[16,5] = constant(value=0.25)
  func @f(%a: f32[7,16], %at: f32[16,7], %b: f32[16,5], %bt: f32[5,16], %e: f32[7,0], %f: f32[0,5]) -> (f32[7,5], f32[7,5], f32[7,5], f32[7,5], f32[7,5]) {
    %p = matmul %a, %b : f32[7,5]
    %q = matmul %at, %b {transpose_a=true} : f32[7,5]
    %r = matmul %a, %bt {transpose_b=true} : f32[7,5]
    %s = matmul %at, %bt {transpose_a=true, transpose_b=true} : f32[7,5]
    %z = matmul %e, %f : f32[7,5]
    %w = load @w : f32[16,5]
    %g = matmul %at, %p {transpose_b=false} : f32[16,5]
    %lr = const 0.01 : f32[16,5]
    %step = mul %g, %lr : f32[16,5]
    %next = sub %w, %step : f32[16,5]
    store @w, %next
    return %p, %q, %r, %s, %z
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 12).unwrap();
    assert_eq!(tally.compared, 1);
}

/// Convolutions whose contraction is no longer than their output channels (a first layer's
/// one input channel, and per group) write each channel's planes in a row and move them to
/// NCHW by planes; the others write a row per position. Both orientations, padded, strided
/// and grouped, agree with the interpreter.
#[test]
fn convolutions_in_both_product_orientations_agree() {
    let attrs = |stride: usize, groups: usize| {
        format!(
            "{{strides=[{stride}, {stride}], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups={groups}}}"
        )
    };
    let module = kiln::ir::parse_module(&format!(
        "module {{
  func @f(%x: f32[5,1,9,7], %w: f32[16,1,3,3], %y: f32[3,4,6,6], %v: f32[12,2,3,3], %z: f32[3,8,5,5], %u: f32[4,8,3,3]) -> (f32[5,16,9,7], f32[3,12,3,3], f32[3,4,5,5]) {{
    %a = conv2d %x, %w {one} : f32[5,16,9,7]
    %b = conv2d %y, %v {grouped} : f32[3,12,3,3]
    %c = conv2d %z, %u {one} : f32[3,4,5,5]
    return %a, %b, %c
  }}
}}",
        one = attrs(1, 1),
        grouped = attrs(2, 2),
    ))
    .unwrap();
    let tally = check_module(&module, 23).unwrap();
    assert_eq!(tally.compared, 1);
}

/// Convolutions followed by a kernel that alone reads their output run it as their epilogue,
/// on each run of samples as they write it: a bias and ReLU (chunks of samples in parallel,
/// as in the digits CNN's first layer) and their sum with the biased output beside it (two
/// outputs, over the output in place), a pointwise convolution (a sample at a time), a large
/// image (runs of positions), an input gradient with its ReLU mask, and a kernel over the
/// output as one row (`tanh`: its rows do not split by samples, so it runs after the
/// convolution). The same convolution written twice is one after the pipeline. Each agrees
/// with the interpreter, and the schedule pairs all five.
#[test]
fn convolution_epilogues_agree() {
    let same = "{strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1}";
    let pointwise = "{strides=[1, 1], padding=[(0, 0), (0, 0)], dilation=[1, 1], groups=1}";
    let module = kiln::ir::parse_module(&format!(
        "module {{
  func @f(%x: f32[64,1,8,8], %w: f32[32,1,3,3], %b: f32[32], %v: f32[16,32,1,1], %big: f32[1,8,64,64], %u: f32[4,8,3,3], %g: f32[64,32,8,8], %k: f32[32,32,3,3]) -> (f32[64,32,8,8], f32[64,32,8,8], f32[64,16,8,8], f32[1,4,64,64], f32[64,1,8,8], f32[64,32,8,8]) {{
    %c = conv2d %x, %w {same} : f32[64,32,8,8]
    %b4 = reshape %b : f32[1,32,1,1]
    %bb = broadcast %b4 : f32[64,32,8,8]
    %z = add %c, %bb : f32[64,32,8,8]
    %zero = const 0.0 : f32[64,32,8,8]
    %h = max %z, %zero : f32[64,32,8,8]
    %c2 = conv2d %x, %w {same} : f32[64,32,8,8]
    %z2 = add %c2, %bb : f32[64,32,8,8]
    %h2 = max %z2, %zero : f32[64,32,8,8]
    %s = add %z2, %h2 : f32[64,32,8,8]
    %p = conv2d %h, %v {pointwise} : f32[64,16,8,8]
    %pz = const 0.0 : f32[64,16,8,8]
    %ph = max %p, %pz : f32[64,16,8,8]
    %l = conv2d %big, %u {same} : f32[1,4,64,64]
    %lz = const 0.0 : f32[1,4,64,64]
    %lh = max %l, %lz : f32[1,4,64,64]
    %dx = conv2d_input_grad %g, %w {same} : f32[64,1,8,8]
    %xz = const 0.0 : f32[64,1,8,8]
    %on = gt %x, %xz : bool[64,1,8,8]
    %dm = select %on, %dx, %xz : f32[64,1,8,8]
    %t = conv2d %h2, %k {same} : f32[64,32,8,8]
    %th = tanh %t : f32[64,32,8,8]
    return %h, %s, %ph, %lh, %dm, %th
  }}
}}"
    ))
    .unwrap();
    let optimised = optimised(&module);
    let func = optimised.function("f").unwrap();
    let executable = Executable::new(func);
    assert_eq!(executable.stats().epilogues, 5, "{func}");
    for seed in [31, 32] {
        assert_eq!(check_module(&module, seed).unwrap().compared, 1);
    }
    // The bias kernel's rows split by samples, and the large image is one sample; the other
    // three kernels are one row each, so they run after their convolution.
    let args = arguments(&module, "f", &mut Gen::new(33));
    let shared: Vec<Arc<Array>> = args.into_iter().map(Arc::new).collect();
    let (mut state, interp) = (StateStore::default(), Interpreter::new(&optimised));
    for _ in 0..2 {
        executable
            .run(shared.clone(), &mut state, &interp, false)
            .unwrap();
    }
    assert_eq!(executable.stats().epilogues_run, 4);
}

/// A convolution's loaded weights are packed for its kernel once and kept while the state holds
/// the same array: a second run packs nothing and gives what the interpreter gives; weights
/// replaced in the state are packed again, and a function that stores its weights (a training
/// step) keeps none. Without the check of the array, the third run would use the first
/// weights.
#[test]
fn convolution_weights_packed_once_while_their_state_is_unchanged() {
    let module = kiln::ir::parse_and_verify(
        "module {
  state @w : f32[8,4,3,3] = constant(value=0.0)
  func @predict(%x: f32[2,4,9,9]) -> f32[2,8,9,9] {
    %w = load @w : f32[8,4,3,3]
    %y = conv2d %x, %w {strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1} : f32[2,8,9,9]
    %t = tanh %y : f32[2,8,9,9]
    return %t
  }
  func @train(%x: f32[2,4,9,9]) -> f32[2,8,9,9] {
    %w = load @w : f32[8,4,3,3]
    %y = conv2d %x, %w {strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1} : f32[2,8,9,9]
    %h = const 0.5 : f32[8,4,3,3]
    %w2 = mul %w, %h : f32[8,4,3,3]
    store @w, %w2
    return %y
  }
}",
    )
    .unwrap();
    let optimised = optimised(&module);
    let interp = Interpreter::new(&optimised);
    let mut g = Gen::new(41);
    let x = arguments(&module, "predict", &mut g);
    let mut state = StateStore::default();
    let mut weights = || arguments(&module, "predict", &mut g)[0].clone();
    let some_weights = |x: Array| match x {
        Array::F32(a) => Array::F32(
            a.into_shape_with_order(vec![2 * 4 * 81])
                .unwrap()
                .slice_move(ndarray::s![..8 * 4 * 9])
                .into_shape_with_order(vec![8, 4, 3, 3])
                .unwrap(),
        ),
        _ => unreachable!("f32 arguments"),
    };
    state.insert("w", some_weights(weights()));
    let predict = Executable::new(optimised.function("predict").unwrap());
    let expected = |state: &StateStore| {
        let mut s = state.clone();
        interp.run("predict", x.clone(), &mut s).unwrap()
    };
    let shared: Vec<Arc<Array>> = x.iter().cloned().map(Arc::new).collect();
    for (run, packs) in [(0, 1), (1, 1), (2, 2)] {
        if run == 2 {
            state.insert("w", some_weights(weights()));
        }
        let want = expected(&state);
        let got = predict
            .run(shared.clone(), &mut state, &interp, false)
            .unwrap();
        assert!(agree(&want[0], &got[0], 1e-5), "run {run}");
        assert_eq!(predict.stats().weights_packed, packs, "run {run}");
    }
    let train = Executable::new(optimised.function("train").unwrap());
    train.run(shared, &mut state, &interp, false).unwrap();
    assert_eq!(train.stats().weights_packed, 0);
}

/// Convolutions and max pooling with channels-last activations (`channels_last=true`, the
/// `channels_last` pass's layout) agree with the interpreter, which runs them as the NCHW ops
/// on transposed operands — and give, transposed, what the NCHW ops give: padded, strided
/// and dilated convolutions and both transposes, one input channel, a pointwise convolution
/// and its transposes, an image large enough to run by positions, grouped (by the
/// interpreter), max pooling with its gradient paired and unpaired, overlapping padded
/// windows, average pooling (by the interpreter).
#[test]
fn channels_last_ops_agree() {
    let conv = |stride: usize, pad: usize, dilation: usize, groups: usize| {
        format!(
            "strides=[{stride}, {stride}], padding=[({pad}, {pad}), ({pad}, {pad})], \
             dilation=[{dilation}, {dilation}], groups={groups}"
        )
    };
    let (same, strided) = (conv(1, 1, 1, 1), conv(2, 2, 2, 1));
    let (pointwise, grouped) = (conv(1, 0, 1, 1), conv(1, 1, 1, 2));
    let tiled = "window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)]";
    let padded = "window=[3, 3], strides=[2, 2], padding=[(1, 1), (1, 1)]";
    let module = kiln::ir::parse_module(&format!(
        "module {{
  func @f(%x: f32[6,9,7,4], %w: f32[8,4,3,3], %g: f32[6,9,7,8], %x1: f32[5,8,8,1], %w1: f32[16,1,3,3], %v: f32[8,4,1,1], %gs: f32[6,5,4,8], %big: f32[1,64,64,8], %u: f32[4,8,3,3], %pg: f32[6,4,3,4], %pp: f32[6,5,4,4]) -> (f32[6,9,7,8], f32[6,9,7,4], f32[8,4,3,3], f32[6,5,4,8], f32[6,9,7,4], f32[8,4,3,3], f32[5,8,8,16], f32[6,9,7,8], f32[6,9,7,4], f32[8,4,1,1], f32[1,64,64,4], f32[6,4,3,4], f32[6,9,7,4], f32[6,9,7,4], f32[6,5,4,4], f32[6,9,7,4]) {{
    %y = conv2d %x, %w {{{same}, channels_last=true}} : f32[6,9,7,8]
    %dx = conv2d_input_grad %g, %w {{{same}, channels_last=true}} : f32[6,9,7,4]
    %dw = conv2d_filter_grad %x, %g {{{same}, channels_last=true}} : f32[8,4,3,3]
    %ys = conv2d %x, %w {{{strided}, channels_last=true}} : f32[6,5,4,8]
    %dxs = conv2d_input_grad %gs, %w {{{strided}, channels_last=true}} : f32[6,9,7,4]
    %dws = conv2d_filter_grad %x, %gs {{{strided}, channels_last=true}} : f32[8,4,3,3]
    %y1 = conv2d %x1, %w1 {{{same}, channels_last=true}} : f32[5,8,8,16]
    %yp = conv2d %x, %v {{{pointwise}, channels_last=true}} : f32[6,9,7,8]
    %dxp = conv2d_input_grad %g, %v {{{pointwise}, channels_last=true}} : f32[6,9,7,4]
    %dwp = conv2d_filter_grad %x, %g {{{pointwise}, channels_last=true}} : f32[8,4,1,1]
    %yb = conv2d %big, %u {{{same}, channels_last=true}} : f32[1,64,64,4]
    %p = max_pool2d %x {{{tiled}, channels_last=true}} : f32[6,4,3,4]
    %dp = max_pool2d_grad %x, %pg {{{tiled}, channels_last=true}} : f32[6,9,7,4]
    %dq = max_pool2d_grad %x, %pg {{{tiled}, channels_last=true}} : f32[6,9,7,4]
    %q = max_pool2d %x {{{padded}, channels_last=true}} : f32[6,5,4,4]
    %dr = max_pool2d_grad %x, %pp {{{padded}, channels_last=true}} : f32[6,9,7,4]
    return %y, %dx, %dw, %ys, %dxs, %dws, %y1, %yp, %dxp, %dwp, %yb, %p, %dp, %dq, %q, %dr
  }}
}}"
    ))
    .unwrap();
    for seed in [41, 42] {
        assert_eq!(check_module(&module, seed).unwrap().compared, 1);
    }
    // The interpreter's channels-last ops are the NCHW ones on transposed operands (a
    // grouped convolution and average pooling, which the executor leaves to it, among them).
    let reference = kiln::ir::parse_module(&format!(
        "module {{
  func @f(%x: f32[6,9,7,4], %w: f32[8,4,3,3], %wg: f32[8,2,3,3]) -> (f32[6,9,7,8], f32[6,9,7,8], f32[6,9,7,8], f32[6,9,7,8], f32[6,5,4,4], f32[6,5,4,4]) {{
    %y = conv2d %x, %w {{{same}, channels_last=true}} : f32[6,9,7,8]
    %yg = conv2d %x, %wg {{{grouped}, channels_last=true}} : f32[6,9,7,8]
    %a = avg_pool2d %x {{{padded}, channels_last=true}} : f32[6,5,4,4]
    %xn = transpose %x {{perm=[0, 3, 1, 2]}} : f32[6,4,9,7]
    %yn = conv2d %xn, %w {{{same}}} : f32[6,8,9,7]
    %ygn = conv2d %xn, %wg {{{grouped}}} : f32[6,8,9,7]
    %an = avg_pool2d %xn {{{padded}}} : f32[6,4,5,4]
    %y2 = transpose %yn {{perm=[0, 2, 3, 1]}} : f32[6,9,7,8]
    %yg2 = transpose %ygn {{perm=[0, 2, 3, 1]}} : f32[6,9,7,8]
    %a2 = transpose %an {{perm=[0, 2, 3, 1]}} : f32[6,5,4,4]
    return %y, %y2, %yg, %yg2, %a, %a2
  }}
}}"
    ))
    .unwrap();
    let args = arguments(&reference, "f", &mut Gen::new(43));
    let interp = Interpreter::new(&reference);
    let results = interp.run("f", args, &mut StateStore::default()).unwrap();
    for pair in results.chunks(2) {
        assert_eq!(pair[0], pair[1]);
    }
}

/// Cases the executor's channels-last loops leave to the interpreter or must not trip on:
/// windows of 255 taps or more (whose tap does not fit the argmax's byte), and samples with
/// no channel or no position. Each gives the interpreter's result.
#[test]
fn channels_last_pooling_edge_cases_agree() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%x: f32[1,17,17,2], %g: f32[1,1,1,2], %e: f32[2,4,4,0], %ge: f32[2,2,2,0], %z: f32[1,0,4,3], %gz: f32[1,1,2,3]) -> (f32[1,1,1,2], f32[1,17,17,2], f32[2,2,2,0], f32[2,4,4,0], f32[1,0,4,3]) {
    %p = max_pool2d %x {window=[17, 17], strides=[1, 1], padding=[(0, 0), (0, 0)], channels_last=true} : f32[1,1,1,2]
    %d = max_pool2d_grad %x, %g {window=[17, 17], strides=[1, 1], padding=[(0, 0), (0, 0)], channels_last=true} : f32[1,17,17,2]
    %pe = max_pool2d %e {window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)], channels_last=true} : f32[2,2,2,0]
    %de = max_pool2d_grad %e, %ge {window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)], channels_last=true} : f32[2,4,4,0]
    %dz = max_pool2d_grad %z, %gz {window=[2, 2], strides=[2, 2], padding=[(1, 1), (0, 0)], channels_last=true} : f32[1,0,4,3]
    return %p, %d, %pe, %de, %dz
  }
}",
    )
    .unwrap();
    let func = module.function("f").unwrap();
    let args = arguments(&module, "f", &mut Gen::new(61));
    let interp = Interpreter::new(&module);
    let expected = interp
        .run("f", args.clone(), &mut StateStore::default())
        .unwrap();
    let executable = Executable::new(func);
    let shared: Vec<Arc<Array>> = args.into_iter().map(Arc::new).collect();
    let compiled = (executable.run(shared, &mut StateStore::default(), &interp, false)).unwrap();
    for (a, b) in expected.iter().zip(&compiled) {
        assert_eq!(a, &**b);
    }
}

/// A kernel that waits for a collective's result (its first reader) is not a convolution's
/// epilogue, which would run it a step before the wait: here the bias is all-reduced (one
/// rank: returned as it is) and read only by the kernel after the convolution.
#[test]
fn a_kernel_waiting_for_a_collective_is_no_epilogue() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%x: f32[4,1,8,8], %w: f32[8,1,3,3], %b: f32[1,8,1,1]) -> f32[4,8,8,8] {
    %s = all_reduce_sum %b : f32[1,8,1,1]
    %c = conv2d %x, %w {strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1} : f32[4,8,8,8]
    %bb = broadcast %s : f32[4,8,8,8]
    %y = add %c, %bb : f32[4,8,8,8]
    return %y
  }
}",
    )
    .unwrap();
    let optimised = optimised(&module);
    let executable = Executable::new(optimised.function("f").unwrap());
    assert_eq!(executable.stats().epilogues, 0);
    assert_eq!(check_module(&module, 62).unwrap().compared, 1);
}

/// The `channels_last` pass rewrites each region of activations that holds a convolution
/// channels last, with transposes (or reshapes, when only axes of size 1 move) where it meets
/// other ops, and the results do not change: one layer's training step (`conv_step.kir`:
/// the image and the bias come in by reshapes, the pooled values' gradient by a transpose);
/// two layers flattened into a dense layer, with a scalar broadcast, a bias gradient keeping
/// its axes, a concatenation of channels and a filter gradient; a pooling without a
/// convolution, a region read inside a `while` body, a forward convolution alone and
/// pointwise convolutions (which save nothing channels last), all left as they are.
#[test]
fn channels_last_regions_keep_results() {
    let conv_step = std::fs::read_to_string("tests/programs/conv_step.kir").unwrap();
    let conv_step = kiln::ir::parse_module(&conv_step).unwrap();
    let same = "strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1";
    let tiled = "window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)]";
    let layers = kiln::ir::parse_module(&format!(
        "module {{
  func @two(%x: f32[N,3,8,8], %w1: f32[4,3,3,3], %w2: f32[6,8,3,3], %d: f32[96,5], %s: f32[], %g: f32[N,6,8,8]) -> (f32[N,5], f32[1,6,1,1], f32[6,8,3,3]) {{
    %c1 = conv2d %x, %w1 {{{same}}} : f32[N,4,8,8]
    %sb = broadcast %s : f32[N,4,8,8]
    %z1 = mul %c1, %sb : f32[N,4,8,8]
    %both = concat %z1, %c1 {{axis=1}} : f32[N,8,8,8]
    %c2 = conv2d %both, %w2 {{{same}}} : f32[N,6,8,8]
    %zero = const 0.0 : f32[N,6,8,8]
    %h = max %c2, %zero : f32[N,6,8,8]
    %p = max_pool2d %h {{{tiled}}} : f32[N,6,4,4]
    %db = reduce_sum %h {{axes=[0, 2, 3], keep_dims=true}} : f32[1,6,1,1]
    %flat = reshape %p : f32[N,96]
    %y = matmul %flat, %d : f32[N,5]
    %dw = conv2d_filter_grad %both, %g {{{same}}} : f32[6,8,3,3]
    return %y, %db, %dw
  }}

  func @pool_only(%x: f32[2,3,4,4]) -> f32[2,3,2,2] {{
    %p = max_pool2d %x {{{tiled}}} : f32[2,3,2,2]
    return %p
  }}

  func @flattened(%x: f32[N,3,8,8], %w: f32[4,3,3,3]) -> f32[N,256] {{
    %c = conv2d %x, %w {{{same}}} : f32[N,4,8,8]
    %f = reshape %c : f32[N,256]
    return %f
  }}

  func @pointwise(%x: f32[N,3,8,8], %w: f32[4,3,1,1], %g: f32[N,4,8,8]) -> (f32[N,4,8,8], f32[4,3,1,1]) {{
    %c = conv2d %x, %w {{strides=[1, 1], padding=[(0, 0), (0, 0)], dilation=[1, 1], groups=1}} : f32[N,4,8,8]
    %dw = conv2d_filter_grad %x, %g {{strides=[1, 1], padding=[(0, 0), (0, 0)], dilation=[1, 1], groups=1}} : f32[4,3,1,1]
    return %c, %dw
  }}

  func @in_loop(%x: f32[2,3,4,4], %w: f32[3,3,3,3]) -> (f32[2,3,4,4], f32[3,3,3,3]) {{
    %c = conv2d %x, %w {{{same}}} : f32[2,3,4,4]
    %dw = conv2d_filter_grad %x, %c {{{same}}} : f32[3,3,3,3]
    %zero = const 0 : i64[]
    %r, %k = while %c, %zero : f32[2,3,4,4], i64[] cond(%a: f32[2,3,4,4], %i: i64[]) {{
      %three = const 3 : i64[]
      %go = lt %i, %three : bool[]
      yield %go
    }} body(%a2: f32[2,3,4,4], %i2: i64[]) {{
      %b = add %a2, %c : f32[2,3,4,4]
      %one = const 1 : i64[]
      %next = add %i2, %one : i64[]
      yield %b, %next
    }}
    return %r, %dw
  }}
}}"
    ))
    .unwrap();
    for (module, seed) in [(&conv_step, 51), (&layers, 52)] {
        assert_eq!(
            check_module(module, seed).unwrap().compared,
            module.functions.len() as u64
        );
    }
    let text = |module: &Module, name: &str| module.function(name).unwrap().to_string();
    let step = text(&optimised(&conv_step), "train_step");
    assert_eq!(step.matches("channels_last=true").count(), 4, "{step}");
    assert_eq!(step.matches("= transpose").count(), 1, "{step}");
    let unoptimised = layers.clone();
    let layers = optimised(&layers);
    let two = text(&layers, "two");
    // The three convolutions, the pooling; in: the image and the output gradient; out: the
    // pooled values (flattened) and the bias gradient (a reshape).
    assert_eq!(two.matches("channels_last=true").count(), 4, "{two}");
    assert!(two.contains("concat") && two.contains("{axis=3}"), "{two}");
    assert_eq!(two.matches("= transpose").count(), 3, "{two}");
    for name in ["pool_only", "in_loop", "flattened", "pointwise"] {
        let f = text(&layers, name);
        assert!(
            !f.contains("channels_last") && !f.contains("transpose"),
            "{f}"
        );
    }
    // A forward convolution alone stays NCHW; so do pointwise ones, which save nothing
    // (products over the NCHW planes) and would pay for their edges. Each says why.
    let mut unoptimised = unoptimised;
    let reports = (PassManager::from_names(&["channels_last"]).unwrap())
        .explain(true)
        .run(&mut unoptimised)
        .unwrap();
    let why = reports[0].explanations.join("\n");
    for reason in [
        "@flattened: 1 convolution(s) stay NCHW: no gradient among them",
        "@pointwise: 2 convolution(s) stay NCHW: channels last would save 0 element moves in them and pay 704 at the region's edges",
    ] {
        assert!(why.contains(reason), "{why}");
    }
}

/// Max pooling and its gradients in one function, as a training step has them: each pooling
/// records its windows' argmax and its gradients read it instead of searching the windows
/// again (paired by the schedule; two gradients of one pooling share it). 2×2 windows that
/// tile the plane, over enough planes to split across threads; over rows 8, 4 and 2 long
/// (AVX-512 blocks of 64 elements, with rows left after the last block for the scalar loop);
/// 2×2 windows that leave a row and a column out; overlapping padded windows in f64. Beside
/// them, average pooling's gradient over windows that tile the plane (written without window
/// scans) and over overlapping ones. The inputs are drawn from a few values, −∞ and NaN among
/// them, so windows tie and hold NaNs; results agree with the interpreter bit for bit (a NaN
/// for a NaN). Channels last, 2×2 windows tiling the image run sixteen channels at a time:
/// over 32 channels (two whole runs, samples split across threads), 20 (a run and four) and
/// 5 (a short run only).
#[test]
fn pooling_gradients_agree_with_max_pooling_keeping_its_argmax() {
    let tiled = "{window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)]}";
    let tiled_nhwc =
        "{window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)], channels_last=true}";
    let padded = "{window=[3, 3], strides=[2, 2], padding=[(1, 1), (1, 0)]}";
    let module = kiln::ir::parse_module(&format!(
        "module {{
  func @f(%x: f32[4,16,32,32], %gx: f32[4,16,16,16], %o: f32[1,2,5,5], %go: f32[1,2,2,2], %y: f64[1,2,7,5], %gy: f64[1,2,4,2], %gy2: f64[1,2,4,2], %e: f32[3,5,8,8], %ge: f32[3,5,4,4], %f: f32[3,3,6,4], %gf: f32[3,3,3,2], %t: f32[2,3,4,2], %gt: f32[2,3,2,1], %c: f32[4,16,16,32], %gc: f32[4,8,8,32], %h: f32[3,8,6,20], %gh: f32[3,4,3,20], %k: f32[2,4,4,5], %gk: f32[2,2,2,5]) -> (f32[4,16,16,16], f32[4,16,32,32], f32[1,2,2,2], f32[1,2,5,5], f64[1,2,4,2], f64[1,2,7,5], f64[1,2,7,5], f32[4,16,32,32], f64[1,2,8,6], f64[1,2,7,5], f32[3,5,4,4], f32[3,5,8,8], f32[3,3,3,2], f32[3,3,6,4], f32[2,3,2,1], f32[2,3,4,2], f32[4,8,8,32], f32[4,16,16,32], f32[3,4,3,20], f32[3,8,6,20], f32[2,2,2,5], f32[2,4,4,5]) {{
    %px = max_pool2d %x {tiled} : f32[4,16,16,16]
    %po = max_pool2d %o {tiled} : f32[1,2,2,2]
    %py = max_pool2d %y {padded} : f64[1,2,4,2]
    %dx = max_pool2d_grad %x, %gx {tiled} : f32[4,16,32,32]
    %do = max_pool2d_grad %o, %go {tiled} : f32[1,2,5,5]
    %dy = max_pool2d_grad %y, %gy {padded} : f64[1,2,7,5]
    %dy2 = max_pool2d_grad %y, %gy2 {padded} : f64[1,2,7,5]
    %da = avg_pool2d_grad %gx {{window=[2, 2], strides=[2, 2], padding=[(0, 0), (0, 0)]}} : f32[4,16,32,32]
    %db = avg_pool2d_grad %gy {{window=[2, 3], strides=[2, 3], padding=[(0, 0), (0, 0)]}} : f64[1,2,8,6]
    %dc = avg_pool2d_grad %gy {padded} : f64[1,2,7,5]
    %pe = max_pool2d %e {tiled} : f32[3,5,4,4]
    %de = max_pool2d_grad %e, %ge {tiled} : f32[3,5,8,8]
    %pf = max_pool2d %f {tiled} : f32[3,3,3,2]
    %df = max_pool2d_grad %f, %gf {tiled} : f32[3,3,6,4]
    %pt = max_pool2d %t {tiled} : f32[2,3,2,1]
    %dt = max_pool2d_grad %t, %gt {tiled} : f32[2,3,4,2]
    %pc = max_pool2d %c {tiled_nhwc} : f32[4,8,8,32]
    %dcl = max_pool2d_grad %c, %gc {tiled_nhwc} : f32[4,16,16,32]
    %ph = max_pool2d %h {tiled_nhwc} : f32[3,4,3,20]
    %dh = max_pool2d_grad %h, %gh {tiled_nhwc} : f32[3,8,6,20]
    %pk = max_pool2d %k {tiled_nhwc} : f32[2,2,2,5]
    %dk = max_pool2d_grad %k, %gk {tiled_nhwc} : f32[2,4,4,5]
    return %px, %dx, %po, %do, %py, %dy, %dy2, %da, %db, %dc, %pe, %de, %pf, %df, %pt, %dt, %pc, %dcl, %ph, %dh, %pk, %dk
  }}
}}"
    ))
    .unwrap();
    let func = module.function("f").unwrap();
    let mut g = Gen::new(29);
    let few = [-1.0, 0.0, 0.5, 2.0, f64::NEG_INFINITY, f64::NAN];
    let args: Vec<Array> = (func.arg_types())
        .map(|t| {
            let dims: Vec<usize> = t
                .shape
                .dims()
                .iter()
                .map(|d| d.as_fixed().unwrap())
                .collect();
            let count = dims.iter().product();
            let values = (0..count).map(|_| few[g.below(few.len())]);
            let values = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&dims), values.collect());
            Array::F64(values.unwrap()).cast(t.dtype)
        })
        .collect();
    let mut state = StateStore::initialize(&module).unwrap();
    let interp = Interpreter::new(&module);
    let expected = interp.run("f", args.clone(), &mut state).unwrap();
    let executable = Executable::new(func);
    assert_eq!(
        executable.stats().kept_argmax,
        9,
        "each pooling keeps its argmax"
    );
    let shared: Vec<Arc<Array>> = args.into_iter().map(Arc::new).collect();
    for run in 0..2 {
        let compiled = (executable.run(shared.clone(), &mut state, &interp, false)).unwrap();
        for (i, (a, b)) in expected.iter().zip(&compiled).enumerate() {
            let same =
                |(x, y): (&f64, &f64)| x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan();
            let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
            assert!(
                a.iter().zip(&b).all(same),
                "result {i}, run {run}: {a:?}\n{b:?}"
            );
        }
    }
}

/// A batch of products sharing their right operand (`[B, M, K] @ [K, N]`, a dense layer over
/// tokens) runs as one product of `B·M` rows: plain, with the right operand transposed, with
/// batch axes of 1 on the right, over a symbolic batch, and onto a state update; a shared
/// left operand (not folded) and a transposed left one (not folded) beside them. Each agrees
/// with the interpreter.
#[test]
fn batches_sharing_a_right_operand_run_as_one_product() {
    let module = kiln::ir::parse_module(
        "module {
  state @acc : f32[3,40,70] = constant(value=0.5)
  func @f(%x: f32[3,40,90], %w: f32[90,70], %wt: f32[70,90], %w1: f32[1,1,90,70], %x4: f32[2,3,40,90], %s: f32[N,40,90], %a: f32[40,90], %b: f32[3,90,70], %xt: f32[3,90,40]) -> (f32[3,40,70], f32[3,40,70], f32[2,3,40,70], f32[N,40,70], f32[3,40,70], f32[3,40,70]) {
    %p = matmul %x, %w : f32[3,40,70]
    %q = matmul %x, %wt {transpose_b=true} : f32[3,40,70]
    %r = matmul %x4, %w1 : f32[2,3,40,70]
    %t = matmul %s, %w : f32[N,40,70]
    %u = matmul %a, %b : f32[3,40,70]
    %v = matmul %xt, %w {transpose_a=true} : f32[3,40,70]
    %acc = load @acc : f32[3,40,70]
    %g = matmul %x, %w : f32[3,40,70]
    %lr = const 0.01 : f32[3,40,70]
    %step = mul %g, %lr : f32[3,40,70]
    %next = sub %acc, %step : f32[3,40,70]
    store @acc, %next
    return %p, %q, %r, %t, %u, %v
  }
}",
    )
    .unwrap();
    let tally = check_module(&module, 13).unwrap();
    assert_eq!(tally.compared, 1);
}

/// The generator draws every op but those listed, each with the test that covers it.
#[test]
fn random_programs_draw_every_op() {
    const NOT_DRAWN: &[(&str, &str)] = &[
        ("fused", "made by the fusion pass from what is drawn"),
        (
            "conv2d_input_grad",
            "gradients of drawn convolutions: passes/tests/grad_check.rs, runtime/tests/oracles.rs",
        ),
        (
            "conv2d_filter_grad",
            "gradients of drawn convolutions: passes/tests/grad_check.rs, runtime/tests/oracles.rs",
        ),
        (
            "max_pool2d_grad",
            "gradients of drawn pooling: passes/tests/grad_check.rs, runtime/tests/oracles.rs",
        ),
        (
            "avg_pool2d_grad",
            "gradients of drawn pooling: passes/tests/grad_check.rs, runtime/tests/oracles.rs",
        ),
        ("all_reduce_sum", "needs ranks: tests/distributed.rs"),
        ("all_reduce_mean", "needs ranks: tests/distributed.rs"),
        ("reduce_scatter_sum", "needs ranks: tests/distributed.rs"),
        ("reduce_scatter_mean", "needs ranks: tests/distributed.rs"),
        ("all_gather", "needs ranks: tests/distributed.rs"),
        ("shard", "needs ranks: tests/distributed.rs"),
        ("collective_broadcast", "needs ranks: tests/distributed.rs"),
        ("send", "needs a peer rank: tests/distributed.rs"),
        ("recv", "needs a peer rank: tests/distributed.rs"),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..1500 {
        for f in &random_module(seed, 24).functions {
            for inst in f.walk_insts() {
                seen.insert(f.inst(inst).op.name());
            }
        }
    }
    let missing: Vec<&str> = (kiln::ir::Op::all_names().into_iter())
        .filter(|name| !seen.contains(name) && !NOT_DRAWN.iter().any(|(n, _)| n == name))
        .collect();
    assert!(missing.is_empty(), "never drawn: {missing:?}");
}

/// Values the backward kernels recompute (an activation's `x/√2` and `sigmoid`, recomputed in
/// a kernel of one pass; a layer norm's `x − mean`, in a kernel of several) give what the
/// stored values gave: the interpreter on the original program, on the optimised one, and
/// the compiled run agree.
#[test]
fn recomputed_values_agree() {
    let module = kiln::ir::parse_module(
        "module {
  func @f(%x: f32[32,16], %w: f32[16,16], %b: f32[16], %g: f32[32,16]) -> (f32[32,16], f32[32,16], f32[32,16]) {
    %h0 = matmul %x, %w : f32[32,16]
    %bb = broadcast %b : f32[32,16]
    %h = add %h0, %bb : f32[32,16]
    %c = const 0.70710677 : f32[32,16]
    %z = mul %h, %c : f32[32,16]
    %cdf = sigmoid %z : f32[32,16]
    %a = mul %h, %cdf : f32[32,16]
    %y = matmul %a, %w {transpose_b=true} : f32[32,16]
    %gy = mul %g, %y : f32[32,16]
    %dh = mul %gy, %cdf : f32[32,16]
    %dz = mul %dh, %z : f32[32,16]
    %mu = reduce_mean %y {axes=[1], keep_dims=true} : f32[32,1]
    %mub = broadcast %mu : f32[32,16]
    %d = sub %y, %mub : f32[32,16]
    %n = mul %d, %g : f32[32,16]
    %y2 = matmul %n, %w : f32[32,16]
    %s = reduce_sum %y2 {axes=[1], keep_dims=true} : f32[32,1]
    %sb = broadcast %s : f32[32,16]
    %t = mul %d, %sb : f32[32,16]
    %u = add %t, %d : f32[32,16]
    return %dz, %u, %y2
  }
}",
    )
    .unwrap();
    let mut optimised = module.clone();
    let reports = PassManager::pipeline("default")
        .unwrap()
        .run(&mut optimised)
        .unwrap();
    let fuse = reports.iter().rfind(|r| r.pass == "fuse").unwrap();
    assert_eq!(
        fuse.stats.get("values recomputed"),
        Some("3"),
        "{optimised}"
    );
    for seed in [41, 42] {
        assert_eq!(check_module(&module, seed).unwrap().compared, 1);
    }
}

/// Products reading and writing through views where axes have size 1 — a batch of one, one
/// head, one token — which a view may give any stride: the batch-1 encoder's `[1, T, K]`
/// seen as `[T, 1, K]` made a product of its `T` rows step by `T·K` (NaN, or a crash, where
/// the interpreter was right). Each shape of each pattern agrees with the interpreter.
#[test]
fn products_through_views_of_size_one_axes_agree() {
    let program = |b: usize, t: usize, h: usize| {
        let (d, k, m) = (3, h * 3, 5);
        format!(
            "module {{
  func @f(%x: f32[{b},{t},{k}], %w: f32[{k},{m}], %g: f32[{t},{b},{m}]) -> (f32[{t},{b},{m}], f32[{b},{t},{k}], f32[{k},{m}], f32[{b},{t},{m}], f32[{b},{h},{t},{t}]) {{
    %tx = transpose %x {{perm=[1, 0, 2]}} : f32[{t},{b},{k}]
    %y = matmul %tx, %w : f32[{t},{b},{m}]
    %x4 = reshape %x : f32[{b},{t},{h},{d}]
    %q = transpose %x4 {{perm=[0, 2, 1, 3]}} : f32[{b},{h},{t},{d}]
    %kt = transpose %x4 {{perm=[0, 2, 3, 1]}} : f32[{b},{h},{d},{t}]
    %s = matmul %q, %kt : f32[{b},{h},{t},{t}]
    %c = matmul %s, %q : f32[{b},{h},{t},{d}]
    %back = transpose %c {{perm=[0, 2, 1, 3]}} : f32[{b},{t},{h},{d}]
    %joined = reshape %back : f32[{b},{t},{k}]
    %rows = reshape %tx : f32[{bt},{k}]
    %grows = reshape %g : f32[{bt},{m}]
    %dw = matmul %rows, %grows {{transpose_a=true}} : f32[{k},{m}]
    %flat = reshape %x : f32[{bt},{k}]
    %z = matmul %flat, %w : f32[{bt},{m}]
    %z3 = reshape %z : f32[{b},{t},{m}]
    %s2 = matmul %q, %q {{transpose_b=true}} : f32[{b},{h},{t},{t}]
    return %y, %joined, %dw, %z3, %s2
  }}
}}",
            bt = b * t,
        )
    };
    for b in [1, 2, 5] {
        for t in [1, 4] {
            for h in [1, 2] {
                let text = program(b, t, h);
                let module = kiln::ir::parse_and_verify(&text)
                    .unwrap_or_else(|e| panic!("batch {b}, {t} tokens, {h} heads: {e}\n{text}"));
                let tally = check_module(&module, 31)
                    .unwrap_or_else(|e| panic!("batch {b}, {t} tokens, {h} heads: {e}"));
                assert_eq!(tally.compared, 1);
            }
        }
    }
}

#[test]
fn a_kernel_with_more_outputs_than_a_word_has_bits_agrees() {
    // A chain of 70 ops, each a result, fuses into one kernel of 70 outputs: the executor
    // once kept which outputs were written in place in a u64 and overflowed its shift.
    let n = 70;
    let mut body = String::new();
    let mut prev = "%x".to_string();
    for i in 0..n {
        let op = ["neg", "abs", "exp", "tanh"][i % 4];
        body += &format!("    %r{i} = {op} {prev} : f32[4,5]\n");
        prev = format!("%r{i}");
    }
    let results: Vec<String> = (0..n).map(|i| format!("%r{i}")).collect();
    let types = vec!["f32[4,5]"; n].join(", ");
    let text = format!(
        "module {{\n  func @f(%x: f32[4,5]) -> ({types}) {{\n{body}    return {}\n  }}\n}}",
        results.join(", ")
    );
    let module = kiln::ir::parse_and_verify(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let tally = check_module(&module, 7).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(tally.compared, 1);
    assert_eq!(tally.kernel_steps, 1, "the chain is one kernel");
}

/// A KV cache's update: `update_slice` writes over its state's own buffer (no copy of the
/// cache each step), and a run that fails after it — a gather past its table — leaves the
/// state as it was, the overwritten slice put back.
#[test]
fn update_slice_writes_over_its_state_and_a_failed_run_puts_the_slice_back() {
    let module = kiln::ir::parse_module(
        "module {
  state @cache : f32[2,3,4] = constant(value=0.5)
  func @f(%v: f32[2,4], %pos: i64, %table: f32[5,4], %at: i64[1]) -> f32[1,4] {
    %c = load @cache : f32[2,3,4]
    %u = update_slice %c, %v, %pos {axis=1} : f32[2,3,4]
    store @cache, %u
    %g = gather %table, %at {axis=0} : f32[1,4]
    return %g
  }
}",
    )
    .unwrap();
    let interp = Interpreter::new(&module);
    let executable = Executable::new(module.function("f").unwrap());
    let mut state = StateStore::initialize(&module).unwrap();
    let f32s = |shape: &[usize], value: f32| {
        Arc::new(Array::F32(ndarray::ArrayD::from_elem(shape, value)))
    };
    let i64s = |shape: &[usize], value: i64| {
        Arc::new(Array::I64(ndarray::ArrayD::from_elem(shape, value)))
    };
    let args = |pos: i64, at: i64| {
        vec![
            f32s(&[2, 4], pos as f32),
            i64s(&[], pos),
            f32s(&[5, 4], 1.0),
            i64s(&[1], at),
        ]
    };
    let cache = |state: &StateStore| state.get("cache").unwrap().to_f64_vec();
    let before = executable.stats().in_place;
    executable
        .run(args(1, 4), &mut state, &interp, false)
        .unwrap();
    assert_eq!(
        executable.stats().in_place,
        before + 1,
        "not over the state's buffer"
    );
    let mut want = vec![0.5; 24];
    for row in [4, 5, 6, 7, 16, 17, 18, 19] {
        want[row] = 1.0;
    }
    assert_eq!(cache(&state), want);
    let failed = executable.run(args(2, 9), &mut state, &interp, false);
    assert!(failed.unwrap_err().to_string().contains("gather"));
    assert_eq!(executable.stats().in_place, before + 2);
    assert_eq!(cache(&state), want, "the failed run changed the state");
    // The interpreter agrees on the run that succeeded.
    let mut fresh = StateStore::initialize(&module).unwrap();
    let args = args(1, 4).into_iter().map(|a| (*a).clone()).collect();
    interp.run("f", args, &mut fresh).unwrap();
    assert_eq!(cache(&fresh), want);
}
