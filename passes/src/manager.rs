//! The pass manager: a flat list of named passes, with timing, statistics, verification and
//! IR printing wrapped around every pass.
//!
//! Verification runs after each pass in debug builds (and therefore in tests); release builds
//! skip it unless asked. `--print-after-all` is an instrumentation hook: the manager calls back
//! with the module after each pass, headed like MLIR's `// -----// IR Dump After cse //----- //`.

use crate::pass::{Pass, PassError, Stats};
use crate::{
    canonicalize, constants, cse, dce, epilogues, fold, fusion, layout, loops, products, simplify,
};
use kiln_ir::{Module, verify_module};
use std::fmt;
use std::time::{Duration, Instant};

/// What one pass did to the module.
#[derive(Clone, Debug)]
pub struct PassReport {
    /// The pass.
    pub pass: &'static str,
    /// How long it took.
    pub time: Duration,
    /// Instructions before it ran.
    pub insts_before: usize,
    /// Instructions after it ran.
    pub insts_after: usize,
    /// What the pass says it did.
    pub stats: Stats,
    /// Why it did it, when explanations were asked for ([`PassManager::explain`]).
    pub explanations: Vec<String>,
}

impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<14} {:>9.3} ms  {:>7} → {:<7} instructions",
            self.pass,
            self.time.as_secs_f64() * 1e3,
            self.insts_before,
            self.insts_after
        )?;
        for (k, v) in &self.stats.entries {
            write!(f, "  {k}: {v}")?;
        }
        Ok(())
    }
}

/// The passes by name, each with one line of what it does.
pub const PASSES: &[(&str, &str)] = &[
    (
        "place_constants",
        "move each constant to just before its first reader, so a program prints the same whoever built it",
    ),
    (
        "canonicalize",
        "fold chains of reshape, transpose, broadcast and cast; drop identity layout ops",
    ),
    (
        "fold",
        "evaluate ops on small constants with the reference kernels; splats stay splats",
    ),
    (
        "cse",
        "merge instructions that compute the same op on the same operands",
    ),
    (
        "simplify",
        "e-graph rewriting (egg): algebra, layout, broadcasts, matmul transposes; memory-traffic cost",
    ),
    (
        "channels_last",
        "convolutions, max pooling and the ops between them channels last, transposes at the region's edges",
    ),
    (
        "loops",
        "in `while` bodies: hoist invariant ops, pre-transpose invariant operands, batch input projections",
    ),
    (
        "fold_updates",
        "an update `w − c·g` whose gradient `g` is a product only it reads becomes `matmul_acc` onto `w`",
    ),
    (
        "dce",
        "remove instructions whose results are unused and that have no effects",
    ),
    (
        "fuse",
        "group elementwise, broadcast and reduction ops into `fused` kernel regions",
    ),
    (
        "order_epilogues",
        "move reshapes, loads and constants after a convolution to before it, so the kernel reading it runs as its epilogue",
    ),
];

/// Named pipelines: lists of passes.
pub const PIPELINES: &[(&str, &[&str])] = &[
    (
        "default",
        &[
            "place_constants",
            "canonicalize",
            "fold",
            "cse",
            "simplify",
            "channels_last",
            "canonicalize",
            "fold",
            "cse",
            "loops",
            "fold_updates",
            "place_constants",
            "dce",
            "fuse",
            "order_epilogues",
        ],
    ),
    (
        "simplify",
        &[
            "place_constants",
            "canonicalize",
            "fold",
            "cse",
            "simplify",
            "canonicalize",
            "fold",
            "cse",
            "place_constants",
            "dce",
        ],
    ),
    ("none", &[]),
];

/// A pass by name.
pub fn pass_by_name(name: &str) -> Result<Box<dyn Pass>, PassError> {
    Ok(match name {
        "place_constants" => Box::new(constants::PlaceConstants),
        "canonicalize" => Box::new(canonicalize::Canonicalize),
        "fold" => Box::new(fold::ConstantFold),
        "cse" => Box::new(cse::Cse),
        "simplify" => Box::new(simplify::Simplify::default()),
        "dce" => Box::new(dce::Dce),
        "channels_last" => Box::new(layout::ChannelsLast::default()),
        "loops" => Box::new(loops::Loops),
        "fold_updates" => Box::new(products::FoldUpdates::default()),
        "fuse" => Box::new(fusion::Fuse::default()),
        "order_epilogues" => Box::new(epilogues::OrderEpilogues::default()),
        _ => {
            return Err(PassError::UnknownPass {
                name: name.to_owned(),
                available: PASSES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    })
}

/// The number of instructions in a module, counting those inside regions.
pub fn instruction_count(module: &Module) -> usize {
    module.functions.iter().map(|f| f.num_insts()).sum()
}

/// Runs passes in order, optionally verifying after each and reporting what each did.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
    verify: bool,
    explain: bool,
}

impl Default for PassManager {
    fn default() -> PassManager {
        PassManager::new()
    }
}

impl PassManager {
    /// No passes; verification after each pass in debug builds.
    pub fn new() -> PassManager {
        PassManager {
            passes: Vec::new(),
            verify: cfg!(debug_assertions),
            explain: false,
        }
    }

    /// Whether to verify the module after every pass.
    pub fn verify_each(mut self, on: bool) -> PassManager {
        self.verify = on;
        self
    }

    /// Whether each pass records why it changed what it changed (in its report's
    /// `explanations`): the e-graph's chains of rules, fusion's decisions.
    pub fn explain(mut self, on: bool) -> PassManager {
        self.explain = on;
        for pass in &mut self.passes {
            pass.set_explain(on);
        }
        self
    }

    /// Appends `pass`.
    pub fn with_pass(mut self, mut pass: Box<dyn Pass>) -> PassManager {
        pass.set_explain(self.explain);
        self.passes.push(pass);
        self
    }

    /// Passes by name, e.g. `["canonicalize", "cse", "dce"]`.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<PassManager, PassError> {
        names.iter().try_fold(PassManager::new(), |pm, name| {
            Ok(pm.with_pass(pass_by_name(name.as_ref().trim())?))
        })
    }

    /// A named pipeline (see [`PIPELINES`]).
    pub fn pipeline(name: &str) -> Result<PassManager, PassError> {
        let (_, passes) = PIPELINES.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            PassError::UnknownPipeline {
                name: name.to_owned(),
                available: PIPELINES
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        })?;
        PassManager::from_names(passes)
    }

    /// The passes' names, in order.
    pub fn pass_names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs every pass in order.
    pub fn run(&mut self, module: &mut Module) -> Result<Vec<PassReport>, PassError> {
        self.run_with(module, |_, _| {})
    }

    /// Runs every pass in order, calling `after_each` with each pass's report and the module
    /// it left (the hook behind `--print-after-all`).
    pub fn run_with(
        &mut self,
        module: &mut Module,
        mut after_each: impl FnMut(&PassReport, &Module),
    ) -> Result<Vec<PassReport>, PassError> {
        let mut reports = Vec::new();
        for pass in &mut self.passes {
            let before = instruction_count(module);
            let start = Instant::now();
            let stats = pass.run(module)?;
            let time = start.elapsed();
            if self.verify {
                verify_module(module).map_err(|e| PassError::Verify {
                    pass: pass.name(),
                    rendered: e.render(module),
                })?;
            }
            let report = PassReport {
                pass: pass.name(),
                time,
                insts_before: before,
                insts_after: instruction_count(module),
                stats,
                explanations: pass.take_explanations(),
            };
            after_each(&report, module);
            reports.push(report);
        }
        Ok(reports)
    }
}

/// The header `--print-after-all` prints before each dump.
pub fn dump_header(pass: &str) -> String {
    format!("// -----// IR Dump After {pass} //----- //")
}
