//! Static programs from Python: `Program`, its values (`Var`, with operators), layers and
//! losses, `minimize`, `Session`, Keras-style functions, and saved-model predictors.

use crate::array::{dtype, from_py, to_py};
use crate::eager::{init, layer_kind, layer_kind_error, rule};
use crate::errors::{KilnError, kiln_ok};
use crate::options::{Options, check_batch_norm};
use kiln::backend::Array;
use kiln::ir::{BinaryOp, Dim, ReduceOp, UnaryOp, Value};
use kiln::runtime::layers::{self, Activation};
use kiln::runtime::{
    Feed, Fetch, Init, KerasFunction, LayerForm, LayerKind, Optimizer, Program, RuntimeError,
    Session, Target,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyProgram>()?;
    m.add_class::<PyVar>()?;
    m.add_class::<PyTarget>()?;
    m.add_class::<PyBatchNorm>()?;
    m.add_class::<PySession>()?;
    m.add_class::<PyFunction>()?;
    m.add_class::<PyPredictor>()?;
    m.add_function(wrap_pyfunction!(load_predictor, m)?)?;
    m.add_function(wrap_pyfunction!(load_onnx, m)?)?;
    Ok(())
}

/// A static program under construction, its default session, and how many times a value
/// was named (a change its size does not show, which sessions must take up too).
#[pyclass(name = "Program", module = "kiln.static")]
pub(crate) struct PyProgram(Program, Option<Py<PySession>>, usize);

/// A value of a program; arithmetic on it adds ops to its program.
#[pyclass(name = "Var", module = "kiln.static")]
pub(crate) struct PyVar {
    program: Py<PyProgram>,
    value: Value,
}

impl Clone for PyVar {
    fn clone(&self) -> PyVar {
        Python::attach(|py| PyVar {
            program: self.program.clone_ref(py),
            value: self.value,
        })
    }
}

impl PyVar {
    /// The value, when it belongs to `program`; else an error saying that `what` mixes two
    /// programs (a value id of one means nothing, or something else, in another).
    fn value_in(&self, program: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
        if self.program.as_ptr() == program.as_ptr() {
            return Ok(self.value);
        }
        Err(KilnError::new_err(format!(
            "{what}: a value of another Program; each Program is a graph of its own, so values \
             of two programs cannot be combined, fed or fetched together"
        )))
    }
}

/// A group of updates `minimize` made; fetch it to apply them.
#[pyclass(name = "Target", module = "kiln.static", frozen)]
pub(crate) struct PyTarget {
    program: Py<PyProgram>,
    target: Target,
    /// The target's name (`<optimizer>.minimize`, say).
    #[pyo3(get)]
    name: String,
}

impl PyTarget {
    /// The target, when it belongs to `program`; else an error naming it and `what`.
    fn target_in(&self, program: &Bound<'_, PyAny>, what: &str) -> PyResult<Target> {
        if self.program.as_ptr() == program.as_ptr() {
            return Ok(self.target);
        }
        Err(KilnError::new_err(format!(
            "{what}: target `{}` belongs to another Program than the session's",
            self.name
        )))
    }
}

/// Batch normalisation in a program (`Program.batch_norm`): `train(x)` gives the output
/// normalised with the batch's statistics and the target that updates the running averages;
/// `eval(x)` the output normalised with them.
#[pyclass(name = "BatchNorm", module = "kiln.static")]
pub(crate) struct PyBatchNorm {
    program: Py<PyProgram>,
    layer: layers::BatchNorm,
}

#[pymethods]
impl PyBatchNorm {
    /// `(y, update)`: `x` normalised with its batch's statistics, and the target that folds
    /// them into the running averages (fetch it with the training step).
    fn train(&self, py: Python<'_>, x: &PyVar) -> PyResult<(PyVar, PyTarget)> {
        let program = self.program.bind(py);
        let x = x.value_in(program.as_any(), "batch_norm")?;
        let mut this = program.borrow_mut();
        let (y, target) = kiln_ok(self.layer.train(&mut this.0, x))?;
        let name = this.0.target_name(target).to_owned();
        drop(this);
        Ok((
            PyProgram::var(program, y),
            PyTarget {
                program: self.program.clone_ref(py),
                target,
                name,
            },
        ))
    }

    /// `x` normalised with the running statistics.
    fn eval(&self, py: Python<'_>, x: &PyVar) -> PyResult<PyVar> {
        let program = self.program.bind(py);
        let x = x.value_in(program.as_any(), "batch_norm")?;
        let y = kiln_ok(self.layer.eval(&mut program.borrow_mut().0, x))?;
        Ok(PyProgram::var(program, y))
    }
}

fn activation(name: Option<&str>) -> PyResult<Activation> {
    Ok(match name.unwrap_or("identity") {
        "identity" | "linear" => Activation::Identity,
        "relu" => Activation::Relu,
        "tanh" => Activation::Tanh,
        "sigmoid" => Activation::Sigmoid,
        "softplus" => Activation::Softplus,
        "gelu" => Activation::Gelu,
        other => {
            return Err(PyTypeError::new_err(format!(
                "unknown activation `{other}`"
            )));
        }
    })
}

impl PyProgram {
    /// The name of the parameter `item` is: a name, or a parameter's `Var`.
    fn parameter_named(slf: &Bound<'_, PyProgram>, item: &Bound<'_, PyAny>) -> PyResult<String> {
        let Ok(var) = item.extract::<PyRef<'_, PyVar>>() else {
            return item
                .extract()
                .map_err(|_| PyTypeError::new_err("a parameter to train is its name or its Var"));
        };
        let value = var.value_in(slf.as_any(), "minimize")?;
        let this = slf.borrow();
        let name = this.0.parameter_name(value).map(str::to_owned);
        name.ok_or_else(|| {
            KilnError::new_err(format!(
                "minimize: {} is not a parameter of the program (only parameters are trained)",
                this.0.describe(value)
            ))
        })
    }

    /// `value` (a number or an array) as a constant of the dtype of `like` (a number fills
    /// `like`'s shape).
    fn constant_like(
        slf: &Bound<'_, PyProgram>,
        like: Value,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<Value> {
        let mut this = slf.borrow_mut();
        let ty = this.0.value_type(like).clone();
        if let Ok(number) = value.extract::<f64>() {
            let literal = kiln::ir::Literal::scalar(ty.dtype, number);
            return kiln_ok(this.0.constant(literal, ty).map_err(RuntimeError::from));
        }
        let array = from_py(value)?.cast(ty.dtype);
        kiln_ok((this.0.constant(array.to_literal(), array.ty())).map_err(RuntimeError::from))
    }

    fn var(slf: &Bound<'_, PyProgram>, value: Value) -> PyVar {
        PyVar {
            program: slf.clone().unbind(),
            value,
        }
    }

    /// Runs `f` on the program and wraps the value it adds.
    fn add(
        slf: &Bound<'_, PyProgram>,
        f: impl FnOnce(&mut Program) -> kiln::runtime::RuntimeResult<Value>,
    ) -> PyResult<PyVar> {
        let v = kiln_ok(f(&mut slf.borrow_mut().0))?;
        Ok(Self::var(slf, v))
    }
}

#[pymethods]
impl PyProgram {
    #[new]
    #[pyo3(signature = (seed = 0))]
    fn new(seed: u64) -> PyProgram {
        PyProgram(Program::with_seed(seed), None, 0)
    }

    /// The session `kiln.function` runs in when given none: made on first use, from the
    /// program as it is then, and shared by every such function of this program.
    fn default_session(slf: &Bound<'_, Self>) -> PyResult<Py<PySession>> {
        let py = slf.py();
        if let Some(s) = &slf.borrow().1 {
            return Ok(s.clone_ref(py));
        }
        let session = Py::new(py, PySession::new(slf)?)?;
        slf.borrow_mut().1 = Some(session.clone_ref(py));
        Ok(session)
    }

    /// A placeholder fed at each run; `None` in `shape` is a dimension of any size: in the
    /// first axis the batch size `N`, which every placeholder shares, elsewhere its own.
    fn placeholder(
        slf: &Bound<'_, Self>,
        name: &str,
        dtype_name: &str,
        shape: Vec<Option<usize>>,
    ) -> PyResult<PyVar> {
        let dims: Vec<Dim> = (shape.iter().enumerate())
            .map(|(i, d)| match (i, d) {
                (_, Some(n)) => Dim::Fixed(*n),
                (0, None) => Dim::sym("N"),
                (_, None) => Dim::sym(&format!("{name}_{i}")),
            })
            .collect();
        let dtype = dtype(dtype_name)?;
        Self::add(slf, |p| p.placeholder(name, dtype, dims))
    }

    /// A parameter `name` of `shape`, initialised by `init` (see `kiln.init`); with
    /// `trainable=False` state no optimizer updates (a buffer).
    #[pyo3(signature = (name, shape, init_spec, dtype_name = "float32", trainable = true))]
    fn parameter(
        slf: &Bound<'_, Self>,
        name: &str,
        shape: Vec<usize>,
        init_spec: &Bound<'_, PyAny>,
        dtype_name: &str,
        trainable: bool,
    ) -> PyResult<PyVar> {
        let (init, dtype) = (init(init_spec)?, dtype(dtype_name)?);
        Self::add(slf, |p| match trainable {
            true => p.parameter(name, dtype, &shape, init),
            false => p.buffer(name, dtype, &shape, init),
        })
    }

    /// A parameter `name` whose first value is the array `value` (its shape and dtype are
    /// the array's); with `trainable=False` state no optimizer updates.
    #[pyo3(signature = (name, value, trainable = true))]
    fn parameter_from(
        slf: &Bound<'_, Self>,
        name: &str,
        value: &Bound<'_, PyAny>,
        trainable: bool,
    ) -> PyResult<PyVar> {
        let value = from_py(value)?;
        Self::add(slf, |p| match trainable {
            true => p.parameter_from(name, &value),
            false => Ok(p.state_from(name, &value)?.1),
        })
    }

    /// The gradients of `loss` with respect to each of `wrt`, added to the program as values
    /// (TF's `gradients`): fetch them, or differentiate them again.
    fn gradients(
        slf: &Bound<'_, Self>,
        loss: &PyVar,
        wrt: Vec<PyRef<'_, PyVar>>,
    ) -> PyResult<Vec<PyVar>> {
        let loss = loss.value_in(slf.as_any(), "gradients")?;
        let wrt: Vec<Value> = (wrt.iter())
            .map(|w| w.value_in(slf.as_any(), "gradients"))
            .collect::<PyResult<_>>()?;
        let grads = kiln_ok(slf.borrow_mut().0.gradients(loss, &wrt))?;
        Ok(grads.into_iter().map(|g| Self::var(slf, g)).collect())
    }

    /// A dense layer `act(x @ w + b)` with parameters `<name>.w`, `<name>.b`.
    #[pyo3(signature = (name, x, units, activation_name = None))]
    fn dense(
        slf: &Bound<'_, Self>,
        name: &str,
        x: &PyVar,
        units: usize,
        activation_name: Option<&str>,
    ) -> PyResult<PyVar> {
        let act = activation(activation_name)?;
        let x = x.value_in(slf.as_any(), "dense")?;
        Self::add(slf, |p| layers::dense(p, name, x, units, act))
    }

    /// A loss or layer by name: `mse`, `softmax_cross_entropy`, `sigmoid_cross_entropy`,
    /// `accuracy` (two operands), `softmax`, `log_softmax`, `mean`, `flatten` (one).
    fn layer(slf: &Bound<'_, Self>, name: &str, args: Vec<PyRef<'_, PyVar>>) -> PyResult<PyVar> {
        let v: Vec<Value> = (args.iter())
            .map(|a| a.value_in(slf.as_any(), name))
            .collect::<PyResult<_>>()?;
        let wrong = || PyTypeError::new_err(format!("`{name}` takes other operands"));
        match (name, &v[..]) {
            ("mse", [a, b]) => Self::add(slf, |p| layers::mse(p, *a, *b)),
            ("softmax_cross_entropy", [a, b]) => {
                Self::add(slf, |p| layers::softmax_cross_entropy(p, *a, *b))
            }
            ("sigmoid_cross_entropy", [a, b]) => {
                Self::add(slf, |p| layers::sigmoid_cross_entropy(p, *a, *b))
            }
            ("accuracy", [a, b]) => Self::add(slf, |p| layers::accuracy(p, *a, *b)),
            ("mean", [a]) => Self::add(slf, |p| layers::mean(p, *a)),
            ("flatten", [a]) => Self::add(slf, |p| layers::flatten(p, *a)),
            ("softmax", [a]) => {
                let axis = last_axis(slf, *a);
                Self::add(slf, |p| layers::softmax(p, *a, axis))
            }
            ("log_softmax", [a]) => {
                let axis = last_axis(slf, *a);
                Self::add(slf, |p| layers::log_softmax(p, *a, axis))
            }
            _ => Err(wrong()),
        }
    }

    /// Adds `loss`'s gradients and an optimizer's updates (of `params` — parameters' names
    /// or their `Var`s —, or all); returns the target that applies them.
    #[pyo3(signature = (kind, lr, loss, params = None, name = None, **options))]
    fn minimize(
        slf: &Bound<'_, Self>,
        kind: &str,
        lr: f64,
        loss: &PyVar,
        params: Option<Vec<Bound<'_, PyAny>>>,
        name: Option<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyTarget> {
        let loss = loss.value_in(slf.as_any(), "minimize")?;
        let params = params
            .map(|list| {
                list.iter()
                    .map(|q| Self::parameter_named(slf, q))
                    .collect::<PyResult<Vec<String>>>()
            })
            .transpose()?;
        let mut this = slf.borrow_mut();
        // An optimizer's target and state are named after it: a second one on the program
        // gets the next free name (`sgd_1`), and a name given that is taken is refused here,
        // before anything is added.
        let taken = |n: &str| {
            let prefix = format!("{n}.");
            this.0.target(&format!("{n}.minimize")).is_some()
                || (this.0.module().states.iter()).any(|s| s.name.starts_with(&prefix))
        };
        let name = match name {
            Some(n) if taken(&n) => {
                return Err(KilnError::new_err(format!(
                    "minimize: an optimizer named `{n}` already updates this program; give \
                     this one another name (name=\"{n}_2\")"
                )));
            }
            Some(n) => n,
            None => (std::iter::once(kind.to_owned()))
                .chain((1..).map(|i| format!("{kind}_{i}")))
                .find(|n| !taken(n))
                .expect("a free name"),
        };
        let mut rule = rule(kind, Some(&name), lr, options)?;
        let names =
            params.unwrap_or_else(|| this.0.params().iter().map(|q| q.name.clone()).collect());
        let target = kiln_ok(rule.minimize_params(&mut this.0, loss, &names))?;
        Ok(PyTarget {
            program: slf.clone().unbind(),
            target,
            name: this.0.target_name(target).to_owned(),
        })
    }

    /// The layer `kind` named `name` applied to `x`, with `options`: `conv2d`
    /// (`out_channels`, `kernel_size`, `stride`, `padding`, `dilation`, `groups`,
    /// `activation`), `max_pool2d` and `avg_pool2d` (`kernel_size`, `stride`, `padding`),
    /// `global_avg_pool`, `layer_norm` (`eps`), `lstm` and `gru` (`hidden_size`; every step's
    /// state and the last), `self_attention` (`dim`), `embedding` (`num_embeddings`,
    /// `embedding_dim`; `x` the integer indices). Returns its values.
    #[pyo3(signature = (kind, name, x, **options))]
    fn static_layer(
        slf: &Bound<'_, Self>,
        kind: &str,
        name: &str,
        x: &PyVar,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<PyVar>> {
        let o = Options {
            kind,
            dict: options,
        };
        let layer_kind = layer_kind(kind, LayerForm::Static)?;
        let x = x.value_in(slf.as_any(), kind)?;
        let width = |p: &Program| {
            p.value_type(x)
                .shape
                .dims()
                .last()
                .and_then(|d| d.as_fixed())
        };
        let fixed_width = |p: &Program| {
            width(p).ok_or_else(|| {
                KilnError::new_err(format!(
                    "{kind}: the input's last axis must have a fixed size"
                ))
            })
        };
        let values: Vec<Value> = {
            let mut this = slf.borrow_mut();
            let p = &mut this.0;
            match layer_kind {
                LayerKind::Conv2d => {
                    let act = activation(
                        o.value("activation")?
                            .map(|a| a.extract::<String>())
                            .transpose()?
                            .as_deref(),
                    )?;
                    let (out, kernel, attrs) = (
                        o.size("out_channels")?,
                        o.pair("kernel_size", [3, 3])?,
                        o.conv2d()?,
                    );
                    vec![kiln_ok(layers::conv2d(
                        p, name, x, out, kernel, attrs, act,
                    ))?]
                }
                LayerKind::MaxPool2d => vec![kiln_ok(layers::max_pool2d(p, x, o.pool2d()?))?],
                LayerKind::AvgPool2d => vec![kiln_ok(layers::avg_pool2d(p, x, o.pool2d()?))?],
                LayerKind::GlobalAvgPool => vec![kiln_ok(layers::global_avg_pool(p, x))?],
                LayerKind::LayerNorm => vec![kiln_ok(layers::layer_norm(
                    p,
                    name,
                    x,
                    o.float("eps", 1e-5)?,
                ))?],
                LayerKind::Lstm | LayerKind::Gru => {
                    let (d, h) = (fixed_width(p)?, o.size("hidden_size")?);
                    let (sequence, last) = if layer_kind == LayerKind::Lstm {
                        let layer = kiln_ok(layers::Lstm::new(p, name, d, h))?;
                        kiln_ok(layer.apply(p, x))?
                    } else {
                        let layer = kiln_ok(layers::Gru::new(p, name, d, h))?;
                        kiln_ok(layer.apply(p, x))?
                    };
                    vec![sequence, last]
                }
                LayerKind::SelfAttention => {
                    let layer = kiln_ok(layers::SelfAttention::new(
                        p,
                        name,
                        fixed_width(p)?,
                        o.size("dim")?,
                    ))?;
                    vec![kiln_ok(layer.apply(p, x))?]
                }
                LayerKind::Embedding => {
                    let shape = [o.size("num_embeddings")?, o.size("embedding_dim")?];
                    let table = kiln_ok(p.parameter(
                        &format!("{name}.w"),
                        kiln::ir::DType::F32,
                        &shape,
                        Init::Normal {
                            mean: 0.0,
                            std: 1.0,
                        },
                    ))?;
                    vec![kiln_ok(p.gather(table, x, 0))?]
                }
                LayerKind::Flatten
                | LayerKind::BatchNorm
                | LayerKind::MultiHeadAttention
                | LayerKind::TransformerEncoderLayer
                | LayerKind::Dropout
                | LayerKind::Gpt
                | LayerKind::Gelu => {
                    return Err(layer_kind_error(layer_kind.no_form(LayerForm::Static)));
                }
            }
        };
        Ok(values.into_iter().map(|v| Self::var(slf, v)).collect())
    }

    /// Batch normalisation named `name` over `channels`: parameters `<name>.gamma`,
    /// `<name>.beta` and the running statistics, shared by its training and evaluation
    /// forms.
    #[pyo3(signature = (name, channels, momentum = 0.1, eps = 1e-5))]
    fn batch_norm(
        slf: &Bound<'_, Self>,
        name: &str,
        channels: usize,
        momentum: f64,
        eps: f64,
    ) -> PyResult<PyBatchNorm> {
        check_batch_norm(momentum, eps)?;
        let mut layer = kiln_ok(layers::BatchNorm::new(
            &mut slf.borrow_mut().0,
            name,
            channels,
        ))?;
        (layer.momentum, layer.eps) = (momentum, eps);
        Ok(PyBatchNorm {
            program: slf.clone().unbind(),
            layer,
        })
    }

    /// A target that stores each pair's new value into the state the pair's first value
    /// loads (a parameter, a buffer, a running statistic): TF's `assign`, Keras's `updates`.
    /// A new value is a `Var`, or a number or array made a constant of the state's dtype.
    fn assign(
        slf: &Bound<'_, Self>,
        pairs: Vec<(PyRef<'_, PyVar>, Bound<'_, PyAny>)>,
    ) -> PyResult<PyTarget> {
        let mut values = Vec::new();
        for (var, new) in &pairs {
            let var = var.value_in(slf.as_any(), "assign")?;
            let new = match new.extract::<PyRef<'_, PyVar>>() {
                Ok(v) => v.value_in(slf.as_any(), "assign")?,
                Err(_) => Self::constant_like(slf, var, new)?,
            };
            values.push((var, new));
        }
        let mut this = slf.borrow_mut();
        let target = kiln_ok(this.0.assign(&values))?;
        Ok(PyTarget {
            program: slf.clone().unbind(),
            target,
            name: this.0.target_name(target).to_owned(),
        })
    }

    /// The names of the trainable parameters, in order.
    fn parameter_names(&self) -> Vec<String> {
        self.0.params().iter().map(|q| q.name.clone()).collect()
    }

    /// The whole graph as text IR.
    fn ir(&self) -> String {
        self.0.graph().to_string()
    }

    /// Saves the function computing `outputs` (named `name`) with the program's state
    /// declarations as a text IR file, for `kiln.load_predictor` or `kiln run`.
    #[pyo3(signature = (path, outputs, name = "predict"))]
    fn save(
        slf: &Bound<'_, Self>,
        path: std::path::PathBuf,
        outputs: Vec<PyRef<'_, PyVar>>,
        name: &str,
    ) -> PyResult<()> {
        let values: Vec<Value> = (outputs.iter())
            .map(|v| v.value_in(slf.as_any(), "save"))
            .collect::<PyResult<_>>()?;
        let module = kiln_ok(slf.borrow().0.export_module(&[(name, &values[..])]))?;
        kiln_ok(kiln::runtime::checkpoint::save_module(&module, &path))
    }
}

/// The last axis of `v` (softmax's axis).
fn last_axis(program: &Bound<'_, PyProgram>, v: Value) -> usize {
    let rank = program.borrow().0.value_type(v).shape.dims().len();
    rank.saturating_sub(1)
}

#[pymethods]
impl PyVar {
    /// The value's name in the program, if it has one (placeholders do).
    #[getter]
    fn name(&self, py: Python<'_>) -> Option<String> {
        let p = self.program.borrow(py);
        p.0.graph().value_name(self.value).map(str::to_owned)
    }

    /// The program the value belongs to.
    #[getter]
    fn program(&self, py: Python<'_>) -> Py<PyProgram> {
        self.program.clone_ref(py)
    }

    /// The size of each axis (`None` for a dimension of any size).
    #[getter]
    fn shape(&self, py: Python<'_>) -> Vec<Option<usize>> {
        let p = self.program.borrow(py);
        let ty = p.0.value_type(self.value);
        ty.shape.dims().iter().map(|d| d.as_fixed()).collect()
    }

    /// Names the value (fetch it by this name).
    fn set_name(&self, py: Python<'_>, name: &str) -> PyVar {
        let mut program = self.program.borrow_mut(py);
        program.0.set_name(self.value, name);
        program.2 += 1;
        drop(program);
        self.clone()
    }

    fn _unary(&self, py: Python<'_>, name: &str) -> PyResult<PyVar> {
        let op = UnaryOp::from_name(name)
            .ok_or_else(|| PyTypeError::new_err(format!("no elementwise op `{name}`")))?;
        self.op(py, |p, x| Ok(p.unary(op, x)?))
    }

    #[pyo3(signature = (name, other, reverse = false))]
    fn _binary(
        &self,
        py: Python<'_>,
        name: &str,
        other: &Bound<'_, PyAny>,
        reverse: bool,
    ) -> PyResult<PyVar> {
        let op = BinaryOp::from_name(name)
            .ok_or_else(|| PyTypeError::new_err(format!("no binary op `{name}`")))?;
        let other = match other.extract::<PyRef<'_, PyVar>>() {
            Ok(v) => Operand::Var(v.value_in(self.program.bind(py).as_any(), name)?),
            Err(_) => Operand::Number(other.extract::<f64>()?),
        };
        self.op(py, |p, x| {
            let dtype = p.value_type(x).dtype;
            let y = match other {
                Operand::Var(v) => v,
                Operand::Number(c) => p.scalar(dtype, c)?,
            };
            let (a, b) = if reverse { (y, x) } else { (x, y) };
            Ok(p.binary(op, a, b)?)
        })
    }

    /// The matrix product `self @ other`, added to the program. Raises `ShapeError` naming
    /// both shapes when the contracted dimensions differ.
    fn matmul(&self, py: Python<'_>, other: &PyVar) -> PyResult<PyVar> {
        let y = other.value_in(self.program.bind(py).as_any(), "matmul")?;
        self.op(py, |p, x| Ok(p.matmul(x, y)?))
    }

    /// The sum over `axis` (a list; every axis by default), added to the program; `keepdims`
    /// keeps the summed axes as size 1.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn sum(&self, py: Python<'_>, axis: Option<Vec<usize>>, keepdims: bool) -> PyResult<PyVar> {
        self.reduce(py, ReduceOp::Sum, axis, keepdims)
    }

    /// The mean over `axis` (a list; every axis by default), added to the program;
    /// `keepdims` keeps the reduced axes as size 1.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn mean(&self, py: Python<'_>, axis: Option<Vec<usize>>, keepdims: bool) -> PyResult<PyVar> {
        self.reduce(py, ReduceOp::Mean, axis, keepdims)
    }
}

enum Operand {
    Var(Value),
    Number(f64),
}

impl PyVar {
    fn op(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Program, Value) -> kiln::runtime::RuntimeResult<Value>,
    ) -> PyResult<PyVar> {
        let v = kiln_ok(f(&mut self.program.borrow_mut(py).0, self.value))?;
        Ok(PyVar {
            program: self.program.clone_ref(py),
            value: v,
        })
    }

    fn reduce(
        &self,
        py: Python<'_>,
        op: ReduceOp,
        axis: Option<Vec<usize>>,
        keepdims: bool,
    ) -> PyResult<PyVar> {
        self.op(py, |p, x| {
            let axes = axis.unwrap_or_else(|| (0..p.value_type(x).shape.dims().len()).collect());
            Ok(p.reduce(op, x, axes, keepdims)?)
        })
    }
}

/// A fetch from Python (a `Var`, a `Target`, or a name), checked to belong to `program`.
fn fetch_in(item: &Bound<'_, PyAny>, program: &Bound<'_, PyAny>) -> PyResult<Fetch> {
    if let Ok(v) = item.extract::<PyRef<'_, PyVar>>() {
        return Ok(Fetch::Value(v.value_in(program, "fetch")?));
    }
    if let Ok(t) = item.extract::<PyRef<'_, PyTarget>>() {
        return Ok(Fetch::Target(t.target_in(program, "fetch")?));
    }
    let name: String = item.extract().map_err(|_| {
        PyTypeError::new_err("a fetch is a Var, a Target (from minimize) or a name")
    })?;
    Ok(Fetch::Name(name))
}

/// What a feed's key gives a value to: a name, or any `Var` of the program.
fn feed_key(key: &Bound<'_, PyAny>, program: &Bound<'_, PyProgram>) -> PyResult<Feed> {
    if let Ok(v) = key.extract::<PyRef<'_, PyVar>>() {
        return Ok(Feed::Value(v.value_in(program.as_any(), "feed")?));
    }
    let name: String = key
        .extract()
        .map_err(|_| PyTypeError::new_err("a feed's key is a name or a Var of the program"))?;
    Ok(Feed::Name(name))
}

/// A program, the scope its parameters live in, and compiled runs.
#[pyclass(name = "Session", module = "kiln")]
pub(crate) struct PySession {
    session: Session,
    program: Py<PyProgram>,
    /// The program's size (instructions, state) when `session` last took it.
    seen: (usize, usize, usize),
}

/// How far a program has grown: its instructions, its state declarations, its namings.
fn size_of(program: &PyProgram) -> (usize, usize, usize) {
    let p = &program.0;
    (p.graph().num_insts(), p.module().states.len(), program.2)
}

/// Waits until no other thread's run holds `session`: a run releases the GIL while it
/// computes, holding the session, so another thread (a run, a function, a trainer) may find
/// it in use — it takes its turn instead of failing (pyo3 raised "Already borrowed").
pub(crate) fn session_mut<'py>(session: &Bound<'py, PySession>) -> PyRefMut<'py, PySession> {
    in_turn(session.py(), || session.try_borrow_mut())
}

/// [`session_mut`] for reading.
pub(crate) fn session_ref<'py>(session: &Bound<'py, PySession>) -> PyRef<'py, PySession> {
    in_turn(session.py(), || session.try_borrow())
}

/// `take()` once it succeeds, the GIL released between tries so the holder can finish.
fn in_turn<T, E>(py: Python<'_>, mut take: impl FnMut() -> Result<T, E>) -> T {
    loop {
        if let Ok(x) = take() {
            return x;
        }
        py.detach(|| std::thread::sleep(std::time::Duration::from_micros(50)));
    }
}

impl PySession {
    /// Every state value, for a trainer's checkpoint.
    pub(crate) fn state_values(&self) -> std::collections::BTreeMap<String, Array> {
        let scope = self.session.scope();
        scope
            .iter()
            .map(|(n, a)| (n.to_owned(), a.clone()))
            .collect()
    }

    /// Sets state values of their declared types (a trainer's resume).
    pub(crate) fn set_states(
        &mut self,
        values: std::collections::BTreeMap<String, Array>,
    ) -> kiln::runtime::RuntimeResult<()> {
        for (name, value) in values {
            self.session.scope_mut().set(&name, value)?;
        }
        Ok(())
    }

    /// Takes up what was added to the program since the session last looked (values,
    /// targets, parameters): the session is rebuilt over its own state, so values it holds
    /// stay, and new parameters start from their initializers.
    fn catch_up(&mut self, py: Python<'_>) -> PyResult<()> {
        let program = self.program.borrow(py);
        let now = size_of(&program);
        if now == self.seen {
            return Ok(());
        }
        let scope = std::mem::take(self.session.scope_mut());
        let backend = self.session.backend();
        self.session = kiln_ok(Session::with_scope(&program.0, scope))?.with_backend(backend);
        self.seen = now;
        Ok(())
    }
}

#[pymethods]
impl PySession {
    #[new]
    fn new(program: &Bound<'_, PyProgram>) -> PyResult<PySession> {
        let p = program.borrow();
        Ok(PySession {
            session: kiln_ok(Session::new(&p.0))?,
            seen: size_of(&p),
            program: program.clone().unbind(),
        })
    }

    /// Runs what `fetches` need with `feed` (placeholder name → array); returns one numpy
    /// array per fetched value, `None` for a target. The GIL is released while it runs.
    #[pyo3(signature = (fetches, feed = None))]
    fn run(
        slf: &Bound<'_, Self>,
        py: Python<'_>,
        fetches: &Bound<'_, PyAny>,
        feed: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let single = !fetches.is_instance_of::<pyo3::types::PyList>()
            && !fetches.is_instance_of::<pyo3::types::PyTuple>();
        let items: Vec<Bound<'_, PyAny>> = if single {
            vec![fetches.clone()]
        } else {
            fetches.extract()?
        };
        let mut this = session_mut(slf);
        let program = this.program.clone_ref(py);
        let fetches: Vec<Fetch> = (items.iter())
            .map(|item| fetch_in(item, program.bind(py).as_any()))
            .collect::<PyResult<_>>()?;
        this.catch_up(py)?;
        let mut feeds: Vec<(Feed, Array)> = Vec::new();
        if let Some(feed) = feed {
            for (k, v) in feed.iter() {
                feeds.push((feed_key(&k, program.bind(py))?, from_py(&v)?));
            }
        }
        let fetches_for_run = fetches.clone();
        let session = &mut this.session;
        let result = py.detach(move || session.run_with_feeds(&fetches_for_run, &feeds));
        let mut values = kiln_ok(result)?.into_iter();
        let out: Vec<Py<PyAny>> = fetches
            .iter()
            .map(|f| match f {
                Fetch::Target(_) => py.None(),
                _ => values.next().map_or_else(|| py.None(), |a| to_py(py, a)),
            })
            .collect();
        if single {
            return Ok(out.into_iter().next().unwrap_or_else(|| py.None()));
        }
        Ok(pyo3::types::PyList::new(py, out)?.into_any().unbind())
    }

    /// The value of state `name` (a parameter, an optimizer moment).
    fn state(slf: &Bound<'_, Self>, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let value = session_ref(slf)
            .session
            .scope()
            .get(name)
            .cloned()
            .ok_or_else(|| KilnError::new_err(format!("the session has no state `{name}`")))?;
        Ok(to_py(py, value))
    }

    /// Saves every state value as a safetensors checkpoint (atomically).
    fn save(slf: &Bound<'_, Self>, path: std::path::PathBuf) -> PyResult<()> {
        kiln_ok(session_ref(slf).session.scope().save(&path))
    }

    /// Loads state values from a checkpoint; nothing changes on error.
    fn load(slf: &Bound<'_, Self>, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let mut this = session_mut(slf);
        this.catch_up(py)?;
        kiln_ok(this.session.scope_mut().load(&path))
    }
}

/// `kiln.function(session, inputs, outputs, updates)`: call it with arrays.
#[pyclass(name = "Function", module = "kiln")]
pub(crate) struct PyFunction {
    session: Py<PySession>,
    function: KerasFunction,
}

#[pymethods]
impl PyFunction {
    #[new]
    #[pyo3(signature = (session, inputs, outputs, updates = Vec::new()))]
    fn new(
        session: Py<PySession>,
        inputs: Vec<PyRef<'_, PyVar>>,
        outputs: Vec<PyRef<'_, PyVar>>,
        updates: Vec<PyRef<'_, PyTarget>>,
        py: Python<'_>,
    ) -> PyResult<PyFunction> {
        let program = session_ref(session.bind(py)).program.clone_ref(py);
        let program = program.bind(py).as_any();
        let values = |vars: &[PyRef<'_, PyVar>]| -> PyResult<Vec<Value>> {
            vars.iter()
                .map(|v| v.value_in(program, "function"))
                .collect()
        };
        let (inputs, outputs) = (values(&inputs)?, values(&outputs)?);
        let updates: Vec<Target> = (updates.iter())
            .map(|t| t.target_in(program, "function"))
            .collect::<PyResult<_>>()?;
        let function = {
            let mut s = session_mut(session.bind(py));
            s.catch_up(py)?;
            kiln_ok(s.session.function(&inputs, &outputs, &updates))?
        };
        Ok(PyFunction { session, function })
    }

    #[pyo3(signature = (*args))]
    fn __call__(&self, py: Python<'_>, args: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<Py<PyAny>>> {
        let arrays: Vec<Array> = args.iter().map(from_py).collect::<PyResult<_>>()?;
        let mut session = session_mut(self.session.bind(py));
        session.catch_up(py)?;
        let out = kiln_ok(self.function.call(&mut session.session, &arrays))?;
        Ok(out.into_iter().map(|a| to_py(py, a)).collect())
    }
}

/// A saved program and checkpoint (or an imported ONNX model) as a callable.
#[pyclass(name = "Predictor", module = "kiln")]
pub(crate) struct PyPredictor(kiln::serve::Predictor, Names);

/// The model's names for the inputs and outputs (an ONNX graph's; a program's arguments).
#[derive(Default)]
struct Names {
    inputs: Vec<String>,
    outputs: Vec<String>,
}

#[pymethods]
impl PyPredictor {
    /// The inputs' names, in the order the predictor takes them.
    #[getter]
    fn inputs(&self) -> Vec<String> {
        self.1.inputs.clone()
    }

    /// The outputs' names, in the order the predictor returns them.
    #[getter]
    fn outputs(&self) -> Vec<String> {
        self.1.outputs.clone()
    }

    #[pyo3(signature = (*args))]
    fn __call__(
        &mut self,
        py: Python<'_>,
        args: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let arrays: Vec<Array> = args.iter().map(from_py).collect::<PyResult<_>>()?;
        let out = self
            .0
            .predict(arrays)
            .map_err(|e| KilnError::new_err(e.to_string()))?;
        Ok(out.into_iter().map(|a| to_py(py, a)).collect())
    }
}

/// Loads a saved program (text IR) and its parameters (safetensors) as a predictor.
#[pyfunction]
fn load_predictor(
    program: std::path::PathBuf,
    parameters: std::path::PathBuf,
) -> PyResult<PyPredictor> {
    let predictor = kiln::serve::Predictor::load(&program, &parameters)
        .map_err(|e| KilnError::new_err(e.to_string()))?;
    let f = predictor.function();
    let names = Names {
        inputs: (f.args().iter().enumerate())
            .map(|(i, &a)| {
                f.value_name(a)
                    .map_or_else(|| format!("arg{i}"), str::to_owned)
            })
            .collect(),
        outputs: Vec::new(),
    };
    Ok(PyPredictor(predictor, names))
}

/// Imports an ONNX model and compiles it as a predictor.
#[pyfunction]
fn load_onnx(path: std::path::PathBuf) -> PyResult<PyPredictor> {
    let model = kiln::onnx::import(&path)
        .map_err(|e| KilnError::new_err(format!("{}: {e}", path.display())))?;
    let state = model.state();
    let function = model.function_name().to_owned();
    let names = Names {
        inputs: model.inputs,
        outputs: model.outputs,
    };
    let predictor = kiln::serve::Predictor::compile(model.module, &function, state)
        .map_err(|e| KilnError::new_err(e.to_string()))?;
    Ok(PyPredictor(predictor, names))
}
