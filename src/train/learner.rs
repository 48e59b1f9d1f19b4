//! What a [`super::Trainer`] trains: a [`Learner`] takes a step on a batch and holds state.
//! Two are provided: a static program in a session ([`StaticClassifier`]), and an eager model
//! with its optimizer, stepping eagerly or compiled with `to_static` ([`EagerClassifier`]).

use super::TrainError;
use kiln_backend::Array;
use kiln_backend::interp::kernels;
use kiln_ir::{AxisSlice, BinaryOp, DType, Shape, Type, Value};
use kiln_runtime::data::Batch;
use kiln_runtime::eager::nn::{self, Layer};
use kiln_runtime::eager::{self, EagerOptimizer, StaticFunction, Tensor};
use kiln_runtime::optim::Accumulation;
use kiln_runtime::{Fetch, Optimizer, Session, Target};
use std::collections::BTreeMap;

/// One step's results.
#[derive(Clone, Debug)]
pub struct Step {
    /// The batch's mean loss.
    pub loss: f64,
    /// The logits, `[b, classes]`.
    pub logits: Array,
}

/// A model with its optimizer, as the trainer drives it.
pub trait Learner {
    /// Computes the loss and logits of `batch` and updates the parameters.
    fn train_step(&mut self, batch: &Batch) -> Result<Step, TrainError>;

    /// Computes the loss and logits of `batch`, changing nothing.
    fn eval_step(&mut self, batch: &Batch) -> Result<Step, TrainError>;

    /// Every state value (parameters and optimizer state), for a checkpoint.
    fn state(&self) -> Result<BTreeMap<String, Array>, TrainError>;

    /// The type of every state value, as [`Learner::state`] returns them.
    fn state_types(&self) -> Result<BTreeMap<String, Type>, TrainError> {
        Ok(self
            .state()?
            .into_iter()
            .map(|(n, a)| (n, a.ty()))
            .collect())
    }

    /// Restores state saved from [`Learner::state`].
    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<(), TrainError>;
}

/// A classifier as a static program: placeholders for the examples and labels (`x` and `y`
/// unless [`StaticClassifier::feeds`] says otherwise), its logits, its loss and the target of
/// its optimizer (from `minimize`), run in a session.
pub struct StaticClassifier {
    session: Session,
    feeds: [String; 2],
    logits: Value,
    loss: Value,
    train: Target,
}

impl StaticClassifier {
    /// The classifier of `session`'s program.
    pub fn new(session: Session, logits: Value, loss: Value, train: Target) -> StaticClassifier {
        StaticClassifier {
            session,
            feeds: ["x".into(), "y".into()],
            logits,
            loss,
            train,
        }
    }

    /// Names the placeholders fed the examples and the labels.
    pub fn feeds(mut self, examples: &str, labels: &str) -> StaticClassifier {
        self.feeds = [examples.into(), labels.into()];
        self
    }

    /// The session, when training is over.
    pub fn into_session(self) -> Session {
        self.session
    }

    /// The session (to save its parameters, or run other parts of the program).
    pub fn session(&mut self) -> &mut Session {
        &mut self.session
    }

    fn run(&mut self, batch: &Batch, update: bool) -> Result<Step, TrainError> {
        let mut fetches = vec![Fetch::Value(self.loss), Fetch::Value(self.logits)];
        if update {
            fetches.push(Fetch::Target(self.train));
        }
        let feeds = [
            (self.feeds[0].as_str(), batch.x.clone()),
            (self.feeds[1].as_str(), batch.y.clone()),
        ];
        let mut out = self.session.run(&fetches, &feeds)?.into_iter();
        let loss = out.next().map_or(f64::NAN, |l| l.to_f64_vec()[0]);
        let logits = out.next().expect("fetched");
        Ok(Step { loss, logits })
    }
}

impl Learner for StaticClassifier {
    fn train_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        self.run(batch, true)
    }

    fn eval_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        self.run(batch, false)
    }

    fn state(&self) -> Result<BTreeMap<String, Array>, TrainError> {
        Ok(self.session.scope().values())
    }

    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<(), TrainError> {
        for (name, value) in state {
            self.session.scope_mut().set(&name, value)?;
        }
        Ok(())
    }
}

/// An eager model trained with cross-entropy and an [`EagerOptimizer`] — eagerly, or, after
/// [`EagerClassifier::compile`], with the loss, gradients and the update of one compiled
/// program (`to_static`), on the same parameters. Logits `[N, C]` against labels `[N]`, or a
/// language model's `[N, T, V]` against tokens `[N, T]`. With
/// [`EagerClassifier::accumulate`], each batch is cut into micro-batches whose gradients are
/// accumulated into one update.
pub struct EagerClassifier {
    model: Box<dyn Layer>,
    optimizer: EagerOptimizer,
    compiled: Option<(StaticFunction, Accumulation)>,
    micro_batches: usize,
}

impl EagerClassifier {
    /// Trains `model` with `optimizer` (made over its parameters).
    pub fn new(model: impl Layer + 'static, optimizer: EagerOptimizer) -> EagerClassifier {
        EagerClassifier {
            model: Box::new(model),
            optimizer,
            compiled: None,
            micro_batches: 1,
        }
    }

    /// Cuts each training batch into `micro_batches` equal parts run one after the other,
    /// their gradients averaged into one update (set before [`EagerClassifier::compile`]).
    pub fn accumulate(mut self, micro_batches: usize) -> EagerClassifier {
        self.micro_batches = micro_batches.max(1);
        self
    }

    /// From now on, steps run compiled: the model's loss and logits traced with `to_static`
    /// for f32 examples of `example_shape` (a batch of any size) and i64 labels `[N]`,
    /// gradients and `rule`'s updates added as IR. The compiled optimizer keeps moments of
    /// its own.
    pub fn compile(
        &mut self,
        example_shape: &[usize],
        rule: &mut dyn Optimizer,
    ) -> Result<(), TrainError> {
        self.compile_for([(DType::F32, example_shape), (DType::I64, &[])], rule)
    }

    /// [`EagerClassifier::compile`] for examples and labels of other dtypes and shapes (each
    /// after a batch axis of any size): a language model's tokens, `[(I64, &[T]), (I64, &[T])]`.
    pub fn compile_for(
        &mut self,
        [(x_dtype, x_shape), (y_dtype, y_shape)]: [(DType, &[usize]); 2],
        rule: &mut dyn Optimizer,
    ) -> Result<(), TrainError> {
        let batched = |dtype, shape: &[usize]| {
            let mut dims = vec![kiln_ir::Dim::sym("N")];
            dims.extend(shape.iter().map(|&d| kiln_ir::Dim::Fixed(d)));
            Type::new(dtype, Shape(dims))
        };
        let (x, y) = (batched(x_dtype, x_shape), batched(y_dtype, y_shape));
        let model = &self.model;
        let mut step = eager::to_static(&[("x", x), ("y", y)], |t| {
            let logits = model.forward(&t[0])?;
            Ok(vec![nn::cross_entropy(&logits, &t[1])?, logits])
        })?;
        let update = step.minimize_accumulated(rule, 0, self.micro_batches)?;
        eager::declare_states(step.program().module())?;
        self.compiled = Some((step, update));
        Ok(())
    }

    /// The compiled step and the target of its update (the last micro-batch's, with
    /// accumulation), once [`EagerClassifier::compile`] has made it.
    pub fn compiled(&self) -> Option<(&StaticFunction, Target)> {
        self.compiled.as_ref().map(|(f, a)| (f, a.apply))
    }

    /// The model.
    pub fn model(&self) -> &dyn Layer {
        self.model.as_ref()
    }

    fn eager_step(&mut self, batch: &Batch, update: bool) -> Result<Step, TrainError> {
        let _no_grad = (!update).then(eager::no_grad);
        self.model.set_training(update);
        if update {
            self.optimizer.zero_grad();
        }
        let parts = micro_batches(batch, if update { self.micro_batches } else { 1 })?;
        let mut steps = Vec::with_capacity(parts.len());
        for part in &parts {
            let (x, y) = (Tensor::new(part.x.clone()), Tensor::new(part.y.clone()));
            let logits = self.model.forward(&x)?;
            let loss = nn::cross_entropy(&logits, &y)?;
            if update {
                let share = loss.binary_scalar(BinaryOp::Mul, 1.0 / parts.len() as f64)?;
                share.backward()?;
            }
            steps.push((loss.item()?, logits.to_array()?));
        }
        if update {
            self.optimizer.step()?;
        }
        joined(steps)
    }

    fn compiled_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        let Some((step, update)) = &mut self.compiled else {
            unreachable!("called when compiled");
        };
        let parts = micro_batches(batch, update.micro_batches)?;
        let mut steps = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let (x, y) = (Tensor::new(part.x.clone()), Tensor::new(part.y.clone()));
            let target = if i + 1 == parts.len() {
                update.apply
            } else {
                update.accumulate
            };
            let out = step.call_and_update(&[&x, &y], &[target])?;
            steps.push((out[0].item()?, out[1].to_array()?));
        }
        joined(steps)
    }
}

/// `batch` cut into `parts` equal micro-batches along its first axis.
fn micro_batches(batch: &Batch, parts: usize) -> Result<Vec<Batch>, TrainError> {
    if parts == 1 {
        return Ok(vec![batch.clone()]);
    }
    let rows = batch.x.shape().first().copied().unwrap_or(0);
    if !rows.is_multiple_of(parts) {
        return Err(TrainError::Invalid(format!(
            "a batch of {rows} rows does not split into {parts} equal micro-batches"
        )));
    }
    let per = rows / parts;
    let rows_of = |a: &Array, i: usize| {
        let mut ranges = vec![AxisSlice::Full; a.shape().len()];
        ranges[0] = AxisSlice::Range {
            start: i * per,
            end: (i + 1) * per,
            step: 1,
        };
        kernels::slice(a, &ranges).map_err(|e| TrainError::Invalid(e.to_string()))
    };
    (0..parts)
        .map(|i| {
            Ok(Batch {
                x: rows_of(&batch.x, i)?,
                y: rows_of(&batch.y, i)?,
            })
        })
        .collect()
}

/// One step's results from its micro-batches': the mean loss, the logits stacked.
fn joined(mut steps: Vec<(f64, Array)>) -> Result<Step, TrainError> {
    let loss = steps.iter().map(|(l, _)| l).sum::<f64>() / steps.len() as f64;
    let logits = match steps.len() {
        1 => steps.pop().expect("one").1,
        _ => {
            let parts: Vec<&Array> = steps.iter().map(|(_, l)| l).collect();
            kernels::concat(&parts, 0).map_err(|e| TrainError::Invalid(e.to_string()))?
        }
    };
    Ok(Step { loss, logits })
}

impl Learner for EagerClassifier {
    fn train_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        match self.compiled {
            Some(_) => self.compiled_step(batch),
            None => self.eager_step(batch, true),
        }
    }

    fn eval_step(&mut self, batch: &Batch) -> Result<Step, TrainError> {
        let Some((step, _)) = &mut self.compiled else {
            return self.eager_step(batch, false);
        };
        let (x, y) = (Tensor::new(batch.x.clone()), Tensor::new(batch.y.clone()));
        let out = step.call(&[&x, &y])?;
        Ok(Step {
            loss: out[0].item()?,
            logits: out[1].to_array()?,
        })
    }

    fn state(&self) -> Result<BTreeMap<String, Array>, TrainError> {
        Ok(eager::scope()?.values())
    }

    fn set_state(&mut self, state: BTreeMap<String, Array>) -> Result<(), TrainError> {
        for (name, value) in state {
            eager::set_state(&name, value)?;
        }
        Ok(())
    }
}
