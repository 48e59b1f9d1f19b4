//! An LSTM classifier on the handwritten digits: the 8 rows of each 8×8 image are a sequence
//! of 8 steps of 8 features, read by an LSTM whose last state feeds a dense layer.

use super::digits_static;
pub use super::digits_static::{Config, Epoch, Model, Outcome};
use kiln_ir::{DType, Dim, Shape};
use kiln_runtime::layers::{self, Activation, Lstm};
use kiln_runtime::{Program, RuntimeResult};

/// The defaults the example trains with.
pub fn config() -> Config {
    Config {
        epochs: 30,
        batch_size: 32,
        hidden: 64,
        learning_rate: 0.005,
        seed: 0,
    }
}

/// `x: f32[N,64]` as `[N,8,8]` (rows as steps) → LSTM (`hidden` units) → last state → dense (10).
pub fn build(config: &Config) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(64)])?;
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
    let rows = p.reshape(x, Shape(vec![Dim::sym("N"), 8.into(), 8.into()]))?;
    let lstm = Lstm::new(&mut p, "lstm", 8, config.hidden)?;
    let (_, last) = lstm.apply(&mut p, rows)?;
    let logits = layers::dense(&mut p, "fc", last, 10, Activation::Identity)?;
    digits_static::classifier(p, [x, y], logits, config)
}

/// Trains on 80 % of the digits and reports test accuracy on the rest after each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    digits_static::train_model(build(config)?, config, on_epoch)
}
