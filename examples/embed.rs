//! Kiln inside your own Rust program: load a saved prediction program and its parameters,
//! compile them once, and serve predictions from a plain Rust function.
//!
//!     cargo run --release                          # the tour writes kiln-out/predict.kir, …
//!     cargo run --release --example embed [-- PROGRAM.kir PARAMS.safetensors]
//!
//! Without the tour's files it trains the digits model for a few epochs first and saves them
//! under target/embed.

use kiln::backend::Array;
use kiln::demos::digits_dygraph;
use kiln::runtime::data;
use kiln::serve::{Predictor, ServeError};
use std::path::PathBuf;

/// The digit (0–9) in an 8×8 image of intensities in [0, 1].
fn classify(model: &mut Predictor, pixels: &[f32]) -> Result<usize, ServeError> {
    let image = ndarray::Array2::from_shape_vec((1, 64), pixels.to_vec())
        .expect("64 pixels")
        .into_dyn();
    let logits = model.predict(vec![Array::F32(image)])?[0].to_f64_vec();
    Ok((0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }))
}

fn saved_model() -> Result<(PathBuf, PathBuf), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [program, params] = &args[..] {
        return Ok((program.into(), params.into()));
    }
    let (program, params) = (
        PathBuf::from("kiln-out/predict.kir"),
        PathBuf::from("kiln-out/digits.safetensors"),
    );
    if program.exists() && params.exists() {
        return Ok((program, params));
    }
    println!("no kiln-out/predict.kir yet: training the digits model for 5 epochs first");
    let config = digits_dygraph::Config {
        epochs: 5,
        ..Default::default()
    };
    let outcome = digits_dygraph::train(&config, |_| {})?;
    Ok(digits_dygraph::save(&outcome, "target/embed".as_ref())?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (program, params) = saved_model()?;
    let mut model = Predictor::load(&program, &params)?;
    println!(
        "serving {} with {}: {}",
        program.display(),
        params.display(),
        model.function().name()
    );

    let digits = data::digits()?;
    let mut correct = 0;
    for (i, row) in digits.features.rows().into_iter().enumerate() {
        let pixels: Vec<f32> = row.to_vec();
        let digit = classify(&mut model, &pixels)?;
        correct += usize::from(digit as i64 == digits.labels[i]);
        if i < 3 {
            for line in pixels.chunks(8) {
                let shade: String = line
                    .iter()
                    .map(|&p| [' ', '.', ':', '#'][(p.clamp(0.0, 1.0) * 3.0).round() as usize])
                    .collect();
                println!("  {shade}");
            }
            println!("  -> {digit} (label {})\n", digits.labels[i]);
        }
    }
    println!(
        "{correct} of {} digits classified correctly ({:.1} %), one call per image",
        digits.len(),
        100.0 * correct as f64 / digits.len() as f64
    );
    Ok(())
}
