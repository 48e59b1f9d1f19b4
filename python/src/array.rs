//! numpy arrays to and from Kiln's arrays. Out: the array's buffer becomes the numpy array's
//! (no copy). In: one copy into a buffer Kiln owns (Kiln's arrays own their elements).

use kiln::backend::Array;
use kiln::ir::DType;
use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// A numpy array (or anything `numpy.asarray` takes) as a Kiln array. float32, float64,
/// int32, int64 and bool keep their dtype; Python floats and lists become float32, ints int64.
pub(crate) fn from_py(value: &Bound<'_, PyAny>) -> PyResult<Array> {
    let py = value.py();
    let np = py.import("numpy")?;
    let array = np.call_method1("asarray", (value,))?;
    let mut kind = array
        .getattr("dtype")?
        .getattr("name")?
        .extract::<String>()?;
    // Python numbers and float lists arrive as float64; Kiln's default float is f32.
    let array = if kind == "float64" && !value.hasattr("dtype")? {
        kind = "float32".into();
        array.call_method1("astype", ("float32",))?
    } else {
        array
    };
    macro_rules! take {
        ($t:ty, $variant:ident) => {{
            let a = array.cast::<PyArrayDyn<$t>>()?;
            Array::$variant(a.readonly().as_array().to_owned())
        }};
    }
    Ok(match kind.as_str() {
        "float32" => take!(f32, F32),
        "float64" => take!(f64, F64),
        "int32" => take!(i32, I32),
        "int64" => take!(i64, I64),
        "bool" => take!(bool, Bool),
        other => {
            return Err(PyTypeError::new_err(format!(
                "Kiln takes float32, float64, int32, int64 or bool arrays, not {other}"
            )));
        }
    })
}

/// A Kiln array as a numpy array, without copying its elements.
pub(crate) fn to_py(py: Python<'_>, array: Array) -> Py<PyAny> {
    match array.into_standard_layout() {
        Array::F32(a) => a.into_pyarray(py).into_any().unbind(),
        Array::F64(a) => a.into_pyarray(py).into_any().unbind(),
        Array::I32(a) => a.into_pyarray(py).into_any().unbind(),
        Array::I64(a) => a.into_pyarray(py).into_any().unbind(),
        Array::Bool(a) => a.into_pyarray(py).into_any().unbind(),
    }
}

/// A dtype by its numpy name (`"float32"`, …) or Kiln's (`"f32"`, …).
pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    Ok(match name {
        "float32" | "f32" => DType::F32,
        "float64" | "f64" => DType::F64,
        "int32" | "i32" => DType::I32,
        "int64" | "i64" => DType::I64,
        "bool" => DType::Bool,
        other => return Err(PyTypeError::new_err(format!("unknown dtype `{other}`"))),
    })
}

/// A dtype's numpy name.
pub(crate) fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}
