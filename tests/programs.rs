//! The example programs under `tests/programs/`: each is checked, printed (snapshotted),
//! round-tripped through the text form, and run by the interpreter against an independent
//! formula computed here in f64.

mod common;

use common::*;
use kiln::backend::{Interpreter, StateStore};
use kiln::ir::parse_module;

#[test]
fn every_program_verifies_prints_and_round_trips() {
    insta::glob!("programs/*.kir", |path| {
        let module = load(path);
        let printed = module.to_string();
        insta::assert_snapshot!(printed);
        let reparsed = parse_module(&printed).unwrap();
        assert!(reparsed == module, "{} does not round-trip", path.display());
        assert_eq!(reparsed.to_string(), printed);
    });
}

fn state_values(state: &StateStore, name: &str) -> Vec<f64> {
    state.get(name).unwrap().to_f64_vec()
}

/// `a[m,k] @ b[k,n]` in f64.
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

#[test]
fn mlp_forward_matches_formula() {
    let module = program("mlp.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    let x = data(3 * 4, 1);
    let y = run(&module, "predict", vec![f32s(&[3, 4], &x)], &mut state);
    let x32: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
    let (w1, b1) = (state_values(&state, "fc1.w"), state_values(&state, "fc1.b"));
    let (w2, b2) = (state_values(&state, "fc2.w"), state_values(&state, "fc2.b"));
    let mut h = matmul(&x32, &w1, 3, 4, 8);
    for (i, v) in h.iter_mut().enumerate() {
        *v = (*v + b1[i % 8]).max(0.0);
    }
    let mut want = matmul(&h, &w2, 3, 8, 3);
    for (i, v) in want.iter_mut().enumerate() {
        *v += b2[i % 3];
    }
    assert_eq!(y[0].shape(), &[3, 3]);
    assert_close(&y[0].to_f64_vec(), &want, 1e-5);
    assert!(
        b1.iter().all(|&b| (b - 0.1).abs() < 1e-7),
        "constant initializer"
    );
}

#[test]
fn softmax_cross_entropy_and_accuracy_match_formula() {
    let module = program("softmax_xent.kir");
    let mut state = StateStore::new();
    let n = 6;
    let logits: Vec<f64> = data(n * 10, 2).iter().map(|v| v * 5.0).collect();
    let logits32: Vec<f64> = logits.iter().map(|&v| v as f32 as f64).collect();
    let labels = [3i64, 0, 9, 4, 4, 7];
    let args = || vec![f32s(&[n, 10], &logits), i64s(&[n], &labels)];
    let loss = run(&module, "loss", args(), &mut state)[0].to_f64_vec()[0];
    let mut want = 0.0;
    let mut hits = 0;
    for (row, &label) in logits32.chunks(10).zip(&labels) {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        want += lse - row[label as usize];
        let argmax = (0..10).fold(0, |best, i| if row[i] > row[best] { i } else { best });
        hits += (argmax == label as usize) as usize;
    }
    assert_close(&[loss], &[want / n as f64], 1e-6);
    let acc = run(&module, "accuracy", args(), &mut state)[0].to_f64_vec()[0];
    assert_eq!(acc, (hits as f32 / n as f32) as f64);
}

#[test]
fn layer_norm_matches_formula() {
    let module = program("layer_norm.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    let x: Vec<f64> = data(4 * 8, 3).iter().map(|v| v * 3.0 + 1.0).collect();
    let y = run(&module, "layer_norm", vec![f32s(&[4, 8], &x)], &mut state);
    let gamma = state_values(&state, "ln.gamma");
    let beta = state_values(&state, "ln.beta");
    assert!(
        gamma.iter().all(|&g| (0.5..1.5).contains(&g)),
        "uniform initializer range"
    );
    let mut want = Vec::new();
    for row in x.chunks(8) {
        let row: Vec<f64> = row.iter().map(|&v| v as f32 as f64).collect();
        let mu = row.iter().sum::<f64>() / 8.0;
        let var = row.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 8.0;
        for (j, v) in row.iter().enumerate() {
            want.push((v - mu) / (var + 1e-5).sqrt() * gamma[j] + beta[j]);
        }
    }
    assert_close(&y[0].to_f64_vec(), &want, 1e-5);
}

#[test]
fn sgd_steps_update_state_like_reference_descent() {
    let module = program("sgd_step.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    let n = 8;
    let x = data(n * 3, 4);
    let x32: Vec<f64> = x.iter().map(|&v| v as f32 as f64).collect();
    let true_w = [1.5, -2.0, 0.5];
    let y: Vec<f64> = x32
        .chunks(3)
        .map(|r| r.iter().zip(&true_w).map(|(a, b)| a * b).sum::<f64>() + 0.3)
        .collect();
    let lr = 0.1;
    let (mut w, mut b) = ([0.0f64; 3], 0.0f64);
    let mut losses = Vec::new();
    for step in 0..5 {
        let args = vec![f32s(&[n, 3], &x), f32s(&[n, 1], &y), f32s(&[], &[lr])];
        let loss = run(&module, "train_step", args, &mut state)[0].to_f64_vec()[0];
        // Reference: the loss before this step's update, then the update.
        let err: Vec<f64> = (0..n)
            .map(|i| (0..3).map(|j| x32[i * 3 + j] * w[j]).sum::<f64>() + b - y[i] as f32 as f64)
            .collect();
        let want_loss = err.iter().map(|e| e * e).sum::<f64>() / n as f64;
        assert_close(&[loss], &[want_loss], 1e-5);
        for j in 0..3 {
            w[j] -= lr * 2.0 / n as f64 * (0..n).map(|i| x32[i * 3 + j] * err[i]).sum::<f64>();
        }
        b -= lr * 2.0 / n as f64 * err.iter().sum::<f64>();
        assert_close(&state_values(&state, "w"), &w, 1e-5);
        assert_close(&state_values(&state, "b"), &[b], 1e-5);
        assert_eq!(state_values(&state, "step"), [(step + 1) as f64]);
        losses.push(loss);
    }
    assert!(
        losses.windows(2).all(|p| p[1] < p[0]),
        "loss decreases: {losses:?}"
    );
}

#[test]
fn failed_run_changes_no_state() {
    let module = program("sgd_step.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    let before = state.clone();
    // y has the wrong number of rows: the run fails at the first op that meets it.
    let args = vec![
        f32s(&[4, 3], &data(12, 5)),
        f32s(&[5, 1], &data(5, 6)),
        f32s(&[], &[0.1]),
    ];
    let err = Interpreter::new(&module)
        .run("train_step", args, &mut state)
        .unwrap_err()
        .to_string();
    assert!(err.contains("argument %y of @train_step"), "{err}");
    assert!(err.contains("N is already bound to 4"), "{err}");
    assert_eq!(state, before);
}

#[test]
fn newton_sqrt_and_clip_by_norm_match_formula() {
    let module = program("control_flow.kir");
    let mut state = StateStore::new();
    let a = [2.0, 9.0, 0.25, 1e6];
    let iters = 30;
    let out = run(
        &module,
        "newton_sqrt",
        vec![
            f64s(&[4], &a),
            kiln::backend::Array::I32(ndarray::arr0(iters).into_dyn()),
        ],
        &mut state,
    );
    let want: Vec<f64> = a
        .iter()
        .map(|&a| (0..iters).fold(a, |x, _| (x + a / x) * 0.5))
        .collect();
    assert_eq!(out[0].to_f64_vec(), want, "same arithmetic, same bits");
    assert_close(&want, &a.map(f64::sqrt), 1e-12);

    for (g, max_norm) in [(vec![3.0, 4.0], 1.0), (vec![0.3, 0.4], 1.0)] {
        let out = run(
            &module,
            "clip_by_norm",
            vec![f32s(&[2], &g), f32s(&[], &[max_norm])],
            &mut state,
        );
        let norm = (g[0] * g[0] + g[1] * g[1]).sqrt();
        let scale = if norm > max_norm {
            max_norm / norm
        } else {
            1.0
        };
        assert_close(&out[0].to_f64_vec(), &[g[0] * scale, g[1] * scale], 1e-6);
    }
}

#[test]
fn attention_matches_formula() {
    let module = program("attention.kir");
    let mut state = StateStore::initialize(&module).unwrap();
    let tokens = [1, 5, 5, 15, 0, 7];
    let out = run(&module, "attend", vec![i32s(&[2, 3], &tokens)], &mut state);
    assert_eq!(out[0].shape(), &[2, 3, 4]);
    let table = state_values(&state, "embed");
    let mut want = Vec::new();
    for batch in tokens.chunks(3) {
        let e: Vec<&[f64]> = batch
            .iter()
            .map(|&t| &table[t as usize * 4..][..4])
            .collect();
        for i in 0..3 {
            let s: Vec<f64> = (0..3)
                .map(|j| 0.5 * (0..4).map(|d| e[i][d] * e[j][d]).sum::<f64>())
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
            let weights: Vec<f64> = s.iter().map(|v| (v - m).exp() / z).collect();
            want.extend((0..4).map(|d| (0..3).map(|j| weights[j] * e[j][d]).sum::<f64>()));
        }
    }
    assert_close(&out[0].to_f64_vec(), &want, 1e-5);
}

#[test]
fn layout_ops_match_index_formulas() {
    let module = program("layout.kir");
    let mut state = StateStore::new();
    let img: Vec<f64> = (0..2 * 16).map(|v| v as f64).collect();
    let out = run(&module, "patches", vec![f32s(&[2, 4, 4], &img)], &mut state);
    assert_eq!(out[0].shape(), &[2, 2, 8]);
    assert_eq!(out[0].to_f64_vec(), img, "reshape keeps row-major order");
    // even[n, i, j] = transpose(img)[n, i, 2j] = img[n, 2j, i]
    let mut want = Vec::new();
    for n in 0..2 {
        for i in 0..4 {
            for j in 0..2 {
                want.push(img[n * 16 + (2 * j) * 4 + i]);
            }
        }
    }
    assert_eq!(out[1].to_f64_vec(), want);

    let x = data(3 * 5, 7);
    let run_with = |counter| {
        Interpreter::new(&module)
            .with_rng_counter(counter)
            .run(
                "masked_noise",
                vec![f32s(&[3, 5], &x)],
                &mut StateStore::new(),
            )
            .unwrap()
    };
    let (first, again, next) = (run_with(0), run_with(0), run_with(1));
    let y = first[0].to_f64_vec();
    for (i, (&got, &orig)) in y.iter().zip(&x).enumerate() {
        if i % 5 < 2 {
            assert_eq!(got, orig as f32 as f64, "masked columns are untouched");
        } else {
            assert_ne!(got, orig as f32 as f64, "noise is added");
        }
    }
    assert_eq!(first, again, "the same run counter draws the same numbers");
    assert_ne!(
        first[0], next[0],
        "the next run counter draws fresh numbers"
    );
    assert_eq!(first[1].to_f64_vec(), [0., 0., 1., 1., 1.].repeat(3));
}
