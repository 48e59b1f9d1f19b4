//! The symbols compiled kernels call, made known to the JIT: each op's scalar helper (the
//! interpreter's own function, for ops whose table row names one — `sin`, `cos`, `pow` and
//! every f64 transcendental — a cold path, a call per element), and the tile-program runner
//! of the ISA in use.

use cranelift_jit::JITBuilder;
use kiln_ir::{BinaryOp, DType, UnaryOp};

use crate::interp::kernels;

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

/// Makes every helper symbol of the op table, and the runner of the ISA in use, known to the
/// JIT (its fallback lookup finds only symbols already loaded, so each is registered here).
pub(super) fn register_symbols(builder: &mut JITBuilder) {
    if let Some(runner) = crate::jit::tile_program::runner(crate::jit::tile_program::isa()) {
        builder.symbol(crate::jit::tile_program::SYMBOL, runner as *const u8);
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
