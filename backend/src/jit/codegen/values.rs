//! Values: leaves loaded from buffers, ops dispatched to their code, constants, iota.

use super::*;

impl Gen<'_, '_> {
    pub(super) fn emit(&mut self, v: Value, map: &Mapping, vector: bool) -> CValue {
        let key = Memo::Value(v, map.clone(), vector);
        if let Some(x) = self.lookup(&key) {
            return x;
        }
        let stashed = self
            .stash_out
            .iter()
            .find(|s| s.value == v && s.map == *map)
            .map(|s| (s.slot, s.slot_map.clone()));
        let x = if let Some((slot, slot_map)) = stashed {
            let addr = self.address(slot, &slot_map, self.dtype(v));
            let ty = if vector {
                types::F32X4
            } else {
                clif_type(self.dtype(v))
            };
            self.b.ins().load(ty, flags(), addr, 0)
        } else if vector && self.level(v, map) < Level::Inner {
            let s = self.emit(v, map, false);
            self.splat(self.dtype(v), s)
        } else {
            self.compute(v, map, vector)
        };
        self.memoise(key, x);
        x
    }

    pub(super) fn compute(&mut self, v: Value, map: &Mapping, vector: bool) -> CValue {
        let plan = self.plan;
        let dtype = self.dtype(v);
        if plan.is_leaf_in(v, self.stage) {
            let slot = plan.slot(plan.source[&v]);
            let addr = self.address(slot, map, dtype);
            let ty = if vector {
                types::F32X4
            } else {
                clif_type(dtype)
            };
            return self.b.ins().load(ty, flags(), addr, 0);
        }
        let (op, args) = plan.op(v).expect("only arguments have no op");
        let operands = plan.operand_mappings(v, map);
        let arg = |g: &mut Self, i: usize| {
            let (x, m) = &operands[i];
            g.emit(*x, m, vector)
        };
        match op {
            Op::Reduce { .. } => {
                panic!("kernel codegen: a reduction is read before it is computed")
            }
            Op::Const { value, .. } => self.constant(value, vector),
            Op::Iota { axis, .. } => self.iota(map[*axis], dtype, vector),
            Op::Broadcast { .. } | Op::Reshape { .. } => arg(self, 0),
            Op::Unary(u) => {
                let x = arg(self, 0);
                self.unary(*u, dtype, x, vector)
            }
            Op::Binary(o) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.binary(*o, dtype, x, y, vector)
            }
            Op::Compare(c) => {
                let (x, y) = (arg(self, 0), arg(self, 1));
                self.compare(*c, self.dtype(args[0]), x, y, vector)
            }
            Op::Select => {
                let (c, x, y) = (arg(self, 0), arg(self, 1), arg(self, 2));
                if !vector {
                    self.b.ins().select(c, x, y)
                } else if dtype == DType::Bool {
                    self.b.ins().bitselect(c, x, y)
                } else {
                    let mask = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), c);
                    self.b.ins().bitselect(mask, x, y)
                }
            }
            Op::Cast { to } => {
                let x = arg(self, 0);
                self.cast(self.dtype(args[0]), *to, x, vector)
            }
            other => panic!("kernel codegen: `{}` is not a kernel op", other.name()),
        }
    }

    pub(super) fn splat(&mut self, dtype: DType, s: CValue) -> CValue {
        match dtype {
            DType::F32 => self.b.ins().splat(types::F32X4, s),
            DType::Bool => {
                let wide = self.b.ins().uextend(types::I32, s);
                let mask = self.b.ins().ineg(wide);
                self.b.ins().splat(types::I32X4, mask)
            }
            other => panic!("kernel codegen: no vector form for {other}"),
        }
    }

    pub(super) fn constant(&mut self, value: &Literal, vector: bool) -> CValue {
        let ins = self.b.ins();
        let s = match value {
            Literal::F32(v) => ins.f32const(v[0]),
            Literal::F64(v) => ins.f64const(v[0]),
            Literal::I32(v) => ins.iconst(types::I32, i64::from(v[0])),
            Literal::I64(v) => ins.iconst(types::I64, v[0]),
            Literal::Bool(v) => ins.iconst(types::I8, i64::from(v[0])),
        };
        if vector {
            self.splat(value.dtype(), s)
        } else {
            s
        }
    }

    pub(super) fn iota(&mut self, axis: Option<u8>, dtype: DType, vector: bool) -> CValue {
        let index = match axis {
            None => self.b.ins().iconst(types::I64, 0),
            Some(k) if k == self.inner_axis() => self.inner.expect("inside an inner loop"),
            Some(k) => self.row_index[k as usize],
        };
        let s = self.index_as(index, dtype);
        if !vector {
            return s;
        }
        // Lane i holds index + i.
        let base = self.b.ins().splat(types::F32X4, s);
        let bytes: Vec<u8> = [0.0f32, 1.0, 2.0, 3.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let c = self.b.func.dfg.constants.insert(bytes.into());
        let lanes = self.b.ins().vconst(types::F32X4, c);
        self.b.ins().fadd(base, lanes)
    }

    pub(super) fn index_as(&mut self, index: CValue, dtype: DType) -> CValue {
        match dtype {
            DType::F32 | DType::F64 => self.b.ins().fcvt_from_sint(clif_type(dtype), index),
            DType::I32 => self.b.ins().ireduce(types::I32, index),
            DType::I64 => index,
            DType::Bool => self.b.ins().icmp_imm_s(IntCC::NotEqual, index, 0),
        }
    }

    pub(super) fn float_const(&mut self, dtype: DType, x: f64, vector: bool) -> CValue {
        match dtype {
            DType::F64 => self.b.ins().f64const(x),
            _ => Clif::new(&mut self.b, DType::F32, vector).f(x as f32),
        }
    }
}
