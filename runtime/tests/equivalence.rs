//! Eager vs traced: each function or model runs eagerly (with `backward()`) and compiled with
//! `to_static` (with the autodiff pass over the traced program). Forward values and gradients
//! — of the inputs and of every parameter — must agree, and the traced IR is snapshotted.

use kiln_backend::Array;
use kiln_ir::{BinaryOp, CompareOp, Conv2dAttrs, DType, Dim, Pool2dAttrs, Shape, Type};
use kiln_runtime::Init;
use kiln_runtime::eager::CustomOpError;
use kiln_runtime::eager::nn::{
    self, Dropout, Embedding, Layer, LayerNorm, Linear, Parameter, Relu, Sequential,
};
use kiln_runtime::eager::{self, CustomOp, EagerResult, Tensor};
use std::sync::Arc;

/// Deterministic data in [-1, 1).
fn data(n: usize, seed: u64) -> Vec<f32> {
    let s = kiln_backend::random::Stream::new(seed, 0);
    (0..n as u64)
        .map(|i| s.uniform(i, -1.0, 1.0) as f32)
        .collect()
}

fn input(shape: &[usize], seed: u64) -> Tensor {
    Tensor::from_f32(shape, data(shape.iter().product(), seed)).unwrap()
}

fn labels(values: &[i64]) -> Tensor {
    Tensor::new(Array::I64(ndarray::arr1(values).into_dyn()))
}

/// An input: its eager value and its type for tracing (batch dimensions symbolic).
struct Input {
    name: &'static str,
    value: Tensor,
    ty: Type,
}

fn batched(name: &'static str, value: Tensor) -> Input {
    let ty = value.ty();
    let mut dims = ty.shape.0.clone();
    dims[0] = Dim::sym("N");
    Input {
        name,
        value,
        ty: Type::new(ty.dtype, Shape(dims)),
    }
}

fn fixed(name: &'static str, value: Tensor) -> Input {
    let ty = value.ty();
    Input { name, value, ty }
}

#[track_caller]
fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}[{i}]: traced {g}, eager {w}"
        );
    }
}

/// Runs `f` both ways on `inputs` and compares; `params` are the model's parameters.
fn equivalent(
    name: &str,
    inputs: Vec<Input>,
    params: Vec<Parameter>,
    f: impl Fn(&[Tensor]) -> EagerResult<Tensor>,
) {
    // Eager: float inputs require grad; loss = sum(f(x) * w) with fixed weights.
    let eager_inputs: Vec<Tensor> = inputs
        .iter()
        .map(|i| {
            if i.value.dtype().is_float() {
                i.value.clone().requires_grad().unwrap()
            } else {
                i.value.clone()
            }
        })
        .collect();
    for p in &params {
        p.zero_grad();
    }
    let out = f(&eager_inputs).unwrap();
    let n = out.ty().shape.num_elements().unwrap();
    let weights = Tensor::from_f32(&out.ty().shape.as_fixed().unwrap(), data(n, 999)).unwrap();
    let loss = out.mul(&weights).unwrap().sum_all().unwrap();
    loss.backward().unwrap();

    // Traced: the same function, compiled; gradients from the autodiff pass. The weights are
    // an input typed like the traced output (whose batch dimension is symbolic).
    let mut types: Vec<(&str, Type)> = inputs.iter().map(|i| (i.name, i.ty.clone())).collect();
    let probe = eager::to_static(&types, |t| Ok(vec![f(t)?])).unwrap();
    let out_ty = probe.program().value_type(probe.outputs()[0]).clone();
    types.push(("weights", out_ty));
    let mut compiled = eager::to_static(&types, |t| {
        let out = f(&t[..t.len() - 1])?;
        Ok(vec![out.mul(&t[t.len() - 1])?.sum_all()?, out])
    })
    .unwrap();
    insta::assert_snapshot!(name, compiled.module("f").unwrap().to_string());
    let mut args: Vec<&Tensor> = inputs.iter().map(|i| &i.value).collect();
    args.push(&weights);
    let outs = compiled.call(&args).unwrap();
    close(
        "output",
        &outs[1].to_f64_vec().unwrap(),
        &out.to_f64_vec().unwrap(),
    );
    let (traced_loss, grads) = compiled.gradients(&args, 0).unwrap();
    close(
        "loss",
        &traced_loss.to_f64_vec().unwrap(),
        &loss.to_f64_vec().unwrap(),
    );
    for (i, input) in eager_inputs.iter().enumerate() {
        if let Some(g) = input.grad() {
            let traced = grads.inputs[i]
                .as_ref()
                .expect("a traced gradient for every float input");
            close(
                &format!("d/d{}", inputs[i].name),
                &traced.to_f64_vec().unwrap(),
                &g.to_f64_vec().unwrap(),
            );
        }
    }
    for p in &params {
        let eager_grad = p.grad().map(|g| g.to_f64_vec().unwrap());
        let traced = grads
            .parameters
            .iter()
            .find(|(n, _)| n == p.name())
            .map(|(_, g)| g.to_f64_vec().unwrap());
        match (eager_grad, traced) {
            (Some(e), Some(t)) => close(&format!("d/d{}", p.name()), &t, &e),
            (e, t) => panic!("{}: eager {e:?} vs traced {t:?}", p.name()),
        }
    }
}

#[test]
fn mlp() {
    eager::reset();
    let model = Sequential::new()
        .push(Linear::new("fc1", 4, 8).unwrap())
        .push(Relu)
        .push(Linear::new("fc2", 8, 3).unwrap());
    equivalent(
        "mlp",
        vec![batched("x", input(&[5, 4], 1))],
        model.parameters(),
        |t| model.forward(&t[0]),
    );
}

#[test]
fn residual_block() {
    eager::reset();
    let (a, b) = (
        Linear::new("res.a", 6, 6).unwrap(),
        Linear::new("res.b", 6, 6).unwrap(),
    );
    let params = [a.parameters(), b.parameters()].concat();
    equivalent(
        "residual_block",
        vec![batched("x", input(&[3, 6], 2))],
        params,
        |t| {
            let h = a.forward(&t[0])?.relu()?;
            t[0].add(&b.forward(&h)?)
        },
    );
}

#[test]
fn layer_norm() {
    eager::reset();
    let ln = LayerNorm::new("ln", 5, 1e-5).unwrap();
    equivalent(
        "layer_norm",
        vec![batched("x", input(&[4, 5], 3))],
        ln.parameters(),
        |t| ln.forward(&t[0]),
    );
}

#[test]
fn softmax_cross_entropy() {
    eager::reset();
    let fc = Linear::new("clf", 4, 3).unwrap();
    let inputs = vec![
        batched("x", input(&[6, 4], 4)),
        batched("y", labels(&[0, 2, 1, 1, 0, 2])),
    ];
    equivalent("softmax_cross_entropy", inputs, fc.parameters(), |t| {
        nn::cross_entropy(&fc.forward(&t[0])?, &t[1])
    });
}

/// `swish(x) = x · sigmoid(x)` as a custom op with a hand-written backward.
struct Swish;

impl CustomOp for Swish {
    fn name(&self) -> &str {
        "equivalence.swish"
    }
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        let [Array::F32(x)] = inputs else {
            return Err("swish takes one f32 tensor".into());
        };
        Ok(vec![Array::F32(x.mapv(|v| v / (1.0 + (-v).exp())))])
    }
    fn backward(
        &self,
        inputs: &[Array],
        _: &[Array],
        grads: &[Array],
    ) -> Result<Vec<Array>, CustomOpError> {
        let ([Array::F32(x)], [Array::F32(g)]) = (inputs, grads) else {
            return Err("f32 only".into());
        };
        let d = x.mapv(|v| {
            let s = 1.0 / (1.0 + (-v).exp());
            s + v * s * (1.0 - s)
        });
        Ok(vec![Array::F32(d * g)])
    }
}

#[test]
fn custom_op() {
    eager::reset();
    eager::register_custom_op(Arc::new(Swish)).unwrap();
    let fc = Linear::new("sw", 3, 4).unwrap();
    equivalent(
        "custom_op",
        vec![batched("x", input(&[5, 3], 5))],
        fc.parameters(),
        |t| {
            let h = fc.forward(&t[0])?;
            Ok(eager::custom::call("equivalence.swish", &[&h])?.remove(0))
        },
    );
}

/// `cond` on the sign of the input's sum: both branches, eagerly and traced.
fn branchy(t: &[Tensor], w: &Parameter) -> EagerResult<Tensor> {
    let w = w.tensor()?;
    let positive = t[0].sum_all()?.compare_scalar(CompareOp::Gt, 0.0)?;
    let r = eager::cond(
        &positive,
        || Ok(vec![t[0].mul(&w)?.tanh()?]),
        || Ok(vec![t[0].exp()?.mul(&w)?]),
    )?;
    Ok(r[0].clone())
}

#[test]
fn cond_then_branch() {
    eager::reset();
    let w = Parameter::new(
        "w",
        DType::F32,
        &[3],
        Init::Uniform {
            low: 0.5,
            high: 1.5,
        },
    )
    .unwrap();
    let x = Tensor::from_f32(&[2, 3], vec![0.5, 0.1, 0.9, 0.3, 0.2, 0.4]).unwrap();
    equivalent(
        "cond_then_branch",
        vec![batched("x", x)],
        vec![w.clone()],
        |t| branchy(t, &w),
    );
}

#[test]
fn cond_else_branch() {
    eager::reset();
    let w = Parameter::new(
        "w",
        DType::F32,
        &[3],
        Init::Uniform {
            low: 0.5,
            high: 1.5,
        },
    )
    .unwrap();
    let x = Tensor::from_f32(&[2, 3], vec![-0.5, 0.1, -0.9, -0.3, 0.2, -0.4]).unwrap();
    equivalent(
        "cond_else_branch",
        vec![batched("x", x)],
        vec![w.clone()],
        |t| branchy(t, &w),
    );
}

/// `h ← tanh(h @ W)` three times, counted by a loop variable.
#[test]
fn while_loop() {
    eager::reset();
    let w = Parameter::new("w", DType::F32, &[4, 4], Init::XavierNormal).unwrap();
    equivalent(
        "while_loop",
        vec![batched("h", input(&[2, 4], 6))],
        vec![w.clone()],
        |t| {
            let zero = Tensor::new(Array::I32(ndarray::arr0(0).into_dyn()));
            let out = eager::while_loop(
                &[zero, t[0].clone()],
                |c| c[0].compare_scalar(CompareOp::Lt, 3.0),
                |c| {
                    Ok(vec![
                        c[0].binary_scalar(BinaryOp::Add, 1.0)?,
                        c[1].matmul(&w.tensor()?)?.tanh()?,
                    ])
                },
            )?;
            Ok(out[1].clone())
        },
    );
}

/// An RNN cell unrolled with `while_loop`: `h ← tanh(x[t] @ Wx + h @ Wh + b)` for each step t.
#[test]
fn rnn_cell_unrolled() {
    eager::reset();
    let wx = Parameter::new("rnn.wx", DType::F32, &[3, 5], Init::XavierUniform).unwrap();
    let wh = Parameter::new("rnn.wh", DType::F32, &[5, 5], Init::XavierUniform).unwrap();
    let b = Parameter::new("rnn.b", DType::F32, &[5], Init::Constant(0.1)).unwrap();
    let params = vec![wx.clone(), wh.clone(), b.clone()];
    let inputs = vec![
        fixed("xs", input(&[4, 2, 3], 7)),
        fixed("h0", input(&[2, 5], 8)),
    ];
    equivalent("rnn_cell_unrolled", inputs, params, |t| {
        let steps = 4.0;
        let zero = Tensor::new(Array::I32(ndarray::arr0(0).into_dyn()));
        let out = eager::while_loop(
            &[zero, t[1].clone()],
            |c| c[0].compare_scalar(CompareOp::Lt, steps),
            |c| {
                let x_t = t[0].gather(&c[0], 0)?;
                let h = x_t
                    .matmul(&wx.tensor()?)?
                    .add(&c[1].matmul(&wh.tensor()?)?)?
                    .add(&b.tensor()?)?
                    .tanh()?;
                Ok(vec![c[0].binary_scalar(BinaryOp::Add, 1.0)?, h])
            },
        )?;
        Ok(out[1].clone())
    });
}

/// One GAN step's losses: the discriminator on real and generated samples, the generator's
/// non-saturating loss.
#[test]
fn gan_step() {
    eager::reset();
    let g1 = Linear::new("gen.fc1", 1, 8).unwrap();
    let g2 = Linear::new("gen.out", 8, 1).unwrap();
    let d1 = Linear::new("disc.fc1", 1, 8).unwrap();
    let d2 = Linear::new("disc.out", 8, 1).unwrap();
    let params = [
        g1.parameters(),
        g2.parameters(),
        d1.parameters(),
        d2.parameters(),
    ]
    .concat();
    let inputs = vec![
        batched("z", input(&[6, 1], 9)),
        batched("real", input(&[6, 1], 10)),
    ];
    equivalent("gan_step", inputs, params, |t| {
        let fake = g2.forward(&g1.forward(&t[0])?.tanh()?)?;
        let disc = |x: &Tensor| d2.forward(&d1.forward(x)?.tanh()?);
        let ones = t[0]
            .binary_scalar(BinaryOp::Mul, 0.0)?
            .binary_scalar(BinaryOp::Add, 1.0)?;
        let zeros = t[0].binary_scalar(BinaryOp::Mul, 0.0)?;
        let d_loss = nn::binary_cross_entropy_with_logits(&disc(&t[1])?, &ones)?.add(
            &nn::binary_cross_entropy_with_logits(&disc(&fake)?, &zeros)?,
        )?;
        let g_loss = nn::binary_cross_entropy_with_logits(&disc(&fake)?, &ones)?;
        Tensor::concat(
            &[
                &d_loss.reshape(Shape::fixed(&[1]))?,
                &g_loss.reshape(Shape::fixed(&[1]))?,
            ],
            0,
        )
    });
}

#[test]
fn embedding_mean_pooling() {
    eager::reset();
    let emb = Embedding::new("emb", 10, 4).unwrap();
    let fc = Linear::new("head", 4, 2).unwrap();
    let params = [emb.parameters(), fc.parameters()].concat();
    let tokens = Tensor::new(Array::I64(
        ndarray::Array2::from_shape_vec((3, 4), vec![1, 5, 5, 9, 0, 2, 3, 9, 7, 7, 7, 1])
            .unwrap()
            .into_dyn(),
    ));
    equivalent(
        "embedding_mean_pooling",
        vec![batched("tokens", tokens)],
        params,
        |t| fc.forward(&emb.forward(&t[0])?.mean(&[1], false)?),
    );
}

/// One head of scaled dot-product attention over `[B, T, D]`.
#[test]
fn attention() {
    eager::reset();
    let (q, k, v) = (
        Linear::new("q", 4, 4).unwrap(),
        Linear::new("k", 4, 4).unwrap(),
        Linear::new("v", 4, 4).unwrap(),
    );
    let params = [q.parameters(), k.parameters(), v.parameters()].concat();
    equivalent(
        "attention",
        vec![batched("x", input(&[2, 3, 4], 11))],
        params,
        |t| {
            let scores = q
                .forward(&t[0])?
                .matmul_t(&k.forward(&t[0])?, false, true)?
                .binary_scalar(BinaryOp::Mul, 0.5)?;
            scores.softmax(2)?.matmul(&v.forward(&t[0])?)
        },
    );
}

/// `gelu(x) = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, written out with scalars.
#[test]
fn gelu_formula() {
    eager::reset();
    equivalent(
        "gelu_formula",
        vec![batched("x", input(&[3, 5], 12))],
        vec![],
        |t| {
            let x = &t[0];
            let cube = x.mul(x)?.mul(x)?;
            let inner = x
                .add(&cube.binary_scalar(BinaryOp::Mul, 0.044715)?)?
                .binary_scalar(BinaryOp::Mul, 0.7978845608028654)?;
            x.binary_scalar(BinaryOp::Mul, 0.5)?
                .mul(&inner.tanh()?.binary_scalar(BinaryOp::Add, 1.0)?)
        },
    );
}

/// Broadcasting arithmetic and an evaluation-mode dropout (the identity).
#[test]
fn broadcasting_and_dropout_in_eval_mode() {
    eager::reset();
    let scale = Parameter::new("scale", DType::F32, &[1, 4], Init::Constant(1.5)).unwrap();
    let mut drop = Dropout::new(0.5, 3);
    drop.set_training(false);
    equivalent(
        "broadcasting_and_dropout",
        vec![
            batched("x", input(&[3, 4], 13)),
            fixed("row", input(&[4], 14)),
        ],
        vec![scale.clone()],
        |t| {
            let y = t[0]
                .mul(&scale.tensor()?)?
                .sub(&t[1])?
                .div(&t[1].abs()?.binary_scalar(BinaryOp::Add, 1.0)?)?;
            drop.forward(&y)?.maximum(&t[1])
        },
    );
}

#[test]
fn small_cnn() {
    eager::reset();
    let same = Conv2dAttrs {
        padding: [(1, 1), (1, 1)],
        ..Conv2dAttrs::default()
    };
    let conv1 = nn::Conv2d::new("cnn.conv1", [1, 3], [3, 3], same).unwrap();
    let strided = Conv2dAttrs {
        strides: [2, 2],
        groups: 3,
        ..Conv2dAttrs::default()
    };
    let conv2 = nn::Conv2d::new("cnn.conv2", [3, 6], [2, 2], strided).unwrap();
    let fc = Linear::new("cnn.fc", 6, 2).unwrap();
    let mut params = conv1.parameters();
    params.extend(conv2.parameters());
    params.extend(fc.parameters());
    equivalent(
        "small_cnn",
        vec![batched("x", input(&[2, 1, 6, 6], 11))],
        params,
        |t| {
            let h = conv1.forward(&t[0])?.relu()?;
            let h = nn::MaxPool2d(Pool2dAttrs::new([2, 2], [1, 1])).forward(&h)?;
            let h = nn::AvgPool2d(Pool2dAttrs::new([2, 2], [1, 1])).forward(&h)?;
            let h = conv2.forward(&h)?.tanh()?;
            let h = nn::GlobalAvgPool.forward(&h)?;
            fc.forward(&nn::Flatten.forward(&h)?)
        },
    );
}

#[test]
fn lstm_through_time() {
    eager::reset();
    let lstm = nn::Lstm::new("seq.lstm", 3, 4).unwrap();
    equivalent(
        "lstm_through_time",
        vec![batched("x", input(&[2, 5, 3], 12))],
        lstm.parameters(),
        |t| lstm.last(&t[0]),
    );
}

#[test]
fn gru_sequence_outputs() {
    eager::reset();
    let gru = nn::Gru::new("seq.gru", 3, 4).unwrap();
    equivalent(
        "gru_sequence_outputs",
        vec![batched("x", input(&[2, 4, 3], 13))],
        gru.parameters(),
        |t| gru.forward(&t[0]),
    );
}

/// A CNN with batch normalisation after its convolution, in training or evaluation mode.
fn cnn_with_batch_norm(name: &str, training: bool) {
    eager::reset();
    let same = Conv2dAttrs {
        padding: [(1, 1), (1, 1)],
        ..Conv2dAttrs::default()
    };
    let conv = nn::Conv2d::new(&format!("{name}.conv"), [2, 4], [3, 3], same).unwrap();
    let mut bn = nn::BatchNorm::new(&format!("{name}.bn"), 4).unwrap();
    let fc = Linear::new(&format!("{name}.fc"), 4, 3).unwrap();
    if !training {
        // Running statistics that are not the initial ones.
        let stats = |v: [f32; 4]| Array::F32(ndarray::arr1(&v).into_dyn());
        bn.running_mean.set(stats([0.1, -0.2, 0.3, 0.0])).unwrap();
        bn.running_var.set(stats([0.5, 1.5, 2.0, 0.8])).unwrap();
        bn.set_training(false);
    }
    let mut params = conv.parameters();
    params.extend(bn.parameters());
    params.extend(fc.parameters());
    equivalent(
        name,
        vec![batched("x", input(&[3, 2, 4, 4], 14))],
        params,
        |t| {
            let h = bn.forward(&conv.forward(&t[0])?)?.relu()?;
            let h = nn::MaxPool2d(Pool2dAttrs::new([2, 2], [2, 2])).forward(&h)?;
            fc.forward(&nn::GlobalAvgPool.forward(&h)?)
        },
    );
}

#[test]
fn cnn_with_batch_norm_training() {
    cnn_with_batch_norm("bn_train", true);
}

#[test]
fn cnn_with_batch_norm_evaluation() {
    cnn_with_batch_norm("bn_eval", false);
}

#[test]
fn transformer_encoder_block() {
    eager::reset();
    let attention = nn::SelfAttention::new("tf.attention", 6, 4).unwrap();
    let norm1 = LayerNorm::new("tf.norm1", 6, 1e-5).unwrap();
    let mlp1 = Linear::new("tf.mlp1", 6, 12).unwrap();
    let mlp2 = Linear::new("tf.mlp2", 12, 6).unwrap();
    let norm2 = LayerNorm::new("tf.norm2", 6, 1e-5).unwrap();
    let mut params = attention.parameters();
    for layer in [&norm1 as &dyn Layer, &mlp1, &mlp2, &norm2] {
        params.extend(layer.parameters());
    }
    equivalent(
        "transformer_encoder_block",
        vec![batched("x", input(&[2, 3, 6], 15))],
        params,
        |t| {
            let h = norm1.forward(&t[0].add(&attention.forward(&t[0])?)?)?;
            let m = mlp2.forward(&mlp1.forward(&h)?.gelu()?)?;
            norm2.forward(&h.add(&m)?)
        },
    );
}

/// The pre-norm encoder layer with causal multi-head attention, over a symbolic batch (its
/// weights' gradients then come from batched products and a sum).
#[test]
fn pre_norm_causal_transformer_encoder_layer() {
    eager::reset();
    let layer = nn::TransformerEncoderLayer::new("pre", [6, 2, 12], true).unwrap();
    equivalent(
        "pre_norm_causal_transformer_encoder_layer",
        vec![batched("x", input(&[2, 4, 6], 17))],
        layer.parameters(),
        |t| layer.forward(&t[0]),
    );
}

#[test]
fn mlp_with_batch_norm_1d() {
    eager::reset();
    let fc = Linear::new("bn1d.fc", 4, 3).unwrap();
    let bn = nn::BatchNorm::new("bn1d.bn", 3).unwrap();
    let mut params = fc.parameters();
    params.extend(bn.parameters());
    equivalent(
        "mlp_with_batch_norm_1d",
        vec![batched("x", input(&[5, 4], 16))],
        params,
        |t| bn.forward(&fc.forward(&t[0])?)?.sigmoid(),
    );
}

#[test]
fn dilated_convolution_and_padded_average_pooling() {
    eager::reset();
    let dilated = Conv2dAttrs {
        padding: [(2, 1), (1, 2)],
        dilation: [2, 2],
        ..Conv2dAttrs::default()
    };
    let conv = nn::Conv2d::new("dil.conv", [2, 3], [3, 2], dilated).unwrap();
    let pool = Pool2dAttrs {
        window: [3, 3],
        strides: [2, 2],
        padding: [(1, 1), (1, 1)],
        channels_last: false,
    };
    equivalent(
        "dilated_convolution_and_padded_average_pooling",
        vec![batched("x", input(&[2, 2, 5, 5], 17))],
        conv.parameters(),
        |t| conv.forward(&t[0])?.avg_pool2d(pool)?.tanh(),
    );
}

#[test]
fn gru_last_state() {
    eager::reset();
    let gru = nn::Gru::new("last.gru", 2, 3).unwrap();
    let fc = Linear::new("last.fc", 3, 2).unwrap();
    let mut params = gru.parameters();
    params.extend(fc.parameters());
    equivalent(
        "gru_last_state",
        vec![batched("x", input(&[3, 6, 2], 18))],
        params,
        |t| fc.forward(&gru.last(&t[0])?),
    );
}

#[test]
fn lstm_sequence_outputs() {
    eager::reset();
    let lstm = nn::Lstm::new("all.lstm", 2, 3).unwrap();
    equivalent(
        "lstm_sequence_outputs",
        vec![batched("x", input(&[2, 4, 2], 19))],
        lstm.parameters(),
        |t| lstm.forward(&t[0]),
    );
}
