//! Buffer addresses: strides of each buffer along the domain, row bases, element
//! addresses.

use super::*;

impl Gen<'_, '_> {
    /// Strides of every buffer the stage reads or writes, computed once in the entry block.
    pub(super) fn precompute_strides(&mut self) {
        let plan = self.plan;
        let stage = &plan.stages[self.stage];
        let mut uses: Vec<(usize, Mapping)> = Vec::new();
        for &v in &stage.values {
            for (x, map) in plan.reads(v) {
                if let Some(&buffer) = plan.source.get(&x)
                    && plan.is_leaf_in(x, self.stage)
                {
                    uses.push((plan.slot(buffer), map));
                }
            }
            let works = if stage.accumulate {
                vec![Work::Combine(v)]
            } else {
                vec![Work::Store(v)]
            };
            for w in works {
                uses.extend(self.work_destinations(w));
            }
        }
        for (slot, map) in uses {
            if !self.strides.contains_key(&(slot, map.clone())) {
                let strides = self.compute_strides(slot, &map);
                self.strides.insert((slot, map), strides);
            }
        }
    }

    pub(super) fn compute_strides(&mut self, slot: usize, map: &Mapping) -> Vec<Stride> {
        let shape = self.plan.slot_type(slot).shape;
        let mut out = vec![Stride::Zero; self.dims.len()];
        // Row-major strides, from the last axis.
        let mut stride = Stride::Const(1);
        for a in (0..shape.rank()).rev() {
            if let Some(k) = map[a] {
                out[k as usize] = self.add_stride(out[k as usize], stride);
            }
            stride = match (&shape.0[a], stride) {
                (Dim::Fixed(n), Stride::Const(s)) => Stride::Const(s * *n as i64),
                (d, s) => {
                    let e = self.extent(d);
                    let s = self.stride_value(s);
                    Stride::Dyn(self.b.ins().imul(s, e))
                }
            };
        }
        out
    }

    pub(super) fn add_stride(&mut self, a: Stride, b: Stride) -> Stride {
        match (a, b) {
            (Stride::Zero, s) | (s, Stride::Zero) => s,
            (Stride::Const(x), Stride::Const(y)) => Stride::Const(x + y),
            (x, y) => {
                let (x, y) = (self.stride_value(x), self.stride_value(y));
                Stride::Dyn(self.b.ins().iadd(x, y))
            }
        }
    }

    pub(super) fn stride_value(&mut self, s: Stride) -> CValue {
        match s {
            Stride::Zero => self.b.ins().iconst(types::I64, 0),
            Stride::Const(c) => self.b.ins().iconst(types::I64, c),
            Stride::Dyn(v) => v,
        }
    }

    pub(super) fn strides(&mut self, slot: usize, map: &Mapping) -> Vec<Stride> {
        match self.strides.get(&(slot, map.clone())) {
            Some(s) => s.clone(),
            // Not precomputed (every use should be): correct, only slower.
            None => self.compute_strides(slot, map),
        }
    }

    /// The address of the buffer's element at the current row, inner position 0.
    pub(super) fn base(&mut self, slot: usize, map: &Mapping) -> CValue {
        let key = Memo::Base(slot, map.clone());
        if let Some(x) = self.lookup(&key) {
            return x;
        }
        let size = self.plan.slot_type(slot).dtype.size_bytes() as i64;
        let strides = self.strides(slot, map);
        let mut offset: Option<CValue> = None;
        for (k, &stride) in strides.iter().enumerate().take(self.dims.len() - 1) {
            let term = match stride {
                Stride::Zero => continue,
                Stride::Const(c) => self.b.ins().imul_imm_s(self.row_index[k], c * size),
                Stride::Dyn(s) => {
                    let t = self.b.ins().imul(self.row_index[k], s);
                    self.b.ins().imul_imm_s(t, size)
                }
            };
            offset = Some(match offset {
                Some(o) => self.b.ins().iadd(o, term),
                None => term,
            });
        }
        let x = match offset {
            Some(o) => self.b.ins().iadd(self.buffers[slot], o),
            None => self.buffers[slot],
        };
        self.memoise(key, x);
        x
    }

    /// The address of the buffer's element at the current row and inner position.
    pub(super) fn address(&mut self, slot: usize, map: &Mapping, dtype: DType) -> CValue {
        let base = self.base(slot, map);
        let inner = self.strides(slot, map)[self.dims.len() - 1];
        let size = dtype.size_bytes() as i64;
        let Some(j) = self.inner else {
            return base;
        };
        match inner {
            Stride::Zero => base,
            Stride::Const(c) => {
                let offset = self.b.ins().imul_imm_s(j, c * size);
                self.b.ins().iadd(base, offset)
            }
            Stride::Dyn(s) => {
                let t = self.b.ins().imul(j, s);
                let offset = self.b.ins().imul_imm_s(t, size);
                self.b.ins().iadd(base, offset)
            }
        }
    }

    pub(super) fn inner_stride_is_unit(&mut self, slot: usize, map: &Mapping) -> bool {
        matches!(
            self.strides(slot, map)[self.dims.len() - 1],
            Stride::Const(1)
        )
    }
}
