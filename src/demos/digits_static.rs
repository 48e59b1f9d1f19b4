//! An MLP classifier on the handwritten digits, as a static program trained in a session.

use kiln_ir::{DType, Dim, Value};
use kiln_runtime::data::{self, Dataset};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{Adam, Fetch, Optimizer, Program, RuntimeResult, Session, Target};

#[derive(Clone, Debug)]
pub struct Config {
    pub epochs: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            epochs: 30,
            batch_size: 32,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
        }
    }
}

/// The program: `x: f32[N,64]`, `y: i64[N]` → logits, loss, accuracy, and an Adam step.
pub struct Model {
    pub program: Program,
    pub x: Value,
    pub y: Value,
    pub logits: Value,
    pub loss: Value,
    pub accuracy: Value,
    pub train: Target,
}

pub fn build(config: &Config) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(64)])?;
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
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

/// The `main` of the digits examples: `--epochs N` and `--out DIR` over `config`, an epoch line
/// per epoch, the prediction program and parameters saved as `DIR/<stem>.kir` and
/// `.safetensors`, and `test accuracy NN.N %` last.
pub fn example_main(
    mut config: Config,
    stem: &str,
    train: impl FnOnce(&Config, &mut dyn FnMut(&Epoch)) -> RuntimeResult<Outcome>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut out = std::path::PathBuf::from(format!("target/{stem}"));
    example_args(&mut config.epochs, &mut out)?;
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
    println!(
        "wrote {} and {} ({seconds:.1} s of training)",
        ir.display(),
        params.display()
    );
    let last = outcome.history.last().map_or(0.0, |e| e.test_accuracy);
    println!("test accuracy {:.1} %", 100.0 * last);
    Ok(())
}

/// The digits examples' arguments: `--epochs N` and `--out DIR`, over the defaults given.
pub fn example_args(
    epochs: &mut usize,
    out: &mut std::path::PathBuf,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--epochs" => *epochs = args.next().ok_or("--epochs needs a number")?.parse()?,
            "--out" => *out = args.next().ok_or("--out needs a folder")?.into(),
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

pub struct Outcome {
    pub model: Model,
    pub session: Session,
    pub history: Vec<Epoch>,
    pub test: Dataset,
}

/// Trains on 80 % of the digits and reports test accuracy on the rest after each epoch.
pub fn train(config: &Config, on_epoch: impl FnMut(&Epoch)) -> RuntimeResult<Outcome> {
    train_model(build(config)?, config, on_epoch)
}

/// Trains `model` (any classifier of `x: f32[N,64]`) as [`train`] does.
pub fn train_model(
    model: Model,
    config: &Config,
    mut on_epoch: impl FnMut(&Epoch),
) -> RuntimeResult<Outcome> {
    let (train_set, test) = data::digits()?.split(0.2, config.seed);
    let mut session = Session::new(&model.program)?;
    let test_batch = test.all();
    let mut history = Vec::new();
    for epoch in 0..config.epochs {
        let mut total = 0.0;
        let batches = train_set.batches(config.batch_size, Some(config.seed + epoch as u64 + 1));
        for batch in &batches {
            let out = session.run(
                &[Fetch::Target(model.train), Fetch::Value(model.loss)],
                &[("x", batch.x.clone()), ("y", batch.y.clone())],
            )?;
            total += out[0].to_f64_vec()[0];
        }
        let acc = session.run(
            &[model.accuracy.into()],
            &[("x", test_batch.x.clone()), ("y", test_batch.y.clone())],
        )?;
        let report = Epoch {
            epoch: epoch + 1,
            mean_loss: total / batches.len() as f64,
            test_accuracy: acc[0].to_f64_vec()[0],
        };
        on_epoch(&report);
        history.push(report);
    }
    Ok(Outcome {
        model,
        session,
        history,
        test,
    })
}
