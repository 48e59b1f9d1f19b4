//! Trains an MLP on the built-in handwritten digits as a static program, then saves the
//! prediction program as text IR and the parameters as safetensors.
//!
//!     cargo run --release --example digits_static [-- --epochs 30 --out DIR --data MNIST_DIR]
//!
//! Serve what it saved: `kiln run target/digits/digits.kir --state target/digits/digits.safetensors --feed x=...`.

use kiln::demos::digits_static::{Config, example_main, train};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    example_main(Config::default(), "digits", |config, on_epoch| {
        train(config, on_epoch)
    })
}
