//! The mutation fuzzer (`kiln fuzz`, `src/fuzz.rs`) for a fixed budget: programs, `.npy`
//! feeds and checkpoints mutated from the repository's corpus, every command's code driven on
//! each, compiled runs compared with the interpreter's. It must find nothing. CI runs a longer
//! budget with the release build (`.ci/run`); `kiln fuzz --seconds N --seed S` runs more.

mod common;

use kiln::fuzz::{Config, run};

fn a_fixed_budget_of_mutants_finds_nothing() {
    let root = common::root();
    let defaults = Config::default();
    let config = Config {
        seed: 0,
        cases: Some(
            std::env::var("KILN_FUZZ_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(20_000),
        ),
        seconds: None,
        corpus: defaults.corpus.iter().map(|p| root.join(p)).collect(),
        out: root.join("target/fuzz-test"),
        ..defaults
    };
    let summary = run(&config, |line| eprintln!("{line}")).unwrap();
    eprintln!("{summary}");
    let findings: Vec<String> = (summary.findings.iter())
        .map(|f| format!("{} ({}): {}", f.what, f.input.display(), f.detail))
        .collect();
    assert!(findings.is_empty(), "{}", findings.join("\n"));
    // The budget reached every part: valid mutants run both ways, feeds and checkpoints.
    assert!(summary.valid >= 20, "{summary}");
    assert!(summary.compared >= 10, "{summary}");
    assert!(
        summary.npy_files >= 100 && summary.checkpoints >= 100,
        "{summary}"
    );
    // ONNX mutants of the seed models (tests/onnx/fuzz_seeds), some of which import.
    assert!(summary.models >= 500 && summary.imported >= 50, "{summary}");
}

/// All in one test: a fuzzing run sets the process's run limits and panic hook while it
/// lasts, so two must not overlap.
#[test]
fn a_fixed_budget_of_mutants_and_the_kept_findings_find_nothing() {
    a_fixed_budget_of_mutants_finds_nothing();
    kept_findings_and_the_corpus_replay_clean();
    a_difference_only_flushing_makes_is_counted_apart_not_found();
}

fn kept_findings_and_the_corpus_replay_clean() {
    let root = common::root();
    let paths = ["tests/fuzz_regressions", "tests/programs"].map(|p| root.join(p));
    let config = Config {
        out: root.join("target/fuzz-replay"),
        ..Config::default()
    };
    let summary = kiln::fuzz::replay(&paths, &config).unwrap();
    assert!(summary.findings.is_empty(), "{:?}", summary.findings);
    assert!(summary.valid >= 10 && summary.compared >= 10, "{summary}");
}

/// A fuzzer finding once open (see the file's comment): a million copies of 255, summed.
#[test]
fn a_long_f32_sum_matches_the_interpreter() {
    let path = common::root().join("tests/fuzz_regressions/long_f32_sum.kir");
    let module = kiln::ir::parse_and_verify(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut state = kiln::backend::StateStore::new();
    let interpreted = kiln::backend::Interpreter::new(&module)
        .run("f", vec![], &mut state)
        .unwrap();
    let mut compiled =
        kiln::serve::Predictor::compile(module, "f", kiln::backend::StateStore::new()).unwrap();
    let compiled = compiled.predict(vec![]).unwrap();
    let (i, c) = (interpreted[0].to_f64_vec()[0], compiled[0].to_f64_vec()[0]);
    assert_eq!(i, 255e6);
    assert!(
        (i - c).abs() <= 1e-6 * i.abs(),
        "interpreted {i}, compiled {c}"
    );
}

/// A fuzzer finding of the flush-to-zero mode (see the file's comment): the runs differ, and
/// the fuzzer tells that from a wrong answer by running compiled again with subnormals kept.
fn a_difference_only_flushing_makes_is_counted_apart_not_found() {
    let root = common::root();
    let path = root.join("tests/fuzz_regressions/subnormal_constant_in_a_loop.kir");
    let config = Config {
        out: root.join("target/fuzz-flushed"),
        ..Config::default()
    };
    let summary = kiln::fuzz::replay(&[path], &config).unwrap();
    assert!(summary.findings.is_empty(), "{:?}", summary.findings);
    assert_eq!(summary.flushed, 1, "{summary}");
}
