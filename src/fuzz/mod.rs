//! `kiln fuzz`: a mutation fuzzer over what users hand Kiln — programs in the text form, ONNX
//! models, `.npy` feeds and safetensors checkpoints — that drives each `kiln` command's code on every
//! mutant, in process, and checks two things:
//!
//! - **No crash**: every command ends in a result or an error, never a panic. (An abort ends
//!   the process; the input being tried is always in `OUT/current.*` first, so a crash that
//!   kills the fuzzer still names its input.)
//! - **No silent disagreement**: a mutant that verifies is run by the interpreter (the oracle,
//!   as `kiln run --interpret`) and compiled (as `kiln run`) on generated feeds; both must
//!   fail, or both succeed with the same results and state.
//!
//! Programs are mutated as tokens: deleted, duplicated, swapped, numbers set to extremes, op
//! names, dtypes and sizes replaced, lines spliced from other programs; ONNX models on the
//! wire and as messages ([`onnx`]). The run is a function
//! of its seed (and of the budget in cases; a budget in seconds stops wherever time runs out).
//! Each finding is written to `OUT/` as a file to reproduce it; kept as a regression case, it
//! belongs in `tests/diagnostics/` (malformed) or `tests/fuzz_regressions/` (valid).

mod onnx;

use crate::npy;
use kiln_backend::random::SplitMix64;
use kiln_backend::{Array, Interpreter, StateStore, limits, subnormals};
use kiln_ir::{DType, Dim, Function, Module, Op, Shape, Symbol, SymbolBindings, Type};
use kiln_passes::{PassManager, Wrt};
use kiln_runtime::Scope;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::Instant;

/// What to fuzz, for how long, and where findings go.
#[derive(Clone, Debug)]
pub struct Config {
    /// The run is a function of this seed (and of `cases`).
    pub seed: u64,
    /// Stop after this many cases.
    pub cases: Option<u64>,
    /// Stop after this many seconds.
    pub seconds: Option<f64>,
    /// What mutants start from: `.kir` files and folders of them, `.onnx` files and folders
    /// holding them at any depth (missing folders are skipped).
    pub corpus: Vec<PathBuf>,
    /// Where the input being tried and the findings are written.
    pub out: PathBuf,
    /// The memory limit runs are held to (kept small, so that runs stay quick).
    pub memory_limit: u64,
    /// The trips a run's loops may make.
    pub max_trips: u64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            seed: 0,
            cases: Some(1000),
            seconds: None,
            corpus: vec![
                PathBuf::from("tests/programs"),
                PathBuf::from("tests/diagnostics"),
                PathBuf::from("tests/runtime_limits"),
                PathBuf::from("tests/fuzz_regressions"),
                PathBuf::from("tests/onnx"),
                // Written by scripts/onnx_node_tests.py, when it has run.
                PathBuf::from("target/onnx-node"),
                PathBuf::from("target/onnx-models"),
            ],
            out: PathBuf::from("target/fuzz"),
            memory_limit: 16 << 20,
            max_trips: 200,
        }
    }
}

/// A crash or a disagreement, and the file that reproduces it.
#[derive(Clone, Debug)]
pub struct Finding {
    /// What went wrong: `panic in run (compiled)`, `compiled and interpreted differ`, …
    pub what: String,
    /// The panic's message or the difference.
    pub detail: String,
    /// The input, written to the output folder.
    pub input: PathBuf,
}

/// What a fuzzing run did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Program mutants tried.
    pub programs: u64,
    /// Of those, the ones that parsed and verified.
    pub valid: u64,
    /// Functions run both ways whose results were compared.
    pub compared: u64,
    /// Functions whose runs both failed (a refusal, a limit, a kernel error).
    pub both_failed: u64,
    /// Of those compared, the ones that differed only as much as the program amplifies a few
    /// roundings of its inputs.
    pub ill_conditioned: u64,
    /// Of those compared, the ones that differed only because the compiled run flushed
    /// subnormals (the same with them kept).
    pub flushed: u64,
    /// Functions not run: more work than a fuzzing run should wait for.
    pub too_costly: u64,
    /// ONNX model mutants tried.
    pub models: u64,
    /// Of those, the ones that imported.
    pub imported: u64,
    /// `.npy` mutants read.
    pub npy_files: u64,
    /// Checkpoint mutants loaded.
    pub checkpoints: u64,
    /// What went wrong.
    pub findings: Vec<Finding>,
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} programs ({} valid), {} ONNX models ({} imported); {} runs compared ({} \
             ill-conditioned, {} different only for flushed subnormals), {} refused both ways, \
             {} too costly to run; {} .npy files, {} checkpoints: {} findings",
            self.programs,
            self.valid,
            self.models,
            self.imported,
            self.compared,
            self.ill_conditioned,
            self.flushed,
            self.both_failed,
            self.too_costly,
            self.npy_files,
            self.checkpoints,
            self.findings.len()
        )
    }
}

/// SplitMix64: small, seeded, and the same everywhere.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Numbers at the edges: sizes that overflow, indices past the end, floats that are not.
const EXTREMES: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "255",
    "65536",
    "2147483647",
    "2147483648",
    "4294967296",
    "4611686018427387904",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "1e308",
    "-1e308",
    "1e-310",
    "nan",
    "inf",
    "-inf",
    "0.5",
];

const DTYPES: &[&str] = &["f32", "f64", "i32", "i64", "bool"];

/// Runs the fuzzer under `config`, reporting progress lines through `progress`.
pub fn run(config: &Config, mut progress: impl FnMut(&str)) -> std::io::Result<Summary> {
    std::fs::create_dir_all(&config.out)?;
    let seeds = corpus(&config.corpus)?;
    let models = onnx::corpus(&config.corpus)?;
    if seeds.is_empty() && models.is_empty() {
        return Err(std::io::Error::other(
            "the corpus has no .kir or .onnx files (run from the project's root, or pass \
             --corpus)",
        ));
    }
    let mut fuzzer = Fuzzer::new(config, seeds, models);
    let started = Instant::now();
    let mut last_report = Instant::now();
    fuzzer.guarded_run(config, |f| {
        let mut case = 0u64;
        while config.cases.is_none_or(|n| case < n)
            && (config.seconds).is_none_or(|s| started.elapsed().as_secs_f64() < s)
        {
            match case % 10 {
                0 => f.npy_case(case)?,
                5 => f.checkpoint_case(case)?,
                // One in twenty: an imported model costs a program's ten (its kernels compile).
                3 if case % 20 == 3 && !f.models.is_empty() => f.onnx_case(case)?,
                _ if f.seeds.is_empty() => f.onnx_case(case)?,
                _ => f.program_case(case)?,
            }
            case += 1;
            if last_report.elapsed().as_secs() >= 10 {
                let seconds = started.elapsed().as_secs_f64();
                progress(&format!("{seconds:>6.0} s  {}", f.summary));
                last_report = Instant::now();
            }
        }
        Ok(())
    })?;
    Ok(fuzzer.summary)
}

/// Tries each program and model of `paths` (files, or folders of `.kir` and `.onnx` files)
/// as it is, unmutated: every command, and its functions run both ways — how a kept finding
/// is checked again.
pub fn replay(paths: &[PathBuf], config: &Config) -> std::io::Result<Summary> {
    std::fs::create_dir_all(&config.out)?;
    let programs = corpus(paths)?;
    let models = onnx::corpus(paths)?;
    let mut fuzzer = Fuzzer::new(config, programs.clone(), models.clone());
    fuzzer.guarded_run(config, |f| {
        for (i, text) in programs.iter().enumerate() {
            f.try_program(text, &format!("replay-{i}"));
        }
        for (i, bytes) in models.iter().enumerate() {
            f.try_model(bytes, &format!("replay-{i}"));
        }
        Ok(())
    })?;
    Ok(fuzzer.summary)
}

/// The `.kir` files of `paths` (files, or folders of them), sorted.
fn corpus(paths: &[PathBuf]) -> std::io::Result<Vec<String>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            for entry in std::fs::read_dir(path)? {
                let p = entry?.path();
                if p.extension().is_some_and(|e| e == "kir") {
                    files.push(p);
                }
            }
        } else if path.is_file() && path.extension().is_none_or(|e| e != "onnx") {
            files.push(path.clone());
        }
    }
    files.sort();
    files.iter().map(std::fs::read_to_string).collect()
}

struct Fuzzer {
    rng: Rng,
    seeds: Vec<String>,
    /// Seed ONNX models, serialized.
    models: Vec<Vec<u8>>,
    ops: Vec<&'static str>,
    out: PathBuf,
    max_trips: u64,
    summary: Summary,
}

/// The outcome of one command on one input: its value, or the panic's message.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".to_owned())
    })
}

impl Fuzzer {
    fn new(config: &Config, seeds: Vec<String>, models: Vec<Vec<u8>>) -> Fuzzer {
        Fuzzer {
            rng: Rng::new(config.seed ^ 0x6b69_6c6e),
            seeds,
            models,
            ops: Op::all_names(),
            out: config.out.clone(),
            max_trips: config.max_trips,
            summary: Summary::default(),
        }
    }

    /// Runs `cases` with panics caught quietly and the run limits set as `config` says, then
    /// restores the process's hook and limits.
    fn guarded_run(
        &mut self,
        config: &Config,
        cases: impl FnOnce(&mut Fuzzer) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let previous_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let (memory, trips) = (limits::memory_limit(), limits::max_trips());
        limits::set_memory_limit(Some(config.memory_limit));
        limits::set_max_trips(Some(config.max_trips));
        let result = cases(self);
        limits::set_memory_limit(Some(memory));
        limits::set_max_trips(Some(trips));
        std::panic::set_hook(previous_hook);
        result
    }

    /// Records a finding, with its input written where a person can rerun it.
    fn found(&mut self, what: String, detail: String, name: String, bytes: &[u8]) {
        let input = self.out.join(name);
        let _ = std::fs::write(&input, bytes);
        self.summary.findings.push(Finding {
            what,
            detail,
            input,
        });
    }

    fn program_case(&mut self, case: u64) -> std::io::Result<()> {
        let seed = self.rng.pick(&self.seeds).clone();
        let mut text = seed;
        // Mostly one edit: a mutant that still verifies reaches the passes and both backends.
        let edits = if self.rng.chance(60) {
            1
        } else {
            2 + self.rng.below(2)
        };
        for _ in 0..edits {
            text = self.mutate(&text);
        }
        std::fs::write(self.out.join("current.kir"), &text)?;
        self.try_program(&text, &format!("{case}"));
        Ok(())
    }

    /// Every command on program `text`, and its functions run both ways; findings are named
    /// after `case`.
    fn try_program(&mut self, text: &str, case: &str) {
        self.summary.programs += 1;
        let commands = guarded(|| commands(text));
        let (failures, module) = match commands {
            Err(panic) => (vec![("parse and verify (kiln check)".into(), panic)], None),
            Ok(result) => result,
        };
        for (what, detail) in failures {
            self.found(
                format!("panic in {what}"),
                detail,
                format!("crash-{case}.kir"),
                text.as_bytes(),
            );
        }
        let Some(module) = module else {
            return;
        };
        self.summary.valid += 1;
        let Ok(scope) = Scope::from_module(&module) else {
            return;
        };
        self.run_both_ways(&module, &scope, case, "kir", text.as_bytes());
    }

    /// Runs (up to three of) `module`'s functions both ways from the state in `scope`, on
    /// generated feeds, and records any disagreement or panic with `input` as `*-case.ext`.
    fn run_both_ways(
        &mut self,
        module: &Module,
        scope: &Scope,
        case: &str,
        ext: &str,
        input: &[u8],
    ) {
        for func in module.functions.iter().take(3) {
            let Some((feeds, sizes)) = feeds(func, &mut self.rng) else {
                continue;
            };
            if work(func, &sizes, self.max_trips) > MAX_WORK {
                self.summary.too_costly += 1;
                continue;
            }
            match guarded(|| differential(module, func, feeds, scope)) {
                Ok(Outcome::Compared) => self.summary.compared += 1,
                Ok(Outcome::IllConditioned) => {
                    self.summary.compared += 1;
                    self.summary.ill_conditioned += 1;
                }
                Ok(Outcome::Flushed) => {
                    self.summary.compared += 1;
                    self.summary.flushed += 1;
                }
                Ok(Outcome::BothFailed) => self.summary.both_failed += 1,
                Ok(Outcome::Differ(detail)) => self.found(
                    format!("compiled and interpreted runs of @{} differ", func.name()),
                    detail,
                    format!("mismatch-{case}.{ext}"),
                    input,
                ),
                Err(panic) => self.found(
                    format!("panic in run of @{}", func.name()),
                    panic,
                    format!("crash-{case}.{ext}"),
                    input,
                ),
            }
        }
    }

    /// One mutation of `text`, token by token.
    fn mutate(&mut self, text: &str) -> String {
        let mut tokens = tokenize(text);
        let solid: Vec<usize> = (0..tokens.len())
            .filter(|&i| !tokens[i].trim().is_empty())
            .collect();
        if solid.is_empty() {
            return text.to_owned();
        }
        let at = *self.rng.pick(&solid);
        let is_number = |t: &str| t.parse::<f64>().is_ok();
        match self.rng.below(9) {
            0 => tokens[at].clear(),
            1 => tokens.insert(at, tokens[at].clone()),
            2 => {
                let other = *self.rng.pick(&solid);
                tokens.swap(at, other);
            }
            3 | 4 => {
                // A number set to an extreme (most often where numbers already are).
                let numbers: Vec<usize> = solid
                    .iter()
                    .copied()
                    .filter(|&i| is_number(&tokens[i]))
                    .collect();
                let at = if numbers.is_empty() {
                    at
                } else {
                    *self.rng.pick(&numbers)
                };
                tokens[at] = self.rng.pick(EXTREMES).to_string();
            }
            5 => {
                let ops: Vec<usize> = (solid.iter().copied())
                    .filter(|&i| self.ops.contains(&tokens[i].as_str()))
                    .collect();
                if let Some(&i) = ops.get(self.rng.below(ops.len().max(1))) {
                    tokens[i] = self.rng.pick(&self.ops).to_string();
                }
            }
            6 => {
                let dtypes: Vec<usize> = (solid.iter().copied())
                    .filter(|&i| DTYPES.contains(&tokens[i].as_str()))
                    .collect();
                if let Some(&i) = dtypes.get(self.rng.below(dtypes.len().max(1))) {
                    tokens[i] = self.rng.pick(DTYPES).to_string();
                }
            }
            7 => {
                // A line of another program spliced in.
                let other = self.rng.pick(&self.seeds).clone();
                let lines: Vec<&str> = other.lines().collect();
                let mut mine: Vec<String> = text.lines().map(str::to_owned).collect();
                let line = self.rng.pick(&lines).to_string();
                let at = self.rng.below(mine.len() + 1);
                mine.insert(at, line);
                return mine.join("\n");
            }
            _ => {
                // A size or symbol in a type changed: `N` for a number, or a number for `N`.
                let dims: Vec<usize> = (solid.iter().copied())
                    .filter(|&i| i > 0 && matches!(tokens[i - 1].as_str(), "[" | ","))
                    .collect();
                if let Some(&i) = dims.get(self.rng.below(dims.len().max(1))) {
                    tokens[i] = self
                        .rng
                        .pick(&["N", "0", "1", "3", "M", "65536"])
                        .to_string();
                }
            }
        }
        tokens.concat()
    }

    fn npy_case(&mut self, case: u64) -> std::io::Result<()> {
        let dtype = *self
            .rng
            .pick(&[DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool]);
        let bytes = self.mutated_npy(dtype);
        let path = self.out.join("current.npy");
        std::fs::write(&path, &bytes)?;
        self.summary.npy_files += 1;
        let read = guarded(|| npy::read_npy(&path, dtype));
        let problem = match read {
            Err(panic) => Some(("panic reading a .npy feed".to_owned(), panic)),
            Ok(Ok(array)) if !array.is_standard_layout() => Some((
                "a .npy feed read in another layout".to_owned(),
                format!("{}", array.ty()),
            )),
            Ok(Ok(array)) if array.len() * dtype.size_bytes() > bytes.len() => Some((
                "a .npy feed larger than its file".to_owned(),
                format!("{} from {} bytes", array.ty(), bytes.len()),
            )),
            Ok(_) => None,
        };
        if let Some((what, detail)) = problem {
            self.found(what, detail, format!("crash-{case}.npy"), &bytes);
        }
        Ok(())
    }

    /// A valid `.npy` file of `dtype` with its header or data mutated.
    fn mutated_npy(&mut self, dtype: DType) -> Vec<u8> {
        let descr = match dtype {
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::Bool => "|b1",
        };
        let shape: Vec<u64> = (0..self.rng.below(4))
            .map(|_| self.rng.below(5) as u64)
            .collect();
        let elements: u64 = shape.iter().product();
        let fortran = self.rng.chance(30);
        let mut dims: Vec<String> = shape.iter().map(|n| format!("{n},")).collect();
        let mut header_descr = descr.to_owned();
        let mut order = if fortran { "True" } else { "False" }.to_owned();
        match self.rng.below(6) {
            0 if !dims.is_empty() => {
                let i = self.rng.below(dims.len());
                dims[i] = format!("{},", self.rng.pick(&EXTREMES[..15]));
            }
            1 => {
                header_descr = self
                    .rng
                    .pick(&["<f4", ">f8", "<i2", "|u1", "<c8", "O", ""])
                    .to_string()
            }
            2 => order = self.rng.pick(&["1", "None", "'x'"]).to_string(),
            _ => {}
        }
        let data_bytes = elements as usize * dtype.size_bytes();
        let data: Vec<u8> = (0..data_bytes)
            .map(|_| (self.rng.next() % 2) as u8)
            .collect();
        let mut bytes = raw_npy(&header_descr, &order, &dims.concat(), &data);
        match self.rng.below(5) {
            0 => bytes.truncate(self.rng.below(bytes.len() + 1)),
            1 => {
                let at = self.rng.below(bytes.len());
                bytes[at] ^= 1 << self.rng.below(8);
            }
            2 => bytes.extend(std::iter::repeat_n(0, self.rng.below(9))),
            _ => {}
        }
        bytes
    }

    fn checkpoint_case(&mut self, case: u64) -> std::io::Result<()> {
        let module = kiln_ir::parse_and_verify(
            "module {
  state @w : f32[3,2] = normal(mean=0.0, std=1.0, seed=1)
  state @b : f32[2] = constant(value=0.5)
  state @step : i64[] = constant(value=0)
}",
        )
        .expect("the checkpoint fuzzer's module verifies");
        let path = self.out.join("current.safetensors");
        let scope = Scope::from_module(&module).expect("a small scope");
        scope.save(&path).map_err(std::io::Error::other)?;
        let mut bytes = std::fs::read(&path)?;
        match self.rng.below(4) {
            0 => bytes.truncate(self.rng.below(bytes.len() + 1)),
            1 => {
                for _ in 0..1 + self.rng.below(4) {
                    let at = self.rng.below(bytes.len());
                    bytes[at] ^= 1 << self.rng.below(8);
                }
            }
            2 => {
                // A number in the JSON header set to an extreme.
                let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
                let header = String::from_utf8_lossy(&bytes[8..header_end.min(bytes.len())]);
                let mut tokens = tokenize(&header);
                let numbers: Vec<usize> = (0..tokens.len())
                    .filter(|&i| tokens[i].parse::<u64>().is_ok())
                    .collect();
                if let Some(&i) = numbers.get(self.rng.below(numbers.len().max(1))) {
                    tokens[i] = self.rng.pick(&EXTREMES[..15]).to_string();
                }
                let header = tokens.concat();
                let mut rebuilt = (header.len() as u64).to_le_bytes().to_vec();
                rebuilt.extend(header.as_bytes());
                rebuilt.extend(&bytes[header_end.min(bytes.len())..]);
                bytes = rebuilt;
            }
            _ => {
                let at = self.rng.below(8);
                bytes[at] = self.rng.next() as u8;
            }
        }
        std::fs::write(&path, &bytes)?;
        self.summary.checkpoints += 1;
        let mut loaded = Scope::from_module(&module).expect("a small scope");
        let before: Vec<(String, Array)> = (loaded.iter())
            .map(|(n, v)| (n.to_owned(), v.clone()))
            .collect();
        let outcome = guarded(|| loaded.load(&path).is_ok());
        let problem = match outcome {
            Err(panic) => Some(("panic loading a checkpoint".to_owned(), panic)),
            Ok(false) => {
                let unchanged = (before.iter()).all(|(n, v)| loaded.get(n) == Some(v));
                (!unchanged).then(|| {
                    (
                        "a failed checkpoint load changed the state".to_owned(),
                        String::new(),
                    )
                })
            }
            Ok(true) => None,
        };
        if let Some((what, detail)) = problem {
            self.found(what, detail, format!("crash-{case}.safetensors"), &bytes);
        }
        Ok(())
    }
}

/// A version 1 `.npy` file written by hand, its header's fields as given (`'<f4'`, `False`,
/// `2,3,`), however wrong: for tests of hostile files.
pub fn raw_npy(descr: &str, fortran_order: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran_order}, 'shape': ({shape}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend(data);
    bytes
}

/// Text as tokens whose concatenation is the text: words, numbers, single punctuation, and
/// runs of whitespace.
fn tokenize(text: &str) -> Vec<String> {
    let word = |c: char| c.is_alphanumeric() || matches!(c, '_' | '.' | '%' | '@' | '-' | '+');
    let mut tokens: Vec<String> = Vec::new();
    for c in text.chars() {
        let joins = tokens.last().is_some_and(|t| {
            let last = t.chars().last().expect("tokens are not empty");
            (word(c) && word(last)) || (c.is_whitespace() && last.is_whitespace())
        });
        match tokens.last_mut() {
            Some(t) if joins => t.push(c),
            _ => tokens.push(c.to_string()),
        }
    }
    tokens
}

/// What `kiln check`, `dump`, `opt`, `stats`, `dot`, `grad` and `export` do with `text`, each
/// guarded: the commands that panicked (with the message), and the module if it verified.
fn commands(text: &str) -> (Vec<(String, String)>, Option<Module>) {
    let mut failures = Vec::new();
    let module = match kiln_ir::parse_and_verify(text) {
        Ok(module) => module,
        Err(e) => {
            if let Err(panic) = guarded(|| e.render(text)) {
                failures.push(("rendering a diagnostic (kiln check)".into(), panic));
            }
            return (failures, None);
        }
    };
    let mut check = |what: &str, f: &mut dyn FnMut() -> Result<(), String>| match guarded(f) {
        Ok(Ok(())) => {}
        Ok(Err(problem)) => failures.push((what.to_owned(), problem)),
        Err(panic) => failures.push((what.to_owned(), panic)),
    };
    check("kiln dump (print, parse back)", &mut || {
        let printed = module.to_string();
        match kiln_ir::parse_and_verify(&printed) {
            Ok(again) if again == module => Ok(()),
            Ok(_) => Err(format!(
                "the printed form parses to another module:\n{printed}"
            )),
            Err(e) => Err(format!("the printed form does not parse: {e}\n{printed}")),
        }
    });
    check("kiln opt", &mut || {
        let mut optimised = module.clone();
        let mut manager = PassManager::pipeline("default")
            .expect("the default pipeline")
            .verify_each(true);
        manager
            .run(&mut optimised)
            .map(|_| ())
            .map_err(|e| format!("the pipeline failed on a verified program: {e}"))
    });
    check("kiln stats", &mut || {
        let mut bound = SymbolBindings::new();
        bound.insert(Symbol::new("N"), usize::MAX);
        let _ = crate::stats::report(&module, &bound);
        Ok(())
    });
    check("kiln dot", &mut || {
        for f in &module.functions {
            let _ = crate::dot::function_to_dot(f);
        }
        Ok(())
    });
    check("kiln grad", &mut || {
        for f in module.functions.iter().take(2) {
            let wrt: Vec<Wrt> = (f.args().iter())
                .filter(|&&a| f.value_type(a).dtype.is_float())
                .filter_map(|&a| f.value_name(a).map(|n| Wrt::Arg(n.to_owned())))
                .take(1)
                .collect();
            if wrt.is_empty() {
                continue;
            }
            if let Ok(grad) = kiln_passes::gradient_function(&module, f, 0, &wrt) {
                let out = Module {
                    states: module.states.clone(),
                    functions: vec![grad],
                };
                kiln_ir::verify_module(&out)
                    .map_err(|e| format!("the gradient does not verify:\n{}", e.render(&out)))?;
            }
        }
        Ok(())
    });
    check("kiln export", &mut || {
        let Ok(state) = StateStore::initialize(&module) else {
            return Ok(());
        };
        let options = kiln_onnx::export::ExportOptions::default();
        for f in module.functions.iter().take(2) {
            // A refusal is an answer; only a panic is a finding.
            let _ = kiln_onnx::export::export(&module, f.name(), &state, &options);
        }
        Ok(())
    });
    (failures, Some(module))
}

/// How a function's two runs went.
enum Outcome {
    Compared,
    /// Different beyond the tolerance, but no more than the interpreter's own results move
    /// when the inputs move by a few roundings.
    IllConditioned,
    /// Different, but the same when the compiled run keeps subnormals instead of flushing.
    Flushed,
    BothFailed,
    Differ(String),
}

/// Arguments for `func`: symbols bound to small sizes (zero among them), floats in [-2, 2],
/// integers in [-2, 4], or `None` if a type cannot be fed (a size past the limit).
fn feeds(func: &Function, rng: &mut Rng) -> Option<(Vec<Array>, SymbolBindings)> {
    let mut sizes: BTreeMap<Symbol, usize> = BTreeMap::new();
    let mut args = Vec::new();
    for &a in func.args() {
        let ty: &Type = func.value_type(a);
        let mut shape = Vec::new();
        for d in ty.shape.dims() {
            shape.push(match d {
                Dim::Fixed(n) => *n,
                // Size 1 twice as often as the others: a batch of one, one head, one token
                // seen through views (which may give a size-1 axis any stride).
                Dim::Sym(s) => {
                    *(sizes.entry(s.clone())).or_insert_with(|| *rng.pick(&[0, 1, 1, 2, 3, 4]))
                }
            });
        }
        let bytes = Type::new(ty.dtype, Shape::fixed(&shape)).fixed_bytes();
        if bytes > u128::from(limits::memory_limit()) {
            return None;
        }
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|_| match ty.dtype {
                DType::Bool => (rng.next() % 2) as f64,
                d if d.is_int() => rng.below(7) as f64 - 2.0,
                _ => (rng.next() % 4001) as f64 / 1000.0 - 2.0,
            })
            .collect();
        let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), values).ok()?;
        args.push(Array::F64(array).cast(ty.dtype));
    }
    Some((args, sizes.into_iter().collect()))
}

/// The most work (multiply-adds, element visits) a run of a mutant may take: the interpreter
/// would spend minutes on a large convolution or product it rightly accepts.
const MAX_WORK: u128 = 30_000_000;

/// The most instructions an imported mutant may have: a mutated sequence length unrolls an
/// ONNX LSTM into millions of them, and the default pipeline's time grows faster than that
/// (BENCHMARKS.md, "Thresholds in the code").
const MAX_IMPORTED_INSTS: usize = 20_000;

/// A generous estimate of a run's work with the symbols sized by `sizes`: products and
/// convolutions by their multiply-adds, pooling by window, anything else by the elements it
/// reads and writes; a loop's body `trips` times.
fn work(func: &Function, sizes: &SymbolBindings, trips: u64) -> u128 {
    let elements = |v: kiln_ir::Value| {
        (func.value_type(v).shape.dims().iter()).fold(1u128, |acc, d| {
            let n = match d {
                Dim::Fixed(n) => *n,
                Dim::Sym(s) => sizes.get(s).copied().unwrap_or(1),
            };
            acc.saturating_mul(n as u128)
        })
    };
    // Instructions anywhere inside a loop run at most `trips` times: the limit counts every
    // trip of a run's loops together.
    let mut in_loops = std::collections::HashSet::new();
    fn enclosed(
        func: &Function,
        region: kiln_ir::Region,
        out: &mut std::collections::HashSet<kiln_ir::Inst>,
    ) {
        for &i in &func.region(region).insts {
            out.insert(i);
            for &r in &func.inst(i).regions {
                enclosed(func, r, out);
            }
        }
    }
    for inst in func.walk_insts() {
        if func.inst(inst).op == Op::While {
            for &r in &func.inst(inst).regions {
                enclosed(func, r, &mut in_loops);
            }
        }
    }
    let mut total = 0u128;
    for inst in func.walk_insts() {
        let data = func.inst(inst);
        let moved = (data.args.iter().chain(&data.results))
            .map(|&v| elements(v))
            .fold(0u128, u128::saturating_add);
        let largest = (data.args.iter().chain(&data.results))
            .map(|&v| elements(v))
            .max()
            .unwrap_or(0);
        let cost = match &data.op {
            // Every output reads a row of one operand: at most (largest)^1.5 for a product.
            Op::MatMul { .. } | Op::Conv2d { .. } | Op::Pool2d { .. } => {
                let second = data.args.get(1).map_or(largest, |&v| elements(v));
                largest.saturating_mul(second.max(1))
            }
            _ => moved,
        };
        let repeats = if in_loops.contains(&inst) {
            trips as u128
        } else {
            1
        };
        total = total.saturating_add(cost.saturating_mul(repeats));
    }
    total
}

/// `func` run as `kiln run --interpret` and as `kiln run` on `args`, compared: results, then
/// state by name.
fn differential(module: &Module, func: &Function, args: Vec<Array>, scope: &Scope) -> Outcome {
    let with_state = |results: Vec<Array>, state: &StateStore| -> Vec<Array> {
        let mut named: Vec<_> = state.iter().collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        results
            .into_iter()
            .chain(named.into_iter().map(|(_, a)| a.clone()))
            .collect()
    };
    let interpret = |args: Vec<Array>| -> Result<Vec<Array>, String> {
        let mut state = scope.store().clone();
        let results = Interpreter::new(module)
            .run_function(func, args, &mut state)
            .map_err(|e| e.to_string())?;
        Ok(with_state(results, &state))
    };
    let compile = |args: Vec<Array>| -> Result<Vec<Array>, String> {
        let mut p =
            crate::serve::Predictor::compile(module.clone(), func.name(), scope.store().clone())
                .map_err(|e| e.to_string())?;
        let results = p.predict(args).map_err(|e| e.to_string())?;
        Ok(with_state(results, p.state()))
    };
    let interpreted = interpret(args.clone());
    let compiled = compile(args.clone());
    // Compiled runs flush subnormals (the book's Limits page): a program that makes them can
    // go another way from there — a quotient of a flushed zero is infinite — which is the
    // mode, not a wrong answer, when a compiled run that keeps them agrees.
    // `interpreted`: the interpreter's results, or `None` when it failed.
    let flushing_only = |interpreted: Option<&[Array]>| {
        let policy = subnormals::subnormals();
        subnormals::set_subnormals(Some(subnormals::Subnormals::Keep));
        let kept = compile(args.clone());
        subnormals::set_subnormals(Some(policy));
        match (interpreted, kept) {
            (Some(i), Ok(k)) => {
                i.len() == k.len() && i.iter().zip(&k).all(|(a, b)| agree(a, b, None))
            }
            (None, Err(_)) => true,
            _ => false,
        }
    };
    match (interpreted, compiled) {
        (Ok(i), Ok(c)) => {
            if i.len() == c.len() && i.iter().zip(&c).all(|(a, b)| agree(a, b, None)) {
                return Outcome::Compared;
            }
            // The program may amplify rounding: a difference no larger than what it does to
            // inputs a few f32 roundings away is the interpreter's f64 sums against f32 ones
            // (a variance of nearly equal values, a comparison of nearly equal floats), not a
            // wrong answer.
            // Several nudges: how far rounding moves a result depends on which way each input
            // rounds, and one nudge may happen to move it little.
            let nudged: Vec<Vec<Array>> = (0..NUDGES)
                .filter_map(|seed| interpret(nudge(&args, seed)).ok())
                .collect();
            let within = !nudged.is_empty()
                && (i.iter().zip(&c).enumerate())
                    .all(|(k, (a, b))| nudged.iter().any(|n| agree(a, b, Some(&n[k]))));
            if within || rounding_only(module, func, &args, scope.store()) {
                return Outcome::IllConditioned;
            }
            if flushing_only(Some(&i)) {
                return Outcome::Flushed;
            }
            let k = (i.iter().zip(&c))
                .position(|(a, b)| !agree(a, b, None))
                .unwrap_or(0);
            Outcome::Differ(format!(
                "value {k} (results, then state by name): interpreted {}, compiled {}",
                i[k], c[k]
            ))
        }
        (Err(_), Err(_)) => Outcome::BothFailed,
        // The compiled path may refuse what the interpreter runs for scratch space of its own
        // (a convolution's patch matrix): a refusal, not a wrong answer.
        (Ok(_), Err(e)) if e.contains("memory limit") => Outcome::BothFailed,
        (i, _) if flushing_only(i.as_deref().ok()) => Outcome::Flushed,
        (i, c) => Outcome::Differ(format!(
            "one run failed: interpreted {}, compiled {}",
            i.err().unwrap_or_else(|| "ok".to_owned()),
            c.err().unwrap_or_else(|| "ok".to_owned())
        )),
    }
}

/// Whether `kiln diff` finds every value the runs of `func` disagree on to be rounding the
/// program amplifies: its instruction, run by the interpreter on the compiled run's own
/// operands, gives the compiled value. That covers what the nudges miss — a sum that cancels
/// exactly (a variance of `2·(x − x̄)`), where the interpreter's f64 sums leave almost nothing
/// whichever way the inputs round and the compiled f32 sums leave rounding that a `rsqrt`
/// blows up.
fn rounding_only(module: &Module, func: &Function, args: &[Array], state: &StateStore) -> bool {
    let Ok(mut pipeline) = PassManager::pipeline("default") else {
        return false;
    };
    let tolerance = crate::diff::Tolerance::default();
    crate::diff::diff(module, func.name(), args, state, &mut pipeline, tolerance)
        .is_ok_and(|report| report.agrees())
}

/// How many nudged runs a disagreement is measured against.
const NUDGES: u64 = 4;

/// `args` with each float element moved by up to 4·10⁻⁷ of itself (about three f32 roundings),
/// the same way every time for one `seed`.
fn nudge(args: &[Array], seed: u64) -> Vec<Array> {
    let mut rng = Rng::new(0x006e_7564_6765 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    (args.iter())
        .map(|a| {
            if !a.dtype().is_float() {
                return a.clone();
            }
            let values: Vec<f64> = (a.to_f64_vec().into_iter())
                .map(|v| v * (1.0 + 4e-7 * ((rng.next() % 2001) as f64 / 1000.0 - 1.0)))
                .collect();
            let nudged = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(a.shape()), values)
                .expect("the same shape");
            Array::F64(nudged).cast(a.dtype())
        })
        .collect()
}

/// Equal types, and elements equal (integers, bools) or within a relative 2e-4 (floats; NaN
/// matching NaN, an interpreted subnormal a compiled zero: `flushed_subnormal`) — plus four times how far `nudged` (the interpreter's result on nudged
/// inputs) moved from `a`, where given.
fn agree(a: &Array, b: &Array, nudged: Option<&Array>) -> bool {
    let tol = if a.dtype().is_float() { 2e-4 } else { 0.0 };
    let moved: Vec<f64> = match nudged {
        Some(n) if n.ty() == a.ty() => (a.to_f64_vec().iter())
            .zip(n.to_f64_vec())
            .map(|(&x, z)| match (x.is_nan(), z.is_nan()) {
                (false, false) if x == z => 0.0,
                (false, false) => 4.0 * (x - z).abs(),
                (true, true) => 0.0,
                _ => f64::INFINITY,
            })
            .collect(),
        _ => vec![0.0; a.len()],
    };
    let close = |x: f64, y: f64, slack: f64| {
        (x.is_nan() && y.is_nan())
            || x == y
            || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs())) + slack
            || slack == f64::INFINITY
            || kiln_runtime::compare::flushed_subnormal(a.dtype(), x, y)
    };
    a.ty() == b.ty()
        && (a.to_f64_vec().iter())
            .zip(b.to_f64_vec())
            .zip(moved)
            .all(|((&x, y), slack)| close(x, y, slack))
}
