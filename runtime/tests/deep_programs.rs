//! Programs far deeper than any model, built through the static API and through eager code:
//! a session trains one and `to_static` traces one without recursing once per op (a stack
//! overflow aborts the test process instead of failing it).

use kiln_backend::Array;
use kiln_ir::{DType, Dim, Shape, Type, UnaryOp};
use kiln_runtime::eager::{self, Tensor};
use kiln_runtime::{Backend, Init, Optimizer, Program, Session, Sgd};
use ndarray::{ArrayD, IxDyn};

/// Ops in each chain (abs then neg, alternately: the chain computes `-|v|`).
const OPS: usize = 20_000;

const X: [f32; 6] = [1.0, -2.0, 3.0, -4.0, 5.0, -6.0];

fn op(i: usize) -> UnaryOp {
    if i.is_multiple_of(2) {
        UnaryOp::Abs
    } else {
        UnaryOp::Neg
    }
}

#[test]
fn a_session_trains_a_twenty_thousand_op_chain_on_both_backends() {
    // loss = Σ (-|x·w|)² = Σ (x·w)², so dloss/dw_j = 2 w_j Σ_i x_ij².
    let mut p = Program::with_seed(1);
    let x = (p.placeholder("x", DType::F32, vec![Dim::Fixed(2), Dim::Fixed(3)])).unwrap();
    let w = (p.parameter("w", DType::F32, &[3], Init::Constant(0.5))).unwrap();
    let wb = p.broadcast_to(w, &Shape::fixed(&[2, 3])).unwrap();
    let mut h = p.binary(kiln_ir::BinaryOp::Mul, x, wb).unwrap();
    for i in 0..OPS {
        h = p.unary(op(i), h).unwrap();
    }
    let sq = p.binary(kiln_ir::BinaryOp::Mul, h, h).unwrap();
    let loss = p
        .reduce(kiln_ir::ReduceOp::Sum, sq, vec![0, 1], false)
        .unwrap();
    let train = Sgd::new(0.01).minimize(&mut p, loss).unwrap();
    let feed = Array::F32(ArrayD::from_shape_vec(IxDyn(&[2, 3]), X.to_vec()).unwrap());
    let column_squares = [1.0 + 16.0, 4.0 + 25.0, 9.0 + 36.0];
    let expected_loss: f64 = column_squares.iter().map(|s| s * 0.25).sum();
    for backend in [Backend::Compiled, Backend::Interpreter] {
        let mut s = Session::new(&p).unwrap().with_backend(backend);
        let out = s.run(&[loss.into(), train.into()], &[("x", feed.clone())]);
        let out = out.unwrap_or_else(|e| panic!("{backend:?}: {e}"));
        let got = out[0].to_f64_vec()[0];
        assert!((got - expected_loss).abs() < 1e-4, "{backend:?}: {got}");
        let w_after = s.scope().get("w").unwrap().to_f64_vec();
        for (j, s) in column_squares.iter().enumerate() {
            let want = 0.5 - 0.01 * 2.0 * 0.5 * s;
            assert!(
                (w_after[j] - want).abs() < 1e-5,
                "{backend:?} w[{j}]: {w_after:?}"
            );
        }
    }
}

#[test]
fn eager_backward_and_to_static_handle_a_twenty_thousand_op_chain() {
    let chain = |t: &Tensor| -> eager::EagerResult<Tensor> {
        let mut h = t.clone();
        for i in 0..OPS {
            h = h.unary(op(i))?;
        }
        h.binary(kiln_ir::BinaryOp::Mul, &h)?.sum_all()
    };
    let x = Tensor::from_f32(&[2, 3], X.to_vec()).unwrap();
    let xg = x.clone().requires_grad().unwrap();
    let loss = chain(&xg).unwrap();
    assert_eq!(loss.item().unwrap(), 91.0);
    loss.backward().unwrap();
    let grad = xg.grad().unwrap().to_f64_vec().unwrap();
    let twice: Vec<f64> = X.iter().map(|v| 2.0 * *v as f64).collect();
    assert_eq!(grad, twice);
    let ty = Type::new(DType::F32, Shape::fixed(&[2, 3]));
    let mut traced = eager::to_static(&[("x", ty)], |t| Ok(vec![chain(&t[0])?])).unwrap();
    let out = traced.call(&[&x]).unwrap();
    assert_eq!(out[0].item().unwrap(), 91.0);
}
