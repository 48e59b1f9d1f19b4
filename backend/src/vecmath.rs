//! Vector math routines: exp, log, tanh, sigmoid, softplus and erf over slices of f32, compiled
//! for AVX-512 and AVX2 and chosen at run time — what compiled kernels call on tiles of a row,
//! the way XLA's CPU backend calls its vectorised runtime functions, because Cranelift emits
//! nothing wider than 128 bits on x86-64.
//!
//! Each function is written once, as a branch-free scalar body ([`scalar`]) that mirrors
//! `jit/math.rs` step for step: the same range reductions, coefficients and fused multiply-adds
//! in the same order. Compiled inside a `#[target_feature]` function, LLVM vectorises the
//! loop over the slice at the ISA's width (16 lanes on AVX-512, 8 on AVX2), and since every
//! step is an exactly rounded IEEE operation, a routine gives the *same bits* as the kernel's
//! own Cranelift code — which is what the tests check, besides the ULP bounds.
//!
//! The ISA is detected once per process; `KILN_VECTOR_MATH` = `avx512`, `avx2` or `off` caps
//! it (`off` keeps every kernel on its Cranelift code). A level the CPU lacks is never used.

use kiln_ir::UnaryOp;
use std::sync::OnceLock;

/// The instruction-set level the routines are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// No routines: kernels keep their Cranelift f32x4 code.
    Off,
    /// 256-bit vectors with fused multiply-add.
    Avx2,
    /// 512-bit vectors.
    Avx512,
}

impl Isa {
    /// The level's name, as `KILN_VECTOR_MATH` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Off => "off",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Off, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the level's routines.
    pub fn supported(self) -> bool {
        match self {
            Isa::Off => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512dq")
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
            Ok("off") => Isa::Off,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        (Isa::ALL.into_iter())
            .filter(|&i| i <= cap && i.supported())
            .max()
            .unwrap_or(Isa::Off)
    })
}

/// A routine: replaces `len` f32s at `data` by the function's values.
pub type Routine = unsafe extern "C" fn(data: *mut f32, len: i64);

/// The routine of `op` at level `isa`, if the op has one there.
pub fn routine(op: UnaryOp, isa: Isa) -> Option<Routine> {
    let has_routine = match op {
        UnaryOp::Exp
        | UnaryOp::Log
        | UnaryOp::Tanh
        | UnaryOp::Sigmoid
        | UnaryOp::Softplus
        | UnaryOp::Erf => true,
        // Cheap or slow single instructions stay in Cranelift; sin and cos call helpers.
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Relu
        | UnaryOp::Sqrt
        | UnaryOp::Rsqrt
        | UnaryOp::Recip
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Floor
        | UnaryOp::Ceil
        | UnaryOp::Round
        | UnaryOp::Not => false,
    };
    if !has_routine || !isa.supported() {
        return None;
    }
    routines::table(op, isa)
}

/// The symbol a kernel calls `op`'s routine by.
pub(crate) fn symbol(op: UnaryOp) -> String {
    format!("kiln_vector_{}", op.name())
}

/// Applies `op`'s routine at level `isa` to `data`; false if there is none.
pub fn apply(op: UnaryOp, isa: Isa, data: &mut [f32]) -> bool {
    let Some(f) = routine(op, isa) else {
        return false;
    };
    // SAFETY: `data` is `len` valid, exclusively borrowed f32s, and `routine` only returns
    // routines whose ISA this CPU supports.
    unsafe { f(data.as_mut_ptr(), data.len() as i64) };
    true
}

/// The scalar bodies, step for step as `jit/math.rs` builds them (see there for the methods
/// and their measured errors). Branch-free, so that LLVM vectorises a loop over them.
pub mod scalar {
    // The approximations' constants, shared with the kernels' Cranelift code (`jit/math.rs`).
    /// Adding it rounds to an integer in the low bits (1.5·2²³).
    pub(crate) const MAGIC: f32 = 12_582_912.0;
    /// Below it `eˣ` rounds to zero; down to it the result is subnormal.
    pub(crate) const EXP_LO: f32 = -103.972_08;
    /// Above it `eˣ` overflows.
    pub(crate) const EXP_HI: f32 = 88.722_84;
    /// `ln 2` in two parts (Cody–Waite): the high part exact in few bits.
    pub(crate) const LN2_HI: f32 = 0.693_359_4;
    /// The rest of `ln 2` (subtracted from the high part).
    pub(crate) const LN2_LO: f32 = 2.121_944_4e-4;
    /// Cephes' degree-6 minimax polynomial for `eʳ` (Horner, highest degree first).
    pub(crate) const EXP_POLY: [f32; 6] = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ];
    /// Cephes' `logf` polynomial.
    pub(crate) const LOG_POLY: [f32; 9] = [
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
    pub(crate) const TANH_BOUND: f32 = 7.905_311;
    /// Below it tanh(x) = x to within rounding.
    pub(crate) const TANH_TINY: f32 = 4e-4;
    /// Eigen's (and XLA's) rational tanh: odd numerator, even denominator, in `x²`.
    pub(crate) const TANH_P: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_4e-4,
        4.893_524_6e-3,
    ];
    /// The denominator of [`TANH_P`].
    pub(crate) const TANH_Q: [f32; 4] =
        [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_6e-3, 4.893_525e-3];
    /// XLA's rational erf, on `|x| ≤ 4`.
    pub(crate) const ERF_BOUND: f32 = 4.0;
    /// The numerator of XLA's erf.
    pub(crate) const ERF_P: [f32; 7] = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906_3e-4,
        -2.954_6e-3,
        -1.609_603_3e-2,
    ];
    /// The denominator of XLA's erf.
    pub(crate) const ERF_Q: [f32; 5] = [
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

#[cfg(target_arch = "x86_64")]
mod routines {
    use super::{Isa, Routine, scalar};
    use kiln_ir::UnaryOp;

    /// One routine per (function, ISA): the scalar body in a loop that LLVM vectorises under
    /// the ISA's target features.
    macro_rules! routines {
        ($($op:ident $f:ident),*) => {
            pub(super) fn table(op: UnaryOp, isa: Isa) -> Option<Routine> {
                mod avx512 {
                    use super::scalar;
                    $(
                        /// # Safety
                        /// `data` points to `len` f32s; the CPU has AVX-512F/DQ, AVX2 and FMA.
                        #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
                        pub(super) unsafe extern "C" fn $f(data: *mut f32, len: i64) {
                            // SAFETY: as the function's contract states.
                            let xs = unsafe { std::slice::from_raw_parts_mut(data, len as usize) };
                            for x in xs {
                                *x = scalar::$f(*x);
                            }
                        }
                    )*
                }
                mod avx2 {
                    use super::scalar;
                    $(
                        /// # Safety
                        /// `data` points to `len` f32s; the CPU has AVX2 and FMA.
                        #[target_feature(enable = "avx2,fma")]
                        pub(super) unsafe extern "C" fn $f(data: *mut f32, len: i64) {
                            // SAFETY: as the function's contract states.
                            let xs = unsafe { std::slice::from_raw_parts_mut(data, len as usize) };
                            for x in xs {
                                *x = scalar::$f(*x);
                            }
                        }
                    )*
                }
                let f: Routine = match (op, isa) {
                    $(
                        (UnaryOp::$op, Isa::Avx512) => avx512::$f,
                        (UnaryOp::$op, Isa::Avx2) => avx2::$f,
                    )*
                    _ => return None,
                };
                Some(f)
            }
        };
    }

    routines!(Exp exp, Log log, Tanh tanh, Sigmoid sigmoid, Softplus softplus, Erf erf);
}

#[cfg(not(target_arch = "x86_64"))]
mod routines {
    use super::{Isa, Routine};
    use kiln_ir::UnaryOp;

    pub(super) fn table(_: UnaryOp, _: Isa) -> Option<Routine> {
        None
    }
}
