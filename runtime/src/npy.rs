//! Arrays in and out of `.npy` files, and inline array literals such as `[[1, 2], [3, 4]]`.

use kiln_backend::Array;
use kiln_ir::DType;
use ndarray::{ArrayD, IxDyn};
use ndarray_npy::ReadNpyExt;
use ndarray_npy::npy::header::Header;
use std::io::{Read, Seek};
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
    /// A `.npy` file that cannot hold what its header says, or that is too large to read.
    #[error("cannot read {path} as {dtype} .npy: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// The dtype asked for.
        dtype: DType,
        /// What is wrong.
        message: String,
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

/// Reads a `.npy` file holding elements of `dtype`, in C or Fortran order (the array comes
/// back row-major either way).
///
/// The header is checked against the file before anything is allocated: the data its shape
/// and element type describe must be exactly what follows it, and within the memory limit
/// ([`kiln_backend::limits`]). A header that claims more than the file holds is an error, not
/// an allocation of what it claims.
pub fn read_npy(path: &Path, dtype: DType) -> Result<Array, ArrayIoError> {
    let invalid = |message: String| ArrayIoError::Invalid {
        path: path.display().to_string(),
        dtype,
        message,
    };
    let read_error = |source| ArrayIoError::Read {
        path: path.display().to_string(),
        dtype,
        source,
    };
    let mut file = std::fs::File::open(path).map_err(|e| read_error(e.into()))?;
    let file_bytes = file.metadata().map_err(|e| read_error(e.into()))?.len();
    let mut counted = Counted {
        inner: std::io::BufReader::new(&mut file),
        bytes: 0,
    };
    let header = Header::from_reader(&mut counted).map_err(|e| read_error(e.into()))?;
    let data_bytes = u128::from(file_bytes.saturating_sub(counted.bytes));
    let item_bytes = item_size(&header.type_descriptor).unwrap_or(dtype.size_bytes());
    let elements = (header.shape.iter()).fold(1u128, |acc, &n| acc.saturating_mul(n as u128));
    let claimed = elements.saturating_mul(item_bytes as u128);
    if claimed != data_bytes {
        return Err(invalid(format!(
            "its header describes shape {:?} of {} ({claimed} bytes of data), but {data_bytes} \
             bytes follow the header",
            header.shape, header.type_descriptor
        )));
    }
    let ty = kiln_ir::Type::new(dtype, kiln_ir::Shape::fixed(&header.shape));
    // An empty array whose other sizes overflow (`(0, 2^63)`) is not an array either.
    ty.check_addressable().map_err(|e| invalid(e.to_string()))?;
    kiln_backend::limits::check_bytes(&format!("{}", path.display()), &ty, claimed)
        .map_err(|e| invalid(e.to_string()))?;
    file.seek(std::io::SeekFrom::Start(0))
        .map_err(|e| read_error(e.into()))?;
    fn read<T: ndarray_npy::ReadableElement>(
        file: &mut std::fs::File,
    ) -> Result<ArrayD<T>, ndarray_npy::ReadNpyError> {
        ArrayD::<T>::read_npy(std::io::BufReader::new(file))
    }
    let array = match dtype {
        DType::F32 => read::<f32>(&mut file).map(Array::F32),
        DType::F64 => read::<f64>(&mut file).map(Array::F64),
        DType::I32 => read::<i32>(&mut file).map(Array::I32),
        DType::I64 => read::<i64>(&mut file).map(Array::I64),
        DType::Bool => read::<bool>(&mut file).map(Array::Bool),
    };
    Ok(array.map_err(read_error)?.into_standard_layout())
}

/// A reader that counts the bytes read through it (the header's length).
struct Counted<R> {
    inner: R,
    bytes: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// The bytes per element a `.npy` type descriptor such as `'<f4'` or `'|b1'` names (as
/// the header prints it).
fn item_size(descriptor: &impl std::fmt::Display) -> Option<usize> {
    let text = descriptor.to_string();
    let text = text.trim_matches(['\'', '"']);
    let digits = text.trim_start_matches(['<', '>', '|', '=']).get(1..)?;
    digits.parse().ok()
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
    fn build<T>(
        shape: &[usize],
        words: &[(String, usize)],
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<ArrayD<T>, String> {
        let values = (words.iter())
            .map(|(word, at)| parse(word).map_err(|e| format!("{e} (at position {at})")))
            .collect::<Result<Vec<T>, _>>()?;
        ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| e.to_string())
    }
    let array = match dtype {
        DType::F32 => build(&shape, &values, float).map(Array::F32),
        DType::F64 => build(&shape, &values, float).map(Array::F64),
        DType::I32 => build(&shape, &values, |w| integer(w, dtype)).map(Array::I32),
        DType::I64 => build(&shape, &values, |w| integer(w, dtype)).map(Array::I64),
        DType::Bool => build(&shape, &values, boolean).map(Array::Bool),
    };
    array.map_err(fail)
}

/// A float word, rounded once to `T` (an f32 is not rounded through an f64 first).
fn float<T: std::str::FromStr>(word: &str) -> Result<T, String> {
    let word = match word {
        "true" => "1",
        "false" => "0",
        w => w,
    };
    word.parse()
        .map_err(|_| format!("expected a number, found `{word}`"))
}

/// An integer word of `dtype`, exactly: `9007199254740993` is not rounded to a float on the
/// way. An integral float (`3.0`, `1e3`) is accepted when it is exact.
fn integer<T: TryFrom<i64>>(word: &str, dtype: DType) -> Result<T, String> {
    let value = match word {
        "true" => 1,
        "false" => 0,
        w => match w.parse::<i64>() {
            Ok(v) => v,
            Err(_) => {
                let f: f64 = float(w)?;
                let exact = f.fract() == 0.0 && f.abs() < 2f64.powi(53);
                if !exact {
                    return Err(format!("`{w}` is not an integer {dtype} can hold exactly"));
                }
                f as i64
            }
        },
    };
    T::try_from(value).map_err(|_| format!("{value} is out of range for {dtype}"))
}

fn boolean(word: &str) -> Result<bool, String> {
    match word {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        w => Err(format!("expected true, false, 1 or 0, found `{w}`")),
    }
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
    fn value(&mut self, depth: usize, out: &mut Vec<(String, usize)>) -> Result<(), String> {
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
        if start == self.pos {
            return Err(format!("expected a number at position {start}"));
        }
        out.push((self.chars[start..self.pos].iter().collect(), start));
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
        // Integers are exact, and out-of-range ones are errors, not saturated.
        let big = parse_array_literal("[9007199254740993, -9223372036854775808]", DType::I64);
        assert_eq!(
            big.unwrap()
                .as_ndarray::<i64>()
                .unwrap()
                .as_slice()
                .unwrap(),
            [9007199254740993, i64::MIN]
        );
        assert!(parse_array_literal("2147483648", DType::I32).is_err());
        assert!(parse_array_literal("9223372036854775808", DType::I64).is_err());
        assert!(parse_array_literal("1e300", DType::I64).is_err());
        assert_eq!(
            parse_array_literal("3.0", DType::I32).unwrap().to_f64_vec(),
            [3.0]
        );
        assert_eq!(
            parse_array_literal("[true, 0]", DType::Bool)
                .unwrap()
                .to_f64_vec(),
            [1.0, 0.0]
        );
        assert!(parse_array_literal("2", DType::Bool).is_err());
        let nan = parse_array_literal("[nan, -inf]", DType::F32)
            .unwrap()
            .to_f64_vec();
        assert!(nan[0].is_nan() && nan[1] == f64::NEG_INFINITY);
        assert!(parse_array_literal("[1,", DType::F32).is_err());
        assert_eq!(parse_array_literal("[]", DType::F32).unwrap().shape(), &[0]);
    }
}
