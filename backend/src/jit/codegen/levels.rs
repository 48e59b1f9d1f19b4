//! Memoisation and levels: where each expression is computed (entry, row or inner loop),
//! hoisting, and whether an inner loop can run on f32x4 lanes.

use super::*;

impl Gen<'_, '_> {
    pub(super) fn lookup(&self, key: &Memo) -> Option<CValue> {
        self.scopes.iter().rev().find_map(|s| s.get(key).copied())
    }

    pub(super) fn memoise(&mut self, key: Memo, x: CValue) {
        self.scopes.last_mut().expect("a scope").insert(key, x);
    }

    pub(super) fn level(&mut self, v: Value, map: &Mapping) -> Level {
        if let Some(&l) = self.levels.get(&(v, map.clone())) {
            return l;
        }
        let plan = self.plan;
        let inner = self.inner_axis();
        let axis_level = |m: Option<u8>| match m {
            None => Level::Entry,
            Some(k) if k == inner => Level::Inner,
            Some(_) => Level::Row,
        };
        let level = if plan.is_leaf_in(v, self.stage) {
            map.iter()
                .map(|&m| axis_level(m))
                .max()
                .unwrap_or(Level::Entry)
        } else {
            match plan.op(v) {
                Some((Op::Reduce { .. }, _)) => Level::Row,
                Some((Op::Const { .. }, _)) => Level::Entry,
                Some((Op::Iota { axis, .. }, _)) => axis_level(map[*axis]),
                // Only where an element is computed can a division by zero be reported.
                Some((Op::Binary(BinaryOp::Div), _)) if !self.dtype(v).is_float() => Level::Inner,
                _ => {
                    let mut l = Level::Entry;
                    for (x, m) in plan.operand_mappings(v, map) {
                        l = l.max(self.level(x, &m));
                    }
                    l
                }
            }
        };
        self.levels.insert((v, map.clone()), level);
        level
    }

    /// Emits, at the current position, every part of the `roots` expressions that is known at
    /// `up_to` (and, at row level, the base addresses of the per-element loads).
    pub(super) fn hoist(&mut self, roots: &[(Value, Mapping)], up_to: Level, vector: bool) {
        let plan = self.plan;
        let mut seen = HashSet::new();
        let mut stack = roots.to_vec();
        while let Some((v, map)) = stack.pop() {
            if !seen.insert((v, map.clone())) {
                continue;
            }
            if self.level(v, &map) <= up_to {
                // Constants stay where they are used: Cranelift rematerialises them, where a
                // hoisted one would hold a register (or a spill slot) through the loop.
                if !matches!(plan.op(v), Some((Op::Const { .. }, _))) {
                    self.emit(v, &map, vector);
                }
                continue;
            }
            if plan.is_leaf_in(v, self.stage) {
                if up_to == Level::Row {
                    self.base(plan.slot(plan.source[&v]), &map);
                }
                continue;
            }
            stack.extend(plan.operand_mappings(v, &map));
        }
    }

    /// Whether every op of the group's per-element work has an f32x4 form.
    pub(super) fn vectorizable(&mut self, works: &[Work]) -> bool {
        let plan = self.plan;
        for &w in works {
            if self.dtype(w.value()) != DType::F32 {
                return false;
            }
            for (slot, map) in self.work_destinations(w) {
                if !self.inner_stride_is_unit(slot, &map) {
                    return false;
                }
            }
        }
        let mut seen = HashSet::new();
        let mut stack = self.roots(works);
        while let Some((v, map)) = stack.pop() {
            if !seen.insert((v, map.clone())) {
                continue;
            }
            let dtype = self.dtype(v);
            if self.level(v, &map) < Level::Inner {
                if !matches!(dtype, DType::F32 | DType::Bool) {
                    return false;
                }
                continue;
            }
            if plan.is_leaf_in(v, self.stage) {
                let slot = plan.slot(plan.source[&v]);
                if dtype != DType::F32 || !self.inner_stride_is_unit(slot, &map) {
                    return false;
                }
                continue;
            }
            let (op, args) = plan.op(v).expect("an op");
            let operand = args.first().map(|&a| self.dtype(a));
            let ok = match (dtype, op) {
                (_, Op::Broadcast { .. } | Op::Reshape { .. }) => true,
                (DType::F32, Op::Unary(u)) => u.vector_form() == VectorForm::F32x4,
                (DType::F32, Op::Binary(b)) => b.vector_form() == VectorForm::F32x4,
                (DType::F32, Op::Iota { .. } | Op::Select) => true,
                (DType::F32 | DType::Bool, Op::Cast { .. }) => {
                    matches!(operand, Some(DType::F32 | DType::Bool))
                }
                (DType::Bool, Op::Compare(c)) => {
                    operand == Some(DType::F32) || matches!(c, CompareOp::Eq | CompareOp::Ne)
                }
                (DType::Bool, Op::Unary(UnaryOp::Not) | Op::Binary(_) | Op::Select) => true,
                _ => false,
            };
            if !ok {
                return false;
            }
            stack.extend(plan.operand_mappings(v, &map));
        }
        true
    }
}
