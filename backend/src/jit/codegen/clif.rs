//! [`Lanes`] over Cranelift values: the ops' bodies (`crate::jit::bodies`) emitted inline into a
//! kernel, on f32x4 lanes, f32 scalars, or f64 scalars (the bodies of ops without helpers use
//! no bit patterns of f32, so they serve f64 as they are).

use crate::jit::bodies::{Cmp, Lanes};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::FunctionBuilder;
use kiln_ir::DType;

/// A function being built, and the type of its float values: `F32X4`, `F32` or `F64`.
pub(super) struct Clif<'a, 'b> {
    b: &'a mut FunctionBuilder<'b>,
    float: Type,
}

impl<'a, 'b> Clif<'a, 'b> {
    /// Values of `dtype` (f32 or f64), f32x4 lanes where `vector`.
    pub(super) fn new(b: &'a mut FunctionBuilder<'b>, dtype: DType, vector: bool) -> Self {
        let float = match (dtype, vector) {
            (DType::F64, false) => types::F64,
            (DType::F32, false) => types::F32,
            (DType::F32, true) => types::F32X4,
            _ => panic!("kernel codegen: no lanes of {dtype} (vector: {vector})"),
        };
        Clif { b, float }
    }

    /// The bodies' bit patterns are f32's (exponent at bit 23, bias 127): an op whose body uses
    /// them has an f64 helper, so f64 values never reach them.
    fn f32_bits_only(&self) {
        debug_assert!(self.float != types::F64, "an f32 bit pattern on f64 values");
    }

    /// The integers as wide as the floats.
    fn int(&self) -> Type {
        match self.float {
            types::F32X4 => types::I32X4,
            types::F64 => types::I64,
            _ => types::I32,
        }
    }

    /// `m ? a : c`: vector masks select bitwise, as the values' type.
    fn pick(&mut self, m: Value, a: Value, c: Value) -> Value {
        if !self.float.is_vector() {
            return self.b.ins().select(m, a, c);
        }
        let ty = self.b.func.dfg.value_type(a);
        let mask = if self.b.func.dfg.value_type(m) == ty {
            m
        } else {
            self.b.ins().bitcast(ty, MemFlagsData::new(), m)
        };
        self.b.ins().bitselect(mask, a, c)
    }
}

impl Lanes for Clif<'_, '_> {
    type F = Value;
    type I = Value;
    type M = Value;

    fn f(&mut self, x: f32) -> Value {
        match self.float {
            types::F64 => self.b.ins().f64const(f64::from(x)),
            types::F32 => self.b.ins().f32const(x),
            ty => {
                let s = self.b.ins().f32const(x);
                self.b.ins().splat(ty, s)
            }
        }
    }
    fn i(&mut self, x: i32) -> Value {
        match self.int() {
            types::I32X4 => {
                let s = self.b.ins().iconst(types::I32, i64::from(x));
                self.b.ins().splat(types::I32X4, s)
            }
            ty => self.b.ins().iconst(ty, i64::from(x)),
        }
    }
    fn add(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }
    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }
    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }
    fn div(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }
    fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.b.ins().fma(a, b, c)
    }
    fn neg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }
    fn abs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }
    fn copysign(&mut self, a: Value, sign: Value) -> Value {
        if !self.float.is_vector() {
            return self.b.ins().fcopysign(a, sign);
        }
        // x86 has no f32x4 `fcopysign` in Cranelift 0.135: by the bits.
        let (a, sign) = (self.bits(a), self.bits(sign));
        let mask = self.i(i32::MIN);
        let sign = self.b.ins().band(sign, mask);
        let a = self.b.ins().band_not(a, mask);
        let bits = self.b.ins().bor(a, sign);
        self.float_of_bits(bits)
    }
    fn sqrt(&mut self, a: Value) -> Value {
        self.b.ins().sqrt(a)
    }
    fn floor(&mut self, a: Value) -> Value {
        self.b.ins().floor(a)
    }
    fn ceil(&mut self, a: Value) -> Value {
        self.b.ins().ceil(a)
    }
    fn round(&mut self, a: Value) -> Value {
        self.b.ins().nearest(a)
    }
    fn max(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmax(a, b)
    }
    fn min(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmin(a, b)
    }
    fn cmp(&mut self, cmp: Cmp, a: Value, b: Value) -> Value {
        let cc = match cmp {
            Cmp::Lt => FloatCC::LessThan,
            Cmp::Gt => FloatCC::GreaterThan,
            Cmp::Eq => FloatCC::Equal,
            Cmp::LtOrNan => FloatCC::UnorderedOrLessThan,
            Cmp::GtOrNan => FloatCC::UnorderedOrGreaterThan,
        };
        self.b.ins().fcmp(cc, a, b)
    }
    fn either(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bor(a, b)
    }
    fn select(&mut self, m: Value, a: Value, b: Value) -> Value {
        self.pick(m, a, b)
    }
    fn select_int(&mut self, m: Value, a: Value, b: Value) -> Value {
        self.pick(m, a, b)
    }
    fn bits(&mut self, a: Value) -> Value {
        self.f32_bits_only();
        let ty = self.int();
        self.b.ins().bitcast(ty, MemFlagsData::new(), a)
    }
    fn float_of_bits(&mut self, a: Value) -> Value {
        self.f32_bits_only();
        self.b.ins().bitcast(self.float, MemFlagsData::new(), a)
    }
    fn convert_int(&mut self, a: Value) -> Value {
        self.b.ins().fcvt_from_sint(self.float, a)
    }
    fn iadd(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().iadd(a, b)
    }
    fn isub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().isub(a, b)
    }
    fn and(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().band(a, b)
    }
    fn or(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bor(a, b)
    }
    fn shl(&mut self, a: Value, n: u8) -> Value {
        self.f32_bits_only();
        self.b.ins().ishl_imm_s(a, i64::from(n))
    }
    fn sar(&mut self, a: Value, n: u8) -> Value {
        self.f32_bits_only();
        self.b.ins().sshr_imm_s(a, i64::from(n))
    }
    fn shr(&mut self, a: Value, n: u8) -> Value {
        self.f32_bits_only();
        self.b.ins().ushr_imm_s(a, i64::from(n))
    }
}
