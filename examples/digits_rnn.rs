//! Trains an LSTM reading the 8 rows of each built-in 8×8 digit as a sequence, as a
//! static program, then saves the prediction program and its parameters.
//!
//!     cargo run --release --example digits_rnn [-- --epochs 30 --out target/digits_rnn]

use kiln::demos::digits_rnn::{config, train};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = config();
    let mut out = PathBuf::from("target/digits_rnn");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--epochs" => config.epochs = args.next().ok_or("--epochs needs a number")?.parse()?,
            "--out" => out = args.next().ok_or("--out needs a folder")?.into(),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let started = std::time::Instant::now();
    let outcome = train(&config, |e| {
        println!(
            "epoch {:>2}  loss {:.4}  test accuracy {:.2} %",
            e.epoch,
            e.mean_loss,
            100.0 * e.test_accuracy
        );
    })?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&out)?;
    let module =
        (outcome.model.program).export_module(&[("predict", &[outcome.model.logits][..])])?;
    let ir = out.join("digits_rnn.kir");
    kiln::runtime::checkpoint::save_module(&module, &ir)?;
    let params = out.join("digits_rnn.safetensors");
    outcome.session.scope().save(&params)?;
    println!(
        "wrote {} and {} ({seconds:.1} s of training)",
        ir.display(),
        params.display()
    );
    let last = outcome.history.last().map_or(0.0, |e| e.test_accuracy);
    println!("test accuracy {:.1} %", 100.0 * last);
    Ok(())
}
