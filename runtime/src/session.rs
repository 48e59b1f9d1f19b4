//! Sessions: run any part of a program with feeds and fetches, over one parameter scope.
//!
//! `run(fetches, feeds)` resolves the fetches (values or targets), prunes the graph to what
//! they need, verifies the slice, optimises and compiles it ([`Backend::Compiled`], the
//! default: the pass pipeline, then native kernels) and caches it under its *signature* — the
//! fetch set and the feeds' names and dtypes — so a second call with the same signature
//! prepares nothing ([`Session::compilations`] counts the preparations; a new batch size is
//! not a new signature). Every run reads and writes the session's one [`Scope`], so a GAN's
//! discriminator and generator updates are two runs over the same parameters.

use crate::custom_ops::Registry;
use crate::error::{RuntimeError, RuntimeResult};
use crate::program::{Program, Target};
use crate::scope::Scope;
use kiln_backend::exec::{ExecStats, Executable};
use kiln_backend::{Array, Interpreter, unshare};
use kiln_ir::{DType, Module, SymbolBindings, Value, verify_module};
use kiln_passes::manager::PassManager;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How programs run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// The default pass pipeline, then compiled kernels (the JIT), gemm and planned buffers.
    #[default]
    Compiled,
    /// The reference interpreter on the program as written: the oracle, and a way to check
    /// the compiled results.
    Interpreter,
}

/// Something to compute in a run: a value, a target (its updates), or either by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// A value of the program.
    Value(Value),
    /// A target (a group of updates).
    Target(Target),
    /// A value or target by name.
    Name(String),
}

impl From<Value> for Fetch {
    fn from(v: Value) -> Fetch {
        Fetch::Value(v)
    }
}

impl From<Target> for Fetch {
    fn from(t: Target) -> Fetch {
        Fetch::Target(t)
    }
}

impl From<&str> for Fetch {
    fn from(name: &str) -> Fetch {
        Fetch::Name(name.to_owned())
    }
}

/// What a feed gives a value to: a placeholder or named value by its name, or any value of
/// the program's top level (TF's feed keyed by a tensor), named or not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feed {
    /// A placeholder, or a value named with `set_name`.
    Name(String),
    /// A value of the program.
    Value(Value),
}

impl From<&str> for Feed {
    fn from(name: &str) -> Feed {
        Feed::Name(name.to_owned())
    }
}

impl From<String> for Feed {
    fn from(name: String) -> Feed {
        Feed::Name(name)
    }
}

impl From<Value> for Feed {
    fn from(v: Value) -> Feed {
        Feed::Value(v)
    }
}

/// What a prepared run is keyed by: the fetches, and the feeds' keys and dtypes in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Signature {
    values: Vec<Value>,
    targets: Vec<Target>,
    feeds: Vec<(Feed, DType)>,
}

/// A pruned, verified slice of the program, ready to run.
struct Prepared {
    /// The slice (optimised, for the compiled backend).
    module: Module,
    /// What gives each argument of the function: the index of its feed in the signature's
    /// (sorted) feeds, how errors name it, and whether it is a placeholder or another value.
    args: Vec<ArgFeed>,
    executable: Option<Executable>,
}

/// Where an argument of a prepared slice comes from.
struct ArgFeed {
    /// Its feed in the signature, or `None` for a placeholder the run does not feed.
    feed: Option<usize>,
    /// How errors name it: `` `x` ``, or `v7 (a matmul)` for a value without a name.
    label: String,
    /// The placeholder's name, when it is one.
    placeholder: Option<String>,
}

/// Runs slices of a program against a scope, caching each prepared slice by signature. A
/// [`Session`] is a runner with a program and a scope of its own; compiled eager functions
/// and eager optimizers use a runner against the eager parameter scope.
#[derive(Default)]
pub struct Runner {
    cache: HashMap<Signature, Prepared>,
    compilations: usize,
    runs: u64,
    backend: Backend,
}

impl Runner {
    /// A runner with the default backend (compiled).
    pub fn new() -> Runner {
        Runner::default()
    }

    /// The backend runs use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Selects the backend for the runs that follow (what was prepared for the other one is
    /// dropped).
    pub fn set_backend(&mut self, backend: Backend) {
        if backend != self.backend {
            self.cache.clear();
            self.backend = backend;
        }
    }

    /// The steps of every prepared slice that do not run native code (see
    /// [`Executable::fallbacks`]), each once.
    pub fn fallbacks(&self) -> Vec<(&'static str, kiln_backend::exec::Fallback)> {
        let mut all: Vec<_> = (self.cache.values())
            .filter_map(|p| p.executable.as_ref())
            .flat_map(Executable::fallbacks)
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// What the compiled runs did so far, summed over every prepared slice.
    pub fn exec_stats(&self) -> ExecStats {
        (self.cache.values())
            .filter_map(|p| p.executable.as_ref())
            .map(Executable::stats)
            .sum()
    }

    /// How many times a run had to prune and verify a new slice of a program.
    pub fn compilations(&self) -> usize {
        self.compilations
    }

    /// Runs what `fetches` need in `program`, feeding placeholders by name, reading and
    /// writing `scope`. Returns the fetched values in order.
    pub fn run(
        &mut self,
        program: &Program,
        scope: &mut Scope,
        fetches: &[Fetch],
        feeds: &[(&str, Array)],
    ) -> RuntimeResult<Vec<Array>> {
        let shared: Vec<(Feed, Arc<Array>)> = (feeds.iter())
            .map(|(n, a)| (Feed::from(*n), Arc::new(a.clone())))
            .collect();
        let results = self.run_inner(program, scope, fetches, &shared, false)?;
        Ok(results.into_iter().map(unshare).collect())
    }

    /// [`Runner::run`] with feeds keyed by [`Feed`]: any value of the program, by name or not.
    pub fn run_with_feeds(
        &mut self,
        program: &Program,
        scope: &mut Scope,
        fetches: &[Fetch],
        feeds: &[(Feed, Array)],
    ) -> RuntimeResult<Vec<Array>> {
        let shared: Vec<(Feed, Arc<Array>)> = (feeds.iter())
            .map(|(k, a)| (k.clone(), Arc::new(a.clone())))
            .collect();
        let results = self.run_inner(program, scope, fetches, &shared, false)?;
        Ok(results.into_iter().map(unshare).collect())
    }

    /// Like [`Runner::run`] without copies: feeds and results are shared. A result's buffer
    /// is reused by the next run once the caller has dropped it.
    pub fn run_shared(
        &mut self,
        program: &Program,
        scope: &mut Scope,
        fetches: &[Fetch],
        feeds: &[(&str, Arc<Array>)],
    ) -> RuntimeResult<Vec<Arc<Array>>> {
        let feeds: Vec<(Feed, Arc<Array>)> = (feeds.iter())
            .map(|(n, a)| (Feed::from(*n), a.clone()))
            .collect();
        self.run_inner(program, scope, fetches, &feeds, true)
    }

    fn run_inner(
        &mut self,
        program: &Program,
        scope: &mut Scope,
        fetches: &[Fetch],
        feeds: &[(Feed, Arc<Array>)],
        retain_results: bool,
    ) -> RuntimeResult<Vec<Arc<Array>>> {
        let (values, targets) = resolve(program, fetches)?;
        let mut sorted: Vec<&(Feed, Arc<Array>)> = feeds.iter().collect();
        sorted.sort_by(|a, b| (&a.0, a.1.dtype()).cmp(&(&b.0, b.1.dtype())));
        let signature = Signature {
            values,
            targets,
            feeds: (sorted.iter())
                .map(|(k, a)| (k.clone(), a.dtype()))
                .collect(),
        };
        if !self.cache.contains_key(&signature) {
            let prepared = prepare(program, &signature, self.compilations, self.backend)?;
            self.compilations += 1;
            self.cache.insert(signature.clone(), prepared);
        }
        let prepared = &self.cache[&signature];
        let sorted: Vec<&Arc<Array>> = sorted.iter().map(|(_, a)| a).collect();
        let args = arguments(prepared, &sorted)?;
        let func = &prepared.module.functions[0];
        let counter = self.runs;
        self.runs += 1;
        let interp = Interpreter::new(&prepared.module)
            .with_custom_ops(&Registry)
            .with_rng_counter(counter);
        Ok(match &prepared.executable {
            Some(executable) => executable.run(args, scope.store_mut(), &interp, retain_results)?,
            None => interp.run_shared(func, args, scope.store_mut())?,
        })
    }
}

fn resolve(program: &Program, fetches: &[Fetch]) -> RuntimeResult<(Vec<Value>, Vec<Target>)> {
    let (mut values, mut targets) = (Vec::new(), Vec::new());
    for fetch in fetches {
        match fetch {
            Fetch::Value(v) => values.push(*v),
            Fetch::Target(t) => targets.push(*t),
            Fetch::Name(name) => match (program.target(name), program.value(name)) {
                (Some(t), _) => targets.push(t),
                (None, Some(v)) => values.push(v),
                (None, None) => {
                    let mut names = program.fetchable_names();
                    names.sort();
                    return Err(RuntimeError::UnknownFetch {
                        name: name.clone(),
                        available: names.join(", "),
                    });
                }
            },
        }
    }
    Ok((values, targets))
}

fn prepare(
    program: &Program,
    signature: &Signature,
    index: usize,
    backend: Backend,
) -> RuntimeResult<Prepared> {
    let fed = fed_values(program, signature)?;
    check_cuts(program, signature, &fed)?;
    // Placeholders stay arguments; every other fed value becomes one.
    let named: Vec<(Value, Option<String>)> = (fed.iter())
        .filter(|(v, _)| !program.graph().args().contains(v))
        .map(|&(v, _)| (v, program.graph().value_name(v).map(str::to_owned)))
        .collect();
    let (func, stands_for) = program.export_fed(
        &format!("run{index}"),
        &signature.values,
        &signature.targets,
        &named,
    );
    let args = (stands_for.iter())
        .map(|&v| {
            let placeholder = program.placeholders().iter().find(|(_, p)| *p == v);
            let feed = fed.iter().find(|(f, _)| *f == v).map(|&(_, i)| i);
            ArgFeed {
                feed,
                label: program.describe(v),
                placeholder: placeholder.map(|(n, _)| n.clone()),
            }
        })
        .collect();
    let mut module = Module {
        states: program.module().states.clone(),
        functions: vec![func],
    };
    verify_module(&module).map_err(|e| RuntimeError::Verify(e.render(&module)))?;
    kiln_backend::comm::verify::check_function(&module.functions[0])?;
    let executable = match backend {
        Backend::Compiled => {
            let mut pipeline =
                PassManager::pipeline("default").expect("the default pipeline exists");
            pipeline.run(&mut module).map_err(RuntimeError::Pass)?;
            Some(Executable::new(&module.functions[0]))
        }
        Backend::Interpreter => None,
    };
    Ok(Prepared {
        module,
        args,
        executable,
    })
}

/// How an error names a feed's key.
fn key_text(program: &Program, key: &Feed) -> String {
    match key {
        Feed::Name(name) => format!("`{name}`"),
        Feed::Value(v) => program.describe(*v),
    }
}

/// The value each feed of the signature gives, with the feed's index: a feed that names
/// nothing, a value inside a region, and two feeds of one value are errors.
fn fed_values(program: &Program, signature: &Signature) -> RuntimeResult<Vec<(Value, usize)>> {
    let mut fed: Vec<(Value, usize)> = Vec::new();
    for (i, (key, _)) in signature.feeds.iter().enumerate() {
        let v = match key {
            Feed::Name(name) => {
                let placeholder = program.placeholders().iter().find(|(n, _)| n == name);
                let v = placeholder.map(|&(_, v)| v).or_else(|| program.value(name));
                v.ok_or_else(|| RuntimeError::UnknownFeed {
                    name: name.clone(),
                    available: (program.placeholders().iter())
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?
            }
            Feed::Value(v) => *v,
        };
        if !program.is_top_level(v) {
            let reason = if program.graph().has_value(v) {
                "the value is computed inside a `cond` or `while` body, which a run cannot cut"
            } else {
                "the key is not a value of this program"
            };
            return Err(RuntimeError::Unfeedable {
                name: key_text(program, key),
                reason,
            });
        }
        if let Some(&(_, first)) = fed.iter().find(|(f, _)| *f == v) {
            return Err(RuntimeError::FedTwice {
                name: program.describe(v),
                first: key_text(program, &signature.feeds[first].0),
                second: key_text(program, key),
            });
        }
        fed.push((v, i));
    }
    Ok(fed)
}

/// Feeding a value computed from a state that a fetched target updates is an error (it would
/// cut the gradient path of that update); so is feeding a value between a gradient's `wrt`
/// and its loss when the run needs that gradient.
fn check_cuts(
    program: &Program,
    signature: &Signature,
    fed: &[(Value, usize)],
) -> RuntimeResult<()> {
    let is_placeholder = |v: Value| program.placeholders().iter().any(|(_, p)| *p == v);
    let cuts: Vec<Value> = (fed.iter().map(|&(v, _)| v))
        .filter(|&v| !is_placeholder(v))
        .collect();
    if cuts.is_empty() {
        return Ok(());
    }
    for &v in &cuts {
        let upstream = program.states_upstream_of(v);
        for &target in &signature.targets {
            if let Some(state) =
                (program.target_states(target).into_iter()).find(|s| upstream.contains(s))
            {
                return Err(RuntimeError::FeedCutsUpdate {
                    name: program.describe(v),
                    state,
                    target: program.target_name(target).to_owned(),
                });
            }
        }
    }
    let needed = program.needed_by(&signature.values, &signature.targets);
    // One walk per cut and per loss (an optimizer's gradients share theirs).
    let upstream_of: Vec<HashSet<Value>> = cuts.iter().map(|&v| program.ancestors(v)).collect();
    let mut before: HashMap<Value, HashSet<Value>> = HashMap::new();
    for &(grad, wrt, loss) in program.gradient_paths() {
        if !needed.contains(&grad) {
            continue;
        }
        let before_loss = before
            .entry(loss)
            .or_insert_with(|| program.ancestors(loss));
        for (&v, upstream) in cuts.iter().zip(&upstream_of) {
            if v != wrt && before_loss.contains(&v) && upstream.contains(&wrt) {
                return Err(RuntimeError::FeedCutsGradient {
                    name: program.describe(v),
                    wrt: program.describe(wrt),
                    loss: program.describe(loss),
                });
            }
        }
    }
    Ok(())
}

/// The run's arguments from the signature's feeds (`sorted`, in its order), checked against
/// the types of what they feed.
fn arguments(prepared: &Prepared, sorted: &[&Arc<Array>]) -> RuntimeResult<Vec<Arc<Array>>> {
    let func = &prepared.module.functions[0];
    let mut bindings = SymbolBindings::new();
    let mut args = Vec::with_capacity(func.args().len());
    for (&v, arg) in func.args().iter().zip(&prepared.args) {
        let ty = func.value_type(v);
        let Some(array) = arg.feed.map(|i| sorted[i]) else {
            return Err(RuntimeError::MissingFeed {
                name: arg.placeholder.clone().unwrap_or_else(|| arg.label.clone()),
                ty: Box::new(ty.clone()),
            });
        };
        let mismatch = |reason: String| RuntimeError::FeedMismatch {
            name: arg.label.clone(),
            kind: if arg.placeholder.is_some() {
                "placeholder"
            } else {
                "value"
            },
            expected: Box::new(ty.clone()),
            found: Box::new(array.ty()),
            reason,
        };
        array.check_fits(ty, &mut bindings).map_err(mismatch)?;
        args.push((*array).clone());
    }
    Ok(args)
}

/// A program, the scope its parameters live in, and a runner.
pub struct Session {
    program: Program,
    scope: Scope,
    runner: Runner,
}

impl Session {
    /// A session over a snapshot of `program`, with a fresh scope holding every parameter at
    /// its (seeded) initial value.
    pub fn new(program: &Program) -> RuntimeResult<Session> {
        Session::with_scope(program, Scope::new())
    }

    /// A session over `program` that uses (and initialises what is missing in) `scope`: how
    /// parameters trained elsewhere are run by another program.
    /// With a communicator of several ranks installed (data-parallel training), rank 0's state
    /// is broadcast, so that every rank starts from the same values — all of it (optimizer
    /// moments too) when the ranks declare the same state, so a checkpoint rank 0 alone loaded
    /// resumes exactly (see [`crate::distributed::broadcast_start_state`]).
    pub fn with_scope(program: &Program, mut scope: Scope) -> RuntimeResult<Session> {
        scope.declare(program.module())?;
        crate::distributed::broadcast_start_state(&mut scope, program, 0)?;
        Ok(Session {
            program: program.clone(),
            scope,
            runner: Runner::default(),
        })
    }

    /// The program the session runs.
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// The session's state.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The session's state, to change.
    pub fn scope_mut(&mut self) -> &mut Scope {
        &mut self.scope
    }

    /// The session's state, keeping it after the session.
    pub fn into_scope(self) -> Scope {
        self.scope
    }

    /// Saves the session's state as a checkpoint at `path` (atomically). Under a communicator
    /// of several ranks only rank 0 writes, since every rank holds the same state; the others
    /// return `Ok(false)`.
    pub fn save(&self, path: &std::path::Path) -> RuntimeResult<bool> {
        let comm = kiln_backend::comm::Communicator::current();
        if comm.as_ref().is_some_and(|c| c.size() > 1)
            && let Some(name) = self.program.sharded_states().first()
        {
            return Err(RuntimeError::Usage(format!(
                "this program's optimizer state is sharded over the ranks (ZeRO; `{name}` and \
                 {} more), so rank 0's checkpoint would hold only its block of it; train \
                 without `with_sharded_state` to save checkpoints",
                self.program.sharded_states().len() - 1
            )));
        }
        let rank = comm.map_or(0, |c| c.rank());
        if rank != 0 {
            return Ok(false);
        }
        self.scope.save(path)?;
        Ok(true)
    }

    /// The steps of the compiled runs so far that do not run native code, each once (see
    /// [`Executable::fallbacks`]).
    pub fn fallbacks(&self) -> Vec<(&'static str, kiln_backend::exec::Fallback)> {
        self.runner.fallbacks()
    }

    /// How many times a run had to prune and verify a new slice of the program.
    pub fn compilations(&self) -> usize {
        self.runner.compilations
    }

    /// Runs on `backend` from now on ([`Backend::Compiled`] by default).
    pub fn with_backend(mut self, backend: Backend) -> Session {
        self.runner.set_backend(backend);
        self
    }

    /// Chooses the backend of later runs.
    pub fn set_backend(&mut self, backend: Backend) {
        self.runner.set_backend(backend);
    }

    /// The backend runs use.
    pub fn backend(&self) -> Backend {
        self.runner.backend()
    }

    /// What the compiled runs did so far: allocations, buffer reuses, in-place updates.
    pub fn exec_stats(&self) -> ExecStats {
        self.runner.exec_stats()
    }

    /// Runs what `fetches` need, feeding placeholders by name; returns the fetched values in
    /// order (targets fetch nothing; their updates are applied). Feeds are copied in; see
    /// [`Session::run_shared`] to share them.
    pub fn run(&mut self, fetches: &[Fetch], feeds: &[(&str, Array)]) -> RuntimeResult<Vec<Array>> {
        self.runner
            .run(&self.program, &mut self.scope, fetches, feeds)
    }

    /// [`Session::run`] with feeds keyed by [`Feed`]: a name, or any value of the program's
    /// top level, named or not (`&[(Feed::Value(wx), array)]`): nothing upstream of a fed
    /// value runs.
    pub fn run_with_feeds(
        &mut self,
        fetches: &[Fetch],
        feeds: &[(Feed, Array)],
    ) -> RuntimeResult<Vec<Array>> {
        self.runner
            .run_with_feeds(&self.program, &mut self.scope, fetches, feeds)
    }

    /// [`Session::run`] without copies: feeds and results are shared arrays, and a result's
    /// buffer is reused by a later run once the caller drops it.
    pub fn run_shared(
        &mut self,
        fetches: &[Fetch],
        feeds: &[(&str, Arc<Array>)],
    ) -> RuntimeResult<Vec<Arc<Array>>> {
        self.runner
            .run_shared(&self.program, &mut self.scope, fetches, feeds)
    }

    /// A Keras-style function: call it with arrays for `inputs` (in order; any values of the
    /// program's top level — placeholders, or intermediates to evaluate from) to get `outputs`
    /// and apply the updates of `updates`.
    pub fn function(
        &self,
        inputs: &[Value],
        outputs: &[Value],
        updates: &[Target],
    ) -> RuntimeResult<KerasFunction> {
        for &v in inputs {
            if !self.program.is_top_level(v) {
                return Err(RuntimeError::Unfeedable {
                    name: self.program.describe(v),
                    reason: "a function's input must be a value of the program's top level",
                });
            }
        }
        let mut fetches: Vec<Fetch> = outputs.iter().map(|&v| Fetch::Value(v)).collect();
        fetches.extend(updates.iter().map(|&t| Fetch::Target(t)));
        Ok(KerasFunction {
            inputs: inputs.iter().map(|&v| Feed::Value(v)).collect(),
            fetches,
        })
    }
}

/// `function(inputs, outputs, updates)`: a thin layer over [`Session::run_with_feeds`].
#[derive(Clone, Debug)]
pub struct KerasFunction {
    inputs: Vec<Feed>,
    fetches: Vec<Fetch>,
}

impl KerasFunction {
    /// Runs the function on `args`, one per input.
    pub fn call(&self, session: &mut Session, args: &[Array]) -> RuntimeResult<Vec<Array>> {
        if args.len() != self.inputs.len() {
            return Err(RuntimeError::Usage(format!(
                "the function takes {} inputs, and was called with {}",
                self.inputs.len(),
                args.len()
            )));
        }
        let feeds: Vec<(Feed, Array)> = (self.inputs.iter().cloned())
            .zip(args.iter().cloned())
            .collect();
        session.run_with_feeds(&self.fetches, &feeds)
    }
}
