//! The digits MLP written eagerly: trained by the [`Trainer`] with `backward()` and an eager
//! Adam, then compiled with `to_static`, which shares the trained parameters.

use super::digits_static::{self, ExampleData};
use crate::train::{Control, EagerClassifier, Event, Trainer};
use kiln_ir::{DType, Dim, Shape, Type};
use kiln_runtime::data::{DataLoader, Dataset};
use kiln_runtime::eager::nn::{Layer, Linear, Relu, Sequential};
use kiln_runtime::eager::{self, EagerError, EagerOptimizer, EagerResult, StaticFunction, Tensor};
use kiln_runtime::{Adam, RuntimeError};
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct Config {
    pub epochs: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// An MNIST-format folder to train on instead of the built-in digits.
    pub data: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            epochs: 20,
            batch_size: 32,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
            data: None,
        }
    }
}

pub use super::digits_static::Epoch;

pub struct Outcome {
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

/// A fresh eager context seeded by `config`, and the `inputs` → hidden → 10 MLP.
fn model(config: &Config, inputs: usize) -> EagerResult<Sequential> {
    eager::reset();
    eager::manual_seed(config.seed);
    Ok(Sequential::new()
        .push(Linear::new("fc1", inputs, config.hidden)?)
        .push(Relu)
        .push(Linear::new("fc2", config.hidden, 10)?))
}

fn example_data(config: &Config) -> EagerResult<ExampleData> {
    let shared = digits_static::Config {
        seed: config.seed,
        data: config.data.clone(),
        ..Default::default()
    };
    Ok(digits_static::load_data(&shared)?)
}

/// Trains eagerly on the examples' data (80 % of the digits, or `config.data`), then compiles
/// the model and compares.
pub fn train(config: &Config, mut on_epoch: impl FnMut(&Epoch)) -> EagerResult<Outcome> {
    let data = example_data(config)?;
    let inputs = data.train.features.ncols();
    let model = model(config, inputs)?;
    let optimizer = EagerOptimizer::new(Adam::new(config.learning_rate), model.parameters())?;
    let train = DataLoader::new(data.train, config.batch_size).shuffle(config.seed + 1);
    let test_loader = DataLoader::new(data.test.clone(), 1000);
    let mut history = Vec::new();
    let mut trainer = Trainer::new(EagerClassifier::new(model, optimizer))
        .progress(false)
        .validate_on(test_loader)
        .on(|event| {
            if let Event::EpochEnd { record } = event {
                let report = Epoch::from(*record);
                on_epoch(&report);
                history.push(report);
            }
            Control::Continue
        });
    trainer
        .fit(&train, config.epochs)
        .map_err(RuntimeError::from)?;
    let learner = trainer.into_learner();
    let model = learner.model();
    let input = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(inputs)]));
    let mut compiled = eager::to_static(&[("x", input)], |t| Ok(vec![model.forward(&t[0])?]))?;
    let test_x = Tensor::new(data.test.all().x);
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
        history,
        test: data.test,
        compiled,
        max_logit_difference,
        prediction_agreement,
    })
}

/// Saves the compiled prediction program (`predict`, text IR), the parameters (safetensors)
/// and 16 test images (`test_images.npy`) under `dir`; returns the first two paths.
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
    kiln_runtime::checkpoint::save_module(&module, &ir).map_err(RuntimeError::from)?;
    eager::save_parameters(&params)?;
    let images = dir.join("test_images.npy");
    let sample = (outcome.test).batch(&(0..16.min(outcome.test.len())).collect::<Vec<_>>());
    kiln_runtime::npy::write_npy(&images, &sample.x)
        .map_err(|e| EagerError::Usage(format!("cannot write {}: {e}", images.display())))?;
    Ok((ir, params))
}
