//! Static programs in a session: pruning, the signature cache, shared parameters, feed and
//! fetch errors, optimizers against reference formulas, and checkpoints.

use kiln_backend::Array;
use kiln_ir::{DType, Dim, Initializer, Shape, Type, parse_module};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{
    Adam, Fetch, Init, LearningRate, Momentum, Optimizer, Program, RuntimeError, Scope, Session,
    Sgd,
};
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize], v: &[f32]) -> Array {
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

fn scalar(a: &Array) -> f64 {
    a.to_f64_vec()[0]
}

/// `x: f32[N,3]` → a dense layer → mean squared error against `y: f32[N,2]`.
fn regression(seed: u64) -> (Program, kiln_ir::Value, kiln_ir::Value) {
    let mut p = Program::with_seed(seed);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(3)])
        .unwrap();
    let y = p
        .placeholder("y", DType::F32, vec![Dim::sym("N"), Dim::Fixed(2)])
        .unwrap();
    let pred = layers::dense(&mut p, "fc", x, 2, Activation::Tanh).unwrap();
    p.set_name(pred, "pred");
    let loss = layers::mse(&mut p, pred, y).unwrap();
    p.set_name(loss, "loss");
    (p, pred, loss)
}

#[test]
fn building_the_same_program_twice_gives_the_same_ir() {
    let build = || {
        let (mut p, _, loss) = regression(3);
        Adam::new(0.01).minimize(&mut p, loss).unwrap();
        (p.module().clone(), p.graph().to_string())
    };
    assert_eq!(build(), build());
    let (other, _, _) = regression(4);
    assert_ne!(
        build().0,
        other.module().clone(),
        "the seed reaches the initializers"
    );
}

#[test]
fn runs_are_pruned_to_what_the_fetches_need() {
    let (p, pred, _) = regression(1);
    let mut s = Session::new(&p).unwrap();
    // `pred` needs only `x`: `y` need not be fed.
    let out = s
        .run(&[pred.into()], &[("x", f32s(&[2, 3], &[0.1; 6]))])
        .unwrap();
    assert_eq!(out[0].shape(), &[2, 2]);
    let err = s
        .run(&["loss".into()], &[("x", f32s(&[2, 3], &[0.1; 6]))])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "missing feed for placeholder `y`: f32[N,2]"
    );
}

#[test]
fn the_same_signature_reuses_the_prepared_program() {
    let (mut p, _, loss) = regression(1);
    let train = Sgd::new(0.1).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let feeds = |n: usize| {
        vec![
            ("x", f32s(&[n, 3], &vec![0.5; n * 3])),
            ("y", f32s(&[n, 2], &vec![0.2; n * 2])),
        ]
    };
    let fetches = [Fetch::Target(train), loss.into()];
    s.run(&fetches, &feeds(4)).unwrap();
    assert_eq!(s.compilations(), 1);
    for _ in 0..5 {
        s.run(&fetches, &feeds(4)).unwrap();
    }
    assert_eq!(
        s.compilations(),
        1,
        "same fetches, feeds, dtypes and shapes: nothing prepared"
    );
    s.run(&fetches, &feeds(7)).unwrap();
    assert_eq!(
        s.compilations(),
        1,
        "another batch size is the same signature: the batch dimension is symbolic"
    );
    s.run(&[loss.into()], &feeds(4)).unwrap();
    assert_eq!(
        s.compilations(),
        2,
        "another fetch set is another signature"
    );
    s.run(&["loss".into()], &feeds(4)).unwrap();
    assert_eq!(
        s.compilations(),
        2,
        "a fetch by name resolves to the same value"
    );
}

#[test]
fn errors_name_the_placeholder_and_what_exists() {
    let (p, pred, _) = regression(1);
    let mut s = Session::new(&p).unwrap();
    let wrong_dtype = Array::F64(ArrayD::zeros(IxDyn(&[2, 3])));
    let err = s
        .run(&[pred.into()], &[("x", wrong_dtype)])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "feed `x`: the placeholder is f32[N,3], but the fed array is f64[2,3] (the dtype is f64, not f32)"
    );
    let err = s
        .run(&[pred.into()], &[("x", f32s(&[2, 4], &[0.0; 8]))])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "feed `x`: the placeholder is f32[N,3], but the fed array is f32[2,4] (dimension 1 is 4, expected 3)"
    );
    let err = s.run(&["prediction".into()], &[]).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "fetch `prediction`: nothing in the program has that name; named values and targets: "
        ),
        "{err}"
    );
    assert!(
        err.contains("pred") && err.contains("loss") && err.contains("fc.w"),
        "{err}"
    );
    let err = s
        .run(&[pred.into()], &[("z", f32s(&[1], &[0.0]))])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "feed `z`: no placeholder or named value has that name; the placeholders are: x, y"
    );
    let mut p2 = Program::new();
    p2.placeholder("x", DType::F32, Shape::scalar()).unwrap();
    let err = p2
        .placeholder("x", DType::F32, Shape::scalar())
        .unwrap_err()
        .to_string();
    assert_eq!(err, "`x` is already declared in this program");
}

#[test]
fn sub_programs_share_one_scope() {
    let mut p = Program::new();
    let a = p
        .parameter("a", DType::F32, &[1], Init::Constant(1.0))
        .unwrap();
    let b = p
        .parameter("b", DType::F32, &[1], Init::Constant(1.0))
        .unwrap();
    let la = layers::mean(&mut p, a).unwrap();
    let lb = layers::mean(&mut p, b).unwrap();
    let ta = Sgd::named("sgd_a", 0.5)
        .minimize_params(&mut p, la, &["a".into()])
        .unwrap();
    let tb = Sgd::named("sgd_b", 0.25)
        .minimize_params(&mut p, lb, &["b".into()])
        .unwrap();
    let mut s = Session::new(&p).unwrap();
    s.run(&[ta.into()], &[]).unwrap();
    assert_eq!(s.scope().get("a").unwrap().to_f64_vec(), [0.5]);
    assert_eq!(
        s.scope().get("b").unwrap().to_f64_vec(),
        [1.0],
        "the other target's parameter is untouched"
    );
    s.run(&[tb.into()], &[]).unwrap();
    s.run(&[ta.into()], &[]).unwrap();
    assert_eq!(s.scope().get("a").unwrap().to_f64_vec(), [0.0]);
    assert_eq!(s.scope().get("b").unwrap().to_f64_vec(), [0.75]);
}

/// Minimises `sum((w - c)²)` for three steps and compares with the update written in f64.
fn quadratic(
    opt: &mut dyn Optimizer,
    reference: impl Fn(&mut [f64], &mut Vec<Vec<f64>>, &[f64], usize),
) {
    let c = [1.0, -2.0, 0.5];
    let mut p = Program::new();
    let w = p
        .parameter("w", DType::F32, &[3], Init::Constant(0.25))
        .unwrap();
    let target = p
        .constant(
            kiln_ir::Literal::F32(c.map(|v| v as f32).to_vec()),
            Type::new(DType::F32, Shape::fixed(&[3])),
        )
        .unwrap();
    let d = p.sub(w, target).unwrap();
    let d2 = p.mul(d, d).unwrap();
    let loss = p
        .reduce(kiln_ir::ReduceOp::Sum, d2, vec![0], false)
        .unwrap();
    let train = opt.minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let mut want = vec![0.25; 3];
    let mut state = Vec::new();
    for step in 1..=3 {
        s.run(&[train.into()], &[]).unwrap();
        let grad: Vec<f64> = want.iter().zip(&c).map(|(w, c)| 2.0 * (w - c)).collect();
        reference(&mut want, &mut state, &grad, step);
        let got = s.scope().get("w").unwrap().to_f64_vec();
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() < 1e-5,
                "step {step}: got {got:?}, want {want:?}"
            );
        }
    }
}

#[test]
fn sgd_momentum_and_adam_follow_their_formulas() {
    quadratic(&mut Sgd::new(0.1), |w, _, g, _| {
        for i in 0..3 {
            w[i] -= 0.1 * g[i];
        }
    });
    quadratic(&mut Momentum::new(0.1, 0.9), |w, state, g, _| {
        state.resize(1, vec![0.0; 3]);
        for i in 0..3 {
            state[0][i] = 0.9 * state[0][i] + g[i];
            w[i] -= 0.1 * state[0][i];
        }
    });
    quadratic(&mut Adam::new(0.1), |w, state, g, t| {
        state.resize(2, vec![0.0; 3]);
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
        for i in 0..3 {
            state[0][i] = b1 * state[0][i] + (1.0 - b1) * g[i];
            state[1][i] = b2 * state[1][i] + (1.0 - b2) * g[i] * g[i];
            let denom = state[1][i].sqrt() / (1.0 - b2.powi(t as i32)).sqrt() + eps;
            w[i] -= 0.1 / (1.0 - b1.powi(t as i32)) * state[0][i] / denom;
        }
    });
}

/// PyTorch's meanings of the optimizers' options, each against its update written out:
/// weight decay, Nesterov momentum, dampening (the first step undamped), decoupled weight
/// decay (AdamW).
#[test]
fn optimizer_options_follow_pytorch() {
    quadratic(&mut Sgd::new(0.1).with_weight_decay(0.2), |w, _, g, _| {
        for i in 0..3 {
            w[i] -= 0.1 * (g[i] + 0.2 * w[i]);
        }
    });
    let mut nesterov = Momentum::new(0.1, 0.9)
        .with_nesterov(true)
        .with_weight_decay(0.05);
    quadratic(&mut nesterov, |w, state, g, _| {
        state.resize(1, vec![0.0; 3]);
        for i in 0..3 {
            let g = g[i] + 0.05 * w[i];
            state[0][i] = 0.9 * state[0][i] + g;
            w[i] -= 0.1 * (g + 0.9 * state[0][i]);
        }
    });
    quadratic(
        &mut Momentum::new(0.1, 0.8).with_dampening(0.5),
        |w, state, g, t| {
            state.resize(1, vec![0.0; 3]);
            let entering = if t == 1 { 1.0 } else { 0.5 };
            for i in 0..3 {
                state[0][i] = 0.8 * state[0][i] + entering * g[i];
                w[i] -= 0.1 * state[0][i];
            }
        },
    );
    let mut adamw = Adam::new(0.1).with_decoupled_weight_decay(0.3);
    quadratic(&mut adamw, |w, state, g, t| {
        state.resize(2, vec![0.0; 3]);
        let (b1, b2, eps) = (0.9f64, 0.999f64, 1e-8);
        for i in 0..3 {
            w[i] -= 0.1 * 0.3 * w[i];
            state[0][i] = b1 * state[0][i] + (1.0 - b1) * g[i];
            state[1][i] = b2 * state[1][i] + (1.0 - b2) * g[i] * g[i];
            let denom = state[1][i].sqrt() / (1.0 - b2.powi(t as i32)).sqrt() + eps;
            w[i] -= 0.1 / (1.0 - b1.powi(t as i32)) * state[0][i] / denom;
        }
    });
}

#[test]
fn optimizer_state_is_declared_in_the_module() {
    let (mut p, _, loss) = regression(1);
    Adam::new(0.01).minimize(&mut p, loss).unwrap();
    let names: Vec<&str> = p.module().states.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "fc.w",
            "fc.b",
            "adam.step",
            "adam.m.fc.w",
            "adam.v.fc.w",
            "adam.m.fc.b",
            "adam.v.fc.b"
        ]
    );
}

#[test]
fn the_learning_rate_can_be_a_feed() {
    let mut p = Program::new();
    let w = p
        .parameter("w", DType::F32, &[], Init::Constant(1.0))
        .unwrap();
    let lr = p.placeholder("lr", DType::F32, Shape::scalar()).unwrap();
    let loss = p.mul(w, w).unwrap();
    let train = Sgd::new(LearningRate::Feed(lr))
        .minimize(&mut p, loss)
        .unwrap();
    let mut s = Session::new(&p).unwrap();
    s.run(&[train.into()], &[("lr", f32s(&[], &[0.25]))])
        .unwrap();
    assert_eq!(s.scope().get("w").unwrap().to_f64_vec(), [0.5]);
    s.run(&[train.into()], &[("lr", f32s(&[], &[0.0]))])
        .unwrap();
    assert_eq!(s.scope().get("w").unwrap().to_f64_vec(), [0.5]);
}

#[test]
fn keras_style_functions() {
    let (mut p, pred, loss) = regression(2);
    let (x, y) = (p.value("x").unwrap(), p.value("y").unwrap());
    let train = Sgd::new(0.5).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let step = s.function(&[x, y], &[loss], &[train]).unwrap();
    let predict = s.function(&[x], &[pred], &[]).unwrap();
    let (xs, ys) = (
        f32s(&[2, 3], &[1., 0., 0., 0., 1., 0.]),
        f32s(&[2, 2], &[0.5, -0.5, -0.5, 0.5]),
    );
    let first = scalar(&step.call(&mut s, &[xs.clone(), ys.clone()]).unwrap()[0]);
    for _ in 0..20 {
        step.call(&mut s, &[xs.clone(), ys.clone()]).unwrap();
    }
    let last = scalar(&step.call(&mut s, &[xs.clone(), ys]).unwrap()[0]);
    assert!(last < first / 2.0, "{first} -> {last}");
    assert_eq!(predict.call(&mut s, &[xs]).unwrap()[0].shape(), &[2, 2]);
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn checkpoints_round_trip_and_reject_bad_files() {
    let dir = temp_dir("checkpoint");
    let path = dir.join("params.safetensors");
    let (mut p, _, loss) = regression(5);
    let train = Adam::new(0.05).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let feeds = [
        ("x", f32s(&[1, 3], &[1., 2., 3.])),
        ("y", f32s(&[1, 2], &[0.1, 0.2])),
    ];
    s.run(&[train.into()], &feeds).unwrap();
    s.scope().save(&path).unwrap();

    // A fresh scope for the same program loads every value, moments included.
    let mut restored = Scope::from_module(p.module()).unwrap();
    restored.load(&path).unwrap();
    for (name, value) in s.scope().iter() {
        assert_eq!(restored.get(name), Some(value), "{name}");
    }

    // Truncated: an error, and the scope keeps its values.
    let bytes = std::fs::read(&path).unwrap();
    let truncated = dir.join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() - 7]).unwrap();
    let before = restored.clone();
    let err = restored.load(&truncated).unwrap_err().to_string();
    assert!(err.contains("is not a valid checkpoint"), "{err}");
    assert_eq!(
        restored.iter().collect::<Vec<_>>(),
        before.iter().collect::<Vec<_>>()
    );

    // Tampered data (the header intact): the checksum catches it.
    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x40;
    let tampered_path = dir.join("tampered.safetensors");
    std::fs::write(&tampered_path, &tampered).unwrap();
    let err = restored.load(&tampered_path).unwrap_err().to_string();
    assert!(err.contains("fails its checksum"), "{err}");

    // Garbage and missing files: errors, not panics.
    std::fs::write(dir.join("garbage"), b"not a checkpoint at all").unwrap();
    assert!(restored.load(&dir.join("garbage")).is_err());
    assert!(
        restored
            .load(&dir.join("missing"))
            .unwrap_err()
            .to_string()
            .starts_with("cannot read")
    );

    // A program whose layer is wider: the error names the parameter and both shapes.
    let mut wide = Program::with_seed(5);
    let x = wide
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(3)])
        .unwrap();
    layers::dense(&mut wide, "fc", x, 4, Activation::Tanh).unwrap();
    let mut other = Scope::from_module(wide.module()).unwrap();
    let err = other.load(&path).unwrap_err().to_string();
    assert!(
        err.ends_with("`fc.b` is f32[2] in the checkpoint but f32[4] in the program"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_failed_save_leaves_the_previous_checkpoint_intact() {
    let dir = temp_dir("atomic");
    let path = dir.join("params.safetensors");
    let (p, _, _) = regression(6);
    let s = Session::new(&p).unwrap();
    s.scope().save(&path).unwrap();
    let saved = std::fs::read(&path).unwrap();
    // Block the temporary file's name with a directory, so the next save cannot write it.
    let blocker = dir.join(format!(".params.safetensors.tmp-{}", std::process::id()));
    std::fs::create_dir_all(&blocker).unwrap();
    let mut changed = s.scope().clone();
    changed.set("fc.b", f32s(&[2], &[9.0, 9.0])).unwrap();
    let err = changed.save(&path).unwrap_err().to_string();
    assert!(err.starts_with("cannot write"), "{err}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        saved,
        "the previous checkpoint is intact"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn exported_programs_serve_the_same_predictions() {
    let (mut p, pred, loss) = regression(7);
    let train = Adam::new(0.05).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let xs = f32s(&[2, 3], &[0.3, -0.2, 0.9, 1.0, 0.0, -1.0]);
    s.run(
        &[train.into()],
        &[("x", xs.clone()), ("y", f32s(&[2, 2], &[1., 0., 0., 1.]))],
    )
    .unwrap();
    let module = p.export_module(&[("predict", &[pred][..])]).unwrap();
    let text = module.to_string();
    let served = parse_module(&text).unwrap();
    assert!(served == module);
    assert_eq!(
        served.function("predict").unwrap().args().len(),
        1,
        "only x is needed"
    );
    let mut state = s.scope().store().clone();
    let out = kiln_backend::Interpreter::new(&served)
        .run("predict", vec![xs.clone()], &mut state)
        .unwrap();
    let compiled = s.run(&[pred.into()], &[("x", xs)]).unwrap().remove(0);
    for (a, b) in out[0].to_f64_vec().iter().zip(compiled.to_f64_vec()) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{a} vs {b}");
    }
}

#[test]
fn scope_checks_types_and_declarations() {
    let mut p = Program::new();
    p.state(
        "counter",
        Type::scalar(DType::I64),
        Initializer::constant(3.0),
    )
    .unwrap();
    let mut scope = Scope::from_module(p.module()).unwrap();
    assert_eq!(scope.get("counter").unwrap().to_f64_vec(), [3.0]);
    let err = scope
        .set("counter", f32s(&[], &[1.0]))
        .unwrap_err()
        .to_string();
    assert_eq!(err, "state `counter`: declared as i64[], given f32[]");
    assert!(matches!(
        scope.set("nope", f32s(&[], &[1.0])),
        Err(RuntimeError::State { .. })
    ));
}

/// Two models in one program: `x → model 1 → z → model 2 → out`.
fn two_models() -> (Program, kiln_ir::Value, kiln_ir::Value) {
    let mut p = Program::with_seed(7);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(3)])
        .unwrap();
    let z = layers::dense(&mut p, "m1", x, 4, Activation::Tanh).unwrap();
    p.set_name(z, "z");
    let out = layers::dense(&mut p, "m2", z, 2, Activation::Identity).unwrap();
    p.set_name(out, "out");
    (p, z, out)
}

#[test]
fn one_models_output_is_fed_by_name_into_the_next_run() {
    let (p, z, out) = two_models();
    let mut s = Session::new(&p).unwrap();
    let x = f32s(&[2, 3], &[0.5, -1.0, 2.0, 0.0, 1.5, -0.5]);
    let direct = s.run(&[out.into()], &[("x", x.clone())]).unwrap();
    let fetched_z = s.run(&[z.into()], &[("x", x)]).unwrap().remove(0);
    // No `x`: nothing upstream of `z` runs, so the placeholder is not needed.
    let fed = s
        .run(&[Fetch::Name("out".into())], &[("z", fetched_z.clone())])
        .unwrap();
    assert_eq!(fed[0].to_f64_vec(), direct[0].to_f64_vec());
    // Fed a different value, the second model computes from it.
    let zeros = f32s(&[1, 4], &[0.0; 4]);
    let bias_only = s.run(&[out.into()], &[("z", zeros)]).unwrap();
    assert_eq!(bias_only[0].to_f64_vec(), [0.0, 0.0], "m2.b starts at zero");
    // The fed array is checked against the value's type.
    let err = s
        .run(&[out.into()], &[("z", f32s(&[2, 3], &[0.0; 6]))])
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "feed `z`: the value is f32[N,4], but the fed array is f32[2,3] (dimension 1 is 3, expected 4)"
    );
}

#[test]
fn feeding_a_value_an_update_needs_upstream_of_its_loss_is_an_error_naming_it() {
    let (mut p, _, out) = two_models();
    let y = p
        .placeholder("y", DType::F32, vec![Dim::sym("N"), Dim::Fixed(2)])
        .unwrap();
    let loss = layers::mse(&mut p, out, y).unwrap();
    let train = Sgd::new(0.1).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let feeds = [
        ("z", f32s(&[1, 4], &[0.1, 0.2, 0.3, 0.4])),
        ("y", f32s(&[1, 2], &[1.0, 0.0])),
    ];
    let err = s
        .run(&[Fetch::Target(train)], &feeds)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("feed `z`: the value is computed from @m1."),
        "{err}"
    );
    assert!(
        err.contains(&format!("which target `{}` updates", p.target_name(train))),
        "{err}"
    );
    // Without a target, feeding `z` to compute the loss is fine.
    let l = s.run(&[loss.into()], &feeds).unwrap();
    assert!(l[0].to_f64_vec()[0].is_finite());
}

#[test]
fn exec_stats_sum_every_field_over_the_prepared_slices() {
    // A convolution with a ReLU epilogue and a max pooling whose gradient reads its kept
    // argmax: `epilogues`, `epilogues_run` and `kept_argmax` read 0 here before they were summed.
    let mut p = Program::with_seed(5);
    let x = p
        .placeholder(
            "x",
            DType::F32,
            vec![Dim::Fixed(2), Dim::Fixed(3), Dim::Fixed(8), Dim::Fixed(8)],
        )
        .unwrap();
    let attrs = kiln_ir::Conv2dAttrs {
        padding: [(1, 1), (1, 1)],
        ..kiln_ir::Conv2dAttrs::default()
    };
    let h = layers::conv2d(&mut p, "conv", x, 4, [3, 3], attrs, Activation::Relu).unwrap();
    let pooled = layers::max_pool2d(&mut p, h, kiln_ir::Pool2dAttrs::new([2, 2], [2, 2])).unwrap();
    let loss = layers::mean(&mut p, pooled).unwrap();
    let train = Sgd::new(0.1).minimize(&mut p, loss).unwrap();
    let mut s = Session::new(&p).unwrap();
    let xs = f32s(
        &[2, 3, 8, 8],
        &(0..384).map(|i| (i % 7) as f32 - 3.0).collect::<Vec<_>>(),
    );
    for _ in 0..2 {
        s.run(&[Fetch::Target(train), loss.into()], &[("x", xs.clone())])
            .unwrap();
    }
    s.run(&[loss.into()], &[("x", xs)]).unwrap();
    let stats = s.exec_stats();
    assert_eq!(
        stats.runs, 3,
        "two training runs and one of the loss: {stats:?}"
    );
    assert!(
        stats.epilogues >= 2,
        "each slice's convolution runs its ReLU: {stats:?}"
    );
    assert!(stats.epilogues_run >= 3, "{stats:?}");
    assert!(
        stats.kept_argmax >= 1,
        "the training slice keeps the pooling's argmax: {stats:?}"
    );
}

#[test]
fn an_sgd_step_of_dense_layers_accumulates_the_weight_gradients_onto_the_weights() {
    // What W5's step does: the default pipeline's `fold_updates` makes each weight's update a
    // `matmul_acc` (the biases' gradients are reductions, which stay updates of their own).
    let (mut p, _, loss) = regression(4);
    let h = p.value("pred").unwrap();
    let second = layers::dense(&mut p, "fc2", h, 2, Activation::Identity).unwrap();
    let y = p.value("y").unwrap();
    let loss2 = layers::mse(&mut p, second, y).unwrap();
    let total = p.add(loss, loss2).unwrap();
    let train = Sgd::new(0.1).minimize(&mut p, total).unwrap();
    let step = p.export("step", &[], &[train]);
    let mut module = kiln_ir::Module {
        states: p.module().states.clone(),
        functions: vec![step],
    };
    let mut pipeline = kiln_passes::manager::PassManager::pipeline("default").unwrap();
    pipeline.run(&mut module).unwrap();
    let text = module.to_string();
    assert_eq!(
        text.matches("matmul_acc").count(),
        2,
        "fc.w and fc2.w:\n{text}"
    );
}
