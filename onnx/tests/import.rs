//! Importing models built here message by message: results against hand-computed values, and
//! hostile files (truncated, bit-flipped, crafted) refused with errors, never a panic.

mod common;

use common::*;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::{AttributeProto, ModelProto, NodeProto, TensorProto};
use kiln_onnx::{OnnxError, import_bytes};
use ndarray::{ArrayD, IxDyn};
use prost::Message;

fn int_vector(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        dims: vec![values.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, initializer: Vec<TensorProto>, output: &str) -> ModelProto {
    let input = vec![floats_info("x", &[-1, 2])];
    model_of(
        17,
        nodes,
        input,
        initializer,
        vec![floats_info(output, &[-1, 3])],
    )
}

/// `relu(x · W + b)` as a Gemm with `transB`: W stored `[3, 2]`.
fn gemm_relu() -> ModelProto {
    let mut gemm = node("Gemm", "fc", &["x", "w", "b"], &["h"]);
    gemm.attribute.push(AttributeProto {
        name: Some("transB".into()),
        i: Some(1),
        r#type: Some(2),
        ..Default::default()
    });
    let w = floats("w", &[3, 2], &[1., 2., -1., 0.5, 0., 3.]);
    let b = floats("b", &[3], &[0.5, -4., 1.]);
    model(
        vec![gemm, node("Relu", "act", &["h"], &["y"])],
        vec![w, b],
        "y",
    )
}

fn run(m: &ModelProto, x: Array) -> Array {
    let imported = import_bytes(&m.encode_to_vec(), None).unwrap();
    let mut state = StateStore::new();
    for (n, v) in imported.parameters {
        state.insert(n, v);
    }
    let interp = Interpreter::new(&imported.module);
    let name = imported.module.functions[0].name().to_owned();
    interp.run(&name, vec![x], &mut state).unwrap().remove(0)
}

#[test]
fn a_gemm_and_relu_give_hand_computed_values_for_any_batch() {
    let x = Array::F32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![1., 1., 2., -1.]).unwrap());
    let y = run(&gemm_relu(), x);
    // Row 1: [1+2+0.5, -1+0.5-4, 0+3+1] = [3.5, -4.5, 4] → relu. Row 2: [0+0.5, -2-0.5-4, -3+1].
    assert_eq!(y.to_f64_vec(), vec![3.5, 0., 4., 0.5, 0., 0.]);
    assert_eq!(y.shape(), &[2, 2 + 1]);
}

#[test]
fn every_unsupported_node_is_listed_at_once() {
    let nodes = vec![
        node("Relu", "ok", &["x"], &["a"]),
        node("FancyOp", "first", &["a"], &["b"]),
        node("Relu", "after_first", &["b"], &["c"]),
        node("OtherOp", "second", &["a"], &["d"]),
    ];
    let m = model(nodes, vec![], "c");
    let Err(OnnxError::Unsupported(list)) = import_bytes(&m.encode_to_vec(), None) else {
        panic!("expected the unsupported nodes");
    };
    let names: Vec<&str> = list.iter().map(|u| u.op_type.as_str()).collect();
    assert_eq!(names, ["FancyOp", "OtherOp"]);
    let message = OnnxError::Unsupported(list).to_string();
    assert!(
        message.contains("\"first\" (FancyOp, opset 17)"),
        "{message}"
    );
    assert!(
        message.contains("\"second\" (OtherOp, opset 17)"),
        "{message}"
    );
}

#[test]
fn truncated_and_bit_flipped_models_are_errors_not_panics() {
    let bytes = gemm_relu().encode_to_vec();
    for len in 0..bytes.len() {
        let _ = import_bytes(&bytes[..len], None);
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..4000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut flipped = bytes.clone();
        let bit = (seed % (bytes.len() as u64 * 8)) as usize;
        flipped[bit / 8] ^= 1 << (bit % 8);
        let _ = import_bytes(&flipped, None);
    }
    assert!(matches!(
        import_bytes(b"not a model at all", None),
        Err(OnnxError::Decode(_)) | Err(OnnxError::Invalid(_))
    ));
}

fn error_of(m: &ModelProto) -> String {
    match import_bytes(&m.encode_to_vec(), None) {
        Ok(_) => panic!("the crafted model was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn crafted_tensors_are_refused_with_what_is_wrong() {
    let mut m = gemm_relu();
    let graph = m.graph.as_mut().unwrap();
    graph.initializer[0].float_data.pop();
    assert!(
        error_of(&m).contains("holds 5 f32 elements"),
        "{}",
        error_of(&m)
    );

    let mut m = gemm_relu();
    m.graph.as_mut().unwrap().initializer[0].dims = vec![1 << 40, 1 << 40, 1 << 40];
    let e = error_of(&m);
    assert!(e.contains("initializer \"w\""), "{e}");

    let mut m = gemm_relu();
    m.graph.as_mut().unwrap().initializer[0].dims = vec![-3, -2];
    assert!(
        error_of(&m).contains("negative dimension"),
        "{}",
        error_of(&m)
    );

    let mut m = gemm_relu();
    m.graph.as_mut().unwrap().initializer[1].raw_data = Some(vec![0; 7]);
    assert!(
        error_of(&m).contains("raw data holds 7 bytes"),
        "{}",
        error_of(&m)
    );

    let mut m = gemm_relu();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.data_location = Some(1);
    w.external_data = vec![kiln_onnx::proto::StringStringEntryProto {
        key: Some("location".into()),
        value: Some("../../etc/passwd".into()),
    }];
    let e = error_of(&m);
    assert!(e.contains("external data"), "{e}");
}

#[test]
fn a_node_evaluated_at_import_that_is_too_large_is_an_error() {
    // ConstantOfShape of 10^15 elements: folding it must be refused, not abort the process.
    let shape = TensorProto {
        name: Some("shape".into()),
        dims: vec![3],
        data_type: Some(DataType::Int64 as i32),
        int64_data: vec![100_000, 100_000, 100_000],
        ..Default::default()
    };
    let nodes = vec![
        node("ConstantOfShape", "huge", &["shape"], &["z"]),
        node("Relu", "act", &["x"], &["y"]),
    ];
    let m = model(nodes, vec![shape], "y");
    let e = error_of(&m);
    assert!(e.contains("huge"), "{e}");
}

#[test]
fn a_wrong_node_names_itself_and_its_op() {
    let mut m = gemm_relu();
    m.graph.as_mut().unwrap().node[0].input[1] = "missing".into();
    let e = error_of(&m);
    assert!(
        e.contains("node \"fc\" (Gemm, opset 17)") && e.contains("\"missing\""),
        "{e}"
    );
}

#[test]
fn a_reshape_computed_from_a_dynamic_batch_stays_symbolic() {
    // y = reshape(x, concat([shape(x)[0]], [-1])): PyTorch's export of x.reshape(x.shape[0], -1).
    let mut gather = node("Gather", "batch", &["shape", "zero"], &["n"]);
    gather.attribute.push(AttributeProto {
        name: Some("axis".into()),
        i: Some(0),
        r#type: Some(2),
        ..Default::default()
    });
    let mut concat = node("Concat", "target", &["n1", "minus_one"], &["target"]);
    concat.attribute.push(AttributeProto {
        name: Some("axis".into()),
        i: Some(0),
        r#type: Some(2),
        ..Default::default()
    });
    let nodes = vec![
        node("Shape", "shape", &["x"], &["shape"]),
        gather,
        node("Unsqueeze", "n1", &["n", "axes"], &["n1"]),
        concat,
        node("Reshape", "flat", &["x", "target"], &["y"]),
    ];
    let zero = TensorProto {
        dims: vec![],
        ..int_vector("zero", &[0])
    };
    let inits = vec![
        zero,
        int_vector("axes", &[0]),
        int_vector("minus_one", &[-1]),
    ];
    let mut m = model(nodes, inits, "y");
    m.graph.as_mut().unwrap().input = vec![floats_info("x", &[-1, 2, 3])];
    let imported = import_bytes(&m.encode_to_vec(), None).unwrap();
    let f = &imported.module.functions[0];
    assert_eq!(f.result_types()[0].to_string(), "f32[batch,6]");
    let x = Array::F32(
        ArrayD::from_shape_vec(IxDyn(&[5, 2, 3]), (0..30).map(|i| i as f32).collect()).unwrap(),
    );
    let y = run(&m, x);
    assert_eq!(y.shape(), &[5, 6]);
    assert_eq!(y.to_f64_vec(), (0..30).map(f64::from).collect::<Vec<_>>());
}

#[test]
fn the_guide_lists_every_op_kiln_imports() {
    let guide = include_str!("../../docs/src/guides/onnx.md");
    let words: std::collections::HashSet<&str> = guide.split_whitespace().collect();
    let missing: Vec<&str> = kiln_onnx::ops::supported()
        .filter(|op| !words.contains(op))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/src/guides/onnx.md does not list {missing:?}"
    );
    let count = format!("The {} ops", kiln_onnx::ops::supported().count());
    assert!(guide.contains(&count), "the guide should say {count:?}");
}

/// A graph of `nodes` over float inputs of the given dimensions (-1: `batch`), at `opset`.
fn graph(
    nodes: Vec<NodeProto>,
    initializer: Vec<TensorProto>,
    inputs: &[(&str, &[i64])],
    output: &str,
    opset: i64,
) -> ModelProto {
    let mut m = model(nodes, initializer, output);
    m.opset_import[0].version = Some(opset);
    let g = m.graph.as_mut().unwrap();
    g.input = inputs.iter().map(|(n, d)| floats_info(n, d)).collect();
    m
}

fn evaluate(m: &ModelProto, x: Vec<f32>, dims: &[usize]) -> Vec<f64> {
    let x = Array::F32(ArrayD::from_shape_vec(IxDyn(dims), x).unwrap());
    run(m, x).to_f64_vec()
}

#[test]
fn slice_backwards_from_before_the_start_keeps_the_first_element() {
    // starts=-10 clamps to 0 (not -1) when stepping backwards: the result is [x0].
    let inits = vec![
        int_vector("s", &[-10]),
        int_vector("e", &[-20]),
        int_vector("a", &[0]),
        int_vector("st", &[-1]),
    ];
    let node = node("Slice", "slice", &["x", "s", "e", "a", "st"], &["y"]);
    let m = graph(vec![node], inits, &[("x", &[3])], "y", 13);
    assert_eq!(evaluate(&m, vec![1., 2., 3.], &[3]), vec![1.]);
}

#[test]
fn resize_of_opset_10_uses_asymmetric_coordinates() {
    // ONNX's Resize-10: linear, scale 2 on [1, 2] gives [1, 1.5, 2, 2].
    let mut node = node("Resize", "up", &["x", "scales"], &["y"]);
    node.attribute.push(AttributeProto {
        name: Some("mode".into()),
        s: Some(b"linear".to_vec()),
        r#type: Some(3),
        ..Default::default()
    });
    let m = graph(
        vec![node],
        vec![floats("scales", &[1], &[2.0])],
        &[("x", &[2])],
        "y",
        10,
    );
    assert_eq!(evaluate(&m, vec![1., 2.], &[2]), vec![1., 1.5, 2., 2.]);
}

#[test]
fn asinh_of_a_large_negative_number_keeps_its_digits() {
    let m = graph(
        vec![node("Asinh", "f", &["x"], &["y"])],
        vec![],
        &[("x", &[1])],
        "y",
        17,
    );
    let y = evaluate(&m, vec![-1e4], &[1])[0];
    assert!((y - (-1e4f64).asinh()).abs() < 1e-4, "{y}");
}

#[test]
fn hostile_nodes_are_errors_not_panics() {
    let models = [
        graph(
            vec![with_int(node("Concat", "c", &[], &["y"]), "axis", 0)],
            vec![],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![node("Shape", "s", &[], &["y"])],
            vec![],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![with_int(node("LRN", "l", &["x"], &["y"]), "size", 3)],
            vec![],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![with_int(
                node("RNN", "r", &["x", "x", "x"], &["y"]),
                "hidden_size",
                2,
            )],
            vec![],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![with_int(
                node("RNN", "r", &["x", "x", "x"], &["y"]),
                "hidden_size",
                -1,
            )],
            vec![],
            &[("x", &[1, 1, 1])],
            "y",
            13,
        ),
        graph(
            vec![with_ints(
                with_ints(
                    node("MaxPool", "p", &["x"], &["y"]),
                    "kernel_shape",
                    &[0, 0],
                ),
                "strides",
                &[1, 1],
            )],
            vec![],
            &[("x", &[1, 1, 4, 4])],
            "y",
            13,
        ),
        graph(
            vec![node("Range", "r", &["a", "b", "c"], &["y"])],
            vec![
                floats("a", &[], &[0.]),
                floats("b", &[], &[1e18]),
                floats("c", &[], &[1.]),
            ],
            &[("x", &[1])],
            "y",
            13,
        ),
        graph(
            vec![node("Upsample", "u", &["x", "scales"], &["y"])],
            vec![floats("scales", &[1], &[2.])],
            &[("x", &[1, 1, 2, 2])],
            "y",
            9,
        ),
        graph(
            vec![with_ints(
                node("Tile", "t", &["x", "r"], &["y"]),
                "unused",
                &[],
            )],
            vec![int_vector("r", &[1 << 40, 1 << 40])],
            &[("x", &[2, 2])],
            "y",
            13,
        ),
        graph(
            vec![node("Pad", "p", &["x", "pads"], &["y"])],
            vec![int_vector("pads", &[i64::MIN, i64::MAX])],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![node("Reshape", "r", &["x", "s"], &["y"])],
            vec![int_vector("s", &[1 << 33, 1 << 33, -1])],
            &[("x", &[2])],
            "y",
            13,
        ),
        graph(
            vec![node("Relu", "r", &["x"], &["y"])],
            vec![],
            &[("x", &[i64::MAX, i64::MAX])],
            "y",
            13,
        ),
    ];
    for (i, m) in models.iter().enumerate() {
        let result =
            std::panic::catch_unwind(|| import_bytes(&m.encode_to_vec(), None).map(|_| ()));
        assert!(result.is_ok(), "model {i} panicked");
        assert!(result.unwrap().is_err(), "model {i} was accepted");
    }
}

#[test]
fn integer_arithmetic_on_known_arrays_folds_up_to_the_fold_pass_size() {
    // `positions + positions` over initializers: computed at import up to the size the `fold`
    // pass makes constants, computed at run time past it (as Kiln's lowerings of index
    // arithmetic are), so that an exported program imports as itself.
    let imported = |n: usize| {
        let values: Vec<i64> = (0..n as i64).collect();
        let m = model_of(
            17,
            vec![node("Add", "twice", &["p", "p"], &["y"])],
            vec![],
            vec![ints("p", &[n as i64], &values)],
            vec![info("y", DataType::Int64, &[n as i64])],
        );
        let model = import_bytes(&m.encode_to_vec(), None).unwrap();
        let program = model.module.to_string();
        let mut state = model.state();
        let out = Interpreter::new(&model.module)
            .run(model.function_name(), vec![], &mut state)
            .unwrap();
        let doubled: Vec<f64> = (0..n).map(|i| 2.0 * i as f64).collect();
        assert_eq!(out[0].to_f64_vec(), doubled);
        program
    };
    let small = imported(kiln_passes::MAX_FOLDED_ELEMENTS);
    assert!(!small.contains(" add "), "{small}");
    let large = imported(kiln_passes::MAX_FOLDED_ELEMENTS + 1);
    assert!(large.contains(" add "), "{large}");
}
