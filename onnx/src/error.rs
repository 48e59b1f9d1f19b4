//! Why a model could not be imported.

use std::path::PathBuf;

/// A model that could not be read or imported. Every variant says what and where; nothing in
/// the importer panics on a hostile file.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not an ONNX protobuf message.
    #[error("not a valid ONNX model (protobuf decoding failed: {0})")]
    Decode(String),
    /// The model is well-formed protobuf but breaks ONNX's rules (or Kiln's limits).
    #[error("invalid model: {0}")]
    Invalid(String),
    /// Nodes whose op (or op version, or attribute) Kiln does not support; every one is listed.
    #[error("{} unsupported node{}:\n{}", .0.len(), if .0.len() == 1 { "" } else { "s" },
        .0.iter().map(|u| format!("  {u}")).collect::<Vec<_>>().join("\n"))]
    Unsupported(Vec<Unsupported>),
    /// A node that Kiln supports could not be converted (bad shapes, types or attributes).
    #[error("node {node}: {message}")]
    Node {
        /// The node: its name, op type and opset.
        node: String,
        /// What is wrong.
        message: String,
    },
}

/// One node Kiln cannot import, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The node's name (or its index when it has none).
    pub name: String,
    /// Its op type, with its domain when not the default.
    pub op_type: String,
    /// The opset version in force for its domain.
    pub opset: i64,
    /// Why: an unknown op, or what about this node is not supported.
    pub reason: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, opset {}): {}",
            self.name, self.op_type, self.opset, self.reason
        )
    }
}

/// The importer's result type.
pub type OnnxResult<T> = Result<T, OnnxError>;
