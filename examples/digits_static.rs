//! Trains an MLP on the built-in handwritten digits as a static program, then saves the
//! prediction program as text IR and the parameters as safetensors.
//!
//!     cargo run --release --example digits_static [-- --epochs 30 --out target/digits]

use kiln::demos::digits_static::{Config, train};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = Config::default();
    let mut out = PathBuf::from("target/digits");
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
    std::fs::create_dir_all(&out)?;
    let module = outcome
        .model
        .program
        .export_module(&[("predict", &[outcome.model.logits][..])])?;
    let ir = out.join("digits.kir");
    kiln::runtime::checkpoint::save_module(&module, &ir)?;
    let params = out.join("digits.safetensors");
    outcome.session.scope().save(&params)?;
    println!("wrote {} and {}", ir.display(), params.display());
    println!(
        "serve it: kiln run {} --state {} --feed x=... ",
        ir.display(),
        params.display()
    );
    Ok(())
}
