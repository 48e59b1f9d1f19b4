//! Gradient-norm clipping as a rule around a rule: every gradient scaled by one factor from
//! their global norm, in the program, before the inner rule's update — PyTorch's
//! `clip_grad_norm_` followed by `optimizer.step()`.

use super::{LearningRate, Optimizer, Step, Update};
use crate::error::{RuntimeError, RuntimeResult};
use crate::program::{Program, Target};
use kiln_ir::{BinaryOp, DType, ReduceOp, StateDecl, Value};

/// `inner`, given gradients scaled by `min(1, max_norm / (‖g‖ + 10⁻⁶))`, where `‖g‖` is the
/// 2-norm of all the gradients it updates together (PyTorch's `clip_grad_norm_`, whose
/// `10⁻⁶` this keeps). The norm is summed in f64.
pub struct ClipGradNorm<O: Optimizer> {
    inner: O,
    max_norm: f64,
}

impl<O: Optimizer> ClipGradNorm<O> {
    /// `inner` with gradients clipped to a global norm of `max_norm` (finite, above 0).
    pub fn new(inner: O, max_norm: f64) -> RuntimeResult<ClipGradNorm<O>> {
        if !(max_norm.is_finite() && max_norm > 0.0) {
            return Err(RuntimeError::Usage(format!(
                "clip_grad_norm: the maximum norm {max_norm} must be finite and above 0"
            )));
        }
        Ok(ClipGradNorm { inner, max_norm })
    }

    /// The rule the clipped gradients go to.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The factor `min(1, max_norm / (‖g‖ + 10⁻⁶))` of `grads`, an f64 scalar.
    fn factor(&self, p: &mut Program, grads: &[Value]) -> RuntimeResult<Value> {
        let mut total = p.scalar(DType::F64, 0.0)?;
        for &g in grads {
            let g = p.cast(g, DType::F64)?;
            let squares = p.mul(g, g)?;
            let axes: Vec<usize> = (0..p.value_type(g).rank()).collect();
            let sum = p.reduce(ReduceOp::Sum, squares, axes, false)?;
            total = p.add(total, sum)?;
        }
        let norm = p.sqrt(total)?;
        let tiny = p.scalar(DType::F64, 1e-6)?;
        let below = p.add(norm, tiny)?;
        let max_norm = p.scalar(DType::F64, self.max_norm)?;
        let ratio = p.div(max_norm, below)?;
        let one = p.scalar(DType::F64, 1.0)?;
        Ok(p.binary(BinaryOp::Min, ratio, one)?)
    }
}

impl<O: Optimizer> Optimizer for ClipGradNorm<O> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn step(&mut self, p: &mut Program, update: &Update<'_>) -> RuntimeResult<Step> {
        self.inner.step(p, update)
    }

    fn finish(&mut self, p: &mut Program) -> RuntimeResult<Vec<(StateDecl, Value)>> {
        self.inner.finish(p)
    }

    fn learning_rate(&self) -> Option<LearningRate> {
        self.inner.learning_rate()
    }

    fn set_learning_rate(&mut self, lr: LearningRate) -> RuntimeResult<()> {
        self.inner.set_learning_rate(lr)
    }

    fn apply_gradients(
        &mut self,
        p: &mut Program,
        updates: &[(StateDecl, Value, Value)],
        suffix: &str,
    ) -> RuntimeResult<Target> {
        let grads: Vec<Value> = updates.iter().map(|(_, _, g)| *g).collect();
        let factor = self.factor(p, &grads)?;
        let mut clipped = Vec::with_capacity(updates.len());
        for (decl, value, grad) in updates {
            let dtype = p.value_type(*grad).dtype;
            let f = p.cast(factor, dtype)?;
            clipped.push((decl.clone(), *value, p.mul(*grad, f)?));
        }
        self.inner.apply_gradients(p, &clipped, suffix)
    }
}
