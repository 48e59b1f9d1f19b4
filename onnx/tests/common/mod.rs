//! Models built message by message, shared by the import tests: graph inputs, nodes with
//! attributes, initializers.

#![allow(dead_code)] // each test file uses some of them

use kiln_backend::Array;
use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto, tensor_shape_proto, type_proto,
};

/// A model (IR version 10) of one graph `net` at `opset` of the default domain: `nodes` over
/// `inputs` and `initializer`, computing `outputs`.
pub(crate) fn model_of(
    opset: i64,
    nodes: Vec<NodeProto>,
    inputs: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
    outputs: Vec<ValueInfoProto>,
) -> ModelProto {
    ModelProto {
        ir_version: Some(10),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(GraphProto {
            name: Some("net".into()),
            node: nodes,
            input: inputs,
            initializer,
            output: outputs,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Graph outputs by name alone (their types left to the import's inference).
pub(crate) fn named<S: AsRef<str>>(names: &[S]) -> Vec<ValueInfoProto> {
    (names.iter())
        .map(|n| ValueInfoProto {
            name: Some(n.as_ref().to_owned()),
            ..Default::default()
        })
        .collect()
}

/// A graph input of `dims`; a negative size is the symbolic size `batch`.
pub(crate) fn info(name: &str, dtype: DataType, dims: &[i64]) -> ValueInfoProto {
    let dim = (dims.iter())
        .map(|&d| tensor_shape_proto::Dimension {
            value: Some(match d {
                d if d < 0 => tensor_shape_proto::dimension::Value::DimParam("batch".into()),
                d => tensor_shape_proto::dimension::Value::DimValue(d),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(dtype as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn floats_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    info(name, DataType::Float, dims)
}

pub(crate) fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub(crate) fn with_int(mut n: NodeProto, name: &str, value: i64) -> NodeProto {
    n.attribute.push(AttributeProto {
        name: Some(name.into()),
        i: Some(value),
        r#type: Some(2),
        ..Default::default()
    });
    n
}

pub(crate) fn with_ints(mut n: NodeProto, name: &str, values: &[i64]) -> NodeProto {
    n.attribute.push(AttributeProto {
        name: Some(name.into()),
        ints: values.to_vec(),
        r#type: Some(7),
        ..Default::default()
    });
    n
}

/// An int64 initializer of `dims` (`[]` for a scalar).
pub(crate) fn ints(name: &str, dims: &[i64], values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Int64 as i32),
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

/// A float initializer of `dims`.
pub(crate) fn floats(name: &str, dims: &[i64], values: &[f32]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: dims.to_vec(),
        data_type: Some(DataType::Float as i32),
        float_data: values.to_vec(),
        ..Default::default()
    }
}

/// An f32 array of `shape`.
pub(crate) fn f32s(shape: &[usize], values: &[f32]) -> Array {
    Array::F32(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), values.to_vec()).unwrap())
}
