//! The reference interpreter: runs any verified function on ndarray. It is the oracle that
//! every compiled kernel and every pass is tested against, so it favours clarity and exactness
//! over speed.
//!
//! It binds symbolic dimensions from the arguments, checks every result it computes against the
//! result's type, and commits `store`s only when the whole function succeeds: a failed run
//! leaves the state as it was. Arrays are shared by reference count: a `load`, a region's
//! results and a loop's carried values are never copied.

pub mod kernels;
pub(crate) mod window;

use crate::InterpError;
use crate::array::Array;
use crate::interp::kernels::{KernelResult, OpError};
use crate::random::Stream;
use crate::state::StateStore;
use kiln_ir::print::{ValueNames, inst_line};
use kiln_ir::{Function, Inst, Loc, Module, Op, Region, SymbolBindings, Value, ValueDef};
use std::collections::HashMap;
use std::sync::Arc;

/// Custom ops: user code that runs on host arrays. The runtime registers them; the interpreter
/// calls them for `call @name` instructions.
pub trait CustomOps {
    /// Runs custom op `name` on `args`, returning its results.
    fn call(&self, name: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError>;
}

/// A custom op's failure, in the op author's words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CustomOpError(pub String);

impl From<String> for CustomOpError {
    fn from(message: String) -> CustomOpError {
        CustomOpError(message)
    }
}

impl From<&str> for CustomOpError {
    fn from(message: &str) -> CustomOpError {
        CustomOpError(message.to_owned())
    }
}

/// Values by SSA id, shared.
pub type Env = HashMap<Value, Arc<Array>>;

/// Runs functions of one module.
pub struct Interpreter<'a> {
    module: &'a Module,
    custom_ops: Option<&'a dyn CustomOps>,
    rng_counter: u64,
}

/// State writes made while evaluating, committed by the caller in order: (state name, value).
pub type Stores = Vec<(String, Arc<Array>)>;

/// The values of one call, keyed by SSA value (region arguments are rebound as loops go round).
struct Frame<'f> {
    func: &'f Function,
    values: Env,
    bindings: SymbolBindings,
    stores: Stores,
    /// Per `update_slice`: whether its array operand dies there, so that the array (a loop's
    /// stack of states) is updated in place rather than copied on every trip.
    donates: HashMap<Inst, bool>,
    /// Per region: the values defined in it that each instruction reads last (or, unread,
    /// defines), dropped once it has run, so that a run holds what `limits::check_live`
    /// counts and no more.
    frees: HashMap<Region, Arc<Vec<Vec<Value>>>>,
}

impl<'a> Interpreter<'a> {
    /// An interpreter for `module`'s functions.
    pub fn new(module: &'a Module) -> Interpreter<'a> {
        Interpreter {
            module,
            custom_ops: None,
            rng_counter: 0,
        }
    }

    /// Runs `call` instructions with `ops`.
    pub fn with_custom_ops(mut self, ops: &'a dyn CustomOps) -> Interpreter<'a> {
        self.custom_ops = Some(ops);
        self
    }

    /// The run counter random draws are keyed by (with their seed).
    pub fn rng_counter(&self) -> u64 {
        self.rng_counter
    }

    /// The run counter that `random_*` ops mix with their seeds; advance it between runs to
    /// draw fresh numbers.
    pub fn with_rng_counter(mut self, counter: u64) -> Interpreter<'a> {
        self.rng_counter = counter;
        self
    }

    /// Runs the module's function `name`.
    pub fn run(
        &self,
        name: &str,
        args: Vec<Array>,
        state: &mut StateStore,
    ) -> Result<Vec<Array>, InterpError> {
        let func = self
            .module
            .function(name)
            .ok_or_else(|| InterpError::UnknownFunction {
                name: name.to_owned(),
                available: self
                    .module
                    .functions
                    .iter()
                    .map(|f| format!("@{}", f.name()))
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        self.run_function(func, args, state)
    }

    /// Runs `func`, whose state declarations are the module's.
    pub fn run_function(
        &self,
        func: &Function,
        args: Vec<Array>,
        state: &mut StateStore,
    ) -> Result<Vec<Array>, InterpError> {
        let shared = args.into_iter().map(Arc::new).collect();
        let results = self.run_shared(func, shared, state)?;
        Ok(results.into_iter().map(unshare).collect())
    }

    /// Like [`Interpreter::run_function`], with arguments and results shared.
    pub fn run_shared(
        &self,
        func: &Function,
        args: Vec<Arc<Array>>,
        state: &mut StateStore,
    ) -> Result<Vec<Arc<Array>>, InterpError> {
        if args.len() != func.args().len() {
            return Err(InterpError::ArgCount {
                func: func.name().to_owned(),
                expected: func.args().len(),
                found: args.len(),
            });
        }
        let _run = crate::limits::RunScope::enter();
        let mut frame = Frame {
            func,
            values: Env::new(),
            bindings: SymbolBindings::new(),
            stores: Vec::new(),
            donates: HashMap::new(),
            frees: HashMap::new(),
        };
        for (&v, array) in func.args().iter().zip(args) {
            let expected = func.value_type(v);
            let mismatch = |reason: String| InterpError::ArgMismatch {
                func: func.name().to_owned(),
                arg: ValueNames::new(func).get(v),
                expected: Box::new(expected.clone()),
                found: Box::new(array.ty()),
                reason,
            };
            array
                .check_fits(expected, &mut frame.bindings)
                .map_err(mismatch)?;
            frame.values.insert(v, array);
        }
        crate::limits::check_function(func, |s| frame.bindings.get(s).copied())?;
        crate::limits::check_live(func, |s| frame.bindings.get(s).copied())?;
        let results = self.region(&mut frame, func.body(), state)?;
        for (name, value) in frame.stores {
            state.insert_shared(name, value);
        }
        Ok(results)
    }

    /// Evaluates `insts` — top-level instructions of `func`, in order — reading operands from
    /// `env` and adding their results to it. For callers that grow a function an instruction
    /// at a time (the eager tape). Shapes must be static; `store`s are not applied.
    pub fn eval_insts(
        &self,
        func: &Function,
        insts: &[Inst],
        env: &mut Env,
        state: &StateStore,
    ) -> Result<(), InterpError> {
        let _run = crate::limits::RunScope::enter();
        let mut frame = Frame {
            func,
            values: std::mem::take(env),
            bindings: SymbolBindings::new(),
            stores: Vec::new(),
            donates: HashMap::new(),
            frees: HashMap::new(),
        };
        let result = insts.iter().try_for_each(|&inst| {
            crate::limits::check_inst(func, inst)?;
            self.inst(&mut frame, inst, state)
        });
        *env = frame.values;
        result
    }

    /// Evaluates one top-level instruction of `func`, reading its operands (and the free
    /// values of its regions) from `values`, with `bindings` for symbolic sizes. Returns its
    /// results and the stores its regions made, which the caller commits. The compiled
    /// executor uses it for the ops it does not compile.
    pub fn eval_inst(
        &self,
        func: &Function,
        inst: Inst,
        values: Env,
        bindings: &SymbolBindings,
        state: &StateStore,
    ) -> Result<(Vec<Arc<Array>>, Stores), InterpError> {
        let _run = crate::limits::RunScope::enter();
        let mut frame = Frame {
            func,
            values,
            bindings: bindings.clone(),
            stores: Vec::new(),
            donates: HashMap::new(),
            frees: HashMap::new(),
        };
        self.inst(&mut frame, inst, state)?;
        let results = (func.inst(inst).results.iter())
            .map(|v| frame.values.remove(v).expect("a result of the instruction"))
            .collect();
        Ok((results, frame.stores))
    }

    fn region(
        &self,
        frame: &mut Frame<'_>,
        region: Region,
        state: &StateStore,
    ) -> Result<Vec<Arc<Array>>, InterpError> {
        let func = frame.func;
        let frees = (frame.frees.entry(region))
            .or_insert_with(|| Arc::new(func.last_reads(region)))
            .clone();
        for (i, &inst) in func.region(region).insts.iter().enumerate() {
            if let Op::UpdateSlice { axis } = func.inst(inst).op
                && *(frame.donates)
                    .entry(inst)
                    .or_insert_with(|| dies_at(func, region, i))
            {
                self.update_slice_in_place(frame, inst, axis)?;
            } else {
                self.inst(frame, inst, state)?;
            }
            for v in &frees[i] {
                frame.values.remove(v);
            }
        }
        func.region(region)
            .results
            .iter()
            .map(|v| {
                frame.values.get(v).cloned().ok_or_else(|| InterpError::Op {
                    func: func.name().to_owned(),
                    op: "yield",
                    loc: Loc::Unknown,
                    line: format!("yield {v}"),
                    message: "the yielded value has no value (is the function verified?)".into(),
                })
            })
            .collect()
    }

    fn fail(&self, frame: &Frame<'_>, inst: Inst, message: String) -> InterpError {
        let data = frame.func.inst(inst);
        InterpError::Op {
            func: frame.func.name().to_owned(),
            op: data.op.name(),
            loc: data.loc,
            line: inst_line(frame.func, inst),
            message,
        }
    }

    fn inst(
        &self,
        frame: &mut Frame<'_>,
        inst: Inst,
        state: &StateStore,
    ) -> Result<(), InterpError> {
        let func = frame.func;
        let data = func.inst(inst);
        let results = self.eval(frame, inst, state).map_err(|e| match e {
            Eval::Kernel(message) => self.fail(frame, inst, message),
            Eval::Nested(err) => *err,
        })?;
        if results.len() != data.results.len() {
            let message = format!(
                "produced {} results for {} result values",
                results.len(),
                data.results.len()
            );
            return Err(self.fail(frame, inst, message));
        }
        for (&v, array) in data.results.iter().zip(results) {
            let ty = func.value_type(v);
            let shape = ty.shape.resolve(&frame.bindings).map_err(|s| {
                self.fail(
                    frame,
                    inst,
                    format!("symbol {s} is not bound by the arguments"),
                )
            })?;
            if array.dtype() != ty.dtype || array.shape() != shape.as_slice() {
                let message = format!(
                    "computed {} where the IR says {ty} (= {shape:?})",
                    array.ty()
                );
                return Err(self.fail(frame, inst, message));
            }
            frame.values.insert(v, array);
        }
        Ok(())
    }

    fn eval(
        &self,
        frame: &mut Frame<'_>,
        inst: Inst,
        state: &StateStore,
    ) -> Result<Vec<Arc<Array>>, Eval> {
        let func = frame.func;
        let data = func.inst(inst);
        match &data.op {
            Op::Load { state: name, ty } => {
                let value = state.get_shared(name).ok_or_else(|| {
                    Eval::Kernel(format!(
                        "state @{name} has no value; initialize the state store first"
                    ))
                })?;
                if value.dtype() != ty.dtype || Some(value.shape().to_vec()) != ty.shape.as_fixed()
                {
                    return Err(Eval::Kernel(format!(
                        "state @{name} holds {}, but the IR loads {ty}",
                        value.ty()
                    )));
                }
                Ok(vec![value.clone()])
            }
            Op::Store { state: name } => {
                let value = operand(frame, data.args.first())?;
                frame.stores.push((name.clone(), value));
                Ok(Vec::new())
            }
            Op::Cond => {
                let pred = operand(frame, data.args.first())?
                    .as_bool_scalar()
                    .ok_or_else(|| Eval::Kernel("the predicate is not a bool scalar".into()))?;
                let region = data.regions.get(if pred { 0 } else { 1 }).copied();
                let region =
                    region.ok_or_else(|| Eval::Kernel("`cond` needs two regions".into()))?;
                self.region(frame, region, state)
                    .map_err(|e| Eval::Nested(Box::new(e)))
            }
            Op::While => self.while_loop(frame, inst, state),
            Op::Fused => {
                let body = *data
                    .regions
                    .first()
                    .ok_or_else(|| Eval::Kernel("`fused` needs a region".into()))?;
                for (&a, v) in func.region(body).args.iter().zip(&data.args) {
                    let value = operand(frame, Some(v))?;
                    frame.values.insert(a, value);
                }
                self.region(frame, body, state)
                    .map_err(|e| Eval::Nested(Box::new(e)))
            }
            op => {
                let args: Vec<Arc<Array>> = data
                    .args
                    .iter()
                    .map(|v| operand(frame, Some(v)))
                    .collect::<Result<_, _>>()?;
                let arg_refs: Vec<&Array> = args.iter().map(|a| &**a).collect();
                let shapes = data
                    .results
                    .iter()
                    .map(|&v| func.value_type(v).shape.resolve(&frame.bindings))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|s| {
                        Eval::Kernel(format!("symbol {s} is not bound by the arguments"))
                    })?;
                let results = self
                    .eval_op(op, &arg_refs, &shapes)
                    .map_err(|e| Eval::Kernel(e.0))?;
                Ok(results.into_iter().map(Arc::new).collect())
            }
        }
    }

    /// Applies an op without regions or state to `args`; `result_shapes` are the concrete
    /// shapes of its results (for ops whose result shape is an attribute, like `broadcast`).
    pub fn eval_op(
        &self,
        op: &Op,
        args: &[&Array],
        result_shapes: &[Vec<usize>],
    ) -> KernelResult<Vec<Array>> {
        use kernels as k;
        let arg = |i: usize| {
            args.get(i)
                .copied()
                .ok_or_else(|| OpError(format!("operand {i} is missing")))
        };
        let shape = |i: usize| {
            result_shapes
                .get(i)
                .ok_or_else(|| OpError::from("a result shape is missing"))
        };
        let one = |r: KernelResult<Array>| r.map(|a| vec![a]);
        match op {
            Op::Const { value, ty } => {
                let array = Array::from_literal(value, shape(0)?)
                    .ok_or_else(|| OpError(format!("the literal does not fill {ty}")))?;
                Ok(vec![array])
            }
            Op::Unary(op) => one(k::unary(*op, arg(0)?)),
            Op::Binary(op) => one(k::binary(*op, arg(0)?, arg(1)?)),
            Op::Compare(op) => one(k::compare(*op, arg(0)?, arg(1)?)),
            Op::Select => one(k::select(arg(0)?, arg(1)?, arg(2)?)),
            Op::Cast { to } => Ok(vec![arg(0)?.cast(*to)]),
            Op::Broadcast { .. } => one(k::broadcast(arg(0)?, shape(0)?)),
            Op::Reshape { .. } => one(k::reshape(arg(0)?, shape(0)?)),
            Op::Transpose { perm } => one(k::transpose(arg(0)?, perm)),
            Op::Slice { axes } => one(k::slice(arg(0)?, axes)),
            Op::Pad {
                low,
                high,
                interior,
            } => one(k::pad(arg(0)?, low, high, interior)),
            Op::Concat { axis } => one(k::concat(args, *axis)),
            Op::Reduce {
                op,
                axes,
                keep_dims,
            } => one(k::reduce(*op, arg(0)?, axes, *keep_dims)),
            Op::ArgReduce {
                op,
                axis,
                keep_dims,
            } => one(k::arg_reduce(*op, arg(0)?, *axis, *keep_dims)),
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => one(k::matmul(arg(0)?, arg(1)?, *transpose_a, *transpose_b)),
            Op::MatMulAcc {
                transpose_a,
                transpose_b,
                scale,
            } => one(k::matmul_acc(
                [arg(0)?, arg(1)?, arg(2)?],
                [*transpose_a, *transpose_b],
                scale.0,
            )),
            Op::Gather { axis } => one(k::gather(arg(0)?, arg(1)?, *axis)),
            Op::UpdateSlice { axis } => one(k::update_slice(arg(0)?, arg(1)?, arg(2)?, *axis)),
            Op::ScatterAdd { axis, .. } => one(k::scatter_add(arg(0)?, arg(1)?, *axis, shape(0)?)),
            Op::Conv2d { kind, attrs } => {
                one(window::conv2d(*kind, attrs, arg(0)?, arg(1)?, shape(0)?))
            }
            Op::Pool2d { kind, attrs } => one(window::pool2d(*kind, attrs, args, shape(0)?)),
            Op::OneHot { depth, dtype } => one(k::one_hot(arg(0)?, *depth, *dtype)),
            Op::Iota { axis, ty } => one(k::iota(shape(0)?, *axis, ty.dtype)),
            Op::Random { dist, seed, ty } => {
                let stream = Stream::new(*seed, self.rng_counter);
                Ok(vec![k::random(*dist, stream, shape(0)?, ty.dtype)])
            }
            Op::Call { callee, .. } => {
                let ops = self.custom_ops.ok_or_else(|| {
                    format!("custom op @{callee} called, but no custom ops are registered")
                })?;
                let owned: Vec<Array> = args.iter().map(|&a| a.clone()).collect();
                ops.call(callee, &owned)
                    .map(|rs| rs.into_iter().map(Array::into_standard_layout).collect())
                    .map_err(|e| OpError(format!("custom op @{callee}: {e}")))
            }
            kiln_ir::communication_op!() => {
                crate::comm::start(op, crate::comm::borrowed(args), result_shapes)
                    .and_then(crate::comm::Started::wait)
                    .map_err(OpError)
            }
            Op::Load { .. } | Op::Store { .. } | Op::Cond | Op::While | Op::Fused => Err(format!(
                "`{}` needs state or regions; run it in a function",
                op.name()
            )
            .into()),
        }
    }

    fn while_loop(
        &self,
        frame: &mut Frame<'_>,
        inst: Inst,
        state: &StateStore,
    ) -> Result<Vec<Arc<Array>>, Eval> {
        let func = frame.func;
        let data = func.inst(inst);
        let [cond, body] = data.regions[..] else {
            return Err(Eval::Kernel("`while` needs two regions".into()));
        };
        let mut carried: Vec<Arc<Array>> = data
            .args
            .iter()
            .map(|v| operand(frame, Some(v)))
            .collect::<Result<_, _>>()?;
        loop {
            for (&a, v) in func.region(cond).args.iter().zip(&carried) {
                frame.values.insert(a, v.clone());
            }
            let keep_going = self
                .region(frame, cond, state)
                .map_err(|e| Eval::Nested(Box::new(e)))?;
            forget(frame, cond);
            match keep_going.first().and_then(|a| a.as_bool_scalar()) {
                Some(true) => crate::limits::count_trip().map_err(Eval::Kernel)?,
                Some(false) => return Ok(carried),
                None => {
                    return Err(Eval::Kernel(
                        "the `cond` region did not yield a bool scalar".into(),
                    ));
                }
            }
            for (&a, v) in func.region(body).args.iter().zip(carried) {
                frame.values.insert(a, v);
            }
            carried = self
                .region(frame, body, state)
                .map_err(|e| Eval::Nested(Box::new(e)))?;
            // Only `carried` holds the next trip's values, so a stack updated in place on
            // this trip is not shared on the next.
            forget(frame, body);
        }
    }

    /// `update_slice` whose array operand dies here: that array, taken out of the frame, is
    /// updated in place when nothing else holds it (O(slice) per trip, not O(array)).
    fn update_slice_in_place(
        &self,
        frame: &mut Frame<'_>,
        inst: Inst,
        axis: usize,
    ) -> Result<(), InterpError> {
        let data = frame.func.inst(inst);
        let fail = |frame: &Frame<'_>, e: String| self.fail(frame, inst, e);
        let [array, value, index] = data.args[..] else {
            return Err(fail(frame, "`update_slice` takes three operands".into()));
        };
        let Some(target) = frame.values.remove(&array) else {
            return Err(fail(frame, "an operand has no value".into()));
        };
        let mut target = unshare(target).into_standard_layout();
        let (value, index) = (frame.values.get(&value), frame.values.get(&index));
        let (Some(value), Some(index)) = (value, index) else {
            return Err(fail(frame, "an operand has no value".into()));
        };
        kernels::update_slice_in_place(&mut target, value, index, axis)
            .map_err(|e| fail(frame, e.0))?;
        frame.values.insert(data.results[0], Arc::new(target));
        Ok(())
    }
}

/// Drops the values `region` (and the regions in it) defined from the frame.
fn forget(frame: &mut Frame<'_>, region: Region) {
    let func = frame.func;
    let data = func.region(region);
    for v in &data.args {
        frame.values.remove(v);
    }
    for &inst in &data.insts {
        for v in &func.inst(inst).results {
            frame.values.remove(v);
        }
        for &r in &func.inst(inst).regions {
            forget(frame, r);
        }
    }
}

/// Whether the first operand of instruction `at` of `region` is defined in that region and
/// read by nothing after it there (nor yielded): then it may be consumed.
fn dies_at(func: &Function, region: Region, at: usize) -> bool {
    let insts = &func.region(region).insts;
    let v = func.inst(insts[at]).args[0];
    let local = match func.value(v).def {
        ValueDef::Arg(r, _) => r == region,
        ValueDef::Result(def, _) => insts[..at].contains(&def),
    };
    let read_later = insts[at + 1..].iter().any(|&later| {
        let d = func.inst(later);
        d.args.contains(&v) || d.regions.iter().any(|&r| func.free_values(r).contains(&v))
    });
    let read_here = func.inst(insts[at]).args[1..].contains(&v);
    local && !read_here && !read_later && !func.region(region).results.contains(&v)
}

fn operand(frame: &Frame<'_>, v: Option<&Value>) -> Result<Arc<Array>, Eval> {
    v.and_then(|v| frame.values.get(v))
        .cloned()
        .ok_or_else(|| Eval::Kernel("an operand has no value (is the function verified?)".into()))
}

/// The array behind a shared reference, copied only if it is still shared.
pub fn unshare(a: Arc<Array>) -> Array {
    Arc::try_unwrap(a).unwrap_or_else(|shared| (*shared).clone())
}

/// Why evaluating one instruction failed: its own kernel, or an instruction in its regions.
enum Eval {
    Kernel(String),
    Nested(Box<InterpError>),
}
