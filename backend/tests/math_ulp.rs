//! The f32 approximations of the ops' bodies (exp, log, tanh, sigmoid, erf, softplus),
//! measured in compiled kernels against the same functions computed in f64 and rounded to
//! f32, over a sweep of inputs. The maximum errors found are documented in
//! `backend/src/jit/bodies.rs` and the book's compiled-execution chapter; this test fails if a
//! change makes any of them worse.

use kiln_backend::Array;
use kiln_backend::jit::tile_program;
use kiln_backend::jit::{self, Path};
use kiln_ir::{DType, Dim, FunctionBuilder, Shape, Type, UnaryOp};
use ndarray::{ArrayD, IxDyn};

/// Distance in units in the last place between two finite f32s (or both infinite alike).
fn ulps(a: f32, b: f32) -> u64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        return 0;
    }
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    let ordered = |x: f32| {
        let bits = x.to_bits() as i32;
        if bits < 0 {
            i64::from(i32::MIN) - i64::from(bits)
        } else {
            i64::from(bits)
        }
    };
    ordered(a).abs_diff(ordered(b))
}

/// Inputs: an even grid over `[lo, hi]` and its neighbourhood of specials.
fn sweep(lo: f32, hi: f32, n: usize) -> Vec<f32> {
    let mut xs: Vec<f32> = (0..n)
        .map(|i| lo + (hi - lo) * i as f32 / (n - 1) as f32)
        .collect();
    xs.extend([
        0.0, -0.0, 1e-30, -1e-30, 1e-7, -1e-7, 1e-3, -1e-3, 0.5, -0.5, 1.0, -1.0,
    ]);
    xs.retain(|x| *x >= lo && *x <= hi);
    xs
}

/// Positive inputs spread over every binade from the smallest subnormal to the largest float.
fn log_sweep(n_per_binade: usize) -> Vec<f32> {
    let mut xs = Vec::new();
    for e in -149..128 {
        let base = 2f32.powi(e);
        for i in 0..n_per_binade {
            xs.push(base * (1.0 + i as f32 / n_per_binade as f32));
        }
    }
    xs.retain(|x| x.is_finite() && *x > 0.0);
    xs
}

fn run(op: UnaryOp, xs: &[f32]) -> Vec<f32> {
    // Cranelift's own code: the tile programs are held to its bits below.
    run_on(op, xs, Path::Cranelift)
}

fn run_on(op: UnaryOp, xs: &[f32], path: Path) -> Vec<f32> {
    let mut b = FunctionBuilder::new("k");
    let x = b.arg("x", Type::new(DType::F32, Shape(vec![Dim::sym("N")])));
    let y = b.unary(op, x).unwrap();
    let func = b.finish(&[y]).unwrap();
    let kernel = jit::kernel(&func).unwrap();
    let input = Array::F32(ArrayD::from_shape_vec(IxDyn(&[xs.len()]), xs.to_vec()).unwrap());
    match kernel.call_with(&[&input], path).unwrap().remove(0) {
        Array::F32(a) => a.iter().copied().collect(),
        _ => unreachable!(),
    }
}

struct Measured {
    max_ulps: u64,
    worst_input: f32,
    max_rel: f64,
}

fn measure(op: UnaryOp, xs: &[f32], exact: impl Fn(f64) -> f64, tiny: f64) -> Measured {
    let got = run(op, xs);
    let mut m = Measured {
        max_ulps: 0,
        worst_input: 0.0,
        max_rel: 0.0,
    };
    for (&x, &y) in xs.iter().zip(&got) {
        let want64 = exact(f64::from(x));
        let want = want64 as f32;
        // Below `tiny`, results are subnormal or flushed by the range clamps; ULPs there
        // measure nothing useful, so only the absolute error is bounded (by `tiny`).
        if want64.abs() < tiny {
            assert!(
                (f64::from(y) - want64).abs() <= tiny,
                "{}({x}) = {y}, want {want}",
                op.name()
            );
            continue;
        }
        let u = ulps(y, want);
        if u > m.max_ulps {
            m.max_ulps = u;
            m.worst_input = x;
        }
        if want64 != 0.0 && want64.is_finite() {
            m.max_rel = m.max_rel.max(((f64::from(y) - want64) / want64).abs());
        }
    }
    eprintln!(
        "{:8} max {:2} ulp (at x = {:e}), max relative error {:.2e} over {} inputs",
        op.name(),
        m.max_ulps,
        m.worst_input,
        m.max_rel,
        xs.len()
    );
    m
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        x.exp() / (1.0 + x.exp())
    }
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

#[test]
fn approximations_stay_within_their_documented_errors() {
    let n = 400_001;
    let tiny = f64::from(f32::MIN_POSITIVE);
    let exp = measure(UnaryOp::Exp, &sweep(-104.0, 88.7, n), f64::exp, tiny);
    let log = measure(UnaryOp::Log, &log_sweep(512), f64::ln, 0.0);
    let tanh = measure(UnaryOp::Tanh, &sweep(-10.0, 10.0, n), f64::tanh, 0.0);
    let sig = measure(UnaryOp::Sigmoid, &sweep(-80.0, 30.0, n), sigmoid, tiny);
    let erf = measure(UnaryOp::Erf, &sweep(-5.0, 5.0, n), libm::erf, 0.0);
    let softplus = measure(UnaryOp::Softplus, &sweep(-80.0, 30.0, n), softplus, tiny);
    // Bounds: the measured figures (see jit/bodies.rs), with one ULP of slack.
    assert!(exp.max_ulps <= 2, "exp: {} ulp", exp.max_ulps);
    assert!(log.max_ulps <= 2, "log: {} ulp", log.max_ulps);
    assert!(tanh.max_ulps <= 7, "tanh: {} ulp", tanh.max_ulps);
    assert!(sig.max_ulps <= 4, "sigmoid: {} ulp", sig.max_ulps);
    assert!(erf.max_ulps <= 7, "erf: {} ulp", erf.max_ulps);
    assert!(
        softplus.max_ulps <= 4,
        "softplus: {} ulp",
        softplus.max_ulps
    );
    for m in [&exp, &log, &tanh, &sig, &erf, &softplus] {
        assert!(m.max_rel <= 1e-6, "relative error {:e}", m.max_rel);
    }
}

/// Non-finite inputs, zeros, overflow and underflow, the smallest subnormal.
const SPECIALS: [f32; 8] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    100.0,
    -100.0,
    1e-45,
];

#[test]
fn special_values_match_the_standard_library() {
    let xs = SPECIALS;
    for (op, f) in [
        (UnaryOp::Exp, f32::exp as fn(f32) -> f32),
        (UnaryOp::Log, f32::ln),
        (UnaryOp::Tanh, f32::tanh),
    ] {
        for (x, y) in xs.iter().zip(run(op, &xs)) {
            let want = f(*x);
            assert!(
                (y.is_nan() && want.is_nan()) || y == want || ulps(y, want) <= 2,
                "{}({x}) = {y}, the standard library gives {want}",
                op.name()
            );
        }
    }
}

/// The tile programs at the ISA level in use give the Cranelift code's bits, so the errors
/// measured above hold for them too (`jit_ops`'s differential tests run at the lower levels).
#[test]
fn tile_programs_give_the_kernels_bits() {
    let n = 200_001;
    let specials = [&SPECIALS[..], &[-1e-45, f32::MAX, f32::MIN]].concat();
    let mut tested = Vec::new();
    for &op in UnaryOp::ALL {
        let transcendental = op.cost() == kiln_ir::Cost::Transcendental;
        if !transcendental || op.vector_form() != kiln_ir::VectorForm::F32x4 {
            continue;
        }
        let mut xs = match op {
            UnaryOp::Log => log_sweep(256),
            _ => sweep(-110.0, 90.0, n),
        };
        xs.extend(&specials);
        let want = run(op, &xs);
        let got = run_on(op, &xs, Path::Programs);
        for ((x, g), w) in xs.iter().zip(&got).zip(&want) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "{}({x}) in a tile program at {}: {g}, Cranelift's code gives {w}",
                op.name(),
                tile_program::isa().name()
            );
        }
        tested.push(op.name());
    }
    eprintln!(
        "tile programs at {} checked for {tested:?}",
        tile_program::isa().name()
    );
    assert_eq!(tested.len(), 6);
    if let Ok(expected) = std::env::var("KILN_EXPECT_ISA") {
        assert_eq!(tile_program::isa().name(), expected, "{expected} untested");
    }
}

/// The same at AVX2, in a child process whose `KILN_VECTOR_MATH` caps the level (the parent
/// runs at the best level the CPU has).
#[test]
fn tile_programs_at_avx2_give_the_kernels_bits() {
    let avx2 = tile_program::Isa::Avx2;
    if !avx2.supported() || tile_program::isa() == avx2 {
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(&exe)
        .args(["--exact", "tile_programs_give_the_kernels_bits"])
        .env("KILN_VECTOR_MATH", avx2.name())
        .env("KILN_EXPECT_ISA", avx2.name())
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "at avx2:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
