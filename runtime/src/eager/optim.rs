//! Optimizers for eager code, with the same update rules as static programs.
//!
//! An [`EagerOptimizer`] builds, once, a small static program that applies a rule (`Sgd`,
//! `Momentum`, `Adam`, …) to its parameters given their gradients as placeholders; `step()`
//! feeds the gradients `backward()` accumulated and runs it against this thread's scope. So
//! each optimizer is written once, and its moments live in the scope (and checkpoints).

use super::nn::Parameter;
use super::{EagerResult, with};
use crate::optim::Optimizer;
use crate::program::{Program, Target};
use crate::session::{Fetch, Runner};
use kiln_backend::Array;
use kiln_ir::{StateDecl, Value};

/// An optimizer for eager parameters: each `step` applies the update of a static [`crate::Optimizer`] to the gradients `backward()` left.
pub struct EagerOptimizer {
    program: Program,
    runner: Runner,
    params: Vec<Parameter>,
    target: Target,
}

impl EagerOptimizer {
    /// An optimizer applying `rule` to `params`.
    pub fn new(mut rule: impl Optimizer, params: Vec<Parameter>) -> EagerResult<EagerOptimizer> {
        let mut program = Program::new();
        let mut updates: Vec<(StateDecl, Value, Value)> = Vec::new();
        for (i, p) in params.iter().enumerate() {
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
        })
    }

    /// Updates every parameter with the gradient accumulated for it (zero if none).
    pub fn step(&mut self) -> EagerResult<()> {
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
        let feeds: Vec<(&str, Array)> = names.iter().map(String::as_str).zip(grads).collect();
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
