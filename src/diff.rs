//! `kiln diff`: where a compiled run parts from the interpreter (the oracle).
//!
//! Every value the function's top level computes is made a result ("observable"), so the
//! compiled code must write it out; the interpreter runs the program as written and the
//! compiled path runs it after the pass pipeline, and the two are compared value by value in
//! program order. When they differ, the pipeline is bisected under the interpreter: the module
//! after each pass is interpreted, and the first pass after which some value differs is named —
//! or, when every pass's output still agrees, the kernels (the code the passes' output was
//! compiled to) are.
//!
//! A value can differ beyond the tolerance although its instruction is computed right: a
//! division by a difference of nearly equal numbers amplifies its operands' rounding. So each
//! differing instruction is evaluated again by the interpreter on the *compiled* run's own
//! operands; when that gives the compiled value, the difference is inherited rounding
//! ("amplified"), not a wrong instruction, and the first instruction that is wrong on its own
//! inputs is the one named.
//!
//! Making values observable changes what the compiled code writes (a fused group writes every
//! value it computes) and so its plan: a product no longer reads an observed reshape or
//! transpose through a view, a buffer is no longer reused. So the function's own results and
//! states are first compared as the user runs it — the same plan `kiln run` makes — and a
//! difference there that the observed runs do not show is reported as what it is: a fault of
//! the compiled plan of the program as run ([`Stage::Plan`]).

use kiln_backend::exec::Executable;
use kiln_backend::{Array, Env, Interpreter, StateStore, unshare};
use kiln_ir::print::{ValueNames, inst_line};
use kiln_ir::{Function, Inst, Loc, Module, Op, SymbolBindings, Value, ValueDef};
use kiln_passes::PassManager;
use std::sync::Arc;

/// How close two values must be to agree.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tolerance {
    /// `|a − b| ≤ tol · (1 + |a|)` elementwise; `None` picks by dtype ([`default_tolerance`]).
    pub tol: Option<f64>,
}

pub use kiln_runtime::compare::{default_tolerance, summary};

/// Where a difference first appears.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// After pass `index` (from 0) of the pipeline, `name`: the module it left, interpreted,
    /// differs from the program as written.
    Pass {
        /// Its position in the pipeline.
        index: usize,
        /// Its name.
        name: String,
    },
    /// Every pass's output agrees under the interpreter; the compiled kernels do not.
    Kernels,
    /// Every value agrees when observed, but the results of the program as run do not: the
    /// compiled plan of the unobserved program (its views, its memory reuse) is wrong.
    Plan,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Pass { index, name } => {
                write!(f, "pass `{name}` (pass {} of the pipeline)", index + 1)
            }
            Stage::Kernels => f.write_str(
                "the compiled kernels (every pass's output agrees under the interpreter)",
            ),
            Stage::Plan => f.write_str(
                "the compiled plan of the program as run (with every value observed the runs \
                 agree; observing changes the plan: products read through views, buffers reused)",
            ),
        }
    }
}

/// One value whose two runs differ.
#[derive(Clone, Debug)]
pub struct Difference {
    /// The value as printed (`%h`), or the state (`@w`) after the run.
    pub value: String,
    /// The instruction that defines it, as one line of text IR (empty for state).
    pub inst: String,
    /// Where that instruction was parsed or built.
    pub loc: Loc,
    /// The interpreter's value, summarised.
    pub interpreted: String,
    /// The compiled value, summarised.
    pub compiled: String,
    /// The largest absolute error, and the element where it is.
    pub max_abs: f64,
    /// The element of the largest absolute error, with both values there.
    pub worst: Option<(Vec<usize>, f64, f64)>,
    /// The largest relative error, `|a − b| / |a|`.
    pub max_rel: f64,
    /// The compiled instruction that computed it, when a fused kernel did.
    pub kernel: Option<String>,
    /// Whether its instruction, evaluated by the interpreter on the other run's operands,
    /// gives the other run's value: the difference is its operands' rounding, amplified.
    pub amplified: bool,
}

/// What [`diff`] found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The function compared.
    pub function: String,
    /// How many values (and states) were compared.
    pub compared: usize,
    /// Every value that differs, in program order, then states; wrong and amplified alike.
    pub differences: Vec<Difference>,
    /// The function's own results, then states, that differ when it runs as the user runs it
    /// (no value observed: the plan `kiln run` makes); amplified where the observed runs show
    /// the same value differing by amplified rounding, wrong otherwise.
    pub as_run: Vec<Difference>,
    /// Where the first difference appears, when there is one.
    pub stage: Option<Stage>,
    /// The passes run, in order.
    pub passes: Vec<String>,
    /// For each run (`interpreted`, `compiled`) that made a NaN or an infinity, the first value
    /// (in program order) holding one and its instruction's line.
    pub non_finite: Vec<(&'static str, String, Loc)>,
}

impl Report {
    /// Whether the two runs agree: every difference, as run and observed, is amplified
    /// rounding.
    pub fn agrees(&self) -> bool {
        self.first_wrong().is_none() && self.first_wrong_as_run().is_none()
    }

    /// The first value whose instruction is wrong on its own operands.
    pub fn first_wrong(&self) -> Option<&Difference> {
        self.differences.iter().find(|d| !d.amplified)
    }

    /// The first result (or state) that is wrong when the program runs as the user runs it.
    pub fn first_wrong_as_run(&self) -> Option<&Difference> {
        self.as_run.iter().find(|d| !d.amplified)
    }
}

/// Why a comparison could not be made.
#[derive(thiserror::Error, Debug)]
pub enum DiffError {
    /// No such function.
    #[error("no function @{0}")]
    UnknownFunction(String),
    /// A pass failed.
    #[error("the pass pipeline failed: {0}")]
    Pass(#[from] kiln_passes::PassError),
    /// One run failed (the other may not have).
    #[error("the {which} run failed: {message}")]
    Run {
        /// `interpreted` or `compiled`.
        which: &'static str,
        /// The run's error.
        message: String,
    },
}

/// Runs `func` of `module` on `args` from `state` through the interpreter and through
/// `pipeline` and the compiled kernels, compares every value, and when they differ names the
/// stage where the difference first appears.
pub fn diff(
    module: &Module,
    func: &str,
    args: &[Array],
    state: &StateStore,
    pipeline: &mut PassManager,
    tolerance: Tolerance,
) -> Result<Report, DiffError> {
    let as_run = AsRun::compare(module, func, args, state, pipeline, tolerance)?;
    let observed = Observed::new(module, func, args, state, tolerance)?;
    let reference = interpret(&observed.module, args, state).map_err(|message| DiffError::Run {
        which: "interpreted",
        message,
    })?;
    let mut snapshots = Vec::new();
    let mut compiled_module = observed.module.clone();
    pipeline.run_with(&mut compiled_module, |report, m| {
        snapshots.push((report.pass.to_owned(), m.clone()))
    })?;
    let compiled = compile_and_run(&compiled_module, args, state)?;
    let mut differences = observed.differences(&reference, &compiled);
    let final_func = &compiled_module.functions[0];
    for d in &mut differences {
        d.kernel = d
            .result
            .map(|k| compiled_as(final_func, final_func.results()[k]));
    }
    let as_run = as_run.judged_by(&differences, observed.func());
    let stage = if differences.iter().any(|d| !d.amplified) {
        Some(observed.first_stage(&snapshots, &reference))
    } else {
        as_run.iter().any(|d| !d.amplified).then_some(Stage::Plan)
    };
    let non_finite = [("interpreted", &reference), ("compiled", &compiled)]
        .into_iter()
        .filter_map(|(run, values)| {
            let k = (values.values.iter())
                .position(|a| kiln_runtime::compare::non_finite(a) != (0, 0))?;
            let func = observed.func();
            let inst = observed.defs[k];
            Some((
                run,
                ValueNames::new(func).get(func.results()[k]),
                func.inst(inst).loc,
            ))
        })
        .collect();
    Ok(Report {
        function: func.to_owned(),
        compared: reference.values.len() + reference.state.len(),
        differences: differences.into_iter().map(|d| d.difference).collect(),
        as_run,
        stage,
        passes: snapshots.into_iter().map(|(name, _)| name).collect(),
        non_finite,
    })
}

/// The function's own results and states, interpreted as written and compiled as the user
/// runs it, and where they differ.
struct AsRun {
    /// Each differing result's value (`None` for a state) and how it differs.
    differences: Vec<(Option<Value>, Difference)>,
}

impl AsRun {
    fn compare(
        module: &Module,
        func: &str,
        args: &[Array],
        state: &StateStore,
        pipeline: &mut PassManager,
        tolerance: Tolerance,
    ) -> Result<AsRun, DiffError> {
        let f = (module.function(func))
            .ok_or_else(|| DiffError::UnknownFunction(func.to_owned()))?
            .clone();
        let written = Module {
            states: module.states.clone(),
            functions: vec![f],
        };
        let reference = interpret(&written, args, state).map_err(|message| DiffError::Run {
            which: "interpreted",
            message,
        })?;
        let mut compiled_module = written.clone();
        pipeline.run(&mut compiled_module)?;
        let compiled = compile_and_run(&compiled_module, args, state)?;
        let f = &written.functions[0];
        let names = ValueNames::new(f);
        let mut differences = Vec::new();
        for (&v, (a, b)) in f
            .results()
            .iter()
            .zip(reference.values.iter().zip(&compiled.values))
        {
            let Some(mut d) = compare(a, b, tolerance) else {
                continue;
            };
            d.value = names.get(v);
            if let ValueDef::Result(inst, _) = f.value(v).def {
                d.inst = inst_line(f, inst);
                d.loc = f.inst(inst).loc;
            }
            differences.push((Some(v), d));
        }
        let states = state_differences(&reference.state, &compiled.state, tolerance);
        differences.extend(states.into_iter().map(|d| (None, d)));
        Ok(AsRun { differences })
    }

    /// The differences, each amplified when the observed runs (`observed`, of `func`) show the
    /// same result or state differing by amplified rounding; wrong when they show it agreeing
    /// or wrong.
    fn judged_by(self, observed: &[Found], func: &Function) -> Vec<Difference> {
        let amplified = |v: Option<Value>, d: &Difference| {
            observed.iter().any(|f| {
                let same = match (v, f.result) {
                    (Some(v), Some(k)) => func.results()[k] == v,
                    (None, None) => f.value == d.value,
                    _ => false,
                };
                same && f.amplified
            })
        };
        (self.differences.into_iter())
            .map(|(v, d)| Difference {
                amplified: amplified(v, &d),
                ..d
            })
            .collect()
    }
}

/// The function compared, with every top-level value a result.
struct Observed<'a> {
    /// The module reduced to the one function, observable.
    module: Module,
    /// The instruction defining each result.
    defs: Vec<Inst>,
    args: &'a [Array],
    state: &'a StateStore,
    /// The symbols' sizes under `args`.
    bindings: SymbolBindings,
    tolerance: Tolerance,
}

/// A difference and the result it is (`None` for a state).
struct Found {
    difference: Difference,
    result: Option<usize>,
}

impl std::ops::Deref for Found {
    type Target = Difference;
    fn deref(&self) -> &Difference {
        &self.difference
    }
}

impl std::ops::DerefMut for Found {
    fn deref_mut(&mut self) -> &mut Difference {
        &mut self.difference
    }
}

impl<'a> Observed<'a> {
    /// `module` reduced to `func` (a function of its own) returning every value its top level
    /// defines, in order.
    fn new(
        module: &Module,
        func: &str,
        args: &'a [Array],
        state: &'a StateStore,
        tolerance: Tolerance,
    ) -> Result<Observed<'a>, DiffError> {
        let mut f = (module.function(func))
            .ok_or_else(|| DiffError::UnknownFunction(func.to_owned()))?
            .clone();
        let body = f.body();
        let (mut results, mut defs) = (Vec::new(), Vec::new());
        for &inst in &f.region(body).insts {
            for &v in &f.inst(inst).results {
                results.push(v);
                defs.push(inst);
            }
        }
        let types = results.iter().map(|&v| f.value_type(v).clone()).collect();
        f.set_region_results(body, results);
        f.set_result_types(types);
        let mut bindings = SymbolBindings::new();
        for (&v, array) in f.args().iter().zip(args) {
            // A misfit is the runs' error to report, with the argument's name.
            let _ = array.check_fits(f.value_type(v), &mut bindings);
        }
        let module = Module {
            states: module.states.clone(),
            functions: vec![f],
        };
        Ok(Observed {
            module,
            defs,
            args,
            state,
            bindings,
            tolerance,
        })
    }

    fn func(&self) -> &Function {
        &self.module.functions[0]
    }

    /// Every value and state of `run` that differs from `reference`, each marked amplified
    /// when its instruction on `run`'s operands gives `run`'s value.
    fn differences(&self, reference: &Run, run: &Run) -> Vec<Found> {
        let func = self.func();
        let names = ValueNames::new(func);
        let env = self.environment(run);
        let mut out = Vec::new();
        for (k, (a, b)) in reference.values.iter().zip(&run.values).enumerate() {
            let Some(mut d) = compare(a, b, self.tolerance) else {
                continue;
            };
            let inst = self.defs[k];
            d.value = names.get(func.results()[k]);
            d.inst = inst_line(func, inst);
            d.loc = func.inst(inst).loc;
            d.amplified = self.recomputes(inst, func.results()[k], &env, b);
            out.push(Found {
                difference: d,
                result: Some(k),
            });
        }
        // A state is written by a store of a value compared above: amplified when they all are.
        let amplified = out.iter().all(|f| f.amplified);
        let states = state_differences(&reference.state, &run.state, self.tolerance);
        out.extend(states.into_iter().map(|d| Found {
            difference: Difference { amplified, ..d },
            result: None,
        }));
        out
    }

    /// The arguments and every observed value of `run`, by value.
    fn environment(&self, run: &Run) -> Env {
        let func = self.func();
        let args = func.args().iter().zip(self.args);
        let values = func.results().iter().zip(&run.values);
        args.chain(values)
            .map(|(&v, a)| (v, Arc::new(a.clone())))
            .collect()
    }

    /// Whether the interpreter, evaluating `inst` on `env`'s operands, gives `value` for `v`.
    fn recomputes(&self, inst: Inst, v: Value, env: &Env, value: &Array) -> bool {
        let func = self.func();
        let data = func.inst(inst);
        // Only what the instruction reads: its operands and its regions' free values (a copy
        // of the whole environment per differing value would be quadratic).
        let mut reads: Vec<Value> = data.args.clone();
        for &r in &data.regions {
            reads.extend(func.free_values(r));
        }
        let operands: Env = (reads.into_iter())
            .filter_map(|v| Some((v, env.get(&v)?.clone())))
            .collect();
        let interp = Interpreter::new(&self.module);
        match interp.eval_inst(func, inst, operands, &self.bindings, self.state) {
            Ok((results, _)) => {
                let k = func.inst(inst).results.iter().position(|&r| r == v);
                k.is_some_and(|k| compare(&results[k], value, self.tolerance).is_none())
            }
            Err(_) => false,
        }
    }

    /// The first stage whose output has a wrong value: the passes' outputs interpreted,
    /// bisected (a wrong value, once made, stays: every value is a result, so no pass drops
    /// it), else the kernels.
    fn first_stage(&self, snapshots: &[(String, Module)], reference: &Run) -> Stage {
        let wrong = |k: usize| match interpret(&snapshots[k].1, self.args, self.state) {
            Ok(run) => self
                .differences(reference, &run)
                .iter()
                .any(|f| !f.amplified),
            // A pass whose output the interpreter cannot run has broken it.
            Err(_) => true,
        };
        let (mut lo, mut hi) = (0, snapshots.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if wrong(mid) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        match snapshots.get(lo) {
            Some((name, _)) => Stage::Pass {
                index: lo,
                name: name.clone(),
            },
            None => Stage::Kernels,
        }
    }
}

/// The values and the state after one run.
struct Run {
    values: Vec<Array>,
    state: StateStore,
}

fn interpret(module: &Module, args: &[Array], state: &StateStore) -> Result<Run, String> {
    let mut state = state.clone();
    let values = Interpreter::new(module)
        .run_function(&module.functions[0], args.to_vec(), &mut state)
        .map_err(|e| e.to_string())?;
    Ok(Run { values, state })
}

fn compile_and_run(module: &Module, args: &[Array], state: &StateStore) -> Result<Run, DiffError> {
    let mut state = state.clone();
    let executable = Executable::new(&module.functions[0]);
    let args = args.iter().cloned().map(Arc::new).collect();
    let values = executable
        .run(args, &mut state, &Interpreter::new(module), false)
        .map_err(|e| DiffError::Run {
            which: "compiled",
            message: e.to_string(),
        })?;
    Ok(Run {
        values: values.into_iter().map(unshare).collect(),
        state,
    })
}

/// The states that differ after the two runs.
fn state_differences(a: &StateStore, b: &StateStore, tolerance: Tolerance) -> Vec<Difference> {
    let mut names: Vec<&str> = a.iter().map(|(n, _)| n).collect();
    names.sort_unstable();
    let mut out = Vec::new();
    for name in names {
        let left = a.get(name).expect("listed");
        let found = match b.get(name) {
            Some(right) => compare(left, right, tolerance),
            None => Some(Difference {
                compiled: "missing".to_owned(),
                ..blank(left)
            }),
        };
        if let Some(mut d) = found {
            d.value = format!("@{name} (after the run)");
            out.push(d);
        }
    }
    out
}

fn blank(a: &Array) -> Difference {
    Difference {
        value: String::new(),
        inst: String::new(),
        loc: Loc::Unknown,
        interpreted: summary(a),
        compiled: String::new(),
        max_abs: f64::INFINITY,
        worst: None,
        max_rel: f64::INFINITY,
        kernel: None,
        amplified: false,
    }
}

/// `None` when `b` (compiled) agrees with `a` (interpreted); else how they differ.
fn compare(a: &Array, b: &Array, tolerance: Tolerance) -> Option<Difference> {
    let found = kiln_runtime::compare::mismatch(a, b, tolerance.tol)?;
    Some(Difference {
        compiled: summary(b),
        max_abs: found.max_abs,
        max_rel: found.max_rel,
        worst: found.worst,
        ..blank(a)
    })
}

/// How the compiled function computed `v`: the fused kernel (its number, its ops, which of its
/// outputs), or the one instruction.
fn compiled_as(func: &Function, v: Value) -> String {
    let ValueDef::Result(inst, output) = func.value(v).def else {
        return format!("argument {}", ValueNames::new(func).get(v));
    };
    let data = func.inst(inst);
    if data.op != Op::Fused {
        return format!("{} (not fused)", inst_line(func, inst));
    }
    let number = (func.region(func.body()).insts.iter())
        .filter(|&&i| func.inst(i).op == Op::Fused)
        .position(|&i| i == inst)
        .map_or(0, |n| n + 1);
    let mut ops: Vec<&str> = Vec::new();
    for &body in &data.regions {
        for &i in &func.region(body).insts {
            let name = func.inst(i).op.name();
            if !ops.contains(&name) {
                ops.push(name);
            }
        }
    }
    format!(
        "fused kernel {number} of @{}, output {} of {} (ops: {})",
        func.name(),
        output + 1,
        data.results.len(),
        ops.join(", ")
    )
}

/// The report as text: a line saying whether the runs agree, then the first wrong value (or
/// every difference, with `all`) and the stage where it appears.
pub fn render(report: &Report, all: bool) -> String {
    let (f, n, compared) = (&report.function, report.differences.len(), report.compared);
    if report.first_wrong().is_none() && report.first_wrong_as_run().is_some() {
        return render_plan_fault(report);
    }
    let mut out = match (report.first_wrong(), report.differences.first()) {
        (_, None) => format!(
            "agree: @{f}: all {compared} values and states within tolerance (interpreted as \
             written; compiled after {} passes)\n",
            report.passes.len()
        ),
        (None, Some(first)) => format!(
            "agree up to rounding: @{f}: {n} of {compared} values and states differ beyond the \
             tolerance, each only by its operands' rounding, amplified (first {}: its \
             instruction on the compiled operands gives the compiled value)\n",
            first.value
        ),
        (Some(_), _) => format!(
            "differ: @{f}: {} of {compared} values and states are wrong on their own operands \
             ({n} differ in all)\n",
            report.differences.iter().filter(|d| !d.amplified).count()
        ),
    };
    let shown: Vec<&Difference> = match report.first_wrong() {
        _ if all => report.differences.iter().collect(),
        Some(first) => vec![first],
        None => Vec::new(),
    };
    for d in shown {
        out += &describe(d);
    }
    if let Some(stage) = &report.stage {
        out += &format!("\nfirst wrong after: {stage}\n");
    }
    for (run, value, loc) in &report.non_finite {
        out += &format!(
            "non-finite: the first value of the {run} run holding NaN or infinity: {value}"
        );
        if loc.is_known() {
            out += &format!(" at {loc}");
        }
        out += "\n";
    }
    out
}

/// The report of a fault only the program as run has: its wrong results and states, and why
/// the observed values cannot name an instruction.
fn render_plan_fault(report: &Report) -> String {
    let wrong: Vec<&Difference> = report.as_run.iter().filter(|d| !d.amplified).collect();
    let mut out = format!(
        "differ: @{}: {} of its results and states are wrong as the program runs (the plan \
         `kiln run` makes), though all {} values and states agree when every value is observed\n",
        report.function,
        wrong.len(),
        report.compared
    );
    for d in wrong {
        out += &describe(d);
    }
    if let Some(stage) = &report.stage {
        out += &format!("\nfirst wrong after: {stage}\n");
    }
    out
}

/// One difference: the value and its line, both runs' values, the errors, the kernel.
fn describe(d: &Difference) -> String {
    let what = if d.amplified {
        "amplified rounding"
    } else {
        "wrong"
    };
    let mut out = format!("\n{what}: {}", d.value);
    if d.loc.is_known() {
        out += &format!(" at {}", d.loc);
    }
    out += "\n";
    if !d.inst.is_empty() {
        out += &format!("  {}\n", d.inst);
    }
    out += &format!(
        "  interpreted  {}\n  compiled     {}\n",
        d.interpreted, d.compiled
    );
    out += &format!("  max abs error {:.3e}", d.max_abs);
    if let Some((index, a, b)) = &d.worst {
        out += &format!(" at {index:?} (interpreted {a}, compiled {b})");
    }
    out += &format!("; max rel error {:.3e}\n", d.max_rel);
    if let Some(kernel) = &d.kernel {
        out += &format!("  computed by  {kernel}\n");
    }
    out
}

/// The report as JSON: `{"function", "agree", "compared", "stage", "passes", "differences",
/// "as_run"}`, the differences only the first wrong one unless `all`, `as_run` the results and
/// states that differ as the program runs.
pub fn to_json(report: &Report, all: bool) -> String {
    let shown: Vec<&Difference> = if all {
        report.differences.iter().collect()
    } else {
        report.first_wrong().into_iter().collect()
    };
    let differences: Vec<serde_json::Value> = shown.into_iter().map(difference_json).collect();
    let as_run: Vec<serde_json::Value> = report.as_run.iter().map(difference_json).collect();
    let stage = report.stage.as_ref().map(|s| match s {
        Stage::Pass { index, name } => serde_json::json!({"pass": name, "index": index}),
        Stage::Kernels => serde_json::json!({"kernels": true}),
        Stage::Plan => serde_json::json!({"plan": true}),
    });
    serde_json::json!({
        "function": report.function,
        "agree": report.agrees(),
        "compared": report.compared,
        "passes": report.passes,
        "stage": stage,
        "differences": differences,
        "as_run": as_run,
        "non_finite": report.non_finite.iter().map(|(run, value, loc)| serde_json::json!({
            "run": run, "value": value, "loc": loc.is_known().then(|| loc.to_string()),
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

fn difference_json(d: &Difference) -> serde_json::Value {
    serde_json::json!({
        "value": d.value,
        "inst": d.inst,
        "loc": d.loc.is_known().then(|| d.loc.to_string()),
        "interpreted": d.interpreted,
        "compiled": d.compiled,
        "max_abs_error": finite_or_null(d.max_abs),
        "max_rel_error": finite_or_null(d.max_rel),
        "worst": d.worst.as_ref().map(|(i, a, b)| serde_json::json!({
            "index": i, "interpreted": finite_or_null(*a), "compiled": finite_or_null(*b)
        })),
        "kernel": d.kernel,
        "amplified": d.amplified,
    })
}

fn finite_or_null(x: f64) -> serde_json::Value {
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// A random value of `ty` (a feed `kiln diff` and `kiln report` draw when none is given): its
/// symbolic dimensions sized by `sizes` (4 when not bound), floats uniform in [-2, 2],
/// integers in [0, 4), bools either way; the same for the same `seed`. A value larger than the
/// memory limit is refused with its size.
pub fn random_value(
    ty: &kiln_ir::Type,
    sizes: &SymbolBindings,
    seed: u64,
) -> Result<Array, String> {
    use kiln_ir::{DType, Dim, Shape, Type};
    let shape: Vec<usize> = (ty.shape.dims().iter())
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            Dim::Sym(s) => sizes.get(s).copied().unwrap_or(4),
        })
        .collect();
    let sized = Type::new(ty.dtype, Shape::fixed(&shape));
    let (bytes, limit) = (sized.fixed_bytes(), kiln_backend::limits::memory_limit());
    if bytes > u128::from(limit) {
        return Err(format!(
            "a random {sized} takes {bytes} bytes, more than the memory limit ({limit} bytes); \
             bind smaller sizes with --bind"
        ));
    }
    let stream = kiln_backend::random::Stream::new(seed, 0x6469_6666);
    let n: usize = shape.iter().product();
    let values = (0..n as u64).map(|i| match ty.dtype {
        DType::Bool => (stream.bits(i) % 2) as f64,
        d if d.is_int() => (stream.bits(i) % 4) as f64,
        _ => stream.uniform(i, -2.0, 2.0),
    });
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), values.collect())
        .expect("as many values as the shape holds");
    Ok(Array::F64(array).cast(ty.dtype))
}
