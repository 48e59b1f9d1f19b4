//! The examples, at a small size: the GAN trained by sub-graphs over one scope, and the digits
//! classifier trained, exported, saved and served by `kiln run`.

mod common;

use kiln::demos::{digits_static, gan_1d};
use std::process::Command;

#[test]
fn gan_generator_learns_the_real_mean_and_runs_reuse_prepared_programs() {
    let config = gan_1d::Config {
        iterations: 600,
        report_every: 100,
        ..gan_1d::Config::default()
    };
    let outcome = gan_1d::train(&config, |_| {}).unwrap();
    let late = &outcome.history[3..];
    let mean = late.iter().map(|r| r.mean).sum::<f64>() / late.len() as f64;
    assert!(
        (mean - 4.0).abs() < 0.5,
        "generated mean {mean}: {:?}",
        outcome.history
    );
    // 1,200 training runs and 6 sample runs prepared exactly three programs: the D step,
    // the G step, and the sampler.
    assert_eq!(outcome.session.compilations(), 3);
}

#[test]
fn digits_classifier_trains_exports_and_serves() {
    let config = digits_static::Config {
        epochs: 3,
        ..digits_static::Config::default()
    };
    let outcome = digits_static::train(&config, |_| {}).unwrap();
    let last = outcome.history.last().unwrap();
    assert!(last.test_accuracy > 0.90, "{:?}", outcome.history);
    assert!(outcome.history[0].mean_loss > last.mean_loss);

    let dir = std::env::temp_dir().join(format!("kiln-digits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let module = outcome
        .model
        .program
        .export_module(&[("predict", &[outcome.model.logits][..])])
        .unwrap();
    let (ir, params) = (dir.join("digits.kir"), dir.join("digits.safetensors"));
    kiln::runtime::checkpoint::save_module(&module, &ir).unwrap();
    assert!(kiln::runtime::checkpoint::load_module(&ir).unwrap() == module);
    outcome.session.scope().save(&params).unwrap();

    let sample = outcome.test.select(&[0, 1, 2]).all();
    let x_path = dir.join("x.npy");
    kiln::npy::write_npy(&x_path, &sample.x).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            ir.to_str().unwrap(),
            "--state",
            params.to_str().unwrap(),
        ])
        .args([
            "--feed",
            &format!("x={}", x_path.display()),
            "--out",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = kiln::npy::read_npy(&dir.join("logits.npy"), kiln::ir::DType::F32).unwrap();
    let mut session = outcome.session;
    let direct = session
        .run(&[outcome.model.logits.into()], &[("x", sample.x)])
        .unwrap();
    assert_eq!(
        served, direct[0],
        "kiln run on the saved files gives the session's logits"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn digits_dygraph_trains_eagerly_compiles_and_serves() {
    use kiln::demos::digits_dygraph;
    let config = digits_dygraph::Config {
        epochs: 3,
        ..digits_dygraph::Config::default()
    };
    let mut outcome = digits_dygraph::train(&config, |_| {}).unwrap();
    assert!(
        outcome.history.last().unwrap().test_accuracy > 0.90,
        "{:?}",
        outcome.history
    );
    assert!(
        outcome.max_logit_difference < 1e-5,
        "{}",
        outcome.max_logit_difference
    );
    assert_eq!(outcome.prediction_agreement, 1.0);

    let dir = std::env::temp_dir().join(format!("kiln-dygraph-{}", std::process::id()));
    let (ir, params) = digits_dygraph::save(&outcome, &dir).unwrap();
    let sample = outcome.test.select(&[3, 4]).all();
    let x_path = dir.join("x.npy");
    kiln::npy::write_npy(&x_path, &sample.x).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "run",
            ir.to_str().unwrap(),
            "--state",
            params.to_str().unwrap(),
        ])
        .args([
            "--feed",
            &format!("x={}", x_path.display()),
            "--out",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            let inputs = [x_path.clone(), dir.join("test_images.npy")];
            p.extension().is_some_and(|e| e == "npy") && !inputs.contains(p)
        })
        .expect("kiln run wrote the logits");
    let served = kiln::npy::read_npy(&served, kiln::ir::DType::F32).unwrap();
    let x = kiln::runtime::eager::Tensor::new(sample.x);
    let compiled = outcome.compiled.call(&[&x]).unwrap();
    assert_eq!(
        served,
        compiled[0].to_array().unwrap(),
        "kiln run on the saved files agrees"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn digits_cnn_trains_and_serves_the_same_logits() {
    use kiln::demos::digits_cnn;
    use kiln::runtime::{Fetch, Session};
    let config = digits_cnn::config();
    let model = digits_cnn::build(&config, kiln::demos::digits_static::DIGITS_IMAGE).unwrap();
    let (train, _) = kiln::runtime::data::digits()
        .unwrap()
        .split(0.2, 0)
        .unwrap();
    let batch = train.select(&(0..24).collect::<Vec<_>>()).all();
    let mut session = Session::new(&model.program).unwrap();
    let feeds = [("x", batch.x.clone()), ("y", batch.y.clone())];
    let mut losses = Vec::new();
    for _ in 0..15 {
        let out = session
            .run(&[Fetch::Target(model.train), model.loss.into()], &feeds)
            .unwrap();
        losses.push(out[0].to_f64_vec()[0]);
    }
    assert!(
        losses[7] < 0.5 * losses[0],
        "the loss does not fall: {losses:?}"
    );
    // The exported prediction program, compiled on its own, gives the session's logits.
    let module = (model.program)
        .export_module(&[("predict", &[model.logits][..])])
        .unwrap();
    let state = session.scope().store().clone();
    let mut predictor = kiln::serve::Predictor::compile(module, "predict", state).unwrap();
    let served = predictor.predict(vec![batch.x.clone()]).unwrap().remove(0);
    let direct = session
        .run(&[model.logits.into()], &[("x", batch.x)])
        .unwrap();
    assert_eq!(served.to_f64_vec(), direct[0].to_f64_vec());
}

#[test]
fn digits_rnn_learns_from_rows_as_steps() {
    use kiln::demos::digits_rnn;
    let config = digits_rnn::Config {
        epochs: 6,
        ..digits_rnn::config()
    };
    let outcome = digits_rnn::train(&config, |_| {}).unwrap();
    let last = outcome.history.last().unwrap();
    assert!(last.test_accuracy > 0.8, "{:?}", outcome.history);
    assert!(outcome.history[0].mean_loss > last.mean_loss);
}

#[test]
fn digits_transformer_learns_from_patches() {
    use kiln::demos::digits_transformer;
    let config = digits_transformer::Config {
        epochs: 4,
        ..digits_transformer::config()
    };
    let outcome = digits_transformer::train(&config, |_| {}).unwrap();
    let last = outcome.history.last().unwrap();
    assert!(last.test_accuracy > 0.85, "{:?}", outcome.history);
    assert!(outcome.history[0].mean_loss > last.mean_loss);
}
