//! ONNX export: a Kiln function written as an ONNX model, the states it reads as initializers.
//!
//! Kiln's programs are static, typed and built from a small op set, so export is a printer:
//! each instruction becomes one node or a few ([`ops`]), symbolic sizes stay named dynamic
//! axes, `cond` and `while` become `If` and `Loop`, fused regions are written op by op, and
//! matrix products become `Gemm`; the groups Kiln makes of `Gemm` with a bias, `Conv` with a
//! bias, `LayerNormalization` and (from opset 23) `Attention` are written back as those ops
//! ([`composites`]), its unrolled LSTM and GRU layers as `LSTM` and `GRU` ([`recurrent`]); a
//! broadcast that ONNX's operands broadcast anyway is left to them. A
//! state the function only reads is an initializer; a state it writes (a KV cache, a
//! training step's parameters) is an input, its value when called, and an output
//! `<state>_next` after the results, its value stored: ONNX graphs hold no state. What ONNX
//! cannot express — a custom op, a collective, a random draw, a gradient-only op — is
//! refused with the instruction's line.
//!
//! ```
//! let module = kiln_ir::parse_and_verify(
//!     "module {
//!        state @w : f32[3,2] = uniform(low=-1.0, high=1.0, seed=1)
//!        func @predict(%x: f32[N,3]) -> f32[N,2] {
//!          %w = load @w : f32[3,2]
//!          %y = matmul %x, %w : f32[N,2]
//!          return %y
//!        }
//!      }",
//! )
//! .unwrap();
//! let state = kiln_backend::StateStore::initialize(&module).unwrap();
//! let model = kiln_onnx::export::export(&module, "predict", &state, &Default::default())?;
//! assert_eq!(model.graph.unwrap().node[0].op_type.as_deref(), Some("Gemm"));
//! # Ok::<(), kiln_onnx::export::ExportError>(())
//! ```

mod composites;
mod graph;
mod ops;
mod recurrent;

use crate::import::NEWEST_OPSET;
use crate::proto::{ModelProto, OperatorSetIdProto, StringStringEntryProto, TensorProto};
use graph::{Graph, graph_proto, value_info};
use kiln_backend::StateStore;
use kiln_ir::print::inst_line;
use kiln_ir::{Function, Inst, Module};
use prost::Message;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The oldest opset Kiln writes.
pub const OLDEST_EXPORT_OPSET: i64 = 17;

/// The opset written unless another is asked for: the one onnxruntime, TensorRT and OpenVINO
/// all read.
pub const DEFAULT_EXPORT_OPSET: i64 = 18;

/// Initializers of more bytes than this in all go to a file beside the model (protobuf's
/// messages end at 2 GiB; the rest of the graph needs room too).
pub const EXTERNAL_DATA_ABOVE: u64 = (1 << 31) - (1 << 27);

/// How a model is written.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// The opset, from [`OLDEST_EXPORT_OPSET`] to the newest Kiln imports.
    pub opset: i64,
    /// Initializers of more bytes in all are written as external data (`MODEL.onnx.data`).
    pub external_data_above: u64,
}

impl Default for ExportOptions {
    fn default() -> ExportOptions {
        ExportOptions {
            opset: DEFAULT_EXPORT_OPSET,
            external_data_above: EXTERNAL_DATA_ABOVE,
        }
    }
}

/// Why a function could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The program has no function of that name.
    #[error("the program has no function @{0}")]
    NoFunction(String),
    /// The function writes a state the program does not declare.
    #[error("the program declares no state @{0}")]
    NoState(String),
    /// The opset asked for is outside what Kiln writes.
    #[error(
        "opset {0} cannot be written: Kiln exports opsets {OLDEST_EXPORT_OPSET} to {NEWEST_OPSET}"
    )]
    Opset(i64),
    /// An instruction ONNX cannot express.
    #[error("cannot export `{line}` ({at}): {reason}")]
    Refused {
        /// The instruction as one line of IR.
        line: String,
        /// Where it came from (its line and column in the IR text, or its ONNX node).
        at: String,
        /// What ONNX lacks.
        reason: String,
    },
    /// A file could not be written (nothing is left behind).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why an op could not be written: its own reason, or a refusal inside its regions.
pub(crate) enum Why {
    Reason(String),
    Nested(ExportError),
}

impl From<String> for Why {
    fn from(reason: String) -> Why {
        Why::Reason(reason)
    }
}

impl From<&str> for Why {
    fn from(reason: &str) -> Why {
        Why::Reason(reason.to_owned())
    }
}

impl From<ExportError> for Why {
    fn from(e: ExportError) -> Why {
        Why::Nested(e)
    }
}

/// The refusal of `inst`, with its line and location.
fn refusal(func: &Function, inst: Inst, why: Why) -> ExportError {
    match why {
        Why::Nested(e) => e,
        Why::Reason(reason) => ExportError::Refused {
            line: inst_line(func, inst),
            at: func.inst(inst).loc.to_string(),
            reason,
        },
    }
}

/// Writes function `func` of `module` as an ONNX model; `state` holds the values of the states
/// it reads (which become initializers).
pub fn export(
    module: &Module,
    func: &str,
    state: &StateStore,
    options: &ExportOptions,
) -> Result<ModelProto, ExportError> {
    if !(OLDEST_EXPORT_OPSET..=NEWEST_OPSET).contains(&options.opset) {
        return Err(ExportError::Opset(options.opset));
    }
    let function = (module.function(func)).ok_or_else(|| ExportError::NoFunction(func.into()))?;
    let mut g = Graph::new(function, options.opset, state);
    let mut inputs = Vec::new();
    for &arg in function.args() {
        let name = g.name(arg);
        let ty = function.value_type(arg);
        g.note_symbols(&name, ty);
        inputs.push(value_info(&name, ty));
    }
    let written = written_states(function);
    for state in &written {
        let decl = (module.state(state)).ok_or_else(|| ExportError::NoState(state.clone()))?;
        let name = g.fresh(state);
        g.state_input(state, &name);
        inputs.push(value_info(&name, &decl.ty));
    }
    let yielded = ops::emit_region(&mut g, function.body())?;
    let mut outputs = graph_outputs(&mut g, &inputs, yielded);
    for state in &written {
        let decl = module.state(state).expect("checked above");
        let last = g.stored[state].clone();
        let next = g.op("Identity", &[&last], &format!("{state}_next"), vec![]);
        outputs.push(value_info(&next, &decl.ty));
    }
    let mut graph = graph_proto(func, g.main_nodes(), inputs, outputs);
    graph.initializer = std::mem::take(&mut g.initializers);
    Ok(ModelProto {
        ir_version: Some(ir_version(options.opset)),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(options.opset),
        }],
        producer_name: Some("kiln".into()),
        producer_version: Some(env!("CARGO_PKG_VERSION").into()),
        graph: Some(graph),
        ..ModelProto::default()
    })
}

/// The states `func` stores at its top level, in the order of their first stores: the
/// exported model's last inputs and outputs, in this order.
pub fn written_states(func: &Function) -> Vec<String> {
    let mut written: Vec<String> = Vec::new();
    for &inst in &func.region(func.body()).insts {
        if let kiln_ir::Op::Store { state } = &func.inst(inst).op
            && !written.contains(state)
        {
            written.push(state.clone());
        }
    }
    written
}

/// The graph's outputs: the function's results, each through an `Identity` where its tensor
/// is a graph input, an initializer or an earlier output (an output must be its own tensor).
fn graph_outputs(
    g: &mut Graph,
    inputs: &[crate::proto::ValueInfoProto],
    yielded: Vec<String>,
) -> Vec<crate::proto::ValueInfoProto> {
    let mut taken: HashSet<String> = (inputs.iter().filter_map(|i| i.name.clone()))
        .chain(g.initializers.iter().filter_map(|t| t.name.clone()))
        .collect();
    let results = g.func.results().to_vec();
    let mut outputs = Vec::new();
    for (v, mut name) in results.into_iter().zip(yielded) {
        if !taken.insert(name.clone()) {
            name = g.op("Identity", &[&name], &format!("{name}_out"), vec![]);
            taken.insert(name.clone());
        }
        outputs.push(value_info(&name, g.func.value_type(v)));
    }
    outputs
}

/// The IR version that goes with an opset (onnx's `VERSION_TABLE`).
fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=18 => 8,
        19..=20 => 9,
        21..=22 => 10,
        _ => 11,
    }
}

/// Exports `func` (as [`export`]) and writes the model to `path`, its initializers beside it
/// in `PATH.data` when they pass [`ExportOptions::external_data_above`]. Either every file is
/// written or none is.
pub fn export_to_file(
    module: &Module,
    func: &str,
    state: &StateStore,
    path: &Path,
    options: &ExportOptions,
) -> Result<(), ExportError> {
    let mut model = export(module, func, state, options)?;
    save(&mut model, path, options.external_data_above)
}

/// Writes `model` to `path` through a temporary file renamed into place.
fn save(model: &mut ModelProto, path: &Path, external_above: u64) -> Result<(), ExportError> {
    let graph = model.graph.as_mut().expect("an exported model has a graph");
    let bytes: u64 = (graph.initializer.iter())
        .map(|t| t.raw_data.as_ref().map_or(0, |r| r.len() as u64))
        .sum();
    let data_path = PathBuf::from(format!("{}.data", path.display()));
    let data = match bytes > external_above {
        true => Some(move_to_external(&mut graph.initializer, &data_path)),
        false => None,
    };
    if let Some(data) = &data {
        write_atomically(&data_path, data)?;
    }
    write_atomically(path, &model.encode_to_vec()).inspect_err(|_| {
        if data.is_some() {
            let _ = std::fs::remove_file(&data_path);
        }
    })
}

/// Moves every initializer's bytes into one buffer, the tensors pointing at their ranges of
/// `data_path` (named relative to the model's folder).
fn move_to_external(initializers: &mut [TensorProto], data_path: &Path) -> Vec<u8> {
    let location = data_path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into());
    let mut data = Vec::new();
    for t in initializers {
        let raw = t.raw_data.take().unwrap_or_default();
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: Some(key.into()),
            value: Some(value),
        };
        t.external_data = vec![
            entry("location", location.clone()),
            entry("offset", data.len().to_string()),
            entry("length", raw.len().to_string()),
        ];
        t.data_location = Some(1); // EXTERNAL
        data.extend_from_slice(&raw);
    }
    data
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ExportError> {
    let failed = |source| ExportError::Write {
        path: path.to_owned(),
        source,
    };
    let partial = PathBuf::from(format!("{}.partial", path.display()));
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&partial);
            failed(e)
        })
}
