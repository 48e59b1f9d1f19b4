//! A model's main graph converted node by node into one Kiln function.

use crate::context::{Ctx, Env, Fail, LARGEST_CONSTANT, Slot};
use crate::error::{OnnxError, OnnxResult, Unsupported};
use crate::node::Node;
use crate::proto::tensor_shape_proto::dimension;
use crate::proto::{GraphProto, ModelProto, NodeProto, ValueInfoProto, type_proto};
use crate::{Model, ops, symbolic, tensor};
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{
    Dim, FunctionBuilder, Loc, Module, Op, Shape, Type, Value, ValueDef, identifier, verify_module,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

/// The opset versions a model imports, by domain (`""` for the default `ai.onnx`).
struct Opsets(HashMap<String, i64>);

/// The newest opset of the default domain Kiln implements: that of the pinned `onnx` wheel
/// (1.23.2), whose node tests it passes. A newer opset may change an op's meaning.
pub const NEWEST_OPSET: i64 = 28;

/// The IR versions Kiln reads: from 3, the first with opset imports, to 14, the pinned `onnx`
/// wheel's.
pub const IR_VERSIONS: std::ops::RangeInclusive<i64> = 3..=14;

impl Opsets {
    fn of(model: &ModelProto) -> OnnxResult<Opsets> {
        let mut map = HashMap::new();
        for o in &model.opset_import {
            let domain = o.domain.clone().unwrap_or_default();
            let domain = if domain == "ai.onnx" {
                String::new()
            } else {
                domain
            };
            let version = o.version.unwrap_or(0);
            if domain.is_empty() && version > NEWEST_OPSET {
                return Err(OnnxError::Invalid(format!(
                    "the model imports opset {version} of the default domain; the newest Kiln \
                     implements is {NEWEST_OPSET}"
                )));
            }
            if map.insert(domain.clone(), version).is_some() {
                return Err(OnnxError::Invalid(format!(
                    "the model imports the domain {domain:?} twice"
                )));
            }
        }
        Ok(Opsets(map))
    }

    fn version(&self, domain: &str) -> Option<i64> {
        let domain = if domain == "ai.onnx" { "" } else { domain };
        self.0.get(domain).copied()
    }
}

/// Converts `model` (read from the folder `base`, where external data lives).
pub(crate) fn import_model(
    model: &ModelProto,
    base: Option<&Path>,
    fixed: &BTreeMap<String, Array>,
) -> OnnxResult<Model> {
    match model.ir_version {
        Some(v) if IR_VERSIONS.contains(&v) => {}
        v => {
            return Err(OnnxError::Invalid(format!(
                "the model's IR version is {}; Kiln reads versions {} to {}",
                v.map_or("not given".into(), |v| v.to_string()),
                IR_VERSIONS.start(),
                IR_VERSIONS.end()
            )));
        }
    }
    let opsets = Opsets::of(model)?;
    let graph = (model.graph.as_ref())
        .ok_or_else(|| OnnxError::Invalid("the model has no graph".into()))?;
    let name = function_name(graph.name.as_deref());
    let mut b = FunctionBuilder::new(&name);
    let mut env = Env::default();
    for t in &graph.initializer {
        let name = t.name.clone().unwrap_or_default();
        if env.slots.contains_key(&name) {
            return Err(OnnxError::Invalid(format!(
                "two initializers are named {name:?}"
            )));
        }
        let array = tensor::to_array(t, base)
            .map_err(|e| OnnxError::Invalid(format!("initializer {name:?}: {e}")))?;
        let slot = Slot::Known {
            array: Rc::new(array),
            value: None,
            initializer: true,
        };
        env.slots.insert(name, slot);
    }
    let mut inputs = Vec::new();
    let mut listed = HashSet::new();
    for input in &graph.input {
        let name = input.name.clone().unwrap_or_default();
        if !listed.insert(name.clone()) {
            return Err(OnnxError::Invalid(format!(
                "two graph inputs are named {name:?}"
            )));
        }
        if env.slots.contains_key(&name) {
            continue; // an initializer listed as an input (IR version < 4): a parameter
        }
        let ty = value_type(input).map_err(|e| match e {
            Fail::Unsupported(reason) => OnnxError::Unsupported(vec![Unsupported {
                name: format!("{name:?}"),
                op_type: "graph input".into(),
                opset: opsets.version("").unwrap_or(0),
                reason,
            }]),
            Fail::Invalid(m) => OnnxError::Invalid(format!("input {name:?}: {m}")),
        })?;
        if let Some(array) = fixed.get(&name) {
            check_fixed(&name, &ty, array)?;
            let slot = Slot::Known {
                array: Rc::new(array.clone()),
                value: None,
                initializer: false,
            };
            env.slots.insert(name, slot);
            continue;
        }
        let v = b.arg(&name, ty);
        env.slots.insert(name.clone(), Slot::Value(v));
        inputs.push(name);
    }
    convert_nodes(graph, &opsets, &mut b, &mut env)?;
    let mut results = Vec::new();
    let mut outputs = Vec::new();
    for output in &graph.output {
        let name = output.name.clone().unwrap_or_default();
        let v = env
            .value(&mut b, &name)
            .map_err(|e| OnnxError::Invalid(format!("graph output {name:?}: {}", message(e))))?;
        // A graph input given back as an output keeps its input's name.
        if !matches!(b.function().value(v).def, ValueDef::Arg(..)) {
            b.set_name(v, &name);
        }
        results.push(v);
        outputs.push(name);
    }
    let function = (b.finish(&results)).map_err(|e| OnnxError::Invalid(e.to_string()))?;
    let mut module = Module::new();
    let mut parameters = BTreeMap::new();
    for (decl, array) in env.states {
        parameters.insert(decl.name.clone(), array);
        module.states.push(decl);
    }
    module.add_function(function);
    verify_module(&module)
        .map_err(|e| OnnxError::Invalid(format!("the converted program does not verify: {e}")))?;
    Ok(Model {
        module,
        parameters,
        inputs,
        outputs,
    })
}

/// An input fixed at import must have the input's dtype and fit its shape.
fn check_fixed(name: &str, ty: &Type, array: &Array) -> OnnxResult<()> {
    let fits = ty.dtype == array.dtype()
        && ty.rank() == array.shape().len()
        && (ty.shape.dims().iter().zip(array.shape()))
            .all(|(d, &n)| d.as_fixed().is_none_or(|m| m == n));
    match fits {
        true => Ok(()),
        false => Err(OnnxError::Invalid(format!(
            "input {name:?} is {ty}; the value fixed for it is {}",
            array.ty()
        ))),
    }
}

fn message(fail: Fail) -> String {
    match fail {
        Fail::Invalid(m) | Fail::Unsupported(m) => m,
    }
}

/// The graph's name made a function name (`main` when it has none).
fn function_name(name: Option<&str>) -> String {
    match name.unwrap_or("") {
        "" => "main".into(),
        name => identifier(name, false, "g"),
    }
}

/// The Kiln type of a graph input: named dimensions become symbols, unknown ones a symbol
/// named after the input and axis.
fn value_type(info: &ValueInfoProto) -> Result<Type, Fail> {
    let name = info.name.as_deref().unwrap_or("");
    let Some(type_proto::Value::TensorType(t)) =
        info.r#type.as_ref().and_then(|t| t.value.as_ref())
    else {
        return Err(Fail::Unsupported("only tensor inputs are supported".into()));
    };
    let dtype = tensor::dtype(t.elem_type.unwrap_or(0)).map_err(Fail::Unsupported)?;
    let shape = (t.shape.as_ref()).ok_or_else(|| Fail::Invalid("the input has no shape".into()))?;
    let dims = (shape.dim.iter().enumerate())
        .map(|(axis, d)| match &d.value {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::Fixed(*v as usize),
            Some(dimension::Value::DimParam(p)) if !p.is_empty() => Dim::sym(&symbol(p)),
            _ => Dim::sym(&symbol(&format!("{name}_{axis}"))),
        })
        .collect();
    let ty = Type::new(dtype, Shape(dims));
    ty.check_addressable()
        .map_err(|e| Fail::Invalid(e.to_string()))?;
    Ok(ty)
}

fn symbol(name: &str) -> String {
    identifier(name, false, "d")
}

/// Converts every node in order; nodes that cannot be converted for lack of support are all
/// collected and reported together.
fn convert_nodes(
    graph: &GraphProto,
    opsets: &Opsets,
    b: &mut FunctionBuilder,
    env: &mut Env,
) -> OnnxResult<()> {
    let mut unsupported = Vec::new();
    for (index, proto) in graph.node.iter().enumerate() {
        let domain = proto.domain.as_deref().unwrap_or("");
        let label = node_label(proto, index);
        let opset = opsets.version(domain).unwrap_or(0);
        let node = Node { proto, opset };
        let outputs = &proto.output;
        let defined =
            |i: usize| env.slots.contains_key(&outputs[i]) || outputs[..i].contains(&outputs[i]);
        if let Some(name) = (0..outputs.len())
            .find(|&i| !outputs[i].is_empty() && defined(i))
            .map(|i| &outputs[i])
        {
            return Err(OnnxError::Node {
                node: format!("{label} ({}, opset {opset})", node.op_type()),
                message: format!(
                    "it writes {name:?}, which is already defined (by a graph input, an \
                     initializer or an earlier node): the graph is not in SSA form"
                ),
            });
        }
        let skip = |env: &mut Env| {
            for out in &proto.output {
                env.slots.insert(out.clone(), Slot::Missing);
            }
        };
        if proto
            .input
            .iter()
            .any(|i| matches!(env.slots.get(i), Some(Slot::Missing)))
        {
            skip(env);
            continue;
        }
        let reason = match (opsets.version(domain), ops::converter(node.op_type())) {
            (None, _) => Some(format!("domain {domain:?} is not imported by the model")),
            _ if !domain.is_empty() && domain != "ai.onnx" => {
                Some(format!("domain {domain:?} is not supported"))
            }
            (_, None) => Some("Kiln has no conversion for this op".into()),
            (Some(_), Some(_)) => None,
        };
        let result = match reason {
            Some(reason) => Err(Fail::Unsupported(reason)),
            None => {
                let start = b.current_len();
                let converted = convert_node(&node, b, env);
                b.relocate_since(start, source_loc(proto, index));
                converted
            }
        };
        match result {
            Ok(()) => {}
            Err(Fail::Unsupported(reason)) => {
                unsupported.push(Unsupported {
                    name: label,
                    op_type: qualified_op(proto),
                    opset,
                    reason,
                });
                skip(env);
            }
            Err(Fail::Invalid(message)) => {
                return Err(OnnxError::Node {
                    node: format!("{label} ({}, opset {opset})", node.op_type()),
                    message,
                });
            }
        }
    }
    match unsupported.is_empty() {
        true => Ok(()),
        false => Err(OnnxError::Unsupported(unsupported)),
    }
}

/// The location of the instructions node `index` becomes: its name (`#index` when it has
/// none) and op type.
fn source_loc(proto: &NodeProto, index: usize) -> Loc {
    let op = qualified_op(proto);
    match proto.name.as_deref() {
        Some(name) if !name.is_empty() => Loc::node(name, &op),
        _ => Loc::node(&format!("#{index}"), &op),
    }
}

/// The node's op type, with its domain when that is not the default one.
fn qualified_op(proto: &NodeProto) -> String {
    let op = proto.op_type.as_deref().unwrap_or("");
    match proto.domain.as_deref().unwrap_or("") {
        "" | "ai.onnx" => op.to_owned(),
        domain => format!("{domain}.{op}"),
    }
}

fn node_label(proto: &NodeProto, index: usize) -> String {
    match proto.name.as_deref() {
        Some(n) if !n.is_empty() => format!("{n:?}"),
        _ => format!("node #{index}"),
    }
}

/// Converts one node: folded into known arrays when all its inputs are known, else into ops.
fn convert_node(node: &Node, b: &mut FunctionBuilder, env: &mut Env) -> Result<(), Fail> {
    let convert = ops::converter(node.op_type()).expect("checked by the caller");
    if symbolic::applies(node, env, b) {
        let shapes = symbolic::eval(node, env, b)?;
        for (name, shape) in node.proto.output.iter().zip(shapes) {
            env.slots.insert(name.clone(), shape_slot(shape));
        }
        return Ok(());
    }
    let inputs_known = (node.proto.input.iter()).all(|i| i.is_empty() || env.known(i).is_some());
    // What `fold` would leave is left too: a large integer result (index arithmetic over
    // positions) is computed at run time, as Kiln's own lowerings compute it, so a program
    // imports as itself after an export. (Large float results become parameters.)
    let folded = match inputs_known {
        true => Some(fold(node, env, convert)?),
        false => None,
    };
    let small = |a: &Array| a.dtype().is_float() || a.len() <= LARGEST_CONSTANT;
    if let Some(arrays) = folded.filter(|arrays| arrays.iter().all(small)) {
        for (name, array) in node.proto.output.iter().zip(arrays) {
            let slot = Slot::Known {
                array: Rc::new(array),
                value: None,
                initializer: false,
            };
            env.slots.insert(name.clone(), slot);
        }
        return Ok(());
    }
    let values = convert(&mut Ctx { b, env, node })?;
    bind_outputs(node, b, env, values)
}

/// Binds the node's outputs; a constant result (a static `Shape`, say) stays known, so the
/// shape arithmetic after it folds.
fn bind_outputs(
    node: &Node,
    b: &FunctionBuilder,
    env: &mut Env,
    values: Vec<Value>,
) -> Result<(), Fail> {
    for (i, name) in node.proto.output.iter().enumerate() {
        match values.get(i) {
            Some(&v) => env
                .slots
                .insert(name.clone(), constant_slot(b, v).unwrap_or(Slot::Value(v))),
            None if name.is_empty() => None,
            None => env.slots.insert(name.clone(), Slot::Missing),
        };
    }
    Ok(())
}

/// A symbolic shape's slot: known integers when no entry is symbolic.
fn shape_slot(shape: symbolic::SymShape) -> Slot {
    let ints: Option<Vec<i64>> = (shape.entries.iter())
        .map(|e| match e {
            symbolic::Entry::Int(i) => Some(*i),
            symbolic::Entry::Sym(_) => None,
        })
        .collect();
    let Some(ints) = ints else {
        return Slot::Shape(shape);
    };
    let dims: &[usize] = if shape.scalar { &[] } else { &[ints.len()] };
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(dims), ints).expect("sized to fit");
    Slot::Known {
        array: Rc::new(Array::I64(array)),
        value: None,
        initializer: false,
    }
}

/// The slot of `v` when it is a constant of static shape.
fn constant_slot(b: &FunctionBuilder, v: Value) -> Option<Slot> {
    let f = b.function();
    let ValueDef::Result(inst, _) = f.value(v).def else {
        return None;
    };
    let Op::Const { value, ty } = &f.inst(inst).op else {
        return None;
    };
    let array = Array::from_literal(value, &ty.shape.as_fixed()?)?;
    Some(Slot::Known {
        array: Rc::new(array),
        value: Some(v),
        initializer: false,
    })
}

/// Runs the node's conversion on its known inputs with the reference interpreter.
fn fold(node: &Node, env: &Env, convert: ops::Convert) -> Result<Vec<Array>, Fail> {
    let mut scratch = Env {
        folding: true,
        ..Env::default()
    };
    for name in node.proto.input.iter().filter(|n| !n.is_empty()) {
        let array = env.known(name).expect("checked by the caller").clone();
        scratch.slots.insert(
            name.clone(),
            Slot::Known {
                array,
                value: None,
                initializer: false,
            },
        );
    }
    let mut b = FunctionBuilder::new("fold");
    let values = convert(&mut Ctx {
        b: &mut b,
        env: &mut scratch,
        node,
    })?;
    let function = b.finish(&values)?;
    let mut module = Module::new();
    module.add_function(function);
    (Interpreter::new(&module).run("fold", Vec::new(), &mut StateStore::new()))
        .map_err(|e| Fail::Invalid(format!("evaluating the node at import time: {e}")))
}
