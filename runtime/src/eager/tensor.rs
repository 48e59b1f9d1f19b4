//! Eager tensors.

use super::tape::{Generation, evaluate};
use super::trace::Trace;
use super::{Context, EagerError, EagerResult, LeafId, with};
use crate::composite;
use kiln_backend::interp::kernels;
use kiln_backend::{Array, Env};
use kiln_ir::{
    ArgOp, AxisSlice, BinaryOp, BuildError, BuildResult, CompareOp, Conv2dAttrs, DType,
    FunctionBuilder, Loc, Pool2dAttrs, ReduceOp, Shape, Type, UnaryOp, Value,
};
use std::fmt;
use std::sync::Arc;

/// A tensor: a value computed at once (eager), or a symbolic value while tracing.
///
/// Methods return `Result`s; the operators `+ - * /` and unary `-` are shorthands that panic
/// with the same message on a shape or dtype error, as slice indexing does.
#[derive(Clone)]
pub struct Tensor(pub(crate) Repr);

#[derive(Clone)]
pub(crate) enum Repr {
    Eager {
        data: Arc<Array>,
        /// Set while the tensor is recorded on the tape.
        node: Option<Node>,
        /// Set when gradients accumulate for this tensor.
        leaf: Option<LeafId>,
    },
    Traced {
        value: Value,
        trace: u64,
        ty: Type,
    },
}

#[derive(Clone)]
pub(crate) struct Node {
    value: Value,
    generation: Arc<Generation>,
    /// The context whose tape holds the value.
    context: u64,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Repr::Eager { data, .. } => write!(f, "Tensor({}: {data})", data.ty()),
            Repr::Traced { value, ty, .. } => write!(f, "Tensor(traced {value}: {ty})"),
        }
    }
}

/// Puts the caller's location on a build error raised inside a tensor method.
fn at(mut e: BuildError, loc: Loc) -> BuildError {
    e.loc = loc;
    e
}

/// Applies `build` — calls of the IR builder — to `inputs`: traced into the current trace,
/// recorded on the tape (and evaluated) when gradients must flow, or just evaluated.
pub(crate) fn apply(
    inputs: &[&Tensor],
    loc: Loc,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> EagerResult<Vec<Tensor>> {
    with(|cx| {
        for t in inputs {
            t.check_in(cx)?;
        }
        let traced = inputs.iter().any(|t| matches!(t.0, Repr::Traced { .. }))
            || (inputs.is_empty() && cx.trace.is_some());
        let outs = if traced {
            trace_op(cx, inputs, loc, build)
        } else if cx.grad_enabled && inputs.iter().any(|t| t.on_tape(cx)) {
            record_op(cx, inputs, loc, build)
        } else {
            compute_op(cx, inputs, loc, build)
        }?;
        if let Some(recording) = &mut cx.recording {
            recording.push(loc, &outs);
        }
        Ok(outs)
    })
}

/// The fast path of an eager op: when no input is traced or on the tape (so no IR needs to be
/// recorded), the interpreter's kernel computes the result at once. `None` sends the op down
/// the general path — which also reports any error with the op's location.
fn direct(
    inputs: &[&Tensor],
    kernel: impl FnOnce(&Array, Option<&Array>) -> kernels::KernelResult<Array>,
) -> Option<Tensor> {
    let result = with(|cx| {
        // Traced ops build IR; recorded ones (`diff`) need their location.
        if cx.trace.is_some() || cx.recording.is_some() {
            return Ok(None);
        }
        fn eager<'t>(cx: &Context, t: &'t Tensor) -> Option<&'t Array> {
            match &t.0 {
                Repr::Eager { data, .. }
                    if t.owner().is_none_or(|o| o == cx.id)
                        && !(cx.grad_enabled && t.on_tape(cx)) =>
                {
                    Some(&**data)
                }
                _ => None,
            }
        }
        let first = inputs.first().and_then(|t| eager(cx, t));
        let second = inputs.get(1).map(|t| eager(cx, t));
        let Some(first) = first else {
            return Ok(None);
        };
        if second == Some(None) {
            return Ok(None);
        }
        // Operands and a result of the first's size past the memory limit go the general way,
        // which refuses them with the op's line.
        let bytes = |a: &Array| (a.len() * a.dtype().size_bytes()) as u128;
        let held = 2 * bytes(first) + second.flatten().map_or(0, bytes);
        if held > u128::from(kiln_backend::limits::memory_limit()) {
            return Ok(None);
        }
        Ok(kernel(first, second.flatten()).ok())
    });
    result
        .ok()
        .flatten()
        .map(|a| Tensor::from_shared(Arc::new(a)))
}

/// Applies builder code to eager tensors: `build` receives the builder and the inputs as IR
/// values and returns the result. It runs at once, is recorded for `backward()`, or is traced
/// into a `to_static` program, like every tensor method (which are all written this way).
///
/// ```
/// use kiln_runtime::eager::{self, Tensor};
/// let x = Tensor::from_f32(&[2], vec![1.0, 2.0])?;
/// let y = eager::compose(&[&x], |b, v| {
///     let e = b.exp(v[0])?;
///     b.add(e, v[0])
/// })?;
/// assert!((y.to_f64_vec()?[0] - (1f64.exp() + 1.0)).abs() < 1e-6);
/// # Ok::<(), kiln_runtime::eager::EagerError>(())
/// ```
#[track_caller]
pub fn compose(
    inputs: &[&Tensor],
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) -> EagerResult<Tensor> {
    apply1(inputs, Loc::caller(), build)
}

pub(crate) fn apply1(
    inputs: &[&Tensor],
    loc: Loc,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) -> EagerResult<Tensor> {
    let mut out = apply(inputs, loc, |b, v| Ok(vec![build(b, v)?]))?;
    Ok(out.remove(0))
}

fn compute_op(
    cx: &mut Context,
    inputs: &[&Tensor],
    loc: Loc,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> EagerResult<Vec<Tensor>> {
    let mut b = FunctionBuilder::new("eager");
    let mut env = Env::new();
    let mut args = Vec::with_capacity(inputs.len());
    for t in inputs {
        let data = t.data()?;
        let v = b.arg("t", data.ty());
        env.insert(v, data.clone());
        args.push(v);
    }
    let outs = build(&mut b, &args).map_err(|e| at(e, loc))?;
    b.relocate_since(0, loc);
    let func = b.function();
    let insts = func.region(func.body()).insts.clone();
    cx.rng_counter += 1;
    evaluate(func, &insts, &mut env, cx.rng_counter)?;
    Ok(outs
        .iter()
        .map(|v| Tensor::from_shared(env[v].clone()))
        .collect())
}

fn record_op(
    cx: &mut Context,
    inputs: &[&Tensor],
    loc: Loc,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> EagerResult<Vec<Tensor>> {
    let generation = cx.tape.generation();
    let mut args = Vec::with_capacity(inputs.len());
    for t in inputs {
        let Repr::Eager { data, node, leaf } = &t.0 else {
            unreachable!("traced tensors take the trace path");
        };
        args.push(match node {
            Some(n) if cx.tape.is_current(&n.generation) => n.value,
            _ => cx.tape.argument(data, *leaf),
        });
    }
    let start = cx.tape.builder().current_len();
    let outs = build(cx.tape.builder(), &args).map_err(|e| at(e, loc))?;
    cx.tape.builder().relocate_since(start, loc);
    cx.rng_counter += 1;
    cx.tape.evaluate(cx.rng_counter)?;
    outs.iter()
        .map(|&v| {
            let data = cx
                .tape
                .value(v)
                .cloned()
                .ok_or_else(|| EagerError::Usage("an op left no value".into()))?;
            Ok(Tensor(Repr::Eager {
                data,
                node: Some(Node {
                    value: v,
                    generation: generation.clone(),
                    context: cx.id,
                }),
                leaf: None,
            }))
        })
        .collect()
}

fn trace_op(
    cx: &mut Context,
    inputs: &[&Tensor],
    loc: Loc,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> EagerResult<Vec<Tensor>> {
    let trace = cx.trace.as_mut().ok_or_else(|| {
        EagerError::Usage("a traced tensor was used after its `to_static` call returned".into())
    })?;
    let args = inputs
        .iter()
        .map(|t| trace.value_of(t))
        .collect::<EagerResult<Vec<_>>>()?;
    let start = trace.program.current_len();
    let outs = build(&mut trace.program, &args).map_err(|e| at(e, loc))?;
    trace.program.relocate_since(start, loc);
    Ok(outs.iter().map(|&v| trace.tensor(v)).collect())
}

impl Tensor {
    /// A tensor holding `data`.
    pub fn new(data: Array) -> Tensor {
        Tensor::from_shared(Arc::new(data.into_standard_layout()))
    }

    pub(crate) fn from_shared(data: Arc<Array>) -> Tensor {
        Tensor(Repr::Eager {
            data,
            node: None,
            leaf: None,
        })
    }

    pub(crate) fn leaf(data: Arc<Array>, leaf: LeafId) -> Tensor {
        Tensor(Repr::Eager {
            data,
            node: None,
            leaf: Some(leaf),
        })
    }

    /// An f32 tensor of `shape` from row-major `values`.
    pub fn from_f32(shape: &[usize], values: Vec<f32>) -> EagerResult<Tensor> {
        let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values).map_err(|e| {
            EagerError::Usage(format!(
                "{} values do not fill shape {shape:?}: {e}",
                shape.iter().product::<usize>()
            ))
        })?;
        Ok(Tensor::new(Array::F32(a)))
    }

    /// An f32 scalar.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::new(Array::F32(ndarray::arr0(v).into_dyn()))
    }

    /// A tensor of zeros.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::new(Array::zeros(dtype, shape))
    }

    /// A tensor every element of which is `value`.
    pub fn full(dtype: DType, shape: &[usize], value: f64) -> Tensor {
        Tensor::new(
            Array::F64(ndarray::ArrayD::from_elem(ndarray::IxDyn(shape), value)).cast(dtype),
        )
    }

    /// Uniform samples in `[low, high)`; drawn afresh each time (and each run, when traced).
    #[track_caller]
    pub fn rand(
        dtype: DType,
        shape: &[usize],
        low: f64,
        high: f64,
        seed: u64,
    ) -> EagerResult<Tensor> {
        let ty = Type::new(dtype, Shape::fixed(shape));
        apply1(&[], Loc::caller(), |b, _| {
            b.random_uniform(ty, low, high, seed)
        })
    }

    /// Normal samples; drawn afresh each time (and each run, when traced).
    #[track_caller]
    pub fn randn(
        dtype: DType,
        shape: &[usize],
        mean: f64,
        std: f64,
        seed: u64,
    ) -> EagerResult<Tensor> {
        let ty = Type::new(dtype, Shape::fixed(shape));
        apply1(&[], Loc::caller(), |b, _| {
            b.random_normal(ty, mean, std, seed)
        })
    }

    /// Uniform samples shaped like `self` (symbolic dimensions included, when traced).
    #[track_caller]
    pub fn rand_like(&self, low: f64, high: f64, seed: u64) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            let ty = b.value_type(v[0]).clone();
            b.random_uniform(ty, low, high, seed)
        })
    }

    // ----- what it is -----

    /// The tensor's type (symbolic dimensions while tracing).
    pub fn ty(&self) -> Type {
        match &self.0 {
            Repr::Eager { data, .. } => data.ty(),
            Repr::Traced { ty, .. } => ty.clone(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.ty().dtype
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.ty().rank()
    }

    /// Whether the tensor is a symbolic value of a trace.
    pub fn is_traced(&self) -> bool {
        matches!(self.0, Repr::Traced { .. })
    }

    /// The context (thread) whose gradient state the tensor refers to, if it refers to any.
    fn owner(&self) -> Option<u64> {
        match &self.0 {
            Repr::Eager { leaf: Some(l), .. } => Some(l.context),
            Repr::Eager { node: Some(n), .. } => Some(n.context),
            _ => None,
        }
    }

    fn check_in(&self, cx: &Context) -> EagerResult<()> {
        match self.owner() {
            Some(owner) => cx.check_owner(owner, "a tensor that records gradients"),
            None => Ok(()),
        }
    }

    /// An error when the tensor records gradients in another thread than this one: its
    /// gradient, or a backward pass through it, would be silently missing here.
    pub fn check_thread(&self) -> EagerResult<()> {
        with(|cx| self.check_in(cx))
    }

    fn on_tape(&self, cx: &Context) -> bool {
        match &self.0 {
            Repr::Eager { leaf: Some(l), .. } => l.context == cx.id,
            Repr::Eager { node: Some(n), .. } => cx.tape.is_current(&n.generation),
            _ => false,
        }
    }

    pub(crate) fn data(&self) -> EagerResult<&Arc<Array>> {
        match &self.0 {
            Repr::Eager { data, .. } => Ok(data),
            Repr::Traced { value, ty, .. } => Err(EagerError::TracedRead {
                value: format!("traced tensor {value}: {ty}"),
            }),
        }
    }

    /// The value. While tracing there is none: the error says to use `cond`/`while_loop`.
    pub fn to_array(&self) -> EagerResult<Array> {
        Ok((**self.data()?).clone())
    }

    /// The value as an ndarray of `T`: `x.to_ndarray::<f32>()?`.
    pub fn to_ndarray<T: kiln_backend::Element>(&self) -> EagerResult<ndarray::ArrayD<T>> {
        let data = self.data()?;
        data.as_ndarray::<T>().cloned().ok_or_else(|| {
            EagerError::Usage(format!(
                "the tensor is {}, not {}",
                data.ty(),
                std::any::type_name::<T>()
            ))
        })
    }

    /// The elements as f64, row-major.
    pub fn to_f64_vec(&self) -> EagerResult<Vec<f64>> {
        Ok(self.data()?.to_f64_vec())
    }

    /// The value of a one-element tensor.
    pub fn item(&self) -> EagerResult<f64> {
        let data = self.data()?;
        match data.to_f64_vec()[..] {
            [v] => Ok(v),
            _ => Err(EagerError::Usage(format!(
                "item() needs one element, the tensor is {}",
                data.ty()
            ))),
        }
    }

    // ----- gradients -----

    /// This tensor, with gradients accumulated for it by `backward()`.
    pub fn requires_grad(self) -> EagerResult<Tensor> {
        let data = self.data()?.clone();
        with(|cx| Ok(Tensor::leaf(data, cx.new_leaf())))
    }

    /// Whether gradients flow into or through this tensor.
    pub fn tracks_grad(&self) -> bool {
        with(|cx| Ok(self.on_tape(cx))).unwrap_or(false)
    }

    /// The same value, cut off from gradients.
    pub fn detach(&self) -> EagerResult<Tensor> {
        Ok(Tensor::from_shared(self.data()?.clone()))
    }

    /// Computes the gradient of this scalar with respect to every leaf it depends on and adds
    /// it to their `grad()`. The tape is cleared.
    pub fn backward(&self) -> EagerResult<()> {
        with(|cx| {
            self.check_in(cx)?;
            let value = match &self.0 {
                Repr::Eager { node: Some(n), .. } if cx.tape.is_current(&n.generation) => n.value,
                Repr::Traced { .. } => {
                    return Err(EagerError::Usage(
                        "backward() runs eagerly; for a traced function use StaticFunction::gradients".into(),
                    ));
                }
                _ => {
                    return Err(EagerError::Usage(
                        "backward(): this tensor does not depend on any tensor that requires grad \
                         (or its tape was already used by an earlier backward())"
                            .into(),
                    ));
                }
            };
            cx.rng_counter += 1;
            let grads = cx.tape.backward(value, cx.rng_counter)?;
            for (leaf, g) in grads {
                super::tape::accumulate(cx, leaf, g)?;
            }
            Ok(())
        })
    }

    /// The gradient accumulated for this leaf, if any.
    pub fn grad(&self) -> Option<Tensor> {
        let Repr::Eager {
            leaf: Some(leaf), ..
        } = &self.0
        else {
            return None;
        };
        with(|cx| Ok(cx.grads.get(leaf).cloned()))
            .ok()
            .flatten()
            .map(Tensor::from_shared)
    }

    /// Forgets the gradient accumulated for this leaf.
    pub fn zero_grad(&self) {
        if let Repr::Eager {
            leaf: Some(leaf), ..
        } = &self.0
        {
            let leaf = *leaf;
            let _ = with(|cx| {
                cx.grads.remove(&leaf);
                Ok(())
            });
        }
    }

    // ----- elementwise -----

    /// `op(self)`, elementwise.
    #[track_caller]
    pub fn unary(&self, op: UnaryOp) -> EagerResult<Tensor> {
        if let Some(t) = direct(&[self], |a, _| kernels::unary(op, a)) {
            return Ok(t);
        }
        apply1(&[self], Loc::caller(), |b, v| b.unary(op, v[0]))
    }

    /// `op(self, other)` with NumPy broadcasting.
    #[track_caller]
    pub fn binary(&self, op: BinaryOp, other: &Tensor) -> EagerResult<Tensor> {
        // The kernel refuses operands of different dtypes or shapes (broadcasting goes the
        // general way, as do errors, which then name the op's location).
        let kernel = |a: &Array, b: Option<&Array>| match b {
            Some(b) => kernels::binary(op, a, b),
            None => Err(kernels::OpError::from("no second operand")),
        };
        if let Some(t) = direct(&[self, other], kernel) {
            return Ok(t);
        }
        apply1(&[self, other], Loc::caller(), |b, v| {
            b.binary(op, v[0], v[1])
        })
    }

    /// `op(self, c)` with a scalar of this tensor's dtype.
    #[track_caller]
    pub fn binary_scalar(&self, op: BinaryOp, c: f64) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            let dtype = b.value_type(v[0]).dtype;
            let c = b.scalar(dtype, c)?;
            b.binary(op, v[0], c)
        })
    }

    /// The comparison `op(self, other)`, elementwise with broadcasting.
    #[track_caller]
    pub fn compare(&self, op: CompareOp, other: &Tensor) -> EagerResult<Tensor> {
        apply1(&[self, other], Loc::caller(), |b, v| {
            b.compare(op, v[0], v[1])
        })
    }

    /// The comparison `op(self, c)` against a scalar.
    #[track_caller]
    pub fn compare_scalar(&self, op: CompareOp, c: f64) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            let dtype = b.value_type(v[0]).dtype;
            let c = b.scalar(dtype, c)?;
            b.compare(op, v[0], c)
        })
    }

    /// The tensor converted to `dtype`.
    #[track_caller]
    pub fn cast(&self, dtype: DType) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| b.cast(v[0], dtype))
    }

    // ----- layout -----

    /// The same elements in `shape`.
    #[track_caller]
    pub fn reshape(&self, shape: impl Into<Shape>) -> EagerResult<Tensor> {
        let shape = shape.into();
        apply1(&[self], Loc::caller(), |b, v| b.reshape(v[0], shape))
    }

    /// The axes permuted by `perm`.
    #[track_caller]
    pub fn transpose(&self, perm: &[usize]) -> EagerResult<Tensor> {
        let perm = perm.to_vec();
        apply1(&[self], Loc::caller(), |b, v| b.transpose(v[0], perm))
    }

    /// The matrix transpose (the last two axes swapped).
    #[track_caller]
    pub fn t(&self) -> EagerResult<Tensor> {
        let rank = self.rank();
        if rank < 2 {
            return Err(EagerError::Usage(format!(
                "t() needs rank 2 or more, the tensor is {}",
                self.ty()
            )));
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        self.transpose(&perm)
    }

    /// The tensor broadcast to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: impl Into<Shape>) -> EagerResult<Tensor> {
        let shape = shape.into();
        apply1(&[self], Loc::caller(), |b, v| b.broadcast_to(v[0], &shape))
    }

    /// A range of each axis.
    #[track_caller]
    pub fn slice(&self, ranges: Vec<AxisSlice>) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| b.slice(v[0], ranges))
    }

    /// `tensors` joined along `axis`.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor], axis: usize) -> EagerResult<Tensor> {
        apply1(tensors, Loc::caller(), |b, v| b.concat(v, axis))
    }

    // ----- reductions, contractions, indexing -----

    /// `op` over `axes`.
    #[track_caller]
    pub fn reduce(&self, op: ReduceOp, axes: &[usize], keep_dims: bool) -> EagerResult<Tensor> {
        let axes = axes.to_vec();
        apply1(&[self], Loc::caller(), |b, v| {
            b.reduce(op, v[0], axes, keep_dims)
        })
    }

    /// The sum over `axes`.
    #[track_caller]
    pub fn sum(&self, axes: &[usize], keep_dims: bool) -> EagerResult<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keep_dims)
    }

    /// The mean over `axes`.
    #[track_caller]
    pub fn mean(&self, axes: &[usize], keep_dims: bool) -> EagerResult<Tensor> {
        self.reduce(ReduceOp::Mean, axes, keep_dims)
    }

    /// The sum of every element: a scalar.
    #[track_caller]
    pub fn sum_all(&self) -> EagerResult<Tensor> {
        let axes: Vec<usize> = (0..self.rank()).collect();
        self.reduce(ReduceOp::Sum, &axes, false)
    }

    /// The mean of every element: a scalar.
    #[track_caller]
    pub fn mean_all(&self) -> EagerResult<Tensor> {
        let axes: Vec<usize> = (0..self.rank()).collect();
        self.reduce(ReduceOp::Mean, &axes, false)
    }

    /// The index of the largest element along `axis`.
    #[track_caller]
    pub fn argmax(&self, axis: usize) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            b.arg_reduce(ArgOp::ArgMax, v[0], axis, false)
        })
    }

    /// The matrix product.
    #[track_caller]
    pub fn matmul(&self, other: &Tensor) -> EagerResult<Tensor> {
        apply1(&[self, other], Loc::caller(), |b, v| b.matmul(v[0], v[1]))
    }

    /// The matrix product with either operand's last two axes swapped first.
    #[track_caller]
    pub fn matmul_t(
        &self,
        other: &Tensor,
        transpose_a: bool,
        transpose_b: bool,
    ) -> EagerResult<Tensor> {
        apply1(&[self, other], Loc::caller(), |b, v| {
            b.matmul_t(v[0], v[1], transpose_a, transpose_b)
        })
    }

    /// Rows (or slices along `axis`) of `self` picked by integer `indices`.
    #[track_caller]
    pub fn gather(&self, indices: &Tensor, axis: usize) -> EagerResult<Tensor> {
        apply1(&[self, indices], Loc::caller(), |b, v| {
            b.gather(v[0], v[1], axis)
        })
    }

    /// Integer labels as one-hot vectors of `depth`.
    #[track_caller]
    pub fn one_hot(&self, depth: usize, dtype: DType) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| b.one_hot(v[0], depth, dtype))
    }

    /// `cond ? on_true : on_false`, elementwise, broadcast together.
    #[track_caller]
    pub fn select(cond: &Tensor, on_true: &Tensor, on_false: &Tensor) -> EagerResult<Tensor> {
        apply1(&[cond, on_true, on_false], Loc::caller(), |b, v| {
            b.select(v[0], v[1], v[2])
        })
    }

    /// `exp(x - max) / sum(exp(x - max))` along `axis` (see [`composite::softmax`]).
    #[track_caller]
    pub fn softmax(&self, axis: usize) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            composite::softmax(b, v[0], axis)
        })
    }

    /// `x - max - log(sum(exp(x - max)))` along `axis` (see [`composite::log_softmax`]).
    #[track_caller]
    pub fn log_softmax(&self, axis: usize) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| {
            composite::log_softmax(b, v[0], axis)
        })
    }

    /// `conv2d(self, w)`: NCHW input, OIHW weights.
    #[track_caller]
    pub fn conv2d(&self, w: &Tensor, attrs: Conv2dAttrs) -> EagerResult<Tensor> {
        apply1(&[self, w], Loc::caller(), |b, v| {
            b.conv2d(v[0], v[1], attrs)
        })
    }

    /// The largest element of each window (NCHW).
    #[track_caller]
    pub fn max_pool2d(&self, attrs: Pool2dAttrs) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| b.max_pool2d(v[0], attrs))
    }

    /// The mean of each window (NCHW; padding counts as zeros).
    #[track_caller]
    pub fn avg_pool2d(&self, attrs: Pool2dAttrs) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| b.avg_pool2d(v[0], attrs))
    }

    /// Every axis but the first in one (see [`composite::flatten`]).
    #[track_caller]
    pub fn flatten(&self) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| composite::flatten(b, v[0]))
    }

    /// GELU with the exact normal CDF (see [`composite::gelu`]).
    #[track_caller]
    pub fn gelu(&self) -> EagerResult<Tensor> {
        apply1(&[self], Loc::caller(), |b, v| composite::gelu(b, v[0]))
    }
}

/// Shorthand methods generated from the op table's elementwise tables: `x.exp()?`.
macro_rules! unary_methods {
    ($(#[$meta:meta])* $enum:ident {
        $($variant:ident = $text:literal, $method:ident, $($_rest:ident),*;)*
    }) => {
        impl Tensor {
            $(
                #[doc = concat!("`", $text, "`, elementwise.")]
                #[track_caller]
                pub fn $method(&self) -> EagerResult<Tensor> {
                    self.unary($enum::$variant)
                }
            )*
        }
    };
}

/// Shorthand methods for the two-operand tables, which broadcast: `x.add(&y)?`, `x.lt(&y)?`.
macro_rules! pair_methods {
    ($kind:ident $(#[$meta:meta])* $enum:ident {
        $($variant:ident = $text:literal, $method:ident, $($_rest:ident),*;)*
    }) => {
        impl Tensor {
            $(
                #[doc = concat!("`", $text, "`, elementwise, with NumPy broadcasting.")]
                #[track_caller]
                pub fn $method(&self, other: &Tensor) -> EagerResult<Tensor> {
                    self.$kind($enum::$variant, other)
                }
            )*
        }
    };
}

macro_rules! binary_methods {
    ($($t:tt)*) => { pair_methods!(binary $($t)*); };
}
macro_rules! compare_methods {
    ($($t:tt)*) => { pair_methods!(compare $($t)*); };
}
kiln_ir::with_unary_ops!(unary_methods);
kiln_ir::with_binary_ops!(binary_methods);
kiln_ir::with_compare_ops!(compare_methods);

/// Unwraps an operator's result: operators cannot return errors, so they panic with the
/// error's message (which names the op, the shapes and the caller's line).
#[track_caller]
fn operator(result: EagerResult<Tensor>) -> Tensor {
    match result {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

macro_rules! operators {
    ($($trait:ident $method:ident => $op:ident),*) => {$(
        impl std::ops::$trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                operator(self.binary(BinaryOp::$op, rhs))
            }
        }
        impl std::ops::$trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                operator(self.binary(BinaryOp::$op, &rhs))
            }
        }
        impl std::ops::$trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                operator(self.binary(BinaryOp::$op, rhs))
            }
        }
        impl std::ops::$trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                operator(self.binary(BinaryOp::$op, &rhs))
            }
        }
        impl std::ops::$trait<f64> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f64) -> Tensor {
                operator(self.binary_scalar(BinaryOp::$op, rhs))
            }
        }
        impl std::ops::$trait<f64> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: f64) -> Tensor {
                operator(self.binary_scalar(BinaryOp::$op, rhs))
            }
        }
    )*};
}

operators!(Add add => Add, Sub sub => Sub, Mul mul => Mul, Div div => Div);

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        operator(self.unary(UnaryOp::Neg))
    }
}

impl std::ops::Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        operator(self.unary(UnaryOp::Neg))
    }
}

impl From<Array> for Tensor {
    fn from(a: Array) -> Tensor {
        Tensor::new(a)
    }
}

impl<T> From<ndarray::ArrayD<T>> for Tensor
where
    Array: From<ndarray::ArrayD<T>>,
{
    fn from(a: ndarray::ArrayD<T>) -> Tensor {
        Tensor::new(Array::from(a))
    }
}

impl Trace {
    /// The trace's value for tensor `t`: itself when traced, else its value as a constant.
    pub(crate) fn value_of(&mut self, t: &Tensor) -> EagerResult<Value> {
        match &t.0 {
            Repr::Traced { value, trace, .. } if *trace == self.id => Ok(*value),
            Repr::Traced { .. } => Err(EagerError::Usage(
                "a tensor of an earlier `to_static` trace was used in this one".into(),
            )),
            Repr::Eager { data, .. } => Ok(self.constant(data)?),
        }
    }

    /// A traced tensor for value `v` of the trace.
    pub(crate) fn tensor(&self, v: Value) -> Tensor {
        Tensor(Repr::Traced {
            value: v,
            trace: self.id,
            ty: self.program.value_type(v).clone(),
        })
    }
}
