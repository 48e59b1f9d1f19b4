//! Each f32 op's vector body, written once over [`Lanes`].
//!
//! A body is a branch-free sequence of lane operations — adds, fused multiply-adds, compares,
//! selects, bit casts, integer shifts. Two implementations of [`Lanes`] compile it:
//!
//! - [`Scalar`], plain `f32` arithmetic, `#[inline(always)]`: inside the tile-program runner's
//!   loops, compiled under `#[target_feature]`, LLVM vectorises the body at the ISA's width —
//!   16 lanes on AVX-512, 8 on AVX2 ([`crate::jit::tile_program`], long rows);
//! - Cranelift's values (`jit/codegen/clif.rs`), which emit the same operations inline into
//!   a kernel on f32x4 lanes or on scalars (short rows, row tails, and f64, whose cheap ops
//!   use the same bodies).
//!
//! Every step is an exactly rounded IEEE operation or a bit operation, so the two compiled
//! forms give the same bits by construction — but for a NaN's sign and payload: `fmax`/`fmin`
//! are the one pair whose meaning is Cranelift's x86 lowering, which [`Scalar`] spells out
//! for f32x4 lanes (NaN payload cleared), while Cranelift's scalar sequence (row tails) passes
//! an operand's NaN on.
//!
//! The approximations, and their maximum errors against the f64 function rounded to f32
//! (measured over sweeps of 130k–400k inputs by `backend/tests/math_ulp.rs`, which fails if
//! any gets worse):
//!
//! | function | method | max ULPs | max relative error | range swept |
//! |---|---|---|---|---|
//! | exp | `x = n·ln2 + r` (Cody–Waite), Cephes' degree-6 polynomial, `2ⁿ` in two halves | 1 | 1.2e-7 | [−104, 88.7] (subnormal results included) |
//! | log | Cephes' `logf`: mantissa in `[√½, √2)`, degree-9 polynomial, subnormals scaled | 1 | 7.5e-8 | every binade |
//! | tanh | Eigen's and XLA's rational form on `|x| ≤ 7.9` | 6 | 3.4e-7 | [−10, 10] |
//! | sigmoid | `1 / (1 + exp(−x))` | 3 | 1.8e-7 | [−80, 30] |
//! | erf | XLA's rational form on `|x| ≤ 4` | 6 | 3.7e-7 | [−5, 5] |
//! | softplus | `max(x, 0) + log1p(exp(−|x|))` | 3 | 2.4e-7 | [−80, 30] (subnormal results included) |
//!
//! `sin`, `cos` and `pow` have no body here, and on f64 every transcendental calls its helper
//! instead of its body: kernels call the interpreter's own scalar function by symbol.

use kiln_ir::{BinaryOp, UnaryOp};

/// A float comparison; the `OrNan` forms also hold when either side is NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cmp {
    Lt,
    Gt,
    Eq,
    LtOrNan,
    GtOrNan,
}

/// The operations an op's body is written in: `F` lanes of f32, `I` lanes of i32, `M` a
/// comparison's mask.
pub(crate) trait Lanes {
    type F: Copy;
    type I: Copy;
    type M: Copy;

    fn f(&mut self, x: f32) -> Self::F;
    fn i(&mut self, x: i32) -> Self::I;

    fn add(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn sub(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(&mut self, a: Self::F, b: Self::F) -> Self::F;
    fn div(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c`, rounded once.
    fn fma(&mut self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    fn neg(&mut self, a: Self::F) -> Self::F;
    fn abs(&mut self, a: Self::F) -> Self::F;
    /// `a`'s magnitude with `sign`'s sign bit.
    fn copysign(&mut self, a: Self::F, sign: Self::F) -> Self::F;
    fn sqrt(&mut self, a: Self::F) -> Self::F;
    fn floor(&mut self, a: Self::F) -> Self::F;
    fn ceil(&mut self, a: Self::F) -> Self::F;
    /// To the nearest integer, ties to even.
    fn round(&mut self, a: Self::F) -> Self::F;
    /// Cranelift's `fmax`: the larger, `+0` over `−0`, NaN if either is.
    fn max(&mut self, a: Self::F, b: Self::F) -> Self::F;
    /// Cranelift's `fmin`: the smaller, `−0` under `+0`, NaN if either is.
    fn min(&mut self, a: Self::F, b: Self::F) -> Self::F;

    fn cmp(&mut self, cmp: Cmp, a: Self::F, b: Self::F) -> Self::M;
    fn either(&mut self, a: Self::M, b: Self::M) -> Self::M;
    /// `m ? a : b`.
    fn select(&mut self, m: Self::M, a: Self::F, b: Self::F) -> Self::F;
    /// `m ? a : b` on integer lanes.
    fn select_int(&mut self, m: Self::M, a: Self::I, b: Self::I) -> Self::I;

    fn bits(&mut self, a: Self::F) -> Self::I;
    fn float_of_bits(&mut self, a: Self::I) -> Self::F;
    /// The integer's value as a float.
    fn convert_int(&mut self, a: Self::I) -> Self::F;
    fn iadd(&mut self, a: Self::I, b: Self::I) -> Self::I;
    fn isub(&mut self, a: Self::I, b: Self::I) -> Self::I;
    fn and(&mut self, a: Self::I, b: Self::I) -> Self::I;
    fn or(&mut self, a: Self::I, b: Self::I) -> Self::I;
    fn shl(&mut self, a: Self::I, n: u8) -> Self::I;
    /// Arithmetic shift right.
    fn sar(&mut self, a: Self::I, n: u8) -> Self::I;
    /// Logical shift right.
    fn shr(&mut self, a: Self::I, n: u8) -> Self::I;
}

/// `op` on f32 lanes; `None` for the ops with no f32 body (helper calls and `not`).
#[inline(always)]
pub(crate) fn unary<L: Lanes>(l: &mut L, op: UnaryOp, x: L::F) -> Option<L::F> {
    Some(match op {
        UnaryOp::Neg => l.neg(x),
        UnaryOp::StopGradient => x,
        UnaryOp::Abs => l.abs(x),
        UnaryOp::Sqrt => l.sqrt(x),
        UnaryOp::Floor => l.floor(x),
        UnaryOp::Ceil => l.ceil(x),
        UnaryOp::Round => l.round(x),
        UnaryOp::Recip => {
            let one = l.f(1.0);
            l.div(one, x)
        }
        UnaryOp::Rsqrt => {
            let s = l.sqrt(x);
            let one = l.f(1.0);
            l.div(one, s)
        }
        UnaryOp::Relu => {
            // `x` where above zero or NaN, else `+0`.
            let zero = l.f(0.0);
            let keep = l.cmp(Cmp::GtOrNan, x, zero);
            l.select(keep, x, zero)
        }
        UnaryOp::Sign => sign(l, x),
        UnaryOp::Exp => exp(l, x),
        UnaryOp::Log => log(l, x),
        UnaryOp::Tanh => tanh(l, x),
        UnaryOp::Sigmoid => {
            let neg = l.neg(x);
            let e = exp(l, neg);
            let one = l.f(1.0);
            let d = l.add(one, e);
            l.div(one, d)
        }
        UnaryOp::Softplus => softplus(l, x),
        UnaryOp::Erf => clamped_odd_rational(l, x, ERF_BOUND, &ERF_P, &ERF_Q),
        UnaryOp::Sin | UnaryOp::Cos | UnaryOp::Not => return None,
    })
}

/// `op` on f32 lanes; `None` for the ops with no f32 body (`pow` and the bool ops).
#[inline(always)]
pub(crate) fn binary<L: Lanes>(l: &mut L, op: BinaryOp, x: L::F, y: L::F) -> Option<L::F> {
    Some(match op {
        BinaryOp::Add => l.add(x, y),
        BinaryOp::Sub => l.sub(x, y),
        BinaryOp::Mul => l.mul(x, y),
        BinaryOp::Div => l.div(x, y),
        BinaryOp::Max => l.max(x, y),
        BinaryOp::Min => l.min(x, y),
        BinaryOp::Pow | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => return None,
    })
}

/// `±1` by `x`'s sign bit where `x` is nonzero, else `x` (zeros and NaN kept).
#[inline(always)]
fn sign<L: Lanes>(l: &mut L, x: L::F) -> L::F {
    let zero = l.f(0.0);
    let below = l.cmp(Cmp::Lt, x, zero);
    let above = l.cmp(Cmp::Gt, x, zero);
    let nonzero = l.either(below, above);
    let one = l.f(1.0);
    let signed_one = l.copysign(one, x);
    l.select(nonzero, signed_one, x)
}

/// Adding it rounds to an integer in the low bits (1.5·2²³).
const MAGIC: f32 = 12_582_912.0;
/// Below it `eˣ` rounds to zero; down to it the result is subnormal.
const EXP_LO: f32 = -103.972_08;
/// Above it `eˣ` overflows.
const EXP_HI: f32 = 88.722_84;
/// `ln 2` in two parts (Cody–Waite): the high part exact in few bits.
const LN2_HI: f32 = 0.693_359_4;
/// The rest of `ln 2` (subtracted from the high part).
const LN2_LO: f32 = 2.121_944_4e-4;
/// Cephes' degree-6 minimax polynomial for `eʳ` (Horner, highest degree first).
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];
/// Cephes' `logf` polynomial.
const LOG_POLY: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];
/// Beyond it tanh is ±1 to within 5 ULPs.
const TANH_BOUND: f32 = 7.905_311;
/// Below it tanh(x) = x to within rounding.
const TANH_TINY: f32 = 4e-4;
/// Eigen's (and XLA's) rational tanh: odd numerator, even denominator, in `x²`.
const TANH_P: [f32; 7] = [
    -2.760_768_5e-16,
    2.000_188e-13,
    -8.604_672e-11,
    5.122_297e-8,
    1.485_722_4e-5,
    6.372_619_4e-4,
    4.893_524_6e-3,
];
/// The denominator of [`TANH_P`].
const TANH_Q: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3];
/// XLA's rational erf, on `|x| ≤ 4`.
const ERF_BOUND: f32 = 4.0;
/// The numerator of XLA's erf.
const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906_3e-4,
    -2.954_6e-3,
    -1.609_603_3e-2,
];
/// The denominator of XLA's erf.
const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329_3e-3,
    -1.426_474e-2,
];

/// `x` limited to `[lo, hi]`, NaN kept: a compare and a select each way (one `maxps` /
/// `minps`, where `fmax`/`fmin` take an 8-instruction sequence on x86).
#[inline(always)]
fn clamp<L: Lanes>(l: &mut L, x: L::F, lo: L::F, hi: L::F) -> L::F {
    let below = l.cmp(Cmp::Lt, x, lo);
    let x = l.select(below, lo, x);
    let above = l.cmp(Cmp::Gt, x, hi);
    l.select(above, hi, x)
}

/// `Σ coeffs[i]·xⁿ⁻ⁱ` by Horner's rule with fused multiply-adds, highest degree first.
#[inline(always)]
fn horner<L: Lanes>(l: &mut L, x: L::F, coeffs: &[f32]) -> L::F {
    let mut acc = l.f(coeffs[0]);
    for &k in &coeffs[1..] {
        let k = l.f(k);
        acc = l.fma(acc, x, k);
    }
    acc
}

/// `eˣ`.
#[inline(always)]
fn exp<L: Lanes>(l: &mut L, x: L::F) -> L::F {
    let (lo, hi) = (l.f(EXP_LO), l.f(EXP_HI));
    let clamped = clamp(l, x, lo, hi);
    let (log2e, magic) = (l.f(std::f32::consts::LOG2_E), l.f(MAGIC));
    let t = l.fma(clamped, log2e, magic);
    let n = l.sub(t, magic);
    let (ln2_hi, ln2_lo) = (l.f(-LN2_HI), l.f(LN2_LO));
    let r = l.fma(n, ln2_hi, clamped);
    let r = l.fma(n, ln2_lo, r);
    let poly = horner(l, r, &EXP_POLY);
    let r2 = l.mul(r, r);
    let one = l.f(1.0);
    let r_plus_one = l.add(r, one);
    let p = l.fma(poly, r2, r_plus_one);
    // 2ⁿ as 2^(n>>1) · 2^(n − n>>1), each built in the exponent bits, so that `n` may reach
    // either end of the range.
    let ti = l.bits(t);
    let magic_bits = l.i(MAGIC.to_bits() as i32);
    let ni = l.isub(ti, magic_bits);
    let half = l.sar(ni, 1);
    let rest = l.isub(ni, half);
    let bias = l.i(127);
    let e1 = l.iadd(half, bias);
    let e1 = l.shl(e1, 23);
    let e2 = l.iadd(rest, bias);
    let e2 = l.shl(e2, 23);
    let (s1, s2) = (l.float_of_bits(e1), l.float_of_bits(e2));
    let y = l.mul(p, s1);
    let y = l.mul(y, s2);
    // Beyond the largest finite result infinity, below the smallest subnormal zero.
    let inf = l.f(f32::INFINITY);
    let over = l.cmp(Cmp::Gt, x, hi);
    let y = l.select(over, inf, y);
    let zero = l.f(0.0);
    let under = l.cmp(Cmp::Lt, x, lo);
    l.select(under, zero, y)
}

/// The natural logarithm.
#[inline(always)]
fn log<L: Lanes>(l: &mut L, x: L::F) -> L::F {
    // Subnormals: scaled into the normal range first.
    let min_normal = l.f(f32::MIN_POSITIVE);
    let tiny = l.cmp(Cmp::Lt, x, min_normal);
    let scale = l.f(8_388_608.0); // 2²³
    let scaled = l.mul(x, scale);
    let xs = l.select(tiny, scaled, x);
    let (zero_i, shift_i) = (l.i(0), l.i(23));
    let pre = l.select_int(tiny, shift_i, zero_i);
    let bits = l.bits(xs);
    let exp_bits = l.shr(bits, 23);
    let mask = l.i(0xff);
    let exp_bits = l.and(exp_bits, mask);
    let bias = l.i(126);
    let e = l.isub(exp_bits, bias);
    let e = l.isub(e, pre);
    let mant_mask = l.i(0x807f_ffff_u32 as i32);
    let half_bits = l.i(0x3f00_0000);
    let m = l.and(bits, mant_mask);
    let m = l.or(m, half_bits);
    let m = l.float_of_bits(m); // in [0.5, 1)
    let ef = l.convert_int(e);
    let sqrt_half = l.f(std::f32::consts::FRAC_1_SQRT_2);
    let small = l.cmp(Cmp::Lt, m, sqrt_half);
    let one = l.f(1.0);
    let ef_minus = l.sub(ef, one);
    let ef = l.select(small, ef_minus, ef);
    let m2 = l.add(m, m);
    let m_small = l.sub(m2, one);
    let m_big = l.sub(m, one);
    let m = l.select(small, m_small, m_big);
    let z = l.mul(m, m);
    let poly = horner(l, m, &LOG_POLY);
    let y = l.mul(poly, m);
    let y = l.mul(y, z);
    let c1 = l.f(-LN2_LO);
    let y = l.fma(ef, c1, y);
    let half = l.f(-0.5);
    let y = l.fma(z, half, y);
    let r = l.add(m, y);
    let c2 = l.f(LN2_HI);
    let r = l.fma(ef, c2, r);
    // Special values: log(0) = −∞, log(x < 0) = NaN, log(∞) = ∞, NaN stays NaN.
    let zero = l.f(0.0);
    let (neg_inf, nan, inf) = (l.f(f32::NEG_INFINITY), l.f(f32::NAN), l.f(f32::INFINITY));
    let is_zero = l.cmp(Cmp::Eq, x, zero);
    let r = l.select(is_zero, neg_inf, r);
    let negative = l.cmp(Cmp::LtOrNan, x, zero);
    let r = l.select(negative, nan, r);
    let is_inf = l.cmp(Cmp::Eq, x, inf);
    l.select(is_inf, inf, r)
}

/// `c·P(c²) / Q(c²)` with `c` = `x` clamped to `±bound`: the odd rational form of tanh and
/// erf (Horner coefficients, highest degree first).
#[inline(always)]
fn clamped_odd_rational<L: Lanes>(l: &mut L, x: L::F, bound: f32, p: &[f32], q: &[f32]) -> L::F {
    let (lo, hi) = (l.f(-bound), l.f(bound));
    let c = clamp(l, x, lo, hi);
    let x2 = l.mul(c, c);
    let p = horner(l, x2, p);
    let p = l.mul(p, c);
    let q = horner(l, x2, q);
    l.div(p, q)
}

/// The hyperbolic tangent.
#[inline(always)]
fn tanh<L: Lanes>(l: &mut L, x: L::F) -> L::F {
    let r = clamped_odd_rational(l, x, TANH_BOUND, &TANH_P, &TANH_Q);
    // Near zero tanh(x) = x to within rounding, and the rational form loses the low bits.
    let ax = l.abs(x);
    let tiny = l.f(TANH_TINY);
    let small = l.cmp(Cmp::Lt, ax, tiny);
    let r = l.select(small, x, r);
    // Beyond the clamp, ±1 (within 5 ULPs of the true value there; exact from |x| ≥ 9.01).
    let hi = l.f(TANH_BOUND);
    let big = l.cmp(Cmp::Gt, ax, hi);
    let one = l.f(1.0);
    let signed_one = l.copysign(one, x);
    l.select(big, signed_one, r)
}

/// `max(x, 0) + log1p(exp(−|x|))`, with `log1p(e) = log(u)·e/(u − 1)` for `u = 1 + e` (exact
/// where `u` rounds to 1), so that small tails keep their precision.
#[inline(always)]
fn softplus<L: Lanes>(l: &mut L, x: L::F) -> L::F {
    let (zero, one) = (l.f(0.0), l.f(1.0));
    let pos = l.max(x, zero);
    let a = l.abs(x);
    let na = l.neg(a);
    let e = exp(l, na);
    let u = l.add(one, e);
    let lu = log(l, u);
    let um1 = l.sub(u, one);
    let ratio = l.div(e, um1);
    let scaled = l.mul(lu, ratio);
    let exact = l.cmp(Cmp::Eq, u, one);
    let log1p = l.select(exact, e, scaled);
    l.add(pos, log1p)
}

/// Plain `f32` arithmetic: what the tile-program runner compiles (and LLVM vectorises) the
/// bodies as.
pub(crate) struct Scalar;

/// x86's `maxps x, y`: `y` unless `x > y` (so `y` on NaN and on equal zeros).
#[inline(always)]
fn maxps(x: f32, y: f32) -> f32 {
    if x > y { x } else { y }
}

#[inline(always)]
fn minps(x: f32, y: f32) -> f32 {
    if x < y { x } else { y }
}

/// The bits below a NaN's quiet bit, where `is_nan` (as an all-ones mask shifted right by 10).
#[inline(always)]
fn nan_fraction(is_nan: bool) -> u32 {
    if is_nan { u32::MAX >> 10 } else { 0 }
}

impl Lanes for Scalar {
    type F = f32;
    type I = i32;
    type M = bool;

    #[inline(always)]
    fn f(&mut self, x: f32) -> f32 {
        x
    }
    #[inline(always)]
    fn i(&mut self, x: i32) -> i32 {
        x
    }
    #[inline(always)]
    fn add(&mut self, a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    fn sub(&mut self, a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    fn mul(&mut self, a: f32, b: f32) -> f32 {
        a * b
    }
    #[inline(always)]
    fn div(&mut self, a: f32, b: f32) -> f32 {
        a / b
    }
    #[inline(always)]
    fn fma(&mut self, a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    fn neg(&mut self, a: f32) -> f32 {
        -a
    }
    #[inline(always)]
    fn abs(&mut self, a: f32) -> f32 {
        a.abs()
    }
    #[inline(always)]
    fn copysign(&mut self, a: f32, sign: f32) -> f32 {
        a.copysign(sign)
    }
    #[inline(always)]
    fn sqrt(&mut self, a: f32) -> f32 {
        a.sqrt()
    }
    #[inline(always)]
    fn floor(&mut self, a: f32) -> f32 {
        a.floor()
    }
    #[inline(always)]
    fn ceil(&mut self, a: f32) -> f32 {
        a.ceil()
    }
    #[inline(always)]
    fn round(&mut self, a: f32) -> f32 {
        a.round_ties_even()
    }
    /// Cranelift's `fmax.f32x4` on x86, step for step (the NaN's payload cleared).
    #[inline(always)]
    fn max(&mut self, x: f32, y: f32) -> f32 {
        let (m1, m2) = (maxps(x, y), maxps(y, x));
        let xor = m1.to_bits() ^ m2.to_bits();
        let blended = f32::from_bits(m1.to_bits() | xor);
        let positive = blended - f32::from_bits(xor);
        f32::from_bits(positive.to_bits() & !nan_fraction(blended.is_nan()))
    }
    /// Cranelift's `fmin.f32x4` on x86, step for step.
    #[inline(always)]
    fn min(&mut self, x: f32, y: f32) -> f32 {
        let (m1, m2) = (minps(x, y), minps(y, x));
        let or = m1.to_bits() | m2.to_bits();
        let is_nan = f32::from_bits(or).is_nan() || m2.is_nan();
        let or = or | if is_nan { u32::MAX } else { 0 };
        f32::from_bits(or & !nan_fraction(is_nan))
    }
    #[inline(always)]
    fn cmp(&mut self, cmp: Cmp, a: f32, b: f32) -> bool {
        match cmp {
            Cmp::Lt => a < b,
            Cmp::Gt => a > b,
            Cmp::Eq => a == b,
            Cmp::LtOrNan => a < b || a.is_nan() || b.is_nan(),
            Cmp::GtOrNan => a > b || a.is_nan() || b.is_nan(),
        }
    }
    #[inline(always)]
    fn either(&mut self, a: bool, b: bool) -> bool {
        a | b
    }
    #[inline(always)]
    fn select(&mut self, m: bool, a: f32, b: f32) -> f32 {
        if m { a } else { b }
    }
    #[inline(always)]
    fn select_int(&mut self, m: bool, a: i32, b: i32) -> i32 {
        if m { a } else { b }
    }
    #[inline(always)]
    fn bits(&mut self, a: f32) -> i32 {
        a.to_bits() as i32
    }
    #[inline(always)]
    fn float_of_bits(&mut self, a: i32) -> f32 {
        f32::from_bits(a as u32)
    }
    #[inline(always)]
    fn convert_int(&mut self, a: i32) -> f32 {
        a as f32
    }
    #[inline(always)]
    fn iadd(&mut self, a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn isub(&mut self, a: i32, b: i32) -> i32 {
        a.wrapping_sub(b)
    }
    #[inline(always)]
    fn and(&mut self, a: i32, b: i32) -> i32 {
        a & b
    }
    #[inline(always)]
    fn or(&mut self, a: i32, b: i32) -> i32 {
        a | b
    }
    #[inline(always)]
    fn shl(&mut self, a: i32, n: u8) -> i32 {
        a.wrapping_shl(u32::from(n))
    }
    #[inline(always)]
    fn sar(&mut self, a: i32, n: u8) -> i32 {
        a >> n
    }
    #[inline(always)]
    fn shr(&mut self, a: i32, n: u8) -> i32 {
        ((a as u32) >> n) as i32
    }
}

/// `op`'s f32 body on one value (NaN for an op with none: callers never pass one).
#[inline(always)]
pub(crate) fn unary_f32(op: UnaryOp, x: f32) -> f32 {
    unary(&mut Scalar, op, x).unwrap_or(f32::NAN)
}

/// `op`'s f32 body on one pair (NaN for an op with none: callers never pass one).
#[inline(always)]
pub(crate) fn binary_f32(op: BinaryOp, x: f32, y: f32) -> f32 {
    binary(&mut Scalar, op, x, y).unwrap_or(f32::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_min_relu_and_sign_follow_cranelifts_x86_code() {
        let (max, min) = (BinaryOp::Max, BinaryOp::Min);
        assert_eq!(binary_f32(max, -0.0, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(binary_f32(max, 0.0, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(binary_f32(min, -0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(binary_f32(min, 0.0, -0.0).to_bits(), (-0.0f32).to_bits());
        for op in [max, min] {
            assert!(binary_f32(op, f32::NAN, 1.0).is_nan());
            assert!(binary_f32(op, 1.0, f32::NAN).is_nan());
        }
        assert_eq!(binary_f32(max, 2.0, -3.0), 2.0);
        assert_eq!(binary_f32(min, 2.0, -3.0), -3.0);
        assert_eq!(unary_f32(UnaryOp::Relu, -0.0).to_bits(), 0.0f32.to_bits());
        assert!(unary_f32(UnaryOp::Relu, f32::NAN).is_nan());
        assert_eq!(unary_f32(UnaryOp::Sign, -2.5), -1.0);
        assert_eq!(
            unary_f32(UnaryOp::Sign, -0.0).to_bits(),
            (-0.0f32).to_bits()
        );
    }
}
