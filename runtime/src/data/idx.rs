//! IDX files (the format of MNIST and Fashion-MNIST, gzipped or not) and MNIST-format folders.

use super::{DataError, Dataset, digits};
use ndarray::{ArrayD, IxDyn};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where Debian's `dataset-fashion-mnist` package installs Fashion-MNIST.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// How to get Fashion-MNIST on Debian or Ubuntu.
pub const FASHION_MNIST_HINT: &str = "sudo apt-get install dataset-fashion-mnist";

const FASHION_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// The unsigned-byte element type, the only one MNIST-format files use.
const IDX_U8: u8 = 0x08;

/// Reads an IDX file of unsigned bytes (gzipped or not: the gzip magic decides): its
/// dimensions and its values in row-major order. A missing, truncated or corrupt file, or one
/// with another element type, is an error naming the file.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::file(path, e))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| DataError::file(path, format!("corrupt or truncated gzip data: {e}")))?;
        out
    } else {
        raw
    };
    let header = bytes.get(..4).ok_or_else(|| {
        DataError::file(
            path,
            format!("{} bytes: too short for an IDX header", bytes.len()),
        )
    })?;
    if header[..2] != [0, 0] {
        return Err(DataError::file(
            path,
            format!("not an IDX file (it starts with {header:02x?}, IDX starts with 00 00)"),
        ));
    }
    if header[2] != IDX_U8 {
        return Err(DataError::file(
            path,
            format!(
                "IDX element type 0x{:02x}; only unsigned bytes (0x08, as in MNIST) are read",
                header[2]
            ),
        ));
    }
    let rank = header[3] as usize;
    let dims_end = 4 + 4 * rank;
    let dims: Vec<usize> = bytes
        .get(4..dims_end)
        .ok_or_else(|| DataError::file(path, format!("truncated in its {rank} dimensions")))?
        .chunks(4)
        .map(|d| u32::from_be_bytes([d[0], d[1], d[2], d[3]]) as usize)
        .collect();
    let expected = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let data = &bytes[dims_end..];
    if expected != Some(data.len()) {
        return Err(DataError::file(
            path,
            format!(
                "its header says {dims:?} ({} values) but it holds {} (truncated or corrupt)",
                expected.map_or("too many".into(), |n| n.to_string()),
                data.len()
            ),
        ));
    }
    Ok((dims, data.to_vec()))
}

/// Where a set of images came from.
#[derive(Clone, Debug, PartialEq)]
pub enum ImageSource {
    /// An MNIST-format folder (Fashion-MNIST when its name says so).
    Mnist(PathBuf),
    /// The 8×8 digits built into Kiln (no image folder was found).
    BuiltinDigits,
}

impl std::fmt::Display for ImageSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageSource::Mnist(dir) if is_fashion(dir) => {
                write!(f, "Fashion-MNIST from {}", dir.display())
            }
            ImageSource::Mnist(dir) => write!(f, "MNIST-format images from {}", dir.display()),
            ImageSource::BuiltinDigits => write!(f, "the built-in 8×8 digits"),
        }
    }
}

fn is_fashion(dir: &Path) -> bool {
    dir.to_string_lossy().to_lowercase().contains("fashion")
}

/// Labelled images split into training and test sets.
#[derive(Clone, Debug)]
pub struct Images {
    /// The training images, `f32[1, h, w]` each, in `[0, 1]`.
    pub train: Dataset,
    /// The test images.
    pub test: Dataset,
    /// Where they came from.
    pub source: ImageSource,
    /// The name of each class.
    pub class_names: Vec<String>,
}

/// `dir/stem` or `dir/stem.gz`, whichever exists (also with MNIST's other spelling,
/// `train-images.idx3-ubyte`).
fn find_file(dir: &Path, stem: &str) -> Result<PathBuf, DataError> {
    let dotted = stem.replacen("-idx", ".idx", 1);
    [stem, &dotted]
        .iter()
        .flat_map(|s| [dir.join(s), dir.join(format!("{s}.gz"))])
        .find(|p| p.is_file())
        .ok_or_else(|| {
            DataError::file(
                dir,
                format!("no {stem} (or {stem}.gz): not an MNIST-format folder"),
            )
        })
}

/// One split of an MNIST-format folder: `{prefix}-images-idx3-ubyte` and
/// `{prefix}-labels-idx1-ubyte`.
fn mnist_split(dir: &Path, prefix: &str) -> Result<Dataset, DataError> {
    let images_path = find_file(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find_file(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let (dims, pixels) = read_idx(&images_path)?;
    let &[n, h, w] = dims.as_slice() else {
        return Err(DataError::file(
            &images_path,
            format!("images need 3 dimensions (count, height, width), the file has {dims:?}"),
        ));
    };
    let (label_dims, labels) = read_idx(&labels_path)?;
    if label_dims != [n] {
        return Err(DataError::file(
            &labels_path,
            format!(
                "holds labels of shape {label_dims:?}, but {} holds {n} images",
                images_path.display()
            ),
        ));
    }
    if let Some((i, l)) = labels.iter().enumerate().find(|(_, l)| **l >= 10) {
        return Err(DataError::file(
            &labels_path,
            format!("label {l} of example {i} is outside the 10 classes 0..10"),
        ));
    }
    let features = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let features = ArrayD::from_shape_vec(IxDyn(&[n, 1, h, w]), features)
        .map_err(|e| DataError::file(&images_path, e))?;
    Dataset::new(
        features,
        labels.into_iter().map(i64::from).collect(),
        Some(10),
    )
}

/// The training (`train-*`) and test (`t10k-*`) sets of an MNIST-format folder, pixels scaled
/// to `[0, 1]`. A missing, truncated or corrupt file, a label out of range, or images and labels
/// of different counts are errors naming the file.
pub fn mnist(dir: &Path) -> Result<Images, DataError> {
    if !dir.is_dir() {
        return Err(DataError::file(dir, "not a folder"));
    }
    let class_names = if is_fashion(dir) {
        FASHION_CLASSES.iter().map(|c| c.to_string()).collect()
    } else {
        (0..10).map(|c| c.to_string()).collect()
    };
    Ok(Images {
        train: mnist_split(dir, "train")?,
        test: mnist_split(dir, "t10k")?,
        source: ImageSource::Mnist(dir.to_owned()),
        class_names,
    })
}

/// Images to train on: the MNIST-format folder `dir` when given (an error if it is not one);
/// else Fashion-MNIST where Debian installs it ([`FASHION_MNIST_DIR`]); else the built-in
/// digits as `[1, 8, 8]` images, split 80/20 (see [`FASHION_MNIST_HINT`]).
pub fn images(dir: Option<&Path>) -> Result<Images, DataError> {
    if let Some(dir) = dir {
        return mnist(dir);
    }
    let system = Path::new(FASHION_MNIST_DIR);
    if system.is_dir() {
        return mnist(system);
    }
    digit_images()
}

/// The built-in digits as `[1, 8, 8]` images, split 80/20 (seed 0).
pub fn digit_images() -> Result<Images, DataError> {
    let (train, test) = digits()?.with_sample_shape(&[1, 8, 8])?.split(0.2, 0)?;
    Ok(Images {
        train,
        test,
        source: ImageSource::BuiltinDigits,
        class_names: (0..10).map(|c| c.to_string()).collect(),
    })
}
