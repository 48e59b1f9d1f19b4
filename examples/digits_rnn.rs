//! Trains an LSTM reading the 8 rows of each built-in 8×8 digit as a sequence, as a
//! static program, then saves the prediction program and its parameters.
//!
//!     cargo run --release --example digits_rnn [-- --epochs 30 --out DIR --data MNIST_DIR]

use kiln::demos::digits_rnn::{config, train};
use kiln::demos::digits_static::example_main;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    example_main(config(), "digits_rnn", |config, on_epoch| {
        train(config, on_epoch)
    })
}
