//! Custom ops from eager code: [`call`] runs a registered op on tensors (evaluated, taped
//! or traced as `call @name`). The registry itself is [`crate::custom_ops`], which sessions
//! and the interpreter use without eager code.

pub use crate::custom_ops::{CustomOp, Registry, lookup, register};
use kiln_ir::Type;

/// Calls registered custom op `name` on `inputs`: evaluated eagerly (recorded on the tape
/// when gradients flow), or traced as `call @name`.
#[track_caller]
pub fn call(name: &str, inputs: &[&super::Tensor]) -> super::EagerResult<Vec<super::Tensor>> {
    let usage = |m: String| super::EagerError::Usage(m);
    let op = lookup(name).ok_or_else(|| usage(format!("no custom op `{name}` is registered")))?;
    let types: Vec<Type> = inputs.iter().map(|t| t.ty()).collect();
    let results = op
        .output_types(&types)
        .map_err(|m| usage(format!("custom op `{name}`: {m}")))?;
    if results.len() != op.num_outputs() {
        return Err(usage(format!(
            "custom op `{name}` declares {} outputs but its output_types gave {}",
            op.num_outputs(),
            results.len()
        )));
    }
    super::tensor::apply(inputs, kiln_ir::Loc::caller(), |b, v| {
        b.call(name, v, results)
    })
}
