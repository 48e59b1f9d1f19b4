//! Vector math: the ISA level tile programs run at, and the scalar bodies of exp, log, tanh,
//! sigmoid, softplus and erf that they vectorise — what compiled kernels compute these
//! functions with on f32, the way XLA's CPU backend calls its vectorised runtime functions.
//!
//! Each function is written once, as a branch-free scalar body ([`scalar`]). Inlined into the
//! tile-program runner compiled for a level (`#[target_feature]`), LLVM vectorises it at the
//! level's width (16 lanes on AVX-512, 8 on AVX2, 4 at the baseline), and since every step is
//! an exactly rounded IEEE operation (fused multiply-adds included), every level gives the
//! same bits — which the tests check, besides the ULP bounds.
//!
//! - `exp`: range reduction `x = n·ln2 + r` (n by rounding `x·log2 e` with the add-magic-number
//!   trick), Cephes' degree-6 minimax polynomial for `eʳ`, and `2ⁿ` built in the exponent bits
//!   (in two halves, so `n` may reach either end of the range).
//! - `log`: Cephes' `logf` — mantissa in `[√½, √2)`, a degree-9 polynomial; denormals scaled.
//! - `tanh`: Eigen's rational approximation on `|x| ≤ 7.9` (odd degree-13 over even degree-6).
//! - `sigmoid`: `1 / (1 + exp(−x))`, with the `exp` above.
//! - `erf`: XLA's rational approximation on `|x| ≤ 4`.
//! - `softplus`: `max(x, 0) + log1p(exp(−|x|))` with the `exp` and `log` above.
//!
//! Maximum errors against the f64 function rounded to f32, measured over sweeps of 130k–400k
//! inputs by `backend/tests/math_ulp.rs` (which fails if any gets worse):
//!
//! | function | max ULPs | max relative error | range swept |
//! |---|---|---|---|
//! | exp | 1 | 1.2e-7 | [−104, 88.7] (subnormal results included) |
//! | log | 1 | 7.5e-8 | every binade, subnormals to the largest float |
//! | tanh | 6 | 3.4e-7 | [−10, 10] |
//! | sigmoid | 3 | 1.8e-7 | [−80, 30] |
//! | erf | 6 | 3.7e-7 | [−5, 5] |
//! | softplus | 3 | 2.4e-7 | [−80, 30] (subnormal results included) |
//!
//! tanh and erf use the same rational forms as XLA (what `jax.jit` runs on the CPU). Where a
//! kernel computes one of these one element at a time (a group that is not vectorised, f64),
//! it calls the interpreter's own scalar function by symbol (`jit/helpers.rs`).
//!
//! The level is detected once per process; `KILN_VECTOR_MATH` = `avx512`, `avx2` or `base`
//! caps it, for debugging (a level the CPU lacks is never used).

use kiln_ir::UnaryOp;
use std::sync::OnceLock;

/// The instruction-set level tile programs are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The target's baseline: 128-bit vectors (SSE2 on x86-64), without fused multiply-add
    /// instructions (each is a call to `fmaf`, which is slow but gives the same bits).
    Base,
    /// 256-bit vectors with fused multiply-add.
    Avx2,
    /// 512-bit vectors.
    Avx512,
}

impl Isa {
    /// The level's name, as `KILN_VECTOR_MATH` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Base => "base",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Base, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the level's code.
    pub fn supported(self) -> bool {
        match self {
            Isa::Base => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The level in use: the best the CPU has, capped by `KILN_VECTOR_MATH` (read once).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = match std::env::var("KILN_VECTOR_MATH").as_deref() {
            Ok("base") => Isa::Base,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        (Isa::ALL.into_iter())
            .filter(|&i| i <= cap && i.supported())
            .max()
            .unwrap_or(Isa::Base)
    })
}

/// Applies `op` to `data` as a kernel's tile program at level `isa` would; false if the CPU
/// lacks the level or the op has no vector body.
pub fn apply(op: UnaryOp, isa: Isa, data: &mut [f32]) -> bool {
    crate::tile_program::apply_unary(op, isa, data)
}

/// The scalar bodies (methods and measured errors above). Branch-free, so that LLVM vectorises a loop over
/// them.
pub mod scalar {
    // The approximations' constants.
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

    #[inline(always)]
    fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
        let x = if x < lo { lo } else { x };
        if x > hi { hi } else { x }
    }

    #[inline(always)]
    fn horner(x: f32, coeffs: &[f32]) -> f32 {
        let mut acc = coeffs[0];
        for &k in &coeffs[1..] {
            acc = acc.mul_add(x, k);
        }
        acc
    }

    /// `eˣ`.
    #[inline(always)]
    pub fn exp(x: f32) -> f32 {
        let c = clamp(x, EXP_LO, EXP_HI);
        let t = c.mul_add(std::f32::consts::LOG2_E, MAGIC);
        let n = t - MAGIC;
        let r = n.mul_add(-LN2_HI, c);
        let r = n.mul_add(LN2_LO, r);
        let poly = horner(r, &EXP_POLY);
        let p = poly.mul_add(r * r, r + 1.0);
        let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
        let half = ni >> 1;
        let rest = ni.wrapping_sub(half);
        let s1 = f32::from_bits((half.wrapping_add(127) << 23) as u32);
        let s2 = f32::from_bits((rest.wrapping_add(127) << 23) as u32);
        let y = p * s1 * s2;
        let y = if x > EXP_HI { f32::INFINITY } else { y };
        if x < EXP_LO { 0.0 } else { y }
    }

    /// The natural logarithm.
    #[inline(always)]
    pub fn log(x: f32) -> f32 {
        let tiny = x < f32::MIN_POSITIVE;
        let xs = if tiny { x * 8_388_608.0 } else { x };
        let pre = if tiny { 23 } else { 0 };
        let bits = xs.to_bits() as i32;
        let e = ((bits as u32 >> 23) as i32 & 0xff) - 126 - pre;
        let m = f32::from_bits(((bits & 0x807f_ffff_u32 as i32) | 0x3f00_0000) as u32);
        let small = m < std::f32::consts::FRAC_1_SQRT_2;
        let ef = e as f32;
        let ef = if small { ef - 1.0 } else { ef };
        let m = if small { (m + m) - 1.0 } else { m - 1.0 };
        let z = m * m;
        let poly = horner(m, &LOG_POLY);
        let y = poly * m * z;
        let y = ef.mul_add(-LN2_LO, y);
        let y = z.mul_add(-0.5, y);
        let r = ef.mul_add(LN2_HI, m + y);
        let r = if x == 0.0 { f32::NEG_INFINITY } else { r };
        // Below zero or NaN (unordered): NaN.
        let r = if x < 0.0 || x.is_nan() { f32::NAN } else { r };
        if x == f32::INFINITY { f32::INFINITY } else { r }
    }

    /// `c·P(c²) / Q(c²)` with `c` = `x` clamped to `±bound`.
    #[inline(always)]
    fn clamped_odd_rational(x: f32, bound: f32, p: &[f32], q: &[f32]) -> f32 {
        let c = clamp(x, -bound, bound);
        let x2 = c * c;
        (horner(x2, p) * c) / horner(x2, q)
    }

    /// The hyperbolic tangent.
    #[inline(always)]
    pub fn tanh(x: f32) -> f32 {
        let r = clamped_odd_rational(x, TANH_BOUND, &TANH_P, &TANH_Q);
        let ax = x.abs();
        let r = if ax < TANH_TINY { x } else { r };
        let signed_one = f32::from_bits((x.to_bits() & 0x8000_0000) | 1f32.to_bits());
        if ax > TANH_BOUND { signed_one } else { r }
    }

    /// `1 / (1 + e⁻ˣ)`.
    #[inline(always)]
    pub fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + exp(-x))
    }

    /// The error function.
    #[inline(always)]
    pub fn erf(x: f32) -> f32 {
        clamped_odd_rational(x, ERF_BOUND, &ERF_P, &ERF_Q)
    }

    /// `max(x, 0) + log1p(e⁻|ˣ|)`, NaN kept (as Cranelift's `fmax` does).
    #[inline(always)]
    pub fn softplus(x: f32) -> f32 {
        let pos = if x > 0.0 || x.is_nan() { x } else { 0.0 };
        let e = exp(-x.abs());
        let u = 1.0 + e;
        let scaled = log(u) * (e / (u - 1.0));
        let log1p = if u == 1.0 { e } else { scaled };
        pos + log1p
    }
}
