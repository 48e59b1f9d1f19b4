//! Optimizers for eager code, with the same update rules as static programs.
//!
//! An [`EagerOptimizer`] builds, once, a small static program that applies a rule (`Sgd`,
//! `Momentum`, `Adam`, …) to its parameters given their gradients as placeholders; `step()`
//! feeds the gradients `backward()` accumulated and runs it against this thread's scope. So
//! each optimizer is written once, and its moments live in the scope (and checkpoints).

use super::nn::Parameter;
use super::{EagerResult, with};
use crate::optim::{LearningRate, Optimizer};
use crate::program::{Program, Target};
use crate::session::{Fetch, Runner};
use kiln_backend::Array;
use kiln_ir::{DType, StateDecl, Value};

/// The placeholder an eager optimizer's learning rate is fed through.
const LEARNING_RATE: &str = "learning_rate";

/// An optimizer for eager parameters: each `step` applies the update of a static [`crate::Optimizer`] to the gradients `backward()` left.
pub struct EagerOptimizer {
    program: Program,
    runner: Runner,
    params: Vec<Parameter>,
    target: Target,
    /// The learning rate fed to each step (a schedule changes it), when the rule has one.
    learning_rate: Option<f64>,
}

impl EagerOptimizer {
    /// An optimizer applying `rule` to `params`.
    pub fn new(mut rule: impl Optimizer, params: Vec<Parameter>) -> EagerResult<EagerOptimizer> {
        let mut program = Program::new();
        // A constant learning rate becomes a scalar fed at each step, so that a schedule can
        // change it without building the update again.
        let learning_rate = match rule.learning_rate() {
            Some(LearningRate::Const(lr)) => {
                let fed = program.placeholder(LEARNING_RATE, DType::F64, Vec::new())?;
                rule.set_learning_rate(LearningRate::Feed(fed))?;
                Some(lr)
            }
            _ => None,
        };
        let mut updates: Vec<(StateDecl, Value, Value)> = Vec::new();
        for (i, p) in params.iter().enumerate() {
            p.check_thread()?;
            let value = program.adopt_parameter(p.decl())?;
            let ty = p.decl().ty.clone();
            let grad = program.placeholder(&format!("grad{i}"), ty.dtype, ty.shape)?;
            updates.push((p.decl().clone(), value, grad));
        }
        let target = rule.apply_gradients(&mut program, &updates, "step")?;
        // The rule's state exists from now on, so that a checkpoint can restore it before
        // the first step.
        with(|cx| Ok(cx.scope.declare(program.module())?))?;
        Ok(EagerOptimizer {
            program,
            runner: Runner::new(),
            params,
            target,
            learning_rate,
        })
    }

    /// The learning rate of the next step (`None` for a rule without one).
    pub fn learning_rate(&self) -> Option<f64> {
        self.learning_rate
    }

    /// Changes the learning rate from the next step on (a schedule's job).
    pub fn set_learning_rate(&mut self, lr: f64) -> EagerResult<()> {
        match &mut self.learning_rate {
            Some(current) => {
                *current = lr;
                Ok(())
            }
            None => Err(super::EagerError::Usage(
                "this optimizer's rule has no learning rate to set".into(),
            )),
        }
    }

    /// Updates every parameter with the gradient accumulated for it (zero if none).
    pub fn step(&mut self) -> EagerResult<()> {
        for p in &self.params {
            p.check_thread()?;
        }
        let names: Vec<String> = (0..self.params.len()).map(|i| format!("grad{i}")).collect();
        let grads: Vec<Array> = self
            .params
            .iter()
            .map(|p| match p.grad() {
                Some(g) => g.to_array(),
                None => {
                    let ty = &p.decl().ty;
                    Ok(Array::zeros(
                        ty.dtype,
                        &ty.shape.as_fixed().unwrap_or_default(),
                    ))
                }
            })
            .collect::<EagerResult<_>>()?;
        let mut feeds: Vec<(&str, Array)> = names.iter().map(String::as_str).zip(grads).collect();
        if let Some(lr) = self.learning_rate {
            feeds.push((LEARNING_RATE, Array::F64(ndarray::arr0(lr).into_dyn())));
        }
        let (program, runner, target) = (&self.program, &mut self.runner, self.target);
        with(|cx| {
            cx.scope.declare(program.module())?;
            runner.run(program, &mut cx.scope, &[Fetch::Target(target)], &feeds)?;
            Ok(())
        })
    }

    /// Forgets the gradients of every parameter.
    pub fn zero_grad(&self) {
        for p in &self.params {
            p.zero_grad();
        }
    }
}
