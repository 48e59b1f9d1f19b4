//! A model whose parameters need more memory than the limit is refused before anything of
//! that size is allocated. (Its own test binary: the limit is process-wide.)

use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::{GraphProto, ModelProto, OperatorSetIdProto, TensorProto};
use prost::Message;

#[test]
fn an_initializer_over_the_memory_limit_is_refused_with_its_size() {
    kiln_backend::limits::set_memory_limit(Some(1 << 20));
    let big = TensorProto {
        name: Some("w".into()),
        dims: vec![1024, 1024],
        data_type: Some(DataType::Float as i32),
        raw_data: Some(Vec::new()),
        ..Default::default()
    };
    let m = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: None,
            version: Some(17),
        }],
        graph: Some(GraphProto {
            initializer: vec![big],
            ..Default::default()
        }),
        ..Default::default()
    };
    let e = kiln_onnx::import_bytes(&m.encode_to_vec(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("4194304 bytes") && e.contains("memory limit"),
        "{e}"
    );
}
