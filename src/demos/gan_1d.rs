//! A GAN on 1-D data, trained by sub-graphs: one static program holds the generator, the
//! discriminator (applied to real and to generated samples with the same parameters) and two
//! update targets. Each iteration runs the discriminator's target, then the generator's, as
//! two `Session::run` calls over one scope.
//!
//! Real data are N(4, 0.5); noise is U(−8, 8). Both are drawn inside the program by seeded
//! random ops, which draw fresh numbers on every run (the session advances a run counter).

use kiln_ir::{DType, Shape, Type, Value};
use kiln_runtime::layers::{self, Activation, Dense};
use kiln_runtime::{Adam, Fetch, Optimizer, Program, RuntimeResult, Session, Target};

#[derive(Clone, Debug)]
pub struct Config {
    pub iterations: usize,
    pub batch_size: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
    /// Report every this many iterations.
    pub report_every: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            iterations: 3000,
            batch_size: 64,
            hidden: 16,
            learning_rate: 0.002,
            seed: 1,
            report_every: 250,
        }
    }
}

pub struct Model {
    pub program: Program,
    pub d_train: Target,
    pub g_train: Target,
    pub d_loss: Value,
    pub g_loss: Value,
    /// 1,000 generated samples for statistics.
    pub samples: Value,
}

/// A 1 → h → h → 1 MLP with tanh hidden layers.
fn mlp(p: &mut Program, name: &str, hidden: usize) -> RuntimeResult<[Dense; 3]> {
    Ok([
        Dense::new(p, &format!("{name}.fc1"), 1, hidden, Activation::Tanh)?,
        Dense::new(p, &format!("{name}.fc2"), hidden, hidden, Activation::Tanh)?,
        Dense::new(p, &format!("{name}.out"), hidden, 1, Activation::Identity)?,
    ])
}

fn apply(p: &mut Program, net: &[Dense; 3], x: Value) -> RuntimeResult<Value> {
    let h = net[0].apply(p, x)?;
    let h = net[1].apply(p, h)?;
    net[2].apply(p, h)
}

pub fn build(config: &Config) -> RuntimeResult<Model> {
    let mut p = Program::with_seed(config.seed);
    let batch = Type::new(DType::F32, Shape::fixed(&[config.batch_size, 1]));
    let generator = mlp(&mut p, "gen", config.hidden)?;
    let discriminator = mlp(&mut p, "disc", config.hidden)?;

    let real = p.random_normal(batch.clone(), 4.0, 0.5, config.seed ^ 0x5ea1)?;
    let noise = p.random_uniform(batch.clone(), -8.0, 8.0, config.seed ^ 0x2015e)?;
    let fake = apply(&mut p, &generator, noise)?;
    let d_real = apply(&mut p, &discriminator, real)?;
    let d_fake = apply(&mut p, &discriminator, fake)?;

    let ones = p.scalar(DType::F32, 1.0)?;
    let zeros = p.scalar(DType::F32, 0.0)?;
    let (ones_b, zeros_b) = (
        p.broadcast_to(ones, &batch.shape)?,
        p.broadcast_to(zeros, &batch.shape)?,
    );
    let real_loss = layers::sigmoid_cross_entropy(&mut p, d_real, ones_b)?;
    let fake_loss = layers::sigmoid_cross_entropy(&mut p, d_fake, zeros_b)?;
    let d_loss = p.add(real_loss, fake_loss)?;
    p.set_name(d_loss, "d_loss");
    // The non-saturating generator loss: make the discriminator call fakes real.
    let g_loss = layers::sigmoid_cross_entropy(&mut p, d_fake, ones_b)?;
    p.set_name(g_loss, "g_loss");

    let names = |prefix: &str, p: &Program| -> Vec<String> {
        p.params()
            .iter()
            .filter(|q| q.name.starts_with(prefix))
            .map(|q| q.name.clone())
            .collect()
    };
    let (d_params, g_params) = (names("disc.", &p), names("gen.", &p));
    let d_train = Adam::named("d_adam", config.learning_rate)
        .with_betas(0.5, 0.999)
        .minimize_params(&mut p, d_loss, &d_params)?;
    let g_train = Adam::named("g_adam", config.learning_rate)
        .with_betas(0.5, 0.999)
        .minimize_params(&mut p, g_loss, &g_params)?;

    let eval_noise = p.random_uniform(
        Type::new(DType::F32, Shape::fixed(&[1000, 1])),
        -8.0,
        8.0,
        config.seed ^ 0xe7a1,
    )?;
    let samples = apply(&mut p, &generator, eval_noise)?;
    p.set_name(samples, "samples");
    Ok(Model {
        program: p,
        d_train,
        g_train,
        d_loss,
        g_loss,
        samples,
    })
}

#[derive(Clone, Debug)]
pub struct Report {
    pub iteration: usize,
    pub d_loss: f64,
    pub g_loss: f64,
    pub mean: f64,
    pub std: f64,
}

pub struct Outcome {
    pub model: Model,
    pub session: Session,
    pub history: Vec<Report>,
}

fn moments(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Trains for `config.iterations` iterations (each a D step then a G step), reporting the
/// generated samples' mean and standard deviation every `report_every` iterations and at
/// the end.
pub fn train(config: &Config, mut on_report: impl FnMut(&Report)) -> RuntimeResult<Outcome> {
    let model = build(config)?;
    let mut session = Session::new(&model.program)?;
    let mut history = Vec::new();
    for i in 1..=config.iterations {
        let d = session.run(&[Fetch::Target(model.d_train), model.d_loss.into()], &[])?;
        let g = session.run(&[Fetch::Target(model.g_train), model.g_loss.into()], &[])?;
        if i % config.report_every.max(1) == 0 || i == config.iterations {
            let samples = session.run(&[model.samples.into()], &[])?;
            let (mean, std) = moments(&samples[0].to_f64_vec());
            let report = Report {
                iteration: i,
                d_loss: d[0].to_f64_vec()[0],
                g_loss: g[0].to_f64_vec()[0],
                mean,
                std,
            };
            on_report(&report);
            history.push(report);
        }
    }
    Ok(Outcome {
        model,
        session,
        history,
    })
}
