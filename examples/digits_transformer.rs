//! Trains a transformer encoder block on the built-in 8×8 digits as 4 patches of 4×4, as a
//! static program, then saves the prediction program and its parameters.
//!
//!     cargo run --release --example digits_transformer [-- --epochs 40 --out DIR --data MNIST_DIR]

use kiln::demos::digits_static::example_main;
use kiln::demos::digits_transformer::{config, train};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    example_main(config(), "digits_transformer", |config, on_epoch| {
        train(config, on_epoch)
    })
}
