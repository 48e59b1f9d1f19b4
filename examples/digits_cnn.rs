//! Trains a small CNN (conv → pool → conv → pool → dense) on the built-in 8×8 digits as a
//! static program, then saves the prediction program and its parameters.
//!
//!     cargo run --release --example digits_cnn [-- --epochs 20 --out DIR --data MNIST_DIR]

use kiln::demos::digits_cnn::{config, train};
use kiln::demos::digits_static::example_main;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    example_main(config(), "digits_cnn", |config, on_epoch| {
        train(config, on_epoch)
    })
}
