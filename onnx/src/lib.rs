//! ONNX import: an `.onnx` model becomes a Kiln [`Module`] — its main graph one function, with
//! symbolic dimensions for ONNX's named or unknown ones — and its initializers the module's
//! parameters. [`export`] is the way back: a function written as a model.
//!
//! ```no_run
//! let model = kiln_onnx::import("model.onnx".as_ref())?;
//! println!("{}", model.module); // the graph as Kiln's text IR
//! # Ok::<(), kiln_onnx::OnnxError>(())
//! ```
//!
//! The messages are decoded by [prost](https://docs.rs/prost) from structs generated once from
//! the vendored `onnx.proto` (`scripts/gen_onnx_proto.sh`): building needs no `protoc`.
//! Every node is converted by one function of [`ops`], found through one table; nodes whose
//! inputs are all known when importing (shape arithmetic, constants) are evaluated then, by the
//! reference interpreter, so `Shape → Gather → Concat → Reshape` chains become constants.

mod context;
mod error;
pub mod export;
mod import;
mod node;
pub mod ops;
#[allow(missing_docs, clippy::all, unreachable_pub)]
pub mod proto;
mod symbolic;
pub mod tensor;

pub use context::{Ctx, Fail};
pub use error::{OnnxError, OnnxResult, Unsupported};
pub use import::{IR_VERSIONS, NEWEST_OPSET};
pub use node::Node;

/// The `doc_string` of an `Identity` node that stands for Kiln's `stop_gradient`: an identity
/// to every runtime, read back by Kiln's importer as the op it was (ONNX has no such op), so
/// that an exported program imports as itself.
pub const STOP_GRADIENT_DOC: &str = "kiln: stop_gradient";

/// The `doc_string` of a `Gather` written from Kiln's `gather`, whose indices are already in
/// `[0, size)` (Kiln checks them): the importer does not wrap negative indices a second time.
pub const GATHER_IN_RANGE_DOC: &str = "kiln: gather, indices in range";

use kiln_backend::Array;
use kiln_ir::Module;
use prost::Message;
use std::collections::BTreeMap;
use std::path::Path;

/// An imported model.
#[derive(Debug, Clone)]
pub struct Model {
    /// The program: one function (named after the graph) and the parameters' declarations.
    pub module: Module,
    /// The parameters' values (the initializers), by state name.
    pub parameters: BTreeMap<String, Array>,
    /// The graph's inputs, in argument order (initializers excluded).
    pub inputs: Vec<String>,
    /// The graph's outputs, in result order.
    pub outputs: Vec<String>,
}

impl Model {
    /// The name of the function the graph became.
    pub fn function_name(&self) -> &str {
        self.module.functions[0].name()
    }

    /// The parameters as the state a run of the module starts from.
    pub fn state(&self) -> kiln_backend::StateStore {
        let mut state = kiln_backend::StateStore::new();
        for (name, value) in &self.parameters {
            state.insert(name.clone(), value.clone());
        }
        state
    }
}

/// Writes an ONNX test case as the backend node tests lay one out: `DIR/model.onnx` and
/// `DIR/test_data_set_0/{input,output}_<i>.pb`.
pub fn write_test_case(
    dir: &Path,
    model: &[u8],
    inputs: &[Array],
    outputs: &[Array],
) -> std::io::Result<()> {
    let data = dir.join("test_data_set_0");
    std::fs::create_dir_all(&data)?;
    std::fs::write(dir.join("model.onnx"), model)?;
    for (kind, arrays) in [("input", inputs), ("output", outputs)] {
        for (i, a) in arrays.iter().enumerate() {
            let name = format!("{kind}_{i}");
            std::fs::write(data.join(format!("{name}.pb")), encode_tensor(a, &name))?;
        }
    }
    Ok(())
}

/// Reads and imports the model at `path` (external data is read beside it).
pub fn import(path: &Path) -> OnnxResult<Model> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Read {
        path: path.to_owned(),
        source,
    })?;
    import_bytes(&bytes, path.parent())
}

/// Imports a serialized model; `base` is the folder external data is read from.
pub fn import_bytes(bytes: &[u8], base: Option<&Path>) -> OnnxResult<Model> {
    import_fixing(bytes, base, &BTreeMap::new())
}

/// Like [`import_bytes`], with some graph inputs fixed to values: they become constants of
/// the program (not arguments), so shapes, axes or pads fed as inputs are known when importing.
pub fn import_fixing(
    bytes: &[u8],
    base: Option<&Path>,
    fixed: &BTreeMap<String, Array>,
) -> OnnxResult<Model> {
    let model = decode_model(bytes)?;
    import::import_model(&model, base, fixed)
}

/// Decodes a serialized `ModelProto`.
pub fn decode_model(bytes: &[u8]) -> OnnxResult<proto::ModelProto> {
    proto::ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))
}

/// Serializes a `ModelProto` (for tools that edit models: `kiln fuzz`).
pub fn encode_model(model: &proto::ModelProto) -> Vec<u8> {
    model.encode_to_vec()
}

/// Serializes an array as a `TensorProto` named `name` (a `.pb` file of ONNX's test data).
pub fn encode_tensor(array: &Array, name: &str) -> Vec<u8> {
    tensor::from_array(array, name).encode_to_vec()
}

/// Decodes a serialized `TensorProto` (the `.pb` files of ONNX's test data) into an array.
pub fn decode_tensor(bytes: &[u8]) -> OnnxResult<Array> {
    let t = proto::TensorProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))?;
    tensor::to_array(&t, None).map_err(OnnxError::Invalid)
}
