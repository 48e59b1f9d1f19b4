//! `kiln.data`'s text for language models (`kiln::runtime::data::text`): corpora, tokenizers
//! and the `TextDataset` of token windows, whose batches arrive as int64 numpy arrays.

use crate::array::to_py;
use crate::errors::kiln_ok;
use kiln::runtime::data::text::{self, Corpus, TextDataset, TokenWindows, Tokenizer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCorpus>()?;
    m.add_class::<PyTokenizer>()?;
    m.add_class::<PyTextDataset>()?;
    m.add_function(wrap_pyfunction!(text_corpus, m)?)?;
    m.add_function(wrap_pyfunction!(sonnets, m)?)?;
    m.add("SHAKESPEARE_ARCHIVE", text::SHAKESPEARE_ARCHIVE)?;
    m.add("SHAKESPEARE_HINT", text::SHAKESPEARE_HINT)?;
    m.add("END_OF_TEXT", text::END_OF_TEXT)?;
    Ok(())
}

/// A text to train on: ``text``, the ``documents``' names in order, and its ``source``.
#[pyclass(name = "Corpus", module = "kiln.data", frozen)]
pub(crate) struct PyCorpus {
    text: String,
    documents: Vec<String>,
    source: String,
}

impl From<Corpus> for PyCorpus {
    fn from(c: Corpus) -> PyCorpus {
        PyCorpus {
            source: c.source.to_string(),
            text: c.text,
            documents: c.documents,
        }
    }
}

#[pymethods]
impl PyCorpus {
    /// The whole text: the documents in order, a blank line between two.
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// The documents' names (a play's file name without ``_gut.txt``), in order.
    #[getter]
    fn documents(&self) -> Vec<String> {
        self.documents.clone()
    }

    /// Where the text was read.
    #[getter]
    fn source(&self) -> &str {
        &self.source
    }

    fn __len__(&self) -> usize {
        self.text.len()
    }

    fn __repr__(&self) -> String {
        let (chars, docs) = (self.text.chars().count(), self.documents.len());
        format!(
            "Corpus({}: {docs} documents, {chars} characters)",
            self.source
        )
    }
}

/// ``path`` when given (the shakespeare archive, a folder holding it, or a UTF-8 text file);
/// else the plays in Kiln's data folder once downloaded; else the built-in sonnets.
#[pyfunction(name = "text")]
#[pyo3(signature = (path = None))]
fn text_corpus(py: Python<'_>, path: Option<PathBuf>) -> PyResult<PyCorpus> {
    kiln_ok(py.detach(|| text::text(path.as_deref()))).map(PyCorpus::from)
}

/// Shakespeare's 154 sonnets, built in.
#[pyfunction]
fn sonnets() -> PyResult<PyCorpus> {
    kiln_ok(text::sonnets()).map(PyCorpus::from)
}

/// Text to token ids and back: characters (``Tokenizer.chars(text)``) or byte-level BPE
/// (``Tokenizer.train_bpe(text, vocab_size)``), saved as JSON (Hugging Face's
/// ``tokenizer.json`` for BPE, which Python's ``tokenizers`` loads to the same ids).
#[pyclass(name = "Tokenizer", module = "kiln.data", frozen)]
pub(crate) struct PyTokenizer(Tokenizer);

#[pymethods]
impl PyTokenizer {
    /// One token per distinct character of ``text``, in code-point order.
    #[staticmethod]
    fn chars(text: &str) -> PyTokenizer {
        PyTokenizer(Tokenizer::chars(text))
    }

    /// Byte-level BPE with ``vocab_size`` tokens trained on ``text``'s lines.
    #[staticmethod]
    fn train_bpe(py: Python<'_>, text: &str, vocab_size: usize) -> PyResult<PyTokenizer> {
        kiln_ok(py.detach(|| Tokenizer::train_bpe(text, vocab_size))).map(PyTokenizer)
    }

    /// The tokenizer ``save`` wrote.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<PyTokenizer> {
        kiln_ok(Tokenizer::load(&path)).map(PyTokenizer)
    }

    /// The tokenizer of ``to_json``'s JSON (or a ``tokenizer.json``).
    #[staticmethod]
    fn from_json(json: &str) -> PyResult<PyTokenizer> {
        kiln_ok(Tokenizer::from_json(json)).map(PyTokenizer)
    }

    /// ``"chars"`` or ``"bpe"``.
    #[getter]
    fn kind(&self) -> &'static str {
        match self.0 {
            Tokenizer::Chars(_) => "chars",
            Tokenizer::Bpe(_) => "bpe",
        }
    }

    /// The number of ids.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    /// The ids of ``text``.
    fn encode(&self, py: Python<'_>, text: &str) -> PyResult<Vec<u32>> {
        kiln_ok(py.detach(|| self.0.encode(text)))
    }

    /// The text of ``ids``.
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        kiln_ok(self.0.decode(&ids))
    }

    /// The tokenizer as JSON.
    fn to_json(&self) -> PyResult<String> {
        kiln_ok(self.0.to_json())
    }

    /// Writes ``to_json`` to ``path``.
    fn save(&self, path: PathBuf) -> PyResult<()> {
        kiln_ok(self.0.save(&path))
    }

    fn __repr__(&self) -> String {
        format!(
            "Tokenizer({}, vocab_size={})",
            self.kind(),
            self.vocab_size()
        )
    }
}

/// Token ids for next-token prediction: the last ``validation_fraction`` validate, windows
/// of ``block_size``. ``get_batch("train", 12, seed, step)`` is nanoGPT's ``get_batch``,
/// drawn from ``(seed, step)``: the same batches every run, and a resumed run goes on alike.
#[pyclass(name = "TextDataset", module = "kiln.data", frozen)]
pub(crate) struct PyTextDataset(TextDataset);

impl PyTextDataset {
    fn split(&self, split: &str) -> PyResult<TokenWindows> {
        match split {
            "train" => Ok(self.0.train()),
            "val" | "validation" => Ok(self.0.validation()),
            other => Err(PyValueError::new_err(format!(
                "split {other:?}: it is \"train\" or \"val\""
            ))),
        }
    }
}

#[pymethods]
impl PyTextDataset {
    #[new]
    #[pyo3(signature = (tokens, block_size, validation_fraction = 0.1))]
    fn new(tokens: Vec<u32>, block_size: usize, validation_fraction: f64) -> PyResult<Self> {
        kiln_ok(TextDataset::new(tokens, block_size, validation_fraction)).map(PyTextDataset)
    }

    /// The window length.
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size()
    }

    /// How many tokens ``split`` (``"train"`` or ``"val"``) holds.
    fn tokens(&self, split: &str) -> PyResult<usize> {
        Ok(self.split(split)?.tokens().len())
    }

    /// Batch ``step`` of ``split``: ``x``, ``y`` int64 ``[batch_size, block_size]``, ``y`` one
    /// token later, at window starts drawn from ``(seed, step)``.
    #[pyo3(signature = (split, batch_size, seed = 0, step = 0))]
    fn get_batch(
        &self,
        py: Python<'_>,
        split: &str,
        batch_size: usize,
        seed: u64,
        step: u64,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let batch = kiln_ok(self.split(split)?.batch(batch_size, seed, step))?;
        Ok((to_py(py, batch.x), to_py(py, batch.y)))
    }

    /// ``split`` in consecutive windows, ``batch_size`` at a time: every token predicted once.
    fn sequential(
        &self,
        py: Python<'_>,
        split: &str,
        batch_size: usize,
    ) -> PyResult<Vec<(Py<PyAny>, Py<PyAny>)>> {
        let part = self.split(split)?;
        let batches = part.sequential(batch_size);
        Ok(batches.map(|b| (to_py(py, b.x), to_py(py, b.y))).collect())
    }

    fn __repr__(&self) -> String {
        let (train, val) = (self.0.train(), self.0.validation());
        format!(
            "TextDataset(train={} tokens, val={} tokens, block_size={})",
            train.tokens().len(),
            val.tokens().len(),
            self.0.block_size()
        )
    }
}
