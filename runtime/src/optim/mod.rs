//! Optimizers for static programs: `minimize(loss)` appends the gradient ops and the update
//! ops (`store`s of new parameter values) and returns them as a runnable [`Target`].
//!
//! Each optimizer is a pure rule `step(param, grad, state) -> (param, state)` written with IR
//! ops. Its state (moments, a step counter) is declared in the module, so checkpoints save it;
//! it is named `<optimizer>.<moment>.<param>`. A rate may follow a [`Schedule`] of the
//! optimizer's step counter, [`ClipGradNorm`] scales every gradient by their global norm
//! before any rule sees them, and [`accumulate_gradients`] updates from micro-batches.

mod accumulate;
mod clip;
mod schedule;

pub use accumulate::{Accumulation, accumulate_gradients};
pub use clip::ClipGradNorm;
pub use schedule::Schedule;

use crate::error::{RuntimeError, RuntimeResult};
use crate::program::{Program, Target};
use kiln_ir::{BinaryOp, DType, Initializer, StateDecl, Type, Value};

/// The learning rate: a constant, or a scalar placeholder fed at each run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LearningRate {
    /// A constant.
    Const(f64),
    /// A value of the program (a placeholder, say), read at each run.
    Feed(Value),
    /// A schedule of the optimizer's step counter, computed in the program.
    Schedule(Schedule),
}

impl From<f64> for LearningRate {
    fn from(lr: f64) -> LearningRate {
        LearningRate::Const(lr)
    }
}

impl From<Schedule> for LearningRate {
    fn from(schedule: Schedule) -> LearningRate {
        LearningRate::Schedule(schedule)
    }
}

impl LearningRate {
    /// The rate as a value of `dtype`; `step` gives the rule's count of updates including
    /// this one, which only a schedule asks for.
    fn value(
        self,
        p: &mut Program,
        dtype: DType,
        step: impl FnOnce(&mut Program) -> RuntimeResult<Value>,
    ) -> RuntimeResult<Value> {
        Ok(match self {
            LearningRate::Const(lr) => p.scalar(dtype, lr)?,
            LearningRate::Feed(v) => p.cast(v, dtype)?,
            LearningRate::Schedule(schedule) => {
                let t = step(p)?;
                schedule.value(p, t, dtype)?
            }
        })
    }
}

/// One parameter to update: its state, its current value, its gradient.
pub struct Update<'a> {
    /// The parameter's state.
    pub decl: &'a StateDecl,
    /// Its value in the program.
    pub value: Value,
    /// Its gradient.
    pub grad: Value,
}

/// The result of a step: the parameter's next value and the next values of the optimizer's
/// state for it.
pub struct Step {
    /// The parameter's new value.
    pub param: Value,
    /// The optimizer's new state values, with their declarations.
    pub state: Vec<(StateDecl, Value)>,
}

/// An update rule: given a parameter and its gradient, the ops of its new value (and of the
/// optimizer's state). `minimize` adds gradient and update ops to a program.
pub trait Optimizer {
    /// A name unique within the program, prefixing the optimizer's state.
    fn name(&self) -> &str;

    /// Adds the ops of one parameter's update.
    fn step(&mut self, p: &mut Program, update: &Update<'_>) -> RuntimeResult<Step>;

    /// Optimizer-wide state to store once all parameters are updated (a step counter).
    fn finish(&mut self, _p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        Ok(Vec::new())
    }

    /// The learning rate the next update ops are built with, if the rule has one.
    fn learning_rate(&self) -> Option<LearningRate> {
        None
    }

    /// Builds the next update ops with `lr` (a placeholder, for a schedule). A rule without a
    /// learning rate refuses.
    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        let _ = lr;
        Err(RuntimeError::Usage(format!(
            "the optimizer `{}` has no learning rate to set",
            self.name()
        )))
    }

    /// Gradient and update ops for every trainable parameter `loss` depends on.
    fn minimize(&mut self, p: &mut Program, loss: Value) -> RuntimeResult<Target> {
        let params: Vec<String> = p.params().iter().map(|q| q.name.clone()).collect();
        self.minimize_params(p, loss, &params)
    }

    /// Gradient and update ops for the named parameters that `loss` depends on (a GAN's
    /// generator step updates the generator's parameters only).
    fn minimize_params(
        &mut self,
        p: &mut Program,
        loss: Value,
        names: &[String],
    ) -> RuntimeResult<Target> {
        let updates = gradient_updates(p, loss, names)?;
        self.apply_gradients(p, &updates, "minimize")
    }

    /// Update ops for each `(parameter, current value, gradient)`, grouped as the target
    /// `<optimizer>.<suffix>`.
    fn apply_gradients(
        &mut self,
        p: &mut Program,
        updates: &[(StateDecl, Value, Value)],
        suffix: &str,
    ) -> RuntimeResult<Target> {
        let mut stores = Vec::new();
        for (decl, value, grad) in updates {
            let update = Update {
                decl,
                value: *value,
                grad: *grad,
            };
            let step = self.step(p, &update)?;
            stores.push(p.store(decl, step.param)?);
            for (state, next) in &step.state {
                stores.push(p.store(state, *next)?);
            }
        }
        finish_target(self, p, stores, suffix)
    }
}

/// A boxed rule is a rule (chosen at run time, as the Python bindings do), with every method,
/// overrides included, the inner rule's.
impl<O: Optimizer + ?Sized> Optimizer for Box<O> {
    fn name(&self) -> &str {
        (**self).name()
    }

    fn step(&mut self, p: &mut Program, update: &Update<'_>) -> RuntimeResult<Step> {
        (**self).step(p, update)
    }

    fn finish(&mut self, p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        (**self).finish(p)
    }

    fn learning_rate(&self) -> Option<LearningRate> {
        (**self).learning_rate()
    }

    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        (**self).set_learning_rate(lr)
    }

    fn minimize(&mut self, p: &mut Program, loss: Value) -> RuntimeResult<Target> {
        (**self).minimize(p, loss)
    }

    fn minimize_params(
        &mut self,
        p: &mut Program,
        loss: Value,
        names: &[String],
    ) -> RuntimeResult<Target> {
        (**self).minimize_params(p, loss, names)
    }

    fn apply_gradients(
        &mut self,
        p: &mut Program,
        updates: &[(StateDecl, Value, Value)],
        suffix: &str,
    ) -> RuntimeResult<Target> {
        (**self).apply_gradients(p, updates, suffix)
    }
}

/// `stores` and the stores of `rule`'s optimizer-wide state ([`Optimizer::finish`]), as the
/// target `<rule>.<suffix>`.
pub(crate) fn finish_target<O: Optimizer + ?Sized>(
    rule: &mut O,
    p: &mut Program,
    mut stores: Vec<kiln_ir::Inst>,
    suffix: &str,
) -> RuntimeResult<Target> {
    for (state, next) in rule.finish(p)? {
        stores.push(p.store(&state, next)?);
    }
    let name = format!("{}.{suffix}", rule.name());
    p.add_target(&name, stores)
}

/// `(parameter, current value, gradient of loss)` for each named parameter that `loss`
/// depends on: what [`Optimizer::minimize_params`] updates. A name that is no parameter of
/// the program is an error (a misspelt name would train nothing), and so is a list of which
/// `loss` depends on none (TF's "no gradients provided for any variable").
pub fn gradient_updates(
    p: &mut Program,
    loss: Value,
    names: &[String],
) -> RuntimeResult<Vec<(StateDecl, Value, Value)>> {
    if let Some(unknown) = (names.iter()).find(|n| !p.params().iter().any(|q| &q.name == *n)) {
        let known: Vec<&str> = p.params().iter().map(|q| q.name.as_str()).collect();
        return Err(RuntimeError::Usage(format!(
            "minimize: `{unknown}` is not a parameter of the program; its parameters are: {}",
            known.join(", ")
        )));
    }
    let ancestors = p.ancestors(loss);
    let params: Vec<(StateDecl, Value)> = p
        .params()
        .iter()
        .filter(|q| names.contains(&q.name) && ancestors.contains(&q.value))
        .map(|q| {
            (
                p.module()
                    .state(&q.name)
                    .expect("parameters are declared")
                    .clone(),
                q.value,
            )
        })
        .collect();
    if params.is_empty() && !names.is_empty() {
        return Err(RuntimeError::Usage(format!(
            "minimize: the loss {} depends on none of the parameters it should train ({}), so \
             no gradient reaches them",
            p.describe(loss),
            names.join(", ")
        )));
    }
    let values: Vec<Value> = params.iter().map(|(_, v)| *v).collect();
    let grads = p.gradients(loss, &values)?;
    Ok(params
        .into_iter()
        .zip(grads)
        .map(|((decl, value), grad)| (decl, value, grad))
        .collect())
}

/// `t + 1`, the step an update makes: the optimizer's f32 counter `<name>.step`, declared by
/// the first parameter's update and kept in `counter` until [`Optimizer::finish`] stores it.
fn next_step(
    p: &mut Program,
    name: &str,
    counter: &mut Option<(StateDecl, Value)>,
) -> RuntimeResult<Value> {
    if let Some((_, t)) = counter {
        return Ok(*t);
    }
    let (decl, t) = p.state(
        &format!("{name}.step"),
        Type::scalar(DType::F32),
        Initializer::constant(0.0),
    )?;
    let one = p.scalar(DType::F32, 1.0)?;
    let t_next = p.add(t, one)?;
    *counter = Some((decl, t_next));
    Ok(t_next)
}

/// The gradient with L2 weight decay added, as PyTorch's optimizers add it: `g + λ·w`.
fn decayed(p: &mut Program, u: &Update<'_>, weight_decay: f64) -> RuntimeResult<Value> {
    if weight_decay == 0.0 {
        return Ok(u.grad);
    }
    let lambda = p.scalar(u.decl.ty.dtype, weight_decay)?;
    let decay = p.mul(u.value, lambda)?;
    Ok(p.add(u.grad, decay)?)
}

/// Declares a zero-initialised moment of `decl`'s type; returns it and its current value.
fn moment(
    p: &mut Program,
    optimizer: &str,
    kind: &str,
    decl: &StateDecl,
) -> RuntimeResult<(StateDecl, Value)> {
    p.state(
        &format!("{optimizer}.{kind}.{}", decl.name),
        decl.ty.clone(),
        Initializer::constant(0.0),
    )
}

/// Plain stochastic gradient descent: `w ← w − lr·g` (with weight decay λ, `g + λ·w` for `g`).
pub struct Sgd {
    name: String,
    lr: LearningRate,
    weight_decay: f64,
    /// The step counter (with a scheduled rate only).
    step: Option<(StateDecl, Value)>,
}

impl Sgd {
    /// Plain gradient descent at learning rate `lr`.
    pub fn new(lr: impl Into<LearningRate>) -> Sgd {
        Sgd::named("sgd", lr)
    }

    /// Gradient descent whose state (none) is named after `name`.
    pub fn named(name: &str, lr: impl Into<LearningRate>) -> Sgd {
        Sgd {
            name: name.to_owned(),
            lr: lr.into(),
            weight_decay: 0.0,
            step: None,
        }
    }

    /// L2 weight decay `λ`, added to the gradient as `λ·w` (PyTorch's `weight_decay`).
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &str {
        &self.name
    }

    fn finish(&mut self, _p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        Ok(self.step.take().into_iter().collect())
    }

    fn learning_rate(&self) -> Option<LearningRate> {
        Some(self.lr)
    }

    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        self.lr = lr;
        Ok(())
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let grad = decayed(p, u, self.weight_decay)?;
        let lr = (self.lr).value(p, u.decl.ty.dtype, |p| {
            next_step(p, &self.name, &mut self.step)
        })?;
        let delta = p.mul(grad, lr)?;
        let param = p.sub(u.value, delta)?;
        Ok(Step {
            param,
            state: Vec::new(),
        })
    }
}

/// SGD with momentum (as PyTorch writes it): `v ← μ·v + (1 − d)·g`, `w ← w − lr·v`; with
/// Nesterov's correction `w ← w − lr·(g + μ·v)`; with weight decay λ, `g + λ·w` for `g`.
pub struct Momentum {
    name: String,
    lr: LearningRate,
    momentum: f64,
    dampening: f64,
    nesterov: bool,
    weight_decay: f64,
    /// The step counter (with dampening only: the first step enters undamped).
    step: Option<(StateDecl, Value)>,
}

impl Momentum {
    /// Gradient descent with momentum (PyTorch's form).
    pub fn new(lr: impl Into<LearningRate>, momentum: f64) -> Momentum {
        Momentum::named("momentum", lr, momentum)
    }

    /// Momentum whose velocity states are named after `name`.
    pub fn named(name: &str, lr: impl Into<LearningRate>, momentum: f64) -> Momentum {
        Momentum {
            name: name.to_owned(),
            lr: lr.into(),
            momentum,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            step: None,
        }
    }

    /// Dampening `d`: the gradient enters the velocity as `(1 − d)·g`, but on the first step
    /// the velocity is the gradient itself (PyTorch's rule).
    pub fn with_dampening(mut self, dampening: f64) -> Momentum {
        self.dampening = dampening;
        self
    }

    /// Nesterov momentum: the step is `g + μ·v` (PyTorch's `nesterov=True`).
    pub fn with_nesterov(mut self, nesterov: bool) -> Momentum {
        self.nesterov = nesterov;
        self
    }

    /// L2 weight decay `λ`, added to the gradient as `λ·w`.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Momentum {
        self.weight_decay = weight_decay;
        self
    }
}

impl Optimizer for Momentum {
    fn name(&self) -> &str {
        &self.name
    }

    fn finish(&mut self, _p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        Ok(self.step.take().into_iter().collect())
    }

    fn learning_rate(&self) -> Option<LearningRate> {
        Some(self.lr)
    }

    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        self.lr = lr;
        Ok(())
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let dtype = u.decl.ty.dtype;
        let grad = decayed(p, u, self.weight_decay)?;
        let (v_decl, v) = moment(p, &self.name, "velocity", u.decl)?;
        let mu = p.scalar(dtype, self.momentum)?;
        let kept = p.mul(v, mu)?;
        let entering = if self.dampening == 0.0 {
            grad
        } else {
            // 1 − d·min(t − 1, 1): 1 on the first step, 1 − d after.
            let t = next_step(p, &self.name, &mut self.step)?;
            let t = p.cast(t, dtype)?;
            let one = p.scalar(dtype, 1.0)?;
            let since_first = p.sub(t, one)?;
            let after_first = p.binary(BinaryOp::Min, since_first, one)?;
            let d = p.scalar(dtype, self.dampening)?;
            let damping = p.mul(after_first, d)?;
            let factor = p.sub(one, damping)?;
            p.mul(grad, factor)?
        };
        let v_next = p.add(kept, entering)?;
        let direction = if self.nesterov {
            let ahead = p.mul(v_next, mu)?;
            p.add(grad, ahead)?
        } else {
            v_next
        };
        let lr = (self.lr).value(p, dtype, |p| next_step(p, &self.name, &mut self.step))?;
        let delta = p.mul(direction, lr)?;
        let param = p.sub(u.value, delta)?;
        Ok(Step {
            param,
            state: vec![(v_decl, v_next)],
        })
    }
}

/// Adam (Kingma & Ba 2015), with PyTorch's bias correction:
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
/// `w ← w − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)`. Weight decay λ is L2 (`g + λ·w` for `g`,
/// PyTorch's `Adam`) or decoupled (`w ← w − lr·λ·w` first, PyTorch's `AdamW`).
pub struct Adam {
    name: String,
    lr: LearningRate,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    /// Whether vectors and scalars (biases, norms' scales) are left undecayed.
    decay_matrices_only: bool,
    /// The step counter's state and `t + 1`, made by the first parameter's step.
    step: Option<(StateDecl, Value)>,
}

impl Adam {
    /// Adam at learning rate `lr`, betas 0.9 and 0.999, eps 1e-8.
    pub fn new(lr: impl Into<LearningRate>) -> Adam {
        Adam::named("adam", lr)
    }

    /// Adam whose moment states are named after `name`.
    pub fn named(name: &str, lr: impl Into<LearningRate>) -> Adam {
        Adam {
            name: name.to_owned(),
            lr: lr.into(),
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
            decay_matrices_only: false,
            step: None,
        }
    }

    /// L2 weight decay `λ`, added to the gradient as `λ·w` (PyTorch's `Adam(weight_decay=λ)`).
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Adam {
        (self.weight_decay, self.decoupled) = (weight_decay, false);
        self
    }

    /// Decoupled weight decay `λ`: `w ← w − lr·λ·w` before the step (PyTorch's `AdamW`).
    pub fn with_decoupled_weight_decay(mut self, weight_decay: f64) -> Adam {
        (self.weight_decay, self.decoupled) = (weight_decay, true);
        self
    }

    /// Decays only parameters of rank 2 or more (products' weights and embeddings), not
    /// biases or norms' scales and shifts — the split GPT recipes make with two parameter
    /// groups in PyTorch.
    pub fn decaying_matrices_only(mut self) -> Adam {
        self.decay_matrices_only = true;
        self
    }

    /// The weight decay of `decl`.
    fn weight_decay_of(&self, decl: &StateDecl) -> f64 {
        match self.decay_matrices_only && decl.ty.rank() < 2 {
            true => 0.0,
            false => self.weight_decay,
        }
    }

    /// Other betas.
    pub fn with_betas(mut self, beta1: f64, beta2: f64) -> Adam {
        self.beta1 = beta1;
        self.beta2 = beta2;
        self
    }

    /// Another eps.
    pub fn with_eps(mut self, eps: f64) -> Adam {
        self.eps = eps;
        self
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &str {
        &self.name
    }

    fn learning_rate(&self) -> Option<LearningRate> {
        Some(self.lr)
    }

    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        self.lr = lr;
        Ok(())
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let dtype = u.decl.ty.dtype;
        let t = next_step(p, &self.name, &mut self.step)?;
        let t = p.cast(t, dtype)?;
        let weight_decay = self.weight_decay_of(u.decl);
        let l2 = if self.decoupled { 0.0 } else { weight_decay };
        let grad = decayed(p, u, l2)?;
        let u = &Update { grad, ..*u };
        let (m_decl, m) = moment(p, &self.name, "m", u.decl)?;
        let (v_decl, v) = moment(p, &self.name, "v", u.decl)?;
        let (b1, b2, one) = (
            p.scalar(dtype, self.beta1)?,
            p.scalar(dtype, self.beta2)?,
            p.scalar(dtype, 1.0)?,
        );
        let one_minus_b1 = p.scalar(dtype, 1.0 - self.beta1)?;
        let one_minus_b2 = p.scalar(dtype, 1.0 - self.beta2)?;
        let m_old = p.mul(m, b1)?;
        let m_new = p.mul(u.grad, one_minus_b1)?;
        let m_next = p.add(m_old, m_new)?;
        let g2 = p.mul(u.grad, u.grad)?;
        let v_old = p.mul(v, b2)?;
        let v_new = p.mul(g2, one_minus_b2)?;
        let v_next = p.add(v_old, v_new)?;
        // Bias corrections 1 − βᵗ.
        let b1t = p.binary(BinaryOp::Pow, b1, t)?;
        let bc1 = p.sub(one, b1t)?;
        let b2t = p.binary(BinaryOp::Pow, b2, t)?;
        let bc2 = p.sub(one, b2t)?;
        let sqrt_v = p.sqrt(v_next)?;
        let sqrt_bc2 = p.sqrt(bc2)?;
        let scaled = p.div(sqrt_v, sqrt_bc2)?;
        let eps = p.scalar(dtype, self.eps)?;
        let denom = p.add(scaled, eps)?;
        let lr = (self.lr).value(p, dtype, |p| next_step(p, &self.name, &mut self.step))?;
        let step_size = p.div(lr, bc1)?;
        let ratio = p.div(m_next, denom)?;
        let delta = p.mul(ratio, step_size)?;
        let start = if self.decoupled && weight_decay != 0.0 {
            let lambda = p.scalar(dtype, weight_decay)?;
            let rate = p.mul(lr, lambda)?;
            let decay = p.mul(u.value, rate)?;
            p.sub(u.value, decay)?
        } else {
            u.value
        };
        let param = p.sub(start, delta)?;
        Ok(Step {
            param,
            state: vec![(m_decl, m_next), (v_decl, v_next)],
        })
    }

    fn finish(&mut self, _p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        Ok(self.step.take().into_iter().collect())
    }
}
