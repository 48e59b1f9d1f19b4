//! A convolutional classifier on the handwritten digits (8×8 images), as a static program:
//! conv → pool → conv → pool → dense, trained with Adam in a session.

use super::digits_static;
pub use super::digits_static::{Config, Epoch, Model, Outcome};
use kiln_ir::{Conv2dAttrs, Dim, Pool2dAttrs, Shape, Value};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{Program, RuntimeResult};

/// The defaults the example trains with.
pub fn config() -> Config {
    Config {
        epochs: 20,
        batch_size: 32,
        hidden: 128,
        learning_rate: 0.002,
        seed: 0,
        data: None,
    }
}

/// `x: f32[N, c·h·w]` as `[N, c, h, w]` → [`network`], trained by [`digits_static::classifier`].
pub fn build(config: &Config, image: [usize; 3]) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let [x, y] = digits_static::placeholders(&mut p, image)?;
    let [c, h, w] = image.map(Dim::Fixed);
    let image = p.reshape(x, Shape(vec![Dim::sym("N"), c, h, w]))?;
    let logits = network(&mut p, image, config.hidden)?;
    digits_static::classifier(p, [x, y], logits, config)
}

/// The logits of `image: f32[N,1,8,8]`: conv 3×3 (32, ReLU) → max pool 2 → conv 3×3 (64,
/// ReLU) → max pool 2 → flatten → dense (`hidden`, ReLU) → dense (10). Parameters `conv1.*`,
/// `conv2.*`, `fc1.*`, `fc2.*` (`.w`, `.b`).
pub fn network(p: &mut Program, image: Value, hidden: usize) -> RuntimeResult<Value> {
    let same = Conv2dAttrs {
        padding: [(1, 1), (1, 1)],
        ..Conv2dAttrs::default()
    };
    let halve = Pool2dAttrs::new([2, 2], [2, 2]);
    let h = layers::conv2d(p, "conv1", image, 32, [3, 3], same, Activation::Relu)?;
    let h = layers::max_pool2d(p, h, halve)?;
    let h = layers::conv2d(p, "conv2", h, 64, [3, 3], same, Activation::Relu)?;
    let h = layers::max_pool2d(p, h, halve)?;
    let h = layers::flatten(p, h)?;
    let h = layers::dense(p, "fc1", h, hidden, Activation::Relu)?;
    layers::dense(p, "fc2", h, 10, Activation::Identity)
}

/// Trains on the examples' data (the digits, or `config.data`) and reports test accuracy after
/// each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    let data = digits_static::load_data(config)?;
    digits_static::train_model(build(config, data.image)?, data, config, on_epoch)
}
