//! An LSTM classifier on the handwritten digits: the 8 rows of each 8×8 image are a sequence
//! of 8 steps of 8 features, read by an LSTM whose last state feeds a dense layer.

use super::digits_static;
pub use super::digits_static::{Config, Epoch, Model, Outcome};
use kiln_ir::{Dim, Shape};
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
        data: None,
    }
}

/// `x: f32[N, c·h·w]` as `[N, h, c·w]` (rows as steps) → LSTM (`hidden` units) → last state → dense (10).
pub fn build(config: &Config, image: [usize; 3]) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let [x, y] = digits_static::placeholders(&mut p, image)?;
    let [c, h, w] = image;
    let rows = p.reshape(x, Shape(vec![Dim::sym("N"), h.into(), (c * w).into()]))?;
    let lstm = Lstm::new(&mut p, "lstm", c * w, config.hidden)?;
    let (_, last) = lstm.apply(&mut p, rows)?;
    let logits = layers::dense(&mut p, "fc", last, 10, Activation::Identity)?;
    digits_static::classifier(p, [x, y], logits, config)
}

/// Trains on the examples' data (the digits, or `config.data`) and reports test accuracy after
/// each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    let data = digits_static::load_data(config)?;
    digits_static::train_model(build(config, data.image)?, data, config, on_epoch)
}
