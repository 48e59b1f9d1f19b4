//! A language model through the trainer: token windows as epochs of steps, a GPT stepping
//! eagerly and compiled to the same parameters, and gradient accumulation over micro-batches
//! equal to one step on the whole batch.

use kiln::ir::DType;
use kiln::runtime::data::text::{self, TextBatches, TextDataset, Tokenizer};
use kiln::runtime::eager::nn::Layer;
use kiln::runtime::eager::{self, EagerOptimizer, Gpt, GptConfig};
use kiln::runtime::{Adam, ClipGradNorm, Schedule, Sgd};
use kiln::train::{Control, EagerClassifier, Learner, Trainer};
use std::collections::BTreeMap;

const BLOCK: usize = 16;

fn sonnets() -> (TextDataset, usize) {
    let corpus = text::sonnets().unwrap();
    let tokenizer = Tokenizer::chars(&corpus.text);
    let tokens = tokenizer.encode(&corpus.text).unwrap();
    (
        TextDataset::new(tokens, BLOCK, 0.1).unwrap(),
        tokenizer.vocab_size(),
    )
}

fn config(vocab: usize) -> GptConfig {
    GptConfig {
        vocab,
        context: BLOCK,
        width: 32,
        heads: 4,
        layers: 2,
    }
}

/// A fresh GPT with AdamW as the recipe sets it (scheduled, clipped, matrices decayed).
fn learner(vocab: usize, micro_batches: usize, compiled: bool) -> EagerClassifier {
    eager::reset();
    eager::manual_seed(11);
    let gpt = Gpt::new("gpt", config(vocab)).unwrap();
    let rule = || {
        let schedule = Schedule::warmup_cosine(3e-3, 3e-4, 2, 12).unwrap();
        let adam = Adam::new(schedule)
            .with_betas(0.9, 0.99)
            .with_decoupled_weight_decay(0.1)
            .decaying_matrices_only();
        ClipGradNorm::new(adam, 1.0).unwrap()
    };
    let optimizer = EagerOptimizer::new(rule(), gpt.parameters()).unwrap();
    let mut learner = EagerClassifier::new(gpt, optimizer).accumulate(micro_batches);
    if compiled {
        let tokens = [(DType::I64, &[BLOCK][..]), (DType::I64, &[BLOCK][..])];
        learner.compile_for(tokens, &mut rule()).unwrap();
    }
    learner
}

fn parameters(learner: &EagerClassifier) -> BTreeMap<String, Vec<f64>> {
    (learner.state().unwrap().into_iter())
        .filter(|(name, _)| name.starts_with("gpt."))
        .map(|(name, a)| (name, a.to_f64_vec()))
        .collect()
}

fn assert_close(a: &BTreeMap<String, Vec<f64>>, b: &BTreeMap<String, Vec<f64>>, tol: f64) {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, x) in a {
        for (x, y) in x.iter().zip(&b[name]) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{name}: {x} vs {y}");
        }
    }
}

#[test]
fn a_gpt_trains_on_text_batches_eagerly_and_compiled_alike() {
    let (data, vocab) = sonnets();
    let train = TextBatches::new(data.train(), 8, 6, 1337);
    let validation = TextBatches::new(data.validation(), 8, 2, 7).same_each_epoch();
    let mut runs = Vec::new();
    for compiled in [false, true] {
        let mut trainer = Trainer::new(learner(vocab, 1, compiled))
            .validate_on(validation.clone())
            .progress(false);
        let history = trainer.fit(&train, 2).unwrap().clone();
        runs.push((history, parameters(trainer.learner())));
    }
    let [(eager_run, eager_params), (compiled_run, compiled_params)] = &runs[..] else {
        unreachable!()
    };
    assert_eq!(eager_run.step_losses.len(), 12);
    let first = eager_run.step_losses[0];
    assert!((first - (vocab as f64).ln()).abs() < 0.1, "{first}");
    let validated = eager_run.epochs[1].validation.as_ref().unwrap();
    assert!(validated.loss < first, "{} vs {first}", validated.loss);
    // Per-token metrics: 2 batches of 8 windows of 16 tokens.
    assert_eq!(validated.examples, 2 * 8 * BLOCK);
    for (a, b) in eager_run.step_losses.iter().zip(&compiled_run.step_losses) {
        assert!((a - b).abs() < 1e-4 * a, "{a} vs {b}");
    }
    assert_close(compiled_params, eager_params, 1e-3);
}

#[test]
fn accumulated_micro_batches_make_the_whole_batch_step() {
    let (data, vocab) = sonnets();
    let batch = data.train().batch(8, 3, 0).unwrap();
    let mut whole = learner(vocab, 1, false);
    whole.train_step(&batch).unwrap();
    let want = parameters(&whole);
    for compiled in [false, true] {
        let mut parts = learner(vocab, 4, compiled);
        parts.train_step(&batch).unwrap();
        assert_close(&parameters(&parts), &want, 2e-5);
        assert_eq!(parts.state().unwrap()["adam.step"].to_f64_vec(), [1.0]);
    }
    let mut uneven = learner(vocab, 3, false);
    let message = uneven.train_step(&batch).unwrap_err().to_string();
    assert!(
        message.contains("8 rows") && message.contains("3 equal"),
        "{message}"
    );
}

#[test]
fn plain_sgd_accumulates_too() {
    let (data, vocab) = sonnets();
    let batch = data.train().batch(4, 5, 0).unwrap();
    let run = |micro_batches: usize| {
        eager::reset();
        eager::manual_seed(2);
        let gpt = Gpt::new("gpt", config(vocab)).unwrap();
        let optimizer = EagerOptimizer::new(Sgd::new(0.5), gpt.parameters()).unwrap();
        let mut learner = EagerClassifier::new(gpt, optimizer).accumulate(micro_batches);
        let tokens = [(DType::I64, &[BLOCK][..]), (DType::I64, &[BLOCK][..])];
        learner.compile_for(tokens, &mut Sgd::new(0.5)).unwrap();
        learner.train_step(&batch).unwrap();
        parameters(&learner)
    };
    assert_close(&run(2), &run(1), 2e-5);
}

#[test]
fn the_recipe_trains_saves_and_generates_the_same_text_after_loading() {
    use kiln::demos::gpt::{self, Recipe};
    use kiln::lm::LanguageModel;
    let recipe = Recipe {
        steps: 8,
        batch: 4,
        eval_every: 4,
        eval_batches: 2,
        warmup: 2,
        model: config(0),
        ..Recipe::default()
    };
    let corpus = text::sonnets().unwrap();
    let mut reports = 0;
    let trained = gpt::train(&recipe, &corpus, None, |_| {
        reports += 1;
        Control::Continue
    })
    .unwrap();
    assert_eq!((reports, trained.history.step_losses.len()), (2, 8));
    let greedy = kiln::runtime::Sampling::greedy();
    let before = trained.model.generate("Shall I", 20, &greedy).unwrap();
    assert!(
        before.starts_with("Shall I") && before.chars().count() == 27,
        "{before:?}"
    );
    let dir = std::env::temp_dir().join(format!("kiln-lm-{}", std::process::id()));
    LanguageModel::save(&trained.model.gpt, &trained.model.tokenizer, &dir).unwrap();
    let loaded = LanguageModel::load(&dir).unwrap();
    assert_eq!(loaded.generate("Shall I", 20, &greedy).unwrap(), before);
    assert_eq!(
        loaded.generate_with("Shall I", 20, &greedy, false).unwrap(),
        before
    );
    // Exported as ONNX (onnxruntime checks the files in CI): the decode case feeds the token
    // greedy generation chose after the prefill, the cache an input and an output.
    let onnx = dir.join("onnx");
    let [_, decode] = gpt::export_onnx(&loaded, "Shall I", &onnx).unwrap();
    let model = kiln::onnx::decode_model(&std::fs::read(decode).unwrap()).unwrap();
    let graph = model.graph.unwrap();
    let caches = 2 * recipe.model.layers;
    assert_eq!(
        (graph.input.len(), graph.output.len()),
        (3 + caches, 1 + caches)
    );
    let case = onnx.join("cases/gpt_decode/test_data_set_0");
    let token = std::fs::read(case.join("input_0.pb")).unwrap();
    let token = kiln::onnx::decode_tensor(&token).unwrap().to_f64_vec()[0];
    let prompt = loaded.tokenizer.encode("Shall I").unwrap().len();
    let greedy_ids = loaded.tokenizer.encode(&before).unwrap();
    assert_eq!(token, f64::from(greedy_ids[prompt]));
    assert!(case.join(format!("output_{caches}.pb")).is_file());
    // `kiln generate` reads the folder, through the cache or not.
    for extra in [&[][..], &["--no-cache"][..]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args([
                "generate",
                dir.to_str().unwrap(),
                "--prompt",
                "Shall I",
                "--tokens",
                "20",
            ])
            .arg("--greedy")
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{before}\n"));
    }
    let drawn = kiln::runtime::Sampling::temperature(1.0, 9).unwrap();
    assert_eq!(
        loaded.generate("Shall I", 20, &drawn).unwrap(),
        loaded.generate("Shall I", 20, &drawn).unwrap()
    );
    // A character the vocabulary lacks is an error naming it; so is a missing folder.
    let message = loaded.generate("ζ", 5, &greedy).err().unwrap().to_string();
    assert!(message.contains('ζ'), "{message}");
    let message = LanguageModel::load(&dir.join("nothing"))
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("config.json"), "{message}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_recipe_stopped_at_a_validation_resumes_to_the_uninterrupted_run() {
    use kiln::demos::gpt::{self, Recipe};
    let recipe = Recipe {
        steps: 8,
        batch: 4,
        eval_every: 4,
        eval_batches: 1,
        warmup: 2,
        model: config(0),
        ..Recipe::default()
    };
    let corpus = text::sonnets().unwrap();
    let values = |trained: &gpt::Trained| -> BTreeMap<String, Vec<f64>> {
        (trained.model.gpt.parameters().iter())
            .map(|p| {
                (
                    p.name().to_owned(),
                    p.tensor().unwrap().to_f64_vec().unwrap(),
                )
            })
            .collect()
    };
    let whole = gpt::train(&recipe, &corpus, None, |_| Control::Continue).unwrap();
    let want = values(&whole);
    let path =
        std::env::temp_dir().join(format!("kiln-lm-resume-{}.safetensors", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let first = gpt::train(&recipe, &corpus, Some(&path), |_| Control::Stop).unwrap();
    assert_eq!(first.history.step_losses.len(), 4);
    assert_ne!(values(&first), want);
    // A fresh model (the scope is reset) loads the checkpoint: parameters, Adam's moments and
    // step (so the schedule's rate), the trainer's position and losses.
    let resumed = gpt::train(&recipe, &corpus, Some(&path), |_| Control::Continue).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(resumed.history.step_losses, whole.history.step_losses);
    assert_close(&values(&resumed), &want, 0.0);
}
