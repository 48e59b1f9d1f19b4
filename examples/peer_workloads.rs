//! Runs Kiln on the peers' workloads (W2–W8 of `../shared/baselines`; W9, the digits CNN,
//! W10, a recurrent network, W11, a transformer encoder, W12, epochs of the Fashion-MNIST
//! CNN, W13, the GPT recipe's training step, and W14 and W15, GPTs' greedy decoding through
//! their KV caches, whose peer scripts are Kiln's `scripts/peers/bench_w9_cnn.py`,
//! `bench_w10_rnn.py`, `bench_w11_transformer.py`, `bench_w12_fashion_epoch.py`,
//! `bench_w13_gpt_step.py`, `bench_w14_decode.py` and `bench_w15_decode.py`)
//! with the peers' timing
//! protocol — the same warm-up and repeat counts, median (min..max) — and appends the same
//! JSON-lines records to `<out>/<workload>.jsonl`, so one table shows Kiln beside the peers.
//!
//!     cargo run --release --example peer_workloads -- --out results [--data dir] [w2 w3 ...]
//!
//! `scripts/compare_peers.sh` runs it after the peers' scripts and writes the comparison.
//!
//! `--data dir` holds the W5, W9, W10 and W11 batches and initial weights the peers use (`scripts/peer_data.py`
//! writes them with numpy), so that the loss after 110 steps is comparable, W13's batch and
//! weights, and W14's and W15's prompts and weights.

use kiln::npy::read_npy;
use kiln::workloads::{self, Forward};
use kiln_ir::DType;
use serde_json::{Value as Json, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

type Error = Box<dyn std::error::Error>;

/// `kiln`, or `kiln_1thread` when `RAYON_NUM_THREADS=1` holds Kiln's kernels to one thread.
fn framework() -> &'static str {
    match std::env::var("RAYON_NUM_THREADS").as_deref() {
        Ok("1") => "kiln_1thread",
        _ => "kiln",
    }
}

/// Minor page faults of this process so far.
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses); minflt is field 10.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

struct Summary {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
    faults_per_call: f64,
}

/// `warmup` untimed calls, then at least `repeats` timed calls (and at least `min_time`
/// seconds of them), as `bench_common.bench` does. Times in seconds.
fn bench(
    mut f: impl FnMut() -> Result<(), Error>,
    warmup: usize,
    repeats: usize,
    min_time: f64,
) -> Result<Summary, Error> {
    for _ in 0..warmup {
        f()?;
    }
    let mut samples = Vec::new();
    let faults = minor_faults();
    let start = Instant::now();
    while samples.len() < repeats || start.elapsed().as_secs_f64() < min_time {
        let t = Instant::now();
        f()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    let faults = minor_faults() - faults;
    Ok(summarize(samples, faults))
}

fn summarize(mut samples: Vec<f64>, faults: u64) -> Summary {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Summary {
        median,
        min: samples[0],
        max: samples[n - 1],
        n,
        faults_per_call: faults as f64 / n as f64,
    }
}

struct Emitter {
    out: PathBuf,
}

impl Emitter {
    /// A training workload's record: ms per step, the first step, the loss after 110 steps.
    fn emit_train_run(&self, workload: &str, case: &str, run: &TrainRun) -> Result<(), Error> {
        let extra = json!({"first_step_s": run.first_step, "loss_after_110_steps": run.loss});
        self.emit(workload, case, Some(&run.summary), "ms", extra)
    }

    /// Appends one record, with the summary scaled to `unit`.
    fn emit(
        &self,
        workload: &str,
        case: &str,
        summary: Option<&Summary>,
        unit: &str,
        extra: Json,
    ) -> Result<(), Error> {
        let scale = match unit {
            "ms" => 1e3,
            "us" => 1e6,
            _ => 1.0,
        };
        let mut record = json!({"workload": workload, "framework": framework(), "case": case, "status": "ok", "unit": unit});
        if let Some(s) = summary {
            record["median"] = json!(s.median * scale);
            record["min"] = json!(s.min * scale);
            record["max"] = json!(s.max * scale);
            record["n"] = json!(s.n);
            record["minflt_per_call"] = json!(s.faults_per_call);
        }
        if let Json::Object(fields) = extra {
            for (k, v) in fields {
                record[k] = v;
            }
        }
        let line = serde_json::to_string(&record)?;
        println!("{line}");
        std::fs::create_dir_all(&self.out)?;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.out.join(format!("{workload}.jsonl")))?;
        writeln!(file, "{line}")?;
        Ok(())
    }
}

/// W2 and W3: a fresh output per call (as the peers' calls allocate) and a reused output.
fn elementwise(
    e: &Emitter,
    workload: &str,
    build: impl Fn() -> Result<Forward, Error>,
    reference: impl Fn(&Forward) -> Vec<f64>,
    bytes: f64,
    label: &str,
) -> Result<(), Error> {
    for fresh in [true, false] {
        let mut f = build()?;
        let t = Instant::now();
        let first_out = f.call_fresh()?;
        let first = t.elapsed().as_secs_f64();
        let want = reference(&f);
        let err = workloads::max_abs_diff(&workloads::head(&first_out, want.len()), &want);
        drop(first_out);
        let summary = if fresh {
            bench(|| f.call_fresh().map(drop).map_err(Into::into), 3, 20, 0.0)?
        } else {
            bench(|| f.call_reused().map_err(Into::into), 3, 20, 0.0)?
        };
        let case = if fresh {
            format!("{label}, fresh output per call")
        } else {
            format!("{label}, output buffer reused")
        };
        e.emit(
            workload,
            &case,
            Some(&summary),
            "ms",
            json!({
                "GBps_median": bytes / summary.median / 1e9,
                "GBps_best": bytes / summary.min / 1e9,
                "max_abs_err_vs_f64": err,
                "first_call_s": first,
            }),
        )?;
    }
    Ok(())
}

fn w2(e: &Emitter) -> Result<(), Error> {
    let (r, c) = (4096, 4096);
    elementwise(
        e,
        "w2",
        || Ok(workloads::gelu(r, c)?),
        |f| workloads::gelu_reference(f.input("x"), f.input("a"), f.input("b"), 64),
        (2 * r * c * 4) as f64,
        "explicit formula, Session (fused, JIT)",
    )
}

fn w3(e: &Emitter) -> Result<(), Error> {
    let (r, c) = (8192, 1024);
    elementwise(
        e,
        "w3",
        || Ok(workloads::softmax(r, c)?),
        |f| workloads::softmax_reference(f.input("x"), c, 64),
        (2 * r * c * 4) as f64,
        "explicit, Session (fused, JIT)",
    )
}

fn w4(e: &Emitter) -> Result<(), Error> {
    for (m, k, n) in [(1024, 1024, 1024), (256, 784, 512)] {
        let mut f = workloads::matmul(m, k, n)?;
        let t = Instant::now();
        let out = f.call_fresh()?;
        let first = t.elapsed().as_secs_f64();
        // The reference in f64 over a sample of rows.
        let (a, b) = (f.input("a").to_f64_vec(), f.input("b").to_f64_vec());
        let got = out.to_f64_vec();
        let (mut max_err, mut max_ref) = (0f64, 0f64);
        for i in (0..m).step_by(37) {
            for j in 0..n {
                let want: f64 = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
                max_err = max_err.max((got[i * n + j] - want).abs());
                max_ref = max_ref.max(want.abs());
            }
        }
        drop(out);
        let summary = bench(|| f.call_fresh().map(drop).map_err(Into::into), 5, 30, 0.5)?;
        let flops = 2.0 * (m * n * k) as f64;
        e.emit(
            "w4",
            &format!("[{m},{k}]@[{k},{n}]"),
            Some(&summary),
            "ms",
            json!({
                "GFLOPs_median": flops / summary.median / 1e9,
                "GFLOPs_best": flops / summary.min / 1e9,
                "max_rel_err_vs_f64": max_err / max_ref,
                "first_call_s": first,
            }),
        )?;
    }
    Ok(())
}

/// Loads a training step's batch and initial weights from the `.npy` files `scripts/peer_data.py`
/// wrote for workload `w` (`<w>_x`, `<w>_y`, `<w>_w<i>`, `<w>_b<i>`): pair `i` is the step's
/// `i`th pair of parameters in the order its layers declared them, as in the peers' lists.
fn load_peer_data(
    step: &mut workloads::TrainStep,
    dir: &Path,
    w: &str,
    labels: DType,
) -> Result<(), Error> {
    let file = |name: String| dir.join(format!("{w}_{name}.npy"));
    let x = read_npy(&file("x".into()), DType::F32)?;
    let y = read_npy(&file("y".into()), labels)?;
    step.feeds = vec![
        ("x".into(), std::sync::Arc::new(x)),
        ("y".into(), std::sync::Arc::new(y)),
    ];
    let names: Vec<String> = (step.session.program().params().iter())
        .map(|p| p.name.clone())
        .collect();
    let scope = step.session.scope_mut();
    for (i, pair) in names.chunks(2).enumerate() {
        scope.set(
            &pair[0],
            read_npy(&file(format!("w{}", i + 1)), DType::F32)?,
        )?;
        scope.set(
            &pair[1],
            read_npy(&file(format!("b{}", i + 1)), DType::F32)?,
        )?;
    }
    Ok(())
}

/// The W5 protocol: 10 warm-up steps (the first is timed alone), then 100 timed steps; the
/// loss after 110 steps.
struct TrainRun {
    first_step: f64,
    summary: Summary,
    loss: f64,
}

fn train_run(step: &mut workloads::TrainStep) -> Result<TrainRun, Error> {
    let t = Instant::now();
    step.step()?;
    let first_step = t.elapsed().as_secs_f64();
    for _ in 0..9 {
        step.step()?;
    }
    let mut samples = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        step.step()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(TrainRun {
        first_step,
        summary: summarize(samples, 0),
        loss: step.loss()?,
    })
}

fn initial_weights(data: Option<&Path>) -> &'static str {
    match data {
        Some(_) => "the peers' initial weights",
        None => "Kiln's own seeded initial weights",
    }
}

fn w5_w7(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    // W7: the first call, from nothing: build the program (autodiff and update ops), open the
    // session, and run the first step (pruning, passes, JIT).
    let t = Instant::now();
    let mut step = workloads::mlp_step()?;
    let build = t.elapsed().as_secs_f64();
    if let Some(dir) = data {
        load_peer_data(&mut step, dir, "w5", DType::I64)?;
    }
    let run = train_run(&mut step)?;
    let first_call = build + run.first_step;
    let case = format!(
        "static Program + Sgd.minimize, Session.run (compiled); {}",
        initial_weights(data)
    );
    e.emit_train_run("w5", &case, &run)?;
    e.emit(
        "w7",
        &case,
        None,
        "s",
        json!({"first_call_s": first_call, "build_s": build, "median_step_ms": run.summary.median * 1e3}),
    )?;
    Ok(())
}

fn w9(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let mut step = workloads::cnn_step()?;
    if let Some(dir) = data {
        load_peer_data(&mut step, dir, "w9", DType::I64)?;
    }
    let run = train_run(&mut step)?;
    let case = format!(
        "digits_cnn network + Sgd.minimize, Session.run (compiled); {}",
        initial_weights(data)
    );
    e.emit_train_run("w9", &case, &run)
}

fn w10(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let mut step = workloads::rnn_step()?;
    if let Some(dir) = data {
        load_peer_data(&mut step, dir, "w10", DType::F32)?;
    }
    let run = train_run(&mut step)?;
    let case = format!(
        "while loop over 64 steps + Sgd.minimize, Session.run (compiled); {}",
        initial_weights(data)
    );
    e.emit_train_run("w10", &case, &run)
}

fn w11(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let mut step = workloads::transformer_step()?;
    if let Some(dir) = data {
        load_peer_data(&mut step, dir, "w11", DType::F32)?;
    }
    let run = train_run(&mut step)?;
    let case = format!(
        "2 TransformerEncoderLayer + Adam.minimize, Session.run (compiled); {}",
        initial_weights(data)
    );
    e.emit_train_run("w11", &case, &run)
}

fn w6(e: &Emitter) -> Result<(), Error> {
    const ITERS: usize = 10_000;
    let x = workloads::eager_add_input();
    let summary = bench(
        || {
            let mut y = None;
            for _ in 0..ITERS {
                y = Some(&x + &x);
            }
            drop(y);
            Ok(())
        },
        2,
        25,
        0.0,
    )?;
    let per_op = Summary {
        median: summary.median / ITERS as f64,
        min: summary.min / ITERS as f64,
        max: summary.max / ITERS as f64,
        n: summary.n,
        faults_per_call: 0.0,
    };
    e.emit(
        "w6",
        "x + x (eager Tensor, no gradient tracking)",
        Some(&per_op),
        "us",
        json!({}),
    )
}

fn w8(e: &Emitter) -> Result<(), Error> {
    let mut gan = workloads::gan()?;
    for _ in 0..20 {
        gan.iteration()?;
    }
    let mut samples = Vec::new();
    let mut losses = (0.0, 0.0);
    for _ in 0..500 {
        let t = Instant::now();
        losses = gan.iteration()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    let summary = summarize(samples, 0);
    e.emit(
        "w8",
        "static Program, two Session.run targets (compiled), random ops in the program",
        Some(&summary),
        "us",
        json!({"final_loss_D": losses.0, "final_loss_G": losses.1}),
    )
}

/// W12: three epochs of the Fashion-MNIST CNN, data loading included (peer script:
/// `scripts/peers/bench_w12_fashion_epoch.py`); the folder is Debian's, or `FASHION_MNIST_DIR`.
fn w12(e: &Emitter) -> Result<(), Error> {
    let dir = std::env::var("FASHION_MNIST_DIR")
        .unwrap_or_else(|_| kiln::runtime::data::FASHION_MNIST_DIR.to_owned());
    let run = workloads::fashion_epochs(Path::new(&dir), 3)?;
    let extra = json!({
        "load_s": run.load_seconds,
        "mean_loss_last_epoch": run.mean_loss_last_epoch,
        "test_accuracy": run.test_accuracy,
        "epochs": run.epoch_seconds.len(),
        // In order: a later epoch slower than the first is what subnormals did (issue 58).
        "epoch_seconds": run.epoch_seconds,
    });
    let case = "tour CNN (digits_cnn::network) + Adam.minimize, Trainer over DataLoader(shuffle, batch 64, prefetch 2)";
    e.emit(
        "w12",
        case,
        Some(&summarize(run.epoch_seconds, 0)),
        "s",
        extra,
    )
}

/// W13: the GPT recipe's training step (forward, backward, clipping, AdamW on its schedule),
/// compiled, from the peers' weights on their batch (`w13/`, as `examples/gpt.rs match` reads
/// a run): 10 warm-up steps, 100 timed, and the loss after the 110 steps.
fn w13(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let dir = data.ok_or("w13 needs --data (scripts/peer_data.py writes its batch)")?;
    let steps = kiln::demos::gpt::replay(&Default::default(), &dir.join("w13"), false)?;
    let [first, .., last] = steps.as_slice() else {
        return Err("w13's batches hold fewer than two steps".into());
    };
    let timed: Vec<f64> = steps[10..steps.len() - 1].iter().map(|s| s.1).collect();
    let extra = json!({
        "first_step_s": first.1,
        "first_loss": first.0,
        "loss_after_110_steps": last.0,
    });
    let case = "demos::gpt (eager::Gpt compiled by EagerClassifier) + ClipGradNorm<Adam> (AdamW, 2 groups)";
    e.emit("w13", case, Some(&summarize(timed, 0)), "ms", extra)
}

/// W14 and W15: 256 tokens decoded greedily after a 64-token prompt at batch 1, through the
/// KV cache (a prefill, then one decode program for every position), from the peers' weights
/// (`<workload>.safetensors`, PyTorch's names and layouts) and prompt; ms a token, the whole
/// generation over 256, prefill included (2 warm-up generations, 10 timed, as the peers).
/// Returns the summary, the record's other fields and the parameters' bytes.
fn decode(
    workload: &str,
    config: kiln::runtime::eager::GptConfig,
    data: Option<&Path>,
) -> Result<(Summary, Json, usize), Error> {
    use kiln::runtime::Sampling;
    use kiln::runtime::checkpoint::{StateDictLayout, load_state_dict};
    use kiln::runtime::eager::{self, Generator, Gpt};
    const NEW: usize = 256;
    let dir = data.ok_or("decoding needs --data (scripts/peer_data.py writes its weights)")?;
    eager::reset();
    let gpt = Gpt::new("gpt", config)?;
    let declared = kiln::lm::declared_types(&gpt);
    let weights = dir.join(format!("{workload}.safetensors"));
    let mut bytes = 0;
    for (name, value) in load_state_dict(&weights, &declared, StateDictLayout::PyTorch)? {
        bytes += value.len() * value.dtype().size_bytes();
        eager::set_state(&name, value)?;
    }
    let prompt = read_npy(&dir.join(format!("{workload}_prompt.npy")), DType::I64)?;
    let prompts = [prompt
        .to_f64_vec()
        .iter()
        .map(|&t| t as i64)
        .collect::<Vec<_>>()];
    let greedy = Sampling::greedy();
    let started = Instant::now();
    let mut generator = Generator::new(&gpt, 1)?;
    let tokens = generator.generate(&prompts, NEW, &greedy, &[])?;
    let first = started.elapsed().as_secs_f64();
    let made = tokens[0][prompts[0].len()..].to_vec();
    let generation = || -> Result<(), Error> {
        let again = generator.generate(&prompts, NEW, &greedy, &[])?;
        match again == tokens {
            true => Ok(()),
            false => Err("greedy decoding is not deterministic".into()),
        }
    };
    let mut per_token = bench(generation, 1, 10, 0.0)?;
    for t in [
        &mut per_token.median,
        &mut per_token.min,
        &mut per_token.max,
    ] {
        *t /= NEW as f64;
    }
    let extra = json!({
        "first_generation_s": first,
        "tokens_per_s": 1.0 / per_token.median,
        "first_tokens": &made[..16],
    });
    Ok((per_token, extra, bytes))
}

const DECODE_CASE: &str =
    "eager::Generator (compiled prefill and decode step, cache updated in place)";

/// W14: the GPT recipe's model (context 320).
fn w14(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let config = kiln::runtime::eager::GptConfig {
        context: 320,
        ..kiln::runtime::eager::GptConfig::nano(65)
    };
    let (per_token, extra, _) = decode("w14", config, data)?;
    e.emit("w14", DECODE_CASE, Some(&per_token), "ms", extra)
}

/// W15: a GPT-2-124M-shaped model, its tokens a second set against the memory-bandwidth bound:
/// every weight but the positions' table is read once a token, at most at the rate of a STREAM
/// copy measured here.
fn w15(e: &Emitter, data: Option<&Path>) -> Result<(), Error> {
    let config = kiln::runtime::eager::GptConfig {
        vocab: 50257,
        context: 1024,
        width: 768,
        heads: 12,
        layers: 12,
    };
    let (per_token, mut extra, bytes) = decode("w15", config, data)?;
    let positions = (config.context - 1) * config.width * 4;
    let per_token_bytes = (bytes - positions) as f64;
    let copy = stream_copy_bytes_per_s();
    let bound = copy / per_token_bytes;
    extra["weight_bytes_per_token"] = json!(per_token_bytes);
    extra["stream_copy_gb_s"] = json!(copy / 1e9);
    extra["bound_tokens_per_s"] = json!(bound);
    extra["fraction_of_bound"] = json!(1.0 / per_token.median / bound);
    e.emit("w15", DECODE_CASE, Some(&per_token), "ms", extra)
}

/// The machine's memory bandwidth as STREAM's copy measures it: the best of 10 copies of a
/// 256 MiB array (far past the caches) split over every thread, counting the bytes read and
/// written. Both arrays are written before the first copy, so no copy pays for page faults.
fn stream_copy_bytes_per_s() -> f64 {
    const LEN: usize = 1 << 26;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let from = vec![1.0f32; LEN];
    let mut to = vec![2.0f32; LEN];
    let chunk = LEN.div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let started = Instant::now();
        std::thread::scope(|s| {
            for (out, src) in to.chunks_mut(chunk).zip(from.chunks(chunk)) {
                s.spawn(move || out.copy_from_slice(src));
            }
        });
        best = best.min(started.elapsed().as_secs_f64());
    }
    std::hint::black_box(&to);
    (2 * LEN * 4) as f64 / best
}

fn main() -> Result<(), Error> {
    let mut out = PathBuf::from("results");
    let mut data = None;
    let mut selected = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = PathBuf::from(args.next().ok_or("--out needs a directory")?),
            "--data" => {
                data = Some(PathBuf::from(
                    args.next().ok_or("--data needs a directory")?,
                ))
            }
            w if w.starts_with('w') => selected.push(w.to_owned()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if selected.is_empty() {
        selected = ["w2", "w3", "w4", "w5", "w6", "w8", "w9", "w10", "w11"]
            .map(String::from)
            .to_vec();
    }
    // W7 is a first call: run it before other workloads have warmed the process.
    selected.sort_by_key(|w| !matches!(w.as_str(), "w5" | "w7"));
    selected.dedup_by(|a, b| matches!((a.as_str(), b.as_str()), ("w5" | "w7", "w5" | "w7")));
    let e = Emitter { out };
    for w in &selected {
        match w.as_str() {
            "w2" => w2(&e)?,
            "w3" => w3(&e)?,
            "w4" => w4(&e)?,
            "w5" | "w7" => w5_w7(&e, data.as_deref())?,
            "w6" => w6(&e)?,
            "w8" => w8(&e)?,
            "w9" => w9(&e, data.as_deref())?,
            "w10" => w10(&e, data.as_deref())?,
            "w11" => w11(&e, data.as_deref())?,
            "w12" => w12(&e)?,
            "w13" => w13(&e, data.as_deref())?,
            "w14" => w14(&e, data.as_deref())?,
            "w15" => w15(&e, data.as_deref())?,
            other => return Err(format!("unknown workload {other}").into()),
        }
    }
    Ok(())
}
