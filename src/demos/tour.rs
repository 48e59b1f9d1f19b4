//! The main job — what `kiln` runs with no arguments (`cargo run --release`): a CNN on
//! Fashion-MNIST when Debian's `dataset-fashion-mnist` is installed (or on an MNIST-format
//! folder given with `--data`; on the built-in 8×8 digits otherwise), written eagerly and
//! trained by the [`Trainer`]: eager steps first, then the same model's training step
//! compiled with `to_static`; evaluated on the test set; then the 1-D GAN; then what it
//! wrote: the IR of each stage, the parameters, the trainer's checkpoint, a drawing of the
//! training step, the loss and accuracy curves and a confusion matrix.

use crate::demos::gan_1d;
use crate::train::{Control, EagerClassifier, Event, Metrics, Trainer};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_ir::{Conv2dAttrs, DType, Dim, Module, Pool2dAttrs, Shape, Type};
use kiln_passes::PassManager;
use kiln_runtime::data::{self, DataLoader, ImageSource, Images};
use kiln_runtime::eager::nn::{Conv2d, Flatten, Layer, Linear, MaxPool2d, Relu, Sequential};
use kiln_runtime::eager::{self, EagerError, EagerOptimizer};
use kiln_runtime::{Adam, RuntimeError};
use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Which images the tour trains on.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum DataChoice {
    /// Fashion-MNIST where Debian installs it, else the built-in digits.
    #[default]
    Auto,
    /// An MNIST-format folder (an error if it is not one).
    Folder(PathBuf),
    /// The built-in 8×8 digits.
    Digits,
}

#[derive(Clone, Debug)]
pub struct Config {
    /// Where every file goes.
    pub out: PathBuf,
    pub data: DataChoice,
    /// Epochs in all (eager steps, then compiled); by default 3 on MNIST-format images and 10
    /// on the digits.
    pub epochs: Option<usize>,
    /// Steps trained eagerly before the step is compiled.
    pub eager_steps: usize,
    pub gan_iterations: usize,
    pub batch_size: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// Draw progress bars (on a terminal).
    pub progress: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            out: PathBuf::from("kiln-out"),
            data: DataChoice::Auto,
            epochs: None,
            eager_steps: 10,
            gan_iterations: 3000,
            batch_size: 64,
            learning_rate: 0.002,
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
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
}

/// How one way of training went.
#[derive(Clone, Debug)]
pub struct Phase {
    pub steps: usize,
    pub seconds: f64,
    /// On the test set, after the phase.
    pub test: Metrics,
}

impl Phase {
    pub fn steps_per_second(&self) -> f64 {
        self.steps as f64 / self.seconds
    }
}

#[derive(Clone, Debug)]
pub struct Summary {
    /// What was trained on, and its size.
    pub source: ImageSource,
    pub train_examples: usize,
    pub test_examples: usize,
    pub epochs: usize,
    pub eager: Phase,
    pub compiled: Phase,
    /// Tracing the step, adding gradients and Adam's updates, and the first compiled step
    /// (pass pipeline and JIT included).
    pub compile_seconds: f64,
    /// Seconds of the whole training (both phases, validation included).
    pub train_seconds: f64,
    pub gan_mean: f64,
    pub gan_std: f64,
    /// What was written, and where.
    pub files: Vec<(&'static str, PathBuf)>,
}

/// The CNN for images `[1, h, w]` (`h`, `w` multiples of 4): conv 3×3 (32, ReLU) → max pool 2
/// → conv 3×3 (64, ReLU) → max pool 2 → dense (128, ReLU) → dense (10).
pub fn cnn(image: &[usize]) -> Result<Sequential, EagerError> {
    let same = Conv2dAttrs {
        padding: [(1, 1), (1, 1)],
        ..Conv2dAttrs::default()
    };
    let halve = Pool2dAttrs::new([2, 2], [2, 2]);
    let flat = 64 * (image[1] / 4) * (image[2] / 4);
    Ok(Sequential::new()
        .push(Conv2d::new("conv1", [image[0], 32], [3, 3], same)?)
        .push(Relu)
        .push(MaxPool2d(halve))
        .push(Conv2d::new("conv2", [32, 64], [3, 3], same)?)
        .push(Relu)
        .push(MaxPool2d(halve))
        .push(Flatten)
        .push(Linear::new("fc1", flat, 128)?)
        .push(Relu)
        .push(Linear::new("fc2", 128, 10)?))
}

fn load(choice: &DataChoice) -> Result<Images, data::DataError> {
    match choice {
        DataChoice::Auto => data::images(None),
        DataChoice::Folder(dir) => data::images(Some(dir)),
        DataChoice::Digits => data::digit_images(),
    }
}

/// What the trainer's callbacks record as the tour runs.
struct Log {
    /// Each step's loss and the phase it ran in.
    curve: Vec<(f64, &'static str)>,
    phase: &'static str,
    /// Steps after the first compiled one, and their seconds.
    timed_steps: usize,
    timed_seconds: f64,
    step_start: Instant,
    /// Seconds from the start of compilation to the end of the first compiled step.
    first_compiled_step: Option<f64>,
}

/// Runs the whole tour; `say` receives a line for each finished stage.
pub fn run(config: &Config, say: impl FnMut(&str)) -> Result<Summary, TourError> {
    let say = RefCell::new(say);
    let say = |line: &str| (say.borrow_mut())(line);
    let write_err = |path: &Path, e: &dyn std::fmt::Display| TourError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    };
    std::fs::create_dir_all(&config.out).map_err(|e| write_err(&config.out, &e))?;
    let mut files = Vec::new();
    let images = load(&config.data)?;
    let shape = images.train.sample_shape.clone();
    say(&format!(
        "data: {} ({} training and {} test images of {}x{})",
        images.source,
        images.train.len(),
        images.test.len(),
        shape[1],
        shape[2]
    ));
    if images.source == ImageSource::BuiltinDigits && config.data == DataChoice::Auto {
        say(&format!(
            "      for real images (Fashion-MNIST, 28x28): {}",
            data::FASHION_MNIST_HINT
        ));
    }
    let real = images.source != ImageSource::BuiltinDigits;
    let epochs = config.epochs.unwrap_or(if real { 3 } else { 10 });

    // 1. Eager: tensors that compute at once, backward(), an eager Adam — the first steps.
    eager::reset();
    eager::manual_seed(config.seed);
    let model = cnn(&shape)?;
    let optimizer = EagerOptimizer::new(Adam::new(config.learning_rate), model.parameters())?;
    let train = DataLoader::new(images.train.clone(), config.batch_size).shuffle(config.seed + 1);
    let test = DataLoader::new(images.test.clone(), 500);
    let checkpoint = config.out.join("checkpoint.safetensors");
    let eager_steps = config.eager_steps.clamp(1, train.len() * epochs);
    let log = RefCell::new(Log {
        curve: Vec::new(),
        phase: "eager",
        timed_steps: 0,
        timed_seconds: 0.0,
        step_start: Instant::now(),
        first_compiled_step: None,
    });
    let compile_start = Cell::new(Instant::now());
    let training_start = Instant::now();
    let mut trainer = Trainer::new(EagerClassifier::new(model, optimizer))
        .progress(config.progress)
        .validate_on(test.clone())
        .checkpoint(&checkpoint)
        .on(|event| {
            let mut log = log.borrow_mut();
            match *event {
                Event::StepBegin { .. } => log.step_start = Instant::now(),
                Event::StepEnd { loss, .. } => {
                    let phase = log.phase;
                    log.curve.push((loss, phase));
                    if phase == "eager" && log.curve.len() == eager_steps {
                        return Control::Stop;
                    }
                    if phase == "compiled" {
                        if log.first_compiled_step.is_none() {
                            let seconds = compile_start.get().elapsed().as_secs_f64();
                            log.first_compiled_step = Some(seconds);
                        } else {
                            log.timed_steps += 1;
                            log.timed_seconds += log.step_start.elapsed().as_secs_f64();
                        }
                    }
                }
                Event::EpochEnd { record } => {
                    let test = record.validation.clone().unwrap_or_default();
                    say(&format!(
                        "epoch {}: training loss {:.4}, test accuracy {:.1} % (top-5 {:.1} %), \
                         {:.0} s",
                        record.epoch + 1,
                        record.train.loss,
                        100.0 * test.accuracy,
                        100.0 * test.top_k,
                        record.seconds
                    ));
                }
                _ => {}
            }
            Control::Continue
        });
    trainer.fit(&train, epochs)?;
    let eager_seconds = training_start.elapsed().as_secs_f64();

    // 2. The same training step compiled: traced once, gradients and Adam's updates added as
    //    IR, then the pass pipeline and the JIT; it trains the same parameters, on from the
    //    batch where eager training stopped. (The eager steps' test accuracy is measured with
    //    the compiled forward pass, on the same parameters: the interpreter that runs eager
    //    ops would take longer over the test set than the training.)
    compile_start.set(Instant::now());
    log.borrow_mut().phase = "compiled";
    let learning_rate = config.learning_rate;
    trainer
        .learner()
        .compile(&shape, &mut Adam::new(learning_rate))?;
    let trace_seconds = compile_start.get().elapsed().as_secs_f64();
    let eager = Phase {
        steps: eager_steps,
        seconds: eager_seconds,
        test: trainer.evaluate(&test)?.0,
    };
    say(&format!(
        "eager: {eager_steps} steps, test accuracy {:.1} %, {:.1} steps/s",
        100.0 * eager.test.accuracy,
        eager.steps_per_second()
    ));
    compile_start.set(Instant::now());
    trainer.fit(&train, epochs)?;
    let (test_metrics, confusion) = trainer.evaluate(&test)?;
    let history = trainer.history().clone();
    let train_seconds = training_start.elapsed().as_secs_f64();
    let learner = trainer.learner();
    let (step, update) = learner.compiled().expect("compiled above");
    let program = step.program();
    let traced = Module {
        states: program.module().states.clone(),
        functions: vec![program.export("train_step", step.outputs(), &[update])],
    };
    let mut x_dims = vec![Dim::sym("N")];
    x_dims.extend(shape.iter().map(|&d| Dim::Fixed(d)));
    let x_type = Type::new(DType::F32, Shape(x_dims));
    let model = learner.model();
    let predict = eager::to_static(&[("x", x_type)], |t| Ok(vec![model.forward(&t[0])?]))?;
    drop(trainer);
    let log = log.into_inner();
    let compiled = Phase {
        steps: log.timed_steps,
        seconds: log.timed_seconds,
        test: test_metrics,
    };
    say(&format!(
        "compiled: {} steps, test accuracy {:.1} %, {:.1} steps/s",
        log.curve.len() - eager_steps,
        100.0 * compiled.test.accuracy,
        compiled.steps_per_second()
    ));

    // The stages of the training step, as text IR: traced (with gradients and updates), then
    // after the pass pipeline (fused kernels); its drawing; the prediction program.
    let mut optimized = traced.clone();
    PassManager::pipeline("default")
        .expect("the default pipeline exists")
        .run(&mut optimized)
        .map_err(RuntimeError::Pass)?;
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
    let params = config.out.join("parameters.safetensors");
    eager::save_parameters(&params)?;
    files.push(("parameters (safetensors)", params));
    files.push(("trainer checkpoint (parameters, Adam, history)", checkpoint));
    let sample = images.test.batch(&(0..16).collect::<Vec<_>>());
    for (what, name, array) in [
        ("16 test images (.npy)", "test_images.npy", &sample.x),
        ("their labels (.npy)", "test_labels.npy", &sample.y),
    ] {
        let path = config.out.join(name);
        kiln_runtime::npy::write_npy(&path, array).map_err(|e| write_err(&path, &e))?;
        files.push((what, path));
    }

    // 3. The GAN: a static program trained by alternating two sub-graphs.
    let gan_config = gan_1d::Config {
        iterations: config.gan_iterations,
        report_every: (config.gan_iterations / 20).max(1),
        ..gan_1d::Config::default()
    };
    let progress = bar(config.progress, config.gan_iterations);
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

    let plots = [
        ("loss per step", "loss.svg"),
        ("loss and accuracy per epoch", "curves.svg"),
        ("confusion matrix (test set)", "confusion.svg"),
    ];
    for (what, name) in plots {
        let path = config.out.join(name);
        match name {
            "loss.svg" => crate::plot::loss_curve(&path, "training loss per step", &log.curve)
                .map_err(|e| write_err(&path, &e))?,
            "curves.svg" => history.plot(&path)?,
            _ => crate::plot::confusion_matrix(&path, &confusion, &images.class_names)
                .map_err(|e| write_err(&path, &e))?,
        }
        files.push((what, path));
    }

    Ok(Summary {
        source: images.source,
        train_examples: images.train.len(),
        test_examples: images.test.len(),
        epochs,
        eager,
        compiled,
        compile_seconds: trace_seconds + log.first_compiled_step.unwrap_or(f64::NAN),
        train_seconds,
        gan_mean: last.mean,
        gan_std: last.std,
        files,
    })
}

fn bar(show: bool, len: usize) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{prefix:>5} [{bar:24}] {pos:>4}/{len} {msg}")
        .expect("a valid template")
        .progress_chars("=> ");
    ProgressBar::new(len as u64)
        .with_style(style)
        .with_prefix("GAN")
}
