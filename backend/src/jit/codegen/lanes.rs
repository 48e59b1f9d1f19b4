//! [`Lanes`] over Cranelift values: the ops' bodies (`crate::lanes`) emitted inline into a
//! kernel, on f32x4 lanes or on scalars.

use crate::lanes::{Cmp, Lanes};
use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value, types};
use cranelift_frontend::FunctionBuilder;

/// A function being built, and whether values are f32x4 lanes or scalars.
pub(super) struct Clif<'a, 'b> {
    pub b: &'a mut FunctionBuilder<'b>,
    pub vector: bool,
}

impl Clif<'_, '_> {
    fn float(&self) -> Type {
        if self.vector { types::F32X4 } else { types::F32 }
    }

    fn int(&self) -> Type {
        if self.vector { types::I32X4 } else { types::I32 }
    }

    /// `m ? a : c`: vector masks select bitwise, as the values' type.
    fn pick(&mut self, m: Value, a: Value, c: Value) -> Value {
        if !self.vector {
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
        let s = self.b.ins().f32const(x);
        if self.vector { self.b.ins().splat(types::F32X4, s) } else { s }
    }
    fn i(&mut self, x: i32) -> Value {
        let s = self.b.ins().iconst(types::I32, i64::from(x));
        if self.vector { self.b.ins().splat(types::I32X4, s) } else { s }
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
    fn to_bits(&mut self, a: Value) -> Value {
        let ty = self.int();
        self.b.ins().bitcast(ty, MemFlagsData::new(), a)
    }
    fn from_bits(&mut self, a: Value) -> Value {
        let ty = self.float();
        self.b.ins().bitcast(ty, MemFlagsData::new(), a)
    }
    fn to_float(&mut self, a: Value) -> Value {
        let ty = self.float();
        self.b.ins().fcvt_from_sint(ty, a)
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
        self.b.ins().ishl_imm_s(a, i64::from(n))
    }
    fn sar(&mut self, a: Value, n: u8) -> Value {
        self.b.ins().sshr_imm_s(a, i64::from(n))
    }
    fn shr(&mut self, a: Value, n: u8) -> Value {
        self.b.ins().ushr_imm_s(a, i64::from(n))
    }
}
