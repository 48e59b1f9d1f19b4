//! The trainer: events in order, metrics against a hand count, early stopping, and a run
//! interrupted mid-epoch that resumes from its checkpoint to the same parameters and history
//! as one that was not — for a static program and for eager code.

use kiln::ir::{DType, Dim};
use kiln::runtime::data::{self, DataLoader, Dataset};
use kiln::runtime::eager::nn::{Layer, Linear, Relu, Sequential};
use kiln::runtime::eager::{self, EagerOptimizer};
use kiln::runtime::layers::{self, Activation};
use kiln::runtime::{Adam, Optimizer, Program, Session};
use kiln::train::{
    Control, EagerClassifier, EarlyStopping, Event, History, Learner, StaticClassifier, Trainer,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn digits() -> (Dataset, Dataset) {
    data::digits().unwrap().split(0.2, 0).unwrap()
}

fn static_mlp_of(hidden: usize) -> StaticClassifier {
    let mut p = Program::with_seed(3);
    let x = p
        .placeholder("x", DType::F32, vec![Dim::sym("N"), Dim::Fixed(64)])
        .unwrap();
    let y = p.placeholder("y", DType::I64, vec![Dim::sym("N")]).unwrap();
    let h = layers::dense(&mut p, "fc1", x, hidden, Activation::Relu).unwrap();
    let logits = layers::dense(&mut p, "fc2", h, 10, Activation::Identity).unwrap();
    let loss = layers::softmax_cross_entropy(&mut p, logits, y).unwrap();
    let train = Adam::new(0.01).minimize(&mut p, loss).unwrap();
    StaticClassifier::new(Session::new(&p).unwrap(), logits, loss, train)
}

fn static_mlp() -> StaticClassifier {
    static_mlp_of(16)
}

fn eager_mlp() -> EagerClassifier {
    eager::reset();
    eager::manual_seed(5);
    let model = Sequential::new()
        .push(Linear::new("fc1", 64, 16).unwrap())
        .push(Relu)
        .push(Linear::new("fc2", 16, 10).unwrap());
    let optimizer = EagerOptimizer::new(Adam::new(0.01), model.parameters()).unwrap();
    EagerClassifier::new(model, optimizer)
}

fn checkpoint_path(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "kiln-trainer-{name}-{}.safetensors",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

/// Trains 3 epochs straight; then again, stopped at step 20 of epoch 1 with a checkpoint every
/// 8 steps (the last at step 16), and resumed by a fresh learner. Parameters, optimizer state
/// and history must be the same, to the bit.
fn resume_matches<L: Learner>(name: &str, make: impl Fn() -> L) {
    let (train, test) = digits();
    let loader = DataLoader::new(train, 32).shuffle(11);
    let validation = DataLoader::new(test, 200);
    let epochs = 3;

    let mut straight = Trainer::new(make())
        .progress(false)
        .validate_on(validation.clone());
    let expected: History = straight.fit(&loader, epochs).unwrap().clone();
    let expected_state = straight.learner().state().unwrap();

    let path = checkpoint_path(name);
    let mut steps = 0;
    let mut interrupted = Trainer::new(make())
        .progress(false)
        .validate_on(validation.clone())
        .checkpoint(&path)
        .checkpoint_every(8)
        .on(|event| match event {
            Event::StepEnd {
                epoch: 1, step: 20, ..
            } => Control::Stop,
            Event::StepEnd { .. } => {
                steps += 1;
                Control::Continue
            }
            _ => Control::Continue,
        });
    let partial = interrupted.fit(&loader, epochs).unwrap();
    assert!(partial.stopped.is_some());
    assert_eq!(partial.epochs.len(), 1);
    drop(interrupted);
    assert_eq!(steps, loader.len() + 20);

    let mut resumed = Trainer::new(make()).progress(false).validate_on(validation);
    assert!(resumed.resume(&path).unwrap());
    assert_eq!(resumed.epoch(), 1);
    let got = resumed.fit(&loader, epochs).unwrap().clone();
    assert_eq!(
        got.step_losses, expected.step_losses,
        "{name}: every step's loss"
    );
    for (a, b) in got.epochs.iter().zip(&expected.epochs) {
        assert_eq!(
            (&a.train, &a.validation),
            (&b.train, &b.validation),
            "{name}"
        );
    }
    assert_eq!(got.epochs.len(), epochs);
    let state: BTreeMap<_, _> = resumed.learner().state().unwrap();
    assert_eq!(state.len(), expected_state.len());
    for (name, value) in &expected_state {
        assert_eq!(state[name].to_f64_vec(), value.to_f64_vec(), "{name}");
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_static_program_resumes_mid_epoch_to_the_same_result() {
    resume_matches("static", static_mlp);
}

#[test]
fn eager_code_resumes_mid_epoch_to_the_same_result() {
    resume_matches("eager", eager_mlp);
}

#[test]
fn events_metrics_and_evaluation() {
    let (train, test) = digits();
    let loader = DataLoader::new(train.clone(), 100).shuffle(1);
    let mut events = Vec::new();
    let mut trainer = Trainer::new(static_mlp()).progress(false).top_k(3).on(|e| {
        events.push(match e {
            Event::EpochBegin { epoch } => format!("begin {epoch}"),
            Event::StepBegin { step, .. } => format!("step {step}"),
            Event::StepEnd { step, loss, .. } => format!("end {step} {}", loss.is_finite()),
            Event::EpochEnd { record } => {
                format!("epoch {} {}", record.epoch, record.train.examples)
            }
        });
        Control::Continue
    });
    let history = trainer.fit(&loader, 2).unwrap();
    assert_eq!(history.step_losses.len(), 2 * loader.len());
    let (metrics, confusion) = trainer
        .evaluate(&DataLoader::new(test.clone(), 64))
        .unwrap();
    assert_eq!(metrics.examples, test.len());
    let counts = &confusion.counts;
    let total: usize = counts.iter().flatten().sum();
    let diagonal: usize = (0..10).map(|c| counts[c][c]).sum();
    assert_eq!(total, test.len());
    assert!((metrics.accuracy - diagonal as f64 / total as f64).abs() < 1e-12);
    assert!(metrics.top_k >= metrics.accuracy && metrics.k == 3);
    drop(trainer);
    assert_eq!(events[0], "begin 0");
    assert_eq!(
        events[1..3],
        ["step 0".to_string(), "end 0 true".to_string()]
    );
    assert_eq!(
        events[2 * loader.len() + 1],
        format!("epoch 0 {}", train.len())
    );
    assert_eq!(events.last().unwrap(), &format!("epoch 1 {}", train.len()));
}

#[test]
fn early_stopping_stops_when_the_loss_stops_improving() {
    let (train, _) = digits();
    let loader = DataLoader::new(train, 64);
    let mut trainer = Trainer::new(eager_mlp())
        .progress(false)
        .early_stopping(EarlyStopping {
            patience: 1,
            min_delta: 10.0,
        });
    let history = trainer.fit(&loader, 5).unwrap();
    assert_eq!(
        history.epochs.len(),
        2,
        "the first epoch sets the best; one more fails it"
    );
    let reason = history.stopped.as_deref().unwrap();
    assert!(
        reason.contains("early stopping: no improvement for 1 epochs"),
        "{reason}"
    );
}

#[test]
fn a_checkpoint_of_another_model_is_refused_and_changes_nothing() {
    let (train, _) = digits();
    let path = checkpoint_path("other");
    let mut trainer = Trainer::new(static_mlp()).progress(false).checkpoint(&path);
    trainer
        .fit(&DataLoader::new(train.clone(), 256), 1)
        .unwrap();
    drop(trainer);
    let mut other = Trainer::new(static_mlp_of(24)).progress(false);
    let before = other.learner().state().unwrap();
    let error = other.resume(&path).unwrap_err().to_string();
    assert!(error.contains(&path.display().to_string()), "{error}");
    let after = other.learner().state().unwrap();
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
    assert_eq!(other.epoch(), 0);
    std::fs::remove_file(&path).ok();
}
