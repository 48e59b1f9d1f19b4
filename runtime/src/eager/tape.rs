//! The tape: the ops that gradients will flow through, as an IR function being built, with
//! the value of every instruction already computed.

use super::{Context, EagerError, EagerResult, LeafId};
use crate::custom_ops::Registry;
use kiln_backend::{Array, Env, Interpreter, StateStore};
use kiln_ir::{Function, FunctionBuilder, Module, Value};
use std::sync::{Arc, Weak};

/// Alive while some tensor recorded on the current tape is alive.
pub(crate) struct Generation;

pub(crate) struct Tape {
    builder: FunctionBuilder,
    env: Env,
    /// Leaves used on this tape and the argument that stands for each.
    leaves: Vec<(LeafId, Value)>,
    generation: Weak<Generation>,
    /// How many body instructions have been evaluated.
    evaluated: usize,
}

impl Tape {
    pub(crate) fn new() -> Tape {
        Tape {
            builder: FunctionBuilder::new("tape"),
            env: Env::new(),
            leaves: Vec::new(),
            generation: Weak::new(),
            evaluated: 0,
        }
    }

    fn clear(&mut self) {
        *self = Tape::new();
    }

    /// The current generation, starting a fresh tape when no recorded tensor is alive.
    pub(crate) fn generation(&mut self) -> Arc<Generation> {
        match self.generation.upgrade() {
            Some(g) => g,
            None => {
                self.clear();
                let g = Arc::new(Generation);
                self.generation = Arc::downgrade(&g);
                g
            }
        }
    }

    pub(crate) fn is_current(&self, generation: &Arc<Generation>) -> bool {
        self.generation
            .upgrade()
            .is_some_and(|g| Arc::ptr_eq(&g, generation))
    }

    /// Instructions recorded, or 0 when no recorded tensor is alive.
    pub(crate) fn len(&self) -> usize {
        if self.generation.strong_count() == 0 {
            return 0;
        }
        let func = self.builder.function();
        func.region(func.body()).insts.len()
    }

    pub(crate) fn builder(&mut self) -> &mut FunctionBuilder {
        &mut self.builder
    }

    pub(crate) fn value(&self, v: Value) -> Option<&Arc<Array>> {
        self.env.get(&v)
    }

    /// An argument standing for `data` (a leaf, or a value computed off the tape).
    pub(crate) fn argument(&mut self, data: &Arc<Array>, leaf: Option<LeafId>) -> Value {
        if let Some(leaf) = leaf
            && let Some(&(_, v)) = self.leaves.iter().find(|(l, _)| *l == leaf)
        {
            return v;
        }
        let v = self.builder.arg("t", data.ty());
        self.env.insert(v, data.clone());
        if let Some(leaf) = leaf {
            self.leaves.push((leaf, v));
        }
        v
    }

    /// Evaluates the instructions added since the last evaluation.
    pub(crate) fn evaluate(&mut self, rng_counter: u64) -> EagerResult<()> {
        let func = self.builder.function();
        let insts = func.region(func.body()).insts[self.evaluated..].to_vec();
        evaluate(func, &insts, &mut self.env, rng_counter)?;
        self.evaluated += insts.len();
        Ok(())
    }

    /// Runs the autodiff pass from `loss` to every leaf on the tape, evaluates the gradient
    /// instructions, and returns each leaf's gradient. The tape is cleared afterwards.
    pub(crate) fn backward(
        &mut self,
        loss: Value,
        rng_counter: u64,
    ) -> EagerResult<Vec<(LeafId, Arc<Array>)>> {
        let wrt: Vec<Value> = self.leaves.iter().map(|&(_, v)| v).collect();
        let mut func =
            std::mem::replace(&mut self.builder, FunctionBuilder::new("tape")).into_function();
        let result = (|| {
            let start = func.region(func.body()).insts.len();
            let grads = kiln_passes::append_gradients(&mut func, loss, &wrt)?;
            let insts = func.region(func.body()).insts[start..].to_vec();
            evaluate(&func, &insts, &mut self.env, rng_counter)?;
            grads
                .iter()
                .zip(&self.leaves)
                .map(|(g, &(leaf, _))| {
                    let value = self.env.get(g).cloned().ok_or_else(|| {
                        EagerError::Usage("a gradient was not computed (a bug in Kiln)".into())
                    })?;
                    Ok((leaf, value))
                })
                .collect::<EagerResult<Vec<_>>>()
        })();
        self.clear();
        result
    }
}

/// Evaluates `insts` of `func` with the reference interpreter's kernels.
pub(crate) fn evaluate(
    func: &Function,
    insts: &[kiln_ir::Inst],
    env: &mut Env,
    rng_counter: u64,
) -> EagerResult<()> {
    let empty = Module::new();
    Interpreter::new(&empty)
        .with_custom_ops(&Registry)
        .with_rng_counter(rng_counter)
        .eval_insts(func, insts, env, &StateStore::new())?;
    Ok(())
}

/// Adds `g` into the accumulated gradient of `leaf`.
pub(crate) fn accumulate(cx: &mut Context, leaf: LeafId, g: Arc<Array>) -> EagerResult<()> {
    let sum = match cx.grads.get(&leaf) {
        Some(prev) => {
            let added = kiln_backend::interp::kernels::binary(kiln_ir::BinaryOp::Add, prev, &g)
                .map_err(|e| EagerError::Usage(e.0))?;
            Arc::new(added)
        }
        None => g,
    };
    cx.grads.insert(leaf, sum);
    Ok(())
}
