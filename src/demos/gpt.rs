//! nanoGPT's CPU recipe on Shakespeare (`examples/gpt.rs`): a character-level (or BPE) GPT
//! of 4 layers, 4 heads, width 128 and context 64, trained 2,000 steps of 12 windows with
//! AdamW (β₂ 0.99, decay 0.1 on matrices), a 100-step warm-up and a cosine to 1e-4,
//! gradients clipped at norm 1 — through the [`Trainer`], compiled, validating every 250
//! steps — then saved as a model directory ([`crate::lm`]) and sampled.

use crate::lm::LanguageModel;
use crate::train::{Control, EagerClassifier, EpochRecord, Event, History, TrainError, Trainer};
use kiln_backend::Array;
use kiln_backend::interp::kernels;
use kiln_ir::{AxisSlice, DType};
use kiln_runtime::data::text::{Corpus, TextBatches, TextDataset, Tokenizer};
use kiln_runtime::eager::nn::Layer;
use kiln_runtime::eager::{self, EagerOptimizer, Gpt, GptConfig};
use kiln_runtime::{Adam, ClipGradNorm, Sampling, Schedule};
use std::path::{Path, PathBuf};

pub use kiln_runtime::data::text::text as corpus;

/// The recipe's settings (nanoGPT's names in the comments).
#[derive(Clone, Debug)]
pub struct Recipe {
    /// Optimizer steps (`max_iters`).
    pub steps: usize,
    /// Windows per step (`batch_size`).
    pub batch: usize,
    /// Micro-batches a step's windows are cut into (`gradient_accumulation_steps`).
    pub micro_batches: usize,
    /// Steps between validations (`eval_interval`).
    pub eval_every: usize,
    /// Validation batches (`eval_iters`), the same ones each time.
    pub eval_batches: usize,
    /// The peak and final learning rates (`learning_rate`, `min_lr`).
    pub lr: (f64, f64),
    /// Warm-up steps (`warmup_iters`); the cosine ends at the last step (`lr_decay_iters`).
    pub warmup: usize,
    /// The sizes; the vocabulary is the tokenizer's.
    pub model: GptConfig,
    /// Byte-level BPE of this many tokens instead of characters.
    pub bpe: Option<usize>,
    /// Steps eagerly instead of compiled.
    pub eager: bool,
    /// Seeds the parameters and the batches.
    pub seed: u64,
}

impl Default for Recipe {
    fn default() -> Recipe {
        Recipe {
            steps: 2000,
            batch: 12,
            micro_batches: 1,
            eval_every: 250,
            eval_batches: 20,
            lr: (1e-3, 1e-4),
            warmup: 100,
            model: GptConfig::nano(0),
            bpe: None,
            eager: false,
            seed: 1337,
        }
    }
}

/// What training gave.
pub struct Trained {
    /// The model and its tokenizer.
    pub model: LanguageModel,
    /// Every step's loss and each validation.
    pub history: History,
    /// Where the text came from.
    pub corpus: String,
    /// Seconds spent training.
    pub seconds: f64,
}

/// The rule: AdamW decaying matrices, on the schedule, clipped.
fn rule(recipe: &Recipe) -> Result<ClipGradNorm<Adam>, TrainError> {
    let (peak, floor) = recipe.lr;
    let schedule = Schedule::warmup_cosine(peak, floor, recipe.warmup, recipe.steps)?;
    let adam = Adam::new(schedule)
        .with_betas(0.9, 0.99)
        .with_decoupled_weight_decay(0.1)
        .decaying_matrices_only();
    Ok(ClipGradNorm::new(adam, 1.0)?)
}

/// The validation batches: `recipe.eval_batches` of the held-out windows, the same each time.
fn validation_batches(recipe: &Recipe, data: &TextDataset) -> TextBatches {
    TextBatches::new(data.validation(), recipe.batch, recipe.eval_batches, 1).same_each_epoch()
}

/// `corpus` tokenized as `recipe` says, in windows of its context with a tenth held out.
fn tokenized(recipe: &Recipe, corpus: &Corpus) -> Result<(Tokenizer, TextDataset), TrainError> {
    let tokenizer = match recipe.bpe {
        Some(size) => Tokenizer::train_bpe(&corpus.text, size)?,
        None => Tokenizer::chars(&corpus.text),
    };
    let ids = tokenizer.encode(&corpus.text)?;
    let data = TextDataset::new(ids, recipe.model.context, 0.1)?;
    Ok((tokenizer, data))
}

/// Trains `recipe` on `corpus`, calling `report` after each validation (whose
/// [`Control::Stop`] ends the run there); checkpoints into `checkpoint` after each
/// validation, and resumes from it, when given.
pub fn train(
    recipe: &Recipe,
    corpus: &Corpus,
    checkpoint: Option<&Path>,
    mut report: impl FnMut(&EpochRecord) -> Control,
) -> Result<Trained, TrainError> {
    let (tokenizer, data) = tokenized(recipe, corpus)?;
    let context = recipe.model.context;
    eager::reset();
    eager::manual_seed(recipe.seed);
    let config = GptConfig {
        vocab: tokenizer.vocab_size(),
        ..recipe.model
    };
    let gpt = Gpt::new("gpt", config)?;
    let optimizer = EagerOptimizer::new(rule(recipe)?, gpt.parameters())?;
    // The learner trains a handle on the same parameters (they live in the eager scope).
    let mut learner = EagerClassifier::new(gpt.clone(), optimizer).accumulate(recipe.micro_batches);
    if !recipe.eager {
        let tokens: [(DType, &[usize]); 2] = [(DType::I64, &[context]), (DType::I64, &[context])];
        learner.compile_for(tokens, &mut rule(recipe)?)?;
    }
    let every = recipe.eval_every.clamp(1, recipe.steps.max(1));
    let train = TextBatches::new(data.train(), recipe.batch, every, recipe.seed);
    let validation = validation_batches(recipe, &data);
    let mut trainer = Trainer::new(learner)
        .validate_on(validation)
        .progress(true)
        .on(|event| match event {
            Event::EpochEnd { record } => report(record),
            _ => Control::Continue,
        });
    if let Some(path) = checkpoint {
        trainer = trainer.checkpoint(path);
        trainer.resume(path)?;
    }
    let started = std::time::Instant::now();
    let history = trainer.fit(&train, recipe.steps.div_ceil(every))?.clone();
    let seconds = started.elapsed().as_secs_f64();
    Ok(Trained {
        model: LanguageModel { gpt, tokenizer },
        history,
        corpus: corpus.source.to_string(),
        seconds,
    })
}

/// The example's arguments: `train [--steps N] [--batch N] [--micro-batches N]
/// [--eval-every N] [--bpe N] [--eager] [--text FILE] [--out DIR]`.
pub fn recipe_args(
    args: impl Iterator<Item = String>,
) -> Result<(Recipe, Option<PathBuf>, PathBuf), String> {
    let mut recipe = Recipe::default();
    let (mut text, mut out) = (None, PathBuf::from("target/gpt"));
    let mut args = args;
    let number = |flag: &str, v: Option<String>| -> Result<usize, String> {
        let v = v.ok_or_else(|| format!("{flag} needs a number"))?;
        v.parse()
            .map_err(|_| format!("{flag} needs a number, not {v}"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--steps" => recipe.steps = number(&arg, args.next())?,
            "--batch" => recipe.batch = number(&arg, args.next())?,
            "--micro-batches" => recipe.micro_batches = number(&arg, args.next())?,
            "--eval-every" => recipe.eval_every = number(&arg, args.next())?,
            "--eval-batches" => recipe.eval_batches = number(&arg, args.next())?,
            "--warmup" => recipe.warmup = number(&arg, args.next())?,
            "--bpe" => recipe.bpe = Some(number(&arg, args.next())?),
            "--eager" => recipe.eager = true,
            "--text" => text = Some(args.next().ok_or("--text needs a file")?.into()),
            "--out" => out = args.next().ok_or("--out needs a folder")?.into(),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    recipe.warmup = recipe.warmup.min(recipe.steps.saturating_sub(1));
    Ok((recipe, text, out))
}

/// Greedy and sampled text from `model` after `prompt`.
pub fn samples(
    model: &LanguageModel,
    prompt: &str,
    tokens: usize,
) -> Result<[String; 2], TrainError> {
    let greedy = model.generate(prompt, tokens, &Sampling::greedy())?;
    let drawn = Sampling::temperature(0.8, 1)?.with_top_k(40)?;
    Ok([greedy, model.generate(prompt, tokens, &drawn)?])
}

/// The comparison with PyTorch (`scripts/peers/gpt_match.sh`): the recipe's first `steps`
/// training batches written into `dir` as `x.npy` and `y.npy` (`i64[steps, batch, context]`),
/// its validation batches as `x_validation.npy` and `y_validation.npy`, with `meta.json` (the
/// sizes and the recipe), for `scripts/peers/gpt_torch.py` to train on.
pub fn write_batches(
    recipe: &Recipe,
    corpus: &Corpus,
    dir: &Path,
    steps: usize,
) -> Result<(), TrainError> {
    let (tokenizer, data) = tokenized(recipe, corpus)?;
    let context = recipe.model.context;
    let train = TextBatches::new(data.train(), recipe.batch, steps, recipe.seed);
    let batches = (0..steps)
        .map(|i| train.batch(0, i))
        .collect::<Result<Vec<_>, _>>()?;
    let io = |e: std::io::Error| TrainError::Invalid(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let validation = validation_batches(recipe, &data);
    let validation = (0..recipe.eval_batches)
        .map(|i| validation.batch(0, i))
        .collect::<Result<Vec<_>, _>>()?;
    let invalid = |e: &dyn std::fmt::Display| TrainError::Invalid(e.to_string());
    let parts = [("x", 0), ("y", 1)];
    for (batches, suffix) in [(&batches, ""), (&validation, "_validation")] {
        for (name, part) in parts {
            let rows: Vec<&Array> = (batches.iter())
                .map(|b| if part == 0 { &b.x } else { &b.y })
                .collect();
            let mut stacked = kernels::concat(&rows, 0).map_err(|e| invalid(&e))?;
            stacked.reshape_in_place(&[batches.len(), recipe.batch, context]);
            let path = dir.join(format!("{name}{suffix}.npy"));
            kiln_runtime::npy::write_npy(&path, &stacked).map_err(|e| invalid(&e))?;
        }
    }
    let m = &recipe.model;
    let meta = serde_json::json!({
        "vocab": tokenizer.vocab_size(), "context": context, "width": m.width,
        "heads": m.heads, "layers": m.layers, "batch": recipe.batch, "steps": steps,
        "lr": recipe.lr.0, "min_lr": recipe.lr.1, "warmup": recipe.warmup,
        "decay_end": recipe.steps, "betas": [0.9, 0.99], "weight_decay": 0.1, "clip": 1.0,
        "seed": recipe.seed, "eval_every": recipe.eval_every,
    });
    let meta = serde_json::to_string_pretty(&meta).expect("json") + "\n";
    std::fs::write(dir.join("meta.json"), meta).map_err(io)?;
    Ok(())
}

/// Kiln's losses on the batches [`write_batches`] wrote, from the peer's initial weights
/// (`dir/init.safetensors`, PyTorch's `state_dict` with Kiln's layer names), stepping
/// compiled (or eagerly), with each step's seconds.
pub fn replay(
    recipe: &Recipe,
    dir: &Path,
    eager_steps: bool,
) -> Result<Vec<(f64, f64)>, TrainError> {
    let read = |name: &str| {
        kiln_runtime::npy::read_npy(&dir.join(name), DType::I64)
            .map_err(|e| TrainError::Invalid(e.to_string()))
    };
    let (xs, ys) = (read("x.npy")?, read("y.npy")?);
    let &[steps, batch, context] = xs.shape() else {
        return Err(TrainError::Invalid(
            "x.npy must be [steps, batch, context]".into(),
        ));
    };
    let meta = std::fs::read_to_string(dir.join("meta.json"))
        .map_err(|e| TrainError::Invalid(format!("{}: {e}", dir.display())))?;
    let vocab = serde_json::from_str::<serde_json::Value>(&meta)
        .ok()
        .and_then(|m| m["vocab"].as_u64())
        .ok_or_else(|| TrainError::Invalid("meta.json has no vocab".into()))?;
    eager::reset();
    let config = GptConfig {
        vocab: vocab as usize,
        context,
        ..recipe.model
    };
    let gpt = Gpt::new("gpt", config)?;
    let declared = crate::lm::declared_types(&gpt);
    let layout = kiln_runtime::checkpoint::StateDictLayout::PyTorch;
    let init = kiln_runtime::checkpoint::load_state_dict(
        &dir.join("init.safetensors"),
        &declared,
        layout,
    )?;
    for (name, value) in init {
        eager::set_state(&name, value)?;
    }
    let optimizer = EagerOptimizer::new(rule(recipe)?, gpt.parameters())?;
    let mut learner = EagerClassifier::new(gpt, optimizer);
    if !eager_steps {
        let tokens: [(DType, &[usize]); 2] = [(DType::I64, &[context]), (DType::I64, &[context])];
        learner.compile_for(tokens, &mut rule(recipe)?)?;
    }
    let row = |a: &Array, i: usize| {
        let range = AxisSlice::Range {
            start: i,
            end: i + 1,
            step: 1,
        };
        let ranges = [range, AxisSlice::Full, AxisSlice::Full];
        let mut one = kernels::slice(a, &ranges).map_err(|e| TrainError::Invalid(e.to_string()))?;
        one.reshape_in_place(&[batch, context]);
        Ok::<_, TrainError>(one)
    };
    (0..steps)
        .map(|i| {
            let batch = kiln_runtime::data::Batch {
                x: row(&xs, i)?,
                y: row(&ys, i)?,
            };
            let started = std::time::Instant::now();
            let loss = crate::train::Learner::train_step(&mut learner, &batch)?.loss;
            Ok((loss, started.elapsed().as_secs_f64()))
        })
        .collect()
}

/// The model's two generation programs written as ONNX models (issue 54) — `DIR/prefill.onnx`
/// (the prompt's tokens and pads; the last slot's logits and the cache) and `DIR/decode.onnx`
/// (one token, its position and the pads; its logits and the cache), each block's keys and
/// values an input and an output — and, for onnxruntime to check them against
/// (`scripts/onnx_export_check.py --node-cases DIR/cases`), Kiln's own outputs of prefilling
/// `prompt` and decoding one token after it, as ONNX test cases. Returns the models' paths.
pub fn export_onnx(
    model: &LanguageModel,
    prompt: &str,
    dir: &Path,
) -> Result<[PathBuf; 2], Box<dyn std::error::Error>> {
    let ids = model.tokenizer.encode(prompt)?;
    let tokens: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
    if tokens.is_empty() || tokens.len() >= model.gpt.config.context {
        return Err(format!(
            "the prompt must have 1 to {} tokens",
            model.gpt.config.context - 1
        )
        .into());
    }
    let _no_grad = eager::no_grad();
    let mut generator = eager::Generator::new(&model.gpt, 1)?;
    let (prefill, decode, mut state) = generator.programs(tokens.len())?;
    let i64s =
        |dims: &[usize], v: Vec<i64>| Array::I64(ndarray::ArrayD::from_shape_vec(dims, v).unwrap());
    let pads = i64s(&[1], vec![0]);
    let prompt_args = vec![i64s(&[1, tokens.len()], tokens.clone()), pads.clone()];
    let logits = write_case(&prefill, "prefill", prompt_args, &mut state, dir)?;
    let vocab = model.gpt.config.vocab;
    let last = logits.to_f64_vec()[..vocab].to_vec();
    let next = (0..vocab)
        .max_by(|&a, &b| last[a].total_cmp(&last[b]))
        .unwrap_or(0);
    let pos = Array::I64(ndarray::arr0(tokens.len() as i64).into_dyn());
    let step_args = vec![i64s(&[1, 1], vec![next as i64]), pos, pads];
    write_case(&decode, "decode", step_args, &mut state, dir)?;
    Ok(["prefill", "decode"].map(|name| dir.join(format!("{name}.onnx"))))
}

/// Exports `func` of `module` to `DIR/<func>.onnx`, runs it on `args` and the cache in
/// `state` (the interpreter), writes the model and its inputs and outputs as the ONNX test
/// case `DIR/cases/gpt_<func>`, and leaves the cache the run wrote in `state`; returns the
/// logits.
fn write_case(
    module: &kiln_ir::Module,
    func: &str,
    mut args: Vec<Array>,
    state: &mut kiln_backend::StateStore,
    dir: &Path,
) -> Result<Array, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let options = kiln_onnx::export::ExportOptions::default();
    let path = dir.join(format!("{func}.onnx"));
    kiln_onnx::export::export_to_file(module, func, state, &path, &options)?;
    let function = module.function(func).ok_or("no such function")?;
    let written = kiln_onnx::export::written_states(function);
    for name in &written {
        args.push(
            state
                .get(name)
                .ok_or("a cache state without a value")?
                .clone(),
        );
    }
    let fed = args[..args.len() - written.len()].to_vec();
    let results = kiln_backend::Interpreter::new(module).run_function(function, fed, state)?;
    let mut outputs = results.clone();
    for name in &written {
        outputs.push(state.get(name).expect("written").clone());
    }
    let case = dir.join("cases").join(format!("gpt_{func}"));
    kiln_onnx::write_test_case(&case, &std::fs::read(&path)?, &args, &outputs)?;
    Ok(results.into_iter().next().ok_or("no logits")?)
}
