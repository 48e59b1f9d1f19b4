//! Elementwise ops in Cranelift IR: float unary and binary ops by their one body
//! (`crate::jit::bodies`, emitted through [`Clif`]), integer and bool ops, comparisons, casts, and
//! calls of the scalar helpers the op table names.

use super::*;

impl Gen<'_, '_> {
    pub(super) fn unary(&mut self, op: UnaryOp, dtype: DType, x: CValue, vector: bool) -> CValue {
        if dtype == DType::Bool {
            return if vector {
                self.b.ins().bnot(x)
            } else {
                self.b.ins().bxor_imm_s(x, 1)
            };
        }
        if !dtype.is_float() {
            let ty = clif_type(dtype);
            return match op {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs => self.b.ins().iabs(x),
                UnaryOp::Relu => {
                    let zero = self.b.ins().iconst(ty, 0);
                    self.b.ins().smax(x, zero)
                }
                UnaryOp::Sign => {
                    let pos = self.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                    let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                    let pos = self.b.ins().uextend(ty, pos);
                    let neg = self.b.ins().uextend(ty, neg);
                    self.b.ins().isub(pos, neg)
                }
                // Float or bool only (their rows' dtype classes), so never on integers.
                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Recip
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Softplus
                | UnaryOp::Erf
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::StopGradient
                | UnaryOp::Not => unreachable!("`{}` on integers", op.name()),
            };
        }
        if let Some(symbol) = op.helper_symbol(dtype) {
            return self.call(symbol, &[x], clif_type(dtype));
        }
        let lanes = &mut Clif::new(&mut self.b, dtype, vector);
        crate::jit::bodies::unary(lanes, op, x)
            .unwrap_or_else(|| panic!("kernel codegen: `{}` on floats", op.name()))
    }

    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        dtype: DType,
        x: CValue,
        y: CValue,
        vector: bool,
    ) -> CValue {
        if dtype.is_float() {
            let lanes = &mut Clif::new(&mut self.b, dtype, vector);
            if let Some(z) = crate::jit::bodies::binary(lanes, op, x, y) {
                return z;
            }
        }
        let ins = self.b.ins();
        match (op, dtype) {
            (BinaryOp::And, _) => ins.band(x, y),
            (BinaryOp::Or, _) => ins.bor(x, y),
            (BinaryOp::Xor, _) => ins.bxor(x, y),
            (BinaryOp::Pow, d) => {
                let symbol = op
                    .helper_symbol(d)
                    .expect("`pow` has a helper for each float type");
                self.call(symbol, &[x, y], clif_type(d))
            }
            (BinaryOp::Add, _) => ins.iadd(x, y),
            (BinaryOp::Sub, _) => ins.isub(x, y),
            (BinaryOp::Mul, _) => ins.imul(x, y),
            (BinaryOp::Max, _) => ins.smax(x, y),
            (BinaryOp::Min, _) => ins.smin(x, y),
            (BinaryOp::Div, _) => {
                debug_assert!(!vector);
                self.checked_div(dtype, x, y)
            }
        }
    }

    /// Truncating division that wraps `MIN / -1` and reports a zero divisor in the status.
    pub(super) fn checked_div(&mut self, dtype: DType, x: CValue, d: CValue) -> CValue {
        let ty = clif_type(dtype);
        let zero = self.b.ins().icmp_imm_s(IntCC::Equal, d, 0);
        let flag = self.b.ins().uextend(types::I32, zero);
        let status = self.b.use_var(self.status);
        let status = self.b.ins().bor(status, flag);
        self.b.def_var(self.status, status);
        let minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, d, -1);
        let one = self.b.ins().iconst(ty, 1);
        let safe = self.b.ins().select(zero, one, d);
        let safe = self.b.ins().select(minus_one, one, safe);
        let q = self.b.ins().sdiv(x, safe);
        let negated = self.b.ins().ineg(x);
        self.b.ins().select(minus_one, negated, q)
    }

    pub(super) fn compare(
        &mut self,
        op: CompareOp,
        operand: DType,
        x: CValue,
        y: CValue,
        vector: bool,
    ) -> CValue {
        if operand.is_float() {
            let cc = match op {
                CompareOp::Eq => FloatCC::Equal,
                CompareOp::Ne => FloatCC::NotEqual,
                CompareOp::Lt => FloatCC::LessThan,
                CompareOp::Le => FloatCC::LessThanOrEqual,
                CompareOp::Gt => FloatCC::GreaterThan,
                CompareOp::Ge => FloatCC::GreaterThanOrEqual,
            };
            return self.b.ins().fcmp(cc, x, y);
        }
        if vector {
            // Masks of bools: only equality has a vector form.
            let differ = self.b.ins().bxor(x, y);
            return match op {
                CompareOp::Ne => differ,
                _ => self.b.ins().bnot(differ),
            };
        }
        let unsigned = operand == DType::Bool;
        let cc = match (op, unsigned) {
            (CompareOp::Eq, _) => IntCC::Equal,
            (CompareOp::Ne, _) => IntCC::NotEqual,
            (CompareOp::Lt, false) => IntCC::SignedLessThan,
            (CompareOp::Le, false) => IntCC::SignedLessThanOrEqual,
            (CompareOp::Gt, false) => IntCC::SignedGreaterThan,
            (CompareOp::Ge, false) => IntCC::SignedGreaterThanOrEqual,
            (CompareOp::Lt, true) => IntCC::UnsignedLessThan,
            (CompareOp::Le, true) => IntCC::UnsignedLessThanOrEqual,
            (CompareOp::Gt, true) => IntCC::UnsignedGreaterThan,
            (CompareOp::Ge, true) => IntCC::UnsignedGreaterThanOrEqual,
        };
        self.b.ins().icmp(cc, x, y)
    }

    pub(super) fn cast(&mut self, from: DType, to: DType, x: CValue, vector: bool) -> CValue {
        if from == to {
            return x;
        }
        if vector {
            return match (from, to) {
                (DType::Bool, DType::F32) => {
                    let lanes = &mut Clif::new(&mut self.b, to, vector);
                    let one = lanes.i(1.0f32.to_bits() as i32);
                    let bits = lanes.and(x, one);
                    lanes.float_of_bits(bits)
                }
                (DType::F32, DType::Bool) => {
                    let zero = Clif::new(&mut self.b, from, vector).f(0.0);
                    self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
                }
                _ => panic!("kernel codegen: no vector cast from {from} to {to}"),
            };
        }
        let (cf, ct) = (clif_type(from), clif_type(to));
        let ins = self.b.ins();
        match (
            from.is_float(),
            from == DType::Bool,
            to.is_float(),
            to == DType::Bool,
        ) {
            // float → float
            (true, _, true, _) if to == DType::F64 => ins.fpromote(ct, x),
            (true, _, true, _) => ins.fdemote(ct, x),
            // float → bool: non-zero (NaN included)
            (true, _, _, true) => {
                let zero = self.float_const(from, 0.0, false);
                self.b.ins().fcmp(FloatCC::NotEqual, x, zero)
            }
            // float → integer: saturating, NaN gives 0
            (true, _, false, false) => ins.fcvt_to_sint_sat(ct, x),
            // bool → number
            (false, true, true, _) => {
                let w = ins.uextend(types::I32, x);
                self.b.ins().fcvt_from_sint(ct, w)
            }
            (false, true, false, _) => ins.uextend(ct, x),
            // integer → bool
            (false, false, _, true) => ins.icmp_imm_s(IntCC::NotEqual, x, 0),
            // integer → float
            (false, false, true, _) => ins.fcvt_from_sint(ct, x),
            // integer → integer
            (false, false, false, false) if ct.bits() > cf.bits() => ins.sextend(ct, x),
            (false, false, false, false) => ins.ireduce(ct, x),
        }
    }

    /// Calls an imported scalar function (registered with the JIT in `jit/symbols.rs`).
    pub(super) fn call(&mut self, name: &str, args: &[CValue], ty: ClType) -> CValue {
        let callee = match self.imports.get(name) {
            Some(&f) => f,
            None => {
                let mut sig = self.module.make_signature();
                sig.params.extend(args.iter().map(|_| AbiParam::new(ty)));
                sig.returns.push(AbiParam::new(ty));
                let id = self
                    .module
                    .declare_function(name, Linkage::Import, &sig)
                    .expect("an imported function is declared with one signature");
                let f = self.module.declare_func_in_func(id, self.b.func);
                self.imports.insert(name.to_owned(), f);
                f
            }
        };
        let call = self.b.ins().call(callee, args);
        self.b.inst_results(call)[0]
    }
}
