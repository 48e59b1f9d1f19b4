//! Gradient accumulation: a large batch's update made from micro-batches run one at a time,
//! so that memory holds one micro-batch's activations. Two targets over one loss: the first
//! adds the micro-batch's gradients into state, the second updates the parameters with the
//! mean of the accumulated ones and this micro-batch's, and clears the state — PyTorch's
//! `(loss / k).backward()` on each of `k` micro-batches, then `step()` and `zero_grad()`.

use super::{Optimizer, gradient_updates};
use crate::error::{RuntimeError, RuntimeResult};
use crate::program::{Program, Target};
use kiln_ir::Initializer;

/// The two targets of an accumulated update (see the module documentation): run
/// `accumulate` with each micro-batch but the last, then `apply` with the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accumulation {
    /// Adds the gradients into `<rule>.accumulated.<param>`.
    pub accumulate: Target,
    /// Updates with the mean over `micro_batches`, and clears the sums.
    pub apply: Target,
    /// Micro-batches per update.
    pub micro_batches: usize,
}

/// The targets updating every trainable parameter `loss` depends on by `rule`, from
/// gradients accumulated over `micro_batches` runs (equal-sized micro-batches, whose mean
/// losses average to the large batch's).
pub fn accumulate_gradients<O: Optimizer + ?Sized>(
    rule: &mut O,
    p: &mut Program,
    loss: kiln_ir::Value,
    micro_batches: usize,
) -> RuntimeResult<Accumulation> {
    if micro_batches == 0 {
        return Err(RuntimeError::Usage(
            "gradient accumulation needs 1 or more micro-batches".into(),
        ));
    }
    let names: Vec<String> = p.params().iter().map(|q| q.name.clone()).collect();
    let updates = gradient_updates(p, loss, &names)?;
    let (mut adds, mut clears, mut means) = (Vec::new(), Vec::new(), Vec::new());
    for (decl, value, grad) in updates {
        let name = format!("{}.accumulated.{}", rule.name(), decl.name);
        let (sum_decl, sum) = p.state(&name, decl.ty.clone(), Initializer::constant(0.0))?;
        let total = p.add(sum, grad)?;
        adds.push(p.store(&sum_decl, total)?);
        let zero = p.scalar(decl.ty.dtype, 0.0)?;
        let zeros = p.broadcast_to(zero, &decl.ty.shape)?;
        clears.push(p.store(&sum_decl, zeros)?);
        let per = p.scalar(decl.ty.dtype, 1.0 / micro_batches as f64)?;
        means.push((decl, value, p.mul(total, per)?));
    }
    let accumulate = p.add_target(&format!("{}.accumulate", rule.name()), adds)?;
    let apply = rule.apply_gradients(p, &means, "apply")?;
    p.extend_target(apply, clears);
    Ok(Accumulation {
        accumulate,
        apply,
        micro_batches,
    })
}
