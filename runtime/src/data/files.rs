//! Datasets from `.npy` and CSV files.

use super::{DataError, Dataset};
use crate::npy::read_npy;
use kiln_backend::Array;
use kiln_ir::DType;
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// Reads `path` as the first of `dtypes` it holds.
fn read_as(path: &Path, dtypes: &[DType]) -> Result<Array, DataError> {
    let mut last = None;
    for &dtype in dtypes {
        match read_npy(path, dtype) {
            Ok(a) => return Ok(a),
            Err(e) => last = Some(e),
        }
    }
    Err(DataError::file(path, last.expect("at least one dtype")))
}

/// A dataset from two `.npy` files: features `[n, ...]` (f32 or f64) and labels `[n]` (i64
/// or i32), with `classes` classes (by default one more than the largest label).
pub fn npy(features: &Path, labels: &Path, classes: Option<usize>) -> Result<Dataset, DataError> {
    let x = match read_as(features, &[DType::F32, DType::F64])?.cast(DType::F32) {
        Array::F32(a) => a,
        _ => unreachable!("cast to f32"),
    };
    let y = match read_as(labels, &[DType::I64, DType::I32])?.cast(DType::I64) {
        Array::I64(a) => a.into_iter().collect(),
        _ => unreachable!("cast to i64"),
    };
    Dataset::new(x, y, classes).map_err(|e| DataError::file(labels, e))
}

/// A dataset from a CSV file of numbers, one example per line: the label in column
/// `label_column` (by default the last), every other column a feature. A first line that is
/// not all numbers is taken as a header. A line with another number of fields, or a field that
/// is not a number, is an error naming the line.
pub fn csv(path: &Path, label_column: Option<usize>) -> Result<Dataset, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::file(path, e))?;
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .peekable();
    let is_header = |line: &str| line.split(',').any(|f| f.trim().parse::<f64>().is_err());
    if lines.peek().is_some_and(|(_, l)| is_header(l)) {
        lines.next();
    }
    let (mut features, mut labels, mut width) = (Vec::new(), Vec::new(), None);
    for (i, line) in lines {
        let at = |message: String| DataError::file(path, format!("line {}: {message}", i + 1));
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let label_at = label_column.unwrap_or(fields.len() - 1);
        match width {
            None => width = Some(fields.len()),
            Some(w) if w != fields.len() => {
                return Err(at(format!(
                    "{} fields, the first line has {w}",
                    fields.len()
                )));
            }
            Some(_) => {}
        }
        if label_at >= fields.len() {
            return Err(at(format!("no column {label_at} for the label")));
        }
        for (c, field) in fields.iter().enumerate() {
            let value: f64 = field
                .parse()
                .map_err(|_| at(format!("`{field}` is not a number")))?;
            if c != label_at {
                features.push(value as f32);
            } else if value.fract() != 0.0 {
                return Err(at(format!("label `{field}` is not a whole number")));
            } else {
                labels.push(value as i64);
            }
        }
    }
    let n = labels.len();
    let d = width.map_or(0, |w| w - 1);
    let x =
        ArrayD::from_shape_vec(IxDyn(&[n, d]), features).map_err(|e| DataError::file(path, e))?;
    Dataset::new(x, labels, None).map_err(|e| DataError::file(path, e))
}
