//! The static-graph API as the design notes and TF1/Keras users write it: feeds keyed by any
//! value (named or not), functions evaluated from an intermediate, gradients as values (and
//! gradients of gradients), `assign` targets, parameters from arrays — and the forms that
//! cannot be right refused with errors that say why.

use kiln_backend::Array;
use kiln_ir::{BinaryOp, DType, Dim, ReduceOp, UnaryOp, Value};
use kiln_runtime::{Feed, Fetch, Optimizer, Program, Session, Sgd};
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize], v: &[f32]) -> Array {
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

fn f64s(shape: &[usize], v: &[f64]) -> Array {
    Array::F64(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

/// The computational-graph essay's model: `y = W·x + b` with `x: f32[N,2]`, `W` and `b`
/// parameters made from arrays, and `Wx` left unnamed.
struct Affine {
    p: Program,
    x: Value,
    w: Value,
    wx: Value,
    y: Value,
}

fn affine() -> Affine {
    let mut p = Program::new();
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(2)])
        .unwrap();
    let w = (p.parameter_from("W", &f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]))).unwrap();
    let b = p.parameter_from("b", &f32s(&[2], &[0.5, -0.5])).unwrap();
    let wx = p.matmul(x, w).unwrap();
    let shape = p.value_type(wx).shape.clone();
    let b_wide = p.broadcast_to(b, &shape).unwrap();
    let y = p.binary(BinaryOp::Add, wx, b_wide).unwrap();
    Affine { p, x, w, wx, y }
}

#[test]
fn parameters_from_arrays_start_from_them_and_print_as_values() {
    let mut m = affine();
    let ids =
        Array::I64(ArrayD::from_shape_vec(IxDyn(&[2]), vec![9_007_199_254_740_993, -7]).unwrap());
    let (decl, _) = m.p.state_from("ids", &ids).unwrap();
    let ir = m.p.module().to_string();
    assert!(
        ir.contains("state @W : f32[2,2] = values([[1.0, 2.0], [3.0, 4.0]])"),
        "{ir}"
    );
    assert!(ir.contains("values([9007199254740993, -7])"), "{ir}");
    assert_eq!(
        m.p.params().len(),
        2,
        "`ids` is state, not a parameter: {:?}",
        decl.name
    );
    let s = Session::new(&m.p).unwrap();
    assert_eq!(
        s.scope().get("W").unwrap().to_f64_vec(),
        [1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(
        s.scope().get("ids").unwrap(),
        &ids,
        "integers exact, not through f64"
    );
}

#[test]
fn any_value_can_be_fed_by_its_value_named_or_not() {
    let m = affine();
    assert_eq!(m.p.parameter_name(m.w), Some("W"));
    let mut s = Session::new(&m.p).unwrap();
    let x = f32s(&[1, 2], &[1.0, 1.0]);
    let direct = s.run(&[m.y.into()], &[("x", x.clone())]).unwrap();
    assert_eq!(direct[0].to_f64_vec(), [4.5, 5.5]);
    // Evaluate from `Wx`: no `x` needed, nothing upstream runs.
    let wx = f32s(&[1, 2], &[10.0, 20.0]);
    let from_wx = s
        .run_with_feeds(&[m.y.into()], &[(Feed::Value(m.wx), wx)])
        .unwrap();
    assert_eq!(from_wx[0].to_f64_vec(), [10.5, 19.5]);
    // A placeholder by its value is the placeholder.
    let by_value = s
        .run_with_feeds(&[m.y.into()], &[(Feed::Value(m.x), x)])
        .unwrap();
    assert_eq!(by_value, direct);
}

#[test]
fn a_function_can_take_an_intermediate_as_its_input() {
    let m = affine();
    let mut s = Session::new(&m.p).unwrap();
    let from_wx = s.function(&[m.wx], &[m.y], &[]).unwrap();
    let out = from_wx
        .call(&mut s, &[f32s(&[2, 2], &[0.0, 0.0, 1.0, 1.0])])
        .unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.5, -0.5, 1.5, 0.5]);
    let err = from_wx.call(&mut s, &[]).unwrap_err().to_string();
    assert_eq!(err, "the function takes 1 inputs, and was called with 0");
}

#[test]
fn bad_feeds_are_errors_that_say_why() {
    let mut m = affine();
    let pred = m.p.placeholder("pred", DType::Bool, vec![]).unwrap();
    let mut inner = None;
    let results =
        m.p.cond(
            pred,
            |b| {
                let v = b.unary(UnaryOp::Neg, m.wx)?;
                inner = Some(v);
                Ok::<_, kiln_ir::BuildError>(vec![v])
            },
            |_| Ok(vec![m.wx]),
        )
        .unwrap();
    let mut s = Session::new(&m.p).unwrap();
    let x = f32s(&[1, 2], &[1.0, 1.0]);
    let twice = [(Feed::from("x"), x.clone()), (Feed::Value(m.x), x.clone())];
    let err = s.run_with_feeds(&[m.y.into()], &twice).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`x` is fed twice in one run (by `x` and by `x`)"
    );
    let in_body = [(Feed::Value(inner.unwrap()), x.clone())];
    let err = (s.run_with_feeds(&[results[0].into()], &in_body)).unwrap_err();
    assert!(
        err.to_string().contains("inside a `cond` or `while` body"),
        "{err}"
    );
    // A value of a bigger program: its id is past this program's values.
    let mut other = Program::new();
    let unknown = (0..1000)
        .map(|_| other.scalar(DType::F32, 2.0).unwrap())
        .last()
        .unwrap();
    let err = s
        .run_with_feeds(&[m.y.into()], &[(Feed::Value(unknown), x)])
        .unwrap_err();
    assert!(
        err.to_string().contains("not a value of this program"),
        "{err}"
    );
}

/// `sum(tanh(x·w))` over a fed `x: f64[3]` and a parameter `w: f64[]`.
fn tanh_sum() -> (Program, Value, Value, Value) {
    let mut p = Program::new();
    let x = p.placeholder("x", DType::F64, vec![Dim::Fixed(3)]).unwrap();
    let w = p.parameter_from("w", &f64s(&[], &[0.7])).unwrap();
    let shape = p.value_type(x).shape.clone();
    let w3 = p.broadcast_to(w, &shape).unwrap();
    let xw = p.binary(BinaryOp::Mul, x, w3).unwrap();
    let t = p.unary(UnaryOp::Tanh, xw).unwrap();
    let loss = p.reduce(ReduceOp::Sum, t, vec![0], false).unwrap();
    (p, x, w, loss)
}

#[test]
fn gradients_are_values_to_fetch_and_differentiate_again() {
    let (mut p, x, w, loss) = tanh_sum();
    let [dw, dx] = p.gradients(loss, &[w, x]).unwrap()[..] else {
        panic!("two gradients")
    };
    let [d2w] = p.gradients(dw, &[w]).unwrap()[..] else {
        panic!("one gradient")
    };
    let xs = [0.3, -1.2, 2.0];
    let mut s = Session::new(&p).unwrap();
    let out = s
        .run(
            &[dw.into(), dx.into(), d2w.into()],
            &[("x", f64s(&[3], &xs))],
        )
        .unwrap();
    let w0 = 0.7f64;
    let sech2 = |v: f64| 1.0 - v.tanh().powi(2);
    let want_dw: f64 = xs.iter().map(|x| x * sech2(x * w0)).sum();
    let want_d2w: f64 = (xs.iter())
        .map(|x| -2.0 * x * x * (x * w0).tanh() * sech2(x * w0))
        .sum();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs().max(1.0);
    assert!(close(out[0].to_f64_vec()[0], want_dw), "{out:?}");
    for (got, x) in out[1].to_f64_vec().iter().zip(xs) {
        assert!(close(*got, w0 * sech2(x * w0)), "{out:?}");
    }
    assert!(
        close(out[2].to_f64_vec()[0], want_d2w),
        "{out:?} {want_d2w}"
    );
}

#[test]
fn a_feed_that_cuts_a_fetched_gradient_is_refused() {
    let (mut p, x, w, loss) = tanh_sum();
    let xw = p.graph().walk_insts()[3];
    let xw = p.graph().inst(xw).results[0];
    let [dw] = p.gradients(loss, &[w]).unwrap()[..] else {
        panic!("one gradient")
    };
    let mut s = Session::new(&p).unwrap();
    let three = f64s(&[3], &[1.0, 2.0, 3.0]);
    let err = s
        .run_with_feeds(&[dw.into()], &[(Feed::Value(xw), three.clone())])
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("feed v"), "{err}");
    assert!(err.contains("lies between `w` and"), "{err}");
    // The loss alone from the same feed is fine, and so is feeding `w` itself.
    s.run_with_feeds(&[loss.into()], &[(Feed::Value(xw), three.clone())])
        .unwrap();
    let at = s
        .run_with_feeds(
            &[dw.into()],
            &[(Feed::Value(w), f64s(&[], &[0.0])), (Feed::Value(x), three)],
        )
        .unwrap();
    assert_eq!(
        at[0].to_f64_vec(),
        [6.0],
        "d/dw sum(tanh(x w)) at w = 0 is sum(x)"
    );
}

#[test]
fn assign_stores_a_placeholders_value_into_a_variable() {
    let mut p = Program::new();
    let v = p.state_from("v", &f32s(&[2], &[0.0, 0.0])).unwrap().1;
    let x = p.placeholder("x", DType::F32, vec![Dim::Fixed(2)]).unwrap();
    let assign = p.assign(&[(v, x)]).unwrap();
    assert_eq!(p.target_name(assign), "assign0");
    let mut s = Session::new(&p).unwrap();
    s.run(&[Fetch::Target(assign)], &[("x", f32s(&[2], &[3.0, 4.0]))])
        .unwrap();
    assert_eq!(s.scope().get("v").unwrap().to_f64_vec(), [3.0, 4.0]);
    let wide = p
        .placeholder("wide", DType::F32, vec![Dim::Fixed(3)])
        .unwrap();
    let err = p.assign(&[(v, wide)]).unwrap_err().to_string();
    assert!(
        err.contains("@v has type f32[2], the stored value f32[3]"),
        "{err}"
    );
    let err = p.assign(&[(x, x)]).unwrap_err().to_string();
    assert!(
        err.contains("assign: `x` is not a parameter or other state"),
        "{err}"
    );
}

#[test]
fn minimize_refuses_names_that_train_nothing() {
    let (mut p, _, _, loss) = tanh_sum();
    let err = (Sgd::new(0.1).minimize_params(&mut p, loss, &["v".into()]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "minimize: `v` is not a parameter of the program; its parameters are: w"
    );
    let unused = p.parameter_from("unused", &f64s(&[], &[1.0])).unwrap();
    assert_eq!(p.parameter_name(unused), Some("unused"));
    let err = (Sgd::new(0.1).minimize_params(&mut p, loss, &["unused".into()]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("depends on none of the parameters it should train (unused)"),
        "{err}"
    );
}

#[test]
fn a_gradient_that_reads_only_shapes_takes_the_batch_size_from_its_placeholder() {
    // d mean(W·x + b) / db is 1/2 everywhere: no element of `x` is read, but its batch size
    // `N` is, so the slice keeps `x` as an argument (it did not verify before).
    let mut m = affine();
    let loss = (m.p.reduce(ReduceOp::Mean, m.y, vec![0, 1], false)).unwrap();
    let b = m.p.value("b").unwrap();
    let [db] = m.p.gradients(loss, &[b]).unwrap()[..] else {
        panic!("one gradient")
    };
    let mut s = Session::new(&m.p).unwrap();
    let x = f32s(&[4, 2], &[1.0; 8]);
    let out = s.run(&[db.into()], &[("x", x)]).unwrap();
    assert_eq!(out[0].to_f64_vec(), [0.5, 0.5]);
    let err = s.run(&[db.into()], &[]).unwrap_err().to_string();
    assert!(err.starts_with("missing feed for placeholder `x`"), "{err}");
}
