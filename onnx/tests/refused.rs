//! What the importer refuses — invalid models, and inputs a lowering must check at run time on
//! both paths as the ONNX op does — and where imported instructions say they came from. Each
//! case here was imported or run without complaint before.

mod common;

use common::*;
use kiln_backend::exec::Executable;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::{ModelProto, NodeProto, TensorProto, ValueInfoProto};
use kiln_onnx::{IR_VERSIONS, Model, NEWEST_OPSET, import_bytes};
use ndarray::{ArrayD, IxDyn};
use prost::Message;
use std::sync::Arc;

fn model(nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: &[&str]) -> ModelProto {
    model_of(17, nodes, inputs, vec![], named(outputs))
}

fn import(m: &ModelProto) -> Result<Model, String> {
    import_bytes(&m.encode_to_vec(), None).map_err(|e| e.to_string())
}

/// Runs `model` through the interpreter and compiled: both results, or both errors.
fn run_both(model: &Model, args: Vec<Array>) -> [Result<Vec<Array>, String>; 2] {
    let name = model.function_name().to_owned();
    let interp = Interpreter::new(&model.module);
    let interpreted = interp.run(&name, args.clone(), &mut StateStore::new());
    let mut module = model.module.clone();
    kiln_passes::PassManager::pipeline("default")
        .unwrap()
        .run(&mut module)
        .unwrap();
    let executable = Executable::new(module.function(&name).unwrap());
    let interp = Interpreter::new(&module);
    let args = args.into_iter().map(Arc::new).collect();
    let compiled = executable.run(args, &mut StateStore::new(), &interp, false);
    let compiled = compiled.map(|r| r.into_iter().map(|a| (*a).clone()).collect());
    [
        interpreted.map_err(|e| e.to_string()),
        compiled.map_err(|e| e.to_string()),
    ]
}

fn i64s(shape: &[usize], values: &[i64]) -> Array {
    Array::I64(ArrayD::from_shape_vec(IxDyn(shape), values.to_vec()).unwrap())
}

/// `GatherElements(x: [2,4], index: [2,1]; axis=1)`.
fn gather_elements() -> ModelProto {
    let ge = with_int(
        node("GatherElements", "pick", &["x", "i"], &["y"]),
        "axis",
        1,
    );
    let inputs = vec![
        info("x", DataType::Float, &[2, 4]),
        info("i", DataType::Int64, &[2, 1]),
    ];
    model(vec![ge], inputs, &["y"])
}

#[test]
fn gather_elements_refuses_an_index_past_its_axis_naming_the_node() {
    let m = import(&gather_elements()).unwrap();
    let x = f32s(&[2, 4], &[0., 1., 2., 3., 10., 11., 12., 13.]);
    let [interpreted, compiled] = run_both(&m, vec![x.clone(), i64s(&[2, 1], &[3, -4])]);
    assert_eq!(interpreted.unwrap()[0].to_f64_vec(), [3., 10.]);
    assert_eq!(compiled.unwrap()[0].to_f64_vec(), [3., 10.]);
    // Index 4 on axis 1 of size 4: the flat position 4 is x[1,0], which was returned.
    for index in [4, -5] {
        for (path, result) in ["interpreted", "compiled"]
            .iter()
            .zip(run_both(&m, vec![x.clone(), i64s(&[2, 1], &[index, 0])]))
        {
            let e = result.expect_err(path);
            assert!(
                e.contains("out of range for axis 0 of size 4"),
                "{path}: {e}"
            );
            assert!(e.contains(r#"node "pick" (GatherElements)"#), "{path}: {e}");
        }
    }
}

#[test]
fn gather_elements_refuses_indices_longer_than_the_data_on_another_axis() {
    let mut m = gather_elements();
    let g = m.graph.as_mut().unwrap();
    g.input[1] = info("i", DataType::Int64, &[3, 1]);
    let e = import(&m).unwrap_err();
    assert!(e.contains(r#""pick" (GatherElements"#), "{e}");
    assert!(
        e.contains("no axis but 1 longer than the data's [2, 4]"),
        "{e}"
    );
}

#[test]
fn a_loss_refuses_a_target_class_out_of_range() {
    let loss = node("NegativeLogLikelihoodLoss", "nll", &["p", "t"], &["l"]);
    let inputs = vec![
        info("p", DataType::Float, &[2, 3]),
        info("t", DataType::Int64, &[2]),
    ];
    let m = import(&model(vec![loss], inputs, &["l"])).unwrap();
    let p = f32s(&[2, 3], &[-1., -2., -3., -4., -5., -6.]);
    let [interpreted, compiled] = run_both(&m, vec![p.clone(), i64s(&[2], &[0, 2])]);
    assert_eq!(interpreted.unwrap()[0].to_f64_vec(), [3.5]);
    assert_eq!(compiled.unwrap()[0].to_f64_vec(), [3.5]);
    // Class 3 of 3 picked no score: the loss came out as if the row were ignored.
    for result in run_both(&m, vec![p, i64s(&[2], &[0, 3])]) {
        let e = result.unwrap_err();
        assert!(e.contains("index 3 is out of range"), "{e}");
        assert!(
            e.contains(r#"node "nll" (NegativeLogLikelihoodLoss)"#),
            "{e}"
        );
    }
}

#[test]
fn two_nodes_writing_one_name_are_refused() {
    let nodes = vec![
        node("Relu", "first", &["x"], &["y"]),
        node("Neg", "second", &["x"], &["y"]),
    ];
    let m = model(nodes, vec![info("x", DataType::Float, &[2])], &["y"]);
    let e = import(&m).unwrap_err();
    assert!(e.contains(r#""second" (Neg, opset 17)"#), "{e}");
    assert!(
        e.contains(r#"it writes "y", which is already defined"#),
        "{e}"
    );
    let nodes = vec![node("Relu", "over_input", &["x"], &["x"])];
    let m = model(nodes, vec![info("x", DataType::Float, &[2])], &["x"]);
    assert!(import(&m).unwrap_err().contains(r#"it writes "x""#));
}

#[test]
fn duplicate_inputs_and_initializers_are_refused() {
    let x = info("x", DataType::Float, &[2]);
    let m = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![x.clone(), x],
        &["y"],
    );
    assert!(
        import(&m)
            .unwrap_err()
            .contains(r#"two graph inputs are named "x""#)
    );
    let w = TensorProto {
        name: Some("w".into()),
        dims: vec![1],
        data_type: Some(DataType::Float as i32),
        float_data: vec![1.0],
        ..Default::default()
    };
    let mut m = model(vec![node("Relu", "r", &["w"], &["y"])], vec![], &["y"]);
    m.graph.as_mut().unwrap().initializer = vec![w.clone(), w];
    assert!(
        import(&m)
            .unwrap_err()
            .contains(r#"two initializers are named "w""#)
    );
}

#[test]
fn a_name_read_before_it_is_written_is_refused() {
    let nodes = vec![
        node("Relu", "early", &["later"], &["y"]),
        node("Neg", "late", &["x"], &["later"]),
    ];
    let m = model(nodes, vec![info("x", DataType::Float, &[2])], &["y"]);
    let e = import(&m).unwrap_err();
    assert!(e.contains(r#""early" (Relu"#), "{e}");
    assert!(
        e.contains(r#"input "later" is not defined before this node"#),
        "{e}"
    );
}

#[test]
fn an_opset_newer_than_kilns_is_refused_naming_both() {
    let mut m = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![info("x", DataType::Float, &[2])],
        &["y"],
    );
    m.opset_import[0].version = Some(NEWEST_OPSET);
    import(&m).unwrap();
    m.opset_import[0].version = Some(999);
    let e = import(&m).unwrap_err();
    assert!(e.contains("opset 999"), "{e}");
    assert!(
        e.contains(&format!("the newest Kiln implements is {NEWEST_OPSET}")),
        "{e}"
    );
}

#[test]
fn ir_versions_kiln_cannot_read_are_refused() {
    let mut m = model(
        vec![node("Relu", "r", &["x"], &["y"])],
        vec![info("x", DataType::Float, &[2])],
        &["y"],
    );
    m.ir_version = Some(*IR_VERSIONS.end());
    import(&m).unwrap();
    for (version, said) in [(Some(99), "99"), (Some(2), "2"), (None, "not given")] {
        m.ir_version = version;
        let e = import(&m).unwrap_err();
        assert!(
            e.contains(&format!("IR version is {said}; Kiln reads versions 3 to")),
            "{e}"
        );
    }
}

#[test]
fn imported_instructions_name_their_node_in_the_printed_ir_and_it_round_trips() {
    let nodes = vec![
        node("Relu", "act", &["x"], &["h"]),
        node("Neg", "", &["h"], &["y"]),
    ];
    let m = import(&model(
        nodes,
        vec![info("x", DataType::Float, &[2])],
        &["y"],
    ))
    .unwrap();
    let printed = m.module.to_string();
    assert!(
        printed.contains(r#"relu %x : f32[2] loc("act", "Relu")"#),
        "{printed}"
    );
    assert!(printed.contains(r##"loc("#1", "Neg")"##), "{printed}");
    let reparsed = kiln_ir::parse_and_verify(&printed).unwrap();
    assert_eq!(reparsed.to_string(), printed);
    let relu = reparsed.functions[0]
        .region(reparsed.functions[0].body())
        .insts[0];
    let loc = reparsed.functions[0].inst(relu).loc;
    assert_eq!(loc.to_string(), r#"line 3, column 10, node "act" (Relu)"#);
}

#[test]
fn a_loss_refuses_targets_and_weights_of_the_wrong_shape() {
    // A fuzzer's mutant: a scalar target panicked the importer (an axis inserted past the end).
    for (target, weight, said) in [
        (&[][..], None, "should be [N, C, d…] and the target"),
        (&[3][..], None, "should be [N, C, d…] and the target"),
        (&[2][..], Some(&[2][..]), "should be one per class (3)"),
    ] {
        let mut inputs = vec![
            info("p", DataType::Float, &[2, 3]),
            info("t", DataType::Int64, target),
        ];
        let mut operands = vec!["p", "t"];
        if let Some(w) = weight {
            inputs.push(info("w", DataType::Float, w));
            operands.push("w");
        }
        let loss = node("NegativeLogLikelihoodLoss", "nll", &operands, &["l"]);
        let e = import(&model(vec![loss], inputs, &["l"])).unwrap_err();
        assert!(e.contains(r#""nll" (NegativeLogLikelihoodLoss"#), "{e}");
        assert!(e.contains(said), "{e}");
    }
}

#[test]
fn a_last_index_arg_reduction_over_a_huge_axis_imports_without_building_its_indices() {
    // A fuzzer's mutant: the reversed positions of an axis of 2³¹ were a 16 GiB constant,
    // allocated (and the process aborted) before any memory limit could refuse the run.
    let mut arg = node("ArgMin", "last", &["x"], &["y"]);
    arg = with_int(with_int(arg, "axis", 1), "select_last_index", 1);
    let m = model(
        vec![arg],
        vec![info("x", DataType::Float, &[2, 1 << 31, 4])],
        &["y"],
    );
    let imported = import(&m).unwrap();
    let small = model(
        vec![with_int(
            with_int(node("ArgMin", "last", &["x"], &["y"]), "axis", 1),
            "select_last_index",
            1,
        )],
        vec![info("x", DataType::Float, &[1, 4, 1])],
        &["y"],
    );
    let small = import(&small).unwrap();
    let x = f32s(&[1, 4, 1], &[2., 1., 3., 1.]);
    for result in run_both(&small, vec![x]) {
        assert_eq!(result.unwrap()[0].to_f64_vec(), [3.]);
    }
    assert!(imported.module.to_string().contains("iota"));
}
