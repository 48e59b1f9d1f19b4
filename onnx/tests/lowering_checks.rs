//! Checks an ONNX op makes that its lowering must keep: each model here breaks one rule of the
//! op's specification and was imported without complaint (and computed a wrong answer) before;
//! it is now refused when importing, naming the node and the values involved. Next to each, the
//! nearest valid model still imports.

mod common;

use common::*;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_onnx::proto::tensor_proto::DataType;
use kiln_onnx::proto::{AttributeProto, ModelProto, NodeProto, TensorProto, ValueInfoProto};
use kiln_onnx::{Model, import_bytes};
use prost::Message;

/// One node over graph inputs and initializers, at `opset`.
struct Net {
    node: NodeProto,
    inputs: Vec<ValueInfoProto>,
    initializers: Vec<TensorProto>,
    opset: i64,
}

impl Net {
    fn new(node: NodeProto, inputs: Vec<ValueInfoProto>) -> Net {
        Net {
            node,
            inputs,
            initializers: Vec::new(),
            opset: 17,
        }
    }

    fn init(mut self, t: TensorProto) -> Net {
        self.initializers.push(t);
        self
    }

    fn opset(mut self, opset: i64) -> Net {
        self.opset = opset;
        self
    }

    fn model(&self) -> ModelProto {
        let (inputs, initializers) = (self.inputs.clone(), self.initializers.clone());
        let outputs = named(&self.node.output);
        model_of(
            self.opset,
            vec![self.node.clone()],
            inputs,
            initializers,
            outputs,
        )
    }

    fn import(&self) -> Result<Model, String> {
        import_bytes(&self.model().encode_to_vec(), None).map_err(|e| e.to_string())
    }

    /// The import error, which must name the node and say `said`.
    fn refused(&self, said: &str) {
        let e = match self.import() {
            Ok(_) => panic!("{:?} was imported; expected {said:?}", self.node.name),
            Err(e) => e,
        };
        let name = self.node.name.as_deref().unwrap();
        assert!(e.contains(&format!("{name:?}")), "{e}");
        assert!(e.contains(said), "{e}");
    }

    /// Like [`Net::refused`], as an unsupported node (not an invalid one).
    fn unsupported(&self, said: &str) {
        self.refused(said);
        let e = self.import().err().unwrap();
        assert!(e.contains("1 unsupported node"), "{e}");
    }
}

/// Runs an imported model on `args` with the reference interpreter.
fn run(m: &Model, args: Vec<Array>) -> Vec<Array> {
    let mut state = StateStore::new();
    for (n, v) in &m.parameters {
        state.insert(n.clone(), v.clone());
    }
    let interp = Interpreter::new(&m.module);
    interp.run(m.function_name(), args, &mut state).unwrap()
}

// F3: OneHot.

fn one_hot(depth: TensorProto, values: &[i64]) -> Net {
    let n = node("OneHot", "hot", &["i", "depth", "values"], &["y"]);
    Net::new(n, vec![info("i", DataType::Int64, &[2])])
        .init(depth)
        .init(ints("values", &[values.len() as i64], values))
}

#[test]
fn one_hot_refuses_values_that_are_not_two_elements() {
    one_hot(ints("depth", &[], &[3]), &[0, 1]).import().unwrap();
    one_hot(ints("depth", &[], &[3]), &[0, 1, 2]).refused("the values [3] should be exactly two");
    one_hot(ints("depth", &[], &[3]), &[1]).refused("the values [1] should be exactly two");
}

#[test]
fn one_hot_refuses_a_negative_depth_or_one_of_rank_2() {
    one_hot(ints("depth", &[1], &[0]), &[0, 1])
        .import()
        .unwrap();
    one_hot(ints("depth", &[], &[-2]), &[0, 1]).refused("depth -2 should not be negative");
    one_hot(ints("depth", &[1, 1], &[3]), &[0, 1]).refused("not of rank 2");
}

// F4: Slice.

#[test]
fn slice_refuses_an_axis_named_twice() {
    let slice = |axes: &[i64]| {
        let n = node("Slice", "cut", &["x", "starts", "ends", "axes"], &["y"]);
        Net::new(n, vec![floats_info("x", &[4, 4])])
            .init(ints("starts", &[2], &[0, 1]))
            .init(ints("ends", &[2], &[2, 3]))
            .init(ints("axes", &[2], axes))
    };
    slice(&[0, -1]).import().unwrap();
    slice(&[0, -2]).refused("the axes [0, -2] name axis 0 of the rank-2 input twice");
}

// F5: Unsqueeze and Squeeze.

#[test]
fn unsqueeze_refuses_an_axis_named_twice() {
    let unsqueeze = |axes: &[i64]| {
        let n = node("Unsqueeze", "grow", &["x", "axes"], &["y"]);
        Net::new(n, vec![floats_info("x", &[3])]).init(ints("axes", &[2], axes))
    };
    unsqueeze(&[0, -1]).import().unwrap();
    unsqueeze(&[2, -1]).refused("the axes [2, -1] name axis 2 of the rank-3 result twice");
}

#[test]
fn squeezing_a_symbolic_axis_is_unsupported_not_invalid() {
    // ONNX leaves a symbolic size to be checked when run: the model is valid.
    let n = node("Squeeze", "thin", &["x", "axes"], &["y"]);
    let net = Net::new(n, vec![floats_info("x", &[-1, 3])]).init(ints("axes", &[1], &[0]));
    net.unsupported("squeezing axis 0 of symbolic size batch");
}

// F6: Split.

fn split(size: i64, outputs: &[&str]) -> Net {
    Net::new(
        node("Split", "parts", &["x"], outputs),
        vec![floats_info("x", &[size])],
    )
}

#[test]
fn split_before_opset_18_refuses_an_axis_that_does_not_divide_evenly() {
    split(6, &["a", "b"]).opset(13).import().unwrap();
    split(5, &["a", "b"])
        .opset(13)
        .refused("axis 0 of size 5 does not split into 2 equal parts");
    // From opset 18 the last part may be smaller.
    let mut uneven = split(5, &["a", "b"]).opset(18);
    uneven.node = with_int(uneven.node, "num_outputs", 2);
    uneven.import().unwrap();
}

#[test]
fn split_refuses_num_outputs_other_than_the_outputs() {
    let mut net = split(6, &["a", "b"]).opset(18);
    net.node = with_int(net.node, "num_outputs", 3);
    net.refused("num_outputs=3, but the node has 2 outputs");
}

// F7: Pad.

fn pad(size: i64, pads: &[i64]) -> Net {
    let n = node("Pad", "edge", &["x", "pads"], &["y"]);
    Net::new(n, vec![floats_info("x", &[size])]).init(ints("pads", &[2], pads))
}

#[test]
fn pad_refuses_negative_pads_that_leave_a_negative_size() {
    pad(3, &[-1, -2]).import().unwrap();
    pad(3, &[-2, -2]).refused("pads -2 and -2 on axis 0 of size 3 leave -1 elements");
}

#[test]
fn pad_cropping_past_the_axis_and_padding_back_is_unsupported() {
    // 3 - 4 + 2 = 1 element, all padding: the crop used to stop at the axis and keep 2.
    pad(3, &[-4, 2]).unsupported("pads -4 and 2 that crop more than axis 0 of size 3 holds");
}

// F8: Mod.

#[test]
fn mod_refuses_fmod_0_on_floats_before_opset_28() {
    let modulo = |fmod: i64, opset: i64| {
        let n = with_int(node("Mod", "rem", &["a", "b"], &["y"]), "fmod", fmod);
        Net::new(n, vec![floats_info("a", &[3]), floats_info("b", &[3])]).opset(opset)
    };
    modulo(1, 17).import().unwrap();
    modulo(0, 28).import().unwrap();
    modulo(0, 17).refused("fmod=0 on f32 inputs: before opset 28 floating-point Mod needs fmod=1");
}

// F9: Clip.

#[test]
fn clip_refuses_bounds_that_are_not_scalars() {
    let clip = |x: &[i64], min: &[i64]| {
        let n = node("Clip", "clamp", &["x", "min"], &["y"]);
        Net::new(n, vec![floats_info("x", x), floats_info("min", min)]).opset(13)
    };
    clip(&[3], &[]).import().unwrap();
    clip(&[3], &[3]).refused("min [3] should be a scalar");
    // A one-element bound is taken as a scalar: it does not give a scalar `x` an axis.
    let m = clip(&[], &[1]).import().unwrap();
    let y = run(&m, vec![f32s(&[], &[-5.0]), f32s(&[1], &[-1.0])]);
    assert_eq!(y[0].shape(), &[] as &[usize]);
    assert_eq!(y[0].to_f64_vec(), [-1.0]);
}

// F10: Gemm.

fn gemm(a: &[i64], b: &[i64], c: Option<&[i64]>) -> Net {
    let mut inputs = vec![floats_info("a", a), floats_info("b", b)];
    let mut names = vec!["a", "b"];
    if let Some(c) = c {
        inputs.push(floats_info("c", c));
        names.push("c");
    }
    Net::new(node("Gemm", "fc", &names, &["y"]), inputs)
}

#[test]
fn gemm_refuses_operands_that_are_not_matrices() {
    gemm(&[2, 3], &[3, 4], None).import().unwrap();
    gemm(&[2, 2, 3], &[3, 4], None).refused("A [2,2,3] should be a matrix (2-D)");
    gemm(&[2, 3], &[3], None).refused("B [3] should be a matrix (2-D)");
}

#[test]
fn gemm_refuses_a_c_that_would_widen_the_product() {
    gemm(&[-1, 3], &[3, 4], Some(&[1, 4])).import().unwrap();
    gemm(&[1, 3], &[3, 4], Some(&[2, 4]))
        .refused("C [2,4] does not broadcast to the product A'·B' [1,4]");
    gemm(&[2, 3], &[3, 4], Some(&[1, 2, 4])).refused("C [1,2,4] does not broadcast");
}

// F11: Conv.

fn conv(w: &[i64], bias: Option<&[i64]>) -> Net {
    let mut inputs = vec![floats_info("x", &[1, 2, 5, 5]), floats_info("w", w)];
    let mut names = vec!["x", "w"];
    if let Some(b) = bias {
        inputs.push(floats_info("b", b));
        names.push("b");
    }
    Net::new(node("Conv", "filter", &names, &["y"]), inputs)
}

#[test]
fn conv_refuses_weights_of_another_rank() {
    conv(&[3, 2, 1, 3], None).import().unwrap();
    conv(&[3, 2, 3], None)
        .refused("the weights [3,2,3] should have the rank of the input [1,2,5,5]");
}

#[test]
fn conv_refuses_a_kernel_shape_unlike_the_weights() {
    let mut net = conv(&[3, 2, 3, 3], None);
    net.node = with_ints(net.node, "kernel_shape", &[3, 3]);
    net.import().unwrap();
    net.node.attribute.clear();
    net.node = with_ints(net.node, "kernel_shape", &[2, 2]);
    net.refused("kernel_shape [2, 2] is not the spatial sizes of the weights [3,2,3,3]");
}

#[test]
fn conv_refuses_a_bias_not_one_per_output_channel() {
    conv(&[4, 2, 3, 3], Some(&[4])).import().unwrap();
    conv(&[4, 2, 3, 3], Some(&[1])).refused("the bias [1] should be 1-D with one value per");
    conv(&[4, 2, 3, 3], Some(&[2, 2])).refused("the bias [2, 2] should be 1-D");
}

// F12: BatchNormalization and InstanceNormalization.

#[test]
fn batch_norm_refuses_statistics_not_one_per_channel() {
    let batch_norm = |mean: &[i64]| {
        let n = node(
            "BatchNormalization",
            "bn",
            &["x", "s", "b", "m", "v"],
            &["y"],
        );
        let inputs = vec![
            floats_info("x", &[2, 3, 4]),
            floats_info("s", &[3]),
            floats_info("b", &[3]),
            floats_info("m", mean),
            floats_info("v", &[3]),
        ];
        Net::new(n, inputs)
    };
    batch_norm(&[3]).import().unwrap();
    batch_norm(&[1]).refused("the mean [1] should have one value per channel (3)");
}

#[test]
fn batch_norm_with_spatial_0_is_unsupported() {
    // Before opset 9, spatial=0 keeps statistics per activation, [C, D]: valid, not per channel.
    let n = node(
        "BatchNormalization",
        "bn",
        &["x", "s", "b", "m", "v"],
        &["y"],
    );
    let mut inputs = vec![floats_info("x", &[2, 3, 4])];
    inputs.extend(["s", "b", "m", "v"].map(|name| floats_info(name, &[3, 4])));
    let net = Net::new(with_int(n, "spatial", 0), inputs).opset(7);
    net.unsupported("BatchNormalization with spatial=0");
}

#[test]
fn instance_norm_refuses_a_scale_not_one_per_channel() {
    let instance_norm = |scale: &[i64]| {
        let n = node("InstanceNormalization", "inorm", &["x", "s", "b"], &["y"]);
        let x = floats_info("x", &[2, 3, 4]);
        Net::new(n, vec![x, floats_info("s", scale), floats_info("b", &[3])])
    };
    instance_norm(&[3]).import().unwrap();
    instance_norm(&[1]).refused("the scale [1] should have one value per channel (3)");
    instance_norm(&[1, 3]).refused("the scale [1, 3] should have one value per channel (3)");
}

// F13: LayerNormalization.

#[test]
fn layer_norm_refuses_a_scale_or_bias_that_would_widen_the_input() {
    let layer_norm = |x: &[i64], scale: &[i64], bias: &[i64]| {
        let n = node("LayerNormalization", "ln", &["x", "s", "b"], &["y"]);
        let inputs = vec![
            floats_info("x", x),
            floats_info("s", scale),
            floats_info("b", bias),
        ];
        Net::new(n, inputs)
    };
    layer_norm(&[3, 4], &[4], &[4]).import().unwrap();
    // ONNX asks only that they broadcast to X: one scale per row is valid.
    layer_norm(&[3, 4], &[3, 1], &[1]).import().unwrap();
    layer_norm(&[1, 4], &[2, 4], &[4])
        .refused("the scale [2,4] does not broadcast to the input [1,4]");
    layer_norm(&[1, 4], &[4], &[5, 1, 4])
        .refused("the bias [5,1,4] does not broadcast to the input [1,4]");
}

// F19: Gather.

#[test]
fn gather_refuses_indices_that_are_not_integers() {
    let gather = |indices: TensorProto| {
        let n = node("Gather", "pick", &["x", "i"], &["y"]);
        Net::new(n, vec![floats_info("x", &[3])]).init(indices)
    };
    gather(ints("i", &[1], &[2])).import().unwrap();
    gather(floats("i", &[1], &[1.7])).refused("the indices should be int32 or int64, not f32");
    // Computed at run time.
    let n = node("Gather", "pick", &["x", "i"], &["y"]);
    let inputs = vec![floats_info("x", &[3]), floats_info("i", &[1])];
    Net::new(n, inputs).refused("the indices should be int32 or int64, not f32");
}

// F14: RNN, GRU and LSTM.

/// `op` over X [2, 1, 3] (T, N, D) with W and R of the given shapes and further inputs
/// `(index, dims)` in increasing order (4, sequence_lens, is an initializer of `dims` 2s).
fn recurrent(op: &str, w: &[i64], r: &[i64], extra: &[(usize, &[i64])]) -> Net {
    let names = ["x", "w", "r", "b", "lens", "h0", "c0", "p"];
    let mut inputs = vec![
        floats_info("x", &[2, 1, 3]),
        floats_info("w", w),
        floats_info("r", r),
    ];
    let (mut used, mut lens) = (vec!["x", "w", "r"], None);
    for &(i, dims) in extra {
        used.resize(i, "");
        used.push(names[i]);
        match i {
            4 => {
                lens = Some(ints(
                    "lens",
                    dims,
                    &vec![2; dims.iter().product::<i64>() as usize],
                ))
            }
            _ => inputs.push(floats_info(names[i], dims)),
        }
    }
    let net = Net::new(node(op, "cell", &used, &["y"]), inputs);
    match lens {
        Some(lens) => net.init(lens),
        None => net,
    }
}

fn lstm(w: &[i64], r: &[i64], extra: &[(usize, &[i64])]) -> Net {
    let mut net = recurrent("LSTM", w, r, extra);
    net.node = with_int(net.node, "hidden_size", 4);
    net
}

#[test]
fn lstm_refuses_weights_not_of_the_gates_hidden_size_and_input() {
    lstm(&[1, 16, 3], &[1, 16, 4], &[]).import().unwrap();
    lstm(&[1, 12, 3], &[1, 16, 4], &[])
        .refused("W [1,12,3] should be [1,16,3] (for 1 direction(s), 4 gate(s) and hidden_size 4)");
    lstm(&[1, 16, 2], &[1, 16, 4], &[]).refused("W [1,16,2] should be [1,16,3]");
    lstm(&[1, 16, 3], &[1, 16, 3], &[]).refused("R [1,16,3] should be [1,16,4]");
    let mut wide = lstm(&[1, 16, 3], &[1, 16, 4], &[]);
    wide.node.attribute.clear();
    wide.node = with_int(wide.node, "hidden_size", 5);
    wide.refused("W [1,16,3] should be [1,20,3]");
}

#[test]
fn lstm_refuses_weights_for_another_number_of_directions() {
    lstm(&[2, 16, 3], &[2, 16, 4], &[]).refused("W [2,16,3] should be [1,16,3]");
    let bidirectional = |w: &[i64], r: &[i64]| {
        let mut net = lstm(w, r, &[]);
        net.node.attribute.push(AttributeProto {
            name: Some("direction".into()),
            s: Some(b"bidirectional".to_vec()),
            r#type: Some(3),
            ..Default::default()
        });
        net
    };
    bidirectional(&[2, 16, 3], &[2, 16, 4]).import().unwrap();
    bidirectional(&[1, 16, 3], &[1, 16, 4]).refused("W [1,16,3] should be [2,16,3] (for 2");
}

#[test]
fn lstm_refuses_biases_states_and_lengths_of_other_shapes() {
    let (w, r) = (&[1, 16, 3][..], &[1, 16, 4][..]);
    let all: [(usize, &[i64]); 5] = [
        (3, &[1, 32]),
        (4, &[1]),
        (5, &[1, 1, 4]),
        (6, &[1, 1, 4]),
        (7, &[1, 12]),
    ];
    lstm(w, r, &all).import().unwrap();
    lstm(w, r, &[(3, &[1, 16])]).refused("B [1,16] should be [1,32]");
    lstm(w, r, &[(4, &[2])]).refused("sequence_lens [2] should be [1]");
    lstm(w, r, &[(5, &[1, 2, 4])]).refused("initial_h [1,2,4] should be [1,1,4]");
    lstm(w, r, &[(6, &[1, 1, 3])]).refused("initial_c [1,1,3] should be [1,1,4]");
    lstm(w, r, &[(7, &[1, 16])]).refused("P [1,16] should be [1,12]");
}

#[test]
fn gru_and_rnn_refuse_weights_for_another_gate_count() {
    let with_hidden = |net: Net| Net {
        node: with_int(net.node.clone(), "hidden_size", 4),
        ..net
    };
    with_hidden(recurrent("GRU", &[1, 12, 3], &[1, 12, 4], &[]))
        .import()
        .unwrap();
    with_hidden(recurrent("GRU", &[1, 16, 3], &[1, 16, 4], &[]))
        .refused("W [1,16,3] should be [1,12,3] (for 1 direction(s), 3 gate(s)");
    with_hidden(recurrent("RNN", &[1, 4, 3], &[1, 4, 4], &[(3, &[1, 8])]))
        .import()
        .unwrap();
    with_hidden(recurrent("RNN", &[1, 4, 3], &[1, 4, 4], &[(3, &[1, 4])]))
        .refused("B [1,4] should be [1,8]");
}

#[test]
fn rnn_without_hidden_size_takes_it_from_r() {
    // ONNX's hidden_size is optional: R [D, G·H, H] gives it.
    recurrent("RNN", &[1, 4, 3], &[1, 4, 4], &[])
        .import()
        .unwrap();
}

#[test]
fn rnn_in_layout_1_reads_the_initial_state_batch_first() {
    // X [N=2, T=1, D=1] and initial_h [N=2, 1, H=1]; W = 0 and R = 1, so Y_h = tanh(initial_h).
    let n = with_int(
        node("RNN", "cell", &["x", "w", "r", "", "", "h0"], &["y", "yh"]),
        "layout",
        1,
    );
    let inputs = vec![floats_info("x", &[2, 1, 1]), floats_info("h0", &[2, 1, 1])];
    let net = Net::new(with_int(n, "hidden_size", 1), inputs)
        .init(floats("w", &[1, 1, 1], &[0.0]))
        .init(floats("r", &[1, 1, 1], &[1.0]));
    let m = net.import().unwrap();
    let x = f32s(&[2, 1, 1], &[0.0, 0.0]);
    let y = run(&m, vec![x, f32s(&[2, 1, 1], &[0.5, -0.5])]);
    assert_eq!(y[1].shape(), &[2, 1, 1]);
    let want = [0.5f64.tanh(), (-0.5f64).tanh()];
    for (got, want) in y[1].to_f64_vec().iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{:?}", y[1].to_f64_vec());
    }
}

// F15: Resize and Upsample.

fn resize(scales: Option<&[f32]>, sizes: Option<&[i64]>) -> Net {
    let n = node("Resize", "scale", &["x", "", "scales", "sizes"], &["y"]);
    let mut net = Net::new(n, vec![floats_info("x", &[1, 1, 2, 2])]).opset(19);
    match scales {
        Some(s) => net = net.init(floats("scales", &[s.len() as i64], s)),
        None => net.node.input[2].clear(),
    }
    match sizes {
        Some(s) => net = net.init(ints("sizes", &[s.len() as i64], s)),
        None => net.node.input[3].clear(),
    }
    net
}

#[test]
fn resize_refuses_both_scales_and_sizes() {
    resize(None, Some(&[1, 1, 4, 4])).import().unwrap();
    resize(Some(&[]), Some(&[1, 1, 4, 4])).import().unwrap();
    resize(Some(&[1.0, 1.0, 2.0, 2.0]), Some(&[1, 1, 4, 4]))
        .refused("scales [4] and sizes [1, 1, 4, 4] are both given");
}

#[test]
fn resize_refuses_sizes_not_one_per_axis() {
    resize(None, Some(&[1, 1, 4, 4, 4])).refused(
        "sizes [1, 1, 4, 4, 4] should have one entry per axis of the rank-4 input [1, 1, 2, 2]",
    );
    let mut net = resize(None, Some(&[1, 1, 4, 4]));
    net.node = with_ints(net.node, "axes", &[2, 3]);
    net.refused("sizes [1, 1, 4, 4] should have one entry per axis of the axes [2, 3]");
    let mut net = resize(None, Some(&[4, 4]));
    net.node = with_ints(net.node, "axes", &[2, 3]);
    net.import().unwrap();
}

#[test]
fn upsample_refuses_a_scale_below_1() {
    let upsample = |scales: &[f32]| {
        let n = node("Upsample", "grow", &["x", "scales"], &["y"]);
        Net::new(n, vec![floats_info("x", &[1, 1, 2, 2])])
            .init(floats("scales", &[4], scales))
            .opset(9)
    };
    upsample(&[1.0, 1.0, 2.0, 2.0]).import().unwrap();
    upsample(&[1.0, 1.0, 0.5, 2.0]).refused(
        "the scales [1.0, 1.0, 0.5, 2.0] of the input [1, 1, 2, 2] include 0.5: Upsample's \
         scales should be at least 1",
    );
}

// F16: Attention.

fn attention(k: &[i64], v: &[i64], past: [Option<&[i64]>; 2]) -> Net {
    let mut inputs = vec![
        floats_info("q", &[1, 4, 3, 8]),
        floats_info("k", k),
        floats_info("v", v),
    ];
    let mut names = vec!["q", "k", "v", ""];
    for (name, dims) in ["pk", "pv"].into_iter().zip(past) {
        match dims {
            Some(d) => {
                inputs.push(floats_info(name, d));
                names.push(name);
            }
            None => names.push(""),
        }
    }
    let n = node(
        "Attention",
        "attend",
        &names,
        &["y", "present_k", "present_v"],
    );
    Net::new(n, inputs).opset(23)
}

#[test]
fn attention_refuses_one_cache_without_the_other() {
    let kv = &[1, 2, 3, 8][..];
    attention(kv, kv, [Some(&[1, 2, 2, 8]), Some(&[1, 2, 2, 8])])
        .import()
        .unwrap();
    attention(kv, kv, [Some(&[1, 2, 2, 8]), None])
        .refused("past_key [1,2,2,8] is given without past_value");
    attention(kv, kv, [None, Some(&[1, 2, 2, 8])])
        .refused("past_value [1,2,2,8] is given without past_key");
}

#[test]
fn attention_refuses_head_counts_that_disagree() {
    let kv = &[1, 2, 3, 8][..];
    attention(kv, &[1, 1, 3, 8], [None, None])
        .refused("K [1,2,3,8] has 2 heads but V [1,1,3,8] has 1");
    attention(&[1, 3, 3, 8], &[1, 3, 3, 8], [None, None]).refused(
        "the 4 query heads of Q [1,4,3,8] do not group over the 3 key heads of K [1,3,3,8]",
    );
    let with_heads = |q: i64, kv_heads: i64| {
        let net = attention(kv, kv, [None, None]);
        let n = with_int(net.node.clone(), "q_num_heads", q);
        Net {
            node: with_int(n, "kv_num_heads", kv_heads),
            ..net
        }
    };
    with_heads(4, 2).import().unwrap();
    with_heads(3, 2).refused("Q [1,4,3,8] has 4 heads, but q_num_heads=3");
    with_heads(4, 1).refused("K [1,2,3,8] has 2 heads, but kv_num_heads=1");
}

// F17: axes of ops on shape values with symbolic sizes.

/// `reshape(x, concat(unsqueeze(shape(x)[0], axes), [3]; axis))` on `x: [batch, 3]`: the shape
/// arithmetic an exporter writes for a dynamic batch.
fn dynamic_reshape(axes: &[i64], axis: i64) -> Result<Model, String> {
    let nodes = vec![
        node("Shape", "shape", &["x"], &["s"]),
        node("Gather", "batch", &["s", "zero"], &["n"]),
        node("Unsqueeze", "grow", &["n", "axes"], &["u"]),
        with_int(
            node("Concat", "join", &["u", "three"], &["target"]),
            "axis",
            axis,
        ),
        node("Reshape", "again", &["x", "target"], &["y"]),
    ];
    let initializer = vec![
        ints("zero", &[], &[0]),
        ints("axes", &[axes.len() as i64], axes),
        ints("three", &[1], &[3]),
    ];
    let input = vec![floats_info("x", &[-1, 3])];
    let m = model_of(17, nodes, input, initializer, named(&["y"]));

    import_bytes(&m.encode_to_vec(), None).map_err(|e| e.to_string())
}

#[test]
fn shape_arithmetic_on_symbolic_sizes_refuses_axes_a_shape_value_lacks() {
    // Both were ignored: the entries went on axis 0 whatever the axes said.
    dynamic_reshape(&[0], 0).unwrap();
    dynamic_reshape(&[-1], -1).unwrap();
    let e = dynamic_reshape(&[1], 0).unwrap_err();
    assert!(e.contains(r#""grow" (Unsqueeze"#), "{e}");
    assert!(
        e.contains("should name the one axis of a 1-D shape value"),
        "{e}"
    );
    let e = dynamic_reshape(&[0], 1).unwrap_err();
    assert!(e.contains(r#""join" (Concat"#), "{e}");
    assert!(
        e.contains("axis 1 is out of range for 1-D shape values"),
        "{e}"
    );
}

/// A sequence too long to unroll is refused by name: a fuzzed length of 2³¹ once asked for
/// 32 GiB of unrolled steps and aborted the process.
#[test]
fn lstm_refuses_a_sequence_too_long_to_unroll() {
    let mut net = lstm(&[1, 16, 3], &[1, 16, 4], &[]);
    net.inputs[0] = floats_info("x", &[1 << 31, 1, 3]);
    net.refused("a sequence of 2147483648 steps (the sequence is unrolled; at most 65536");
}

// Attributes of a valid value that Kiln does not implement are unsupported, not invalid.

#[test]
fn unimplemented_attribute_values_are_unsupported_nodes() {
    let mut coupled = lstm(&[1, 16, 3], &[1, 16, 4], &[]);
    coupled.node = with_int(coupled.node, "input_forget", 1);
    coupled.unsupported("attribute input_forget=1 is not supported");

    let pool = with_int(
        with_ints(
            node("MaxPool", "pool", &["x"], &["y"]),
            "kernel_shape",
            &[2, 2],
        ),
        "storage_order",
        1,
    );
    let column_major = Net::new(pool, vec![floats_info("x", &[1, 1, 4, 4])]);
    column_major.unsupported("attribute storage_order=1 is not supported");
}
