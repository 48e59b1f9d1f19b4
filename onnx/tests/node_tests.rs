//! ONNX's backend node tests (generated from the pinned `onnx` wheel by
//! `scripts/onnx_node_tests.py` into `target/onnx-node`, or `$KILN_ONNX_NODE_TESTS`): every
//! case on the manifest (`tests/node_manifest.txt`) must import and give the expected outputs,
//! within the case's tolerances, both through the reference interpreter and compiled. Cases off
//! the manifest are run and counted by why they fail, not hidden. No case may panic.
//!
//! Every passing case is also exported (`kiln_onnx::export`) and imported again: the exported
//! model must give the expected outputs, and is counted as a fixed point when the program
//! after the pipeline prints the same as the original's (but for the nodes' locations). `KILN_ONNX_EXPORT_DIR=DIR` writes
//! each exported case there (model and test data) for onnxruntime
//! (`scripts/onnx_export_check.py --node-cases DIR`).
//!
//! Without the data the test says so and passes, unless `KILN_ONNX_NODE_REQUIRED=1` (CI).
//! `KILN_ONNX_WRITE_MANIFEST=1` rewrites the manifest with the cases that pass.

use kiln_backend::exec::Executable;
use kiln_backend::{Array, Interpreter, unshare};
use kiln_onnx::{OnnxError, decode_tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MANIFEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node_manifest.txt");

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_ONNX_NODE_TESTS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/onnx-node"),
    }
}

/// Why a case did not pass.
#[derive(Debug)]
#[allow(dead_code)] // the reasons are printed by Debug
enum Outcome {
    Pass,
    /// Passes with its integer inputs (shapes, axes, pads) fixed when importing.
    PassFixed,
    /// Not a case of Kiln's tensors (other dtypes, sequences, …).
    NotTensors(String),
    Unsupported(String),
    Failed(String),
}

/// What exporting a passing case and importing it again gave.
#[derive(Debug)]
#[allow(dead_code)] // the reasons are printed by Debug
enum Exported {
    /// The same program after the pipeline, printed.
    FixedPoint,
    /// The expected outputs from a program that prints differently: the first line that
    /// differs, as imported and as exported then imported.
    SameOutputs(String),
    /// An op the exporter refuses.
    Refused(String),
    /// Wrong outputs, or a model that does not import.
    Differs(String),
}

/// Each case's export outcome, by case folder name.
static EXPORTS: Mutex<BTreeMap<String, Exported>> = Mutex::new(BTreeMap::new());

struct Case {
    dir: PathBuf,
    rtol: f64,
    atol: f64,
    /// False when a value is a sequence or an optional (not a tensor).
    tensors_only: bool,
}

impl Case {
    /// The case in `dir`, with its tolerances from `meta.json`.
    fn read(dir: PathBuf) -> Case {
        let meta = std::fs::read_to_string(dir.join("meta.json")).unwrap();
        let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
        Case {
            rtol: meta["rtol"].as_f64().unwrap_or(1e-3),
            atol: meta["atol"].as_f64().unwrap_or(1e-7),
            tensors_only: meta["tensors_only"] != serde_json::Value::Bool(false),
            dir,
        }
    }
}

fn read_tensors(dir: &Path, kind: &str) -> Result<Vec<Array>, OnnxError> {
    let mut out = Vec::new();
    for i in 0.. {
        let path = dir.join(format!("test_data_set_0/{kind}_{i}.pb"));
        let Ok(bytes) = std::fs::read(&path) else {
            break;
        };
        out.push(decode_tensor(&bytes)?);
    }
    Ok(out)
}

/// Which inputs (by index and value) a retried import fixes.
type Fixes = fn(usize, &Array) -> bool;

/// The names of the graph's inputs that are not initializers, in order.
fn graph_inputs(bytes: &[u8]) -> Vec<String> {
    let model = kiln_onnx::decode_model(bytes).unwrap();
    let graph = model.graph.unwrap();
    let inits: Vec<_> = graph.initializer.iter().map(|t| t.name.clone()).collect();
    (graph.input.iter())
        .filter(|i| !inits.contains(&i.name))
        .map(|i| i.name.clone().unwrap_or_default())
        .collect()
}

fn run_case(case: &Case) -> Outcome {
    if !case.tensors_only {
        return Outcome::NotTensors("sequence or optional values".into());
    }
    let (inputs, expected) = match (
        read_tensors(&case.dir, "input"),
        read_tensors(&case.dir, "output"),
    ) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => return Outcome::NotTensors(e.to_string()),
    };
    let bytes = std::fs::read(case.dir.join("model.onnx")).unwrap();
    let mut model = kiln_onnx::import_bytes(&bytes, Some(&case.dir));
    let mut inputs = inputs;
    let mut outcome_if_pass = Outcome::Pass;
    if let Err(OnnxError::Unsupported(u)) = &model
        && u.iter().any(|u| u.reason.contains("computed at run time"))
    {
        // Shapes, axes, pads or scales fed as graph inputs: import with the integer inputs
        // fixed, or failing that every input but the first (the data).
        let named: Vec<(String, Array)> = graph_inputs(&bytes).into_iter().zip(inputs).collect();
        let attempts: [Fixes; 2] = [|_, a| a.dtype().is_int(), |i, _| i > 0];
        inputs = Vec::new();
        for fix in attempts {
            let (fixed, rest): (Vec<_>, Vec<_>) = named
                .iter()
                .cloned()
                .enumerate()
                .partition(|(i, (_, a))| fix(*i, a));
            let fixed = fixed.into_iter().map(|(_, named)| named).collect();
            model = kiln_onnx::import_fixing(&bytes, Some(&case.dir), &fixed);
            inputs = rest.into_iter().map(|(_, (_, a))| a).collect();
            let run_time = |u: &[kiln_onnx::Unsupported]| {
                u.iter().any(|u| u.reason.contains("computed at run time"))
            };
            if !matches!(&model, Err(OnnxError::Unsupported(u)) if run_time(u)) {
                break;
            }
        }
        outcome_if_pass = Outcome::PassFixed;
    }
    let model = match model {
        Ok(m) => m,
        Err(OnnxError::Unsupported(u)) if u[0].reason.contains("no Kiln dtype") => {
            return Outcome::NotTensors(u[0].reason.clone());
        }
        Err(OnnxError::Unsupported(u)) => return Outcome::Unsupported(u[0].reason.clone()),
        Err(OnnxError::Invalid(m)) if m.contains("no Kiln dtype") => return Outcome::NotTensors(m),
        Err(e) => return Outcome::Failed(format!("import: {e}")),
    };
    if inputs.len() != model.inputs.len() {
        return Outcome::Failed(format!(
            "{} inputs for {} arguments",
            inputs.len(),
            model.inputs.len()
        ));
    }
    let mut state = model.state();
    let name = model.function_name().to_owned();
    let interp = Interpreter::new(&model.module);
    let interpreted = match interp.run(&name, inputs.clone(), &mut state.clone()) {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("interpreter: {e}")),
    };
    if let Err(e) = compare(&interpreted, &expected, case) {
        return Outcome::Failed(format!("interpreter: {e}"));
    }
    let mut module = model.module.clone();
    if let Err(e) = kiln_passes::PassManager::pipeline("default")
        .unwrap()
        .run(&mut module)
    {
        return Outcome::Failed(format!("passes: {e}"));
    }
    let function = module
        .function(&name)
        .expect("the pipeline keeps the function");
    let executable = Executable::new(function);
    let interp = Interpreter::new(&module);
    let inputs_kept = inputs.clone();
    let args = inputs.into_iter().map(Arc::new).collect();
    let compiled = match executable.run(args, &mut state, &interp, false) {
        Ok(r) => r.into_iter().map(unshare).collect::<Vec<_>>(),
        Err(e) => return Outcome::Failed(format!("compiled: {e}")),
    };
    if let Err(e) = compare(&compiled, &expected, case) {
        return Outcome::Failed(format!("compiled: {e}"));
    }
    // The node cases only: the zoo models' random weights make activations near 1e10 whose
    // outputs agree only to rounding, so a second runtime's sums cannot be held to them.
    let case_name = case.dir.file_name().unwrap().to_string_lossy().into_owned();
    if case_name.starts_with("test_") {
        let exported = export_round_trip(case, &model, &module, &inputs_kept, &expected);
        EXPORTS.lock().unwrap().insert(case_name, exported);
    }
    outcome_if_pass
}

/// Exports the imported `model`, imports it again and runs it: the expected outputs, and the
/// same program after the pipeline (`optimized`) for a fixed point.
fn export_round_trip(
    case: &Case,
    model: &kiln_onnx::Model,
    optimized: &kiln_ir::Module,
    inputs: &[Array],
    expected: &[Array],
) -> Exported {
    let state = model.state();
    let name = model.function_name();
    let options = kiln_onnx::export::ExportOptions::default();
    let onnx = match kiln_onnx::export::export(&model.module, name, &state, &options) {
        Ok(m) => m,
        Err(e) => return Exported::Refused(e.to_string()),
    };
    let bytes = prost::Message::encode_to_vec(&onnx);
    if let Some(dir) = std::env::var_os("KILN_ONNX_EXPORT_DIR") {
        let case_dir = Path::new(&dir).join(case.dir.file_name().unwrap());
        kiln_onnx::write_test_case(&case_dir, &bytes, inputs, expected).unwrap();
    }
    let back = match kiln_onnx::import_bytes(&bytes, None) {
        Ok(m) => m,
        Err(e) => return Exported::Differs(format!("import: {e}")),
    };
    let mut back_state = back.state();
    let interp = Interpreter::new(&back.module);
    let run = interp.run(back.function_name(), inputs.to_vec(), &mut back_state);
    match run
        .map_err(|e| e.to_string())
        .and_then(|r| compare(&r, expected, case))
    {
        Ok(()) => {}
        Err(e) => return Exported::Differs(e),
    }
    let mut again = back.module.clone();
    match kiln_passes::PassManager::pipeline("default")
        .unwrap()
        .run(&mut again)
    {
        Ok(_) => {
            let before = without_locs(&optimized.to_string());
            let after = without_locs(&again.to_string());
            match before.lines().zip(after.lines()).find(|(a, b)| a != b) {
                None if before.lines().count() == after.lines().count() => Exported::FixedPoint,
                None => Exported::SameOutputs("a different number of lines".to_owned()),
                Some((a, b)) => Exported::SameOutputs(format!("{} => {}", a.trim(), b.trim())),
            }
        }
        Err(e) => Exported::Differs(format!("passes: {e}")),
    }
}

/// Printed IR without its `loc("node", "Op")` notes: an exported node is named after its
/// output and typed by the op it became, so only the program itself can be a fixed point.
fn without_locs(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(" loc(\"") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("\")").map_or(rest.len() - i, |j| j + 2);
        rest = &rest[i + end..];
    }
    out.push_str(rest);
    out
}

/// NumPy's `assert_allclose`: `|actual − expected| ≤ atol + rtol·|expected|`, NaN where NaN.
fn compare(actual: &[Array], expected: &[Array], case: &Case) -> Result<(), String> {
    if actual.len() != expected.len() {
        return Err(format!(
            "{} results, {} expected",
            actual.len(),
            expected.len()
        ));
    }
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        if a.dtype() != e.dtype() || a.shape() != e.shape() {
            return Err(format!(
                "output {i}: {} where {} was expected",
                a.ty(),
                e.ty()
            ));
        }
        let (av, ev) = (a.to_f64_vec(), e.to_f64_vec());
        for (k, (&x, &y)) in av.iter().zip(&ev).enumerate() {
            let close = (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= case.atol + case.rtol * y.abs();
            if !close {
                return Err(format!(
                    "output {i}, element {k}: {x} where {y} was expected"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn onnx_node_tests() {
    let dir = data_dir();
    if !dir.is_dir() {
        let required = std::env::var("KILN_ONNX_NODE_REQUIRED").is_ok_and(|v| v == "1");
        assert!(!required, "no node test data at {}", dir.display());
        eprintln!(
            "skipped: no ONNX node test data at {} (scripts/onnx_node_tests.py)",
            dir.display()
        );
        return;
    }
    let listed: Vec<String> = std::fs::read_to_string(MANIFEST)
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model.onnx").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut outcomes = BTreeMap::new();
    for name in &names {
        let case = Case::read(dir.join(name));
        let outcome = std::panic::catch_unwind(|| run_case(&case))
            .unwrap_or_else(|p| Outcome::Failed(format!("PANIC: {}", panic_message(&p))));
        outcomes.insert(name.clone(), outcome);
    }
    report(&names, &listed, &outcomes);
    report_exports(&listed);
}

/// Counts the export round trips; every listed case that exports must give its outputs.
fn report_exports(listed: &[String]) {
    let exports = EXPORTS.lock().unwrap();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in exports.values() {
        let kind = match e {
            Exported::FixedPoint => "fixed point",
            Exported::SameOutputs(_) => "same outputs, other text",
            Exported::Refused(_) => "refused",
            Exported::Differs(_) => "differs",
        };
        *counts.entry(kind).or_default() += 1;
    }
    eprintln!("export round trip of the passing cases: {counts:?}");
    if std::env::var("KILN_ONNX_NODE_VERBOSE").is_ok() {
        for (name, e) in exports.iter() {
            eprintln!("  export {name}: {e:?}");
        }
    }
    let differs: Vec<String> = (exports.iter())
        .filter(|(n, e)| matches!(e, Exported::Differs(_)) && listed.contains(n))
        .map(|(n, e)| format!("{n}: {e:?}"))
        .collect();
    assert!(
        differs.is_empty(),
        "{} listed cases differ after an export round trip:\n{}",
        differs.len(),
        differs.join("\n")
    );
    let wrong: Vec<String> = (exports.iter())
        .filter(|(n, _)| listed.contains(n))
        .filter_map(|(n, e)| match e {
            Exported::SameOutputs(line) => Some(format!("{n}: {line}")),
            _ => None,
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} listed cases break the export fixed point (first differing line, as imported => \
         as exported and imported again):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The wheel's `data/light` models (written beside the node tests by the same script): every
/// one must import and reproduce its expected output, interpreted and compiled.
#[test]
fn onnx_zoo_models() {
    let required = std::env::var("KILN_ONNX_NODE_REQUIRED").is_ok_and(|v| v == "1");
    if cfg!(debug_assertions) && !required {
        eprintln!("skipped: the zoo models run with --release (vgg19 takes minutes unoptimised)");
        return;
    }
    every_model_passes(&data_dir().join("../onnx-models"), 9, required);
}

/// Small PyTorch models (CNN, LSTM, GRU, attention; fixed and dynamic batch; a BERT-style
/// encoder at batch 1 and 8 exported by `dynamo=True`) exported by `scripts/onnx_from_torch.py`
/// where torch is installed: each gives torch's outputs.
#[test]
fn torch_exports() {
    every_model_passes(&data_dir().join("../onnx-torch"), 9, false);
}

/// Runs every model folder under `dir` (at least `expected` of them) and requires each to pass.
fn every_model_passes(dir: &Path, expected: usize, required: bool) {
    if !dir.is_dir() {
        assert!(!required, "no models at {}", dir.display());
        eprintln!("skipped: no models at {}", dir.display());
        return;
    }
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    names.sort();
    assert!(
        names.len() >= expected,
        "expected {expected} models in {}",
        dir.display()
    );
    let mut failures = Vec::new();
    for path in names {
        let case = Case::read(path.clone());
        let started = std::time::Instant::now();
        let outcome = std::panic::catch_unwind(|| run_case(&case))
            .unwrap_or_else(|p| Outcome::Failed(format!("PANIC: {}", panic_message(&p))));
        eprintln!(
            "{}: {outcome:?} ({:.1} s)",
            path.display(),
            started.elapsed().as_secs_f64()
        );
        if !matches!(outcome, Outcome::Pass) {
            failures.push(format!("{}: {outcome:?}", path.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    (p.downcast_ref::<String>().cloned())
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn report(names: &[String], listed: &[String], outcomes: &BTreeMap<String, Outcome>) {
    let passes = |o: &Outcome| matches!(o, Outcome::Pass | Outcome::PassFixed);
    let passing: Vec<&String> = names.iter().filter(|n| passes(&outcomes[*n])).collect();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for o in outcomes.values() {
        let kind = match o {
            Outcome::Pass => "pass",
            Outcome::PassFixed => "pass with integer inputs fixed",
            Outcome::NotTensors(_) => "not Kiln tensors",
            Outcome::Unsupported(_) => "unsupported",
            Outcome::Failed(_) => "failed",
        };
        *counts.entry(kind).or_default() += 1;
    }
    eprintln!(
        "{} node test cases: {counts:?}; {} on the manifest",
        names.len(),
        listed.len()
    );
    if std::env::var("KILN_ONNX_NODE_VERBOSE").is_ok() {
        for (name, o) in outcomes {
            eprintln!("  {name}: {o:?}");
        }
    }
    if std::env::var("KILN_ONNX_WRITE_MANIFEST").is_ok_and(|v| v == "1") {
        let mut text = String::from(
            "# ONNX backend node test cases (onnx 1.23.2) that Kiln must pass; maintained by\n\
             # KILN_ONNX_WRITE_MANIFEST=1 cargo test -p kiln-onnx --test node_tests\n",
        );
        for n in &passing {
            text.push_str(n);
            text.push('\n');
        }
        std::fs::write(MANIFEST, text).unwrap();
        eprintln!("wrote {} cases to {MANIFEST}", passing.len());
    }
    let panics: Vec<String> = (outcomes.iter())
        .filter_map(|(n, o)| match o {
            Outcome::Failed(m) if m.starts_with("PANIC") => Some(format!("{n}: {m}")),
            _ => None,
        })
        .collect();
    let broken: Vec<String> = (listed.iter())
        .filter_map(|n| match outcomes.get(n) {
            Some(Outcome::Pass | Outcome::PassFixed) => None,
            Some(o) => Some(format!("{n}: {o:?}")),
            None => Some(format!("{n}: no such case in the data")),
        })
        .collect();
    assert!(
        panics.is_empty(),
        "{} cases panicked:\n{}",
        panics.len(),
        panics.join("\n")
    );
    assert!(
        broken.is_empty(),
        "{} listed cases fail:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
