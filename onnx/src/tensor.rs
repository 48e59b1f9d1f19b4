//! ONNX tensors (`TensorProto`) to Kiln arrays, and arrays and literals to tensors for export,
//! with ONNX's element types mapped onto Kiln's. Every length and size is checked before
//! anything is allocated.

use crate::proto::TensorProto;
use crate::proto::tensor_proto::DataType;
use kiln_backend::Array;
use kiln_ir::{DType, Literal, Type};
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// Kiln's dtype for an ONNX element type, or the ONNX type's name when Kiln has none.
pub fn dtype(elem_type: i32) -> Result<DType, String> {
    match DataType::try_from(elem_type) {
        Ok(DataType::Float) => Ok(DType::F32),
        Ok(DataType::Double) => Ok(DType::F64),
        Ok(DataType::Int32) => Ok(DType::I32),
        Ok(DataType::Int64) => Ok(DType::I64),
        Ok(DataType::Bool) => Ok(DType::Bool),
        Ok(other) => Err(format!(
            "element type {} has no Kiln dtype (Kiln has f32, f64, i32, i64, bool)",
            other.as_str_name()
        )),
        Err(_) => Err(format!("unknown element type {elem_type}")),
    }
}

/// The dimensions of a tensor, checked: none negative, and the element count addressable.
pub fn dims(raw: &[i64], dtype: DType) -> Result<Vec<usize>, String> {
    let dims = raw
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d} in {raw:?}")))
        .collect::<Result<Vec<usize>, String>>()?;
    Type::new(dtype, kiln_ir::Shape::fixed(&dims))
        .check_addressable()
        .map_err(|e| e.to_string())?;
    Ok(dims)
}

/// The array a `TensorProto` holds. `base` is the model's folder, where external data lives.
pub fn to_array(t: &TensorProto, base: Option<&Path>) -> Result<Array, String> {
    let dtype = dtype(t.data_type.unwrap_or(0))?;
    let shape = dims(&t.dims, dtype)?;
    let count: usize = shape.iter().product();
    check_memory(dtype, count)?;
    let external;
    let raw = if t.data_location == Some(1) {
        external = read_external(t, base)?;
        Some(external.as_slice())
    } else {
        t.raw_data.as_deref()
    };
    let mut array = match raw {
        Some(bytes) => from_le_bytes(dtype, bytes, count)?,
        None => from_typed_fields(t, dtype, count)?,
    };
    array.reshape_in_place(&shape); // the element count was checked against the shape
    Ok(array)
}

/// Refuses a tensor larger than the run's memory limit before allocating it.
fn check_memory(dtype: DType, count: usize) -> Result<(), String> {
    let bytes = count as u128 * dtype.size_bytes() as u128;
    let limit = kiln_backend::limits::memory_limit();
    if bytes > limit as u128 {
        return Err(format!(
            "a tensor of {count} {} elements needs {bytes} bytes, more than the memory limit \
             of {limit} bytes",
            dtype.name()
        ));
    }
    Ok(())
}

fn from_le_bytes(dtype: DType, bytes: &[u8], count: usize) -> Result<Array, String> {
    let width = dtype.size_bytes();
    if bytes.len() != count * width {
        return Err(format!(
            "raw data holds {} bytes; {count} {} elements need {}",
            bytes.len(),
            dtype.name(),
            count * width
        ));
    }
    let chunks = bytes.chunks_exact(width);
    let array = match dtype {
        DType::F32 => Array::F32(vec1(
            chunks.map(|c| f32::from_le_bytes(c.try_into().unwrap())),
        )),
        DType::F64 => Array::F64(vec1(
            chunks.map(|c| f64::from_le_bytes(c.try_into().unwrap())),
        )),
        DType::I32 => Array::I32(vec1(
            chunks.map(|c| i32::from_le_bytes(c.try_into().unwrap())),
        )),
        DType::I64 => Array::I64(vec1(
            chunks.map(|c| i64::from_le_bytes(c.try_into().unwrap())),
        )),
        DType::Bool => Array::Bool(vec1(chunks.map(|c| c[0] != 0))),
    };
    Ok(array)
}

fn vec1<T>(items: impl Iterator<Item = T>) -> ArrayD<T> {
    let v: Vec<T> = items.collect();
    let n = v.len();
    ArrayD::from_shape_vec(IxDyn(&[n]), v).expect("a vector's shape is its length")
}

fn from_typed_fields(t: &TensorProto, dtype: DType, count: usize) -> Result<Array, String> {
    let (len, array) = match dtype {
        DType::F32 => (
            t.float_data.len(),
            Array::F32(vec1(t.float_data.iter().copied())),
        ),
        DType::F64 => (
            t.double_data.len(),
            Array::F64(vec1(t.double_data.iter().copied())),
        ),
        DType::I32 => (
            t.int32_data.len(),
            Array::I32(vec1(t.int32_data.iter().copied())),
        ),
        DType::I64 => (
            t.int64_data.len(),
            Array::I64(vec1(t.int64_data.iter().copied())),
        ),
        DType::Bool => (
            t.int32_data.len(),
            Array::Bool(vec1(t.int32_data.iter().map(|&b| b != 0))),
        ),
    };
    if len != count {
        return Err(format!(
            "holds {len} {} elements; its dimensions {:?} need {count}",
            dtype.name(),
            t.dims
        ));
    }
    Ok(array)
}

/// The bytes of a tensor stored outside the model (`location`, `offset`, `length`), which
/// must stay inside the model's folder.
fn read_external(t: &TensorProto, base: Option<&Path>) -> Result<Vec<u8>, String> {
    let entry = |key: &str| {
        (t.external_data.iter())
            .find(|e| e.key.as_deref() == Some(key))
            .and_then(|e| e.value.clone())
    };
    let location = entry("location").ok_or("external data without a location")?;
    let base = base.ok_or("external data, but the model was not read from a file")?;
    if Path::new(&location).is_absolute() || location.split(['/', '\\']).any(|p| p == "..") {
        return Err(format!(
            "external data location {location:?} leaves the model's folder"
        ));
    }
    let number = |key: &str| -> Result<Option<u64>, String> {
        entry(key)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| format!("external data {key} {v:?} is not a number"))
            })
            .transpose()
    };
    let path = base.join(&location);
    let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let offset = number("offset")?.unwrap_or(0) as usize;
    let end = match number("length")? {
        Some(length) => offset.checked_add(length as usize),
        None => Some(bytes.len()),
    };
    match end {
        Some(end) if offset <= end && end <= bytes.len() => Ok(bytes[offset..end].to_vec()),
        _ => Err(format!(
            "external data range is outside {} ({} bytes)",
            path.display(),
            bytes.len()
        )),
    }
}

/// ONNX's element type for a Kiln dtype.
pub fn elem_type(dtype: DType) -> i32 {
    let t = match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
    };
    t as i32
}

/// The `TensorProto` of `literal`'s elements with type `ty` (as many elements as `ty` has),
/// stored as little-endian raw data.
pub fn from_literal(literal: &Literal, ty: &Type, name: Option<&str>) -> TensorProto {
    let raw: Vec<u8> = match literal {
        Literal::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Literal::F64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Literal::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Literal::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Literal::Bool(v) => v.iter().map(|&b| b as u8).collect(),
    };
    let dims = (ty.shape.dims().iter())
        .map(|d| d.as_fixed().map_or(-1, |n| n as i64))
        .collect();
    TensorProto {
        dims,
        data_type: Some(elem_type(ty.dtype)),
        name: name.map(str::to_owned),
        raw_data: Some(raw),
        ..TensorProto::default()
    }
}

/// The `TensorProto` of an array (an initializer named `name`).
pub fn from_array(array: &Array, name: &str) -> TensorProto {
    from_literal(&array.to_literal(), &array.ty(), Some(name))
}
