//! Process-wide run limits, as an embedding server sets them once at start: the memory one
//! value or the state may take, and the trips a `while` loop may make.
//!
//! A run that would pass a limit is refused with an error that names what asked for too much
//! — before anything is allocated where the sizes are known up front (state, and every value
//! once the arguments have bound the shapes' symbols), so a hostile program cannot abort the
//! process with an allocation failure.

use kiln_ir::{Dim, Function, Inst, Op, Region, Symbol, Type};
use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// A value or the state needs more memory than the limit allows.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what}: {held}, {bytes} bytes, more than the memory limit of {limit} bytes; the run \
     was refused before it started (raise the limit with `kiln run --memory-limit` or \
     `kiln_backend::limits::set_memory_limit`)"
)]
pub struct MemoryLimitExceeded {
    /// What asked for the memory: `state @w`, a value and its function, or the values a run
    /// holds at once at an instruction.
    pub what: String,
    /// What is held: a type, or how many values together.
    pub held: String,
    /// The bytes it needs.
    pub bytes: u128,
    /// The limit in force.
    pub limit: u64,
}

static MEMORY_LIMIT: AtomicU64 = AtomicU64::new(0);
static MAX_TRIPS: AtomicU64 = AtomicU64::new(u64::MAX);

/// The bytes one value, or all state together, may take: the machine's memory unless set.
pub fn memory_limit() -> u64 {
    match MEMORY_LIMIT.load(Ordering::Relaxed) {
        0 => machine_memory(),
        bytes => bytes,
    }
}

/// Sets [`memory_limit`]; `None` restores the default (the machine's memory).
pub fn set_memory_limit(bytes: Option<u64>) {
    MEMORY_LIMIT.store(bytes.map_or(0, |b| b.max(1)), Ordering::Relaxed);
}

/// The trips all `while` loops of one run may make together (nested loops count every inner
/// trip): unlimited unless set. A loop of exactly this many trips runs.
pub fn max_trips() -> u64 {
    MAX_TRIPS.load(Ordering::Relaxed)
}

/// Sets [`max_trips`]; `None` removes the limit.
pub fn set_max_trips(trips: Option<u64>) {
    MAX_TRIPS.store(trips.unwrap_or(u64::MAX), Ordering::Relaxed);
}

thread_local! {
    /// The run on this thread: how deeply runs nest (a compiled region is a run inside its
    /// program's, an interpreted instruction inside a compiled one) and the trips made since
    /// the outermost began.
    static RUN: Cell<(u32, u64)> = const { Cell::new((0, 0)) };
}

/// Marks a run on this thread while it lives; the outermost starts a fresh trip count.
pub(crate) struct RunScope(());

impl RunScope {
    pub(crate) fn enter() -> RunScope {
        RUN.with(|run| {
            let (depth, trips) = run.get();
            run.set((depth + 1, if depth == 0 { 0 } else { trips }));
        });
        RunScope(())
    }
}

impl Drop for RunScope {
    fn drop(&mut self) {
        RUN.with(|run| {
            let (depth, trips) = run.get();
            run.set((depth.saturating_sub(1), trips));
        });
    }
}

/// Counts one more trip of a loop of this thread's run: an error once the run's loops
/// together pass [`max_trips`].
pub(crate) fn count_trip() -> Result<(), String> {
    let max_trips = max_trips();
    RUN.with(|run| {
        let (depth, trips) = run.get();
        if trips >= max_trips {
            return Err(format!(
                "the loop did not end within {max_trips} trips (the run's loops together may \
                 make at most {max_trips}: the limit set with `kiln run --max-trips` or \
                 `kiln_backend::limits::set_max_trips`)"
            ));
        }
        run.set((depth, trips + 1));
        Ok(())
    })
}

/// The machine's memory (`MemTotal` in `/proc/meminfo`), or no limit where that is unknown.
pub fn machine_memory() -> u64 {
    static TOTAL: OnceLock<u64> = OnceLock::new();
    *TOTAL.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map_or(u64::MAX, |kb| kb.saturating_mul(1024))
    })
}

/// The bytes of a value of `ty` with its symbols sized by `size`, saturating.
pub fn bytes_of(ty: &Type, size: impl Fn(&Symbol) -> Option<usize>) -> u128 {
    ty.shape
        .dims()
        .iter()
        .fold(ty.dtype.size_bytes() as u128, |acc, d| {
            let n = match d {
                Dim::Fixed(n) => Some(*n),
                Dim::Sym(s) => size(s),
            };
            acc.saturating_mul(n.unwrap_or(1) as u128)
        })
}

/// An error if `bytes` (of `what`, a value of `ty`) pass the memory limit.
pub fn check_bytes(what: &str, ty: &Type, bytes: u128) -> Result<(), MemoryLimitExceeded> {
    let limit = memory_limit();
    if bytes <= u128::from(limit) {
        return Ok(());
    }
    Err(MemoryLimitExceeded {
        what: what.to_owned(),
        held: ty.to_string(),
        bytes,
        limit,
    })
}

/// Refuses a run of `func` in which some value, with the symbols sized by `size`, would pass
/// the memory limit. Values inside regions count too (a loop body's values exist per trip).
pub fn check_function(
    func: &Function,
    size: impl Fn(&Symbol) -> Option<usize>,
) -> Result<(), MemoryLimitExceeded> {
    let limit = u128::from(memory_limit());
    for (v, data) in func.all_values() {
        let bytes = bytes_of(&data.ty, &size);
        if bytes > limit {
            let name = func
                .value_name(v)
                .map_or(v.to_string(), |n| format!("%{n}"));
            return check_bytes(&format!("{name} in @{}", func.name()), &data.ty, bytes);
        }
    }
    Ok(())
}

/// Refuses a run of `func` that would hold more than the memory limit at once, with the
/// symbols sized by `size`: the arguments, then every value from its instruction to its last
/// use (a loop's or a branch's values while it runs), and an f32 reduction's f64 accumulator
/// — the interpreter's live set, which the compiled path's buffers do not pass. Twelve values
/// of 800 MB, each under the limit, are refused here before anything is allocated.
pub fn check_live(
    func: &Function,
    size: impl Fn(&Symbol) -> Option<usize>,
) -> Result<(), MemoryLimitExceeded> {
    let peak = peak_in(func, func.body(), &size);
    let limit = memory_limit();
    if peak.bytes <= u128::from(limit) {
        return Ok(());
    }
    let what = match peak.at {
        Some(inst) => format!(
            "@{}: the values live at once at `{}`",
            func.name(),
            kiln_ir::print::inst_line(func, inst)
        ),
        None => format!("@{}: its arguments", func.name()),
    };
    Err(MemoryLimitExceeded {
        what,
        held: format!("{} values together", peak.values),
        bytes: peak.bytes,
        limit,
    })
}

/// Refuses instruction `inst` of `func` (of static shapes) when its operands, its results
/// and what it holds while it runs (a region's values, an f64 accumulator) together pass the
/// memory limit: the check of an eager op, which runs alone.
pub fn check_inst(func: &Function, inst: Inst) -> Result<(), MemoryLimitExceeded> {
    let size = |_: &Symbol| None;
    let d = func.inst(inst);
    let bytes = |v| bytes_of(func.value_type(v), size);
    let inner = (d.regions.iter())
        .map(|&r| peak_in(func, r, &size).bytes)
        .max()
        .unwrap_or(0);
    let total = (d.args.iter().chain(&d.results))
        .map(|&v| bytes(v))
        .fold(inner, u128::saturating_add)
        .saturating_add(accumulator_bytes(func, inst, &size));
    let limit = memory_limit();
    if total <= u128::from(limit) {
        return Ok(());
    }
    Err(MemoryLimitExceeded {
        what: format!("`{}`", kiln_ir::print::inst_line(func, inst)),
        held: format!(
            "{} operands and results together",
            d.args.len() + d.results.len()
        ),
        bytes: total,
        limit,
    })
}

/// The most a region holds at once: bytes, how many values, and where.
#[derive(Clone, Copy, Default)]
struct Peak {
    bytes: u128,
    values: usize,
    at: Option<Inst>,
}

/// The most region `region` of `func` holds at once beyond the values that enter it from
/// outside — its arguments, then each value from its instruction to its last read
/// ([`Function::last_reads`], what the interpreter drops) — and where. Regions nest at most
/// [`kiln_ir::MAX_REGION_DEPTH`] deep, so the recursion is bounded.
fn peak_in(func: &Function, region: Region, size: &dyn Fn(&Symbol) -> Option<usize>) -> Peak {
    let data = func.region(region);
    let bytes = |v| bytes_of(func.value_type(v), size);
    let frees = func.last_reads(region);
    let mut live: u128 = data.args.iter().map(|&a| bytes(a)).sum();
    let mut count = data.args.len();
    let mut peak = Peak {
        bytes: live,
        values: count,
        at: None,
    };
    for (i, &inst) in data.insts.iter().enumerate() {
        let d = func.inst(inst);
        let outputs: u128 = d.results.iter().map(|&r| bytes(r)).sum();
        let inner = (d.regions.iter())
            .map(|&r| peak_in(func, r, size))
            .max_by_key(|p| p.bytes)
            .unwrap_or_default();
        let during = (live.saturating_add(outputs))
            .saturating_add(inner.bytes)
            .saturating_add(accumulator_bytes(func, inst, size));
        if during > peak.bytes {
            peak = Peak {
                bytes: during,
                values: count + d.results.len() + inner.values,
                at: Some(inst),
            };
        }
        live = live.saturating_add(outputs);
        count += d.results.len();
        let freed: u128 = frees[i].iter().map(|&v| bytes(v)).sum();
        live = live.saturating_sub(freed);
        count = count.saturating_sub(frees[i].len());
    }
    peak
}

/// The f64 accumulator the interpreter sums an f32 reduction's result in.
fn accumulator_bytes(func: &Function, inst: Inst, size: &dyn Fn(&Symbol) -> Option<usize>) -> u128 {
    let data = func.inst(inst);
    match data.op {
        Op::Reduce { .. } if func.value_type(data.results[0]).dtype == kiln_ir::DType::F32 => {
            bytes_of(func.value_type(data.results[0]), size).saturating_mul(2)
        }
        _ => 0,
    }
}
