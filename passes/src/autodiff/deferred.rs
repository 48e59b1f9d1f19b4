//! Weight gradients of a counted loop's products, deferred to one product after the loop.
//!
//! In a loop body, `y = a · w` with `w` captured from outside contributes `aₖᵀ · gₖ` to
//! `w`'s gradient on every trip `k`. Summed over the trips that is one product of the stacked
//! left operands and the stacked adjoints, `Aᵀ · G` — what cuDNN-style recurrent layers do.
//! The backward loop then only writes `gₖ` into a stack (in place) instead of running a
//! small product and a sum every trip, and the one large product splits across threads.
//!
//! A left operand is stacked already when it is a carried value (the forward loop keeps its
//! states) or a row of a table from outside the loop gathered by the counter (the table is
//! the stack). The adjoint stack has as many rows as that source, rows no trip wrote staying
//! zero, so `A` is the source itself and nothing is copied.

use super::{KEPT_STATES_BUDGET, Sweep, zeros};
use crate::loops::{Counted, gathered_by};
use crate::simplify::extract::bytes;
use kiln_ir::{
    AxisSlice, BinaryOp, BuildError, Dim, FunctionBuilder, Inst, Op, Region, Shape, Type, Value,
};

/// A product in the loop body whose contribution to its right operand's gradient is
/// computed after the loop.
pub(super) struct Deferred {
    /// The `matmul` in the forward body.
    pub inst: Inst,
    /// Its right operand, captured from outside the loop.
    pub weight: Value,
    /// Where its left operands of every trip are, stacked.
    pub lhs: Stacked,
    /// The rows of that stack (and of the adjoints' stack).
    pub rows: usize,
    /// Another deferred product whose adjoint stack this one reads, keeping none of its own:
    /// the two results are the operands of one `add` (an RNN cell's `x·W + h·U`), so every
    /// trip gives them the same adjoint, at the same row.
    pub shares: Option<usize>,
}

/// A left operand's stack.
#[derive(Clone, Copy)]
pub(super) enum Stacked {
    /// Carried value `j`: row `k` of the states' stack `j` is its value on trip `k`.
    State(usize),
    /// `gather(table, counter, 0)`: row `first + k` of `table` on trip `k`.
    Table(Value),
}

impl Sweep<'_> {
    /// The products of loop body `body` whose weight gradients can be deferred: `a · w` or
    /// `a · wᵀ`, 2-D with fixed shapes, `w` in `captured`, `a` stacked.
    pub(super) fn deferred_products(
        &self,
        body: Region,
        captured: &[Value],
        counted: Counted,
    ) -> Vec<Deferred> {
        let region = self.src.region(body);
        let counter = region.args[counted.counter];
        let mut found = Vec::new();
        for &inst in &region.insts {
            let data = self.src.inst(inst);
            let Op::MatMul {
                transpose_a: false, ..
            } = data.op
            else {
                continue;
            };
            let (a, w) = (data.args[0], data.args[1]);
            let fixed_2d = |v: Value| {
                let shape = &self.ty(v).shape;
                shape.rank() == 2 && shape.as_fixed().is_some()
            };
            if a == w || !captured.contains(&w) || !fixed_2d(a) || !fixed_2d(w) {
                continue;
            }
            let (lhs, rows) = if let Some(j) = region.args.iter().position(|&v| v == a) {
                (Stacked::State(j), counted.trips + 1)
            } else if let Some(table) = gathered_by(self.src, a, counter) {
                // Rows no trip reads cost flops in the product.
                let rows = self.ty(table).shape.dims()[0].as_fixed().unwrap_or(0);
                if !counted.reads_most_of(rows) || !self.src.free_values(body).contains(&table) {
                    continue;
                }
                (Stacked::Table(table), rows)
            } else {
                continue;
            };
            let stack_bytes = (counted.trips + 1) as f64 * bytes(self.ty(data.results[0]));
            if stack_bytes > KEPT_STATES_BUDGET {
                continue;
            }
            found.push(Deferred {
                inst,
                weight: w,
                lhs,
                rows,
                shares: None,
            });
        }
        self.share_adjoint_stacks(body, &mut found, counted);
        found
    }

    /// Marks the products whose adjoints another product's stack holds already (see
    /// [`Deferred::shares`]): of two that qualify, the one with fewer rows keeps the stack.
    fn share_adjoint_stacks(&self, body: Region, found: &mut [Deferred], counted: Counted) {
        let region = self.src.region(body);
        let result = |d: &Deferred| self.src.inst(d.inst).results[0];
        // The one use of `y`, if that is all it has (the region's results count as uses).
        let only_user = |y: Value| {
            let mut users = (region.insts.iter()).filter(|&&i| self.src.inst(i).args.contains(&y));
            match (users.next(), users.next()) {
                (Some(&i), None) if !region.results.contains(&y) => Some(i),
                _ => None,
            }
        };
        let offset = |d: &Deferred| match d.lhs {
            Stacked::State(_) => 0,
            Stacked::Table(_) => counted.first,
        };
        for s in 0..found.len() {
            for o in 0..found.len() {
                let (keeper, reader) = (&found[o], &found[s]);
                let summed = match (only_user(result(keeper)), only_user(result(reader))) {
                    (Some(a), Some(b)) if a == b && o != s => {
                        let add = self.src.inst(a);
                        matches!(add.op, Op::Binary(BinaryOp::Add))
                            && self.ty(result(keeper)) == self.ty(result(reader))
                    }
                    _ => false,
                };
                // The keeper's rows hold every trip's row, and the reader's left operands
                // line up with them (a state stack is cut to the keeper's rows).
                let fits = offset(keeper) == offset(reader)
                    && keeper.rows as i64 >= offset(keeper) + counted.trips as i64
                    && match reader.lhs {
                        Stacked::State(_) => keeper.rows <= reader.rows,
                        Stacked::Table(_) => keeper.rows == reader.rows,
                    };
                let first_choice =
                    keeper.rows < reader.rows || (keeper.rows == reader.rows && o < s);
                if summed && fits && first_choice && keeper.shares.is_none() {
                    found[s].shares = Some(o);
                    break;
                }
            }
        }
    }

    /// The zero stack of trip adjoints of deferred product `d`'s result.
    pub(super) fn adjoint_stack(
        &self,
        b: &mut FunctionBuilder,
        d: &Deferred,
    ) -> Result<Value, BuildError> {
        let y = self.ty(self.src.inst(d.inst).results[0]);
        let mut dims = vec![Dim::Fixed(d.rows)];
        dims.extend(y.shape.dims().iter().cloned());
        zeros(b, &Type::new(y.dtype, Shape(dims)))
    }

    /// Which row of `d`'s stacks trip `k` (counting from 0) reads and writes.
    pub(super) fn stack_row(
        &self,
        b: &mut FunctionBuilder,
        d: &Deferred,
        counted: Counted,
        k: Value,
    ) -> Result<Value, BuildError> {
        match d.lhs {
            Stacked::State(_) => Ok(k),
            Stacked::Table(_) => {
                let first = b.scalar(b.value_type(k).dtype, counted.first as f64)?;
                b.add(k, first)
            }
        }
    }

    /// `d`'s contribution to its weight's gradient from the filled adjoint stack: `Aᵀ · G`
    /// (`Gᵀ · A` for a transposed weight), the stacks flattened to matrices.
    pub(super) fn deferred_gradient(
        &self,
        b: &mut FunctionBuilder,
        d: &Deferred,
        stacks: &[Value],
        adjoints: Value,
    ) -> Result<Value, BuildError> {
        let data = self.src.inst(d.inst);
        let Op::MatMul { transpose_b, .. } = data.op else {
            unreachable!("a deferred product is a matmul");
        };
        // The adjoint stack may be another product's, with fewer rows than the states.
        let rows = b.value_type(adjoints).shape.dims()[0]
            .as_fixed()
            .unwrap_or(d.rows);
        let source = match d.lhs {
            Stacked::State(j) if rows < d.rows => {
                let mut axes = vec![AxisSlice::Full; b.value_type(stacks[j]).shape.rank()];
                axes[0] = AxisSlice::Range {
                    start: 0,
                    end: rows,
                    step: 1,
                };
                b.slice(stacks[j], axes)?
            }
            Stacked::State(j) => stacks[j],
            Stacked::Table(table) => self.fwd(table),
        };
        let flat = |b: &mut FunctionBuilder, v: Value, per_trip: Value| {
            let dims = self.ty(per_trip).shape.as_fixed().unwrap_or_default();
            b.reshape(v, Shape::fixed(&[rows * dims[0], dims[1]]))
        };
        let a = flat(b, source, data.args[0])?;
        let g = flat(b, adjoints, data.results[0])?;
        if transpose_b {
            b.matmul_t(g, a, true, false)
        } else {
            b.matmul_t(a, g, true, false)
        }
    }
}

/// The place among the carried adjoint stacks of the one deferred product `i` reads: its own,
/// or the one it shares.
pub(super) fn stack_of(deferred: &[Deferred], i: usize) -> usize {
    let keeper = deferred[i].shares.unwrap_or(i);
    deferred[..keeper]
        .iter()
        .filter(|d| d.shares.is_none())
        .count()
}

/// Whether every use of `w` in `region` (nested regions included) is as the right operand
/// of one of the `deferred` products.
pub(super) fn only_deferred_uses(
    s: &Sweep<'_>,
    region: Region,
    w: Value,
    deferred: &[Deferred],
) -> bool {
    let data = s.src.region(region);
    let yields_w = data.results.contains(&w);
    !yields_w
        && data.insts.iter().all(|&inst| {
            let i = s.src.inst(inst);
            let is_deferred = deferred.iter().any(|d| d.inst == inst && d.weight == w);
            (is_deferred || !i.args.contains(&w))
                && i.regions
                    .iter()
                    .all(|&r| only_deferred_uses(s, r, w, deferred))
        })
}
