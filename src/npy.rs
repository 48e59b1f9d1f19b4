//! Arrays in and out of `.npy` files, and inline array literals such as `[[1, 2], [3, 4]]`.

use kiln_backend::Array;
use kiln_ir::DType;
use ndarray::{ArrayD, IxDyn};
use std::path::Path;

/// Why an array could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ArrayIoError {
    /// Reading a `.npy` file failed.
    #[error("cannot read {path} as {dtype} .npy: {source}")]
    Read {
        /// The file.
        path: String,
        /// The dtype asked for.
        dtype: DType,
        /// The error.
        source: ndarray_npy::ReadNpyError,
    },
    /// Writing a `.npy` file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The error.
        source: ndarray_npy::WriteNpyError,
    },
    /// An inline array literal is malformed.
    #[error("invalid array literal `{text}`: {message}")]
    Literal {
        /// The text.
        text: String,
        /// What is wrong.
        message: String,
    },
}

/// Reads a `.npy` file holding elements of `dtype`.
pub fn read_npy(path: &Path, dtype: DType) -> Result<Array, ArrayIoError> {
    fn read<T: ndarray_npy::ReadableElement>(
        path: &Path,
    ) -> Result<ArrayD<T>, ndarray_npy::ReadNpyError> {
        ndarray_npy::read_npy(path)
    }
    let result = match dtype {
        DType::F32 => read::<f32>(path).map(Array::F32),
        DType::F64 => read::<f64>(path).map(Array::F64),
        DType::I32 => read::<i32>(path).map(Array::I32),
        DType::I64 => read::<i64>(path).map(Array::I64),
        DType::Bool => read::<bool>(path).map(Array::Bool),
    };
    result.map_err(|source| ArrayIoError::Read {
        path: path.display().to_string(),
        dtype,
        source,
    })
}

/// Writes an array as a `.npy` file.
pub fn write_npy(path: &Path, array: &Array) -> Result<(), ArrayIoError> {
    let result = kiln_backend::with_array!(array, a => ndarray_npy::write_npy(path, a));
    result.map_err(|source| ArrayIoError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Parses an inline array: a number, `true`/`false`, or nested lists of them, as `dtype`.
pub fn parse_array_literal(text: &str, dtype: DType) -> Result<Array, ArrayIoError> {
    let fail = |message: String| ArrayIoError::Literal {
        text: text.to_owned(),
        message,
    };
    let mut parser = LiteralParser {
        chars: text.chars().filter(|c| !c.is_whitespace()).collect(),
        pos: 0,
        dims: Vec::new(),
        leaf_depth: None,
    };
    let mut values = Vec::new();
    parser.value(0, &mut values).map_err(fail)?;
    if parser.pos != parser.chars.len() {
        return Err(fail(format!(
            "unexpected text after position {}",
            parser.pos
        )));
    }
    // An empty list `[]` has no leaves: its depth is where it ends.
    let depth = parser.leaf_depth.unwrap_or(parser.dims.len());
    let shape: Vec<usize> = parser.dims[..depth]
        .iter()
        .map(|d| d.unwrap_or(0))
        .collect();
    let is_int = dtype.is_int();
    if let Some(v) = values.iter().find(|v| is_int && v.fract() != 0.0) {
        return Err(fail(format!(
            "{v} is not an integer, but the argument is {dtype}"
        )));
    }
    let array = ArrayD::from_shape_vec(IxDyn(&shape), values).map_err(|e| fail(e.to_string()))?;
    Ok(Array::F64(array).cast(dtype))
}

struct LiteralParser {
    chars: Vec<char>,
    pos: usize,
    /// The list length seen at each depth; every list at one depth must agree.
    dims: Vec<Option<usize>>,
    /// The depth of the numbers; every number must sit at the same depth.
    leaf_depth: Option<usize>,
}

impl LiteralParser {
    fn value(&mut self, depth: usize, out: &mut Vec<f64>) -> Result<(), String> {
        if depth > 32 {
            return Err("nested too deeply".into());
        }
        if self.chars.get(self.pos) == Some(&'[') {
            self.pos += 1;
            let mut count = 0;
            if self.chars.get(self.pos) != Some(&']') {
                loop {
                    self.value(depth + 1, out)?;
                    count += 1;
                    match self.chars.get(self.pos) {
                        Some(',') => self.pos += 1,
                        Some(']') => break,
                        _ => return Err(format!("expected `,` or `]` at position {}", self.pos)),
                    }
                }
            }
            self.pos += 1;
            if self.dims.len() <= depth {
                self.dims.resize(depth + 1, None);
            }
            return match self.dims[depth] {
                Some(n) if n != count => Err(format!(
                    "ragged nesting: a list of {count} where one of {n} came before"
                )),
                _ => {
                    self.dims[depth] = Some(count);
                    Ok(())
                }
            };
        }
        if *self.leaf_depth.get_or_insert(depth) != depth {
            return Err(format!("ragged nesting at position {}", self.pos));
        }
        let start = self.pos;
        while self
            .chars
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
        {
            self.pos += 1;
        }
        let word: String = self.chars[start..self.pos].iter().collect();
        let value = match word.as_str() {
            "true" => 1.0,
            "false" => 0.0,
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => word
                .parse()
                .map_err(|_| format!("expected a number at position {start}, found `{word}`"))?,
        };
        out.push(value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_parse_with_shape() {
        let a = parse_array_literal("[[1, 2], [3, 4]]", DType::I64).unwrap();
        assert_eq!(a.shape(), &[2, 2]);
        assert_eq!(a.to_f64_vec(), [1.0, 2.0, 3.0, 4.0]);
        let s = parse_array_literal("2.5", DType::F32).unwrap();
        assert_eq!(s.shape(), &[] as &[usize]);
        assert!(parse_array_literal("[[1], [2, 3]]", DType::F32).is_err());
        assert!(parse_array_literal("[[1], 2]", DType::F32).is_err());
        assert!(parse_array_literal("[1, [2]]", DType::F32).is_err());
        assert_eq!(
            parse_array_literal("[[[1], [2]]]", DType::F32)
                .unwrap()
                .shape(),
            &[1, 2, 1]
        );
        assert!(parse_array_literal("[1.5]", DType::I32).is_err());
        assert!(parse_array_literal("[1,", DType::F32).is_err());
        assert_eq!(parse_array_literal("[]", DType::F32).unwrap().shape(), &[0]);
    }
}
