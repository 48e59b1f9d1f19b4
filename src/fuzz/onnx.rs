//! ONNX models in `kiln fuzz`: seed models (the ONNX node tests', the zoo's, the repository's
//! own) mutated on the wire — bits flipped, bytes cut, repeated or inserted — or as messages —
//! dims, attributes, element types, opsets and IR versions set to edge values, initializer
//! data cut, nodes deleted, repeated, reordered and rewired — then imported. A model that
//! imports goes through every command as a program does (its printed IR, `loc(...)` and all,
//! must parse back) and is run both ways from its initializers.

use super::{Fuzzer, MAX_IMPORTED_INSTS, commands, guarded};
use kiln_onnx::proto::tensor_shape_proto::dimension;
use kiln_onnx::proto::{GraphProto, ModelProto, ValueInfoProto, type_proto};
use kiln_runtime::Scope;
use std::path::PathBuf;

/// Seed models larger than this are left out: each mutant is imported, and a zoo model's full
/// weights would make a case take seconds.
const MAX_SEED_BYTES: u64 = 256 << 10;

/// Integers at the edges, for dims, attributes and versions.
const EDGE_INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    -2,
    7,
    65536,
    2147483647,
    -2147483648,
    4294967296,
    4611686018427387904,
    i64::MAX,
    i64::MIN,
];

/// Floats at the edges, for attributes and initializer data.
const EDGE_FLOATS: &[f32] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-45,
    1e30,
    -1e30,
    f32::MAX,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
];

/// The `.onnx` files under `paths` (files, or folders searched to any depth), at most
/// [`MAX_SEED_BYTES`] each, in sorted order, read.
pub(super) fn corpus(paths: &[PathBuf]) -> std::io::Result<Vec<Vec<u8>>> {
    let mut files = Vec::new();
    let mut pending: Vec<PathBuf> = paths.to_vec();
    while let Some(path) = pending.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                pending.push(entry?.path());
            }
        } else if path.extension().is_some_and(|e| e == "onnx")
            && path.metadata()?.len() <= MAX_SEED_BYTES
        {
            files.push(path);
        }
    }
    files.sort();
    files.iter().map(std::fs::read).collect()
}

impl Fuzzer {
    /// One mutant of a seed model, imported and, when it imports, driven like a program.
    pub(super) fn onnx_case(&mut self, case: u64) -> std::io::Result<()> {
        if self.models.is_empty() {
            return Ok(());
        }
        let seed = self.rng.pick(&self.models).clone();
        let bytes = match self.rng.chance(20) {
            true => self.mutated_bytes(seed),
            false => match kiln_onnx::decode_model(&seed) {
                Ok(mut model) => {
                    for _ in 0..1 + self.rng.below(2) {
                        self.mutate_model(&mut model);
                    }
                    kiln_onnx::encode_model(&model)
                }
                Err(_) => self.mutated_bytes(seed),
            },
        };
        std::fs::write(self.out.join("current.onnx"), &bytes)?;
        self.try_model(&bytes, &case.to_string());
        Ok(())
    }

    /// Imports `bytes`; on success, every command on the imported program and its function
    /// run both ways. Findings are named after `case`.
    pub(super) fn try_model(&mut self, bytes: &[u8], case: &str) {
        self.summary.models += 1;
        let name = format!("crash-{case}.onnx");
        let model = match guarded(|| kiln_onnx::import_bytes(bytes, None)) {
            Err(panic) => return self.found("panic in kiln import".into(), panic, name, bytes),
            Ok(Err(_)) => return,
            Ok(Ok(model)) => model,
        };
        self.summary.imported += 1;
        let insts: usize = (model.module.functions.iter())
            .map(|f| f.walk_insts().len())
            .sum();
        if insts > MAX_IMPORTED_INSTS {
            self.summary.too_costly += 1;
            return;
        }
        let text = match guarded(|| model.module.to_string()) {
            Err(panic) => return self.found("panic printing an import".into(), panic, name, bytes),
            Ok(text) => text,
        };
        let (failures, module) = guarded(|| commands(&text))
            .unwrap_or_else(|panic| (vec![("parse and verify".into(), panic)], None));
        for (what, detail) in failures {
            self.found(format!("{what} of an import"), detail, name.clone(), bytes);
        }
        let Some(module) = module else {
            let detail = format!("the imported program does not parse back:\n{text}");
            return self.found("kiln import".into(), detail, name, bytes);
        };
        let Ok(mut scope) = Scope::from_module(&module) else {
            return;
        };
        for (state, value) in &model.parameters {
            if let Err(e) = scope.set(state, value.clone()) {
                let detail = format!("initializer {state}: {e}");
                return self.found("an import's initializer".into(), detail, name, bytes);
            }
        }
        self.run_both_ways(&module, &scope, case, "onnx", bytes);
    }

    /// `seed` with a few bits flipped, or cut short, or a run of it repeated or replaced.
    fn mutated_bytes(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        if bytes.is_empty() {
            return bytes;
        }
        let at = self.rng.below(bytes.len());
        match self.rng.below(4) {
            0 => {
                for _ in 0..1 + self.rng.below(4) {
                    let at = self.rng.below(bytes.len());
                    bytes[at] ^= 1 << self.rng.below(8);
                }
            }
            1 => bytes.truncate(at),
            2 => {
                let end = (at + 1 + self.rng.below(16)).min(bytes.len());
                let run = bytes[at..end].to_vec();
                bytes.splice(at..at, run);
            }
            _ => bytes[at] = self.rng.next() as u8,
        }
        bytes
    }

    /// One edit of `model` as a message.
    fn mutate_model(&mut self, model: &mut ModelProto) {
        match self.rng.below(8) {
            0 => {
                let v = *self.rng.pick(&[0, 1, 6, 7, 13, 17, 18, 21, 28, 29, 999]);
                match model.opset_import.first_mut() {
                    Some(opset) if self.rng.chance(70) => opset.version = Some(v),
                    _ => model.ir_version = Some(*self.rng.pick(&[0, 2, 3, 7, 10, 14, 15, 99])),
                }
            }
            1 => self.mutate_dim(model),
            2 | 3 => self.mutate_attribute(model),
            4 => self.mutate_initializer(model),
            _ => {
                if let Some(graph) = model.graph.as_mut() {
                    self.edit_graph(graph);
                }
            }
        }
    }

    /// A dim of a graph input, output or initializer set to an edge value or made symbolic.
    fn mutate_dim(&mut self, model: &mut ModelProto) {
        let Some(graph) = model.graph.as_mut() else {
            return;
        };
        if self.rng.chance(30) && !graph.initializer.is_empty() {
            let t = self.rng.below(graph.initializer.len());
            let dims = &mut graph.initializer[t].dims;
            match dims.is_empty() {
                true => dims.push(*self.rng.pick(EDGE_INTS)),
                false => {
                    let d = self.rng.below(dims.len());
                    dims[d] = *self.rng.pick(EDGE_INTS);
                }
            }
            return;
        }
        let mut infos: Vec<&mut ValueInfoProto> =
            graph.input.iter_mut().chain(&mut graph.output).collect();
        if infos.is_empty() {
            return;
        }
        let at = self.rng.below(infos.len());
        let Some(type_proto::Value::TensorType(t)) =
            infos[at].r#type.as_mut().and_then(|t| t.value.as_mut())
        else {
            return;
        };
        if self.rng.chance(20) {
            t.elem_type = Some(self.rng.below(17) as i32);
            return;
        }
        let Some(shape) = t.shape.as_mut().filter(|s| !s.dim.is_empty()) else {
            return;
        };
        let d = self.rng.below(shape.dim.len());
        shape.dim[d].value = Some(match self.rng.chance(25) {
            true => dimension::Value::DimParam("N".into()),
            false => dimension::Value::DimValue(*self.rng.pick(EDGE_INTS)),
        });
    }

    /// An attribute of a node changed to an edge value, lengthened, shortened or removed.
    fn mutate_attribute(&mut self, model: &mut ModelProto) {
        let Some(graph) = model.graph.as_mut() else {
            return;
        };
        let with: Vec<usize> = (0..graph.node.len())
            .filter(|&n| !graph.node[n].attribute.is_empty())
            .collect();
        let Some(&n) = with.get(self.rng.below(with.len())) else {
            return;
        };
        let attrs = &mut graph.node[n].attribute;
        let at = self.rng.below(attrs.len());
        let a = &mut attrs[at];
        match self.rng.below(6) {
            0 => {
                attrs.remove(at);
            }
            1 => a.i = Some(*self.rng.pick(EDGE_INTS)),
            2 => a.f = Some(*self.rng.pick(EDGE_FLOATS)),
            3 if !a.ints.is_empty() => {
                let k = self.rng.below(a.ints.len());
                a.ints[k] = *self.rng.pick(EDGE_INTS);
            }
            3 | 4 => match self.rng.chance(50) {
                true => a.ints.push(*self.rng.pick(EDGE_INTS)),
                false => {
                    a.ints.pop();
                }
            },
            _ => a.r#type = Some(self.rng.below(15) as i32),
        }
    }

    /// An initializer's data cut, set to an edge value or retyped.
    fn mutate_initializer(&mut self, model: &mut ModelProto) {
        let Some(graph) = model.graph.as_mut().filter(|g| !g.initializer.is_empty()) else {
            return;
        };
        let at = self.rng.below(graph.initializer.len());
        let t = &mut graph.initializer[at];
        match self.rng.below(4) {
            0 => t.data_type = Some(self.rng.below(17) as i32),
            1 if !t.float_data.is_empty() => {
                let k = self.rng.below(t.float_data.len());
                t.float_data[k] = *self.rng.pick(EDGE_FLOATS);
            }
            1 if !t.int64_data.is_empty() => {
                let k = self.rng.below(t.int64_data.len());
                t.int64_data[k] = *self.rng.pick(EDGE_INTS);
            }
            _ => {
                // Each of the data fields cut to a random length (most are empty).
                if let Some(raw) = t.raw_data.as_mut() {
                    raw.truncate(self.rng.below(raw.len() + 1));
                }
                t.float_data
                    .truncate(self.rng.below(t.float_data.len() + 1));
                t.int64_data
                    .truncate(self.rng.below(t.int64_data.len() + 1));
            }
        }
    }

    /// A node deleted, repeated, moved, or one of its inputs or outputs renamed to another
    /// value of the graph (or to nothing), or its op replaced by another's.
    fn edit_graph(&mut self, graph: &mut GraphProto) {
        if graph.node.is_empty() {
            return;
        }
        let n = self.rng.below(graph.node.len());
        let names: Vec<String> = (graph.input.iter().filter_map(|i| i.name.clone()))
            .chain(graph.initializer.iter().filter_map(|t| t.name.clone()))
            .chain(graph.node.iter().flat_map(|node| node.output.clone()))
            .chain([String::new()])
            .collect();
        match self.rng.below(6) {
            0 => {
                graph.node.remove(n);
            }
            1 => {
                let copy = graph.node[n].clone();
                let at = self.rng.below(graph.node.len() + 1);
                graph.node.insert(at, copy);
            }
            2 => {
                let other = self.rng.below(graph.node.len());
                graph.node.swap(n, other);
            }
            3 if !graph.node[n].input.is_empty() => {
                let k = self.rng.below(graph.node[n].input.len());
                graph.node[n].input[k] = self.rng.pick(&names).clone();
            }
            3 | 4 if !graph.node[n].output.is_empty() => {
                let k = self.rng.below(graph.node[n].output.len());
                graph.node[n].output[k] = self.rng.pick(&names).clone();
            }
            _ => {
                let ops: Vec<&str> = kiln_onnx::ops::supported().collect();
                graph.node[n].op_type = Some(self.rng.pick(&ops).to_string());
            }
        }
    }
}
