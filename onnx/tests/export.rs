//! ONNX export: programs written as models, read back by Kiln's importer and run against the
//! programs as written (onnxruntime checks the same models in `scripts/onnx_export_check.py`);
//! what ONNX cannot express refused by instruction, and no partial file left.

use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{Module, Symbol, SymbolBindings, parse_and_verify};
use kiln_onnx::export::{ExportError, ExportOptions, export, export_to_file};
use prost::Message;
use std::path::{Path, PathBuf};

fn program(file: &str) -> Module {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/export")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    parse_and_verify(&text).unwrap_or_else(|e| panic!("{}", e.render(&text)))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-export-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn arguments(module: &Module, func: &str, batch: usize) -> Vec<Array> {
    let f = module.function(func).unwrap();
    let sizes: SymbolBindings = [(Symbol::new("N"), batch)].into_iter().collect();
    (f.arg_types().enumerate())
        .map(|(i, ty)| kiln::diff::random_value(ty, &sizes, 17 + i as u64).unwrap())
        .collect()
}

fn interpret(module: &Module, func: &str, args: Vec<Array>, state: &StateStore) -> Vec<Array> {
    let f = module.function(func).unwrap();
    let mut state = state.clone();
    Interpreter::new(module)
        .run_function(f, args, &mut state)
        .unwrap()
}

fn assert_close(func: &str, expected: &[Array], got: &[Array]) {
    assert_eq!(expected.len(), got.len(), "@{func}: result count");
    for (i, (e, g)) in expected.iter().zip(got).enumerate() {
        assert_eq!(e.ty(), g.ty(), "@{func} result {i}: type");
        for (a, b) in e.to_f64_vec().iter().zip(g.to_f64_vec()) {
            let ok = (a - b).abs() <= 1e-5 * a.abs().max(1.0) || (a.is_nan() && b.is_nan());
            assert!(ok, "@{func} result {i}: {a} written, {b} read back");
        }
    }
}

/// Exports `func`, imports the bytes, and runs both at batch 1 and 7.
fn round_trip(module: &Module, func: &str) {
    round_trip_at(module, func, &ExportOptions::default());
}

/// [`round_trip`] at the opset `options` give. With `KILN_ONNX_EXPORT_DIR=DIR`, each model
/// and batch is also written as a node case `DIR/kiln_export_<func>_opset<o>_batch<n>` for
/// onnxruntime (`scripts/onnx_export_check.py --node-cases DIR`).
fn round_trip_at(module: &Module, func: &str, options: &ExportOptions) {
    let state = StateStore::initialize(module).unwrap();
    let model = export(module, func, &state, options).unwrap_or_else(|e| panic!("@{func}: {e}"));
    let bytes = model.encode_to_vec();
    let back = kiln_onnx::import_bytes(&bytes, None)
        .unwrap_or_else(|e| panic!("@{func}: the exported model does not import: {e}"));
    let parameters = back.state();
    for batch in [1, 7] {
        let args = arguments(module, func, batch);
        let expected = interpret(module, func, args.clone(), &state);
        if let Some(dir) = std::env::var_os("KILN_ONNX_EXPORT_DIR") {
            let name = format!("kiln_export_{func}_opset{}_batch{batch}", options.opset);
            kiln_onnx::write_test_case(&Path::new(&dir).join(name), &bytes, &args, &expected)
                .unwrap();
        }
        let got = interpret(
            &back.module,
            back.function_name(),
            args.clone(),
            &parameters,
        );
        assert_close(func, &expected, &got);
    }
}

/// Functions whose exported models Kiln's importer does not read (`ScatterND`, a `Slice` at
/// an index known only at run time, `If`): onnxruntime runs them
/// (scripts/onnx_export_check.py).
const ONNXRUNTIME_ONLY: &[&str] = &["indexing", "branches"];

#[test]
fn every_op_round_trips_through_onnx() {
    let module = program("every_op.kir");
    for func in &module.functions {
        if !ONNXRUNTIME_ONLY.contains(&func.name()) {
            round_trip(&module, func.name());
        }
    }
    let state = StateStore::initialize(&module).unwrap();
    for func in ONNXRUNTIME_ONLY {
        export(&module, func, &state, &ExportOptions::default()).unwrap();
    }
}

#[test]
fn control_flow_becomes_if_and_loop() {
    let module = program("../../../tests/programs/control_flow.kir");
    let state = StateStore::new();
    for (func, op) in [("newton_sqrt", "Loop"), ("clip_by_norm", "If")] {
        let model = export(&module, func, &state, &ExportOptions::default()).unwrap();
        let ops: Vec<_> = (model.graph.unwrap().node.iter())
            .filter_map(|n| n.op_type.clone())
            .collect();
        // Kiln's importer reads neither; onnxruntime runs both (scripts/onnx_export_check.py).
        assert!(ops.iter().any(|o| o == op), "@{func}: {ops:?}");
    }
}

#[test]
fn products_become_gemm_and_sizes_stay_named() {
    let module = program("every_op.kir");
    let state = StateStore::initialize(&module).unwrap();
    let model = export(&module, "dense", &state, &ExportOptions::default()).unwrap();
    let graph = model.graph.unwrap();
    let ops: Vec<_> = graph
        .node
        .iter()
        .filter_map(|n| n.op_type.as_deref())
        .collect();
    assert!(ops.contains(&"Gemm"), "{ops:?}");
    assert_eq!(graph.initializer.len(), 2, "the two states read");
    let shape = format!("{:?}", graph.input[0].r#type);
    assert!(shape.contains("DimParam(\"N\")"), "{shape}");
}

fn refusal(text: &str) -> ExportError {
    let module = parse_and_verify(text).unwrap();
    let state = StateStore::initialize(&module).unwrap();
    let dir = scratch("refused");
    let path = dir.join("model.onnx");
    let e = export_to_file(&module, "f", &state, &path, &ExportOptions::default()).unwrap_err();
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "a failed export left {left:?}");
    e
}

#[test]
fn what_onnx_cannot_express_is_refused_by_line() {
    let random = "module {\n  func @f(%x: f32[2]) -> f32[2] {\n    %n = random_normal {mean=0.0, std=1.0, seed=7} : f32[2]\n    %y = add %x, %n : f32[2]\n    return %y\n  }\n}\n";
    let e = refusal(random).to_string();
    assert!(e.contains("random_normal") && e.contains("line 3"), "{e}");
    let grad = "module {\n  func @f(%x: f32[1,1,4,4], %g: f32[1,1,3,3]) -> f32[1,1,2,2] {\n    %w = conv2d_filter_grad %x, %g {strides=[1,1], padding=[(0,0),(0,0)], dilation=[1,1], groups=1} : f32[1,1,2,2]\n    return %w\n  }\n}\n";
    let e = refusal(grad).to_string();
    assert!(e.contains("filter gradient") && e.contains("line 3"), "{e}");
}

#[test]
fn a_written_state_becomes_an_input_and_an_output() {
    let text = "module {\n  state @s : f32[2] = constant(value=0.0)\n  func @f(%x: f32[2]) -> f32[2] {\n    %s = load @s : f32[2]\n    %t = add %s, %x : f32[2]\n    store @s, %t\n    return %x\n  }\n}\n";
    let module = parse_and_verify(text).unwrap();
    let state = StateStore::initialize(&module).unwrap();
    let model = export(&module, "f", &state, &ExportOptions::default()).unwrap();
    let back = kiln_onnx::import_bytes(&model.encode_to_vec(), None).unwrap();
    assert_eq!(back.inputs, ["x", "s"]);
    assert_eq!(back.outputs, ["x_out", "s_next"]);
    assert!(back.parameters.is_empty(), "{:?}", back.parameters.keys());
    let vector = |v: [f32; 2]| Array::F32(ndarray::arr1(&v).into_dyn());
    let args = vec![vector([1.0, 2.0]), vector([10.0, 20.0])];
    let got = interpret(&back.module, back.function_name(), args, &StateStore::new());
    assert_eq!(got, [vector([1.0, 2.0]), vector([11.0, 22.0])]);
}

#[test]
fn a_nested_refusal_names_the_inner_instruction() {
    let text = "module {\n  func @f(%p: bool[], %x: f32[2]) -> f32[2] {\n    %y = cond %p : f32[2] then {\n      %n = random_uniform {low=0.0, high=1.0, seed=1} : f32[2]\n      yield %n\n    } else {\n      yield %x\n    }\n    return %y\n  }\n}\n";
    let e = refusal(text).to_string();
    assert!(e.contains("random_uniform") && e.contains("line 4"), "{e}");
}

#[test]
fn unwritable_paths_and_unknown_opsets_are_errors() {
    let module = program("every_op.kir");
    let state = StateStore::initialize(&module).unwrap();
    let path = Path::new("/nonexistent-kiln-dir/model.onnx");
    let e = export_to_file(&module, "dense", &state, path, &ExportOptions::default());
    assert!(matches!(e, Err(ExportError::Write { .. })), "{e:?}");
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("/nonexistent-kiln-dir/model.onnx")
    );
    let old = ExportOptions {
        opset: 16,
        ..Default::default()
    };
    let e = export(&module, "dense", &state, &old).unwrap_err();
    assert!(e.to_string().contains("opset 16"), "{e}");
    let e = export(&module, "nope", &state, &ExportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("@nope"), "{e}");
}

#[test]
fn a_state_of_the_wrong_type_is_refused() {
    let module = program("every_op.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    state.insert("w", Array::zeros(kiln_ir::DType::F64, &[4, 6]));
    let e = export(&module, "dense", &state, &ExportOptions::default()).unwrap_err();
    assert!(e.to_string().contains("state w holds f64[4,6]"), "{e}");
}

#[test]
fn large_initializers_go_to_external_data() {
    let module = program("every_op.kir");
    let state = StateStore::initialize(&module).unwrap();
    let dir = scratch("external");
    let path = dir.join("model.onnx");
    let options = ExportOptions {
        external_data_above: 16,
        ..Default::default()
    };
    export_to_file(&module, "conv", &state, &path, &options).unwrap();
    assert!(dir.join("model.onnx.data").exists());
    let back = kiln_onnx::import(&path).unwrap();
    let names: Vec<_> = back.parameters.keys().collect();
    assert!(back.parameters.contains_key("k"), "{names:?}");
    assert_eq!(back.parameters["k"], *state.get("k").unwrap());
}

fn op_types(model: &kiln_onnx::proto::ModelProto) -> Vec<(String, usize)> {
    let graph = model.graph.as_ref().unwrap();
    (graph.node.iter())
        .map(|n| (n.op_type.clone().unwrap_or_default(), n.input.len()))
        .collect()
}

#[test]
fn composites_are_written_back_as_onnx_ops() {
    let module = program("every_op.kir");
    let state = StateStore::initialize(&module).unwrap();
    let options = ExportOptions::default();
    let dense = op_types(&export(&module, "dense", &state, &options).unwrap());
    assert!(dense.contains(&("Gemm".into(), 3)), "{dense:?}");
    assert!(!dense.iter().any(|(op, _)| op == "Add"), "{dense:?}");
    let conv = op_types(&export(&module, "conv", &state, &options).unwrap());
    assert!(conv.contains(&("Conv".into(), 3)), "{conv:?}");
    // Kiln's own layer norm (the layers' and the importer's composite), and read back.
    let mut b = kiln_ir::FunctionBuilder::new("norm");
    let f32s = |dims: &[kiln_ir::Dim]| {
        kiln_ir::Type::new(kiln_ir::DType::F32, kiln_ir::Shape(dims.to_vec()))
    };
    let x = b.arg("x", f32s(&[kiln_ir::Dim::sym("N"), 5.into()]));
    let scale = b.arg("scale", f32s(&[5.into()]));
    let bias = b.arg("bias", f32s(&[5.into()]));
    let y = kiln::runtime::composite::layer_norm(&mut b, x, scale, bias, 1e-5).unwrap();
    let mut norm = Module::new();
    norm.add_function(b.finish(&[y]).unwrap());
    let model = export(&norm, "norm", &StateStore::new(), &options).unwrap();
    assert_eq!(op_types(&model), [("LayerNormalization".into(), 3)]);
    round_trip(&norm, "norm");
}

#[test]
fn a_size_read_inside_a_branch_is_read_in_the_main_graph() {
    let module = program("every_op.kir");
    let model = export(
        &module,
        "branches",
        &StateStore::new(),
        &ExportOptions::default(),
    );
    let graph = model.unwrap().graph.unwrap();
    assert_eq!(graph.node[0].op_type.as_deref(), Some("Shape"));
    let shapes = |nodes: &[kiln_onnx::proto::NodeProto]| {
        (nodes.iter())
            .filter(|n| n.op_type.as_deref() == Some("Shape"))
            .count()
    };
    let branch = &graph
        .node
        .iter()
        .find(|n| n.op_type.as_deref() == Some("If"))
        .unwrap();
    let then = branch.attribute[0].g.as_ref().unwrap();
    assert_eq!((shapes(&graph.node), shapes(&then.node)), (1, 0));
}

#[test]
fn the_oldest_and_newest_opsets_round_trip() {
    // Opset 17 takes ReduceMean/Max/Min's axes as an attribute; 18 and later as an input.
    let module = program("every_op.kir");
    for opset in [17, kiln_onnx::NEWEST_OPSET] {
        let options = ExportOptions {
            opset,
            ..Default::default()
        };
        for func in ["reductions", "dense", "conv"] {
            round_trip_at(&module, func, &options);
        }
    }
}

/// What ONNX has no op for comes back as itself: `stop_gradient` (an `Identity` that says
/// so), Kiln's `gather` (indices not wrapped again), and a broadcast left to the reader's
/// implicit broadcasting (no `Expand`, the importer's own `broadcast` again).
#[test]
fn ops_onnx_lacks_come_back_as_themselves() {
    let text = "module {
  func @f(%x: f32[N,4], %b: f32[4], %i: i64[3]) -> (f32[N,4], f32[3,4]) {
    %s = stop_gradient %x : f32[N,4]
    %bb = broadcast %b : f32[N,4]
    %y = add %s, %bb : f32[N,4]
    %g = gather %y, %i {axis=0} : f32[3,4]
    return %y, %g
  }
}";
    let module = parse_and_verify(text).unwrap();
    let model = export(&module, "f", &StateStore::new(), &ExportOptions::default()).unwrap();
    let ops: Vec<String> = op_types(&model).into_iter().map(|(op, _)| op).collect();
    assert!(!ops.contains(&"Expand".to_owned()), "{ops:?}");
    let back = kiln_onnx::import_bytes(&model.encode_to_vec(), None).unwrap();
    let printed = back.module.to_string();
    assert!(printed.contains("= stop_gradient %x"), "{printed}");
    assert!(printed.contains("= broadcast %b"), "{printed}");
    assert!(
        !printed.contains("select"),
        "the indices were wrapped again:\n{printed}"
    );
}

/// Kiln's attention (the layers' `composite::scaled_dot_product_attention`, causal or not) is
/// one `Attention` node from opset 23, with the causal bias as its mask; before 23 it is the
/// ops it is made of. Imported again, it gives the same results.
#[test]
fn attention_is_written_back_from_opset_23() {
    use kiln_ir::{DType, Dim, FunctionBuilder, Shape, Type};
    let heads = |b: &mut FunctionBuilder, name: &str, t: usize| {
        let ty = Type::new(
            DType::F32,
            Shape(vec![Dim::sym("N"), 2.into(), t.into(), 8.into()]),
        );
        b.arg(name, ty)
    };
    let mut module = Module::new();
    for causal in [false, true] {
        let mut b = FunctionBuilder::new(if causal { "causal" } else { "full" });
        let (q, k, v) = (
            heads(&mut b, "q", 5),
            heads(&mut b, "k", 5),
            heads(&mut b, "v", 5),
        );
        let y = kiln::runtime::composite::scaled_dot_product_attention(&mut b, q, k, v, causal);
        module.add_function(b.finish(&[y.unwrap()]).unwrap());
    }
    let at = |opset| ExportOptions {
        opset,
        ..ExportOptions::default()
    };
    for func in ["full", "causal"] {
        let model = export(&module, func, &StateStore::new(), &at(23)).unwrap();
        let ops: Vec<(String, usize)> = op_types(&model);
        let attention = ops.iter().filter(|(op, _)| op == "Attention").count();
        let inputs = if func == "causal" { 4 } else { 3 };
        assert!(ops.contains(&("Attention".into(), inputs)), "{ops:?}");
        assert_eq!(attention, 1, "{ops:?}");
        assert!(
            !ops.iter().any(|(op, _)| op == "Softmax" || op == "Exp"),
            "{ops:?}"
        );
        round_trip_at(&module, func, &at(23));
        let before = op_types(&export(&module, func, &StateStore::new(), &at(22)).unwrap());
        assert!(
            !before.iter().any(|(op, _)| op == "Attention"),
            "{before:?}"
        );
    }
}

/// A module of Kiln's recurrent layers over `[N, 3, 4]` sequences (hidden size 5): `lstm`
/// (every step, the last state and cell), `lstm_last` (the last state only), `gru`, and
/// `stacked` (a GRU over an LSTM's steps).
fn recurrent_layers() -> Module {
    use kiln::runtime::composite::{gru, lstm};
    use kiln_ir::{DType, Dim, FunctionBuilder, Shape, Type};
    let f32s = |dims: Vec<Dim>| Type::new(DType::F32, Shape(dims));
    let args = |b: &mut FunctionBuilder, gates: usize, d: usize| {
        let x = b.arg("x", f32s(vec![Dim::sym("N"), 3.into(), d.into()]));
        let w_ih = b.arg("w_ih", f32s(vec![d.into(), (gates * 5).into()]));
        let w_hh = b.arg("w_hh", f32s(vec![5.into(), (gates * 5).into()]));
        (x, w_ih, w_hh)
    };
    let bias = |b: &mut FunctionBuilder, name: &str, gates: usize| {
        b.arg(name, f32s(vec![(gates * 5).into()]))
    };
    let mut module = Module::new();
    for (name, every) in [("lstm", true), ("lstm_last", false)] {
        let mut b = FunctionBuilder::new(name);
        let (x, w_ih, w_hh) = args(&mut b, 4, 4);
        let bias = bias(&mut b, "b", 4);
        let (sequence, [h, c]) = lstm(&mut b, x, w_ih, w_hh, bias).unwrap();
        let results = if every { vec![sequence, h, c] } else { vec![h] };
        module.add_function(b.finish(&results).unwrap());
    }
    let mut b = FunctionBuilder::new("gru");
    let (x, w_ih, w_hh) = args(&mut b, 3, 4);
    let biases = [bias(&mut b, "b_ih", 3), bias(&mut b, "b_hh", 3)];
    let (sequence, h) = gru(&mut b, x, [w_ih, w_hh], biases).unwrap();
    module.add_function(b.finish(&[sequence, h]).unwrap());
    let mut b = FunctionBuilder::new("stacked");
    let (x, w_ih, w_hh) = args(&mut b, 4, 4);
    let b0 = bias(&mut b, "b", 4);
    let (sequence, _) = lstm(&mut b, x, w_ih, w_hh, b0).unwrap();
    let w2 = b.arg("w2_ih", f32s(vec![5.into(), 15.into()]));
    let r2 = b.arg("w2_hh", f32s(vec![5.into(), 15.into()]));
    let biases = [bias(&mut b, "b2_ih", 3), bias(&mut b, "b2_hh", 3)];
    let (_, h) = gru(&mut b, sequence, [w2, r2], biases).unwrap();
    module.add_function(b.finish(&[h]).unwrap());
    module
}

#[test]
fn lstm_and_gru_are_written_back_as_themselves() {
    let module = recurrent_layers();
    let options = ExportOptions::default();
    for (func, layers) in [
        ("lstm", &["LSTM"][..]),
        ("lstm_last", &["LSTM"]),
        ("gru", &["GRU"]),
        ("stacked", &["LSTM", "GRU"]),
    ] {
        let model = export(&module, func, &StateStore::new(), &options).unwrap();
        let ops = op_types(&model);
        let found: Vec<&str> = (ops.iter())
            .filter(|(op, _)| op == "LSTM" || op == "GRU")
            .map(|(op, _)| op.as_str())
            .collect();
        assert_eq!(found, layers, "@{func}: {ops:?}");
        let unrolled = ["Sigmoid", "Tanh", "Gemm", "MatMul", "Slice"];
        assert!(
            !ops.iter().any(|(op, _)| unrolled.contains(&op.as_str())),
            "@{func}: {ops:?}"
        );
        round_trip(&module, func);
    }
}

#[test]
fn an_lstm_whose_steps_are_read_elsewhere_stays_unrolled() {
    use kiln_ir::{DType, Dim, FunctionBuilder, Shape, Type};
    let f32s = |dims: Vec<Dim>| Type::new(DType::F32, Shape(dims));
    let mut b = FunctionBuilder::new("peeked");
    let x = b.arg("x", f32s(vec![Dim::sym("N"), 2.into(), 3.into()]));
    let w_ih = b.arg("w_ih", f32s(vec![3.into(), 8.into()]));
    let w_hh = b.arg("w_hh", f32s(vec![2.into(), 8.into()]));
    let bias = b.arg("b", f32s(vec![8.into()]));
    let (_, [h, _]) = kiln::runtime::composite::lstm(&mut b, x, w_ih, w_hh, bias).unwrap();
    // The first step's gate pre-activations, read outside the layer.
    let f = (b.function().walk_insts().into_iter())
        .map(|i| b.function().inst(i))
        .find(|d| d.op == kiln_ir::Op::Binary(kiln_ir::BinaryOp::Add))
        .map(|d| d.results[0])
        .unwrap();
    let mut module = Module::new();
    module.add_function(b.finish(&[h, f]).unwrap());
    let ops =
        op_types(&export(&module, "peeked", &StateStore::new(), &Default::default()).unwrap());
    assert!(!ops.iter().any(|(op, _)| op == "LSTM"), "{ops:?}");
    round_trip(&module, "peeked");
}

#[test]
fn a_large_iota_is_written_as_a_range_not_every_element() {
    let module = parse_and_verify(
        "module {
           func @small() -> i64[2,3] {
             %i = iota {axis=1} : i64[2,3]
             return %i
           }
           func @huge() -> i64[1000000,1000000] {
             %i = iota {axis=1} : i64[1000000,1000000]
             return %i
           }
         }",
    )
    .unwrap();
    let options = ExportOptions::default();
    let small = op_types(&export(&module, "small", &StateStore::new(), &options).unwrap());
    assert_eq!(small, [("Constant".to_owned(), 0)]);
    round_trip(&module, "small");
    // 10¹² elements as a constant asked for 1.8 TB (a fuzzer finding).
    let huge = op_types(&export(&module, "huge", &StateStore::new(), &options).unwrap());
    let ops: Vec<&str> = huge.iter().map(|(op, _)| op.as_str()).collect();
    assert!(ops.contains(&"Range") && ops.contains(&"Expand"), "{ops:?}");
}
