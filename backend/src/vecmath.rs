//! Vector math routines: exp, log, tanh, sigmoid, softplus and erf over slices of f32, compiled
//! for AVX-512 and AVX2 and chosen at run time — what compiled kernels call on tiles of a row,
//! the way XLA's CPU backend calls its vectorised runtime functions, because Cranelift emits
//! nothing wider than 128 bits on x86-64.
//!
//! Each routine is the op's one body ([`crate::lanes`]) in a loop over the slice, compiled
//! inside a `#[target_feature]` function, where LLVM vectorises it at the ISA's width (16
//! lanes on AVX-512, 8 on AVX2); it gives the same bits as the body Cranelift emits into a
//! kernel, which the tests check besides the ULP bounds.
//!
//! The ISA is detected once per process; `KILN_VECTOR_MATH` = `avx512`, `avx2` or `off` caps
//! it (`off` keeps every kernel on its Cranelift code). A level the CPU lacks is never used.

use kiln_ir::{Cost, UnaryOp, VectorForm};
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

/// The routine of `op` at level `isa`, if the op has one there: the transcendental functions
/// with an f32 body (cheap ops stay inline in kernels; `sin` and `cos` call helpers).
pub fn routine(op: UnaryOp, isa: Isa) -> Option<Routine> {
    let has_routine = op.cost() == Cost::Transcendental && op.vector_form() == VectorForm::F32x4;
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

#[cfg(target_arch = "x86_64")]
mod routines {
    use super::{Isa, Routine};
    use kiln_ir::UnaryOp;

    /// One routine per (op of the table, ISA): the op's body in a loop that LLVM vectorises
    /// under the ISA's target features.
    macro_rules! routines {
        ($(#[$meta:meta])* $enum:ident { $($op:ident = $text:literal, $($_rest:ident),*;)* }) => {
            pub(super) fn table(op: UnaryOp, isa: Isa) -> Option<Routine> {
                mod avx512 {
                    use crate::lanes::unary_f32;
                    use kiln_ir::UnaryOp;
                    $(
                        /// # Safety
                        /// `data` points to `len` f32s; the CPU has AVX-512F/DQ, AVX2 and FMA.
                        #[allow(non_snake_case)]
                        #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
                        pub(super) unsafe extern "C" fn $op(data: *mut f32, len: i64) {
                            // SAFETY: as the function's contract states.
                            let xs = unsafe { std::slice::from_raw_parts_mut(data, len as usize) };
                            for x in xs {
                                *x = unary_f32(UnaryOp::$op, *x);
                            }
                        }
                    )*
                }
                mod avx2 {
                    use crate::lanes::unary_f32;
                    use kiln_ir::UnaryOp;
                    $(
                        /// # Safety
                        /// `data` points to `len` f32s; the CPU has AVX2 and FMA.
                        #[allow(non_snake_case)]
                        #[target_feature(enable = "avx2,fma")]
                        pub(super) unsafe extern "C" fn $op(data: *mut f32, len: i64) {
                            // SAFETY: as the function's contract states.
                            let xs = unsafe { std::slice::from_raw_parts_mut(data, len as usize) };
                            for x in xs {
                                *x = unary_f32(UnaryOp::$op, *x);
                            }
                        }
                    )*
                }
                Some(match isa {
                    Isa::Avx512 => match op { $(UnaryOp::$op => avx512::$op,)* },
                    Isa::Avx2 => match op { $(UnaryOp::$op => avx2::$op,)* },
                    Isa::Off => return None,
                })
            }
        };
    }

    kiln_ir::with_unary_ops!(routines);
}

#[cfg(not(target_arch = "x86_64"))]
mod routines {
    use super::{Isa, Routine};
    use kiln_ir::UnaryOp;

    pub(super) fn table(_: UnaryOp, _: Isa) -> Option<Routine> {
        None
    }
}
