//! An ONNX graph under construction: unique tensor names for Kiln's values, nodes, constants,
//! and the shape tensors that symbolic dimensions need at run time.

use super::composites::{self, Composites};
use crate::proto::attribute_proto::AttributeType;
use crate::proto::tensor_shape_proto::{Dimension, dimension};
use crate::proto::type_proto::{self, Tensor};
use crate::proto::{
    AttributeProto, GraphProto, NodeProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use crate::tensor;
use kiln_backend::StateStore;
use kiln_ir::print::ValueNames;
use kiln_ir::{Dim, Function, Literal, Region, Shape, Symbol, Type, Value};
use std::collections::{HashMap, HashSet};

/// The graph being written for one function (its subgraphs share the builder's names).
pub(super) struct Graph<'f> {
    pub(super) func: &'f Function,
    pub(super) opset: i64,
    printed: ValueNames,
    names: HashMap<Value, String>,
    used: HashSet<String>,
    pub(super) nodes: Vec<NodeProto>,
    /// A 1-element i64 tensor holding each symbol's size, read off a graph input's shape.
    symbol_sizes: HashMap<Symbol, String>,
    /// The nodes reading the symbols' sizes, which head the main graph.
    prelude: Vec<NodeProto>,
    /// Where each symbol can be read: a graph input's name and the axis.
    symbol_sources: HashMap<Symbol, (String, usize)>,
    /// The values of the states the function reads.
    states: &'f StateStore,
    /// The states read so far, as initializers (named after their states).
    pub(super) initializers: Vec<TensorProto>,
    loaded: HashMap<String, String>,
    /// The tensor each state written at the top level was last given (`store`).
    pub(super) stored: HashMap<String, String>,
    /// The instruction groups written as one ONNX op.
    pub(super) composites: Composites,
}

impl<'f> Graph<'f> {
    pub(super) fn new(func: &'f Function, opset: i64, states: &'f StateStore) -> Graph<'f> {
        Graph {
            func,
            opset,
            printed: ValueNames::new(func),
            names: HashMap::new(),
            used: HashSet::new(),
            nodes: Vec::new(),
            symbol_sizes: HashMap::new(),
            prelude: Vec::new(),
            symbol_sources: HashMap::new(),
            states,
            initializers: Vec::new(),
            loaded: HashMap::new(),
            stored: HashMap::new(),
            composites: composites::find(func, opset),
        }
    }

    /// A tensor name not used yet, `hint` itself when it is free.
    pub(super) fn fresh(&mut self, hint: &str) -> String {
        crate::context::unique_name(&mut self.used, hint)
    }

    /// The tensor that holds `v`: its IR name, made unique on first use.
    pub(super) fn name(&mut self, v: Value) -> String {
        if let Some(name) = self.names.get(&v) {
            return name.clone();
        }
        let hint = self.printed.get(v)[1..].to_owned();
        let name = self.fresh(&hint);
        self.names.insert(v, name.clone());
        name
    }

    /// Makes `v` another name for the tensor `name` (a fused region's argument, a state's
    /// initializer).
    pub(super) fn alias(&mut self, v: Value, name: String) {
        self.names.insert(v, name);
    }

    /// The initializer holding state `state` (of type `ty`), written on its first load.
    pub(super) fn load(&mut self, state: &str, ty: &Type) -> Result<String, String> {
        if let Some(name) = self.loaded.get(state) {
            return Ok(name.clone());
        }
        let value = (self.states.get(state))
            .ok_or_else(|| format!("state {state} has no value to export"))?;
        if value.ty() != *ty {
            return Err(format!(
                "state {state} holds {}, but the program reads it as {ty}",
                value.ty()
            ));
        }
        let name = self.fresh(state);
        self.initializers.push(tensor::from_array(value, &name));
        self.loaded.insert(state.to_owned(), name.clone());
        Ok(name)
    }

    /// Makes the loads of `state` read the graph input `name` instead of an initializer (a
    /// state the function writes is an input and an output).
    pub(super) fn state_input(&mut self, state: &str, name: &str) {
        self.loaded.insert(state.to_owned(), name.to_owned());
    }

    /// Forgets the tensor names of the values `region` defines, so that writing it again
    /// (a loop's condition, inside the loop's body) defines new tensors.
    pub(super) fn forget_region(&mut self, region: Region) {
        let func = self.func;
        for &a in &func.region(region).args {
            self.names.remove(&a);
        }
        for &inst in &func.region(region).insts {
            for &r in &func.inst(inst).results {
                self.names.remove(&r);
            }
            for &inner in &func.inst(inst).regions {
                self.forget_region(inner);
            }
        }
    }

    /// Notes that symbol dimensions of `ty` can be read off graph input `name`.
    pub(super) fn note_symbols(&mut self, name: &str, ty: &Type) {
        for (axis, dim) in ty.shape.dims().iter().enumerate() {
            if let Dim::Sym(s) = dim {
                (self.symbol_sources.entry(s.clone())).or_insert((name.to_owned(), axis));
            }
        }
    }

    /// Appends a node of the default domain; its name is its first output's.
    pub(super) fn node(
        &mut self,
        op: &str,
        inputs: &[&str],
        outputs: &[&str],
        attribute: Vec<AttributeProto>,
    ) {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name: Some(format!("{op}:{}", outputs.first().copied().unwrap_or(""))),
            op_type: Some(op.to_owned()),
            attribute,
            ..NodeProto::default()
        });
    }

    /// Gives the last node written `doc` as its `doc_string`.
    pub(super) fn document_last(&mut self, doc: &str) {
        if let Some(node) = self.nodes.last_mut() {
            node.doc_string = Some(doc.to_owned());
        }
    }

    /// A node with one fresh output named after `hint`; returns the output.
    pub(super) fn op(
        &mut self,
        op: &str,
        inputs: &[&str],
        hint: &str,
        attribute: Vec<AttributeProto>,
    ) -> String {
        let out = self.fresh(hint);
        self.node(op, inputs, &[&out], attribute);
        out
    }

    /// A `Constant` node holding `tensor`.
    pub(super) fn constant(&mut self, hint: &str, tensor: TensorProto) -> String {
        self.op("Constant", &[], hint, vec![attr_tensor("value", tensor)])
    }

    /// A 1-D i64 constant.
    pub(super) fn ints(&mut self, values: &[i64]) -> String {
        let literal = Literal::I64(values.to_vec());
        let ty = Type::new(kiln_ir::DType::I64, Shape::fixed(&[values.len()]));
        self.constant("ints", tensor::from_literal(&literal, &ty, None))
    }

    /// A 1-D i64 tensor of `shape`'s sizes: a constant when static, else built at run time
    /// from the graph inputs that carry its symbols.
    pub(super) fn shape_tensor(&mut self, shape: &Shape) -> Result<String, String> {
        if let Some(dims) = shape.as_fixed() {
            return Ok(self.ints(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>()));
        }
        let mut parts = Vec::new();
        for dim in shape.dims() {
            parts.push(match dim {
                Dim::Fixed(n) => self.ints(&[*n as i64]),
                Dim::Sym(s) => self.symbol_size(s)?,
            });
        }
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        Ok(self.op("Concat", &parts, "shape", vec![attr_int("axis", 0)]))
    }

    /// The 1-element i64 tensor holding symbol `s`'s size (`Shape` of an input, one axis).
    pub(super) fn symbol_size(&mut self, s: &Symbol) -> Result<String, String> {
        if let Some(name) = self.symbol_sizes.get(s) {
            return Ok(name.clone());
        }
        let Some((input, axis)) = self.symbol_sources.get(s).cloned() else {
            return Err(format!("the size {s} is not a dimension of any argument"));
        };
        let axis = axis as i64;
        let attrs = vec![attr_int("start", axis), attr_int("end", axis + 1)];
        // Written at the top of the main graph, whichever subgraph asks first, so that every
        // later use — in any graph — sees it.
        let name = self.op("Shape", &[&input], &format!("size_{s}"), attrs);
        let node = self.nodes.pop().expect("just written");
        self.prelude.push(node);
        self.symbol_sizes.insert(s.clone(), name.clone());
        Ok(name)
    }

    /// The main graph's nodes: the symbols' sizes first, then the function's.
    pub(super) fn main_nodes(&mut self) -> Vec<NodeProto> {
        let mut nodes = std::mem::take(&mut self.prelude);
        nodes.append(&mut self.nodes);
        nodes
    }

    /// The graph's nodes taken, leaving the builder's names (a subgraph's nodes).
    pub(super) fn take_nodes(&mut self) -> Vec<NodeProto> {
        std::mem::take(&mut self.nodes)
    }
}

/// A graph input or output: its name and Kiln type, symbolic sizes as named dimensions.
pub(super) fn value_info(name: &str, ty: &Type) -> ValueInfoProto {
    let dim = (ty.shape.dims().iter())
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Fixed(n) => dimension::Value::DimValue(*n as i64),
                Dim::Sym(s) => dimension::Value::DimParam(s.as_str().to_owned()),
            }),
            ..Dimension::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_owned()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(Tensor {
                elem_type: Some(tensor::elem_type(ty.dtype)),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..TypeProto::default()
        }),
        ..ValueInfoProto::default()
    }
}

/// A graph of `nodes` with `inputs` and `outputs`.
pub(super) fn graph_proto(
    name: &str,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    outputs: Vec<ValueInfoProto>,
) -> GraphProto {
    GraphProto {
        node: nodes,
        name: Some(name.to_owned()),
        input: inputs,
        output: outputs,
        ..GraphProto::default()
    }
}

fn attr(name: &str, kind: AttributeType) -> AttributeProto {
    AttributeProto {
        name: Some(name.to_owned()),
        r#type: Some(kind as i32),
        ..AttributeProto::default()
    }
}

pub(super) fn attr_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        i: Some(i),
        ..attr(name, AttributeType::Int)
    }
}

pub(super) fn attr_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        ints: ints.to_vec(),
        ..attr(name, AttributeType::Ints)
    }
}

pub(super) fn attr_float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        f: Some(f),
        ..attr(name, AttributeType::Float)
    }
}

pub(super) fn attr_string(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        s: Some(s.as_bytes().to_vec()),
        ..attr(name, AttributeType::String)
    }
}

pub(super) fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto {
        t: Some(t),
        ..attr(name, AttributeType::Tensor)
    }
}

pub(super) fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        g: Some(g),
        ..attr(name, AttributeType::Graph)
    }
}
