//! `diff`: a function run eagerly against the same function traced by [`to_static`] and
//! compiled, op by op — the answer to "the compiled version gives a different answer and I
//! can't find where".
//!
//! The function runs twice with every tensor op recorded (its location in the caller's source
//! and its results): once eagerly, once while tracing. Every traced result outside loops and
//! branches becomes an output of the exported program, which runs compiled (the default pass
//! pipeline and the JIT's kernels) and interpreted. The eager and compiled values of each op,
//! matched by source location in order, are compared; the first op whose values differ is
//! named with its line. Non-finite values are tracked the same way: for each run, the first op
//! that produced a NaN or an infinity.
//!
//! Eager `cond` and `while_loop` bodies run as often as the data says but are traced once into
//! regions: their ops are not compared (the loop's results are). Random ops draw other numbers
//! eagerly than compiled.

use super::{EagerError, EagerResult, Tensor, scope, to_static, with};
use crate::compare::{Mismatch, mismatch, non_finite, summary};
use kiln_backend::exec::Executable;
use kiln_backend::{Array, Interpreter, StateStore, unshare};
use kiln_ir::{Loc, Module, Value, ValueDef};
use kiln_passes::PassManager;
use std::collections::HashSet;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

/// Where a front end's user called an op (`file.py:12`), when the Rust location would be the
/// front end's own binding; asked once per op while [`diff_located`] records.
pub type Locate = Rc<dyn Fn() -> Option<String>>;

/// The ops recorded while [`diff`] runs a function.
pub(crate) struct Recording {
    pub records: Vec<Record>,
    pub locate: Option<Locate>,
}

/// One tensor op as `diff` saw it: where it was called and what it gave.
#[derive(Clone)]
pub(crate) struct Record {
    loc: Loc,
    place: Option<String>,
    eager: Vec<Arc<Array>>,
    traced: Vec<Value>,
}

impl Recording {
    pub(crate) fn push(&mut self, loc: Loc, outs: &[Tensor]) {
        let place = self.locate.as_ref().and_then(|locate| locate());
        self.records.push(Record::of(loc, place, outs));
    }
}

impl Record {
    fn of(loc: Loc, place: Option<String>, outs: &[Tensor]) -> Record {
        let mut record = Record {
            loc,
            place,
            eager: Vec::new(),
            traced: Vec::new(),
        };
        for t in outs {
            match &t.0 {
                super::tensor::Repr::Eager { data, .. } => record.eager.push(data.clone()),
                super::tensor::Repr::Traced { value, .. } => record.traced.push(*value),
            }
        }
        record
    }
}

/// The first op whose eager and compiled values differ.
#[derive(Clone, Debug)]
pub struct OpDifference {
    /// The op (the IR op its last instruction is).
    pub op: String,
    /// Where the caller's code called it.
    pub loc: Loc,
    /// Where the front end's user called it, when a front end says ([`diff_located`]).
    pub place: Option<String>,
    /// The eager value, summarised.
    pub eager: String,
    /// The compiled value, summarised.
    pub compiled: String,
    /// How far apart they are.
    pub mismatch: Mismatch,
}

/// The first op of one run whose result holds a NaN or an infinity.
#[derive(Clone, Debug)]
pub struct FirstNonFinite {
    /// `eager`, `compiled` or `interpreted`.
    pub run: &'static str,
    /// The op.
    pub op: String,
    /// Where the caller's code called it.
    pub loc: Loc,
    /// Where the front end's user called it, when a front end says ([`diff_located`]).
    pub place: Option<String>,
    /// NaN elements of its result.
    pub nan: usize,
    /// Infinite elements of its result.
    pub inf: usize,
}

/// What [`diff`] found.
#[derive(Clone, Debug)]
pub struct EagerDiff {
    /// Ops compared (eager against compiled).
    pub compared: usize,
    /// The first op whose values differ.
    pub first: Option<OpDifference>,
    /// For each run that produced a non-finite value, the first op that did.
    pub non_finite: Vec<FirstNonFinite>,
    /// Traced ops with no eager op at the same place (inside `cond` or `while_loop` bodies).
    pub unmatched: usize,
}

impl EagerDiff {
    /// Whether every compared op agrees and no run produced a non-finite value.
    pub fn agrees(&self) -> bool {
        self.first.is_none() && self.non_finite.is_empty()
    }
}

/// Runs `f` on `inputs` eagerly and through [`to_static`] (compiled, and interpreted), and
/// compares every op's values: see the [module documentation](self).
///
/// ```
/// use kiln_runtime::eager::{self, Tensor};
/// let x = Tensor::from_f32(&[3], vec![0.5, 1.0, 2.0])?;
/// let report = eager::diff(|t| Ok(vec![t[0].exp()?.log()?]), &[&x])?;
/// assert!(report.agrees(), "{report}");
/// # Ok::<(), kiln_runtime::eager::EagerError>(())
/// ```
pub fn diff(
    f: impl Fn(&[Tensor]) -> EagerResult<Vec<Tensor>>,
    inputs: &[&Tensor],
) -> EagerResult<EagerDiff> {
    diff_located(f, inputs, None)
}

/// [`diff`] for a front end whose users' source lines are not Rust's: `locate` says where the
/// user called each op (Python's `kiln.diff` passes the caller's `file.py:line`); ops are
/// matched, and reported, by it.
pub fn diff_located(
    f: impl Fn(&[Tensor]) -> EagerResult<Vec<Tensor>>,
    inputs: &[&Tensor],
    locate: Option<Locate>,
) -> EagerResult<EagerDiff> {
    let args = (inputs.iter())
        .map(|t| t.detach())
        .collect::<EagerResult<Vec<_>>>()?;
    let eager = recorded(locate.clone(), || f(&args).map(drop))?;
    let traced = Traced::new(&f, &args, locate)?;
    Ok(traced.compare(&eager))
}

/// The function traced, its ops' results (outside regions) run compiled and interpreted.
struct Traced {
    /// The traced ops outside regions, in order.
    records: Vec<Record>,
    /// The op of each traced value, in the records' order.
    ops: Vec<String>,
    compiled: Vec<Array>,
    interpreted: Vec<Array>,
}

impl Traced {
    fn new(
        f: &impl Fn(&[Tensor]) -> EagerResult<Vec<Tensor>>,
        args: &[Tensor],
        locate: Option<Locate>,
    ) -> EagerResult<Traced> {
        let names: Vec<(String, kiln_ir::Type)> = (args.iter().enumerate())
            .map(|(i, t)| (format!("input{i}"), t.ty()))
            .collect();
        let named: Vec<(&str, kiln_ir::Type)> =
            names.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let mut function = None;
        let records = recorded(locate, || {
            function = Some(to_static(&named, f)?);
            Ok(())
        })?;
        let function = function.expect("traced");
        let graph = function.program().graph();
        let top: HashSet<kiln_ir::Inst> =
            graph.region(graph.body()).insts.iter().copied().collect();
        let at_top =
            |v: &Value| matches!(graph.value(*v).def, ValueDef::Result(i, _) if top.contains(&i));
        let records: Vec<Record> = (records.into_iter())
            .filter(|r| !r.traced.is_empty() && r.traced.iter().all(at_top))
            .collect();
        let values: Vec<Value> = (records.iter())
            .flat_map(|r| r.traced.iter().copied())
            .collect();
        let ops = (values.iter())
            .map(|&v| match graph.value(v).def {
                ValueDef::Result(i, _) => graph.inst(i).op.name().to_owned(),
                ValueDef::Arg(..) => "input".to_owned(),
            })
            .collect();
        let module = function.program().export_module(&[("diff", &values)])?;
        let state = scope()?.store().clone();
        let feeds = feeds(&module, &names, args)?;
        Ok(Traced {
            records,
            ops,
            compiled: run_compiled(&module, &feeds, &state)?,
            interpreted: run_interpreted(&module, &feeds, &state)?,
        })
    }

    /// The eager ops matched to the traced ones by place, in order, and compared.
    fn compare(&self, eager: &[Record]) -> EagerDiff {
        let mut report = EagerDiff {
            compared: 0,
            first: None,
            non_finite: Vec::new(),
            unmatched: 0,
        };
        let mut eager_records = eager.iter().filter(|r| !r.eager.is_empty());
        let mut k = 0;
        let mut first_non_finite = [None, None, None];
        for record in &self.records {
            let same_place = |e: &&Record| e.loc == record.loc && e.place == record.place;
            let Some(eager) = eager_records.find(same_place) else {
                report.unmatched += 1;
                k += record.traced.len();
                continue;
            };
            report.compared += 1;
            for j in 0..record.traced.len() {
                let runs = [
                    eager.eager.get(j).map(|a| &**a),
                    self.compiled.get(k),
                    self.interpreted.get(k),
                ];
                for (slot, value) in first_non_finite.iter_mut().zip(runs) {
                    if slot.is_none()
                        && let Some(value) = value
                        && non_finite(value) != (0, 0)
                    {
                        *slot = Some((k, record, non_finite(value)));
                    }
                }
                if report.first.is_none()
                    && let (Some(a), Some(b)) = (runs[0], runs[1])
                    && let Some(found) = mismatch(a, b, None)
                {
                    report.first = Some(OpDifference {
                        op: self.ops[k].clone(),
                        loc: record.loc,
                        place: record.place.clone(),
                        eager: summary(a),
                        compiled: summary(b),
                        mismatch: found,
                    });
                }
                k += 1;
            }
        }
        let runs = ["eager", "compiled", "interpreted"];
        for (run, found) in runs.into_iter().zip(first_non_finite) {
            if let Some((k, record, (nan, inf))) = found {
                report.non_finite.push(FirstNonFinite {
                    run,
                    op: self.ops[k].clone(),
                    loc: record.loc,
                    place: record.place.clone(),
                    nan,
                    inf,
                });
            }
        }
        report
    }
}

/// The records of the tensor ops `run` makes.
fn recorded(
    locate: Option<Locate>,
    run: impl FnOnce() -> EagerResult<()>,
) -> EagerResult<Vec<Record>> {
    with(|cx| {
        if cx.recording.is_some() {
            return Err(EagerError::Usage(
                "diff cannot run inside another diff".into(),
            ));
        }
        cx.recording = Some(Recording {
            records: Vec::new(),
            locate,
        });
        Ok(())
    })?;
    let outcome = run();
    let records = with(|cx| Ok(cx.recording.take().map(|r| r.records).unwrap_or_default()))?;
    outcome.map(|()| records)
}

/// The exported function's arguments, by the inputs' names.
fn feeds(
    module: &Module,
    names: &[(String, kiln_ir::Type)],
    args: &[Tensor],
) -> EagerResult<Vec<Array>> {
    let func = &module.functions[0];
    (func.args().iter())
        .map(|&a| {
            let name = func.value_name(a).unwrap_or_default();
            let i = (names.iter().position(|(n, _)| n == name))
                .ok_or_else(|| EagerError::Usage(format!("diff: no input {name}")))?;
            Ok((**args[i].data()?).clone())
        })
        .collect()
}

fn run_compiled(module: &Module, args: &[Array], state: &StateStore) -> EagerResult<Vec<Array>> {
    let mut module = module.clone();
    PassManager::pipeline("default")
        .expect("the default pipeline exists")
        .run(&mut module)
        .map_err(|e| EagerError::Usage(format!("diff: the pass pipeline failed: {e}")))?;
    let executable = Executable::new(&module.functions[0]);
    let args = args.iter().cloned().map(Arc::new).collect();
    let results = executable.run(args, &mut state.clone(), &Interpreter::new(&module), false)?;
    Ok(results.into_iter().map(unshare).collect())
}

fn run_interpreted(module: &Module, args: &[Array], state: &StateStore) -> EagerResult<Vec<Array>> {
    let interp = Interpreter::new(module);
    Ok(interp.run_function(&module.functions[0], args.to_vec(), &mut state.clone())?)
}

impl fmt::Display for EagerDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first {
            None => writeln!(f, "agree: {} ops, eager and compiled", self.compared)?,
            Some(d) => {
                writeln!(
                    f,
                    "differ: the first op whose eager and compiled values differ:"
                )?;
                writeln!(f, "  {} at {}", d.op, place(&d.place, d.loc))?;
                writeln!(f, "  eager     {}", d.eager)?;
                writeln!(f, "  compiled  {}", d.compiled)?;
                write!(f, "  max abs error {:.3e}", d.mismatch.max_abs)?;
                if let Some((index, a, b)) = &d.mismatch.worst {
                    write!(f, " at {index:?} (eager {a}, compiled {b})")?;
                }
                writeln!(f, "; max rel error {:.3e}", d.mismatch.max_rel)?;
            }
        }
        for n in &self.non_finite {
            writeln!(
                f,
                "non-finite: the first op of the {} run to produce NaN or infinity: {} at {} \
                 ({} NaN, {} infinite)",
                n.run,
                n.op,
                place(&n.place, n.loc),
                n.nan,
                n.inf
            )?;
        }
        if self.unmatched > 0 {
            writeln!(
                f,
                "({} traced ops inside cond or while_loop bodies not compared)",
                self.unmatched
            )?;
        }
        Ok(())
    }
}

/// The front end's place when it gave one, else the Rust location.
fn place(place: &Option<String>, loc: Loc) -> String {
    place.clone().unwrap_or_else(|| loc.to_string())
}
