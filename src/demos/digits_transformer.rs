//! A transformer encoder block on the handwritten digits: each 8×8 image as 4 patches of
//! 4×4 pixels (tokens of 16 features; an image of h×w, (h/4)·(w/4) of them), embedded with a learned position, one block of
//! self-attention and an MLP (each with a residual connection and layer norm), the tokens
//! averaged, and a dense classifier.

use super::digits_static;
pub use super::digits_static::{Config, Epoch, Model, Outcome};
use kiln_ir::{DType, Dim, ReduceOp, Shape};
use kiln_runtime::layers::{self, Activation, Dense, SelfAttention};
use kiln_runtime::{Init, Program, RuntimeResult};

/// The defaults the example trains with.
pub fn config() -> Config {
    Config {
        epochs: 40,
        batch_size: 32,
        hidden: 32,
        learning_rate: 0.003,
        seed: 0,
        data: None,
    }
}

/// The model width is `config.hidden`; the MLP is twice as wide.
pub fn build(config: &Config, image: [usize; 3]) -> RuntimeResult<Model> {
    let width = config.hidden;
    let mut p = Program::with_seed(config.seed);
    let [x, y] = digits_static::placeholders(&mut p, image)?;
    // [N, c·h·w] → [N, c, h/4, 4, w/4, 4] (channel, patch row, pixel row, patch column,
    // pixel column) → [N, h/4, w/4, c, 4, 4] → (h/4)·(w/4) tokens of 16·c.
    let [c, h, w] = image;
    let (rows, columns, patch) = (h / 4, w / 4, 16 * c);
    let tokens = rows * columns;
    let grid = p.reshape(
        x,
        Shape(vec![
            Dim::sym("N"),
            c.into(),
            rows.into(),
            4.into(),
            columns.into(),
            4.into(),
        ]),
    )?;
    let patches = p.transpose(grid, vec![0, 2, 4, 1, 3, 5])?;
    let tokens_shape = Shape(vec![Dim::sym("N"), tokens.into(), patch.into()]);
    let token_values = p.reshape(patches, tokens_shape)?;
    let embed = Dense::new(&mut p, "embed", patch, width, Activation::Identity)?;
    let h = embed.apply(&mut p, token_values)?;
    let position = p.parameter(
        "position",
        DType::F32,
        &[tokens, width],
        Init::Normal {
            mean: 0.0,
            std: 0.1,
        },
    )?;
    let h = p.add(h, position)?;
    let attention = SelfAttention::new(&mut p, "attention", width, width)?;
    let a = attention.apply(&mut p, h)?;
    let h = p.add(h, a)?;
    let h = layers::layer_norm(&mut p, "norm1", h, 1e-5)?;
    let m = layers::dense(&mut p, "mlp1", h, 2 * width, Activation::Gelu)?;
    let m = layers::dense(&mut p, "mlp2", m, width, Activation::Identity)?;
    let h = p.add(h, m)?;
    let h = layers::layer_norm(&mut p, "norm2", h, 1e-5)?;
    let pooled = p.reduce(ReduceOp::Mean, h, vec![1], false)?;
    let logits = layers::dense(&mut p, "head", pooled, 10, Activation::Identity)?;
    digits_static::classifier(p, [x, y], logits, config)
}

/// Trains on the examples' data (the digits, or `config.data`) and reports test accuracy after
/// each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    let data = digits_static::load_data(config)?;
    digits_static::train_model(build(config, data.image)?, data, config, on_epoch)
}
