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
        err.contains("composite.rs"),
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
