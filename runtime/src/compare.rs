//! Comparing two runs' values: how far apart they are, and a one-line summary of each. Shared
//! by `kiln diff` (interpreted against compiled) and [`crate::eager::diff`] (eager against
//! compiled).

use kiln_backend::Array;
use kiln_ir::DType;

/// The tolerance floats of `dtype` are compared with when none is given: a few hundred ulps of
/// f32 (kernels round in another order than the interpreter's f64 arithmetic), exact for
/// integers and bools.
pub fn default_tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        d if d.is_float() => 1e-2,
        _ => 0.0,
    }
}

/// How `b` differs from `a`, the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The largest absolute error (infinite where one side is not finite, or the types differ).
    pub max_abs: f64,
    /// The largest relative error, `|a − b| / |a|`.
    pub max_rel: f64,
    /// Where the largest absolute error is, and both values there.
    pub worst: Option<(Vec<usize>, f64, f64)>,
}

/// Whether `compiled` is `reference` flushed: zero where the reference is a subnormal of
/// `dtype` (below its smallest normal). Compiled runs flush subnormals by default
/// ([`kiln_backend::subnormals`]) and the interpreter never does, so every comparison of the
/// two takes this as agreement, whichever the policy — exactly, without a tolerance.
pub fn flushed_subnormal(dtype: DType, reference: f64, compiled: f64) -> bool {
    let smallest_normal = match dtype {
        DType::F32 => f32::MIN_POSITIVE as f64,
        DType::F64 => f64::MIN_POSITIVE,
        _ => return false,
    };
    compiled == 0.0 && reference.abs() < smallest_normal
}

/// `None` when `b` agrees with `a` (the reference) elementwise within
/// `|a − b| ≤ tol · (1 + |a|)` (`tol` by dtype when `None`), NaN matching NaN and a subnormal
/// matching its flushed zero ([`flushed_subnormal`]); else how far.
pub fn mismatch(a: &Array, b: &Array, tol: Option<f64>) -> Option<Mismatch> {
    if a.ty() != b.ty() {
        return Some(Mismatch {
            max_abs: f64::INFINITY,
            max_rel: f64::INFINITY,
            worst: None,
        });
    }
    let tol = tol.unwrap_or(default_tolerance(a.dtype()));
    let (xs, ys) = (a.to_f64_vec(), b.to_f64_vec());
    let (mut max_abs, mut max_rel, mut worst, mut differs) = (0.0f64, 0.0f64, None, false);
    for (i, (&x, &y)) in xs.iter().zip(&ys).enumerate() {
        if x == y || (x.is_nan() && y.is_nan()) || flushed_subnormal(a.dtype(), x, y) {
            continue;
        }
        // Unequal and not both finite (a NaN or infinity on one side): differ outright.
        let err = if x.is_finite() && y.is_finite() {
            (x - y).abs()
        } else {
            f64::INFINITY
        };
        differs |= err > tol * (1.0 + x.abs()) || err == f64::INFINITY;
        max_rel = max_rel.max(err / x.abs());
        if err > max_abs || worst.is_none() {
            max_abs = err;
            worst = Some((i, x, y));
        }
    }
    differs.then(|| Mismatch {
        max_abs,
        max_rel,
        worst: worst.map(|(i, x, y)| (unravel(i, a.shape()), x, y)),
    })
}

/// The multi-index of flat (row-major) index `i`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (k, &n) in shape.iter().enumerate().rev() {
        if n > 0 {
            index[k] = i % n;
            i /= n;
        }
    }
    index
}

/// How many elements of `a` are NaN and how many infinite.
pub fn non_finite(a: &Array) -> (usize, usize) {
    if !a.dtype().is_float() {
        return (0, 0);
    }
    let xs = a.to_f64_vec();
    let nan = xs.iter().filter(|x| x.is_nan()).count();
    let inf = xs.iter().filter(|x| x.is_infinite()).count();
    (nan, inf)
}

/// `f32[2,3] min -1 max 2.5 mean 0.31`, with NaN and infinity counts when there are any.
pub fn summary(a: &Array) -> String {
    let xs = a.to_f64_vec();
    let finite: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    let mut out = a.ty().to_string();
    if let (Some(min), Some(max)) = (
        finite.iter().copied().reduce(f64::min),
        finite.iter().copied().reduce(f64::max),
    ) {
        let mean = finite.iter().sum::<f64>() / finite.len() as f64;
        out += &format!(" min {min:.6} max {max:.6} mean {mean:.6}");
    }
    let (nan, inf) = non_finite(a);
    if nan > 0 {
        out += &format!(", {nan} NaN");
    }
    if inf > 0 {
        out += &format!(", {inf} infinite");
    }
    out
}
