//! The digits MLP written eagerly (dygraph): trained with `backward()` and Adam, compiled
//! with `to_static`, checked against the eager model, saved, and ready for `kiln run`.
//!
//!     cargo run --release --example digits_dygraph [-- --epochs 20 --out target/digits_dygraph]

use kiln::demos::digits_dygraph::{Config, save, train};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    let mut out = PathBuf::from("target/digits_dygraph");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--epochs" => config.epochs = args.next().ok_or("--epochs needs a number")?.parse()?,
            "--out" => out = args.next().ok_or("--out needs a folder")?.into(),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let outcome = train(&config, |e| {
        println!(
            "epoch {:>2}  loss {:.4}  test accuracy {:.2} %",
            e.epoch,
            e.mean_loss,
            100.0 * e.test_accuracy
        );
    })?;
    println!(
        "to_static: compiled and eager logits differ by at most {:.2e}; predictions agree on {:.1} % of the test set",
        outcome.max_logit_difference,
        100.0 * outcome.prediction_agreement
    );
    let (ir, params) = save(&outcome, &out)?;
    println!("wrote {} and {}", ir.display(), params.display());
    println!(
        "serve them: kiln run {} --state {} --feed x=images.npy",
        ir.display(),
        params.display()
    );
    Ok(())
}
