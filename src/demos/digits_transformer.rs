//! A transformer encoder block on the handwritten digits: each 8×8 image as 4 patches of
//! 4×4 pixels (tokens of 16 features), embedded with a learned position, one block of
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
    }
}

/// The model width is `config.hidden`; the MLP is twice as wide.
pub fn build(config: &Config) -> RuntimeResult<Model> {
    let width = config.hidden;
    let mut p = Program::with_seed(config.seed);
    let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(64)])?;
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
    // [N, 64] → [N, 2, 4, 2, 4] (patch row, pixel row, patch column, pixel column)
    // → [N, 2, 2, 4, 4] → 4 tokens of 16.
    let grid = p.reshape(
        x,
        Shape(vec![Dim::sym("N"), 2.into(), 4.into(), 2.into(), 4.into()]),
    )?;
    let patches = p.transpose(grid, vec![0, 1, 3, 2, 4])?;
    let tokens = p.reshape(patches, Shape(vec![Dim::sym("N"), 4.into(), 16.into()]))?;
    let embed = Dense::new(&mut p, "embed", 16, width, Activation::Identity)?;
    let h = embed.apply(&mut p, tokens)?;
    let position = p.parameter(
        "position",
        DType::F32,
        &[4, width],
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

/// Trains on 80 % of the digits and reports test accuracy on the rest after each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    digits_static::train_model(build(config)?, config, on_epoch)
}
