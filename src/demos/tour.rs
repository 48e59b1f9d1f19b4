//! The main job — what `kiln` runs with no arguments (`cargo run --release`): on the built-in
//! digits, an eager MLP trained for a few epochs; the same model's training step compiled
//! with `to_static` and trained on, timed against eager; the 1-D GAN; then what it wrote: the
//! IR of each stage, the parameters, a drawing of the training step and a loss curve.

use crate::demos::{digits_dygraph, gan_1d};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_ir::{DType, Dim, Module, Shape, Type};
use kiln_passes::PassManager;
use kiln_runtime::data::Batch;
use kiln_runtime::eager::nn::{self, Layer, Sequential};
use kiln_runtime::eager::{self, EagerError, Tensor};
use kiln_runtime::{Adam, RuntimeError};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct Config {
    /// Where every file goes.
    pub out: PathBuf,
    pub eager_epochs: usize,
    pub compiled_epochs: usize,
    pub gan_iterations: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            out: PathBuf::from("kiln-out"),
            eager_epochs: 5,
            compiled_epochs: 5,
            gan_iterations: 3000,
            batch_size: 32,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
            progress: true,
        }
    }
}

#[derive(thiserror::Error, Debug)]
pub enum TourError {
    #[error(transparent)]
    Eager(#[from] EagerError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// How one way of training went.
#[derive(Clone, Debug)]
pub struct Phase {
    pub steps: usize,
    pub seconds: f64,
    pub final_loss: f64,
    pub test_accuracy: f64,
}

impl Phase {
    pub fn steps_per_second(&self) -> f64 {
        self.steps as f64 / self.seconds
    }
}

#[derive(Clone, Debug)]
pub struct Summary {
    pub eager: Phase,
    pub compiled: Phase,
    /// Tracing the step, adding gradients and Adam's updates, and the first compiled step
    /// (pass pipeline and JIT included).
    pub compile_seconds: f64,
    pub gan_mean: f64,
    pub gan_std: f64,
    /// What was written, and where.
    pub files: Vec<(&'static str, PathBuf)>,
}

fn bar(config: &Config, len: usize, prefix: String) -> ProgressBar {
    if !config.progress {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{prefix:>17} [{bar:20}] {pos:>4}/{len} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    ProgressBar::new(len as u64)
        .with_style(style)
        .with_prefix(prefix)
}

/// The line said after an epoch of `phase`.
fn epoch_line(phase: &str, epoch: usize, state: &Phase, steps: usize, start: Instant) -> String {
    format!(
        "{phase} epoch {}: loss {:.4}, test accuracy {:.1} %, {:.0} steps/s",
        epoch + 1,
        state.final_loss,
        100.0 * state.test_accuracy,
        steps as f64 / start.elapsed().as_secs_f64(),
    )
}

/// Moves an epoch's bar on by a step, showing the running loss, the test accuracy after the
/// previous epoch, and the speed so far.
fn advance(progress: &ProgressBar, loss: f64, phase: &Phase, steps: usize, start: Instant) {
    progress.inc(1);
    if progress.is_hidden() {
        return;
    }
    let accuracy = if phase.test_accuracy > 0.0 {
        format!("{:.1} %", 100.0 * phase.test_accuracy)
    } else {
        "—".into()
    };
    let speed = steps as f64 / start.elapsed().as_secs_f64();
    progress.set_message(format!(
        "loss {loss:.3}  accuracy {accuracy}  {speed:.0} steps/s"
    ));
}

fn tensors(batch: &Batch) -> (Tensor, Tensor) {
    (Tensor::new(batch.x.clone()), Tensor::new(batch.y.clone()))
}

/// Runs the whole tour; `say` receives a line for each finished stage.
pub fn run(config: &Config, mut say: impl FnMut(&str)) -> Result<Summary, TourError> {
    let write_err = |path: &Path, e: &dyn std::fmt::Display| TourError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(&config.out).map_err(|e| write_err(&config.out, &e))?;
    let mut files = Vec::new();

    // 1. Eager: tensors that compute at once, backward(), an eager Adam.
    let (model, mut opt, train_set, test_set) = digits_dygraph::setup(&digits_dygraph::Config {
        hidden: config.hidden,
        learning_rate: config.learning_rate,
        seed: config.seed,
        ..Default::default()
    })?;
    let (test_x, test_y) = tensors(&test_set.all());
    let test_accuracy = |model: &Sequential| -> Result<f64, TourError> {
        let _no_grad = eager::no_grad();
        Ok(nn::accuracy(&model.forward(&test_x)?, &test_y)?.item()?)
    };
    let epochs = |seed_offset: usize, count: usize| {
        (0..count)
            .map(|e| {
                let seed = config.seed + (seed_offset + e) as u64 + 1;
                train_set.batches(config.batch_size, Some(seed))
            })
            .collect::<Vec<_>>()
    };
    let mut curve: Vec<(f64, &'static str)> = Vec::new();
    let mut eager_phase = Phase {
        steps: 0,
        seconds: 0.0,
        final_loss: f64::NAN,
        test_accuracy: 0.0,
    };
    for (e, batches) in epochs(0, config.eager_epochs).iter().enumerate() {
        let progress = bar(config, batches.len(), format!("eager epoch {}", e + 1));
        let start = Instant::now();
        let mut total = 0.0;
        for (i, batch) in batches.iter().enumerate() {
            let (x, y) = tensors(batch);
            opt.zero_grad();
            let loss = nn::cross_entropy(&model.forward(&x)?, &y)?;
            loss.backward()?;
            opt.step()?;
            let loss = loss.item()?;
            total += loss;
            curve.push((loss, "eager"));
            advance(
                &progress,
                total / (i + 1) as f64,
                &eager_phase,
                i + 1,
                start,
            );
        }
        eager_phase.seconds += start.elapsed().as_secs_f64();
        eager_phase.steps += batches.len();
        eager_phase.final_loss = total / batches.len() as f64;
        eager_phase.test_accuracy = test_accuracy(&model)?;
        progress.finish_and_clear();
        say(&epoch_line("eager", e, &eager_phase, batches.len(), start));
    }

    // 2. The same training step compiled: traced once, gradients and Adam's updates added as
    //    IR, then the pass pipeline and the JIT. It trains the same parameters.
    let compile_start = Instant::now();
    let x_type = Type::new(DType::F32, Shape(vec![Dim::sym("N"), Dim::Fixed(64)]));
    let y_type = Type::new(DType::I64, Shape(vec![Dim::sym("N")]));
    let mut step = eager::to_static(&[("x", x_type.clone()), ("y", y_type)], |t| {
        Ok(vec![nn::cross_entropy(&model.forward(&t[0])?, &t[1])?])
    })?;
    let update = step.minimize(&mut Adam::new(config.learning_rate), 0)?;
    let mut compiled_phase = Phase {
        steps: 0,
        seconds: 0.0,
        final_loss: f64::NAN,
        test_accuracy: 0.0,
    };
    let mut compile_seconds = 0.0;
    for (e, batches) in epochs(config.eager_epochs, config.compiled_epochs)
        .iter()
        .enumerate()
    {
        let progress = bar(config, batches.len(), format!("compiled epoch {}", e + 1));
        let start = Instant::now();
        let mut total = 0.0;
        let mut timed_steps = 0;
        for (i, batch) in batches.iter().enumerate() {
            let (x, y) = tensors(batch);
            let step_start = Instant::now();
            let loss = step.call_and_update(&[&x, &y], &[update])?[0].item()?;
            if compile_seconds == 0.0 {
                compile_seconds = compile_start.elapsed().as_secs_f64();
            } else {
                timed_steps += 1;
                compiled_phase.seconds += step_start.elapsed().as_secs_f64();
            }
            total += loss;
            curve.push((loss, "compiled"));
            advance(
                &progress,
                total / (i + 1) as f64,
                &compiled_phase,
                i + 1,
                start,
            );
        }
        compiled_phase.steps += timed_steps;
        compiled_phase.final_loss = total / batches.len() as f64;
        compiled_phase.test_accuracy = test_accuracy(&model)?;
        progress.finish_and_clear();
        say(&epoch_line(
            "compiled",
            e,
            &compiled_phase,
            batches.len(),
            start,
        ));
    }

    // The stages of the training step, as text IR: traced (with gradients and updates), then
    // after the pass pipeline (fused kernels); its drawing; the prediction program.
    let program = step.program();
    let traced = Module {
        states: program.module().states.clone(),
        functions: vec![program.export("train_step", step.outputs(), &[update])],
    };
    let mut optimized = traced.clone();
    PassManager::pipeline("default")
        .expect("the default pipeline exists")
        .run(&mut optimized)
        .map_err(RuntimeError::Pass)?;
    let predict = eager::to_static(&[("x", x_type)], |t| Ok(vec![model.forward(&t[0])?]))?;
    let stages = [
        (
            "training step, traced (gradients, Adam)",
            "train_step.kir",
            &traced,
        ),
        (
            "training step, optimised (fused kernels)",
            "train_step.opt.kir",
            &optimized,
        ),
        (
            "prediction program",
            "predict.kir",
            &predict.module("predict")?,
        ),
    ];
    for (what, name, module) in stages {
        let path = config.out.join(name);
        kiln_runtime::checkpoint::save_module(module, &path).map_err(RuntimeError::from)?;
        files.push((what, path));
    }
    let dot = config.out.join("train_step.dot");
    std::fs::write(&dot, crate::dot::function_to_dot(&optimized.functions[0]))
        .map_err(|e| write_err(&dot, &e))?;
    files.push(("drawing of the training step (Graphviz)", dot));
    let params = config.out.join("digits.safetensors");
    eager::save_parameters(&params)?;
    files.push(("parameters (safetensors)", params));

    // 3. The GAN: a static program trained by alternating two sub-graphs.
    let gan_config = gan_1d::Config {
        iterations: config.gan_iterations,
        report_every: (config.gan_iterations / 20).max(1),
        ..gan_1d::Config::default()
    };
    let progress = bar(config, config.gan_iterations, "GAN".into());
    let gan = gan_1d::train(&gan_config, |r| {
        progress.set_position(r.iteration as u64);
        progress.set_message(format!("generated mean {:.2}, std {:.2}", r.mean, r.std));
    })?;
    progress.finish_and_clear();
    let last = gan.history.last().cloned().expect("at least one report");
    say(&format!(
        "GAN, {} iterations: generated mean {:.3}, std {:.3} (real data: N(4, 0.5))",
        config.gan_iterations, last.mean, last.std
    ));
    let gan_ir = config.out.join("gan.kir");
    let gan_module = gan.model.program.export_module(&[
        ("d_loss", &[gan.model.d_loss][..]),
        ("g_loss", &[gan.model.g_loss][..]),
    ])?;
    kiln_runtime::checkpoint::save_module(&gan_module, &gan_ir).map_err(RuntimeError::from)?;
    files.push(("GAN losses (static program)", gan_ir));

    let plot = config.out.join("loss.svg");
    crate::plot::loss_curve(&plot, &curve).map_err(|e| write_err(&plot, &e))?;
    files.push(("loss curve", plot));

    Ok(Summary {
        eager: eager_phase,
        compiled: compiled_phase,
        compile_seconds,
        gan_mean: last.mean,
        gan_std: last.std,
        files,
    })
}
