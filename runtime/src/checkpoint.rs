//! Checkpoints: state values as safetensors files.
//!
//! - A save writes a temporary file beside the target, flushes it to disk and renames it over
//!   the target, so a failed save leaves the previous checkpoint intact.
//! - Each tensor's CRC-32 is stored in the file's metadata; a load verifies it, so a damaged or
//!   edited file is an error, never a silent partial load. (safetensors itself rejects
//!   truncated files and malformed headers.)
//! - A load checks every tensor against the declared types before anything is replaced.

use kiln_backend::Array;
use kiln_ir::{DType, Type};
use ndarray::{ArrayD, IxDyn};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

/// Why a checkpoint could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Writing failed (the previous file is intact).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid safetensors file.
    #[error("{path} is not a valid checkpoint: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor's checksum does not match (the file was truncated or modified).
    #[error("{path}: tensor `{name}` fails its checksum; the file was damaged or modified")]
    Checksum {
        /// The file.
        path: String,
        /// The tensor.
        name: String,
    },
    /// A tensor's type differs from the state it loads into.
    #[error("{path}: `{name}` is {found} in the checkpoint but {expected} in the program")]
    Mismatch {
        /// The file.
        path: String,
        /// The tensor.
        name: String,
        /// The state's type.
        expected: Box<Type>,
        /// The tensor's type.
        found: Box<Type>,
    },
    /// State values the file does not have.
    #[error("{path}: the checkpoint has no values for {names}")]
    Missing {
        /// The file.
        path: String,
        /// The missing states.
        names: String,
    },
}

const CHECKSUM_PREFIX: &str = "kiln.crc32.";

fn le_bytes(array: &Array) -> Vec<u8> {
    match array {
        Array::F32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Array::F64(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Array::I32(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Array::I64(a) => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Array::Bool(a) => a.iter().map(|&v| v as u8).collect(),
    }
}

fn safetensors_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::Bool => Dtype::BOOL,
    }
}

/// Writes `tensors` to `path` atomically (temporary file, flush, rename).
pub fn save<'a>(
    tensors: impl IntoIterator<Item = (&'a str, &'a Array)>,
    path: &Path,
) -> Result<(), CheckpointError> {
    let write_error = |source| CheckpointError::Write {
        path: path.display().to_string(),
        source,
    };
    let owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, a)| {
            (
                name.to_owned(),
                safetensors_dtype(a.dtype()),
                a.shape().to_vec(),
                le_bytes(a),
            )
        })
        .collect();
    let mut metadata = HashMap::from([("format".to_owned(), "kiln".to_owned())]);
    for (name, _, _, bytes) in &owned {
        metadata.insert(
            format!("{CHECKSUM_PREFIX}{name}"),
            format!("{:08x}", crc32fast::hash(bytes)),
        );
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.as_str(), v))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| write_error(std::io::Error::other(e.to_string())))?;
    let bytes = safetensors::serialize(views, Some(metadata))
        .map_err(|e| write_error(std::io::Error::other(e.to_string())))?;
    write_atomically(path, &bytes).map_err(write_error)
}

/// Writes `bytes` to a temporary file beside `path`, flushes it, and renames it over `path`.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn to_array(view: &TensorView<'_>) -> Result<Array, String> {
    let shape = IxDyn(view.shape());
    let data = view.data();
    fn chunks<const N: usize, T>(data: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
        data.chunks_exact(N)
            .map(|c| f(c.try_into().expect("chunks_exact gives N bytes")))
            .collect()
    }
    let build = |e: ndarray::ShapeError| e.to_string();
    Ok(match view.dtype() {
        Dtype::F32 => Array::F32(
            ArrayD::from_shape_vec(shape, chunks(data, f32::from_le_bytes)).map_err(build)?,
        ),
        Dtype::F64 => Array::F64(
            ArrayD::from_shape_vec(shape, chunks(data, f64::from_le_bytes)).map_err(build)?,
        ),
        Dtype::I32 => Array::I32(
            ArrayD::from_shape_vec(shape, chunks(data, i32::from_le_bytes)).map_err(build)?,
        ),
        Dtype::I64 => Array::I64(
            ArrayD::from_shape_vec(shape, chunks(data, i64::from_le_bytes)).map_err(build)?,
        ),
        Dtype::BOOL => Array::Bool(
            ArrayD::from_shape_vec(shape, data.iter().map(|&b| b != 0).collect()).map_err(build)?,
        ),
        other => return Err(format!("dtype {other:?} is not one Kiln uses")),
    })
}

/// Reads the values of `declared` state from `path`, checking each against its declared type
/// and checksum. Either every declared value is returned, or an error and nothing. Tensors the
/// program does not declare are ignored (a training checkpoint serves an inference program).
pub fn load(
    path: &Path,
    declared: &BTreeMap<String, Type>,
) -> Result<BTreeMap<String, Array>, CheckpointError> {
    let (values, missing) = load_present(path, declared)?;
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(|name| format!("`{name}`")).collect();
        return Err(CheckpointError::Missing {
            path: path.display().to_string(),
            names: names.join(", "),
        });
    }
    Ok(values)
}

/// Like [`load`], but declared state the file lacks is skipped and listed (a parameters-only
/// checkpoint loaded where an optimizer has declared its moments): the values present, and the
/// names skipped. A value present but of the wrong type or checksum is still an error.
pub fn load_present(
    path: &Path,
    declared: &BTreeMap<String, Type>,
) -> Result<(BTreeMap<String, Array>, Vec<String>), CheckpointError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Read {
        path: shown.clone(),
        source,
    })?;
    let invalid = |message: String| CheckpointError::Invalid {
        path: shown.clone(),
        message,
    };
    let (_, metadata) = SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let checksums = metadata.metadata().clone().unwrap_or_default();
    let (present, missing): (Vec<_>, Vec<_>) = declared
        .iter()
        .partition(|(name, _)| tensors.tensor(name).is_ok());
    let missing: Vec<String> = missing.into_iter().map(|(name, _)| name.clone()).collect();
    let mut out = BTreeMap::new();
    for (name, expected) in present {
        let view = tensors.tensor(name).map_err(|e| invalid(e.to_string()))?;
        if let Some(sum) = checksums.get(&format!("{CHECKSUM_PREFIX}{name}"))
            && *sum != format!("{:08x}", crc32fast::hash(view.data()))
        {
            return Err(CheckpointError::Checksum {
                path: shown,
                name: name.clone(),
            });
        }
        let array = to_array(&view).map_err(|m| invalid(format!("tensor `{name}`: {m}")))?;
        if array.ty() != *expected {
            return Err(CheckpointError::Mismatch {
                path: shown,
                name: name.clone(),
                expected: Box::new(expected.clone()),
                found: Box::new(array.ty()),
            });
        }
        out.insert(name.clone(), array);
    }
    Ok((out, missing))
}

/// Writes a module as text IR, atomically (a failed save leaves the previous file intact).
pub fn save_module(module: &kiln_ir::Module, path: &Path) -> Result<(), CheckpointError> {
    write_atomically(path, module.to_string().as_bytes()).map_err(|source| CheckpointError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// Reads a module saved as text IR, parsed and verified; errors carry the line and a caret.
pub fn load_module(path: &Path) -> Result<kiln_ir::Module, CheckpointError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| CheckpointError::Read {
        path: shown.clone(),
        source,
    })?;
    kiln_ir::parse_and_verify(&text).map_err(|e| CheckpointError::Invalid {
        path: shown,
        message: e.render(&text),
    })
}

/// How a state dict written by another framework names and lays out Kiln's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateDictLayout {
    /// Kiln's own names and layouts (what [`save`] writes).
    Kiln,
    /// PyTorch's `state_dict()` of a module tree with Kiln's layer names, saved with
    /// `safetensors.torch.save_file`: a layer's last name part renamed — `w` → `weight`
    /// (transposed when a matrix: Kiln's `Linear` is `[in, out]`, PyTorch's `[out, in]`),
    /// `b` → `bias`, `gamma` → `weight`, `beta` → `bias`, `table` → `weight` — and the rest
    /// as it is (a convolution's `[out, in, kh, kw]` is the same in both).
    PyTorch,
}

impl StateDictLayout {
    /// The name `name` has in this layout, and whether its matrix is transposed there.
    pub fn name_of(self, name: &str) -> (String, bool) {
        let (path, last) = name.rsplit_once('.').unwrap_or(("", name));
        let renamed = match (self, last) {
            (StateDictLayout::Kiln, _) => return (name.to_owned(), false),
            (_, "w") => ("weight", true),
            (_, "gamma" | "table") => ("weight", false),
            (_, "b" | "beta") => ("bias", false),
            (_, other) => (other, false),
        };
        match path {
            "" => (renamed.0.to_owned(), renamed.1),
            _ => (format!("{path}.{}", renamed.0), renamed.1),
        }
    }
}

/// Reads `declared` state (Kiln's names and types) from a state dict in `layout` at `path`,
/// converted to Kiln's layouts; like [`load`], every value or an error, and nothing else
/// changes. A tensor's shape is checked in the file's layout, so an error names the file's
/// tensor and shape.
pub fn load_state_dict(
    path: &Path,
    declared: &BTreeMap<String, Type>,
    layout: StateDictLayout,
) -> Result<BTreeMap<String, Array>, CheckpointError> {
    let mut theirs = BTreeMap::new();
    let mut names = Vec::new();
    for (name, ty) in declared {
        let (their_name, matrix_name) = layout.name_of(name);
        let dims = ty.shape.as_fixed().unwrap_or_default();
        let transposed = matrix_name && ty.rank() == 2 && dims.len() == 2;
        let ty = match transposed {
            true => Type::new(ty.dtype, kiln_ir::Shape::fixed(&[dims[1], dims[0]])),
            false => ty.clone(),
        };
        theirs.insert(their_name.clone(), ty);
        names.push((name.clone(), their_name, transposed));
    }
    let mut values = load(path, &theirs)?;
    let mut ours = BTreeMap::new();
    for (name, their_name, transposed) in names {
        let value = values.remove(&their_name).expect("loaded");
        let value = match transposed {
            true => {
                kiln_backend::map_array!(value, a => a.reversed_axes().as_standard_layout().into_owned())
            }
            false => value,
        };
        ours.insert(name, value);
    }
    Ok(ours)
}
