//! Composites (softmax, losses, layer norm) are written once: the static layers and eager code
//! build the same values, and inputs a composite cannot take are errors that name it.

use kiln_backend::Array;
use kiln_ir::{DType, Dim};
use kiln_runtime::eager::{self, Tensor, nn};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{Fetch, Program, Session};
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize], v: &[f32]) -> Array {
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

const LOGITS: [f32; 6] = [0.5, -1.0, 2.0, 0.0, 0.25, -0.75];

#[test]
fn static_and_eager_cross_entropy_agree() {
    let mut p = Program::with_seed(0);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(3)])
        .unwrap();
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")]).unwrap();
    let loss = layers::softmax_cross_entropy(&mut p, x, y).unwrap();
    let mut s = Session::new(&p).unwrap();
    let labels = Array::I64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![2, 0]).unwrap());
    let feeds = [("x", f32s(&[2, 3], &LOGITS)), ("y", labels.clone())];
    let got = s.run(&[Fetch::from(loss)], &feeds).unwrap()[0].to_f64_vec()[0];

    let eager = nn::cross_entropy(
        &Tensor::from_f32(&[2, 3], LOGITS.to_vec()).unwrap(),
        &Tensor::new(labels),
    )
    .unwrap()
    .item()
    .unwrap();
    // The formula, in f64: -(log softmax(row 0)[2] + log softmax(row 1)[0]) / 2.
    let lse = |r: &[f32]| r.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
    let want = -((f64::from(LOGITS[2]) - lse(&LOGITS[..3]))
        + (f64::from(LOGITS[3]) - lse(&LOGITS[3..])))
        / 2.0;
    assert!((got - want).abs() < 1e-6, "static {got} vs {want}");
    assert!((eager - want).abs() < 1e-6, "eager {eager} vs {want}");
}

#[test]
fn a_symbolic_class_count_is_an_error_naming_the_loss() {
    let mut p = Program::with_seed(0);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::sym("C")])
        .unwrap();
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")]).unwrap();
    let err = layers::softmax_cross_entropy(&mut p, x, y)
        .unwrap_err()
        .to_string();
    assert!(err.contains("softmax_cross_entropy"), "{err}");
    assert!(err.contains("f32[N,C]"), "{err}");
    assert!(err.contains("fixed size"), "{err}");
    assert!(
        err.contains("runtime/tests/composite.rs"),
        "the error carries the caller's line: {err}"
    );
}

#[test]
fn scalar_inputs_to_layers_are_errors_naming_the_layer() {
    let mut p = Program::with_seed(0);
    let s = p.placeholder("s", DType::F32, Vec::<Dim>::new()).unwrap();
    let y = p.placeholder("y", DType::I64, Vec::<Dim>::new()).unwrap();
    let cases: [(&str, String); 5] = [
        (
            "dense",
            layers::dense(&mut p, "fc", s, 3, Activation::Relu)
                .unwrap_err()
                .to_string(),
        ),
        (
            "layer_norm",
            layers::layer_norm(&mut p, "ln", s, 1e-5)
                .unwrap_err()
                .to_string(),
        ),
        (
            "softmax_cross_entropy",
            layers::softmax_cross_entropy(&mut p, s, y)
                .unwrap_err()
                .to_string(),
        ),
        (
            "accuracy",
            layers::accuracy(&mut p, s, y).unwrap_err().to_string(),
        ),
        (
            "softmax",
            layers::softmax(&mut p, s, 0).unwrap_err().to_string(),
        ),
    ];
    for (name, err) in cases {
        assert!(err.contains(name), "{name}: {err}");
        assert!(err.contains("f32[]"), "{name} names the shape: {err}");
    }

    let scalar = Tensor::scalar(1.0);
    let labels = Tensor::new(Array::I64(ArrayD::from_elem(IxDyn(&[]), 0)));
    let err = nn::cross_entropy(&scalar, &labels).unwrap_err().to_string();
    assert!(
        err.contains("softmax_cross_entropy") && err.contains("f32[]"),
        "{err}"
    );
    let ln = nn::LayerNorm::new("ln", 1, 1e-5).unwrap();
    let err = eager::nn::Layer::forward(&ln, &scalar)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer_norm") && err.contains("f32[]"), "{err}");
}

#[test]
fn softplus_and_gelu_activations_match_their_formulas() {
    let xs = [-3.0f32, -0.5, 0.0, 0.5, 4.0];
    let x = Tensor::from_f32(&[5], xs.to_vec()).unwrap();
    let softplus = x.softplus().unwrap().to_f64_vec().unwrap();
    let gelu = x.gelu().unwrap().to_f64_vec().unwrap();
    for (i, &v) in xs.iter().enumerate() {
        let v = f64::from(v);
        let sp = (1.0 + v.exp()).ln();
        let ge = v * 0.5 * (1.0 + libm::erf(v / std::f64::consts::SQRT_2));
        assert!(
            (softplus[i] - sp).abs() < 1e-6,
            "softplus({v}) = {} vs {sp}",
            softplus[i]
        );
        assert!(
            (gelu[i] - ge).abs() < 1e-6,
            "gelu({v}) = {} vs {ge}",
            gelu[i]
        );
    }
}

/// A `[4, 2]` batch: channel 0 is 1, 2, 3, 4; channel 1 is 10, 10, 20, 20.
fn bn_batch() -> Array {
    f32s(&[4, 2], &[1.0, 10.0, 2.0, 10.0, 3.0, 20.0, 4.0, 20.0])
}

/// What batch normalisation and its running averages give for [`bn_batch`], in f64.
fn bn_expected() -> (Vec<f64>, [f64; 2], [f64; 2]) {
    let (m, v) = ([2.5, 15.0], [1.25, 25.0]); // means and biased variances
    let unbiased = [v[0] * 4.0 / 3.0, v[1] * 4.0 / 3.0];
    let data = [1.0, 10.0, 2.0, 10.0, 3.0, 20.0, 4.0, 20.0];
    let y = (0..8)
        .map(|i| (data[i] - m[i % 2]) / (v[i % 2] + 1e-5f64).sqrt())
        .collect();
    let mean = [0.1 * m[0], 0.1 * m[1]];
    let var = [0.9 + 0.1 * unbiased[0], 0.9 + 0.1 * unbiased[1]];
    (y, mean, var)
}

#[test]
fn batch_norm_static_trains_its_running_statistics_and_evaluates_with_them() {
    let mut p = Program::with_seed(0);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(2)])
        .unwrap();
    let bn = layers::BatchNorm::new(&mut p, "bn", 2).unwrap();
    let (y, stats) = bn.train(&mut p, x).unwrap();
    let y_eval = bn.eval(&mut p, x).unwrap();
    let mut s = Session::new(&p).unwrap();
    let out = s
        .run(&[y.into(), Fetch::Target(stats)], &[("x", bn_batch())])
        .unwrap();
    let (want_y, want_mean, want_var) = bn_expected();
    for (g, w) in out[0].to_f64_vec().iter().zip(&want_y) {
        assert!((g - w).abs() < 1e-4, "{g} vs {w}");
    }
    let mean = s.scope().get("bn.running_mean").unwrap().to_f64_vec();
    let var = s.scope().get("bn.running_var").unwrap().to_f64_vec();
    assert!((mean[0] - want_mean[0]).abs() < 1e-6 && (mean[1] - want_mean[1]).abs() < 1e-5);
    assert!((var[0] - want_var[0]).abs() < 1e-6 && (var[1] - want_var[1]).abs() < 1e-5);
    // Evaluation uses the running statistics.
    let e = s.run(&[y_eval.into()], &[("x", bn_batch())]).unwrap()[0].to_f64_vec();
    let want = (1.0 - want_mean[0]) / (want_var[0] + 1e-5).sqrt();
    assert!((e[0] - want).abs() < 1e-5, "{} vs {want}", e[0]);
}

#[test]
fn batch_norm_eager_and_traced_update_the_running_statistics_alike() {
    use kiln_runtime::eager::nn::Layer;
    eager::reset();
    let mut bn = nn::BatchNorm::new("ebn", 2).unwrap();
    let x = Tensor::new(bn_batch());
    let y = bn.forward(&x).unwrap().to_f64_vec().unwrap();
    let (want_y, want_mean, want_var) = bn_expected();
    for (g, w) in y.iter().zip(&want_y) {
        assert!((g - w).abs() < 1e-4, "{g} vs {w}");
    }
    let mean = bn.running_mean.tensor().unwrap().to_f64_vec().unwrap();
    assert!((mean[1] - want_mean[1]).abs() < 1e-5, "{mean:?}");
    // Traced in training mode, every call stores the running averages.
    let ty = kiln_ir::Type::new(
        DType::F32,
        kiln_ir::Shape(vec![Dim::sym("N"), Dim::Fixed(2)]),
    );
    let mut f = eager::to_static(&[("x", ty)], |t| Ok(vec![bn.forward(&t[0])?])).unwrap();
    f.call(&[&x]).unwrap();
    let var = bn.running_var.tensor().unwrap().to_f64_vec().unwrap();
    let twice = 0.9 * want_var[1] + 0.1 * (25.0 * 4.0 / 3.0);
    assert!((var[1] - twice).abs() < 1e-4, "{var:?} vs {twice}");
    // Evaluation mode reads them and changes nothing.
    bn.set_training(false);
    let before = bn.running_var.tensor().unwrap().to_f64_vec().unwrap();
    bn.forward(&x).unwrap();
    assert_eq!(
        bn.running_var.tensor().unwrap().to_f64_vec().unwrap(),
        before
    );
    assert!(bn.running_mean.grad().is_none());
}

/// Operands a loss would broadcast into a wrong answer are refused by name: labels `[N, 1]`
/// against logits `[N, C]` averaged an `[N, N]` table, and `mse` of `[N, 1]` against `[N]`
/// likewise; before, both returned a number.
#[test]
fn loss_operands_that_would_broadcast_are_refused_naming_the_loss() {
    eager::reset();
    let logits = Tensor::new(f32s(&[2, 3], &LOGITS));
    let column = Tensor::new(Array::I64(
        ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![2, 0]).unwrap(),
    ));
    let floats = Tensor::new(f32s(&[2], &[2.0, 0.0]));
    for (labels, found) in [(&column, "i64[2,1]"), (&floats, "f32[2]")] {
        let message = nn::cross_entropy(&logits, labels).unwrap_err().to_string();
        assert!(
            message.contains("softmax_cross_entropy: labels") && message.contains(found),
            "{message}"
        );
        assert!(
            message.contains("one integer class per row (i64[2])"),
            "{message}"
        );
        assert!(nn::accuracy(&logits, labels).is_err());
    }
    let prediction = Tensor::new(f32s(&[2, 1], &[1.0, 2.0]));
    let message = nn::mse(&prediction, &floats).unwrap_err().to_string();
    assert!(
        message.contains("mse: the prediction f32[2,1] and the target f32[2] must have one shape"),
        "{message}"
    );

    let mut p = Program::with_seed(0);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(3)])
        .unwrap();
    let y = p
        .placeholder("y", DType::I64, vec![Dim::sym("N"), Dim::Fixed(1)])
        .unwrap();
    let message = layers::softmax_cross_entropy(&mut p, x, y)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("labels i64[N,1] do not fit logits f32[N,3]"),
        "{message}"
    );
}
