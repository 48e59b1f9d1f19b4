//! Transcendental functions for f32 kernels, written in Cranelift IR as polynomial or rational
//! approximations that work on scalars and on f32x4 vectors alike:
//!
//! - `exp`: range reduction `x = n·ln2 + r` (n by rounding `x·log2 e` with the add-magic-number
//!   trick), Cephes' degree-6 minimax polynomial for `eʳ`, and `2ⁿ` built in the exponent bits
//!   (in two halves, so `n` may reach either end of the range).
//! - `log`: Cephes' `logf` — mantissa in `[√½, √2)`, a degree-9 polynomial; denormals scaled.
//! - `tanh`: Eigen's rational approximation on `|x| ≤ 7.9` (odd degree-13 over even degree-6).
//! - `sigmoid`: `1 / (1 + exp(−x))`, with the `exp` above.
//! - `erf`: XLA's rational approximation on `|x| ≤ 4`.
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
//! tanh and erf use the same rational forms as XLA (what `jax.jit` runs on the CPU).
//! `crate::vecmath` has the same functions, step for step, as AVX-512 and AVX2 routines that
//! kernels call on tiles; they give these functions' bits, so the bounds hold for both.
//! `softplus` is `max(x, 0) + log1p(exp(−|x|))` with the `exp` and `log` above.
//! Ops whose table row names a helper (`sin`, `cos`, `pow`, and every f64 transcendental) call
//! the interpreter's own scalar function by symbol (a cold path: a call per element).

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITBuilder;
use kiln_ir::{BinaryOp, DType, UnaryOp};

use crate::interp::kernels;
use crate::vecmath::scalar::{
    ERF_BOUND, ERF_P, ERF_Q, EXP_HI, EXP_LO, EXP_POLY, LN2_HI, LN2_LO, LOG_POLY, MAGIC, TANH_BOUND,
    TANH_P, TANH_Q, TANH_TINY,
};

/// Scalar f32 or four lanes of f32.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Lanes {
    pub vector: bool,
}

impl Lanes {
    pub(super) fn float(self) -> Type {
        if self.vector {
            types::F32X4
        } else {
            types::F32
        }
    }

    pub(super) fn int(self) -> Type {
        if self.vector {
            types::I32X4
        } else {
            types::I32
        }
    }

    pub(super) fn c(self, b: &mut FunctionBuilder, x: f32) -> Value {
        let s = b.ins().f32const(x);
        if self.vector {
            b.ins().splat(types::F32X4, s)
        } else {
            s
        }
    }

    pub(super) fn ci(self, b: &mut FunctionBuilder, x: i32) -> Value {
        let s = b.ins().iconst(types::I32, x as i64);
        if self.vector {
            b.ins().splat(types::I32X4, s)
        } else {
            s
        }
    }

    pub(super) fn to_int(self, b: &mut FunctionBuilder, x: Value) -> Value {
        b.ins().bitcast(self.int(), MemFlagsData::new(), x)
    }

    pub(super) fn to_float(self, b: &mut FunctionBuilder, x: Value) -> Value {
        b.ins().bitcast(self.float(), MemFlagsData::new(), x)
    }

    /// `cond ? a : b` for a comparison result of these lanes.
    pub(super) fn select(self, b: &mut FunctionBuilder, cond: Value, a: Value, c: Value) -> Value {
        if self.vector {
            // The mask must have the type of the values selected.
            let ty = b.func.dfg.value_type(a);
            let mask = if b.func.dfg.value_type(cond) == ty {
                cond
            } else {
                b.ins().bitcast(ty, MemFlagsData::new(), cond)
            };
            b.ins().bitselect(mask, a, c)
        } else {
            b.ins().select(cond, a, c)
        }
    }

    /// `x` limited to `[lo, hi]`, NaN kept. A compare and a select each way: one `maxps` /
    /// `minps`, where `fmax`/`fmin` (which order zeros and propagate NaN from either side)
    /// take an 8-instruction sequence on x86.
    pub(super) fn clamp(self, b: &mut FunctionBuilder, x: Value, lo: Value, hi: Value) -> Value {
        let below = b.ins().fcmp(FloatCC::LessThan, x, lo);
        let x = self.select(b, below, lo, x);
        let above = b.ins().fcmp(FloatCC::GreaterThan, x, hi);
        self.select(b, above, hi, x)
    }

    /// `Σ coeffs[i]·xⁱ⁻ᵏ…` by Horner's rule with fused multiply-adds, highest degree first.
    fn horner(self, b: &mut FunctionBuilder, x: Value, coeffs: &[f32]) -> Value {
        let mut acc = self.c(b, coeffs[0]);
        for &k in &coeffs[1..] {
            let kc = self.c(b, k);
            acc = b.ins().fma(acc, x, kc);
        }
        acc
    }
}

pub(super) fn exp(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // Down to −103.97 the result is subnormal (2ⁿ is built in two halves, so it gets there);
    // below it rounds to zero.
    let (lo, hi) = (l.c(b, EXP_LO), l.c(b, EXP_HI));
    let clamped = l.clamp(b, x, lo, hi);
    let (log2e, magic) = (l.c(b, LOG2E), l.c(b, MAGIC));
    let t = b.ins().fma(clamped, log2e, magic);
    let n = b.ins().fsub(t, magic);
    let (ln2_hi, ln2_lo) = (l.c(b, -LN2_HI), l.c(b, LN2_LO));
    let r = b.ins().fma(n, ln2_hi, clamped);
    let r = b.ins().fma(n, ln2_lo, r);
    let poly = l.horner(b, r, &EXP_POLY);
    let r2 = b.ins().fmul(r, r);
    let one = l.c(b, 1.0);
    let r_plus_one = b.ins().fadd(r, one);
    let p = b.ins().fma(poly, r2, r_plus_one);
    // 2ⁿ as 2^(n>>1) · 2^(n − n>>1), each built in the exponent bits.
    let ti = l.to_int(b, t);
    let magic_bits = l.ci(b, MAGIC.to_bits() as i32);
    let ni = b.ins().isub(ti, magic_bits);
    let half = b.ins().sshr_imm_s(ni, 1);
    let rest = b.ins().isub(ni, half);
    let bias = l.ci(b, 127);
    let e1 = b.ins().iadd(half, bias);
    let e1 = b.ins().ishl_imm_s(e1, 23);
    let e2 = b.ins().iadd(rest, bias);
    let e2 = b.ins().ishl_imm_s(e2, 23);
    let (s1, s2) = (l.to_float(b, e1), l.to_float(b, e2));
    let y = b.ins().fmul(p, s1);
    let y = b.ins().fmul(y, s2);
    // Beyond the largest finite result, infinity (as the standard library gives).
    let inf = l.c(b, f32::INFINITY);
    let over = b.ins().fcmp(FloatCC::GreaterThan, x, hi);
    let y = l.select(b, over, inf, y);
    let zero = l.c(b, 0.0);
    let under = b.ins().fcmp(FloatCC::LessThan, x, lo);
    l.select(b, under, zero, y)
}

pub(super) fn log(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    // Denormals: scale into the normal range first.
    let min_normal = l.c(b, f32::MIN_POSITIVE);
    let tiny = b.ins().fcmp(FloatCC::LessThan, x, min_normal);
    let scale = l.c(b, 8_388_608.0); // 2²³
    let scaled = b.ins().fmul(x, scale);
    let xs = l.select(b, tiny, scaled, x);
    let zero_i = l.ci(b, 0);
    let shift_i = l.ci(b, 23);
    let pre = l.select(b, tiny, shift_i, zero_i);
    let bits = l.to_int(b, xs);
    let exp_bits = b.ins().ushr_imm_s(bits, 23);
    let mask = l.ci(b, 0xff);
    let exp_bits = b.ins().band(exp_bits, mask);
    let bias = l.ci(b, 126);
    let e = b.ins().isub(exp_bits, bias);
    let e = b.ins().isub(e, pre);
    let mant_mask = l.ci(b, 0x807f_ffff_u32 as i32);
    let half_bits = l.ci(b, 0x3f00_0000);
    let m = b.ins().band(bits, mant_mask);
    let m = b.ins().bor(m, half_bits);
    let m = l.to_float(b, m); // in [0.5, 1)
    let ef = if l.vector {
        b.ins().fcvt_from_sint(types::F32X4, e)
    } else {
        b.ins().fcvt_from_sint(types::F32, e)
    };
    let sqrt_half = l.c(b, std::f32::consts::FRAC_1_SQRT_2);
    let small = b.ins().fcmp(FloatCC::LessThan, m, sqrt_half);
    let one = l.c(b, 1.0);
    let ef_minus = b.ins().fsub(ef, one);
    let ef = l.select(b, small, ef_minus, ef);
    let m2 = b.ins().fadd(m, m);
    let m_small = b.ins().fsub(m2, one);
    let m_big = b.ins().fsub(m, one);
    let m = l.select(b, small, m_small, m_big);
    let z = b.ins().fmul(m, m);
    let poly = l.horner(b, m, &LOG_POLY);
    let y = b.ins().fmul(poly, m);
    let y = b.ins().fmul(y, z);
    let c1 = l.c(b, -LN2_LO);
    let y = b.ins().fma(ef, c1, y);
    let half = l.c(b, -0.5);
    let y = b.ins().fma(z, half, y);
    let r = b.ins().fadd(m, y);
    let c2 = l.c(b, LN2_HI);
    let r = b.ins().fma(ef, c2, r);
    // Special values: log(0) = −∞, log(x < 0) = NaN, log(∞) = ∞, NaN stays NaN.
    let zero = l.c(b, 0.0);
    let neg_inf = l.c(b, f32::NEG_INFINITY);
    let nan = l.c(b, f32::NAN);
    let inf = l.c(b, f32::INFINITY);
    let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
    let r = l.select(b, is_zero, neg_inf, r);
    let negative = b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, zero);
    let r = l.select(b, negative, nan, r);
    let is_inf = b.ins().fcmp(FloatCC::Equal, x, inf);
    l.select(b, is_inf, inf, r)
}

/// `c·P(c²) / Q(c²)` with `c` = `x` clamped to `±bound`: the odd rational form of tanh and
/// erf (Horner coefficients, highest degree first). Also returns the upper bound's constant.
fn clamped_odd_rational(
    b: &mut FunctionBuilder,
    l: Lanes,
    x: Value,
    bound: f32,
    p: &[f32],
    q: &[f32],
) -> (Value, Value) {
    let (lo, hi) = (l.c(b, -bound), l.c(b, bound));
    let c = l.clamp(b, x, lo, hi);
    let x2 = b.ins().fmul(c, c);
    let p = l.horner(b, x2, p);
    let p = b.ins().fmul(p, c);
    let q = l.horner(b, x2, q);
    (b.ins().fdiv(p, q), hi)
}

pub(super) fn tanh(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    let (r, hi) = clamped_odd_rational(b, l, x, TANH_BOUND, &TANH_P, &TANH_Q);
    // Near zero tanh(x) = x to within rounding, and the rational form loses the low bits.
    let ax = b.ins().fabs(x);
    let tiny = l.c(b, TANH_TINY);
    let small = b.ins().fcmp(FloatCC::LessThan, ax, tiny);
    let r = l.select(b, small, x, r);
    // Beyond the clamp, ±1 (within 5 ULPs of the true value there; exact from |x| ≥ 9.01).
    let big = b.ins().fcmp(FloatCC::GreaterThan, ax, hi);
    let bits = l.to_int(b, x);
    let sign_mask = l.ci(b, i32::MIN);
    let sign = b.ins().band(bits, sign_mask);
    let one_bits = l.ci(b, 1.0f32.to_bits() as i32);
    let signed_one = b.ins().bor(sign, one_bits);
    let signed_one = l.to_float(b, signed_one);
    l.select(b, big, signed_one, r)
}

pub(super) fn sigmoid(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    let neg = b.ins().fneg(x);
    let e = exp(b, l, neg);
    let one = l.c(b, 1.0);
    let d = b.ins().fadd(one, e);
    b.ins().fdiv(one, d)
}

pub(super) fn erf(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    let (r, _) = clamped_odd_rational(b, l, x, ERF_BOUND, &ERF_P, &ERF_Q);
    r
}

/// `softplus(x) = max(x, 0) + log1p(exp(−|x|))`, with `log1p(e) = log(u)·e/(u − 1)` for
/// `u = 1 + e` (exact where `u` rounds to 1), so that small tails keep their precision.
pub(super) fn softplus(b: &mut FunctionBuilder, l: Lanes, x: Value) -> Value {
    let zero = l.c(b, 0.0);
    let one = l.c(b, 1.0);
    let pos = b.ins().fmax(x, zero);
    let a = b.ins().fabs(x);
    let na = b.ins().fneg(a);
    let e = exp(b, l, na);
    let u = b.ins().fadd(one, e);
    let lu = log(b, l, u);
    let um1 = b.ins().fsub(u, one);
    let ratio = b.ins().fdiv(e, um1);
    let scaled = b.ins().fmul(lu, ratio);
    let exact = b.ins().fcmp(FloatCC::Equal, u, one);
    let log1p = l.select(b, exact, e, scaled);
    b.ins().fadd(pos, log1p)
}

/// A unary op's scalar helper, generated per op from the interpreter's own scalar function
/// (so a helper computes exactly what the oracle does).
macro_rules! unary_helpers {
    ($(#[$meta:meta])* $enum:ident { $($variant:ident = $text:literal, $($_rest:ident),*;)* }) => {
        fn unary_helpers(op: UnaryOp) -> (extern "C" fn(f32) -> f32, extern "C" fn(f64) -> f64) {
            match op {
                $(UnaryOp::$variant => {
                    extern "C" fn f32_helper(x: f32) -> f32 {
                        kernels::unary_float_fn(UnaryOp::$variant).map_or(f32::NAN, |f| f(x))
                    }
                    extern "C" fn f64_helper(x: f64) -> f64 {
                        kernels::unary_float_fn(UnaryOp::$variant).map_or(f64::NAN, |f| f(x))
                    }
                    (f32_helper, f64_helper)
                })*
            }
        }
    };
}
kiln_ir::with_unary_ops!(unary_helpers);

extern "C" fn powf(x: f32, y: f32) -> f32 {
    kernels::pow(x, y)
}
extern "C" fn pow64(x: f64, y: f64) -> f64 {
    kernels::pow(x, y)
}

/// Makes every helper symbol of the op table, and the vector routines of the ISA in use,
/// known to the JIT (its fallback lookup finds only
/// symbols already loaded, so each is registered here).
pub(super) fn register_symbols(builder: &mut JITBuilder) {
    let isa = crate::vecmath::isa();
    for &op in UnaryOp::ALL {
        if let Some(routine) = crate::vecmath::routine(op, isa) {
            builder.symbol(crate::vecmath::symbol(op), routine as *const u8);
        }
    }
    if let Some(runner) = crate::tile_program::runner(isa) {
        builder.symbol(crate::tile_program::SYMBOL, runner as *const u8);
    }
    for &op in UnaryOp::ALL {
        let (f32_helper, f64_helper) = unary_helpers(op);
        if let Some(name) = op.helper_symbol(DType::F32) {
            builder.symbol(name, f32_helper as *const u8);
        }
        if let Some(name) = op.helper_symbol(DType::F64) {
            builder.symbol(name, f64_helper as *const u8);
        }
    }
    for &op in BinaryOp::ALL {
        // `pow` is the one binary op with helpers (exhaustive, so a new op is decided here).
        type Pair = (
            extern "C" fn(f32, f32) -> f32,
            extern "C" fn(f64, f64) -> f64,
        );
        let (f32_helper, f64_helper): Pair = match op {
            BinaryOp::Pow => (powf, pow64),
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor => continue,
        };
        if let Some(name) = op.helper_symbol(DType::F32) {
            builder.symbol(name, f32_helper as *const u8);
        }
        if let Some(name) = op.helper_symbol(DType::F64) {
            builder.symbol(name, f64_helper as *const u8);
        }
    }
}
