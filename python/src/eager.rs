//! Eager tensors, parameters, eager optimizers, PyLayers (custom ops whose forward and
//! backward are Python functions over numpy arrays) and `to_static`.

use crate::array::{dtype, dtype_name, from_py, to_py};
use crate::errors::{KilnError, ShapeError, composite_error, kiln_ok};
use crate::options::{Options, check_batch_norm};
use kiln::backend::{Array, CustomOpError};
use kiln::ir::{BinaryOp, CompareOp, DType, Dim, ReduceOp, Shape, Type, UnaryOp};
use kiln::runtime::eager::custom::{self, CustomOp};
use kiln::runtime::eager::nn::{self, Layer, Parameter};
use kiln::runtime::eager::{self, EagerOptimizer, Gpt, Index, NoGradGuard, StaticFunction, Tensor};
use kiln::runtime::{
    Init, LayerForm, LayerKind, LayerKindError, Optimizer, OptimizerError, OptimizerOptions,
    OptionValue, Target,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::sync::Arc;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTensor>()?;
    m.add_class::<PyParameter>()?;
    m.add_class::<PyNoGrad>()?;
    m.add_class::<PyEagerOptimizer>()?;
    m.add_class::<PyStaticFunction>()?;
    m.add_class::<PyNativeLayer>()?;
    m.add_function(wrap_pyfunction!(tensor, m)?)?;
    m.add_function(wrap_pyfunction!(parameter, m)?)?;
    m.add_function(wrap_pyfunction!(unary_ops, m)?)?;
    m.add_function(wrap_pyfunction!(register_pylayer, m)?)?;
    m.add_function(wrap_pyfunction!(apply_pylayer, m)?)?;
    m.add_function(wrap_pyfunction!(to_static, m)?)?;
    m.add_function(wrap_pyfunction!(diff, m)?)?;
    m.add_function(wrap_pyfunction!(loss, m)?)?;
    m.add_function(wrap_pyfunction!(check_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(cond, m)?)?;
    m.add_function(wrap_pyfunction!(functional, m)?)?;
    m.add_function(wrap_pyfunction!(layer_kinds, m)?)?;
    m.add_function(wrap_pyfunction!(recurrent, m)?)?;
    m.add_function(wrap_pyfunction!(cat, m)?)?;
    m.add_function(wrap_pyfunction!(stack, m)?)?;
    m.add_function(wrap_pyfunction!(manual_seed, m)?)?;
    m.add_function(wrap_pyfunction!(set_flush_denormal, m)?)?;
    m.add_function(wrap_pyfunction!(reset, m)?)?;
    m.add_function(wrap_pyfunction!(save_parameters, m)?)?;
    m.add_function(wrap_pyfunction!(load_parameters, m)?)?;
    Ok(())
}

/// An eager tensor: computed at once, recorded for `backward()` when gradients flow.
#[pyclass(name = "Tensor", module = "kiln")]
#[derive(Clone)]
pub(crate) struct PyTensor(pub(crate) Tensor);

/// A tensor argument: a `Tensor`, or a `Parameter` — its current value, recorded for
/// gradients — since a parameter is a tensor, as in PyTorch (`x @ self.weight`).
pub(crate) struct TensorArg(pub(crate) Tensor);

impl<'a, 'py> FromPyObject<'a, 'py> for TensorArg {
    type Error = PyErr;

    fn extract(obj: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<TensorArg> {
        if let Ok(t) = obj.extract::<PyRef<'_, PyTensor>>() {
            return Ok(TensorArg(t.0.clone()));
        }
        if let Ok(p) = obj.extract::<PyRef<'_, PyParameter>>() {
            return py_eager(p.0.tensor()).map(TensorArg);
        }
        Err(PyTypeError::new_err(format!(
            "expected a kiln.Tensor, found {}",
            obj.get_type().name()?
        )))
    }
}

/// A tensor or a Python number, as an operand.
fn operand(t: &PyTensor, other: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    if let Ok(o) = other.extract::<TensorArg>() {
        return Ok(o.0);
    }
    if let Ok(v) = other.extract::<f64>() {
        return Ok(Tensor::new(scalar(t.0.dtype(), v)));
    }
    Ok(Tensor::new(from_py(other)?))
}

/// `v` as a rank-0 array of `dtype`.
fn scalar(dtype: DType, v: f64) -> Array {
    Array::F64(ndarray::arr0(v).into_dyn()).cast(dtype)
}

fn axes(t: &Tensor, selection: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<usize>> {
    match selection {
        Some(a) if !a.is_none() => match a.extract::<i64>() {
            Ok(a) => Ok(vec![axis_of(t, a)?]),
            Err(_) => (a.extract::<Vec<i64>>()?.into_iter())
                .map(|a| axis_of(t, a))
                .collect(),
        },
        _ => Ok((0..t.rank()).collect()),
    }
}

impl PyTensor {
    /// The elements where `mask` is true: a mask of the tensor's shape gives them in order (a
    /// 1-D result); a mask of its first axis gives those rows.
    fn masked(&self, mask: &Array) -> PyResult<PyTensor> {
        py_eager(self.0.masked(mask)).map(PyTensor)
    }

    fn extremum(
        &self,
        py: Python<'_>,
        op: ReduceOp,
        dim: Option<i64>,
        keepdim: bool,
    ) -> PyResult<Py<PyAny>> {
        let Some(dim) = dim else {
            let all: Vec<usize> = (0..self.0.rank()).collect();
            let value = py_eager(self.0.reduce(op, &all, false))?;
            return Ok(Py::new(py, PyTensor(value))?.into_any());
        };
        let axis = axis_of(&self.0, dim)?;
        let values = py_eager(self.0.reduce(op, &[axis], keepdim))?;
        let ranked = match op {
            ReduceOp::Max => self.0.clone(),
            _ => py_eager(self.0.unary(UnaryOp::Neg))?,
        };
        let mut indices = py_eager(ranked.argmax(axis))?;
        if keepdim {
            indices = py_eager(indices.reshape(values.ty().shape.clone()))?;
        }
        let pair = (
            Py::new(py, PyTensor(values))?,
            Py::new(py, PyTensor(indices))?,
        );
        Ok(pair.into_pyobject(py)?.into_any().unbind())
    }
}

/// A boolean mask (a numpy bool array, a bool tensor, or a list of bools), if `key` is one.
fn bool_mask(key: &Bound<'_, PyAny>) -> PyResult<Option<Array>> {
    if let Ok(t) = key.extract::<PyRef<'_, PyTensor>>() {
        if t.0.dtype() != DType::Bool {
            return Ok(None);
        }
        return py_eager(t.0.to_array()).map(Some);
    }
    let is_array = key.hasattr("dtype")? || key.is_instance_of::<PyList>();
    if !is_array || key.is_instance_of::<pyo3::types::PyBool>() {
        return Ok(None);
    }
    match from_py(key) {
        Ok(a @ Array::Bool(_)) => Ok(Some(a)),
        _ => Ok(None),
    }
}

/// A Python index item as Kiln's: `None`, `...`, a slice, an int, or an integer array or
/// tensor.
fn index_item(item: &Bound<'_, PyAny>) -> PyResult<Index> {
    if item.is_none() {
        return Ok(Index::NewAxis);
    }
    if item.is(item.py().Ellipsis()) {
        return Ok(Index::Ellipsis);
    }
    if let Ok(slice) = item.cast::<pyo3::types::PySlice>() {
        let bound = |name: &str| -> PyResult<Option<i64>> { slice.getattr(name)?.extract() };
        return Ok(Index::Range {
            start: bound("start")?,
            stop: bound("stop")?,
            step: bound("step")?,
        });
    }
    if let Ok(i) = item.extract::<i64>() {
        return Ok(Index::At(i));
    }
    match item.extract::<PyRef<'_, PyTensor>>() {
        Ok(t) => Ok(Index::Gather(t.0.clone())),
        Err(_) => Ok(Index::Gather(Tensor::new(from_py(item)?))),
    }
}

#[pymethods]
impl PyTensor {
    /// The elements as a numpy array.
    fn numpy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(to_py(py, py_eager(self.0.to_array())?))
    }

    /// The value of a one-element tensor.
    fn item(&self) -> PyResult<f64> {
        py_eager(self.0.item())
    }

    /// The size of each axis, a tuple (`None` for a traced symbolic one).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let dims: Vec<Option<usize>> = (self.0.ty().shape.dims().iter())
            .map(|d| d.as_fixed())
            .collect();
        PyTuple::new(py, dims)
    }

    /// The element type's name: `"float32"`, `"float64"`, `"int32"`, `"int64"` or `"bool"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.0.dtype())
    }

    /// Whether `backward()` computes this tensor's gradient.
    #[getter]
    fn requires_grad(&self) -> bool {
        self.0.tracks_grad()
    }

    /// Computes the gradients of this (scalar) tensor with respect to every tensor and
    /// parameter it depends on; read them with `.grad`.
    fn backward(&self) -> PyResult<()> {
        py_eager(self.0.backward())
    }

    /// The gradient `backward()` left, or `None`.
    #[getter]
    fn grad(&self) -> PyResult<Option<PyTensor>> {
        py_eager(self.0.check_thread())?;
        Ok(self.0.grad().map(PyTensor))
    }

    /// Forgets the gradient `backward()` left.
    fn zero_grad(&self) {
        self.0.zero_grad()
    }

    /// The same values, cut from the gradient tape.
    fn detach(&self) -> PyResult<PyTensor> {
        py_eager(self.0.detach()).map(PyTensor)
    }

    /// An elementwise op of the op table by name (`tanh`, `exp`, …).
    fn _unary(&self, name: &str) -> PyResult<PyTensor> {
        let op = UnaryOp::from_name(name)
            .ok_or_else(|| PyTypeError::new_err(format!("no elementwise op `{name}`")))?;
        py_eager(self.0.unary(op)).map(PyTensor)
    }

    /// A binary op by name (`add`, `sub`, `mul`, `div`, `pow`, `max`, `min`); `reverse`
    /// swaps the operands (`2 - x`).
    #[pyo3(signature = (name, other, reverse = false))]
    fn _binary(&self, name: &str, other: &Bound<'_, PyAny>, reverse: bool) -> PyResult<PyTensor> {
        let op = BinaryOp::from_name(name)
            .ok_or_else(|| PyTypeError::new_err(format!("no binary op `{name}`")))?;
        let other = operand(self, other)?;
        let result = if reverse {
            other.binary(op, &self.0)
        } else {
            self.0.binary(op, &other)
        };
        py_eager(result).map(PyTensor)
    }

    /// A comparison by name (`lt`, `le`, `gt`, `ge`, `eq`, `ne`).
    fn _compare(&self, name: &str, other: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let op = CompareOp::from_name(name)
            .ok_or_else(|| PyTypeError::new_err(format!("no comparison `{name}`")))?;
        py_eager(self.0.compare(op, &operand(self, other)?)).map(PyTensor)
    }

    /// The sum over `axis` (an int or a list; every axis by default), keeping the summed
    /// axes as size 1 with `keepdims`. Raises `ShapeError` for an axis out of range.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn sum(&self, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyTensor> {
        py_eager(self.0.sum(&axes(&self.0, axis)?, keepdims)).map(PyTensor)
    }

    /// The mean over `axis` (an int or a list; every axis by default), keeping the reduced
    /// axes as size 1 with `keepdims`. Raises `ShapeError` for an axis out of range.
    #[pyo3(signature = (axis = None, keepdims = false))]
    fn mean(&self, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyTensor> {
        py_eager(self.0.mean(&axes(&self.0, axis)?, keepdims)).map(PyTensor)
    }

    /// The matrix product `self @ other` (batch dimensions broadcast). Raises `ShapeError`
    /// naming both shapes when the contracted dimensions differ.
    fn matmul(&self, other: TensorArg) -> PyResult<PyTensor> {
        py_eager(self.0.matmul(&other.0)).map(PyTensor)
    }

    /// The same elements, row-major, in `shape`: sizes as arguments or one list (`reshape(2,
    /// -1)`, `reshape([2, -1])`). One size may be `-1`, inferred from the others; `None` keeps
    /// this tensor's size on that axis (a traced batch size: `x.reshape(x.shape[0], -1)`).
    /// Raises `ShapeError` when the element counts differ or `-1` cannot be inferred.
    #[pyo3(signature = (*shape))]
    fn reshape(&self, shape: &Bound<'_, PyTuple>) -> PyResult<PyTensor> {
        let sizes: Vec<Option<i64>> = match shape.len() {
            1 if !shape.get_item(0)?.is_none() && shape.get_item(0)?.extract::<i64>().is_err() => {
                shape.get_item(0)?.extract()?
            }
            _ => shape.extract()?,
        };
        let dims = reshape_dims(&self.0.ty().shape, &sizes)?;
        py_eager(self.0.reshape(Shape(dims))).map(PyTensor)
    }

    /// ``t[key]``: ints (negative from the end), slices (step 1 or more), ``...``, ``None``
    /// (a new axis of size 1), one integer list or array (or int tensor) gathering along its
    /// axis, or a boolean mask of the tensor's shape or of its first axis (eagerly only: the
    /// result's size depends on the values). Reads and differentiates, eagerly and traced;
    /// an index out of range is an ``IndexError``.
    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
        let items: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(tuple) => tuple.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        if let [only] = items.as_slice()
            && let Some(mask) = bool_mask(only)?
        {
            return self.masked(&mask);
        }
        let items: Vec<Index> = items.iter().map(index_item).collect::<PyResult<_>>()?;
        py_eager(self.0.index(&items)).map(PyTensor)
    }

    /// The largest element (over every axis), or, with ``dim``, ``(values, indices)`` along
    /// that axis (``keepdim`` keeps it as size 1), as PyTorch's ``max``.
    #[pyo3(signature = (dim = None, keepdim = false))]
    fn max(&self, py: Python<'_>, dim: Option<i64>, keepdim: bool) -> PyResult<Py<PyAny>> {
        self.extremum(py, ReduceOp::Max, dim, keepdim)
    }

    /// The smallest element, or, with ``dim``, ``(values, indices)`` along it (see ``max``).
    #[pyo3(signature = (dim = None, keepdim = false))]
    fn min(&self, py: Python<'_>, dim: Option<i64>, keepdim: bool) -> PyResult<Py<PyAny>> {
        self.extremum(py, ReduceOp::Min, dim, keepdim)
    }

    /// ``bool(t)``: the value of a one-element tensor. A tensor of several elements, or one
    /// traced by ``to_static`` (its value is not known until the compiled function runs),
    /// raises ``KilnError`` — for the second, branch with ``kiln.cond``.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        if self.0.is_traced() {
            let place = crate::errors::python_caller(py).ok().flatten();
            let at = place.map_or(String::new(), |p| format!(" at {p}"));
            return Err(KilnError::new_err(format!(
                "bool() of a tensor traced by to_static{at}: its value is not known until the \
                 compiled function runs. To branch on it, use kiln.cond(pred, true_fn, \
                 false_fn), or kiln.while_loop to loop, which trace into `cond` and `while` ops"
            )));
        }
        let array = py_eager(self.0.to_array())?;
        match array.len() {
            1 => Ok(array.to_f64_vec()[0] != 0.0),
            n => Err(KilnError::new_err(format!(
                "bool() of a tensor of {n} elements is ambiguous: reduce it first (`(t > 0).sum()`, \
                 say)"
            ))),
        }
    }

    /// The axes permuted: axis `i` of the result is axis `dims[i]` (negative counts from the
    /// end). Raises `ShapeError` for `dims` that are not a permutation of the axes.
    #[pyo3(signature = (*dims))]
    fn permute(&self, dims: Vec<i64>) -> PyResult<PyTensor> {
        let perm: Vec<usize> = (dims.iter())
            .map(|&d| axis_of(&self.0, d))
            .collect::<PyResult<_>>()?;
        py_eager(self.0.transpose(&perm)).map(PyTensor)
    }

    /// As PyTorch's: `transpose(dim0, dim1)` swaps two axes; with no arguments, the axes
    /// reversed (`t.T`). A permutation of every axis is `permute`'s.
    #[pyo3(signature = (*dims))]
    fn transpose(&self, dims: Vec<i64>) -> PyResult<PyTensor> {
        match dims[..] {
            [] => py_eager(self.0.t()).map(PyTensor),
            [a, b] => {
                let (a, b) = (axis_of(&self.0, a)?, axis_of(&self.0, b)?);
                let mut perm: Vec<usize> = (0..self.0.rank()).collect();
                perm.swap(a, b);
                py_eager(self.0.transpose(&perm)).map(PyTensor)
            }
            _ => Err(PyTypeError::new_err(format!(
                "transpose takes two axes to swap (or none, to reverse them all), given {}; \
                 permute(*dims) reorders every axis",
                dims.len()
            ))),
        }
    }

    /// The softmax along `axis` (the last by default).
    #[pyo3(signature = (axis = -1))]
    fn softmax(&self, axis: i64) -> PyResult<PyTensor> {
        let axis = axis_of(&self.0, axis)?;
        py_eager(self.0.softmax(axis)).map(PyTensor)
    }

    /// The log-softmax along `axis` (the last by default).
    #[pyo3(signature = (axis = -1))]
    fn log_softmax(&self, axis: i64) -> PyResult<PyTensor> {
        let axis = axis_of(&self.0, axis)?;
        py_eager(self.0.log_softmax(axis)).map(PyTensor)
    }

    /// The index of the largest element along `axis` (the last by default), as int64; the
    /// first on a tie.
    #[pyo3(signature = (axis = -1))]
    fn argmax(&self, axis: i64) -> PyResult<PyTensor> {
        let axis = axis_of(&self.0, axis)?;
        py_eager(self.0.argmax(axis)).map(PyTensor)
    }

    /// The values converted to `dtype_name` (`"float32"`, `"float64"`, `"int32"`, `"int64"`,
    /// `"bool"`). Raises `TypeError` for another name.
    fn astype(&self, dtype_name: &str) -> PyResult<PyTensor> {
        py_eager(self.0.cast(dtype(dtype_name)?)).map(PyTensor)
    }

    fn __repr__(&self) -> String {
        match self.0.to_array() {
            Ok(a) => format!("kiln.Tensor({a}, dtype={})", dtype_name(a.dtype())),
            Err(_) => format!("kiln.Tensor(<traced {}>)", self.0.ty()),
        }
    }
}

/// Axis `axis` of `t`, counted from the end when negative.
fn axis_of(t: &Tensor, axis: i64) -> PyResult<usize> {
    let rank = t.rank() as i64;
    let a = if axis < 0 { axis + rank } else { axis };
    usize::try_from(a)
        .ok()
        .filter(|&a| (a as i64) < rank.max(1))
        .ok_or_else(|| KilnError::new_err(format!("axis {axis} is out of range for rank {rank}")))
}

/// The dims of a reshape of a tensor of shape `from` to `sizes` (`None`: `from`'s dim on that
/// axis; `-1`: inferred, symbolic when what is left of `from` is one symbolic dim).
fn reshape_dims(from: &Shape, sizes: &[Option<i64>]) -> PyResult<Vec<Dim>> {
    let bad = |why: String| ShapeError::new_err(format!("reshape of {from} to {sizes:?}: {why}"));
    let mut dims: Vec<Option<Dim>> = Vec::with_capacity(sizes.len());
    for (i, size) in sizes.iter().enumerate() {
        dims.push(match *size {
            None => Some(from.dims().get(i).cloned().ok_or_else(|| {
                bad(format!(
                    "`None` at axis {i}, which the tensor does not have"
                ))
            })?),
            Some(-1) => None,
            Some(n) if n >= 0 => Some(Dim::Fixed(n as usize)),
            Some(n) => return Err(bad(format!("size {n}"))),
        });
    }
    let inferred = dims.iter().filter(|d| d.is_none()).count();
    if inferred > 1 {
        return Err(bad("only one size may be -1".into()));
    }
    if inferred == 1 {
        // What is left: the fixed part's quotient and the symbolic dims not given.
        let fixed = |ds: &mut dyn Iterator<Item = &Dim>| -> usize {
            ds.filter_map(Dim::as_fixed).product()
        };
        let given: Vec<&Dim> = dims.iter().flatten().collect();
        let (whole, part) = (
            fixed(&mut from.dims().iter()),
            fixed(&mut given.iter().copied()),
        );
        let mut symbols: Vec<&Dim> = from
            .dims()
            .iter()
            .filter(|d| d.as_fixed().is_none())
            .collect();
        for d in given.iter().filter(|d| d.as_fixed().is_none()) {
            match symbols.iter().position(|s| s == d) {
                Some(at) => {
                    symbols.remove(at);
                }
                None => return Err(bad(format!("{d} is not a size of the tensor"))),
            }
        }
        if part == 0 || whole % part != 0 {
            return Err(bad(format!("{whole} elements do not divide by {part}")));
        }
        let rest = whole / part;
        let left = match (symbols.as_slice(), rest) {
            ([], _) => Dim::Fixed(rest),
            ([symbol], 1) => (*symbol).clone(),
            _ => return Err(bad("-1 would be a product of sizes; give them".into())),
        };
        let at = dims
            .iter()
            .position(Option::is_none)
            .expect("one is inferred");
        dims[at] = Some(left);
    }
    Ok(dims
        .into_iter()
        .map(|d| d.expect("every size known"))
        .collect())
}

/// `kiln.cat(tensors, dim=0)`: the tensors joined along `dim`.
#[pyfunction]
#[pyo3(signature = (tensors, dim = 0))]
fn cat(tensors: Vec<TensorArg>, dim: i64) -> PyResult<PyTensor> {
    let first = tensors
        .first()
        .ok_or_else(|| PyValueError::new_err("cat of no tensors"))?;
    let axis = axis_of(&first.0, dim)?;
    let all: Vec<&Tensor> = tensors.iter().map(|t| &t.0).collect();
    py_eager(Tensor::concat(&all, axis)).map(PyTensor)
}

/// `kiln.stack(tensors, dim=0)`: the tensors (of one shape) along a new axis `dim`.
#[pyfunction]
#[pyo3(signature = (tensors, dim = 0))]
fn stack(tensors: Vec<TensorArg>, dim: i64) -> PyResult<PyTensor> {
    let first = tensors
        .first()
        .ok_or_else(|| PyValueError::new_err("stack of no tensors"))?;
    let rank = first.0.rank() as i64;
    let at = if dim < 0 { dim + rank + 1 } else { dim };
    if !(0..=rank).contains(&at) {
        return Err(KilnError::new_err(format!(
            "dim {dim} is out of range for stacking rank {rank}"
        )));
    }
    let lifted: Vec<Tensor> = (tensors.iter())
        .map(|t| {
            let mut dims = t.0.ty().shape.dims().to_vec();
            dims.insert(at as usize, Dim::Fixed(1));
            py_eager(t.0.reshape(Shape(dims)))
        })
        .collect::<PyResult<_>>()?;
    let all: Vec<&Tensor> = lifted.iter().collect();
    py_eager(Tensor::concat(&all, at as usize)).map(PyTensor)
}

/// A recurrent layer's step loop over `x` `[N, T, D]`: for `lstm` (`x, w_ih, w_hh, bias`)
/// every step's hidden state, the last hidden state and the last cell state; for `gru` (`x,
/// w_ih, w_hh, b_ih, b_hh`) every step's hidden state and the last one.
#[pyfunction]
fn recurrent(kind: &str, inputs: Vec<TensorArg>) -> PyResult<Vec<PyTensor>> {
    let t: Vec<&Tensor> = inputs.iter().map(|t| &t.0).collect();
    let out: Vec<Tensor> = match (layer_kind(kind, LayerForm::Eager)?, &t[..]) {
        (LayerKind::Lstm, [x, w_ih, w_hh, b]) => py_eager(nn::lstm(x, w_ih, w_hh, b))?.into(),
        (LayerKind::Gru, [x, w_ih, w_hh, b_ih, b_hh]) => {
            py_eager(nn::gru(x, [w_ih, w_hh], [b_ih, b_hh]))?.into()
        }
        _ => {
            return Err(PyTypeError::new_err(format!(
                "no recurrent layer `{kind}` of {} tensors",
                t.len()
            )));
        }
    };
    Ok(out.into_iter().map(PyTensor).collect())
}

/// `kiln.nn.functional`'s native half: the function `name` of `inputs` with `options`, each
/// the runtime's one composite or op (as the layers use them).
#[pyfunction]
#[pyo3(signature = (name, inputs, **options))]
fn functional(
    name: &str,
    inputs: Vec<TensorArg>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyTensor> {
    let o = Options {
        kind: name,
        dict: options,
    };
    let t: Vec<&Tensor> = inputs.iter().map(|t| &t.0).collect();
    let arity = |n: usize| -> PyResult<()> {
        (t.len() == n).then_some(()).ok_or_else(|| {
            PyTypeError::new_err(format!("`{name}` takes {n} tensors, given {}", t.len()))
        })
    };
    let kind = layer_kind(name, LayerForm::Functional)?;
    let result = match kind {
        LayerKind::Gelu => arity(1).map(|_| t[0].gelu())?,
        LayerKind::Flatten => arity(1).map(|_| t[0].flatten())?,
        LayerKind::MaxPool2d => arity(1).map(|_| o.pool2d().map(|a| t[0].max_pool2d(a)))??,
        LayerKind::AvgPool2d => arity(1).map(|_| o.pool2d().map(|a| t[0].avg_pool2d(a)))??,
        LayerKind::Embedding => arity(2).map(|_| t[1].gather(t[0], 0))?,
        LayerKind::Conv2d => {
            let attrs = o.conv2d()?;
            match t.as_slice() {
                [x, w] => x.conv2d(w, attrs),
                [x, w, b] => eager::compose(&[x, w, b], |bd, v| {
                    kiln::runtime::composite::conv2d_bias(bd, v[0], v[1], v[2], attrs)
                }),
                _ => {
                    return Err(PyTypeError::new_err(
                        "`conv2d` takes x, weight and a bias or none",
                    ));
                }
            }
        }
        LayerKind::LayerNorm => {
            arity(3)?;
            let eps = o.float("eps", 1e-5)?;
            eager::compose(&[t[0], t[1], t[2]], |b, v| {
                kiln::runtime::composite::layer_norm(b, v[0], v[1], v[2], eps)
            })
        }
        LayerKind::Dropout => {
            arity(1)?;
            let mut layer = nn::Dropout::new(o.float("p", 0.5)?, 0);
            layer.set_training(o.value("training")?.map_or(Ok(true), |v| v.extract())?);
            layer.forward(t[0])
        }
        LayerKind::GlobalAvgPool
        | LayerKind::BatchNorm
        | LayerKind::Lstm
        | LayerKind::Gru
        | LayerKind::SelfAttention
        | LayerKind::MultiHeadAttention
        | LayerKind::TransformerEncoderLayer
        | LayerKind::Gpt => {
            return Err(layer_kind_error(kind.no_form(LayerForm::Functional)));
        }
    };
    py_eager(result).map(PyTensor)
}

/// `kiln.cond(pred, true_fn, false_fn)`: calls one branch (each returns a tensor or a list of
/// tensors) — at once eagerly, and traced into a `cond` op, both branches, under `to_static`.
#[pyfunction]
fn cond(
    py: Python<'_>,
    pred: TensorArg,
    true_fn: Py<PyAny>,
    false_fn: Py<PyAny>,
) -> PyResult<Py<PyAny>> {
    let single = std::cell::Cell::new(false);
    let branch = |f: &Py<PyAny>| -> kiln::runtime::eager::EagerResult<Vec<Tensor>> {
        Python::attach(|py| {
            let out = f.call0(py).map_err(raised_in_branch)?;
            let out = out.bind(py);
            if let Ok(t) = out.extract::<TensorArg>() {
                single.set(true);
                return Ok(vec![t.0]);
            }
            let list: Vec<TensorArg> = out.extract().map_err(raised_in_branch)?;
            Ok(list.iter().map(|t| t.0.clone()).collect())
        })
    };
    let outs = py_eager(kiln::runtime::eager::cond(
        &pred.0,
        || branch(&true_fn),
        || branch(&false_fn),
    ))?;
    let mut tensors = outs.into_iter().map(PyTensor);
    if single.get() {
        let first = tensors.next().expect("a branch returned one tensor");
        return Ok(Py::new(py, first)?.into_any());
    }
    let items: Vec<Py<PyTensor>> = tensors.map(|t| Py::new(py, t)).collect::<PyResult<_>>()?;
    Ok(PyList::new(py, items)?.into_any().unbind())
}

/// A Python exception raised in a branch: kept, to be raised again as itself.
fn raised_in_branch(e: PyErr) -> kiln::runtime::eager::EagerError {
    crate::errors::stash(e);
    kiln::runtime::eager::EagerError::Usage("a branch of kiln.cond raised an exception".into())
}

pub(crate) fn py_eager<T>(r: kiln::runtime::eager::EagerResult<T>) -> PyResult<T> {
    kiln_ok(r)
}

/// `kiln.tensor(array, requires_grad=False)`.
#[pyfunction]
#[pyo3(signature = (data, requires_grad = false))]
fn tensor(data: &Bound<'_, PyAny>, requires_grad: bool) -> PyResult<PyTensor> {
    let t = Tensor::new(from_py(data)?);
    if requires_grad {
        return py_eager(t.requires_grad()).map(PyTensor);
    }
    Ok(PyTensor(t))
}

/// The names of the op table's elementwise ops, which become `Tensor` methods.
#[pyfunction]
fn unary_ops() -> Vec<&'static str> {
    UnaryOp::ALL.iter().map(|o| o.name()).collect()
}

/// A trainable parameter in this thread's scope.
#[pyclass(name = "Parameter", module = "kiln")]
#[derive(Clone)]
pub(crate) struct PyParameter(pub(crate) Parameter);

#[pymethods]
impl PyParameter {
    /// The parameter's name (`<layer>.<name>`).
    #[getter]
    fn name(&self) -> String {
        self.0.name().to_owned()
    }

    /// The parameter's value as a tensor (recorded for gradients).
    fn tensor(&self) -> PyResult<PyTensor> {
        py_eager(self.0.tensor()).map(PyTensor)
    }

    /// The value as a numpy array.
    fn numpy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let t = py_eager(self.0.tensor())?;
        Ok(to_py(py, py_eager(t.to_array())?))
    }

    /// Replaces the value (same dtype and shape).
    fn set_value(&self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        py_eager(self.0.set(from_py(value)?))
    }

    /// The gradient `backward()` accumulated, or `None`.
    #[getter]
    fn grad(&self) -> PyResult<Option<PyTensor>> {
        py_eager(self.0.check_thread())?;
        Ok(self.0.grad().map(PyTensor))
    }

    /// The parameter's shape, a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let dims = self.0.decl().ty.shape.as_fixed().unwrap_or_default();
        PyTuple::new(py, dims)
    }

    /// Forgets the gradient `backward()` accumulated.
    fn clear_gradient(&self) {
        self.0.zero_grad()
    }

    fn __repr__(&self) -> String {
        format!("kiln.Parameter({}: {})", self.0.name(), self.0.decl().ty)
    }
}

/// An initializer from its Python description: `("constant", v)`, `("uniform", low, high)`,
/// `("normal", mean, std)`, or a name (`zeros`, `ones`, `xavier_uniform`, …).
pub(crate) fn init(spec: &Bound<'_, PyAny>) -> PyResult<Init> {
    let (kind, args): (String, Vec<f64>) = match spec.extract::<String>() {
        Ok(name) => (name, Vec::new()),
        Err(_) => {
            let items: Vec<Bound<'_, PyAny>> = spec.extract()?;
            let kind = items
                .first()
                .ok_or_else(|| PyTypeError::new_err("an empty initializer"))?
                .extract()?;
            let args = items[1..]
                .iter()
                .map(|a| a.extract())
                .collect::<PyResult<_>>()?;
            (kind, args)
        }
    };
    Ok(match (kind.as_str(), &args[..]) {
        ("zeros", []) => Init::Zeros,
        ("ones", []) => Init::Ones,
        ("constant", [v]) => Init::Constant(*v),
        ("uniform", [low, high]) => Init::Uniform {
            low: *low,
            high: *high,
        },
        ("normal", [mean, std]) => Init::Normal {
            mean: *mean,
            std: *std,
        },
        ("xavier_uniform", []) => Init::XavierUniform,
        ("xavier_normal", []) => Init::XavierNormal,
        ("kaiming_uniform", []) => Init::KaimingUniform,
        ("kaiming_normal", []) => Init::KaimingNormal,
        _ => {
            return Err(PyTypeError::new_err(format!(
                "unknown initializer {kind}{args:?}"
            )));
        }
    })
}

/// Declares a parameter named `name` (made unique if taken) in this thread's scope.
#[pyfunction]
#[pyo3(signature = (name, shape, init_spec, dtype_name = "float32"))]
fn parameter(
    name: &str,
    shape: Vec<usize>,
    init_spec: &Bound<'_, PyAny>,
    dtype_name: &str,
) -> PyResult<PyParameter> {
    let p = Parameter::new(name, dtype(dtype_name)?, &shape, init(init_spec)?);
    py_eager(p).map(PyParameter)
}

/// While entered, ops record nothing for gradients.
#[pyclass(name = "no_grad", module = "kiln")]
pub(crate) struct PyNoGrad(Option<NoGradGuard>);

#[pymethods]
impl PyNoGrad {
    #[new]
    fn new() -> PyNoGrad {
        PyNoGrad(None)
    }

    fn __enter__(mut slf: PyRefMut<'_, Self>) -> PyRefMut<'_, Self> {
        slf.0 = Some(eager::no_grad());
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, PyTuple>) -> bool {
        self.0 = None;
        false
    }
}

/// An update rule from Python: `kind` (`sgd`, `adam`), its learning rate and its options,
/// with PyTorch's names and meanings, checked by [`OptimizerOptions`] when the optimizer is
/// built — an option the rule does not take is a `TypeError`, a value it cannot use a
/// `ValueError`.
pub(crate) fn rule(
    kind: &str,
    name: Option<&str>,
    lr: f64,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Box<dyn Optimizer>> {
    let mut o = OptimizerOptions::of_kind(kind).map_err(optimizer_error)?;
    for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        let value = if value.is_instance_of::<pyo3::types::PyBool>() {
            OptionValue::Flag(value.extract()?)
        } else if let Ok(x) = value.extract::<f64>() {
            OptionValue::Number(x)
        } else {
            let (a, b): (f64, f64) = value.extract()?;
            OptionValue::Pair(a, b)
        };
        o.set(&key, value).map_err(optimizer_error)?;
    }
    o.build(name.unwrap_or(kind), lr).map_err(optimizer_error)
}

fn optimizer_error(e: OptimizerError) -> PyErr {
    match e {
        OptimizerError::Invalid(_) => PyValueError::new_err(e.to_string()),
        _ => PyTypeError::new_err(e.to_string()),
    }
}

/// Checks an optimizer's options as [`rule`] does, building nothing: so that Python's
/// optimizers refuse a bad option when they are made, static or eager.
#[pyfunction]
#[pyo3(signature = (kind, lr, **options))]
fn check_optimizer(kind: &str, lr: f64, options: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    rule(kind, None, lr, options).map(|_| ())
}

/// An eager optimizer over parameters: `step()` applies the rule to their gradients.
#[pyclass(name = "EagerOptimizer", module = "kiln")]
pub(crate) struct PyEagerOptimizer(EagerOptimizer);

#[pymethods]
impl PyEagerOptimizer {
    #[new]
    #[pyo3(signature = (kind, params, lr, **options))]
    fn new(
        kind: &str,
        params: Vec<PyRef<'_, PyParameter>>,
        lr: f64,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyEagerOptimizer> {
        let params = params.iter().map(|p| p.0.clone()).collect();
        let rule = rule(kind, None, lr, options)?;
        py_eager(EagerOptimizer::new(rule, params)).map(PyEagerOptimizer)
    }

    /// Changes the learning rate from the next step on (what a schedule does).
    fn set_lr(&mut self, lr: f64) -> PyResult<()> {
        py_eager(self.0.set_learning_rate(lr))
    }

    fn step(&mut self) -> PyResult<()> {
        py_eager(self.0.step())
    }

    fn zero_grad(&self) {
        self.0.zero_grad()
    }
}

/// A PyLayer: Python `forward(inputs)` and `backward(inputs, outputs, grads)` over lists of
/// numpy arrays, registered as the custom op `name`.
struct PyLayerOp {
    name: String,
    forward: Py<PyAny>,
    backward: Py<PyAny>,
    outputs: usize,
}

/// Calls `f(*args)` with lists of numpy arrays; a single array back counts as a list of one.
/// A Python exception becomes the op's error, with its traceback.
fn call_numpy(f: &Py<PyAny>, groups: &[&[Array]]) -> Result<Vec<Array>, CustomOpError> {
    Python::attach(|py| {
        let args: Vec<Bound<'_, PyList>> = groups
            .iter()
            .map(|g| PyList::new(py, g.iter().map(|a| to_py(py, a.clone()))))
            .collect::<PyResult<_>>()
            .map_err(|e| CustomOpError(e.to_string()))?;
        let traceback = |e: PyErr| {
            let tb = e
                .traceback(py)
                .and_then(|t| t.format().ok())
                .unwrap_or_default();
            let message = format!(
                "{tb}{}: {}",
                e.get_type(py)
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
                e.value(py)
            );
            // The exception itself is raised again where the Kiln error reaches Python.
            crate::errors::stash(e);
            CustomOpError(message)
        };
        let out = f
            .bind(py)
            .call1(PyTuple::new(py, args).map_err(traceback)?)
            .map_err(traceback)?;
        let items: Vec<Bound<'_, PyAny>> =
            if out.is_instance_of::<PyList>() || out.is_instance_of::<PyTuple>() {
                out.extract().map_err(traceback)?
            } else {
                vec![out]
            };
        items
            .iter()
            .map(|a| from_py(a).map_err(traceback))
            .collect()
    })
}

impl CustomOp for PyLayerOp {
    fn name(&self) -> &str {
        &self.name
    }

    fn num_outputs(&self) -> usize {
        self.outputs
    }

    fn output_types(&self, inputs: &[Type]) -> Result<Vec<Type>, CustomOpError> {
        let first = inputs
            .first()
            .ok_or_else(|| CustomOpError(format!("PyLayer `{}` needs an input", self.name)))?;
        Ok(vec![first.clone(); self.outputs])
    }

    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        call_numpy(&self.forward, &[inputs])
    }

    fn backward(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        output_grads: &[Array],
    ) -> Result<Vec<Array>, CustomOpError> {
        call_numpy(&self.backward, &[inputs, outputs, output_grads])
    }
}

/// Registers a PyLayer's static methods as custom op `name` (its outputs have the first
/// input's type).
#[pyfunction]
fn register_pylayer(
    name: &str,
    forward: Py<PyAny>,
    backward: Py<PyAny>,
    outputs: usize,
) -> PyResult<()> {
    let op = PyLayerOp {
        name: name.to_owned(),
        forward,
        backward,
        outputs,
    };
    custom::register(Arc::new(op)).map_err(|e| KilnError::new_err(e.to_string()))
}

/// Applies registered PyLayer `name` to `inputs`: eagerly, or traced as `call @name`.
#[pyfunction]
fn apply_pylayer(name: &str, inputs: Vec<TensorArg>) -> PyResult<Vec<PyTensor>> {
    let tensors: Vec<&Tensor> = inputs.iter().map(|t| &t.0).collect();
    Ok(py_eager(custom::call(name, &tensors))?
        .into_iter()
        .map(PyTensor)
        .collect())
}

/// A Python function traced into a compiled program.
#[pyclass(name = "StaticFunction", module = "kiln")]
pub(crate) struct PyStaticFunction {
    function: StaticFunction,
    targets: Vec<Target>,
}

#[pymethods]
impl PyStaticFunction {
    /// Runs the compiled program; with `train`, also the updates `minimize` added.
    #[pyo3(signature = (inputs, train = false))]
    fn call(&mut self, inputs: Vec<TensorArg>, train: bool) -> PyResult<Vec<PyTensor>> {
        let tensors: Vec<&Tensor> = inputs.iter().map(|t| &t.0).collect();
        let out = if train {
            self.function.call_and_update(&tensors, &self.targets)
        } else {
            self.function.call(&tensors)
        };
        Ok(py_eager(out)?.into_iter().map(PyTensor).collect())
    }

    /// The traced program as text IR (state and one function, `name`).
    #[pyo3(signature = (name = "forward"))]
    fn ir(&self, name: &str) -> PyResult<String> {
        Ok(py_eager(self.function.module(name))?.to_string())
    }

    /// Writes the traced function as an ONNX model at `path` (`kiln.onnx.export`): the
    /// parameters' current values as initializers, a `None` size as a dynamic axis.
    #[pyo3(signature = (path, opset = kiln::onnx::export::DEFAULT_EXPORT_OPSET, name = "forward"))]
    fn export_onnx(&self, path: std::path::PathBuf, opset: i64, name: &str) -> PyResult<()> {
        let module = py_eager(self.function.module_with_updates(name))?;
        let state = py_eager(self.function.state())?;
        let options = kiln::onnx::export::ExportOptions {
            opset,
            ..Default::default()
        };
        kiln::onnx::export::export_to_file(&module, name, &state, &path, &options)
            .map_err(|e| KilnError::new_err(e.to_string()))
    }

    /// Adds an optimizer's update for the `output`-th output (a scalar loss); later calls with
    /// `train=True` apply it.
    #[pyo3(signature = (kind, lr, output = 0, **options))]
    fn minimize(
        &mut self,
        kind: &str,
        lr: f64,
        output: usize,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let mut rule = rule(kind, None, lr, options)?;
        let target = py_eager(self.function.minimize(&mut rule, output))?;
        self.targets.push(target);
        Ok(())
    }
}

/// Calls `f` (a Python callable over a list of tensors, returning a tensor or a list) on
/// `tensors`; a Python exception is kept in `error`, to be raised as itself.
fn call_python(
    f: &Py<PyAny>,
    tensors: &[Tensor],
    error: &std::cell::RefCell<Option<PyErr>>,
) -> eager::EagerResult<Vec<Tensor>> {
    Python::attach(|py| {
        let args = PyList::new(py, tensors.iter().map(|t| PyTensor(t.clone())))?;
        let out = f.bind(py).call1((args,))?;
        let items: Vec<TensorArg> = match out.extract() {
            Ok(list) => list,
            Err(_) => vec![out.extract()?],
        };
        Ok(items.iter().map(|t| t.0.clone()).collect())
    })
    .map_err(|e: PyErr| {
        let message = e.to_string();
        *error.borrow_mut() = Some(e);
        eager::EagerError::Usage(message)
    })
}

/// Traces `f` (a Python callable over a list of tensors, returning a list) with inputs of
/// the given `(name, dtype, shape)`; `None` in a shape is a symbolic dimension.
#[pyfunction]
fn to_static(
    f: Py<PyAny>,
    inputs: Vec<(String, String, Vec<Option<usize>>)>,
) -> PyResult<PyStaticFunction> {
    let types: Vec<(String, Type)> = inputs
        .iter()
        .map(|(name, d, shape)| {
            let dims = (shape.iter().enumerate())
                .map(|(i, d)| match (i, d) {
                    (_, Some(n)) => Dim::Fixed(*n),
                    // The batch, which every argument shares.
                    (0, None) => Dim::sym("N"),
                    (_, None) => Dim::sym(&format!("{name}_{i}")),
                })
                .collect();
            Ok((name.clone(), Type::new(dtype(d)?, Shape(dims))))
        })
        .collect::<PyResult<_>>()?;
    let typed: Vec<(&str, Type)> = types.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let python_error = std::cell::RefCell::new(None);
    let traced = eager::to_static(&typed, |tensors| call_python(&f, tensors, &python_error));
    match (traced, python_error.into_inner()) {
        (_, Some(e)) => Err(e),
        (result, None) => Ok(PyStaticFunction {
            function: py_eager(result)?,
            targets: Vec::new(),
        }),
    }
}

/// Runs `f` (a Python callable over a list of tensors, returning a list) on `inputs` eagerly
/// and traced by `to_static` (compiled and interpreted), comparing every op; returns the
/// report as a dict (`kiln.diff` wraps it). Ops are located, and matched, by the caller's
/// Python line.
#[pyfunction]
fn diff<'py>(
    py: Python<'py>,
    f: Py<PyAny>,
    inputs: Vec<TensorArg>,
) -> PyResult<Bound<'py, PyDict>> {
    let inputs: Vec<&Tensor> = inputs.iter().map(|t| &t.0).collect();
    let python_error = std::cell::RefCell::new(None);
    let call = |tensors: &[Tensor]| call_python(&f, tensors, &python_error);
    let locate: eager::diff::Locate =
        std::rc::Rc::new(|| Python::attach(|py| crate::errors::python_caller(py).ok().flatten()));
    let report = eager::diff_located(call, &inputs, Some(locate));
    if let Some(e) = python_error.into_inner() {
        return Err(e);
    }
    let report = py_eager(report)?;
    let out = PyDict::new(py);
    out.set_item("agree", report.agrees())?;
    out.set_item("compared", report.compared)?;
    out.set_item("text", report.to_string())?;
    let place =
        |place: &Option<String>, loc: kiln::ir::Loc| place.clone().unwrap_or(loc.to_string());
    let first = match &report.first {
        None => None,
        Some(d) => {
            let item = PyDict::new(py);
            item.set_item("op", &d.op)?;
            item.set_item("line", place(&d.place, d.loc))?;
            item.set_item("eager", &d.eager)?;
            item.set_item("compiled", &d.compiled)?;
            item.set_item("max_abs_error", d.mismatch.max_abs)?;
            item.set_item("max_rel_error", d.mismatch.max_rel)?;
            Some(item)
        }
    };
    out.set_item("first", first)?;
    let non_finite = PyList::empty(py);
    for n in &report.non_finite {
        let item = PyDict::new(py);
        item.set_item("run", n.run)?;
        item.set_item("op", &n.op)?;
        item.set_item("line", place(&n.place, n.loc))?;
        item.set_item("nan", n.nan)?;
        item.set_item("inf", n.inf)?;
        non_finite.append(item)?;
    }
    out.set_item("non_finite", non_finite)?;
    Ok(out)
}

/// An eager loss by name over two tensors: `cross_entropy` (logits, integer labels), `mse`,
/// `binary_cross_entropy_with_logits`, or the metric `accuracy`. Traced like any op.
#[pyfunction]
fn loss(name: &str, a: TensorArg, b: TensorArg) -> PyResult<PyTensor> {
    let result = match name {
        "cross_entropy" => nn::cross_entropy(&a.0, &b.0),
        "mse" => nn::mse(&a.0, &b.0),
        "binary_cross_entropy_with_logits" => nn::binary_cross_entropy_with_logits(&a.0, &b.0),
        "accuracy" => nn::accuracy(&a.0, &b.0),
        other => return Err(PyTypeError::new_err(format!("Kiln has no loss `{other}`"))),
    };
    result.map(PyTensor).map_err(|e| composite_error(name, e))
}

/// Seeds the parameters made from now on in this thread (each drawn from the seed and its
/// name), and dropout.
#[pyfunction]
fn manual_seed(seed: u64) {
    eager::manual_seed(seed)
}

/// Whether compiled runs flush subnormal floats to zero (`True`, the default) or keep IEEE
/// subnormals (`False`), process-wide, as `torch.set_flush_denormal`; returns whether this
/// machine can flush them (x86-64 can). `KILN_SUBNORMALS=keep` sets the default.
#[pyfunction]
fn set_flush_denormal(mode: bool) -> bool {
    use kiln::backend::subnormals::{Subnormals, can_flush, set_subnormals};
    set_subnormals(Some(if mode {
        Subnormals::Flush
    } else {
        Subnormals::Keep
    }));
    can_flush()
}

/// Forgets this thread's parameters, gradients and tape.
#[pyfunction]
fn reset() {
    eager::reset()
}

/// Saves this thread's eager parameters to `path` (safetensors, written atomically). Raises
/// `CheckpointError` when the file cannot be written; the previous file is then intact.
#[pyfunction]
fn save_parameters(path: std::path::PathBuf) -> PyResult<()> {
    py_eager(eager::save_parameters(&path))
}

/// Loads this thread's eager parameters from `path` (safetensors). Raises `CheckpointError`
/// for a missing, corrupt or mismatched file; nothing changes then.
#[pyfunction]
fn load_parameters(path: std::path::PathBuf) -> PyResult<()> {
    py_eager(eager::load_parameters(&path))
}

/// One of Kiln's built-in eager layers (convolution, pooling, normalisation, recurrent
/// cells, attention, embedding, dropout, a GPT), made by kind; `kiln.nn` wraps each in a
/// `Layer`. A GPT is kept as itself too, for `generate`.
#[pyclass(name = "NativeLayer", module = "kiln")]
pub(crate) struct PyNativeLayer {
    layer: Box<dyn Layer + Send + Sync>,
    gpt: Option<Gpt>,
}

/// The layer of `kind` named `name` with `options` (a dict of its sizes).
fn native_layer(kind: &str, name: &str, o: &Bound<'_, PyDict>) -> PyResult<PyNativeLayer> {
    let o = Options {
        kind,
        dict: Some(o),
    };
    let kind = layer_kind(kind, LayerForm::Eager)?;
    let layer: Box<dyn Layer + Send + Sync> = match kind {
        LayerKind::Conv2d => {
            let channels = [o.size("in_channels")?, o.size("out_channels")?];
            Box::new(py_eager(nn::Conv2d::new(
                name,
                channels,
                o.pair("kernel_size", [3, 3])?,
                o.conv2d()?,
            ))?)
        }
        LayerKind::MaxPool2d => Box::new(nn::MaxPool2d(o.pool2d()?)),
        LayerKind::AvgPool2d => Box::new(nn::AvgPool2d(o.pool2d()?)),
        LayerKind::Flatten => Box::new(nn::Flatten),
        LayerKind::GlobalAvgPool => Box::new(nn::GlobalAvgPool),
        LayerKind::BatchNorm => {
            let mut layer = py_eager(nn::BatchNorm::new(name, o.size("channels")?))?;
            layer.momentum = o.float("momentum", layer.momentum)?;
            layer.eps = o.float("eps", layer.eps)?;
            check_batch_norm(layer.momentum, layer.eps)?;
            Box::new(layer)
        }
        LayerKind::LayerNorm => Box::new(py_eager(nn::LayerNorm::new(
            name,
            o.size("width")?,
            o.float("eps", 1e-5)?,
        ))?),
        LayerKind::Lstm => Box::new(py_eager(nn::Lstm::new(
            name,
            o.size("input_size")?,
            o.size("hidden_size")?,
        ))?),
        LayerKind::Gru => Box::new(py_eager(nn::Gru::new(
            name,
            o.size("input_size")?,
            o.size("hidden_size")?,
        ))?),
        LayerKind::Embedding => Box::new(py_eager(nn::Embedding::new(
            name,
            o.size("vocab")?,
            o.size("dim")?,
        ))?),
        LayerKind::SelfAttention => Box::new(py_eager(nn::SelfAttention::new(
            name,
            o.size("features")?,
            o.size("dim")?,
        ))?),
        LayerKind::MultiHeadAttention => Box::new(py_eager(nn::MultiHeadAttention::new(
            name,
            o.size("embed_dim")?,
            o.size("num_heads")?,
            o.flag("causal")?,
        ))?),
        LayerKind::TransformerEncoderLayer => {
            Box::new(py_eager(nn::TransformerEncoderLayer::new(
                name,
                [
                    o.size("d_model")?,
                    o.size("nhead")?,
                    o.size("dim_feedforward")?,
                ],
                o.flag("causal")?,
            ))?)
        }
        LayerKind::Dropout => Box::new(nn::Dropout::new(
            o.float("p", 0.5)?,
            o.size("seed").unwrap_or(0) as u64,
        )),
        LayerKind::Gpt => {
            let gpt = crate::gpt::gpt(name, &o)?;
            let layer = Box::new(gpt.clone());
            return Ok(PyNativeLayer {
                layer,
                gpt: Some(gpt),
            });
        }
        LayerKind::Gelu => return Err(layer_kind_error(kind.no_form(LayerForm::Eager))),
    };
    Ok(PyNativeLayer { layer, gpt: None })
}

/// The layer kind `name` in `form`, or Python's `TypeError` naming the kinds there are.
pub(crate) fn layer_kind(name: &str, form: LayerForm) -> PyResult<LayerKind> {
    LayerKind::parse(name, form).map_err(layer_kind_error)
}

pub(crate) fn layer_kind_error(e: LayerKindError) -> PyErr {
    PyTypeError::new_err(e.to_string())
}

/// `_kiln.layer_kinds()`: the layer table, each kind's name with the names of its forms.
#[pyfunction]
fn layer_kinds() -> Vec<(&'static str, Vec<&'static str>)> {
    (LayerKind::ALL.iter())
        .map(|k| (k.name(), k.forms().iter().map(|f| f.name()).collect()))
        .collect()
}

#[pymethods]
impl PyNativeLayer {
    #[new]
    #[pyo3(signature = (kind, name, **options))]
    fn new(
        py: Python<'_>,
        kind: &str,
        name: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyNativeLayer> {
        let empty = PyDict::new(py);
        let options = options.unwrap_or(&empty);
        native_layer(kind, name, options)
    }

    fn forward(&self, x: TensorArg) -> PyResult<PyTensor> {
        py_eager(self.layer.forward(&x.0)).map(PyTensor)
    }

    fn parameters(&self) -> Vec<PyParameter> {
        self.layer
            .parameters()
            .into_iter()
            .map(PyParameter)
            .collect()
    }

    fn buffers(&self) -> Vec<PyParameter> {
        self.layer.buffers().into_iter().map(PyParameter).collect()
    }

    fn set_training(&mut self, training: bool) {
        self.layer.set_training(training)
    }

    /// A GPT's `prompts` each followed by up to `count` drawn tokens (`kiln.nn.GPT.generate`).
    #[pyo3(signature = (prompts, count, greedy, temperature, top_k, top_p, seed, stop, cache))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        prompts: Vec<Vec<i64>>,
        count: usize,
        greedy: bool,
        temperature: f64,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
        stop: Vec<i64>,
        cache: bool,
    ) -> PyResult<Vec<Vec<i64>>> {
        let Some(gpt) = &self.gpt else {
            return Err(PyTypeError::new_err("generate: only a GPT generates"));
        };
        // Temperature 0 is greedy decoding.
        let sampling = kiln::runtime::Sampling {
            temperature: if greedy { 0.0 } else { temperature },
            top_k,
            top_p,
            seed,
        };
        crate::gpt::generate(gpt, &prompts, count, sampling, &stop, cache)
    }
}
