//! Optimizers for static programs: `minimize(loss)` appends the gradient ops and the update
//! ops (`store`s of new parameter values) and returns them as a runnable [`Target`].
//!
//! Each optimizer is a pure rule `step(param, grad, state) -> (param, state)` written with IR
//! ops. Its state (moments, a step counter) is declared in the module, so checkpoints save it;
//! it is named `<optimizer>.<moment>.<param>`.

use crate::error::RuntimeResult;
use crate::program::{Program, Target};
use kiln_ir::{BinaryOp, DType, Initializer, StateDecl, Type, Value};

/// The learning rate: a constant, or a scalar placeholder fed at each run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LearningRate {
    /// A constant.
    Const(f64),
    /// A value of the program (a placeholder, say), read at each run.
    Feed(Value),
}

impl From<f64> for LearningRate {
    fn from(lr: f64) -> LearningRate {
        LearningRate::Const(lr)
    }
}

impl LearningRate {
    fn value(self, p: &mut Program, dtype: DType) -> RuntimeResult<Value> {
        Ok(match self {
            LearningRate::Const(lr) => p.scalar(dtype, lr)?,
            LearningRate::Feed(v) => p.cast(v, dtype)?,
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
/// depends on: what [`Optimizer::minimize_params`] updates.
pub fn gradient_updates(
    p: &mut Program,
    loss: Value,
    names: &[String],
) -> RuntimeResult<Vec<(StateDecl, Value, Value)>> {
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
    let values: Vec<Value> = params.iter().map(|(_, v)| *v).collect();
    let grads = p.gradients(loss, &values)?;
    Ok(params
        .into_iter()
        .zip(grads)
        .map(|((decl, value), grad)| (decl, value, grad))
        .collect())
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

/// Plain stochastic gradient descent: `w ← w − lr·g`.
pub struct Sgd {
    name: String,
    lr: LearningRate,
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
        }
    }
}

impl Optimizer for Sgd {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let lr = self.lr.value(p, u.decl.ty.dtype)?;
        let delta = p.mul(u.grad, lr)?;
        let param = p.sub(u.value, delta)?;
        Ok(Step {
            param,
            state: Vec::new(),
        })
    }
}

/// SGD with momentum (as PyTorch writes it): `v ← μ·v + g`, `w ← w − lr·v`.
pub struct Momentum {
    name: String,
    lr: LearningRate,
    momentum: f64,
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
        }
    }
}

impl Optimizer for Momentum {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let dtype = u.decl.ty.dtype;
        let (v_decl, v) = moment(p, &self.name, "velocity", u.decl)?;
        let mu = p.scalar(dtype, self.momentum)?;
        let decayed = p.mul(v, mu)?;
        let v_next = p.add(decayed, u.grad)?;
        let lr = self.lr.value(p, dtype)?;
        let delta = p.mul(v_next, lr)?;
        let param = p.sub(u.value, delta)?;
        Ok(Step {
            param,
            state: vec![(v_decl, v_next)],
        })
    }
}

/// Adam (Kingma & Ba 2015), with PyTorch's bias correction:
/// `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
/// `w ← w − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)`.
pub struct Adam {
    name: String,
    lr: LearningRate,
    beta1: f64,
    beta2: f64,
    eps: f64,
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
            step: None,
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

    /// `t + 1`, the step this update makes (the counter is f32 state `<name>.step`).
    fn next_step(&mut self, p: &mut Program) -> RuntimeResult<Value> {
        if let Some((_, t)) = &self.step {
            return Ok(*t);
        }
        let name = format!("{}.step", self.name);
        let (decl, t) = p.state(&name, Type::scalar(DType::F32), Initializer::constant(0.0))?;
        let one = p.scalar(DType::F32, 1.0)?;
        let t_next = p.add(t, one)?;
        self.step = Some((decl, t_next));
        Ok(t_next)
    }
}

impl Optimizer for Adam {
    fn name(&self) -> &str {
        &self.name
    }

    fn step(&mut self, p: &mut Program, u: &Update<'_>) -> RuntimeResult<Step> {
        let dtype = u.decl.ty.dtype;
        let t = self.next_step(p)?;
        let t = p.cast(t, dtype)?;
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
        let lr = self.lr.value(p, dtype)?;
        let step_size = p.div(lr, bc1)?;
        let ratio = p.div(m_next, denom)?;
        let delta = p.mul(ratio, step_size)?;
        let param = p.sub(u.value, delta)?;
        Ok(Step {
            param,
            state: vec![(m_decl, m_next), (v_decl, v_next)],
        })
    }

    fn finish(&mut self, _p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        Ok(self.step.take().into_iter().collect())
    }
}
