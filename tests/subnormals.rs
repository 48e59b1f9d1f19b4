//! Subnormal floats in compiled runs: flushed to zero by default (results and operands), kept
//! as IEEE numbers with `Subnormals::Keep`; the interpreter never flushes; the caller's own
//! floating-point mode is restored after a run; a kernel split across threads flushes on
//! every thread. One test, because the policy is process-wide and tests run in parallel.

use kiln::backend::Array;
use kiln::backend::subnormals::{Subnormals, can_flush, set_subnormals, subnormals};
use kiln::ir::{DType, ReduceOp, Shape, Value};
use kiln::runtime::compare::mismatch;
use kiln::runtime::{Backend, Fetch, Program, RuntimeResult, Session};
use std::hint::black_box;

/// 2²⁰ elements in rows of 1024: enough for the kernel to split across the team's threads.
const LEN: usize = 1 << 20;
const SHAPE: [usize; 2] = [1024, 1024];
const RUNS: usize = 5;

/// `x·0.5` and `x + 1e-37`, each plus `0·max(x)` over its row: a row-wise kernel, whose
/// rows are split across the team's threads (a purely elementwise kernel is one long row).
fn programs() -> Vec<(Program, Value)> {
    let build = |f: &dyn Fn(&mut Program, Value) -> RuntimeResult<Value>| {
        let mut p = Program::new();
        let x = p.placeholder("x", DType::F32, Shape::fixed(&SHAPE))?;
        let y = f(&mut p, x)?;
        let max = p.reduce(ReduceOp::Max, x, vec![1], true)?;
        let zero = p.scalar(DType::F32, 0.0)?;
        let nothing = p.mul(max, zero)?;
        let y = p.add(y, nothing)?;
        RuntimeResult::Ok((p, y))
    };
    let halve = |p: &mut Program, x| {
        let half = p.scalar(DType::F32, 0.5)?;
        Ok(p.mul(x, half)?)
    };
    let add_normal = |p: &mut Program, x| {
        let c = p.scalar(DType::F32, 1e-37)?;
        Ok(p.add(x, c)?)
    };
    vec![build(&halve).unwrap(), build(&add_normal).unwrap()]
}

/// The result of the last of several runs (a helper thread that was parked at the first
/// spins between the later ones, so it takes part of the kernel's rows).
fn run(program: &Program, y: Value, backend: Backend, x: &Array) -> Array {
    let mut session = Session::new(program).unwrap().with_backend(backend);
    let mut out = Vec::new();
    for _ in 0..RUNS {
        out = session
            .run(&[Fetch::Value(y)], &[("x", x.clone())])
            .unwrap();
    }
    out.into_iter().next().unwrap()
}

/// A subnormal made from normal operands, through memory so that nothing folds it.
fn tiny_product() -> f32 {
    black_box(black_box(1e-20f32) * black_box(1e-20f32))
}

#[test]
fn compiled_runs_flush_subnormals_unless_asked_to_keep_them() {
    assert_eq!(
        subnormals(),
        Subnormals::Flush,
        "the default (KILN_SUBNORMALS unset)"
    );
    // Subnormal inputs: 1e-39 … 2e-39 (f32's smallest normal is 1.18e-38).
    let values: Vec<f32> = (0..LEN)
        .map(|i| 1e-39 * (1.0 + i as f32 / LEN as f32))
        .collect();
    assert!(values.iter().all(|v| v.is_subnormal()));
    let x = Array::F32(ndarray::ArrayD::from_shape_vec(SHAPE.to_vec(), values).unwrap());
    let [(halve, halved), (add, added)] = <[_; 2]>::try_from(programs()).ok().unwrap();

    for policy in [Subnormals::Flush, Subnormals::Keep] {
        set_subnormals(Some(policy));
        let flushes = policy == Subnormals::Flush && can_flush();
        let interpreted = run(&halve, halved, Backend::Interpreter, &x);
        let compiled = run(&halve, halved, Backend::Compiled, &x);
        assert!(
            tiny_product() > 0.0,
            "{policy:?}: the caller's mode is restored after a run"
        );
        let compiled_values = compiled.to_f64_vec();
        if flushes {
            // FTZ: every subnormal result written as zero, on every thread's part.
            assert!(compiled_values.iter().all(|&v| v == 0.0));
        } else {
            assert_eq!(
                compiled, interpreted,
                "{policy:?}: IEEE subnormals, bit for bit"
            );
        }
        assert!(
            interpreted.to_f64_vec().iter().all(|&v| v > 0.0),
            "the oracle never flushes"
        );
        // The comparison rule of every differential test: a flushed subnormal agrees.
        assert_eq!(
            mismatch(&interpreted, &compiled, Some(0.0)),
            None,
            "{policy:?}"
        );

        // DAZ: a subnormal operand is read as zero, so x + 1e-37 is exactly 1e-37.
        let interpreted = run(&add, added, Backend::Interpreter, &x);
        let compiled = run(&add, added, Backend::Compiled, &x);
        let exact = 1e-37f32 as f64;
        assert_eq!(
            compiled.to_f64_vec().iter().all(|&v| v == exact),
            flushes,
            "{policy:?}"
        );
        assert!(interpreted.to_f64_vec().iter().all(|&v| v > exact));
        assert_eq!(
            mismatch(&interpreted, &compiled, None),
            None,
            "{policy:?}: within f32's tolerance"
        );
    }
    set_subnormals(None);
}
