//! The digits MLP written eagerly (dygraph): trained with `backward()` and Adam, compiled
//! with `to_static`, checked against the eager model, saved, and ready for `kiln run`.
//!
//!     cargo run --release --example digits_dygraph [-- --epochs 20 --out DIR --data MNIST_DIR]

use kiln::demos::digits_dygraph::{Config, save, train};
use kiln::demos::digits_static::{example_args, print_epoch};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    let mut out = PathBuf::from("target/digits_dygraph");
    example_args(&mut config.epochs, &mut out, &mut config.data)?;
    let outcome = train(&config, print_epoch)?;
    println!(
        "to_static: compiled and eager logits differ by at most {:.2e}; predictions agree on {:.1} % of the test set",
        outcome.max_logit_difference,
        100.0 * outcome.prediction_agreement
    );
    let (ir, params) = save(&outcome, &out)?;
    println!("wrote {} and {}", ir.display(), params.display());
    println!(
        "serve them: kiln run {} --state {} --feed x={}",
        ir.display(),
        params.display(),
        out.join("test_images.npy").display()
    );
    Ok(())
}
