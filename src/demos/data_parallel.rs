//! The digits MLP trained on several ranks: data parallel (gradients averaged by all-reduce)
//! or with a parameter server. Each rank runs [`train_rank`] on the current thread's
//! communicator; one rank alone is plain training on the whole global batch.

use kiln_backend::Array;
use kiln_backend::comm::Communicator;
use kiln_ir::{DType, Dim, Value};
use kiln_runtime::data;
use kiln_runtime::distributed::{DataParallel, ParameterServer};
use kiln_runtime::layers::{self, Activation};
use kiln_runtime::{Adam, Fetch, Optimizer, Program, RuntimeError, RuntimeResult, Session, Sgd};

/// How the ranks share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every rank trains on its share of the batch; gradients are averaged by all-reduce.
    AllReduce,
    /// Ranks `0..servers` hold the parameters and apply the updates; the others train.
    ParameterServer {
        /// How many server ranks.
        servers: usize,
    },
}

/// What to train.
#[derive(Clone, Debug)]
pub struct Config {
    pub steps: usize,
    /// The global batch: every step's rows over all (training) ranks.
    pub global_batch: usize,
    pub hidden: usize,
    pub learning_rate: f64,
    pub seed: u64,
    pub mode: Mode,
    /// The update rule: Adam (the default) or plain SGD, whose step is proportional to the
    /// gradient (so a sum where a mean belongs shows in the loss; Adam's normalised step
    /// hides a uniform scale).
    pub rule: Rule,
    pub bucket_bytes: usize,
    /// ZeRO stage 1: the optimizer state sharded over the ranks (all-reduce mode).
    pub zero: bool,
    /// Gradients all-reduced as bfloat16 (all-reduce mode).
    pub bf16: bool,
    /// Fault injection, to see how the others stop: this rank fails at step 2.
    pub fault: Option<(usize, Fault)>,
    /// Where rank 0 saves the state (parameters and optimizer state) after the last step.
    pub save: Option<std::path::PathBuf>,
    /// A checkpoint that rank 0 alone loads, and the step it was saved after: training goes
    /// on from there exactly as an uninterrupted run.
    pub resume: Option<(std::path::PathBuf, usize)>,
}

/// The optimizer every rank (or server) applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Adam,
    Sgd,
}

/// How an injected fault ends a rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It returns an error (and tells the others).
    Error,
    /// The process exits at once, telling no one (with in-process ranks, all of them go).
    Exit,
    /// From the start, the rank buckets its gradients in 1 KiB buckets (a setting that differs
    /// between ranks): its collectives differ from the others'.
    Buckets,
    /// From the start, the rank's hidden layer is one unit wider (a different model).
    Width,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            steps: 50,
            global_batch: 240,
            hidden: 64,
            learning_rate: 0.003,
            seed: 0,
            mode: Mode::AllReduce,
            rule: Rule::Adam,
            bucket_bytes: kiln_runtime::distributed::DEFAULT_BUCKET_BYTES,
            zero: false,
            bf16: false,
            fault: None,
            save: None,
            resume: None,
        }
    }
}

/// What one rank did.
#[derive(Clone, Debug)]
pub struct RankReport {
    pub rank: usize,
    /// Rows this rank trained on per second (0 for a server).
    pub examples_per_second: f64,
    /// The last step's loss over the whole global batch (the mean of the trainers' losses).
    pub final_loss: f64,
    pub steps: usize,
    /// The bytes of optimizer state (moments, step counters) this rank holds: all of it, or
    /// its share with `--zero`.
    pub optimizer_bytes: usize,
}

/// The digits MLP: `x: f32[N,64]`, `y: i64[N]` → the mean cross-entropy `loss`.
fn model(config: &Config) -> RuntimeResult<(Program, Value)> {
    let mut p = Program::with_seed(config.seed);
    let x = p.placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(64)])?;
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")])?;
    let h = layers::dense(&mut p, "fc1", x, config.hidden, Activation::Relu)?;
    let logits = layers::dense(&mut p, "fc2", h, 10, Activation::Identity)?;
    let loss = layers::softmax_cross_entropy(&mut p, logits, y)?;
    p.set_name(loss, "loss");
    Ok((p, loss))
}

/// One rank's training, on the current thread's communicator (alone without one).
pub fn train_rank(config: &Config) -> RuntimeResult<RankReport> {
    let comm = Communicator::current();
    let (rank, ranks) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.size()));
    let config = &skewed(config, rank);
    let (mut p, loss) = model(config)?;
    let mut optimizer: Box<dyn Optimizer> = match config.rule {
        Rule::Adam => Box::new(Adam::new(config.learning_rate)),
        Rule::Sgd => Box::new(Sgd::new(config.learning_rate)),
    };
    let (target, trainer, trainers) = match config.mode {
        Mode::AllReduce => {
            let mut rule = DataParallel::new(optimizer).with_bucket_bytes(config.bucket_bytes);
            if config.zero {
                rule = rule.with_sharded_state(ranks);
            }
            if config.bf16 {
                rule = rule.with_bf16_wire();
            }
            (rule.minimize(&mut p, loss)?, Some(rank), ranks)
        }
        Mode::ParameterServer { servers } => {
            let ps = ParameterServer::new(servers, ranks)?;
            if ps.is_server(rank) {
                (
                    ps.server_step(&mut p, &mut *optimizer, rank)?,
                    None,
                    ranks - servers,
                )
            } else {
                (
                    ps.trainer_step(&mut p, loss)?,
                    Some(rank - servers),
                    ranks - servers,
                )
            }
        }
    };
    let mut scope = kiln_runtime::Scope::new();
    scope.declare(p.module())?;
    let first_step = match &config.resume {
        Some((path, step)) => {
            // Rank 0 alone reads it (storage only it can reach); the session's start
            // broadcasts all of the state.
            if rank == 0 {
                scope.load(path)?;
            }
            *step
        }
        None => 0,
    };
    let mut session = Session::with_scope(&p, scope)?;
    let dataset = data::digits()?;
    let mut batches = Vec::new();
    let mut last_loss = 0.0;
    let started = std::time::Instant::now();
    for step in first_step..config.steps {
        inject_fault(config, rank, step)?;
        let Some(share) = trainer else {
            session.run(&[Fetch::Target(target)], &[])?;
            continue;
        };
        if batches.is_empty() {
            // Each epoch's order depends on the step that starts it, so a run resumed in the
            // middle of an epoch takes up its order where the first run left it.
            let per_epoch = (dataset.len() / config.global_batch).max(1);
            let start = step - step % per_epoch;
            let epoch = (start as u64).wrapping_mul(7919);
            batches = dataset.shards(
                config.global_batch,
                share,
                trainers,
                Some(config.seed ^ epoch),
            )?;
            batches.reverse();
            batches.truncate(batches.len().saturating_sub(step - start));
        }
        let batch = batches
            .pop()
            .expect("a global batch has rows for every rank");
        let out = session.run(
            &[Fetch::Value(loss), Fetch::Target(target)],
            &[("x", batch.x), ("y", batch.y)],
        )?;
        last_loss = out[0].to_f64_vec()[0];
    }
    if let Some(path) = &config.save {
        session.save(path)?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let rows = (config.global_batch / trainers) * (config.steps - first_step.min(config.steps));
    let params: Vec<&str> = p.params().iter().map(|q| q.name.as_str()).collect();
    let optimizer_bytes = (session.scope().iter())
        .filter(|(name, _)| !params.contains(name))
        .map(|(_, a)| a.len() * a.dtype().size_bytes())
        .sum();
    Ok(RankReport {
        rank,
        examples_per_second: if trainer.is_some() {
            rows as f64 / seconds
        } else {
            0.0
        },
        final_loss: mean_over_trainers(comm.as_ref(), last_loss, trainer.is_some(), trainers)?,
        steps: config.steps,
        optimizer_bytes,
    })
}

/// `config` as rank `rank` sees it when a skew is injected there.
fn skewed(config: &Config, rank: usize) -> Config {
    let mut config = config.clone();
    match config.fault {
        Some((r, Fault::Buckets)) if r == rank => config.bucket_bytes = 1024,
        Some((r, Fault::Width)) if r == rank => config.hidden += 1,
        _ => {}
    }
    config
}

fn inject_fault(config: &Config, rank: usize, step: usize) -> RuntimeResult<()> {
    match config.fault {
        Some((r, fault @ (Fault::Error | Fault::Exit))) if r == rank && step == 2 => {
            if fault == Fault::Exit {
                eprintln!("rank {rank}: exiting at step {step} (injected)");
                std::process::exit(3);
            }
            Err(RuntimeError::Usage(format!(
                "rank {rank}: injected failure at step {step}"
            )))
        }
        _ => Ok(()),
    }
}

/// The mean of the trainers' `loss` (servers add nothing), known to every rank.
fn mean_over_trainers(
    comm: Option<&Communicator>,
    loss: f64,
    is_trainer: bool,
    trainers: usize,
) -> RuntimeResult<f64> {
    let Some(comm) = comm else { return Ok(loss) };
    let mine = Array::F64(ndarray::arr1(&[if is_trainer { loss } else { 0.0 }]).into_dyn());
    let sum = comm.all_reduce(&[&mine], false)?.wait()?;
    Ok(sum[0].to_f64_vec()[0] / trainers as f64)
}

/// Parses the example's arguments: `--threads N`, `--steps S`, `--mode allreduce|ps`,
/// `--servers K`, `--batch B`, `--hidden H`, `--bucket-kib K`, `--zero` (optimizer state
/// sharded), `--bf16` (gradients all-reduced as bfloat16), and for
/// fault injection `--fail-rank R`
/// (rank R returns an error at step 2), `--exit-rank R` (its process exits there),
/// `--skew-buckets-rank R` (rank R buckets differently) or `--skew-width-rank R` (rank R's
/// model is wider); `--save PATH` (rank 0 saves the state after the last step) and
/// `--resume PATH --from-step S` (rank 0 alone loads it; steps S.. follow).
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<(Config, usize), String> {
    let mut config = Config::default();
    let mut threads = 1;
    let mut servers = 1;
    let mut ps = false;
    let (mut resume, mut from_step) = (None, None);
    let mut args = args;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |s: String, name: &str| {
            s.parse::<usize>()
                .map_err(|_| format!("{name} takes a number, found `{s}`"))
        };
        match arg.as_str() {
            "--threads" => threads = number(value("--threads")?, "--threads")?,
            "--steps" => config.steps = number(value("--steps")?, "--steps")?,
            "--batch" => config.global_batch = number(value("--batch")?, "--batch")?,
            "--servers" => servers = number(value("--servers")?, "--servers")?,
            "--fail-rank" => {
                config.fault = Some((number(value("--fail-rank")?, "--fail-rank")?, Fault::Error))
            }
            "--exit-rank" => {
                config.fault = Some((number(value("--exit-rank")?, "--exit-rank")?, Fault::Exit))
            }
            "--zero" => config.zero = true,
            "--bf16" => config.bf16 = true,
            "--hidden" => config.hidden = number(value(&arg)?, &arg)?,
            "--save" => config.save = Some(value(&arg)?.into()),
            "--resume" => resume = Some(std::path::PathBuf::from(value(&arg)?)),
            "--from-step" => from_step = Some(number(value(&arg)?, &arg)?),
            "--skew-buckets-rank" => {
                let rank = number(value(&arg)?, &arg)?;
                config.fault = Some((rank, Fault::Buckets))
            }
            "--skew-width-rank" => {
                let rank = number(value(&arg)?, &arg)?;
                config.fault = Some((rank, Fault::Width))
            }
            "--bucket-kib" => {
                config.bucket_bytes = 1024 * number(value("--bucket-kib")?, "--bucket-kib")?
            }
            "--mode" => match value("--mode")?.as_str() {
                "allreduce" => ps = false,
                "ps" => ps = true,
                other => return Err(format!("--mode is `allreduce` or `ps`, not `{other}`")),
            },
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    if ps {
        config.mode = Mode::ParameterServer { servers };
    }
    config.resume = match (resume, from_step) {
        (Some(path), Some(step)) => Some((path, step)),
        (None, None) => None,
        _ => return Err("--resume PATH and --from-step S go together".into()),
    };
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok((config, threads))
}

/// Prints the ranks' reports: a throughput line per rank, then `final loss X` last.
pub fn print_reports(reports: &[RankReport]) {
    for r in reports {
        if r.examples_per_second > 0.0 {
            println!(
                "rank {}: {} steps, {:.0} examples/s, optimizer state {:.1} KiB",
                r.rank,
                r.steps,
                r.examples_per_second,
                r.optimizer_bytes as f64 / 1024.0
            );
        } else {
            println!("rank {}: {} steps (parameter server)", r.rank, r.steps);
        }
    }
    if let Some(r) = reports.first() {
        println!("final loss {:.6}", r.final_loss);
    }
}

/// Runs `config` on `threads` in-process ranks (one: no communicator at all).
pub fn run_threads(config: &Config, threads: usize) -> Result<Vec<RankReport>, RuntimeError> {
    if threads == 1 {
        return Ok(vec![train_rank(config)?]);
    }
    let config = config.clone();
    kiln_backend::comm::local::run(threads, move |_| train_rank(&config))
        .into_iter()
        .collect()
}

/// Every rank's report, in rank order, on every rank (MPI ranks report this way; each rank's
/// throughput and optimizer bytes travel in its slots of one summed vector).
pub fn gather_reports(comm: &Communicator, mine: RankReport) -> RuntimeResult<Vec<RankReport>> {
    let mut slots = vec![0.0; 2 * comm.size()];
    slots[2 * mine.rank] = mine.examples_per_second;
    slots[2 * mine.rank + 1] = mine.optimizer_bytes as f64;
    let slots = Array::F64(ndarray::arr1(&slots).into_dyn());
    let all = comm.all_reduce(&[&slots], false)?.wait()?[0].to_f64_vec();
    Ok((all.chunks(2).enumerate())
        .map(|(rank, pair)| RankReport {
            rank,
            examples_per_second: pair[0],
            optimizer_bytes: pair[1] as usize,
            ..mine.clone()
        })
        .collect())
}
