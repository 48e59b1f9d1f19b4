//! `kiln.data`: datasets (arrays, `.npy`, CSV, MNIST-format folders, the built-in digits),
//! transforms and the `DataLoader`, all Rust's (`kiln::runtime::data`): batches are made on a
//! background thread and arrive as numpy arrays.

use crate::array::{from_py, to_py};
use crate::errors::{KilnError, kiln_ok};
use kiln::backend::Array;
use kiln::runtime::data::{
    self, Batches, DataLoader, Dataset, Normalize, RandomCrop, RandomHorizontalFlip, Transform,
};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDataset>()?;
    m.add_class::<PyDataLoader>()?;
    m.add_class::<PyBatches>()?;
    m.add_class::<PyTransform>()?;
    m.add_function(wrap_pyfunction!(digits, m)?)?;
    m.add_function(wrap_pyfunction!(mnist, m)?)?;
    m.add_function(wrap_pyfunction!(images, m)?)?;
    m.add_function(wrap_pyfunction!(transform, m)?)?;
    m.add("FASHION_MNIST_DIR", data::FASHION_MNIST_DIR)?;
    m.add("FASHION_MNIST_HINT", data::FASHION_MNIST_HINT)?;
    Ok(())
}

/// Examples in memory: float32 features (each of ``sample_shape``) and integer labels in
/// ``0..classes``.
#[pyclass(name = "Dataset", module = "kiln.data", frozen)]
#[derive(Clone)]
pub(crate) struct PyDataset(pub(crate) Arc<Dataset>);

#[pymethods]
impl PyDataset {
    /// A dataset of ``features`` (``[n, ...]``) and ``labels`` (``[n]``) in ``0..classes``
    /// (by default one more than the largest label).
    #[new]
    #[pyo3(signature = (features, labels, classes = None))]
    fn new(
        features: &Bound<'_, PyAny>,
        labels: &Bound<'_, PyAny>,
        classes: Option<usize>,
    ) -> PyResult<PyDataset> {
        let x = match from_py(features)?.cast(kiln::ir::DType::F32) {
            Array::F32(a) => a,
            _ => unreachable!("cast to f32"),
        };
        let y = from_py(labels)?;
        if y.dtype().is_float() {
            return Err(PyTypeError::new_err("labels must be integers"));
        }
        let y = y.to_f64_vec().iter().map(|&v| v as i64).collect();
        Ok(PyDataset(Arc::new(kiln_ok(Dataset::new(x, y, classes))?)))
    }

    /// A dataset from two ``.npy`` files: features and labels.
    #[staticmethod]
    #[pyo3(signature = (features, labels, classes = None))]
    fn from_npy(features: PathBuf, labels: PathBuf, classes: Option<usize>) -> PyResult<PyDataset> {
        Ok(PyDataset(Arc::new(kiln_ok(data::npy(
            &features, &labels, classes,
        ))?)))
    }

    /// A dataset from a CSV file of numbers: the label in ``label_column`` (by default the
    /// last); a first line that is not numbers is a header.
    #[staticmethod]
    #[pyo3(signature = (path, label_column = None))]
    fn from_csv(path: PathBuf, label_column: Option<usize>) -> PyResult<PyDataset> {
        Ok(PyDataset(Arc::new(kiln_ok(data::csv(
            &path,
            label_column,
        ))?)))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// ``(features, label)`` of example ``i`` (negative counts from the end).
    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<(Py<PyAny>, i64)> {
        let n = self.0.len() as isize;
        let at = if i < 0 { i + n } else { i };
        if !(0..n).contains(&at) {
            return Err(PyIndexError::new_err(format!(
                "example {i} of a dataset of {n}"
            )));
        }
        let batch = self.0.batch(&[at as usize]);
        let mut x = batch.x;
        x.reshape_in_place(&self.0.sample_shape);
        Ok((to_py(py, x), self.0.labels[at as usize]))
    }

    /// The shape of one example.
    #[getter]
    fn sample_shape(&self) -> Vec<usize> {
        self.0.sample_shape.clone()
    }

    /// The number of classes.
    #[getter]
    fn classes(&self) -> usize {
        self.0.classes
    }

    /// Every label, as an int64 array.
    #[getter]
    fn labels(&self, py: Python<'_>) -> Py<PyAny> {
        to_py(py, self.0.all().y)
    }

    /// Every example, as a float32 array ``[n, ...sample_shape]``.
    #[getter]
    fn features(&self, py: Python<'_>) -> Py<PyAny> {
        to_py(py, self.0.all().x)
    }

    /// A shuffled split into ``(train, test)`` with ``test_fraction`` of the examples in test.
    #[pyo3(signature = (test_fraction, seed = 0))]
    fn split(&self, test_fraction: f64, seed: u64) -> PyResult<(PyDataset, PyDataset)> {
        let (a, b) = kiln_ok(self.0.split(test_fraction, seed))?;
        Ok((PyDataset(Arc::new(a)), PyDataset(Arc::new(b))))
    }

    /// The same examples seen with another shape of as many values (``[1, 8, 8]`` for the
    /// digits as images).
    fn reshape(&self, shape: Vec<usize>) -> PyResult<PyDataset> {
        let d = kiln_ok((*self.0).clone().with_sample_shape(&shape))?;
        Ok(PyDataset(Arc::new(d)))
    }

    fn __repr__(&self) -> String {
        format!(
            "Dataset({} examples of {:?}, {} classes)",
            self.0.len(),
            self.0.sample_shape,
            self.0.classes
        )
    }
}

/// The built-in digits: 1,797 examples of 64 pixels in [0, 1], labels 0..9.
#[pyfunction]
fn digits() -> PyResult<PyDataset> {
    Ok(PyDataset(Arc::new(kiln_ok(data::digits())?)))
}

/// ``(train, test, class_names)`` of an MNIST-format folder: images ``[1, h, w]`` in [0, 1].
/// A missing, truncated or corrupt file is an error naming it.
#[pyfunction]
fn mnist(dir: PathBuf) -> PyResult<(PyDataset, PyDataset, Vec<String>)> {
    let images = kiln_ok(data::mnist(&dir))?;
    Ok((
        PyDataset(Arc::new(images.train)),
        PyDataset(Arc::new(images.test)),
        images.class_names,
    ))
}

/// ``(train, test, source, class_names)``: the MNIST-format folder ``dir`` when given; else
/// Fashion-MNIST where Debian installs it; else the built-in digits as ``[1, 8, 8]`` images
/// (``source`` says which).
#[pyfunction]
#[pyo3(signature = (dir = None))]
fn images(dir: Option<PathBuf>) -> PyResult<(PyDataset, PyDataset, String, Vec<String>)> {
    let images = kiln_ok(data::images(dir.as_deref()))?;
    Ok((
        PyDataset(Arc::new(images.train)),
        PyDataset(Arc::new(images.test)),
        images.source.to_string(),
        images.class_names,
    ))
}

/// A per-example transform, applied by the loader (``kiln.data.Normalize`` and the others
/// make them).
#[pyclass(name = "Transform", module = "kiln.data", frozen)]
pub(crate) struct PyTransform {
    transform: Arc<dyn Transform>,
    description: String,
}

#[pymethods]
impl PyTransform {
    fn __repr__(&self) -> String {
        self.description.clone()
    }
}

/// A transform by kind: ``normalize`` (``mean``, ``std``: one value or one per channel),
/// ``random_crop`` (``padding``), ``random_horizontal_flip`` (``p``).
#[pyfunction]
#[pyo3(signature = (kind, mean = None, std = None, padding = 0, p = 0.5))]
fn transform(
    kind: &str,
    mean: Option<Vec<f32>>,
    std: Option<Vec<f32>>,
    padding: usize,
    p: f64,
) -> PyResult<PyTransform> {
    let (transform, description): (Arc<dyn Transform>, String) = match kind {
        "normalize" => {
            let (mean, std) = (mean.unwrap_or_default(), std.unwrap_or_default());
            let description = format!("Normalize(mean={mean:?}, std={std:?})");
            (Arc::new(Normalize { mean, std }), description)
        }
        "random_crop" => (
            Arc::new(RandomCrop { padding }),
            format!("RandomCrop(padding={padding})"),
        ),
        "random_horizontal_flip" => (
            Arc::new(RandomHorizontalFlip { p }),
            format!("RandomHorizontalFlip(p={p})"),
        ),
        other => return Err(PyTypeError::new_err(format!("no transform `{other}`"))),
    };
    Ok(PyTransform {
        transform,
        description,
    })
}

/// ``DataLoader(dataset, batch_size=32, shuffle=False, seed=0, drop_last=False,
/// transforms=[], prefetch=2, rank=0, world_size=1)``: batches of ``dataset`` as ``(x, y)``
/// numpy arrays, epoch after epoch. With ``shuffle``, epoch ``e`` uses the permutation seeded
/// ``seed + e`` (the same batches on every run). ``drop_last`` drops a last, smaller batch.
/// ``transforms`` (``kiln.data.Normalize``, ...) apply to each example, seeded per example
/// and epoch. ``prefetch`` batches are made ahead on a background thread (0: on demand). With
/// ``world_size`` > 1, each batch of ``batch_size`` is split into equal shares and this loader
/// yields share ``rank``, so that the ranks together see the global order (a batch size the
/// ranks cannot share is a ``KilnError``).
#[pyclass(name = "DataLoader", module = "kiln.data")]
pub(crate) struct PyDataLoader {
    pub(crate) loader: DataLoader,
    epoch: usize,
}

#[pymethods]
impl PyDataLoader {
    #[new]
    #[pyo3(signature = (
        dataset, batch_size = 32, shuffle = false, seed = 0, drop_last = false,
        transforms = Vec::new(), prefetch = 2, rank = 0, world_size = 1
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dataset: &PyDataset,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
        drop_last: bool,
        transforms: Vec<PyRef<'_, PyTransform>>,
        prefetch: usize,
        rank: usize,
        world_size: usize,
    ) -> PyResult<PyDataLoader> {
        let mut loader = DataLoader::new(dataset.0.clone(), batch_size)
            .drop_last(drop_last)
            .prefetch(prefetch);
        if shuffle {
            loader = loader.shuffle(seed);
        }
        for t in transforms {
            loader = loader.transform(t.transform.clone());
        }
        if world_size > 1 || rank > 0 {
            loader = kiln_ok(loader.shard(rank, world_size))?;
        }
        Ok(PyDataLoader { loader, epoch: 0 })
    }

    /// Batches per epoch.
    fn __len__(&self) -> usize {
        self.loader.len()
    }

    /// The next epoch's batches, ``(x, y)`` numpy arrays; each pass is the next epoch (its
    /// own shuffle), unless ``set_epoch`` says which.
    fn __iter__(&mut self) -> PyResult<PyBatches> {
        let batches = kiln_ok(self.loader.epoch(self.epoch))?;
        self.epoch += 1;
        Ok(PyBatches(std::sync::Mutex::new(batches)))
    }

    /// Makes the next pass epoch ``epoch`` (as PyTorch's ``DistributedSampler.set_epoch``).
    fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    /// The dataset batched.
    #[getter]
    fn dataset(&self) -> PyDataset {
        PyDataset(Arc::new(self.loader.dataset().clone()))
    }

    /// The number of examples in a (global) batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.loader.batch_size()
    }
}

/// One epoch's batches.
#[pyclass(name = "Batches", module = "kiln.data")]
pub(crate) struct PyBatches(std::sync::Mutex<Batches>);

#[pymethods]
impl PyBatches {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<(Py<PyAny>, Py<PyAny>)>> {
        let batches = self
            .0
            .get_mut()
            .map_err(|_| KilnError::new_err("a batch failed"))?;
        let next = py.detach(|| batches.next());
        match next {
            None => Ok(None),
            Some(batch) => {
                let batch = kiln_ok(batch)?;
                Ok(Some((to_py(py, batch.x), to_py(py, batch.y))))
            }
        }
    }

    fn __len__(&mut self) -> usize {
        self.0.get_mut().map_or(0, |b| b.len())
    }
}
