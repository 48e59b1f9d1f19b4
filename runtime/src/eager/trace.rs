//! `to_static`: tracing eager code into a static program that shares its parameters.
//!
//! While a function is traced, every tensor op is recorded into a [`Program`] instead of
//! running: inputs become placeholders (dimensions may be symbolic, so one compiled function
//! serves every batch size), parameters become `load`s of their state, and eager tensors the
//! function closes over become constants. The result runs in a [`Runner`] against this
//! thread's parameter scope, so it always sees the parameters the eager code trains.

use super::tensor::Repr;
use super::{EagerError, EagerResult, Tensor, with};
use crate::optim::{Accumulation, Optimizer, accumulate_gradients};
use crate::program::{Program, Target};
use crate::session::{Fetch, Runner};
use kiln_backend::{Array, StateStore};
use kiln_ir::{BuildResult, Inst, Module, Type, Value};
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct Trace {
    pub id: u64,
    pub program: Program,
    /// Eager tensors embedded as constants, kept alive so their addresses stay theirs.
    constants: HashMap<usize, (Arc<Array>, Value)>,
    /// State the traced code assigned (running statistics): stored at every call.
    pub stores: Vec<Inst>,
}

impl Trace {
    /// `data` as a constant of the traced program (one constant per tensor).
    pub(crate) fn constant(&mut self, data: &Arc<Array>) -> BuildResult<Value> {
        let key = Arc::as_ptr(data) as usize;
        if let Some((_, v)) = self.constants.get(&key) {
            return Ok(*v);
        }
        let v = self.program.constant(data.to_literal(), data.ty())?;
        self.constants.insert(key, (data.clone(), v));
        Ok(v)
    }
}

/// Traces `f` over inputs named and typed by `inputs` into a compiled function.
///
/// ```
/// use kiln_ir::{DType, Dim, Shape, Type};
/// use kiln_runtime::eager::{self, Tensor, nn::{Layer, Linear}};
///
/// let layer = Linear::new("doc.fc", 3, 2)?;
/// let x_type = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(3)]));
/// let mut forward = eager::to_static(&[("x", x_type)], |t| Ok(vec![layer.forward(&t[0])?]))?;
/// let x = Tensor::from_f32(&[1, 3], vec![1.0, 2.0, 3.0])?;
/// assert_eq!(forward.call(&[&x])?[0].to_f64_vec()?, layer.forward(&x)?.to_f64_vec()?);
/// # Ok::<(), kiln_runtime::eager::EagerError>(())
/// ```
pub fn to_static(
    inputs: &[(&str, Type)],
    f: impl FnOnce(&[Tensor]) -> EagerResult<Vec<Tensor>>,
) -> EagerResult<StaticFunction> {
    let args = with(|cx| {
        if cx.trace.is_some() {
            return Err(EagerError::Usage(
                "to_static cannot run inside another to_static".into(),
            ));
        }
        let mut trace = Trace {
            id: cx.new_trace_id(),
            program: Program::with_seed(cx.seed),
            constants: HashMap::new(),
            stores: Vec::new(),
        };
        let mut args = Vec::new();
        for (name, ty) in inputs {
            let v = trace
                .program
                .placeholder(name, ty.dtype, ty.shape.clone())?;
            args.push((name.to_string(), v, trace.tensor(v)));
        }
        cx.trace = Some(trace);
        Ok(args)
    })?;
    let tensors: Vec<Tensor> = args.iter().map(|(_, _, t)| t.clone()).collect();
    let result = f(&tensors);
    let (trace, context) = with(|cx| Ok((cx.trace.take(), cx.id)))?;
    let mut trace = trace.ok_or_else(|| EagerError::Usage("the trace ended early".into()))?;
    let outputs = result?
        .iter()
        .map(|t| trace.value_of(t))
        .collect::<EagerResult<Vec<_>>>()?;
    let updates = match trace.stores.is_empty() {
        true => None,
        false => Some(trace.program.add_target("state_updates", trace.stores)?),
    };
    Ok(StaticFunction {
        program: trace.program,
        inputs: args.into_iter().map(|(name, v, _)| (name, v)).collect(),
        outputs,
        updates,
        runner: Runner::new(),
        gradients: HashMap::new(),
        context,
    })
}

/// A traced function, compiled once per signature and run against this thread's parameters.
pub struct StaticFunction {
    program: Program,
    inputs: Vec<(String, Value)>,
    outputs: Vec<Value>,
    /// The state the traced code assigned, stored at every call.
    updates: Option<Target>,
    runner: Runner,
    /// The gradient values appended to the program for each output.
    gradients: HashMap<usize, GradientValues>,
    /// The context (thread) whose parameters it runs against.
    context: u64,
}

/// Where the gradients of one output live in the program.
#[derive(Clone)]
struct GradientValues {
    /// For each float input: its index and its gradient.
    inputs: Vec<(usize, Value)>,
    /// For each parameter: its name and its gradient.
    params: Vec<(String, Value)>,
}

/// Gradients from a compiled function: for each float input (in order, `None` for others),
/// and for each parameter by name.
#[derive(Debug)]
pub struct Gradients {
    /// The gradient of each input that was traced with one.
    pub inputs: Vec<Option<Tensor>>,
    /// The gradient of each parameter, by name.
    pub parameters: Vec<(String, Tensor)>,
}

impl StaticFunction {
    /// The traced program: placeholders for the inputs, state for the parameters.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The traced function's outputs.
    pub fn outputs(&self) -> &[Value] {
        &self.outputs
    }

    /// How many times a call had to prepare (prune and verify) a new signature.
    pub fn compilations(&self) -> usize {
        self.runner.compilations()
    }

    /// The traced function as a verified module named `name` (state + one function), to
    /// print, save, or serve with `kiln run`.
    pub fn module(&self, name: &str) -> EagerResult<Module> {
        Ok(self.program.export_module(&[(name, &self.outputs[..])])?)
    }

    /// Like [`StaticFunction::module`], with the state updates every call makes (the traced
    /// code's assignments: a KV cache written, a batch norm's running statistics) as stores.
    pub fn module_with_updates(&self, name: &str) -> EagerResult<Module> {
        let targets: Vec<Target> = self.updates.into_iter().collect();
        let function = self.program.export(name, &self.outputs, &targets);
        Ok(self.program.module_of(vec![function])?)
    }

    /// The values of the state the function reads, as they are now: its parameters (declared
    /// ones initialized), to export or save beside [`StaticFunction::module`].
    pub fn state(&self) -> EagerResult<StateStore> {
        let (program, context) = (&self.program, self.context);
        with(|cx| {
            cx.check_owner(context, "a function compiled with to_static")?;
            cx.scope.declare(program.module())?;
            Ok(cx.scope.store().clone())
        })
    }

    /// Runs the function on `args` (eager tensors) and returns its outputs.
    pub fn call(&mut self, args: &[&Tensor]) -> EagerResult<Vec<Tensor>> {
        let fetches: Vec<Fetch> = self.outputs.iter().map(|&v| v.into()).collect();
        self.run(args, &fetches)
    }

    /// Adds an optimizer's update of every parameter the `output`-th output (a scalar loss)
    /// depends on; run it with [`StaticFunction::call_and_update`].
    pub fn minimize(&mut self, rule: &mut dyn Optimizer, output: usize) -> EagerResult<Target> {
        let loss = self.output(output)?;
        Ok(rule.minimize(&mut self.program, loss)?)
    }

    /// Like [`StaticFunction::minimize`], from gradients accumulated over `micro_batches`
    /// calls (see [`crate::optim::Accumulation`]): call with `accumulate` on each micro-batch
    /// but the last, then with `apply`.
    pub fn minimize_accumulated(
        &mut self,
        rule: &mut dyn Optimizer,
        output: usize,
        micro_batches: usize,
    ) -> EagerResult<Accumulation> {
        let loss = self.output(output)?;
        Ok(accumulate_gradients(
            rule,
            &mut self.program,
            loss,
            micro_batches,
        )?)
    }

    /// Runs the outputs and applies `updates`: a compiled training step.
    pub fn call_and_update(
        &mut self,
        args: &[&Tensor],
        updates: &[Target],
    ) -> EagerResult<Vec<Tensor>> {
        let mut fetches: Vec<Fetch> = self.outputs.iter().map(|&v| v.into()).collect();
        fetches.extend(updates.iter().map(|&t| Fetch::Target(t)));
        self.run(args, &fetches)
    }

    /// The `output`-th output (a scalar) and its gradients with respect to the float inputs
    /// and the parameters, computed by the compiled program.
    pub fn gradients(
        &mut self,
        args: &[&Tensor],
        output: usize,
    ) -> EagerResult<(Tensor, Gradients)> {
        if !self.gradients.contains_key(&output) {
            let loss = self.output(output)?;
            let inputs: Vec<(usize, Value)> = self
                .inputs
                .iter()
                .enumerate()
                .filter(|(_, (_, v))| self.program.value_type(*v).dtype.is_float())
                .map(|(i, (_, v))| (i, *v))
                .collect();
            let params: Vec<(String, Value)> = self
                .program
                .params()
                .iter()
                .map(|p| (p.name.clone(), p.value))
                .collect();
            let mut wrt: Vec<Value> = inputs.iter().map(|(_, v)| *v).collect();
            wrt.extend(params.iter().map(|(_, v)| *v));
            let grads = self.program.gradients(loss, &wrt)?;
            let (input_grads, param_grads) = grads.split_at(inputs.len());
            let inputs = inputs
                .iter()
                .zip(input_grads)
                .map(|((i, _), g)| (*i, *g))
                .collect();
            let params = params
                .iter()
                .zip(param_grads)
                .map(|((n, _), g)| (n.clone(), *g))
                .collect();
            self.gradients
                .insert(output, GradientValues { inputs, params });
        }
        let GradientValues { inputs, params } = &self.gradients[&output];
        let mut fetches: Vec<Fetch> = vec![self.outputs[output].into()];
        fetches.extend(inputs.iter().map(|(_, g)| Fetch::Value(*g)));
        fetches.extend(params.iter().map(|(_, g)| Fetch::Value(*g)));
        let (inputs, params) = (inputs.clone(), params.clone());
        let mut results = self.run(args, &fetches)?.into_iter();
        let value = results
            .next()
            .ok_or_else(|| EagerError::Usage("no loss came back".into()))?;
        let mut by_input: Vec<Option<Tensor>> = vec![None; self.inputs.len()];
        for ((i, _), g) in inputs.iter().zip(results.by_ref()) {
            by_input[*i] = Some(g);
        }
        let parameters = params.iter().map(|(n, _)| n.clone()).zip(results).collect();
        Ok((
            value,
            Gradients {
                inputs: by_input,
                parameters,
            },
        ))
    }

    fn output(&self, index: usize) -> EagerResult<Value> {
        self.outputs.get(index).copied().ok_or_else(|| {
            EagerError::Usage(format!(
                "the function has {} outputs, not {}",
                self.outputs.len(),
                index + 1
            ))
        })
    }

    /// Runs `fetches` and the traced state updates; returns the fetched values.
    fn run(&mut self, args: &[&Tensor], fetches: &[Fetch]) -> EagerResult<Vec<Tensor>> {
        let mut fetches = fetches.to_vec();
        fetches.extend(self.updates.map(Fetch::Target));
        self.run_fetches(args, &fetches)
    }

    fn run_fetches(&mut self, args: &[&Tensor], fetches: &[Fetch]) -> EagerResult<Vec<Tensor>> {
        if args.len() != self.inputs.len() {
            return Err(EagerError::Usage(format!(
                "the function takes {} inputs ({}), {} given",
                self.inputs.len(),
                self.inputs
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                args.len()
            )));
        }
        let feeds: Vec<(&str, Arc<Array>)> = self
            .inputs
            .iter()
            .zip(args)
            .map(|((name, _), t)| match &t.0 {
                Repr::Eager { data, .. } => Ok((name.as_str(), data.clone())),
                Repr::Traced { .. } => Err(EagerError::Usage(
                    "a compiled function takes eager tensors".into(),
                )),
            })
            .collect::<EagerResult<_>>()?;
        let (program, runner) = (&self.program, &mut self.runner);
        let context = self.context;
        let results = with(|cx| {
            cx.check_owner(context, "a function compiled with to_static")?;
            cx.scope.declare(program.module())?;
            Ok(runner.run_shared(program, &mut cx.scope, fetches, &feeds)?)
        })?;
        Ok(results.into_iter().map(Tensor::from_shared).collect())
    }
}
