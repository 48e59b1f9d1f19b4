//! The compiled executor: runs a function (after the pass pipeline) step by step — `fused`
//! regions and loose elementwise ops as kernels compiled by the JIT, matrix products by gemm,
//! reshapes by moving buffers, everything else by the reference interpreter — with buffers
//! planned ahead ([`schedule`]) and kept from run to run, so a training step allocates
//! nothing once it is warm.
//!
//! Semantics are the interpreter's: results, errors (with the failing instruction), and state
//! written only when the whole run succeeds. The one exception is planned: a parameter or
//! optimizer state updated in place is written by a step after which nothing can fail.

mod control;
mod conv;
mod depthwise;
#[cfg(debug_assertions)]
pub mod fault;
mod inspect;
mod kept;
pub(crate) mod matmul;
use kept::Kept;
mod pool;
mod pool_avx512;
mod pool_nhwc;
pub(crate) mod schedule;
pub use inspect::{KernelInfo, Placement, StepTime};
mod spare;

use crate::InterpError;
use crate::interp::{Env, Interpreter, kernels};
use crate::{Array, StateStore, settings};
use cranelift_entity::EntityRef;
use kiln_ir::print::{ValueNames, inst_line};
use kiln_ir::{
    Conv2dAttrs, ConvKind, DType, Function, Inst, Op, Pool2dAttrs, PoolKind, Shape, SymbolBindings,
    Type, Value,
};
use schedule::{Output, Schedule, ShapeRecipe, Step, StepKind};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// A function compiled for the executor.
pub struct Executable {
    func: Function,
    schedule: Schedule,
    /// Results that own a slot: `(result position, slot)`.
    result_slots: Vec<(usize, usize)>,
    runtime: Mutex<Option<Runtime>>,
    counters: Counters,
    threads: bool,
    /// With `KILN_PROFILE=1` or [`Executable::with_profile`]: time and count per step.
    profile: Option<Mutex<Vec<(std::time::Duration, u64)>>>,
    /// How many of the slowest steps are printed when the executable is dropped (25 with
    /// `KILN_PROFILE=1`, all with `KILN_PROFILE=all`; none for [`Executable::with_profile`]).
    print_profile: usize,
    /// By step: whether it is a convolution whose weights are loaded from a state the function
    /// does not store, so that it keeps them packed between runs ([`Packed`]). A trained
    /// weight would change each run, and holding it would stop its update in place.
    packs_weights: Vec<bool>,
}

impl Drop for Executable {
    fn drop(&mut self) {
        let Some(profile) = self.profile.as_ref().filter(|_| self.print_profile > 0) else {
            return;
        };
        let profile = profile.lock().unwrap_or_else(PoisonError::into_inner);
        let total: f64 = profile.iter().map(|(d, _)| d.as_secs_f64()).sum();
        let mut rows: Vec<(usize, f64, u64)> = (profile.iter().enumerate())
            .map(|(i, (d, n))| (i, d.as_secs_f64(), *n))
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        eprintln!(
            "kiln profile of @{}: {:.3} ms in {} steps",
            self.func.name(),
            total * 1e3,
            rows.len()
        );
        let lines = kiln_ir::print::InstLines::new(&self.func);
        for (i, secs, n) in rows.into_iter().take(self.print_profile) {
            let step = &self.schedule.steps[i];
            let mut line = lines.line(step.inst);
            line.truncate(100);
            let per_call = if n > 0 { secs * 1e6 / n as f64 } else { 0.0 };
            eprintln!(
                "{:6.1} %  {per_call:9.1} µs/run  {line}",
                100.0 * secs / total.max(1e-12)
            );
        }
    }
}

/// Which steps keep their convolution's weights packed between runs
/// ([`Executable::packs_weights`]): convolutions and input gradients whose weights are a load
/// of a state that `func` stores nowhere.
fn packs_weights(func: &Function, schedule: &Schedule) -> Vec<bool> {
    let stored: HashSet<&str> = (func.walk_insts().into_iter())
        .filter_map(|inst| match &func.inst(inst).op {
            Op::Store { state } => Some(state.as_str()),
            _ => None,
        })
        .collect();
    let loads: HashMap<Value, &str> = (schedule.steps.iter())
        .filter_map(|s| match &s.kind {
            StepKind::Load { state } => Some((s.outputs[0], state.as_str())),
            _ => None,
        })
        .collect();
    let weights_of = |s: &Step| match s.kind {
        StepKind::Conv2d { kind, .. } if !matches!(kind, ConvKind::FilterGrad { .. }) => {
            loads.get(&s.inputs[1]).copied()
        }
        _ => None,
    };
    (schedule.steps.iter())
        .map(|s| weights_of(s).is_some_and(|state| !stored.contains(state)))
        .collect()
}

/// How many earlier results per result an executable keeps for reuse: a caller that keeps
/// each result until the next one arrives (a training loop's loss, a stream of outputs) then
/// gets its buffers back without new pages (a fresh 64 MiB output costs its page faults, ~10
/// ms here).
const RETURNED_PER_RESULT: usize = 2;

/// Buffers and scratch vectors kept between runs.
#[derive(Default)]
struct Runtime {
    /// Each slot's buffer while no value holds it.
    arena: Vec<Option<Arc<Array>>>,
    /// Each value's array during a run, by value index.
    env: Vec<Option<Arc<Array>>>,
    sizes: Vec<i64>,
    /// The sizes the memory limit was last checked for (checked again when they change).
    checked_sizes: Option<Vec<i64>>,
    kernel_sizes: Vec<i64>,
    /// Whether each output of the kernel being called is written over an input's buffer.
    over_input: Vec<bool>,
    shape: Vec<usize>,
    pointers: Vec<*mut u8>,
    outputs: Vec<Arc<Array>>,
    held: Vec<Arc<Array>>,
    /// Results handed out in earlier runs that callers still held when the next run began:
    /// each buffer is taken again once its caller drops it.
    returned: Vec<Arc<Array>>,
    /// Buffers of arguments (and other values without a slot) that died in this run, for
    /// its later outputs and then for slots left empty: a loop body's carried values become
    /// the next trip's outputs.
    dead: Vec<Array>,
    /// Pending stores: state, value, and the slot the state's old buffer may refill.
    stores: Vec<(String, Arc<Array>, Option<usize>)>,
    /// Argmaxes max poolings keep for their gradients (`StepKind::Pool2d`).
    kept_argmax: Vec<Kept<pool::Argmax>>,
    /// Communication under way, by step index.
    communicating: Vec<Option<crate::comm::Started>>,
    /// The convolution just run has run the next step's kernel as its epilogue.
    epilogue_ran: bool,
    /// By step: a convolution's weights packed for its kernel, kept from an earlier run.
    packed: Vec<Option<Packed>>,
    /// The slices `update_slice` steps wrote over in state's own buffers this run.
    overwritten: Vec<Overwritten>,
}

/// A state's slice that an `update_slice` wrote over in the state's buffer (a KV cache's
/// position: O(slice) instead of a copy of the cache), kept until the run ends: a run that
/// fails later puts it back, so a failed run leaves state as it found it.
struct Overwritten {
    state: String,
    old: Array,
    index: Array,
    axis: usize,
}

/// A convolution's weights in the order its kernel reads them ([`conv::packed_weights`]), and
/// the loaded array they were made from. Holding that array keeps it unchanged — the executor
/// writes over a buffer only when it alone holds it — so while a later run loads the same
/// array, the packed weights are still its own.
struct Packed {
    source: Arc<Array>,
    weights: Array,
}

// SAFETY: `pointers` only holds addresses during one kernel call and is cleared after it; the
// rest is owned data.
unsafe impl Send for Runtime {}

/// An epilogue kernel's buffer addresses and the convolution output's among them, shared by
/// the threads that run the convolution's chunks.
struct Addresses<'a>(&'a [*mut u8], *mut u8);

// SAFETY: each thread runs the kernel on the rows of the samples it has written, which no other
// thread reads or writes; the other buffers are read only, or written at those rows only.
unsafe impl Sync for Addresses<'_> {}

impl Addresses<'_> {
    /// The addresses with the convolution output's replaced by `output`.
    fn with_output_at(&self, output: *mut u8) -> [*mut u8; schedule::MAX_EPILOGUE_BUFFERS] {
        let mut buffers = [std::ptr::null_mut(); schedule::MAX_EPILOGUE_BUFFERS];
        for (to, &p) in buffers.iter_mut().zip(self.0) {
            *to = if p == self.1 { output } else { p };
        }
        buffers
    }
}

#[derive(Default)]
struct Counters {
    runs: AtomicU64,
    allocations: AtomicU64,
    reuses: AtomicU64,
    in_place: AtomicU64,
    interpreted: AtomicU64,
    epilogues_run: AtomicU64,
    weights_packed: AtomicU64,
}

/// What an executable did so far, and how it is built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecStats {
    /// How many times the executable has run.
    pub runs: u64,
    /// Buffers allocated (a warm run allocates only its results, which it hands over).
    pub allocations: u64,
    /// Buffers taken from the arena instead.
    pub reuses: u64,
    /// Outputs written over an input's or a state's buffer.
    pub in_place: u64,
    /// Steps run by the interpreter.
    pub interpreted: u64,
    /// Kernels run as a convolution's epilogue (on each run of samples it wrote).
    pub epilogues_run: u64,
    /// Convolution weights put in their kernel's order and kept for later runs (once per
    /// convolution while its loaded weights stay the same).
    pub weights_packed: u64,
    /// Steps in the schedule.
    pub steps: usize,
    /// Steps that call a compiled kernel.
    pub kernels: usize,
    /// Buffer slots the memory plan uses.
    pub slots: usize,
    /// Argmaxes max poolings keep for their gradients.
    pub kept_argmax: usize,
    /// Convolutions paired with the kernel after them, which they run as their epilogue when
    /// its rows split by samples.
    pub epilogues: usize,
}

/// Sums every field: what several executables (a session's prepared slices) did together.
/// The destructuring names each field, so a new one is a compile error here until summed.
impl std::ops::AddAssign for ExecStats {
    fn add_assign(&mut self, other: ExecStats) {
        let ExecStats {
            runs,
            allocations,
            reuses,
            in_place,
            interpreted,
            epilogues_run,
            weights_packed,
            steps,
            kernels,
            slots,
            kept_argmax,
            epilogues,
        } = other;
        self.runs += runs;
        self.allocations += allocations;
        self.reuses += reuses;
        self.in_place += in_place;
        self.interpreted += interpreted;
        self.epilogues_run += epilogues_run;
        self.weights_packed += weights_packed;
        self.steps += steps;
        self.kernels += kernels;
        self.slots += slots;
        self.kept_argmax += kept_argmax;
        self.epilogues += epilogues;
    }
}

impl std::iter::Sum for ExecStats {
    fn sum<I: Iterator<Item = ExecStats>>(stats: I) -> ExecStats {
        stats.fold(ExecStats::default(), |mut total, s| {
            total += s;
            total
        })
    }
}

/// How a step that is not native code runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fallback {
    /// The interpreter's kernel for the op, called on the step's buffers (no frame): the ops
    /// of [`INTERPRETER_KERNELS`].
    InterpreterKernel,
    /// The interpreter, instruction and regions (custom-op calls; regions that touch state
    /// or communicate; kernels the JIT could not compile).
    Interpreted,
}

/// The ops whose compiled form is the interpreter's own kernel (for some or all dtypes), in
/// one list: compiled-against-interpreter tests cannot check these (both sides run the same
/// code), so each has hand-computed cases of its own in `backend/tests/interp_ops.rs`, and
/// `runtime/tests/op_info.rs` fails when a compiled run uses the interpreter for an op not
/// listed here.
/// (`matmul` only for integer operands: float products run in gemm.)
pub const INTERPRETER_KERNELS: &[&str] = &[
    "transpose",
    "slice",
    "pad",
    "concat",
    "argmax",
    "argmin",
    "matmul",
];

/// Whether a fallback is one the executor documents: an op of [`INTERPRETER_KERNELS`], or a
/// custom-op `call` (which only the interpreter can run).
pub fn expected_fallback(op: &str, how: Fallback) -> bool {
    match how {
        Fallback::InterpreterKernel => INTERPRETER_KERNELS.contains(&op),
        Fallback::Interpreted => op == "call",
    }
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Executable {
    /// Compiles `func` (verified; after the pass pipeline, so that its kernels are `fused`
    /// regions). Kernels the JIT cannot compile run in the interpreter.
    pub fn new(func: &Function) -> Executable {
        let schedule = Schedule::new(func);
        if settings::debug_level() >= 1 {
            for reason in &schedule.fallbacks {
                eprintln!("kiln: interpreted instead of compiled: {reason}");
            }
        }
        let steps = schedule.steps.len();
        let print_profile = settings::profile_rows();
        let mut result_slots = Vec::new();
        for step in &schedule.steps {
            for (out, &value) in step.out.iter().zip(&step.outputs) {
                if let Output::Slot(slot) | Output::InPlace { slot, .. } = *out
                    && let Some(position) = func.results().iter().position(|&r| r == value)
                {
                    result_slots.push((position, slot));
                }
            }
        }
        let packs_weights = packs_weights(func, &schedule);
        Executable {
            func: func.clone(),
            packs_weights,
            schedule,
            result_slots,
            runtime: Mutex::new(None),
            counters: Counters::default(),
            threads: true,
            profile: (print_profile > 0).then(|| Mutex::new(vec![Default::default(); steps])),
            print_profile,
        }
    }

    /// Whether kernels and matrix products may use more than one thread (default: yes).
    pub fn with_threads(mut self, threads: bool) -> Executable {
        self.threads = threads;
        self
    }

    /// The function the executable runs.
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// The programs of compiled control-flow regions.
    fn regions(&self) -> impl Iterator<Item = &Executable> {
        self.schedule.steps.iter().flat_map(|s| match &s.kind {
            StepKind::While { cond, body, .. } => vec![&**cond, &**body],
            StepKind::Cond { branches, .. } => branches.iter().map(|b| &**b).collect(),
            _ => Vec::new(),
        })
    }

    /// The steps (its compiled regions' included) that do not run native code: each one's op
    /// and how it runs instead. A test asserts that every one is expected (see
    /// [`INTERPRETER_KERNELS`]), so that nothing falls back to the interpreter unseen.
    pub fn fallbacks(&self) -> Vec<(&'static str, Fallback)> {
        let own = self.schedule.steps.iter().filter_map(|s| {
            let op = self.func.inst(s.inst).op.name();
            match s.kind {
                StepKind::InterpreterKernel => Some((op, Fallback::InterpreterKernel)),
                StepKind::Interpret => Some((op, Fallback::Interpreted)),
                _ => None,
            }
        });
        let mut all: Vec<_> = own.collect();
        all.extend(self.regions().flat_map(Executable::fallbacks));
        all
    }

    /// What the executable has done so far: allocations, reuses, in-place writes (the counts
    /// include those of its compiled control-flow regions).
    pub fn stats(&self) -> ExecStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let regions: Vec<ExecStats> = self.regions().map(Executable::stats).collect();
        let sum = |f: fn(&ExecStats) -> u64| regions.iter().map(f).sum::<u64>();
        ExecStats {
            runs: get(&c.runs),
            allocations: get(&c.allocations) + sum(|r| r.allocations),
            reuses: get(&c.reuses) + sum(|r| r.reuses),
            in_place: get(&c.in_place) + sum(|r| r.in_place),
            interpreted: get(&c.interpreted) + sum(|r| r.interpreted),
            epilogues_run: get(&c.epilogues_run) + sum(|r| r.epilogues_run),
            weights_packed: get(&c.weights_packed) + sum(|r| r.weights_packed),
            steps: self.schedule.steps.len(),
            kernels: (self.schedule.steps.iter())
                .filter(|s| matches!(s.kind, StepKind::Kernel { .. }))
                .count()
                + regions.iter().map(|r| r.kernels).sum::<usize>(),
            slots: self.schedule.slots.len(),
            kept_argmax: self.schedule.kept_argmax,
            epilogues: (self.schedule.steps.iter())
                .filter(|s| matches!(s.kind, StepKind::Conv2d { epilogue: true, .. }))
                .count(),
        }
    }

    /// Runs the function on `args`, reading and (when it succeeds) writing `state`; `interp`
    /// runs the steps that are not compiled (with its custom ops and random-number counter).
    /// With `retain_results`, the results' buffers stay known to the executable, which reuses
    /// each one in a later run if the caller has dropped it by then.
    pub fn run(
        &self,
        args: Vec<Arc<Array>>,
        state: &mut StateStore,
        interp: &Interpreter<'_>,
        retain_results: bool,
    ) -> Result<Vec<Arc<Array>>, InterpError> {
        let _run = crate::limits::RunScope::enter();
        let _mode = crate::subnormals::ModeScope::for_run();
        let taken = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let mut rt = taken.unwrap_or_default();
        rt.arena.resize(self.schedule.slots.len(), None);
        rt.env.resize(self.func.num_values(), None);
        rt.kept_argmax
            .resize_with(self.schedule.kept_argmax, Default::default);
        // A kept argmax is this run's or none.
        rt.kept_argmax.iter_mut().for_each(|k| k.valid = false);
        rt.communicating.clear();
        rt.communicating
            .resize_with(self.schedule.steps.len(), || None);
        rt.packed.resize_with(self.schedule.steps.len(), || None);
        // A run that failed between a convolution and its epilogue's step left this set.
        rt.epilogue_ran = false;
        let result = self.run_in(&mut rt, args, state, interp, retain_results);
        rt.env.iter_mut().for_each(|v| *v = None);
        rt.communicating.clear();
        rt.stores.clear();
        rt.held.clear();
        rt.outputs.clear();
        if result.is_err() {
            Self::put_back(&mut rt.overwritten, state);
        }
        rt.overwritten.clear();
        *self.runtime.lock().unwrap_or_else(PoisonError::into_inner) = Some(rt);
        add(&self.counters.runs, 1);
        result
    }

    fn run_in(
        &self,
        rt: &mut Runtime,
        args: Vec<Arc<Array>>,
        state: &mut StateStore,
        interp: &Interpreter<'_>,
        retain_results: bool,
    ) -> Result<Vec<Arc<Array>>, InterpError> {
        self.bind(rt, &args)?;
        self.check_memory(rt)?;
        self.check_loads(state)?;
        for (&a, array) in self.func.args().iter().zip(args) {
            // Kernels read buffers in memory order: an argument in another layout (a
            // Fortran-ordered `.npy`, a transposed view) is laid out row-major first.
            rt.env[a.index()] = Some(Array::standard_shared(array));
        }
        let mut bindings: Option<SymbolBindings> = None;
        for (index, step) in self.schedule.steps.iter().enumerate() {
            let started = self.profile.as_ref().map(|_| std::time::Instant::now());
            let awaits_itself = step.awaits.contains(&index);
            self.finish_communication(rt, step.awaits.iter().filter(|&&k| k != index))?;
            self.step(rt, index, state, interp, &mut bindings)?;
            if awaits_itself {
                self.finish_communication(rt, [&index].into_iter())?;
            }
            if let (Some(profile), Some(started)) = (&self.profile, started) {
                let mut p = profile.lock().unwrap_or_else(PoisonError::into_inner);
                p[index].0 += started.elapsed();
                p[index].1 += 1;
            }
            for &(v, slot) in &step.release {
                match (rt.env[v.index()].take(), slot) {
                    (Some(array), Some(s)) if Arc::strong_count(&array) == 1 => {
                        rt.arena[s] = Some(array)
                    }
                    (Some(array), None) => {
                        if let Some(small) = Arc::into_inner(array).and_then(spare::keep) {
                            rt.dead.push(small);
                        }
                    }
                    _ => {}
                }
            }
        }
        // What is left serves the slots whose buffers leave as results (a loop body's
        // carried values): the next run then finds them there.
        for array in rt.dead.drain(..) {
            let empty = (0..rt.arena.len())
                .find(|&s| rt.arena[s].is_none() && self.schedule.slots[s] == array.dtype());
            if let Some(s) = empty {
                rt.arena[s] = Some(Arc::new(array));
            }
        }
        let results: Vec<Arc<Array>> = (self.func.results().iter())
            .map(|v| rt.env[v.index()].clone().expect("a computed result"))
            .collect();
        for (name, value, recycle) in rt.stores.drain(..) {
            let old = state.replace_shared(name, value);
            // The replaced buffer serves the stored value's slot in the next run.
            if let (Some(old), Some(slot)) = (old, recycle)
                && Arc::strong_count(&old) == 1
                && rt.arena[slot].is_none()
            {
                rt.arena[slot] = Some(old);
            }
        }
        if retain_results {
            for &(position, slot) in &self.result_slots {
                rt.arena[slot] = Some(results[position].clone());
            }
            let keep = RETURNED_PER_RESULT * self.result_slots.len();
            let excess = rt.returned.len().saturating_sub(keep);
            rt.returned.drain(..excess);
        }
        Ok(results)
    }

    /// Refuses the run if a value, or a convolution's scratch space, would pass the memory
    /// limit at the bound sizes (checked once
    /// per set of sizes, so a warm step does no work here).
    fn check_memory(&self, rt: &mut Runtime) -> Result<(), InterpError> {
        if rt.checked_sizes.as_ref() == Some(&rt.sizes) {
            return Ok(());
        }
        let symbols = &self.schedule.symbols;
        let sizes = &rt.sizes;
        let size = |s: &kiln_ir::Symbol| {
            let i = symbols.iter().position(|x| x == s)?;
            usize::try_from(sizes[i]).ok()
        };
        crate::limits::check_function(&self.func, size)?;
        crate::limits::check_live(&self.func, size)?;
        for step in &self.schedule.steps {
            if let StepKind::Conv2d { kind, attrs, .. } = &step.kind {
                self.check_conv_scratch(step, *kind, attrs, size)?;
            }
        }
        rt.checked_sizes = Some(rt.sizes.clone());
        Ok(())
    }

    /// Checks the arguments against the function's types and binds the symbols' sizes.
    fn bind(&self, rt: &mut Runtime, args: &[Arc<Array>]) -> Result<(), InterpError> {
        let func = &self.func;
        if args.len() != func.args().len() {
            return Err(InterpError::ArgCount {
                func: func.name().to_owned(),
                expected: func.args().len(),
                found: args.len(),
            });
        }
        let mut bindings = kiln_ir::SymbolBindings::new();
        for (&a, array) in func.args().iter().zip(args) {
            let expected = func.value_type(a);
            array
                .check_fits(expected, &mut bindings)
                .map_err(|reason| InterpError::ArgMismatch {
                    func: func.name().to_owned(),
                    arg: ValueNames::new(func).get(a),
                    expected: Box::new(expected.clone()),
                    found: Box::new(array.ty()),
                    reason,
                })?;
        }
        rt.sizes.clear();
        (rt.sizes).extend(
            (self.schedule.symbols.iter()).map(|s| bindings.get(s).map_or(-1, |&n| n as i64)),
        );
        if let Some(s) = rt.sizes.iter().position(|&n| n < 0) {
            return Err(self.fail(
                self.func.region(self.func.body()).insts[0],
                format!(
                    "symbol {} is not bound by the arguments",
                    self.schedule.symbols[s]
                ),
            ));
        }
        Ok(())
    }

    /// Every loaded state exists with its declared type (before anything runs, so that a
    /// failed load cannot follow an in-place update).
    fn check_loads(&self, state: &StateStore) -> Result<(), InterpError> {
        for step in &self.schedule.steps {
            let StepKind::Load { state: name } = &step.kind else {
                continue;
            };
            let ty = self.func.value_type(step.outputs[0]);
            let message = match state.get_shared(name) {
                None => format!("state @{name} has no value; initialize the state store first"),
                Some(v)
                    if v.dtype() != ty.dtype || Some(v.shape().to_vec()) != ty.shape.as_fixed() =>
                {
                    format!("state @{name} holds {}, but the IR loads {ty}", v.ty())
                }
                Some(_) => continue,
            };
            return Err(self.fail(step.inst, message));
        }
        Ok(())
    }

    fn fail(&self, inst: Inst, message: impl ToString) -> InterpError {
        let message = message.to_string();
        let data = self.func.inst(inst);
        InterpError::Op {
            func: self.func.name().to_owned(),
            op: data.op.name(),
            loc: data.loc,
            line: inst_line(&self.func, inst),
            message,
        }
    }

    /// A buffer for slot `slot`: the arena's when it is free and fits, else a new one.
    fn acquire(
        &self,
        rt: &mut Runtime,
        slot: usize,
        dtype: DType,
        recipe: &ShapeRecipe,
    ) -> Arc<Array> {
        recipe.resolve_into(&rt.sizes, &mut rt.shape);
        let len: usize = rt.shape.iter().product();
        if let Some(mut array) = rt.arena[slot].take() {
            if let Some(a) = Arc::get_mut(&mut array)
                && a.dtype() == dtype
                && a.len() == len
            {
                a.reshape_in_place(&rt.shape);
                add(&self.counters.reuses, 1);
                return array;
            }
            // A result of an earlier run that its caller still holds: it waits for the
            // caller to drop it.
            if Arc::strong_count(&array) > 1 {
                rt.returned.push(array);
            }
        }
        if let Some(i) = (rt.returned.iter_mut())
            .position(|r| Arc::get_mut(r).is_some_and(|a| a.dtype() == dtype && a.len() == len))
        {
            let mut array = rt.returned.swap_remove(i);
            Arc::get_mut(&mut array)
                .expect("a dropped result")
                .reshape_in_place(&rt.shape);
            add(&self.counters.reuses, 1);
            return array;
        }
        if let Some(i) = (rt.dead.iter()).position(|a| a.dtype() == dtype && a.len() == len) {
            let mut array = rt.dead.swap_remove(i);
            array.reshape_in_place(&rt.shape);
            add(&self.counters.reuses, 1);
            return Arc::new(array);
        }
        if let Some(mut array) = spare::take(dtype, len) {
            array.reshape_in_place(&rt.shape);
            add(&self.counters.reuses, 1);
            return Arc::new(array);
        }
        add(&self.counters.allocations, 1);
        if settings::debug_level() >= 3 {
            eprintln!(
                "kiln: @{} allocates slot {slot}: {dtype}{:?}",
                self.func.name(),
                rt.shape
            );
        }
        let mut array = Array::zeros(dtype, &rt.shape);
        advise_huge_pages(&mut array);
        Arc::new(array)
    }

    fn value(rt: &Runtime, v: Value) -> &Arc<Array> {
        rt.env[v.index()]
            .as_ref()
            .expect("an operand computed before its use")
    }

    /// Runs one step of the schedule.
    fn step(
        &self,
        rt: &mut Runtime,
        index: usize,
        state: &mut StateStore,
        interp: &Interpreter<'_>,
        bindings: &mut Option<SymbolBindings>,
    ) -> Result<(), InterpError> {
        let step = &self.schedule.steps[index];
        match &step.kind {
            StepKind::Kernel { .. } if std::mem::take(&mut rt.epilogue_ran) => {}
            StepKind::Kernel { kernel, symbols } => {
                self.run_kernel(rt, step, state, kernel, symbols)?
            }
            StepKind::MatMul {
                transpose_a,
                transpose_b,
                views,
                written_through,
                onto,
            } => {
                let operands = matmul::Operands {
                    transposed: [*transpose_a, *transpose_b],
                    written_through: written_through.as_deref(),
                    views: views.each_ref().map(|view| matmul::View {
                        shape: view.shape.as_ref().map(|r| {
                            let mut shape = Vec::new();
                            r.resolve_into(&rt.sizes, &mut shape);
                            shape
                        }),
                        perm: view.perm.as_deref(),
                    }),
                };
                #[cfg(debug_assertions)]
                let through_view = (views.iter()).any(|v| v.shape.is_some() || v.perm.is_some());
                match onto {
                    None => self.two_operands_into_slot(rt, step, |a, b, out, threads| {
                        matmul::matmul(a, b, out, operands, None, threads);
                        #[cfg(debug_assertions)]
                        if through_view {
                            fault::apply_to_view_product(out);
                        }
                    }),
                    Some(scale) => self.run_matmul_onto(rt, step, state, operands, *scale),
                }
            }
            StepKind::Conv2d {
                kind,
                attrs,
                epilogue,
            } => {
                let packed = self.packed_weights(rt, index);
                if !(*epilogue && self.run_conv_with_epilogue(rt, index, state, packed.as_ref())) {
                    self.two_operands_into_slot(rt, step, |a, b, out, threads| {
                        let packed = packed.as_ref().map(|p| &p.weights);
                        conv::conv2d(*kind, attrs, [a, b], packed, out, threads, None)
                    })
                }
                rt.packed[index] = packed;
            }
            StepKind::Pool2d {
                kind,
                attrs,
                argmax,
            } => self.run_pool(rt, step, *kind, attrs, *argmax),
            StepKind::Reshape => self.run_reshape(rt, step),
            StepKind::Const { value, shape, made } => {
                let array = made.get_or_init(|| {
                    Arc::new(Array::from_literal(value, shape).expect("a literal of its shape"))
                });
                rt.env[step.outputs[0].index()] = Some(array.clone());
            }
            StepKind::Load { state: name } => {
                let value = state.get_shared(name).expect("a checked load").clone();
                rt.env[step.outputs[0].index()] = Some(value);
            }
            StepKind::Store {
                state: name,
                recycle,
            } => {
                let value = Self::value(rt, step.inputs[0]).clone();
                rt.stores.push((name.clone(), value, *recycle));
            }
            StepKind::Native => self.run_native(rt, step, interp, state)?,
            StepKind::InterpreterKernel => self.run_interpreter_kernel(rt, step, interp)?,
            StepKind::Communicate => self.start_communication(rt, step, index)?,
            StepKind::While { cond, body, .. } => {
                self.run_while(rt, step, [cond, body], state, interp)?
            }
            StepKind::Cond { branches, .. } => self.run_cond(rt, step, branches, state, interp)?,
            StepKind::Interpret => self.run_interpreted(rt, step, state, interp, bindings)?,
        }
        Ok(())
    }

    /// A compiled kernel: its buffers acquired (outputs in place where the plan allows), the
    /// call, and its outputs and scratch put back.
    fn run_kernel(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        kernel: &crate::jit::Kernel,
        symbols: &[usize],
    ) -> Result<(), InterpError> {
        let scratch_start = self.kernel_buffers(rt, step, state, symbols);
        // SAFETY: the pointers are the kernel's inputs, outputs and scratch, in its
        // ABI order, each a contiguous array of its value's type under these sizes.
        // Outputs and scratch are buffers no one else holds; an output shares an
        // input's buffer only where the plan allows it (`can_update_in_place`).
        let status = unsafe { kernel.execute(&rt.pointers, &rt.kernel_sizes, self.threads) };
        #[cfg(debug_assertions)]
        fault::apply(&self.func, step.inst, &mut rt.outputs[..step.out.len()]);
        self.kernel_done(rt, step, state, scratch_start);
        if let Err(status) = status {
            return Err(self.fail(
                step.inst,
                format!("{} (in a compiled kernel)", status.message()),
            ));
        }
        Ok(())
    }

    /// Runs convolution step `index` with the next step's kernel as its epilogue
    /// (`schedule/pairing.rs`): the kernel's buffers are taken first, then the kernel runs
    /// on each run of samples as the convolution writes them. False, with nothing done, when
    /// the kernel's rows do not split by samples at these sizes.
    /// Step `index`'s convolution weights packed for its kernel: those of an earlier run while
    /// the loaded array is the same one, else packed now (when the step keeps them at all).
    fn packed_weights(&self, rt: &mut Runtime, index: usize) -> Option<Packed> {
        if !self.packs_weights[index] {
            return None;
        }
        let step = &self.schedule.steps[index];
        let StepKind::Conv2d { kind, attrs, .. } = &step.kind else {
            unreachable!("only convolutions pack weights")
        };
        let w = Self::value(rt, step.inputs[1]).clone();
        if let Some(kept) = rt.packed[index]
            .take()
            .filter(|k| Arc::ptr_eq(&k.source, &w))
        {
            return Some(kept);
        }
        step.shapes[0].resolve_into(&rt.sizes, &mut rt.shape);
        let shapes = [
            Self::value(rt, step.inputs[0]).shape(),
            w.shape(),
            &rt.shape,
        ];
        let weights = conv::packed_weights(*kind, attrs, shapes, &w)?;
        add(&self.counters.weights_packed, 1);
        Some(Packed { source: w, weights })
    }

    fn run_conv_with_epilogue(
        &self,
        rt: &mut Runtime,
        index: usize,
        state: &mut StateStore,
        packed: Option<&Packed>,
    ) -> bool {
        let (step, next) = (&self.schedule.steps[index], &self.schedule.steps[index + 1]);
        let (StepKind::Conv2d { kind, attrs, .. }, StepKind::Kernel { kernel, symbols }) =
            (&step.kind, &next.kind)
        else {
            unreachable!("a convolution paired with a kernel")
        };
        let Output::Slot(slot) = step.out[0] else {
            unreachable!("a paired convolution writes a slot")
        };
        rt.kernel_sizes.clear();
        rt.kernel_sizes.extend(symbols.iter().map(|&s| rt.sizes[s]));
        let stage = &kernel.plan.stages[0];
        let rows = stage.rows(&kernel.plan, &rt.kernel_sizes) as usize;
        let row_len = stage.row_len(&kernel.plan, &rt.kernel_sizes) as usize;
        step.shapes[0].resolve_into(&rt.sizes, &mut rt.shape);
        let (samples, len) = (rt.shape[0], rt.shape.iter().product::<usize>());
        // Chunks of no elements are never handed to the callback.
        if len == 0 || !rows.is_multiple_of(samples) || rows * row_len != len {
            return false;
        }
        let y = step.outputs[0];
        let dtype = self.func.value_type(y).dtype;
        rt.env[y.index()] = Some(self.acquire(rt, slot, dtype, &step.shapes[0]));
        let scratch_start = self.kernel_buffers(rt, next, state, symbols);
        let operands = [0, 1].map(|k| Self::value(rt, step.inputs[k]).clone());
        let Runtime {
            env,
            outputs,
            pointers,
            kernel_sizes,
            ..
        } = &mut *rt;
        let y_at = pointers[next.inputs.iter().position(|&v| v == y).expect("read")];
        let target = match env[y.index()].as_mut() {
            Some(array) => array,
            // The kernel writes its output over the convolution's.
            None => (outputs.iter_mut())
                .find(|o| o.data_ptr().cast_mut() == y_at)
                .expect("the output written in place"),
        };
        let target = Arc::get_mut(target).expect("a buffer of the step's own");
        let addresses = Addresses(pointers, y_at);
        let (per_sample, sample_bytes) = (rows / samples, len / samples * dtype.size_bytes());
        let written = |run: std::ops::Range<usize>, at: *mut u8| {
            // The convolution's output as the chunk's own slice gives it.
            let buffers = addresses.with_output_at(at.wrapping_sub(run.start * sample_bytes));
            let rows = (run.start * per_sample) as i64..(run.end * per_sample) as i64;
            // SAFETY: the kernel's buffers as `kernel_buffers` took them, the convolution's
            // output addressed through the run's slice; the runs' rows are disjoint, and the
            // kernel's rows read and write only their own samples.
            let done =
                unsafe { kernel.execute_rows(&buffers[..addresses.0.len()], kernel_sizes, rows) };
            done.expect("an epilogue kernel cannot fail");
        };
        let [a, b] = &operands;
        let packed = packed.map(|p| &p.weights);
        conv::conv2d(
            *kind,
            attrs,
            [a, b],
            packed,
            target,
            self.threads,
            Some(&written),
        );
        #[cfg(debug_assertions)]
        fault::apply(&self.func, next.inst, &mut rt.outputs[..next.out.len()]);
        self.kernel_done(rt, next, state, scratch_start);
        add(&self.counters.epilogues_run, 1);
        rt.epilogue_ran = true;
        true
    }

    /// Fills `rt.pointers` with the kernel's inputs, outputs and scratch in its ABI order and
    /// `rt.kernel_sizes` with its sizes; returns where the scratch starts in `rt.outputs`.
    fn kernel_buffers(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        symbols: &[usize],
    ) -> usize {
        rt.kernel_sizes.clear();
        rt.kernel_sizes.extend(symbols.iter().map(|&s| rt.sizes[s]));
        rt.pointers.clear();
        for &v in &step.inputs {
            rt.pointers.push(Self::value(rt, v).data_ptr().cast_mut());
        }
        rt.over_input.clear();
        for k in 0..step.out.len() {
            let (array, in_place) = self.kernel_output(rt, step, state, k);
            rt.over_input.push(in_place);
            rt.outputs.push(array);
        }
        for (k, array) in rt.outputs.iter_mut().enumerate() {
            let ptr = Arc::get_mut(array)
                .expect("a kernel's output buffer is its own")
                .data_mut_ptr();
            if rt.over_input[k]
                && let Output::InPlace { input, .. } | Output::State { input, .. } = step.out[k]
            {
                // The input is read through the same pointer the output is written by.
                rt.pointers[input] = ptr;
                add(&self.counters.in_place, 1);
            }
            rt.pointers.push(ptr);
        }
        let scratch_start = rt.outputs.len();
        for (s, recipe) in &step.scratch {
            let dtype = self.schedule.slots[*s];
            let array = self.acquire(rt, *s, dtype, recipe);
            rt.outputs.push(array);
        }
        for array in &mut rt.outputs[scratch_start..] {
            let ptr = Arc::get_mut(array)
                .expect("scratch is the kernel's own")
                .data_mut_ptr();
            rt.pointers.push(ptr);
        }
        scratch_start
    }

    /// The buffer kernel output `k` is written to, and whether it is its input's own buffer
    /// (updated in place); an input someone else still holds is kept alive in `rt.held`.
    fn kernel_output(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        k: usize,
    ) -> (Arc<Array>, bool) {
        let dtype = self.func.value_type(step.outputs[k]).dtype;
        match &step.out[k] {
            Output::Slot(s) => (self.acquire(rt, *s, dtype, &step.shapes[k]), false),
            Output::InPlace { input, slot } => {
                let mut array = rt.env[step.inputs[*input].index()]
                    .take()
                    .expect("a live input");
                if Arc::get_mut(&mut array).is_some() {
                    (array, true)
                } else {
                    rt.held.push(array);
                    (self.acquire(rt, *slot, dtype, &step.shapes[k]), false)
                }
            }
            Output::State {
                input,
                state: name,
                slot,
            } => {
                rt.env[step.inputs[*input].index()] = None;
                let mut array = state.remove(name).expect("a checked load");
                if Arc::get_mut(&mut array).is_some() {
                    (array, true)
                } else {
                    rt.pointers[*input] = array.data_ptr().cast_mut();
                    rt.held.push(array.clone());
                    state.insert_shared(name.clone(), array);
                    (self.acquire(rt, *slot, dtype, &step.shapes[k]), false)
                }
            }
            Output::External => unreachable!("kernels write slots"),
        }
    }

    /// Returns the scratch to its slots and binds the outputs (and state updated in place).
    fn kernel_done(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        scratch_start: usize,
    ) {
        rt.pointers.clear();
        rt.held.clear();
        let scratch: Vec<Arc<Array>> = rt.outputs.drain(scratch_start..).collect();
        for ((s, _), array) in step.scratch.iter().zip(scratch) {
            rt.arena[*s] = Some(array);
        }
        for (k, array) in rt.outputs.drain(..).enumerate() {
            if let Output::State { state: name, .. } = &step.out[k]
                && state.get_shared(name).is_none()
            {
                state.insert_shared(name.clone(), array.clone());
            }
            rt.env[step.outputs[k].index()] = Some(array);
        }
    }

    /// `w + scale·(a·b)` for inputs `a, b, w`: over `w`'s buffer when the step may take it
    /// (a parameter's update in place), else over a copy of `w`.
    fn run_matmul_onto(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        operands: matmul::Operands,
        scale: f64,
    ) {
        let (a, b) = (
            Self::value(rt, step.inputs[0]).clone(),
            Self::value(rt, step.inputs[1]).clone(),
        );
        // `kernel_output` redirects a kernel's read of a shared state through these; a
        // product reads its operands directly, so they only need to exist.
        rt.pointers.clear();
        rt.pointers.resize(step.inputs.len(), std::ptr::null_mut());
        let mut out = self.output_over_input(rt, step, state, 2);
        let target = Arc::get_mut(&mut out).expect("the step's own buffer");
        matmul::matmul(&a, &b, target, operands, Some(scale), self.threads);
        rt.outputs.push(out);
        self.kernel_done(rt, step, state, 1);
    }

    /// Refuses a convolution whose scratch space would pass the memory limit at the sizes
    /// `size` gives the symbols (checked with the values', once per set of sizes).
    fn check_conv_scratch(
        &self,
        step: &Step,
        kind: ConvKind,
        attrs: &Conv2dAttrs,
        size: impl Fn(&kiln_ir::Symbol) -> Option<usize>,
    ) -> Result<(), InterpError> {
        let shape = |v: Value| -> Vec<usize> {
            (self.func.value_type(v).shape.dims().iter())
                .map(|d| match d {
                    kiln_ir::Dim::Fixed(n) => *n,
                    kiln_ir::Dim::Sym(s) => size(s).unwrap_or(0),
                })
                .collect()
        };
        let [a, b, out] = [step.inputs[0], step.inputs[1], step.outputs[0]].map(shape);
        let dtype = self.func.value_type(step.outputs[0]).dtype;
        let (bytes, [rows, cols]) = conv::scratch(kind, attrs, [&a, &b, &out], dtype.size_bytes())
            .map_err(|message| self.fail(step.inst, message))?;
        if bytes <= u128::from(crate::limits::memory_limit()) {
            return Ok(());
        }
        let patch_matrix = Type::new(
            dtype,
            Shape::fixed(&[rows.min(usize::MAX as u128) as usize, cols as usize]),
        );
        let what = format!(
            "the scratch space of {} (patch matrix, offsets, channels-last image)",
            inst_line(&self.func, step.inst)
        );
        Ok(crate::limits::check_bytes(&what, &patch_matrix, bytes)?)
    }

    /// A pooling op (or its gradient) by direct loops into a slot's buffer, recording or
    /// reading the argmax `argmax` names.
    fn run_pool(
        &self,
        rt: &mut Runtime,
        step: &Step,
        kind: PoolKind,
        attrs: &Pool2dAttrs,
        argmax: Option<usize>,
    ) {
        let Output::Slot(s) = step.out[0] else {
            unreachable!("pooling writes a slot")
        };
        let dtype = self.func.value_type(step.outputs[0]).dtype;
        let mut out = self.acquire(rt, s, dtype, &step.shapes[0]);
        let mut kept = std::mem::take(&mut rt.kept_argmax);
        let args: Vec<&Array> = step.inputs.iter().map(|&v| &**Self::value(rt, v)).collect();
        let target = Arc::get_mut(&mut out).expect("a fresh or free buffer");
        let argmax = Kept::of(&mut kept, argmax, kind == PoolKind::Max);
        pool::pool2d(kind, attrs, &args, target, self.threads, argmax);
        rt.kept_argmax = kept;
        rt.env[step.outputs[0].index()] = Some(out);
    }

    /// Runs `compute(a, b, out, threads)` for a step of two operands and one output slot.
    fn two_operands_into_slot(
        &self,
        rt: &mut Runtime,
        step: &Step,
        compute: impl FnOnce(&Array, &Array, &mut Array, bool),
    ) {
        let Output::Slot(s) = step.out[0] else {
            unreachable!("the step writes a slot")
        };
        let dtype = self.func.value_type(step.outputs[0]).dtype;
        let mut out = self.acquire(rt, s, dtype, &step.shapes[0]);
        let (a, b) = (
            Self::value(rt, step.inputs[0]),
            Self::value(rt, step.inputs[1]),
        );
        let target = Arc::get_mut(&mut out).expect("a fresh or free buffer");
        compute(a, b, target, self.threads);
        rt.env[step.outputs[0].index()] = Some(out);
    }

    /// A reshape: the input's buffer renamed when no one else holds it, else a copy.
    fn run_reshape(&self, rt: &mut Runtime, step: &Step) {
        let dtype = self.func.value_type(step.outputs[0]).dtype;
        let out = match step.out[0] {
            Output::InPlace { slot, .. } => {
                let mut array = rt.env[step.inputs[0].index()].take().expect("a live input");
                step.shapes[0].resolve_into(&rt.sizes, &mut rt.shape);
                if let Some(a) = Arc::get_mut(&mut array) {
                    a.reshape_in_place(&rt.shape);
                    array
                } else {
                    let mut copy = self.acquire(rt, slot, dtype, &step.shapes[0]);
                    Arc::get_mut(&mut copy)
                        .expect("a fresh buffer")
                        .copy_elements_from(&array);
                    copy
                }
            }
            Output::Slot(slot) => {
                let mut copy = self.acquire(rt, slot, dtype, &step.shapes[0]);
                let input = Self::value(rt, step.inputs[0]);
                Arc::get_mut(&mut copy)
                    .expect("a fresh buffer")
                    .copy_elements_from(input);
                copy
            }
            _ => unreachable!("a reshape writes a slot"),
        };
        rt.env[step.outputs[0].index()] = Some(out);
    }

    /// `one_hot` written into a slot's buffer.
    /// `gather`, `scatter_add`, `one_hot` or a random draw, written into its planned buffer by
    /// the interpreter's own loops (the `_into` kernels), so the results are the oracle's.
    fn run_native(
        &self,
        rt: &mut Runtime,
        step: &Step,
        interp: &Interpreter<'_>,
        state: &mut StateStore,
    ) -> Result<(), InterpError> {
        let op = &self.func.inst(step.inst).op;
        if let Op::UpdateSlice { axis } = op {
            return self.run_update_slice(rt, step, *axis, state);
        }
        let Output::Slot(slot) = step.out[0] else {
            unreachable!("a native step writes a slot")
        };
        let dtype = self.func.value_type(step.outputs[0]).dtype;
        let mut out = self.acquire(rt, slot, dtype, &step.shapes[0]);
        let target = Arc::get_mut(&mut out).expect("a fresh or free buffer");
        let arg = |k: usize| &**Self::value(rt, step.inputs[k]);
        let done = match op {
            Op::OneHot { depth, .. } => kernels::one_hot_into(arg(0), *depth, target),
            Op::Transpose { perm } => kernels::transpose_into(arg(0), perm, target),
            Op::Concat { axis } => {
                let args: Vec<&Array> = (0..step.inputs.len()).map(arg).collect();
                kernels::concat_into(&args, *axis, target)
            }
            Op::Gather { axis } => kernels::gather_into(arg(0), arg(1), *axis, target),
            Op::ScatterAdd { axis, .. } => kernels::scatter_add_into(arg(0), arg(1), *axis, target),
            Op::Random { dist, seed, .. } => {
                let stream = crate::random::Stream::new(*seed, interp.rng_counter());
                kernels::random_into(*dist, stream, target);
                Ok(())
            }
            other => unreachable!("`{}` is not a native step", other.name()),
        };
        done.map_err(|m| self.fail(step.inst, m))?;
        rt.env[step.outputs[0].index()] = Some(out);
        Ok(())
    }

    /// Output 0 of `step`, holding input `j`'s values: input `j`'s own buffer when the step
    /// may take it and no one else holds it, else a copy of it.
    fn output_over_input(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        j: usize,
    ) -> Arc<Array> {
        let (mut out, in_place) = self.kernel_output(rt, step, state, 0);
        if in_place {
            add(&self.counters.in_place, 1);
        } else {
            // The input is still bound, or held aside when it was shared.
            let source = match step.out[0] {
                Output::Slot(_) => Self::value(rt, step.inputs[j]),
                _ => rt.held.last().expect("the shared input"),
            };
            Arc::get_mut(&mut out)
                .expect("a fresh or free buffer")
                .assign(source);
        }
        out
    }

    /// `update_slice`: in place over the array when its buffer is free (O(slice)), else a copy
    /// of it with the slice written.
    /// Over a state's own buffer (taken out of the store while it is written), the slice it
    /// overwrites is kept first ([`Overwritten`]) and the buffer goes back to the store.
    fn run_update_slice(
        &self,
        rt: &mut Runtime,
        step: &Step,
        axis: usize,
        state: &mut StateStore,
    ) -> Result<(), InterpError> {
        let value = Self::value(rt, step.inputs[1]).clone();
        let index = Self::value(rt, step.inputs[2]).clone();
        let mut out = self.output_over_input(rt, step, state, 0);
        let over_state = match &step.out[0] {
            Output::State { state: name, .. } if state.get_shared(name).is_none() => Some(name),
            _ => None,
        };
        let target = Arc::get_mut(&mut out).expect("a fresh or free buffer");
        let kept = match over_state {
            Some(name) => kernels::slice_at(target, &index, axis).map(|old| {
                let (state, index) = (name.clone(), (*index).clone());
                rt.overwritten.push(Overwritten {
                    state,
                    old,
                    index,
                    axis,
                })
            }),
            None => Ok(()),
        };
        // Both kernels check everything before they write: on an error nothing changed.
        let done = kept.and_then(|()| kernels::update_slice_in_place(target, &value, &index, axis));
        if let Some(name) = over_state {
            state.insert_shared(name.clone(), out.clone());
        }
        rt.held.clear();
        done.map_err(|m| self.fail(step.inst, m))?;
        rt.env[step.outputs[0].index()] = Some(out);
        Ok(())
    }

    /// Writes the slices a failed run's `update_slice` steps overwrote in state back, the
    /// last first.
    fn put_back(overwritten: &mut Vec<Overwritten>, state: &mut StateStore) {
        for o in overwritten.drain(..).rev() {
            if let Some(array) = state.get_shared_mut(&o.state) {
                let array = Arc::make_mut(array);
                kernels::update_slice_in_place(array, &o.old, &o.index, o.axis)
                    .expect("the slice it was taken from");
            }
        }
    }

    /// An op the interpreter's kernels compute directly on the operands' arrays.
    fn run_interpreter_kernel(
        &self,
        rt: &mut Runtime,
        step: &Step,
        interp: &Interpreter<'_>,
    ) -> Result<(), InterpError> {
        let args: Vec<&Array> = step.inputs.iter().map(|&v| &**Self::value(rt, v)).collect();
        let shapes = Self::output_shapes(rt, step);
        let op = &self.func.inst(step.inst).op;
        let results = interp
            .eval_op(op, &args, &shapes)
            .map_err(|m| self.fail(step.inst, m))?;
        for ((&v, array), shape) in step.outputs.iter().zip(results).zip(&shapes) {
            let ty = self.func.value_type(v);
            if array.dtype() != ty.dtype || array.shape() != shape.as_slice() {
                let message = format!(
                    "computed {} where the IR says {ty} (= {shape:?})",
                    array.ty()
                );
                return Err(self.fail(step.inst, message));
            }
            rt.env[v.index()] = Some(Arc::new(array));
        }
        add(&self.counters.interpreted, 1);
        Ok(())
    }

    /// The shapes of `step`'s outputs at this run's sizes.
    fn output_shapes(rt: &Runtime, step: &Step) -> Vec<Vec<usize>> {
        (step.shapes.iter())
            .map(|r| {
                let mut shape = Vec::new();
                r.resolve_into(&rt.sizes, &mut shape);
                shape
            })
            .collect()
    }

    /// Starts a communication op with this step's operands.
    fn start_communication(
        &self,
        rt: &mut Runtime,
        step: &Step,
        index: usize,
    ) -> Result<(), InterpError> {
        // An operand whose last use this is, held nowhere else, is handed over: an all-reduce
        // then works in its buffer.
        let owned: Vec<Option<Array>> = (step.inputs.iter())
            .map(|&v| Self::take_dying(rt, step, v))
            .collect();
        let args: Vec<Cow<'_, Array>> = (owned.into_iter().zip(&step.inputs))
            .map(|(own, &v)| match own {
                Some(array) => Cow::Owned(array),
                None => Cow::Borrowed(&**Self::value(rt, v)),
            })
            .collect();
        let shapes = Self::output_shapes(rt, step);
        let op = &self.func.inst(step.inst).op;
        let started = crate::comm::start(op, args, &shapes).map_err(|m| self.fail(step.inst, m))?;
        rt.communicating[index] = Some(started);
        Ok(())
    }

    /// `v`'s array, taken out of the environment, if this step is its last use, it is read
    /// once here, and nothing else holds it.
    fn take_dying(rt: &mut Runtime, step: &Step, v: Value) -> Option<Array> {
        let dies_here = step.release.iter().any(|&(r, _)| r == v);
        let read_once = step.inputs.iter().filter(|&&u| u == v).count() == 1;
        if !(dies_here && read_once) {
            return None;
        }
        match Arc::try_unwrap(rt.env[v.index()].take()?) {
            Ok(array) => Some(array),
            Err(shared) => {
                rt.env[v.index()] = Some(shared);
                None
            }
        }
    }

    /// Waits for the communication steps `awaits` started and binds their results.
    fn finish_communication<'a>(
        &self,
        rt: &mut Runtime,
        awaits: impl Iterator<Item = &'a usize>,
    ) -> Result<(), InterpError> {
        for &k in awaits {
            let comm_step = &self.schedule.steps[k];
            let started = rt.communicating[k].take().expect("a started communication");
            let results = started.wait().map_err(|m| self.fail(comm_step.inst, m))?;
            for (&v, array) in comm_step.outputs.iter().zip(results) {
                rt.env[v.index()] = Some(Arc::new(array));
            }
        }
        Ok(())
    }

    /// An instruction the interpreter runs whole (control flow, calls), with the run's sizes.
    fn run_interpreted(
        &self,
        rt: &mut Runtime,
        step: &Step,
        state: &mut StateStore,
        interp: &Interpreter<'_>,
        bindings: &mut Option<SymbolBindings>,
    ) -> Result<(), InterpError> {
        let bindings = bindings.get_or_insert_with(|| {
            (self.schedule.symbols.iter().cloned())
                .zip(rt.sizes.iter().map(|&n| n as usize))
                .collect()
        });
        let values: Env = (step.inputs.iter())
            .map(|&v| (v, Self::value(rt, v).clone()))
            .collect();
        let (results, stores) = interp.eval_inst(&self.func, step.inst, values, bindings, state)?;
        for (&v, array) in step.outputs.iter().zip(results) {
            rt.env[v.index()] = Some(array);
        }
        rt.stores
            .extend(stores.into_iter().map(|(name, value)| (name, value, None)));
        add(&self.counters.interpreted, 1);
        Ok(())
    }
}

/// Asks Linux to back a large new buffer with 2 MiB pages. A fresh 64 MiB output otherwise
/// takes 16,384 page faults on first touch, which cost more than the kernel that fills it.
/// The buffer is still untouched (zeroed memory comes from fresh mappings), so the advice
/// applies to every fault. Advice only: nothing changes if the kernel declines it.
fn advise_huge_pages(array: &mut Array) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = array.len() * array.dtype().size_bytes();
    if !cfg!(target_os = "linux") || bytes < 2 * HUGE_PAGE {
        return;
    }
    let start = array.data_mut_ptr() as usize;
    let aligned_start = start.next_multiple_of(HUGE_PAGE);
    let aligned_end = (start + bytes) / HUGE_PAGE * HUGE_PAGE;
    if aligned_end > aligned_start {
        // SAFETY: the range lies within the array's allocation; MADV_HUGEPAGE changes how
        // its pages are backed, never their contents.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}
