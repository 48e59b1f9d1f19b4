//! An MLP classifier on the handwritten digits (or any MNIST-format images), as a static
//! program trained in a session by the [`Trainer`]; the other image examples share its data,
//! training and `main`.

use crate::train::{StaticClassifier, Trainer};
use kiln_ir::{DType, Dim, Value};
use kiln_runtime::data::{self, DataLoader, Dataset, ImageSource};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{Adam, Optimizer, Program, RuntimeResult, Session, Target};
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct Config {
    pub epochs: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// An MNIST-format folder to train on instead of the built-in digits.
    pub data: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            epochs: 30,
            batch_size: 32,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
            data: None,
        }
    }
}

/// The digits' images: one channel of 8×8.
pub const DIGITS_IMAGE: [usize; 3] = [1, 8, 8];

/// What the image examples train on: each example flattened to `c·h·w` values, the image
/// shape `[c, h, w]`, and where the images came from.
#[derive(Clone, Debug)]
pub struct ExampleData {
    pub train: Dataset,
    pub test: Dataset,
    pub image: [usize; 3],
    pub source: ImageSource,
}

/// The built-in digits split 80/20 with `config.seed`, or the MNIST-format folder
/// `config.data` (its own training and test sets).
pub fn load_data(config: &Config) -> RuntimeResult<ExampleData> {
    let Some(dir) = &config.data else {
        let (train, test) = data::digits()?.split(0.2, config.seed)?;
        return Ok(ExampleData {
            train,
            test,
            image: DIGITS_IMAGE,
            source: ImageSource::BuiltinDigits,
        });
    };
    let images = data::mnist(dir)?;
    let image: [usize; 3] = (images.train.sample_shape.clone().try_into())
        .map_err(|_| data::DataError::Invalid("MNIST images are [1, h, w]".into()))?;
    let flat = [image.iter().product()];
    Ok(ExampleData {
        train: images.train.with_sample_shape(&flat)?,
        test: images.test.with_sample_shape(&flat)?,
        image,
        source: images.source,
    })
}

/// The placeholders of an image classifier: `x: f32[N, c·h·w]`, `y: i64[N]`.
pub fn placeholders(p: &mut Program, image: [usize; 3]) -> RuntimeResult<[Value; 2]> {
    let width = image.iter().product::<usize>();
    let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(width)])?;
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
    Ok([x, y])
}

/// The program: `x: f32[N, c·h·w]`, `y: i64[N]` → logits, loss, accuracy, and an Adam step.
pub struct Model {
    pub program: Program,
    pub x: Value,
    pub y: Value,
    pub logits: Value,
    pub loss: Value,
    pub accuracy: Value,
    pub train: Target,
}

pub fn build(config: &Config, image: [usize; 3]) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let [x, y] = placeholders(&mut p, image)?;
    let h = layers::dense(&mut p, "fc1", x, config.hidden, Activation::Relu)?;
    let logits = layers::dense(&mut p, "fc2", h, 10, Activation::Identity)?;
    classifier(p, [x, y], logits, config)
}

/// A digits classifier from its `logits` over placeholders `x` and `y`: the loss, accuracy
/// and Adam step every digits model trains with (named `logits`, `loss`, `accuracy`).
pub fn classifier(
    mut p: Program,
    [x, y]: [Value; 2],
    logits: Value,
    config: &Config,
) -> RuntimeResult<Model> {
    p.set_name(logits, "logits");
    let loss = layers::softmax_cross_entropy(&mut p, logits, y)?;
    p.set_name(loss, "loss");
    let accuracy = layers::accuracy(&mut p, logits, y)?;
    p.set_name(accuracy, "accuracy");
    let train = Adam::new(config.learning_rate).minimize(&mut p, loss)?;
    Ok(Model {
        program: p,
        x,
        y,
        logits,
        loss,
        accuracy,
        train,
    })
}

/// The `main` of the image examples: `--epochs N`, `--out DIR` and `--data DIR` over
/// `config`, an epoch line per epoch, the prediction program and parameters saved as
/// `DIR/<stem>.kir` and `.safetensors` with 16 test images as `DIR/test_images.npy`, and
/// `test accuracy NN.N %` last.
pub fn example_main(
    mut config: Config,
    stem: &str,
    train: impl FnOnce(&Config, &mut dyn FnMut(&Epoch)) -> RuntimeResult<Outcome>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::path::PathBuf::from(format!("target/{stem}"));
    example_args(&mut config.epochs, &mut out, &mut config.data)?;
    let started = std::time::Instant::now();
    let outcome = train(&config, &mut print_epoch)?;
    let seconds = started.elapsed().as_secs_f64();
    std::fs::create_dir_all(&out)?;
    let model = &outcome.model;
    let module = model
        .program
        .export_module(&[("predict", &[model.logits][..])])?;
    let ir = out.join(format!("{stem}.kir"));
    kiln_runtime::checkpoint::save_module(&module, &ir)?;
    let params = out.join(format!("{stem}.safetensors"));
    outcome.session.scope().save(&params)?;
    let images = out.join("test_images.npy");
    let sample = outcome
        .test
        .batch(&(0..16.min(outcome.test.len())).collect::<Vec<_>>());
    kiln_runtime::npy::write_npy(&images, &sample.x)?;
    println!(
        "wrote {} and {} ({seconds:.1} s of training)",
        ir.display(),
        params.display()
    );
    println!(
        "run it: kiln run {} --state {} --feed x={}",
        ir.display(),
        params.display(),
        images.display()
    );
    let last = outcome.history.last().map_or(0.0, |e| e.test_accuracy);
    println!("test accuracy {:.1} %", 100.0 * last);
    Ok(())
}

/// The image examples' arguments: `--epochs N`, `--out DIR` and `--data DIR` (an MNIST-format
/// folder), over the defaults given.
pub fn example_args(
    epochs: &mut usize,
    out: &mut std::path::PathBuf,
    data: &mut Option<PathBuf>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--epochs" => *epochs = args.next().ok_or("--epochs needs a number")?.parse()?,
            "--out" => *out = args.next().ok_or("--out needs a folder")?.into(),
            "--data" => *data = Some(args.next().ok_or("--data needs a folder")?.into()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(())
}

/// The digits examples' line per epoch.
pub fn print_epoch(e: &Epoch) {
    println!(
        "epoch {:>2}  loss {:.4}  test accuracy {:.2} %",
        e.epoch,
        e.mean_loss,
        100.0 * e.test_accuracy
    );
}

/// What training reports after each epoch.
#[derive(Clone, Debug)]
pub struct Epoch {
    pub epoch: usize,
    pub mean_loss: f64,
    pub test_accuracy: f64,
}

impl From<&crate::train::EpochRecord> for Epoch {
    /// The trainer's record of an epoch (counted from 0) as the examples print it (from 1).
    fn from(record: &crate::train::EpochRecord) -> Epoch {
        Epoch {
            epoch: record.epoch + 1,
            mean_loss: record.train.loss,
            test_accuracy: record.validation.as_ref().map_or(0.0, |m| m.accuracy),
        }
    }
}

pub struct Outcome {
    pub model: Model,
    pub session: Session,
    pub history: Vec<Epoch>,
    pub test: Dataset,
}

/// Trains on the examples' data ([`load_data`]) and reports test accuracy after each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    let data = load_data(config)?;
    train_model(build(config, data.image)?, data, config, on_epoch)
}

/// Trains `model` (any classifier of `x: f32[N, c·h·w]`) on `data` with the [`Trainer`]: batches
/// of `config.batch_size`, shuffled with `config.seed + 1 + epoch`, the test set measured after
/// each epoch.
pub fn train_model(
    model: Model,
    data: ExampleData,
    config: &Config,
    mut on_epoch: impl FnMut(&Epoch),
) -> RuntimeResult<Outcome> {
    let learner = StaticClassifier::new(
        Session::new(&model.program)?,
        model.logits,
        model.loss,
        model.train,
    );
    let train = DataLoader::new(data.train, config.batch_size).shuffle(config.seed + 1);
    let mut history = Vec::new();
    let mut trainer = Trainer::new(learner)
        .progress(false)
        .validate_on(DataLoader::new(data.test.clone(), 1000))
        .on(|event| {
            if let crate::train::Event::EpochEnd { record } = event {
                let report = Epoch::from(*record);
                on_epoch(&report);
                history.push(report);
            }
            crate::train::Control::Continue
        });
    trainer.fit(&train, config.epochs)?;
    let session = trainer.into_learner().into_session();
    Ok(Outcome {
        model,
        session,
        history,
        test: data.test,
    })
}
