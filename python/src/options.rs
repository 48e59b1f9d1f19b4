//! Options of layers and functions from Python keyword arguments: sizes, pairs (an int for
//! both spatial axes, or a tuple), numbers, and the attributes built from them.

use kiln::ir::{Conv2dAttrs, Pool2dAttrs};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A `ValueError` unless batch norm's `momentum` is in [0, 1] and its `eps` 0 or more (NaN
/// is neither).
pub(crate) fn check_batch_norm(momentum: f64, eps: f64) -> PyResult<()> {
    if (0.0..=1.0).contains(&momentum) && (0.0..=f64::INFINITY).contains(&eps) {
        return Ok(());
    }
    Err(pyo3::exceptions::PyValueError::new_err(format!(
        "batch_norm: momentum {momentum} must be in [0, 1] and eps {eps} 0 or more"
    )))
}

/// Reads a layer's or a function's options (a dict of sizes, pairs and numbers).
pub(crate) struct Options<'a, 'py> {
    pub(crate) kind: &'a str,
    pub(crate) dict: Option<&'a Bound<'py, PyDict>>,
}

impl Options<'_, '_> {
    pub(crate) fn value(&self, key: &str) -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(match self.dict {
            Some(d) => d.get_item(key)?.filter(|v| !v.is_none()),
            None => None,
        })
    }

    pub(crate) fn size(&self, key: &str) -> PyResult<usize> {
        let kind = self.kind;
        self.value(key)?
            .ok_or_else(|| PyTypeError::new_err(format!("`{kind}` needs `{key}`")))?
            .extract()
    }

    /// An int for both spatial axes, or a pair.
    pub(crate) fn pair(&self, key: &str, default: [usize; 2]) -> PyResult<[usize; 2]> {
        match self.value(key)? {
            None => Ok(default),
            Some(v) => match v.extract::<usize>() {
                Ok(n) => Ok([n, n]),
                Err(_) => v.extract::<(usize, usize)>().map(|(a, b)| [a, b]),
            },
        }
    }

    /// A bool, `false` when left out.
    pub(crate) fn flag(&self, key: &str) -> PyResult<bool> {
        self.value(key)?.map_or(Ok(false), |v| v.extract())
    }

    pub(crate) fn float(&self, key: &str, default: f64) -> PyResult<f64> {
        self.value(key)?.map_or(Ok(default), |v| v.extract())
    }

    pub(crate) fn conv2d(&self) -> PyResult<Conv2dAttrs> {
        let padding = self.pair("padding", [0, 0])?;
        Ok(Conv2dAttrs {
            strides: self.pair("stride", [1, 1])?,
            padding: [(padding[0], padding[0]), (padding[1], padding[1])],
            dilation: self.pair("dilation", [1, 1])?,
            groups: self.value("groups")?.map_or(Ok(1), |v| v.extract())?,
            channels_last: false,
        })
    }

    /// A pooling window: `kernel_size`, `stride` (the window by default), `padding`.
    pub(crate) fn pool2d(&self) -> PyResult<Pool2dAttrs> {
        let window = self.pair("kernel_size", [2, 2])?;
        let padding = self.pair("padding", [0, 0])?;
        let mut attrs = Pool2dAttrs::new(window, self.pair("stride", window)?);
        attrs.padding = [(padding[0], padding[0]), (padding[1], padding[1])];
        Ok(attrs)
    }
}
