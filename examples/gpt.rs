//! nanoGPT's CPU recipe: a GPT trained on Shakespeare, saved, and sampled.
//!
//!     scripts/fetch_shakespeare.sh          # once: the plays (else the built-in sonnets)
//!     cargo run --release --example gpt -- train [--steps 2000] [--bpe 1024] [--out target/gpt]
//!     cargo run --release --example gpt -- generate target/gpt [--prompt TEXT] [--tokens 200]
//!
//! `export DIR [--prompt TEXT] [--out DIR2]` writes the model's prefill and decode programs as
//! ONNX models (`DIR2/prefill.onnx`, `DIR2/decode.onnx`; the KV cache an input and an output)
//! with Kiln's outputs as test cases for onnxruntime (`DIR2/cases`).
//!
//! `batches DIR` and `match DIR` are the two halves of `scripts/peers/gpt_match.sh`, the
//! comparison with PyTorch from the same weights and batches.
//!
//! `train` takes `--batch`, `--micro-batches`, `--eval-every`, `--eval-batches`, `--warmup`,
//! `--eager` and `--text FILE` too; it checkpoints into `DIR/checkpoint.safetensors` after
//! each validation and resumes from it. `kiln generate DIR` samples a saved model as well.

use kiln::demos::gpt::{self, recipe_args};
use kiln::lm::LanguageModel;
use kiln::train::Control;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("train") => train(args),
        Some("generate") => generate(args),
        Some("export") => export(args),
        Some("batches") => batches(args),
        Some("match") => compare(args),
        _ => Err(
            "usage: gpt train [OPTIONS] | gpt generate DIR [--prompt TEXT] [--tokens N] \
                  | gpt export DIR [--prompt TEXT] [--out DIR2] \
                  | gpt batches DIR [--steps N] | gpt match DIR [--eager]"
                .into(),
        ),
    }
}

fn train(args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let (recipe, text, out) = recipe_args(args)?;
    let corpus = gpt::corpus(text.as_deref())?;
    println!("data: {} ({} characters)", corpus.source, corpus.text.len());
    std::fs::create_dir_all(&out)?;
    let checkpoint = out.join("checkpoint.safetensors");
    let trained = gpt::train(&recipe, &corpus, Some(&checkpoint), |record| {
        let step = (record.epoch + 1) * recipe.eval_every.min(recipe.steps);
        let validation = record.validation.as_ref().map_or(f64::NAN, |v| v.loss);
        println!(
            "step {step:>5}  train loss {:.4}  validation loss {validation:.4}  ({:.1} s)",
            record.train.loss, record.seconds
        );
        Control::Continue
    })?;
    LanguageModel::save(&trained.model.gpt, &trained.model.tokenizer, &out)?;
    let losses: Vec<(f64, &str)> = (trained.history.step_losses.iter())
        .map(|&l| (l, "training step"))
        .collect();
    let title = "nanoGPT's CPU recipe in Kiln: training loss per step";
    kiln::plot::loss_curve(&out.join("loss.svg"), title, &losses)?;
    let steps = trained.history.step_losses.len();
    println!(
        "{steps} steps in {:.1} s; wrote {} (the model, loss.svg)",
        trained.seconds,
        out.display()
    );
    let [greedy, drawn] = gpt::samples(&trained.model, "ROMEO:", 200)?;
    println!("--- greedy ---\n{greedy}\n--- temperature 0.8, top-k 40 ---\n{drawn}");
    Ok(())
}

fn generate(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.next().ok_or("generate needs the model's folder")?);
    let (mut prompt, mut tokens) = ("ROMEO:".to_string(), 200);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--prompt" => prompt = args.next().ok_or("--prompt needs a text")?,
            "--tokens" => tokens = args.next().ok_or("--tokens needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let model = LanguageModel::load(&dir)?;
    let [greedy, drawn] = gpt::samples(&model, &prompt, tokens)?;
    println!("--- greedy ---\n{greedy}\n--- temperature 0.8, top-k 40 ---\n{drawn}");
    Ok(())
}

fn export(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.next().ok_or("export needs the model's folder")?);
    let (mut prompt, mut out) = ("ROMEO:".to_string(), dir.join("onnx"));
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--prompt" => prompt = args.next().ok_or("--prompt needs a text")?,
            "--out" => out = PathBuf::from(args.next().ok_or("--out needs a folder")?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let model = LanguageModel::load(&dir)?;
    let [prefill, decode] = gpt::export_onnx(&model, &prompt, &out)?;
    println!(
        "wrote {} and {} (the cache an input and an output), and their test cases in {}",
        prefill.display(),
        decode.display(),
        out.join("cases").display()
    );
    Ok(())
}

fn batches(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.next().ok_or("batches needs a folder")?);
    let mut steps = 50;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--steps" => steps = args.next().ok_or("--steps needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let corpus = gpt::corpus(None)?;
    gpt::write_batches(&gpt::Recipe::default(), &corpus, &dir, steps)?;
    println!(
        "wrote {steps} batches of {} into {}",
        corpus.source,
        dir.display()
    );
    Ok(())
}

/// Kiln's losses from the peer's weights and batches against the peer's own
/// (`DIR/torch_losses.json`, a list of numbers): the largest relative difference, an error
/// above 1e-4.
fn compare(mut args: impl Iterator<Item = String>) -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(args.next().ok_or("match needs a folder")?);
    let eager = args.next().as_deref() == Some("--eager");
    let steps = gpt::replay(&gpt::Recipe::default(), &dir, eager)?;
    let losses: Vec<f64> = steps.iter().map(|s| s.0).collect();
    // The median step after the first three (the first compiles).
    let mut seconds: Vec<f64> = steps.iter().skip(3).map(|s| s.1).collect();
    seconds.sort_by(f64::total_cmp);
    let median_ms = 1e3 * seconds.get(seconds.len() / 2).copied().unwrap_or(f64::NAN);
    let theirs: Vec<f64> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("torch_losses.json"))?)?;
    if theirs.len() != losses.len() {
        return Err(format!("{} losses against PyTorch's {}", losses.len(), theirs.len()).into());
    }
    let mut worst = (0.0f64, 0);
    for (i, (a, b)) in losses.iter().zip(&theirs).enumerate() {
        let relative = (a - b).abs() / b.abs();
        println!("step {i:>3}  kiln {a:.6}  pytorch {b:.6}  relative {relative:.2e}");
        if relative > worst.0 || relative.is_nan() {
            worst = (relative, i);
        }
    }
    let mode = if eager { "eager" } else { "compiled" };
    println!(
        "largest relative difference ({mode}): {:.2e} at step {}; kiln {mode}: {median_ms:.1} ms a step",
        worst.0, worst.1
    );
    if worst.0 > 1e-4 || worst.0.is_nan() {
        return Err(format!("the losses differ by {:.2e} (more than 1e-4)", worst.0).into());
    }
    Ok(())
}
