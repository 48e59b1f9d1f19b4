//! Eager tensors: values, gradients, the tape's life, errors, control flow, custom ops,
//! optimizers, and compiled functions sharing the eager parameters.

use kiln_backend::Array;
use kiln_ir::{DType, Dim, Shape, Type};
use kiln_runtime::eager::CustomOpError;
use kiln_runtime::eager::nn::{self, Layer, Linear, Parameter};
use kiln_runtime::eager::{self, CustomOp, EagerOptimizer, Tensor};
use kiln_runtime::{Adam, Init, Sgd};
use std::sync::Arc;

fn t(shape: &[usize], values: &[f32]) -> Tensor {
    Tensor::from_f32(shape, values.to_vec()).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn ops_compute_at_once_with_broadcasting_and_operators() {
    eager::reset();
    let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = t(&[3], &[10., 20., 30.]);
    let c = &a + &b;
    assert_eq!(c.to_f64_vec().unwrap(), [11., 22., 33., 14., 25., 36.]);
    let d = (&a * 2.0 - 1.0).sum(&[1], false).unwrap();
    assert_eq!(d.to_f64_vec().unwrap(), [9., 27.]);
    let m = a.matmul(&a.t().unwrap()).unwrap();
    assert_eq!(m.to_f64_vec().unwrap(), [14., 32., 32., 77.]);
    assert_eq!((-&b).to_f64_vec().unwrap(), [-10., -20., -30.]);
    let ints = Tensor::new(Array::I64(ndarray::arr1(&[1, 0]).into_dyn()));
    assert_eq!(
        a.gather(&ints, 0).unwrap().to_f64_vec().unwrap(),
        [4., 5., 6., 1., 2., 3.]
    );
    let out_of_range = Tensor::new(Array::I64(ndarray::arr1(&[2]).into_dyn()));
    let line = line!() + 1;
    let err = a.gather(&out_of_range, 0).unwrap_err().to_string();
    assert!(
        err.contains("index 2 is out of range for axis 0 of size 2"),
        "{err}"
    );
    assert!(
        err.contains(&format!("runtime/tests/eager.rs:{line}:")),
        "run errors point at the caller: {err}"
    );
    assert!(
        !c.tracks_grad(),
        "nothing required grad: nothing was recorded"
    );
}

#[test]
fn backward_matches_hand_gradients_and_accumulates() {
    eager::reset();
    let x = t(&[3], &[1., -2., 0.5]).requires_grad().unwrap();
    let w = t(&[3], &[0.5, 0.25, 2.0]).requires_grad().unwrap();
    // loss = sum(tanh(x * w)); d/dx = (1 - tanh²) w; d/dw = (1 - tanh²) x
    let loss = x.mul(&w).unwrap().tanh().unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let (xs, ws) = ([1.0f64, -2.0, 0.5], [0.5f64, 0.25, 2.0]);
    let dt: Vec<f64> = xs
        .iter()
        .zip(&ws)
        .map(|(x, w)| 1.0 - (x * w).tanh().powi(2))
        .collect();
    close(
        &x.grad().unwrap().to_f64_vec().unwrap(),
        &dt.iter().zip(&ws).map(|(d, w)| d * w).collect::<Vec<_>>(),
        1e-6,
    );
    close(
        &w.grad().unwrap().to_f64_vec().unwrap(),
        &dt.iter().zip(&xs).map(|(d, x)| d * x).collect::<Vec<_>>(),
        1e-6,
    );
    // A second backward adds to the gradient; zero_grad clears it.
    let loss = x.sum_all().unwrap();
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_f64_vec().unwrap();
    close(
        &g,
        &dt.iter()
            .zip(&ws)
            .map(|(d, w)| d * w + 1.0)
            .collect::<Vec<_>>(),
        1e-6,
    );
    x.zero_grad();
    assert!(x.grad().is_none());
}

#[test]
fn no_grad_detach_and_the_tape_life() {
    eager::reset();
    let x = t(&[2], &[1., 2.]).requires_grad().unwrap();
    {
        let _guard = eager::no_grad();
        let y = &x * &x;
        assert!(!y.tracks_grad());
        assert_eq!(eager::tape_len(), 0);
    }
    let y = &x * &x;
    assert!(y.tracks_grad());
    assert!(eager::tape_len() > 0);
    let cut = y.detach().unwrap();
    let z = (&cut * &x).sum_all().unwrap();
    z.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_f64_vec().unwrap(),
        [1., 4.],
        "no gradient through the detached y"
    );
    drop((y, z));
    assert_eq!(
        eager::tape_len(),
        0,
        "no recorded tensor alive: the tape is released"
    );
    let err = cut.sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(
        err.contains("does not depend on any tensor that requires grad"),
        "{err}"
    );
}

#[test]
fn shape_errors_name_the_op_shapes_and_caller() {
    eager::reset();
    let a = t(&[2, 3], &[0.; 6]);
    let b = t(&[4], &[0.; 4]);
    let line = line!() + 1;
    let err = a.add(&b).unwrap_err().to_string();
    assert!(
        err.starts_with("add: operand shapes do not broadcast: f32[2,3], f32[4]"),
        "{err}"
    );
    assert!(
        err.contains(&format!("runtime/tests/eager.rs:{line}:")),
        "{err}"
    );
    let panic =
        std::panic::catch_unwind(|| &t(&[2, 3], &[0.; 6]) + &t(&[4], &[0.; 4])).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(
        message.starts_with("add: operand shapes do not broadcast"),
        "operators panic with the same message: {message}"
    );
}

#[test]
fn reading_a_traced_value_explains_what_to_do() {
    eager::reset();
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N")]));
    let err = eager::to_static(&[("x", ty)], |x| {
        let total = x[0].sum_all()?;
        if total.item()? > 0.0 {
            Ok(vec![x[0].exp()?])
        } else {
            Ok(vec![x[0].clone()])
        }
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.starts_with("cannot read the value of traced tensor"),
        "{err}"
    );
    assert!(
        err.contains("f32[]")
            && err.contains("use `kiln::eager::cond` or `kiln::eager::while_loop`"),
        "{err}"
    );
}

#[test]
fn cond_and_while_run_eagerly_and_trace_into_regions() {
    eager::reset();
    let f = |x: &Tensor| -> eager::EagerResult<Tensor> {
        let positive = x.sum_all()?.compare_scalar(kiln_ir::CompareOp::Gt, 0.0)?;
        let r = eager::cond(&positive, || Ok(vec![x.exp()?]), || Ok(vec![x.neg()?]))?;
        // Double until the sum passes 10.
        let out = eager::while_loop(
            &[r[0].clone()],
            |v| v[0].sum_all()?.compare_scalar(kiln_ir::CompareOp::Lt, 10.0),
            |v| Ok(vec![v[0].binary_scalar(kiln_ir::BinaryOp::Mul, 2.0)?]),
        )?;
        Ok(out[0].clone())
    };
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N")]));
    let mut compiled = eager::to_static(&[("x", ty)], |x| Ok(vec![f(&x[0])?])).unwrap();
    let text = compiled.module("f").unwrap().to_string();
    assert!(
        text.contains(" = cond ") && text.contains(" = while "),
        "{text}"
    );
    for values in [[0.5f32, 1.0], [-1.0, -2.0]] {
        let x = t(&[2], &values);
        let eager_out = f(&x).unwrap().to_f64_vec().unwrap();
        let compiled_out = compiled.call(&[&x]).unwrap()[0].to_f64_vec().unwrap();
        close(&compiled_out, &eager_out, 1e-6);
    }
}

/// `cube(x) = x³`, with its own backward `3x²·g`.
struct Cube;

impl CustomOp for Cube {
    fn name(&self) -> &str {
        "test.cube"
    }
    fn forward(&self, inputs: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        match inputs {
            [Array::F32(x)] => Ok(vec![Array::F32(x.mapv(|v| v * v * v))]),
            _ => Err("cube takes one f32 tensor".into()),
        }
    }
    fn backward(
        &self,
        inputs: &[Array],
        _outputs: &[Array],
        grads: &[Array],
    ) -> Result<Vec<Array>, CustomOpError> {
        match (inputs, grads) {
            ([Array::F32(x)], [Array::F32(g)]) => Ok(vec![Array::F32(
                ndarray::Zip::from(x)
                    .and(g)
                    .map_collect(|&x, &g| 3.0 * x * x * g),
            )]),
            _ => Err("cube.grad takes f32 tensors".into()),
        }
    }
}

fn cube(x: &Tensor) -> eager::EagerResult<Tensor> {
    eager::custom::call("test.cube", &[x]).map(|mut v| v.remove(0))
}

#[test]
fn custom_ops_run_eagerly_traced_and_compiled_with_their_backward() {
    eager::reset();
    eager::register_custom_op(Arc::new(Cube)).unwrap();
    let x = t(&[3], &[1., -2., 0.5]).requires_grad().unwrap();
    let y = cube(&x).unwrap();
    assert_eq!(y.to_f64_vec().unwrap(), [1., -8., 0.125]);
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_f64_vec().unwrap(), [3., 12., 0.75]);
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N")]));
    let mut compiled =
        eager::to_static(&[("x", ty)], |v| Ok(vec![cube(&v[0])?.sum_all()?])).unwrap();
    assert!(
        compiled
            .module("f")
            .unwrap()
            .to_string()
            .contains("call @test.cube, %x")
    );
    let (loss, grads) = compiled.gradients(&[&t(&[3], &[1., -2., 0.5])], 0).unwrap();
    assert_eq!(loss.item().unwrap(), -6.875);
    assert_eq!(
        grads.inputs[0].as_ref().unwrap().to_f64_vec().unwrap(),
        [3., 12., 0.75]
    );
    let err = eager::custom::call("test.missing", &[&x])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no custom op `test.missing` is registered"),
        "{err}"
    );
}

#[test]
fn optimizers_update_parameters_and_compiled_functions_see_them() {
    eager::reset();
    eager::manual_seed(3);
    let layer = Linear::new("fc", 2, 1).unwrap();
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(2)]));
    let mut compiled = eager::to_static(&[("x", ty)], |x| Ok(vec![layer.forward(&x[0])?])).unwrap();
    let mut opt = EagerOptimizer::new(Sgd::new(0.1), layer.parameters()).unwrap();
    let x = t(&[4, 2], &[1., 0., 0., 1., 1., 1., 0., 0.]);
    let y = t(&[4, 1], &[1., -1., 0., 0.5]);
    let mut losses = Vec::new();
    for _ in 0..30 {
        opt.zero_grad();
        let loss = nn::mse(&layer.forward(&x).unwrap(), &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        losses.push(loss.item().unwrap());
    }
    assert!(losses[29] < losses[0] / 2.0, "{losses:?}");
    let eager_out = layer.forward(&x).unwrap().to_f64_vec().unwrap();
    let compiled_out = compiled.call(&[&x]).unwrap()[0].to_f64_vec().unwrap();
    assert_eq!(
        eager_out, compiled_out,
        "the compiled function reads the trained parameters"
    );
    assert_eq!(compiled.compilations(), 1);

    // Adam keeps its moments in the same scope.
    let mut adam = EagerOptimizer::new(Adam::new(0.01), layer.parameters()).unwrap();
    nn::mse(&layer.forward(&x).unwrap(), &y)
        .unwrap()
        .backward()
        .unwrap();
    adam.step().unwrap();
    let scope = eager::scope().unwrap();
    assert!(
        scope.get("adam.m.fc.w").is_some() && scope.get("adam.step").unwrap().to_f64_vec() == [1.0]
    );
}

#[test]
fn compiled_training_steps_update_the_shared_parameters() {
    eager::reset();
    let w = Parameter::new("w", DType::F32, &[1], Init::Constant(0.0)).unwrap();
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N")]));
    let mut step = eager::to_static(&[("x", ty)], |x| {
        // loss = mean((x - w)²): its minimum is w = mean(x)
        let d = x[0].sub(&w.tensor()?)?;
        Ok(vec![d.mul(&d)?.mean_all()?])
    })
    .unwrap();
    let train = step.minimize(&mut Sgd::new(0.25), 0).unwrap();
    let x = t(&[4], &[1., 2., 3., 6.]);
    for _ in 0..40 {
        step.call_and_update(&[&x], &[train]).unwrap();
    }
    close(&w.tensor().unwrap().to_f64_vec().unwrap(), &[3.0], 1e-4);
}

#[test]
fn parameters_save_and_load_and_serve_from_a_session() {
    eager::reset();
    let layer = Linear::new("dense", 3, 2).unwrap();
    let ty = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(3)]));
    let compiled = eager::to_static(&[("x", ty)], |x| Ok(vec![layer.forward(&x[0])?])).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-eager-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    eager::save_parameters(&dir.join("p.safetensors")).unwrap();
    let module = compiled.module("forward").unwrap();
    let mut scope = kiln_runtime::Scope::from_module(&module).unwrap();
    scope.load(&dir.join("p.safetensors")).unwrap();
    let x = t(&[1, 3], &[1., 2., 3.]);
    let served = kiln_backend::Interpreter::new(&module)
        .run(
            "forward",
            vec![x.to_array().unwrap()],
            &mut scope.store().clone(),
        )
        .unwrap();
    assert_eq!(
        served[0].to_f64_vec(),
        layer.forward(&x).unwrap().to_f64_vec().unwrap()
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tensors_convert_to_and_from_ndarray() {
    let a = ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]).into_dyn();
    let t = Tensor::from(a.clone());
    assert_eq!(t.to_ndarray::<f32>().unwrap(), a);
    let err = t.to_ndarray::<i64>().unwrap_err().to_string();
    assert_eq!(err, "the tensor is f32[2,2], not i64");
}

#[test]
fn parameters_are_set_from_arrays_with_their_types_checked() {
    eager::reset();
    let p = Parameter::new("set.w", DType::F32, &[2], Init::Zeros).unwrap();
    p.set(Array::F32(ndarray::arr1(&[1.5f32, -2.0]).into_dyn()))
        .unwrap();
    assert_eq!(p.tensor().unwrap().to_f64_vec().unwrap(), [1.5, -2.0]);
    let err = p
        .set(Array::F32(ndarray::arr1(&[1.0f32, 2.0, 3.0]).into_dyn()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("set.w") && err.contains("f32[2]") && err.contains("f32[3]"),
        "{err}"
    );
    let err = p
        .set(Array::F64(ndarray::arr1(&[1.0, 2.0]).into_dyn()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("f64[2]"), "{err}");
    assert_eq!(
        p.tensor().unwrap().to_f64_vec().unwrap(),
        [1.5, -2.0],
        "unchanged"
    );
}

#[test]
fn a_parameters_only_checkpoint_loads_after_an_optimizer_declared_its_moments() {
    eager::reset();
    let dir = std::env::temp_dir().join(format!("kiln-partial-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("params.safetensors");
    let w = Parameter::new("fc.w", DType::F32, &[3], Init::Ones).unwrap();
    eager::save_parameters(&file).unwrap();

    let mut opt = EagerOptimizer::new(Adam::new(0.1), vec![w.clone()]).unwrap();
    let loss = w
        .tensor()
        .unwrap()
        .mul(&w.tensor().unwrap())
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    let trained = w.tensor().unwrap().to_f64_vec().unwrap();
    assert!(trained.iter().all(|&v| v < 1.0));

    // The strict load names what the file lacks and changes nothing.
    let err = eager::load_parameters(&file).unwrap_err().to_string();
    assert!(
        err.contains("`adam.m.fc.w`, `adam.step`, `adam.v.fc.w`"),
        "{err}"
    );
    assert_eq!(w.tensor().unwrap().to_f64_vec().unwrap(), trained);
    // The non-strict load restores the parameter and lists the moments it skipped.
    let skipped = eager::load_parameters_present(&file).unwrap();
    assert_eq!(skipped, ["adam.m.fc.w", "adam.step", "adam.v.fc.w"]);
    assert_eq!(w.tensor().unwrap().to_f64_vec().unwrap(), [1.0, 1.0, 1.0]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Gradients, parameters and compiled functions live in the thread that made them. Moved to
/// another thread (a Rust `Tensor` is `Send`), they are refused by name; a plain value is not.
/// Before, another thread's leaf could share an id with one of its own (a gradient credited
/// to the wrong tensor), and a parameter or a compiled function silently ran against a fresh
/// copy of the parameters there.
#[test]
fn state_of_another_thread_is_refused_and_plain_values_cross() {
    eager::reset();
    let w = Parameter::new("w", DType::F32, &[2], Init::Constant(1.0)).unwrap();
    let leaf = t(&[2], &[1., 2.]).requires_grad().unwrap();
    let recorded = &leaf * 3.0;
    let plain = t(&[2], &[5., 6.]);
    let ty = Type::new(DType::F32, Shape::fixed(&[2]));
    let w2 = w.clone();
    let compiled =
        eager::to_static(&[("x", ty)], move |x| Ok(vec![&x[0] * &w2.tensor()?])).unwrap();
    let other_thread = std::thread::spawn(move || {
        let refused = |what: &str, r: eager::EagerResult<()>| {
            let message = r.expect_err(what).to_string();
            assert!(message.contains("another thread"), "{what}: {message}");
        };
        refused("parameter", w.tensor().map(drop));
        refused(
            "set",
            w.set(Array::F32(ndarray::arr1(&[0., 0.]).into_dyn())),
        );
        refused("leaf", leaf.exp().map(drop));
        refused("recorded", (recorded.sum(&[0], false)).map(drop));
        refused("backward", recorded.backward());
        refused(
            "optimizer",
            EagerOptimizer::new(Sgd::new(0.1), vec![w.clone()]).map(drop),
        );
        let mut compiled = compiled;
        refused("compiled", compiled.call(&[&plain]).map(drop));
        // A plain value computes anywhere, and a detached tensor is a plain value.
        assert_eq!((&plain + 1.0).to_f64_vec().unwrap(), [6., 7.]);
        assert_eq!(
            leaf.detach()
                .unwrap()
                .exp()
                .unwrap()
                .to_f64_vec()
                .unwrap()
                .len(),
            2
        );
    });
    other_thread.join().unwrap();
}

#[test]
fn a_parameter_from_before_a_reset_is_refused() {
    eager::reset();
    let w = Parameter::new("w", DType::F32, &[1], Init::Zeros).unwrap();
    eager::reset();
    let _same_name = Parameter::new("w", DType::F32, &[1], Init::Ones).unwrap();
    let message = w.tensor().map(drop).unwrap_err().to_string();
    assert!(
        message.contains("parameter `w` belongs to another thread (or to this one before a reset)"),
        "{message}"
    );
}

#[test]
fn a_no_grad_guard_dropped_after_a_reset_leaves_the_new_context_alone() {
    eager::reset();
    let guard = eager::no_grad();
    eager::reset();
    drop(guard);
    let x = t(&[1], &[2.0]).requires_grad().unwrap();
    (&x * &x).sum(&[0], false).unwrap().backward().unwrap();
    assert_eq!(x.grad().unwrap().to_f64_vec().unwrap(), [4.0]);
}

/// NumPy's indexing, written out by hand for a `[2, 3, 4]` tensor of 0..24.
#[test]
fn numpy_style_indexing_slices_reshapes_and_gathers() {
    use eager::Index;
    let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let x = t(&[2, 3, 4], &values);
    let range = |start, stop, step| Index::Range { start, stop, step };
    let of = |items: &[Index]| {
        let y = x.index(items).unwrap();
        (y.ty().shape.as_fixed().unwrap(), y.to_f64_vec().unwrap())
    };
    // x[1, -1] = [20, 21, 22, 23]
    assert_eq!(
        of(&[Index::At(1), Index::At(-1)]),
        (vec![4], vec![20.0, 21.0, 22.0, 23.0])
    );
    // x[:, 1:, ::2]: rows 1..3 of each, every second column.
    assert_eq!(
        of(&[
            Index::FULL,
            range(Some(1), None, None),
            range(None, None, Some(2))
        ]),
        (
            vec![2, 2, 2],
            vec![4.0, 6.0, 8.0, 10.0, 16.0, 18.0, 20.0, 22.0]
        )
    );
    // x[..., -2:] keeps the last two columns; x[None, 0, ..., 3] adds an axis.
    assert_eq!(
        of(&[Index::Ellipsis, range(Some(-2), None, None)]).0,
        vec![2, 3, 2]
    );
    assert_eq!(
        of(&[Index::NewAxis, Index::At(0), Index::Ellipsis, Index::At(3)]),
        (vec![1, 3], vec![3.0, 7.0, 11.0])
    );
    // x[0, [2, 0]] gathers rows; out-of-bounds stops clamp as Python's do.
    let rows = Tensor::new(Array::I64(ndarray::arr1(&[2, 0]).into_dyn()));
    assert_eq!(
        of(&[
            Index::At(0),
            Index::Gather(rows),
            range(None, Some(99), Some(3))
        ]),
        (vec![2, 2], vec![8.0, 11.0, 0.0, 3.0])
    );
    let refused = |items: &[Index]| x.index(items).err().unwrap().to_string();
    assert_eq!(
        refused(&[Index::FULL, Index::At(3)]),
        "index 3 is out of range for axis 1 of size 3"
    );
    assert_eq!(
        refused(&[Index::At(0), Index::At(0), Index::At(0), Index::At(0)]),
        "4 indices for a tensor of rank 3"
    );
    assert_eq!(
        refused(&[range(None, None, Some(0))]),
        "slices step forward (a step of 1 or more)"
    );
    let mask = Array::Bool(ndarray::arr1(&[false, true]).into_dyn());
    assert_eq!(x.masked(&mask).unwrap().to_f64_vec().unwrap()[0], 12.0);
}
