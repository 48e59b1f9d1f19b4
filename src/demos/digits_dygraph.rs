//! The digits MLP written eagerly: trained with `backward()` and an eager Adam, then compiled
//! with `to_static`, which shares the trained parameters.

use kiln_ir::{DType, Dim, Shape, Type};
use kiln_runtime::data::{self, Dataset};
use kiln_runtime::eager::nn::{self, Layer, Linear, Relu, Sequential};
use kiln_runtime::eager::{self, EagerError, EagerOptimizer, EagerResult, StaticFunction, Tensor};
use kiln_runtime::{Adam, RuntimeError};

#[derive(Clone, Debug)]
pub struct Config {
    pub epochs: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            epochs: 20,
            batch_size: 32,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
        }
    }
}

pub use super::digits_static::Epoch;

pub struct Outcome {
    pub model: Sequential,
    pub history: Vec<Epoch>,
    pub test: Dataset,
    /// `forward` compiled with `to_static`, sharing the trained parameters.
    pub compiled: StaticFunction,
    /// On the test set: the largest difference between eager and compiled logits, and the
    /// fraction of rows whose predicted class agrees.
    pub max_logit_difference: f64,
    pub prediction_agreement: f64,
}

fn argmax_rows(values: &[f64], width: usize) -> Vec<usize> {
    values
        .chunks(width)
        .map(|row| (0..width).fold(0, |best, i| if row[i] > row[best] { i } else { best }))
        .collect()
}

/// A fresh eager context seeded by `config`, the 64 → hidden → 10 MLP with its Adam, and the
/// digits split 80/20 into training and test sets.
pub fn setup(config: &Config) -> EagerResult<(Sequential, EagerOptimizer, Dataset, Dataset)> {
    eager::reset();
    eager::manual_seed(config.seed);
    let model = Sequential::new()
        .push(Linear::new("fc1", 64, config.hidden)?)
        .push(Relu)
        .push(Linear::new("fc2", config.hidden, 10)?);
    let opt = EagerOptimizer::new(Adam::new(config.learning_rate), model.parameters())?;
    let digits = data::digits().map_err(RuntimeError::from)?;
    let (train_set, test) = digits.split(0.2, config.seed);
    Ok((model, opt, train_set, test))
}

/// Trains eagerly on 80 % of the digits, then compiles the model and compares.
pub fn train(config: &Config, mut on_epoch: impl FnMut(&Epoch)) -> EagerResult<Outcome> {
    let (model, mut opt, train_set, test) = setup(config)?;
    let test_batch = test.all();
    let (test_x, test_y) = (Tensor::new(test_batch.x), Tensor::new(test_batch.y));
    let mut history = Vec::new();
    for epoch in 0..config.epochs {
        let mut total = 0.0;
        let batches = train_set.batches(config.batch_size, Some(config.seed + epoch as u64 + 1));
        for batch in &batches {
            opt.zero_grad();
            let logits = model.forward(&Tensor::new(batch.x.clone()))?;
            let loss = nn::cross_entropy(&logits, &Tensor::new(batch.y.clone()))?;
            loss.backward()?;
            opt.step()?;
            total += loss.item()?;
        }
        let accuracy = {
            let _no_grad = eager::no_grad();
            nn::accuracy(&model.forward(&test_x)?, &test_y)?.item()?
        };
        let report = Epoch {
            epoch: epoch + 1,
            mean_loss: total / batches.len() as f64,
            test_accuracy: accuracy,
        };
        on_epoch(&report);
        history.push(report);
    }
    let input = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(64)]));
    let mut compiled = eager::to_static(&[("x", input)], |t| Ok(vec![model.forward(&t[0])?]))?;
    let eager_logits = {
        let _no_grad = eager::no_grad();
        model.forward(&test_x)?.to_f64_vec()?
    };
    let compiled_logits = compiled.call(&[&test_x])?[0].to_f64_vec()?;
    let max_logit_difference = eager_logits
        .iter()
        .zip(&compiled_logits)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let (a, b) = (
        argmax_rows(&eager_logits, 10),
        argmax_rows(&compiled_logits, 10),
    );
    let prediction_agreement =
        a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
    Ok(Outcome {
        model,
        history,
        test,
        compiled,
        max_logit_difference,
        prediction_agreement,
    })
}

/// Saves the compiled prediction program (`predict`, text IR) and the parameters
/// (safetensors) under `dir`; returns their paths.
pub fn save(
    outcome: &Outcome,
    dir: &std::path::Path,
) -> EagerResult<(std::path::PathBuf, std::path::PathBuf)> {
    std::fs::create_dir_all(dir)
        .map_err(|e| EagerError::Usage(format!("cannot create {}: {e}", dir.display())))?;
    let module = outcome.compiled.module("predict")?;
    let (ir, params) = (
        dir.join("digits_dygraph.kir"),
        dir.join("digits_dygraph.safetensors"),
    );
    kiln_runtime::checkpoint::save_module(&module, &ir)
        .map_err(kiln_runtime::RuntimeError::from)?;
    eager::save_parameters(&params)?;
    Ok((ir, params))
}
