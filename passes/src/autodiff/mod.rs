//! Reverse-mode automatic differentiation as a pass over the IR.
//!
//! [`append_gradients`] extends a function with the ops that compute the gradient of a scalar
//! loss with respect to chosen values (arguments, or the results of `load`s of state). The
//! result is ordinary IR: printable, verifiable, runnable by any backend.
//!
//! How it works:
//! - *Activity*: a value is active when it depends on a value we differentiate with respect
//!   to. Only active float values receive gradients; integer, boolean and comparison results
//!   stop gradients by construction, and `stop_gradient` by definition.
//! - *Reverse sweep*: instructions are visited last to first; each instruction whose results
//!   have adjoints contributes to its active operands through its vector-Jacobian rule
//!   (`rules.rs`, one rule per op). Contributions to one value are summed.
//! - *Regions*: the gradient of a `cond` is a `cond` on the same predicate whose branches
//!   recompute the forward branch and then run the reverse sweep over it, yielding the
//!   gradients of the values the branch captured.

mod deferred;
mod rules;

use crate::loops::{Counted, counted_loop};
use crate::simplify::extract::bytes;
use deferred::{Deferred, only_deferred_uses, stack_of};
use kiln_ir::{
    BuildError, DType, Function, FunctionBuilder, Inst, Literal, Module, Op, Region, Type, UnaryOp,
    Value,
};
use std::collections::{HashMap, HashSet};

/// Why gradients could not be derived.
#[derive(Debug, thiserror::Error)]
pub enum AutodiffError {
    /// The loss is not a scalar.
    #[error("the loss must be a float scalar, found {0}")]
    LossNotScalar(Type),
    /// A `--wrt` names nothing that can be differentiated.
    #[error("cannot differentiate with respect to {value}: {reason}")]
    BadWrt {
        /// What was named.
        value: String,
        /// Why.
        reason: String,
    },
    /// An op has no gradient rule.
    #[error("`{op}` has no gradient rule yet, and the loss depends on it through {line}")]
    NoRule {
        /// The op.
        op: &'static str,
        /// The instruction, as text.
        line: String,
    },
    /// Building the gradient ops failed.
    #[error("building the gradient failed: {0}")]
    Build(#[from] BuildError),
}

/// Appends to `func`'s body the ops computing `d loss / d w` for each `w` in `wrt`, and
/// returns those gradient values (zeros where the loss does not depend on `w`). `loss` and
/// every `w` must be top-level values of `func`; `loss` a float scalar, each `w` a float.
pub fn append_gradients(
    func: &mut Function,
    loss: Value,
    wrt: &[Value],
) -> Result<Vec<Value>, AutodiffError> {
    let loss_ty = func.value_type(loss).clone();
    if !loss_ty.dtype.is_float() || loss_ty.rank() != 0 {
        return Err(AutodiffError::LossNotScalar(loss_ty));
    }
    let top: HashSet<Value> = top_level_values(func);
    for &w in wrt {
        let ty = func.value_type(w);
        let problem = if !top.contains(&w) {
            Some("it is not a top-level value of the function".to_owned())
        } else if !ty.dtype.is_float() {
            Some(format!("it has type {ty}; only floats have gradients"))
        } else {
            None
        };
        if let Some(reason) = problem {
            return Err(AutodiffError::BadWrt {
                value: format!("{w}"),
                reason,
            });
        }
    }
    let src = func.clone();
    let mut b = FunctionBuilder::resume(std::mem::replace(func, Function::new("")));
    let outcome = (|| -> Result<Vec<Value>, AutodiffError> {
        let active = activity(&src, wrt);
        let mut sweep = Sweep {
            src: &src,
            active: &active,
            remap: HashMap::new(),
            adjoints: HashMap::new(),
            deferred: HashSet::new(),
        };
        let one = b.constant(literal(loss_ty.dtype, 1.0), loss_ty.clone())?;
        sweep.adjoints.insert(loss, one);
        sweep.region(&mut b, src.body())?;
        let gradients = wrt.iter().map(|&w| sweep.adjoint_or_zeros(&mut b, w));
        Ok(gradients.collect::<Result<Vec<_>, _>>()?)
    })();
    *func = b.into_function();
    outcome
}

/// A value to differentiate with respect to, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wrt {
    /// A function argument, `%x` in the text form.
    Arg(String),
    /// A state variable, `@fc1.w`: the gradient with respect to the value its `load`s read.
    State(String),
}

impl std::str::FromStr for Wrt {
    type Err = std::convert::Infallible;

    /// `@name` is state; `%name` or `name` an argument.
    fn from_str(s: &str) -> Result<Wrt, Self::Err> {
        Ok(match s.strip_prefix('@') {
            Some(state) => Wrt::State(state.to_owned()),
            None => Wrt::Arg(s.trim_start_matches('%').to_owned()),
        })
    }
}

/// A new function `@<name>_grad` with `func`'s arguments, returning result `loss_index` of
/// `func` (the loss) followed by its gradient with respect to each of `wrt`.
pub fn gradient_function(
    module: &Module,
    func: &Function,
    loss_index: usize,
    wrt: &[Wrt],
) -> Result<Function, AutodiffError> {
    let mut f = func.clone();
    f.set_name(format!("{}_grad", func.name()));
    let loss = *f
        .results()
        .get(loss_index)
        .ok_or_else(|| AutodiffError::BadWrt {
            value: format!("result {loss_index}"),
            reason: format!("@{} has {} results", func.name(), func.results().len()),
        })?;
    let names = kiln_ir::print::ValueNames::new(&f);
    let mut targets: Vec<Vec<Value>> = Vec::new();
    for w in wrt {
        targets.push(match w {
            Wrt::Arg(name) => {
                let arg = f
                    .args()
                    .iter()
                    .copied()
                    .find(|&a| names.get(a)[1..] == **name);
                vec![arg.ok_or_else(|| AutodiffError::BadWrt {
                    value: format!("%{name}"),
                    reason: format!(
                        "@{} has no such argument; its arguments are {}",
                        func.name(),
                        f.args().iter().map(|&a| names.get(a)).collect::<Vec<_>>().join(", ")
                    ),
                })?]
            }
            Wrt::State(state) => {
                if module.state(state).is_none() {
                    return Err(AutodiffError::BadWrt {
                        value: format!("@{state}"),
                        reason: "no such state is declared".into(),
                    });
                }
                let body = f.region(f.body());
                body.insts
                    .iter()
                    .filter(|&&i| matches!(&f.inst(i).op, Op::Load { state: s, .. } if s == state))
                    .map(|&i| f.inst(i).results[0])
                    .collect()
            }
        });
    }
    let flat: Vec<Value> = targets.concat();
    let grads = append_gradients(&mut f, loss, &flat)?;
    let mut b = FunctionBuilder::resume(f);
    let mut results = vec![loss];
    let mut next = grads.into_iter();
    for (w, values) in wrt.iter().zip(&targets) {
        let mut sum: Option<Value> = None;
        for _ in values {
            let g = next.next().expect("one gradient per target");
            sum = Some(match sum {
                Some(s) => b.add(s, g)?,
                None => g,
            });
        }
        let g = match (sum, w) {
            (Some(g), _) => g,
            (None, Wrt::State(state)) => {
                let ty = module.state(state).expect("checked above").ty.clone();
                zeros(&mut b, &ty)?
            }
            (None, Wrt::Arg(_)) => unreachable!("an argument is one target"),
        };
        let name = match w {
            Wrt::Arg(n) | Wrt::State(n) => format!("grad_{n}"),
        };
        b.set_name(g, &name);
        results.push(g);
    }
    Ok(b.finish(&results)?)
}

fn top_level_values(func: &Function) -> HashSet<Value> {
    let body = func.region(func.body());
    let mut values: HashSet<Value> = body.args.iter().copied().collect();
    for &inst in &body.insts {
        values.extend(func.inst(inst).results.iter().copied());
    }
    values
}

fn literal(dtype: DType, value: f64) -> Literal {
    Literal::scalar(dtype, value)
}

/// The values that depend on `wrt` (and are floats), across all regions.
fn activity(func: &Function, wrt: &[Value]) -> HashSet<Value> {
    let mut active: HashSet<Value> = wrt.iter().copied().collect();
    mark_region(func, func.body(), &mut active);
    active
}

fn mark_region(func: &Function, region: Region, active: &mut HashSet<Value>) {
    for &inst in &func.region(region).insts {
        let data = func.inst(inst);
        let uses_active = data.args.iter().any(|a| active.contains(a))
            || data
                .regions
                .iter()
                .any(|&r| func.free_values(r).iter().any(|v| active.contains(v)));
        for &r in &data.regions {
            // Region arguments (a loop's carried values) are active when anything the
            // instruction uses is: an over-approximation that keeps loops simple.
            if uses_active {
                let floats = func
                    .region(r)
                    .args
                    .iter()
                    .filter(|&&a| func.value_type(a).dtype.is_float());
                active.extend(floats);
            }
            mark_region(func, r, active);
        }
        if uses_active && data.op != Op::Unary(UnaryOp::StopGradient) {
            for &r in &data.results {
                if func.value_type(r).dtype.is_float() {
                    active.insert(r);
                }
            }
        }
    }
}

/// The reverse sweep over one region: adjoints of the forward values, and where the forward
/// values are available in the region being built (`remap`; identity at the top level).
pub(crate) struct Sweep<'a> {
    src: &'a Function,
    active: &'a HashSet<Value>,
    remap: HashMap<Value, Value>,
    adjoints: HashMap<Value, Value>,
    /// Products whose right operand's gradient the enclosing loop computes after it.
    deferred: HashSet<Inst>,
}

impl<'a> Sweep<'a> {
    /// A sweep over a region nested in this one's: the same forward values, no adjoints yet.
    fn nested(&self) -> Sweep<'a> {
        Sweep {
            src: self.src,
            active: self.active,
            remap: self.remap.clone(),
            adjoints: HashMap::new(),
            deferred: HashSet::new(),
        }
    }

    /// The value computing forward value `v` in the region being built.
    pub(crate) fn fwd(&self, v: Value) -> Value {
        self.remap.get(&v).copied().unwrap_or(v)
    }

    pub(crate) fn ty(&self, v: Value) -> &'a Type {
        self.src.value_type(v)
    }

    pub(crate) fn is_active(&self, v: Value) -> bool {
        self.active.contains(&v)
    }

    /// Whether `inst`'s rule gives operand `i` a gradient: it is active, and not the weight
    /// of a product whose gradient the enclosing loop computes after it.
    pub(crate) fn wants_gradient(&self, inst: Inst, i: usize) -> bool {
        self.is_active(self.src.inst(inst).args[i]) && !(i == 1 && self.deferred.contains(&inst))
    }

    fn accumulate(
        &mut self,
        b: &mut FunctionBuilder,
        v: Value,
        g: Value,
    ) -> Result<(), BuildError> {
        let sum = match self.adjoints.get(&v) {
            Some(&prev) => b.add(prev, g)?,
            None => g,
        };
        self.adjoints.insert(v, sum);
        Ok(())
    }

    fn adjoint_or_zeros(&self, b: &mut FunctionBuilder, v: Value) -> Result<Value, BuildError> {
        match self.adjoints.get(&v) {
            Some(&g) => Ok(g),
            None => zeros(b, self.ty(v)),
        }
    }

    /// Runs the reverse sweep over `region`'s instructions.
    fn region(&mut self, b: &mut FunctionBuilder, region: Region) -> Result<(), AutodiffError> {
        for &inst in self.src.region(region).insts.iter().rev() {
            let results = &self.src.inst(inst).results;
            let grads: Vec<Option<Value>> = results
                .iter()
                .map(|r| self.adjoints.get(r).copied())
                .collect();
            if grads.iter().all(Option::is_none) {
                continue;
            }
            let contributions = match self.src.inst(inst).op {
                Op::Cond => self.cond(b, inst, &grads)?,
                Op::While => self.while_loop(b, inst, &grads)?,
                Op::Fused => self.fused(b, inst, &grads)?,
                _ => rules::vjp(self, b, inst, &grads)?,
            };
            for (v, g) in contributions {
                if self.is_active(v) {
                    self.accumulate(b, v, g)?;
                }
            }
        }
        Ok(())
    }

    /// The gradient of a `cond`: a `cond` on the same predicate whose branches recompute the
    /// forward branch, sweep it backwards, and yield the gradients of the captured values.
    fn cond(
        &mut self,
        b: &mut FunctionBuilder,
        inst: Inst,
        grads: &[Option<Value>],
    ) -> Result<Vec<(Value, Value)>, AutodiffError> {
        let data = self.src.inst(inst);
        let (then_r, else_r) = (data.regions[0], data.regions[1]);
        let mut captured: Vec<Value> = Vec::new();
        for r in [then_r, else_r] {
            for v in self.src.free_values(r) {
                if self.is_active(v) && !captured.contains(&v) {
                    captured.push(v);
                }
            }
        }
        if captured.is_empty() {
            return Ok(Vec::new());
        }
        let pred = self.fwd(data.args[0]);
        let seeds = |region: Region| -> Vec<(Value, Option<Value>)> {
            let yields = &self.src.region(region).results;
            yields.iter().copied().zip(grads.iter().copied()).collect()
        };
        let (then_seeds, else_seeds) = (seeds(then_r), seeds(else_r));
        let gradients = b.cond(
            pred,
            |b| self.branch(b, then_r, &then_seeds, &captured),
            |b| self.branch(b, else_r, &else_seeds, &captured),
        )?;
        Ok(captured.into_iter().zip(gradients).collect())
    }

    /// The gradient of a `while` loop. A top-level loop that counts a fixed number of trips
    /// `T` (`i` from a constant, `i < constant`, `i + 1`) keeps its states: the forward loop
    /// is replaced by one that also writes the carried values before each trip into stacks
    /// (`update_slice`, in place), and the backward loop reads them back — O(T) body
    /// evaluations and O(T) storage, as `jax.lax.scan` and PyTorch do.
    ///
    /// Any other loop is differentiated by recomputation: count the trips `T`, then for
    /// `k = T-1` down to `0` recompute the carried values before iteration `k` (running the
    /// body `k` times from the initial values) and sweep the body backwards there. That costs
    /// O(T²) body evaluations and no storage that grows with `T`.
    fn while_loop(
        &mut self,
        b: &mut FunctionBuilder,
        inst: Inst,
        grads: &[Option<Value>],
    ) -> Result<Vec<(Value, Value)>, AutodiffError> {
        let data = self.src.inst(inst);
        let (cond_r, body_r) = (data.regions[0], data.regions[1]);
        let init: Vec<Value> = data.args.iter().map(|&v| self.fwd(v)).collect();
        let floats: Vec<usize> = (0..data.args.len())
            .filter(|&i| self.ty(data.args[i]).dtype.is_float())
            .collect();
        let captured: Vec<Value> = self
            .src
            .free_values(body_r)
            .into_iter()
            .filter(|&v| self.is_active(v) && self.ty(v).dtype.is_float())
            .collect();
        if floats.is_empty() && captured.is_empty() {
            return Ok(Vec::new());
        }
        let top_level = self.src.region(self.src.body()).insts.contains(&inst);
        let counted = counted_loop(self.src, inst).filter(|c| {
            let state: f64 = data.args.iter().map(|&v| bytes(self.ty(v))).sum();
            top_level && (c.trips + 1) as f64 * state <= KEPT_STATES_BUDGET
        });
        let (trips, states, deferred) = match counted {
            Some(counted) => {
                let stacks = self.record_states(b, inst, counted)?;
                (
                    b.scalar(DType::I32, counted.trips as f64)?,
                    States::Stacks(stacks, counted),
                    self.deferred_products(body_r, &captured, counted),
                )
            }
            None => (
                self.trip_count(b, cond_r, body_r, &init)?,
                States::Recompute,
                Vec::new(),
            ),
        };
        // A captured value used only by deferred products needs no sum across the trips.
        let captured: Vec<Value> = captured
            .into_iter()
            .filter(|&v| !only_deferred_uses(self, body_r, v, &deferred))
            .collect();
        let loop_shape = LoopShape {
            body: body_r,
            init: &init,
            floats: &floats,
            captured: &captured,
            states: &states,
            deferred: &deferred,
        };
        let mut start = vec![trips];
        for &i in &floats {
            start.push(match grads[i] {
                Some(g) => g,
                None => zeros(b, self.ty(data.args[i]))?,
            });
        }
        for &v in &captured {
            start.push(zeros(b, self.ty(v))?);
        }
        for d in deferred.iter().filter(|d| d.shares.is_none()) {
            start.push(self.adjoint_stack(b, d)?);
        }
        let results = b.while_loop(
            &start,
            |b, c| {
                let zero = b.scalar(DType::I32, 0.0)?;
                Ok(b.compare(kiln_ir::CompareOp::Gt, c[0], zero)?)
            },
            |b, c| self.reverse_iteration(b, &loop_shape, c),
        )?;
        let mut out = Vec::new();
        for (k, &i) in floats.iter().enumerate() {
            out.push((data.args[i], results[1 + k]));
        }
        for (j, &v) in captured.iter().enumerate() {
            out.push((v, results[1 + floats.len() + j]));
        }
        let filled = &results[1 + floats.len() + captured.len()..];
        for (i, d) in deferred.iter().enumerate() {
            let adjoints = filled[stack_of(&deferred, i)];
            let g = self.deferred_gradient(b, d, states.stacks(), adjoints)?;
            out.push((d.weight, g));
        }
        Ok(out)
    }

    /// The gradient of a `fused` group: its body, inlined, swept backwards.
    fn fused(
        &mut self,
        b: &mut FunctionBuilder,
        inst: Inst,
        grads: &[Option<Value>],
    ) -> Result<Vec<(Value, Value)>, AutodiffError> {
        let data = self.src.inst(inst);
        let body = self.src.region(data.regions[0]);
        let mut inner = self.nested();
        for (&arg, &operand) in body.args.iter().zip(&data.args) {
            inner.remap.insert(arg, self.fwd(operand));
        }
        for &i in &body.insts {
            b.clone_inst(self.src, i, &mut inner.remap)?;
        }
        for (&y, g) in body.results.iter().zip(grads) {
            if let Some(g) = g {
                inner.accumulate(b, y, *g)?;
            }
        }
        inner.region(b, data.regions[0])?;
        let mut out = Vec::new();
        for (&arg, &operand) in body.args.iter().zip(&data.args) {
            if let Some(&g) = inner.adjoints.get(&arg) {
                out.push((operand, g));
            }
        }
        Ok(out)
    }

    /// Replaces top-level counted loop `inst` by one that also keeps its carried values in
    /// stacks (`[trips + 1, …]`, one per carried value: the states before each trip and after
    /// the last); returns the stacks.
    fn record_states(
        &mut self,
        b: &mut FunctionBuilder,
        inst: Inst,
        Counted {
            counter,
            first,
            trips,
        }: Counted,
    ) -> Result<Vec<Value>, AutodiffError> {
        let data = self.src.inst(inst);
        let (cond_r, body_r) = (data.regions[0], data.regions[1]);
        let n = data.args.len();
        let mut start: Vec<Value> = data.args.iter().map(|&v| self.fwd(v)).collect();
        // Stack `j` holds carried value `j` before trip `k` at `k`, and after the last trip
        // at `trips`: so the states on both sides of every trip.
        let mut made = Vec::new();
        let origin = b.scalar(DType::I32, 0.0)?;
        made.extend(b.last_inst());
        for &v in &data.args {
            let ty = self.ty(v);
            let mut dims = vec![kiln_ir::Dim::Fixed(trips + 1)];
            dims.extend(ty.shape.0.iter().cloned());
            let empty = zeros(b, &Type::new(ty.dtype, kiln_ir::Shape(dims)))?;
            made.extend(b.last_inst());
            start.push(b.update_slice(empty, self.fwd(v), origin, 0)?);
            made.extend(b.last_inst());
        }
        let recorded = b.while_loop(
            &start,
            |b, c| Ok::<_, BuildError>(self.clone_region(b, cond_r, &c[..n])?[0]),
            |b, c| {
                let mut next = self.clone_region(b, body_r, &c[..n])?;
                // The counter before this trip is `first + k`: the state after it goes at `k + 1`.
                let offset = b.scalar(self.ty(data.args[counter]).dtype, (1 - first) as f64)?;
                let after = b.add(c[counter], offset)?;
                for j in 0..n {
                    next.push(b.update_slice(c[n + j], next[j], after, 0)?);
                }
                Ok(next)
            },
        )?;
        made.extend(b.last_inst());
        // In the forward pass's place: right after the loop it replaces, whose results it
        // gives (the old loop is then dead).
        for &i in &made {
            b.hoist(i, Some(inst));
        }
        for (&old, &new) in data.results.iter().zip(&recorded) {
            b.replace_uses(old, new);
            self.remap.insert(old, new);
        }
        Ok(recorded[n..].to_vec())
    }

    /// Re-runs the loop with a counter: how many times the body runs.
    fn trip_count(
        &self,
        b: &mut FunctionBuilder,
        cond_r: Region,
        body_r: Region,
        init: &[Value],
    ) -> Result<Value, BuildError> {
        let zero = b.scalar(DType::I32, 0.0)?;
        let mut start = vec![zero];
        start.extend_from_slice(init);
        let counted = b.while_loop(
            &start,
            |b, c| Ok(self.clone_region(b, cond_r, &c[1..])?[0]),
            |b, c| {
                let one = b.scalar(DType::I32, 1.0)?;
                let mut next = vec![b.add(c[0], one)?];
                next.extend(self.clone_region(b, body_r, &c[1..])?);
                Ok(next)
            },
        )?;
        Ok(counted[0])
    }

    /// One step of the backward loop, whose carried values `c` are the iteration count, the
    /// adjoints of the float carried values, and the gradients gathered for captured values.
    fn reverse_iteration(
        &self,
        b: &mut FunctionBuilder,
        l: &LoopShape<'_>,
        c: &[Value],
    ) -> Result<Vec<Value>, AutodiffError> {
        let one = b.scalar(DType::I32, 1.0)?;
        let k = b.sub(c[0], one)?;
        // The carried values before iteration k: kept, or the body run k times from the start.
        let mut after = Vec::new();
        let state = match l.states {
            States::Stacks(stacks, _) => {
                let mut state = vec![k];
                for &stack in stacks {
                    state.push(b.gather(stack, k, 0)?);
                    after.push(b.gather(stack, c[0], 0)?);
                }
                state
            }
            States::Recompute => {
                let zero = b.scalar(DType::I32, 0.0)?;
                let mut start = vec![zero];
                start.extend_from_slice(l.init);
                b.while_loop(
                    &start,
                    |b, s| b.compare(kiln_ir::CompareOp::Lt, s[0], k),
                    |b, s| {
                        let one = b.scalar(DType::I32, 1.0)?;
                        let mut next = vec![b.add(s[0], one)?];
                        next.extend(self.clone_region(b, l.body, &s[1..])?);
                        Ok(next)
                    },
                )?
            }
        };
        let body = self.src.region(l.body);
        let mut inner = self.nested();
        for (&arg, &v) in body.args.iter().zip(&state[1..]) {
            inner.remap.insert(arg, v);
        }
        inner.deferred = l.deferred.iter().map(|d| d.inst).collect();
        for &inst in &body.insts {
            b.clone_inst(self.src, inst, &mut inner.remap)?;
        }
        // What the trip yields is kept too: the rules that read an op's result (tanh's) then
        // read the kept value, and the recomputation of the trip's forward ops is dead.
        for (&y, &kept) in body.results.iter().zip(&after) {
            inner.remap.insert(y, kept);
        }
        for (slot, &i) in l.floats.iter().enumerate() {
            inner.accumulate(b, body.results[i], c[1 + slot])?;
        }
        inner.region(b, l.body)?;
        let mut next = vec![k];
        for &i in l.floats {
            next.push(inner.adjoint_or_zeros(b, body.args[i])?);
        }
        for (j, &v) in l.captured.iter().enumerate() {
            let g = inner.adjoint_or_zeros(b, v)?;
            next.push(b.add(c[1 + l.floats.len() + j], g)?);
        }
        let filled = &c[1 + l.floats.len() + l.captured.len()..];
        let keepers = l.deferred.iter().filter(|d| d.shares.is_none());
        for (d, &stack) in keepers.zip(filled) {
            let y = self.src.inst(d.inst).results[0];
            next.push(match (inner.adjoints.get(&y), l.states) {
                (Some(&g), &States::Stacks(_, counted)) => {
                    let row = self.stack_row(b, d, counted, k)?;
                    b.update_slice(stack, g, row, 0)?
                }
                _ => stack,
            });
        }
        Ok(next)
    }

    /// Re-emits `region`'s instructions with its arguments bound to `args`; returns what it
    /// yields.
    fn clone_region(
        &self,
        b: &mut FunctionBuilder,
        region: Region,
        args: &[Value],
    ) -> Result<Vec<Value>, BuildError> {
        let mut remap = self.remap.clone();
        for (&a, &v) in self.src.region(region).args.iter().zip(args) {
            remap.insert(a, v);
        }
        for &inst in &self.src.region(region).insts {
            b.clone_inst(self.src, inst, &mut remap)?;
        }
        Ok(self
            .src
            .region(region)
            .results
            .iter()
            .map(|v| remap.get(v).copied().unwrap_or(*v))
            .collect())
    }

    /// Inside a new branch: recompute forward `region`, seed its yields, sweep it backwards,
    /// and return the gradients of `captured` (zeros where the branch does not use them).
    fn branch(
        &self,
        b: &mut FunctionBuilder,
        region: Region,
        seeds: &[(Value, Option<Value>)],
        captured: &[Value],
    ) -> Result<Vec<Value>, AutodiffError> {
        let mut inner = self.nested();
        for &inst in &self.src.region(region).insts {
            b.clone_inst(self.src, inst, &mut inner.remap)?;
        }
        for &(y, g) in seeds {
            if let Some(g) = g {
                inner.accumulate(b, y, g)?;
            }
        }
        inner.region(b, region)?;
        captured
            .iter()
            .map(|&v| inner.adjoint_or_zeros(b, v).map_err(AutodiffError::from))
            .collect()
    }
}

/// The most memory a loop's kept states may take (estimated as extraction does, symbolic
/// sizes at 256);
/// a loop whose states would take more is differentiated by recomputation. (It also stops a
/// loop that keeps its states from keeping stacks of stacks when it is differentiated again.)
pub(crate) const KEPT_STATES_BUDGET: f64 = (256 << 20) as f64;

/// How the backward loop gets the carried values before each forward trip.
enum States {
    /// Run the body again from the initial values.
    Recompute,
    /// Read them from the stacks the forward loop filled, one per carried value.
    Stacks(Vec<Value>, Counted),
}

impl States {
    /// The kept stacks (none when recomputing).
    fn stacks(&self) -> &[Value] {
        match self {
            States::Stacks(stacks, _) => stacks,
            States::Recompute => &[],
        }
    }
}

/// What the backward loop of a `while` needs to know about the forward loop.
struct LoopShape<'l> {
    body: Region,
    /// The initial carried values, as the gradient code sees them.
    init: &'l [Value],
    /// Which carried values are floats (they get adjoints).
    floats: &'l [usize],
    /// Active float values the body captures from outside the loop.
    captured: &'l [Value],
    states: &'l States,
    /// Products whose weight gradients are computed after the loop (kept states only).
    deferred: &'l [Deferred],
}

/// A splat of zeros of type `ty`.
pub(crate) fn zeros(b: &mut FunctionBuilder, ty: &Type) -> Result<Value, BuildError> {
    b.constant(literal(ty.dtype, 0.0), ty.clone())
}
