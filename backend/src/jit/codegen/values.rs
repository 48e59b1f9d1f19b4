//! Values: leaves loaded from buffers, ops dispatched to their code, constants, iota.

use super::*;

impl Gen<'_, '_> {
    pub(super) fn emit(&mut self, v: Value, map: &Mapping) -> CValue {
        let key = Memo::Value(v, map.clone());
        if let Some(x) = self.lookup(&key) {
            return x;
        }
        let stashed = self
            .stash_out
            .iter()
            .find(|s| s.value == v && s.map == *map)
            .map(|s| (s.slot, s.slot_map.clone()));
        let x = if let Some((slot, slot_map)) = stashed {
            let dtype = self.dtype(v);
            let addr = self.address(slot, &slot_map, dtype);
            self.b.ins().load(clif_type(dtype), flags(), addr, 0)
        } else {
            self.compute(v, map)
        };
        self.memoise(key, x);
        x
    }

    pub(super) fn compute(&mut self, v: Value, map: &Mapping) -> CValue {
        let plan = self.plan;
        let dtype = self.dtype(v);
        if plan.is_leaf_in(v, self.stage) {
            let slot = plan.slot(plan.source[&v]);
            let addr = self.address(slot, map, dtype);
            return self.b.ins().load(clif_type(dtype), flags(), addr, 0);
        }
        let (op, args) = plan.op(v).expect("only arguments have no op");
        let operands = plan.operand_mappings(v, map);
        let arg = |g: &mut Self, i: usize| {
            let (x, m) = &operands[i];
            g.emit(*x, m)
        };
        match op {
            Op::Reduce { .. } => {
                panic!("kernel codegen: a reduction is read before it is computed")
            }
            Op::Const { value, .. } => self.constant(value),
            Op::Iota { axis, .. } => self.iota(map[*axis], dtype),
            Op::Broadcast { .. } | Op::Reshape { .. } => arg(self, 0),
            Op::Unary(u) => {
                let x = arg(self, 0);
                self.unary(*u, dtype, x)
            }
            Op::Binary(o) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.binary(*o, dtype, x, y)
            }
            Op::Compare(c) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.compare(*c, self.dtype(args[0]), x, y)
            }
            Op::Select => {
                let (c, x, y) = (arg(self, 0), arg(self, 1), arg(self, 2));
                self.b.ins().select(c, x, y)
            }
            Op::Cast { to } => {
                let x = arg(self, 0);
                self.cast(self.dtype(args[0]), *to, x)
            }
            other => panic!("kernel codegen: `{}` is not a kernel op", other.name()),
        }
    }

    pub(super) fn constant(&mut self, value: &Literal) -> CValue {
        let ins = self.b.ins();
        match value {
            Literal::F32(v) => ins.f32const(v[0]),
            Literal::F64(v) => ins.f64const(v[0]),
            Literal::I32(v) => ins.iconst(types::I32, i64::from(v[0])),
            Literal::I64(v) => ins.iconst(types::I64, v[0]),
            Literal::Bool(v) => ins.iconst(types::I8, i64::from(v[0])),
        }
    }

    pub(super) fn iota(&mut self, axis: Option<u8>, dtype: DType) -> CValue {
        let index = match axis {
            None => self.b.ins().iconst(types::I64, 0),
            Some(k) if k == self.inner_axis() => self.inner.expect("inside an inner loop"),
            Some(k) => self.row_index[k as usize],
        };
        self.index_as(index, dtype)
    }

    pub(super) fn index_as(&mut self, index: CValue, dtype: DType) -> CValue {
        match dtype {
            DType::F32 | DType::F64 => self.b.ins().fcvt_from_sint(clif_type(dtype), index),
            DType::I32 => self.b.ins().ireduce(types::I32, index),
            DType::I64 => index,
            DType::Bool => self.b.ins().icmp_imm_s(IntCC::NotEqual, index, 0),
        }
    }

    pub(super) fn float_const(&mut self, dtype: DType, x: f64) -> CValue {
        match dtype {
            DType::F64 => self.b.ins().f64const(x),
            _ => self.b.ins().f32const(x as f32),
        }
    }
}
