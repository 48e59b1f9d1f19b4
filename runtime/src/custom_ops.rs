//! Custom ops (the PyLayer of the dygraph design): user code with its own forward and
//! backward over host arrays.
//!
//! A registered op runs eagerly, is traced as `call @name`, runs in the interpreter and in
//! compiled programs, and its gradient comes from its own backward: the autodiff pass emits
//! `call @name.grad(inputs…, outputs…, output gradients…)`, which this registry routes to
//! [`CustomOp::backward`].

use kiln_backend::{Array, CustomOpError, CustomOps};
use kiln_ir::Type;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

/// An op written by the user over host arrays, with its own forward and backward.
pub trait CustomOp: Send + Sync {
    /// The name the IR calls it by: `call @name`.
    fn name(&self) -> &str;

    /// How many results it has.
    fn num_outputs(&self) -> usize {
        1
    }

    /// The result types for operands of `inputs` types (dimensions may be symbolic while
    /// tracing). The default: one result of the first operand's type.
    fn output_types(&self, inputs: &[Type]) -> Result<Vec<Type>, CustomOpError> {
        inputs
            .first()
            .map(|t| vec![t.clone()])
            .ok_or_else(|| format!("`{}` needs an operand", self.name()).into())
    }

    /// The results for `inputs`.
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>, CustomOpError>;

    /// One gradient per input, given the inputs, the outputs and the gradients of the outputs.
    fn backward(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        output_grads: &[Array],
    ) -> Result<Vec<Array>, CustomOpError>;
}

fn registry() -> &'static RwLock<HashMap<String, Arc<dyn CustomOp>>> {
    static REGISTRY: OnceLock<RwLock<HashMap<String, Arc<dyn CustomOp>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Registers `op` for every thread; registering a name again replaces the op.
pub fn register(op: Arc<dyn CustomOp>) -> Result<(), CustomOpError> {
    let name = op.name().to_owned();
    if name.ends_with(".grad") || name.is_empty() {
        return Err(
            format!("`{name}` cannot name a custom op (empty, or ends with `.grad`)").into(),
        );
    }
    registry()
        .write()
        .map_err(|_| CustomOpError::from("the custom-op registry is poisoned"))?
        .insert(name, op);
    Ok(())
}

/// The op registered as `name`.
pub fn lookup(name: &str) -> Option<Arc<dyn CustomOp>> {
    registry().read().ok()?.get(name).cloned()
}

/// The registry as the interpreter sees it.
pub struct Registry;

impl CustomOps for Registry {
    fn call(&self, name: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        let (base, backward) = match name.strip_suffix(".grad") {
            Some(base) => (base, true),
            None => (name, false),
        };
        let op = lookup(base)
            .ok_or_else(|| CustomOpError(format!("no custom op `{base}` is registered")))?;
        if backward {
            let outputs = op.num_outputs();
            let inputs = args.len().checked_sub(2 * outputs).ok_or_else(|| {
                CustomOpError(format!(
                    "`{name}` needs the inputs, {outputs} outputs and {outputs} gradients"
                ))
            })?;
            op.backward(
                &args[..inputs],
                &args[inputs..inputs + outputs],
                &args[inputs + outputs..],
            )
        } else {
            op.forward(args)
        }
    }
}
