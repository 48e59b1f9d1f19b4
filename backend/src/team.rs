//! The threads a kernel splits its work over: the calling thread and helpers that spin
//! between parallel regions instead of sleeping.
//!
//! Why not rayon's pool: its workers sleep a few microseconds after their last job, and
//! waking one is slow on the 2-core VMs: a 64×256×256 product split in two through
//! `rayon::join` took 51–111 µs (with 0–100 µs of other work between products), against 47
//! on one thread and 25–29 µs with a spinning helper. A
//! training step runs hundreds of short kernels, so the wake-up was paid every time. The
//! helpers here spin for [`SPIN`] after their last region — as OpenMP runtimes do — and park
//! after that, so an idle program does not hold a core.
//!
//! The caller claims tasks like the helpers do, so a region is never slower than running it
//! alone by more than the claims: a helper that is late (parked, or preempted) finds the
//! tasks taken. A region is opened by one thread at a time; a second thread that asks while
//! one is open (ranks of a local group, a nested region) runs its tasks on rayon's pool.
//!
//! Every task computes in the floating-point mode of the region's caller (whether subnormals
//! are flushed, [`crate::subnormals`]), on whichever thread it runs, so a result's bits do not
//! depend on the thread count.
use crate::subnormals::{Mode, ModeScope};
use rayon::prelude::*;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins after its last region before it parks.
pub const SPIN: Duration = Duration::from_millis(1);

/// Runs `task(i)` for every `i` in `0..count`, on the calling thread and as many helpers as
/// the caller's rayon pool has threads beyond it (so `RAYON_NUM_THREADS=1`, or a rank's
/// one-thread pool, keeps everything on the calling thread). Returns when every task has
/// returned; a task's panic is resumed on the caller.
pub fn for_each(count: usize, task: impl Fn(usize) + Sync) {
    let width = width();
    if count <= 1 || width <= 1 {
        (0..count).for_each(task);
        return;
    }
    let mode = Mode::current();
    if SHARED.open.swap(true, SeqCst) {
        (0..count).into_par_iter().for_each(|i| {
            let _mode = ModeScope::adopt(mode);
            task(i);
        });
        return;
    }
    let helpers = helpers();
    let job = Job {
        task: &task,
        mode,
        count,
        helpers: (width - 1).min(helpers.len()),
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    };
    // SAFETY (of the erased lifetime): the job is withdrawn, and no helper is inside it,
    // before this function returns (below).
    let erased = &job as *const Job<'_> as *mut Job<'static>;
    SHARED.job.store(erased, SeqCst);
    SHARED.generation.fetch_add(1, SeqCst);
    for helper in &helpers[..job.helpers] {
        if helper.parked.load(SeqCst) {
            helper.thread.unpark();
        }
    }
    job.work();
    wait_until(|| job.done.load(SeqCst) == count);
    SHARED.job.store(ptr::null_mut(), SeqCst);
    wait_until(|| SHARED.inside.load(SeqCst) == 0);
    SHARED.open.store(false, SeqCst);
    let panic = job.panic.lock().map(|mut p| p.take()).unwrap_or(None);
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// Calls `f(i, chunk)` on each `size`-element chunk of `data` (the last may be shorter),
/// through [`for_each`] when `threads` allows.
pub fn for_each_chunk<T: Send>(
    data: &mut [T],
    size: usize,
    threads: bool,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if size == 0 {
        return;
    }
    if !threads || data.len() <= size {
        data.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
        return;
    }
    // Each chunk is taken by exactly one task; the lock is never contended.
    let chunks: Vec<Mutex<&mut [T]>> = data.chunks_mut(size).map(Mutex::new).collect();
    for_each(chunks.len(), |i| {
        if let Ok(mut chunk) = chunks[i].lock() {
            f(i, &mut chunk)
        }
    });
}

/// Spins until `done` holds, yielding the core after a while (a helper that holds a task
/// may have been preempted: more threads than cores).
fn wait_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        spins = spins.saturating_add(1);
        if spins < 1 << 12 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// `0..len` in at most `parts` pieces, each a multiple of `multiple` long but the last: how
/// many, and the `i`th.
pub(crate) fn pieces(
    len: usize,
    parts: usize,
    multiple: usize,
) -> (usize, impl Fn(usize) -> std::ops::Range<usize>) {
    let size = len.div_ceil(parts.max(1)).next_multiple_of(multiple).max(1);
    (len.div_ceil(size), move |i| {
        i * size..((i + 1) * size).min(len)
    })
}

/// Starts the helpers and rayon's global pool if they are not running yet. A thread starts
/// with its parent's floating-point mode, so compiled runs call this before they change the
/// mode: no thread is born flushing subnormals for good.
pub(crate) fn start() {
    helpers();
    rayon::current_num_threads();
}

/// The threads a region opened here may use: the caller's rayon pool's width.
pub fn width() -> usize {
    rayon::current_num_threads()
}

/// One parallel region: `count` tasks, claimed one at a time.
struct Job<'t> {
    task: &'t (dyn Fn(usize) + Sync),
    /// The caller's floating-point mode, which the helpers take on.
    mode: Mode,
    count: usize,
    /// How many helpers may join (the first ones).
    helpers: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Job<'_> {
    /// Claims and runs tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, SeqCst);
            if i >= self.count {
                return;
            }
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| (self.task)(i)))
                && let Ok(mut slot) = self.panic.lock()
            {
                slot.get_or_insert(payload);
            }
            self.done.fetch_add(1, SeqCst);
        }
    }
}

/// What the caller and the helpers share.
struct Shared {
    /// The open region's job, or null.
    job: AtomicPtr<Job<'static>>,
    /// Bumped when a region opens: a helper joins each generation once.
    generation: AtomicU64,
    /// Helpers between reading `job` and leaving it: the caller waits for none before its
    /// job goes out of scope.
    inside: AtomicUsize,
    /// Whether a region is open.
    open: AtomicBool,
}

static SHARED: Shared = Shared {
    job: AtomicPtr::new(ptr::null_mut()),
    generation: AtomicU64::new(0),
    inside: AtomicUsize::new(0),
    open: AtomicBool::new(false),
};

struct Helper {
    thread: Thread,
    parked: Arc<AtomicBool>,
}

/// The helpers, started on first use: one fewer than the machine's cores.
fn helpers() -> &'static [Helper] {
    static HELPERS: OnceLock<Vec<Helper>> = OnceLock::new();
    HELPERS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        (1..cores)
            .filter_map(|index| {
                let parked = Arc::new(AtomicBool::new(false));
                let flag = parked.clone();
                let handle = std::thread::Builder::new()
                    .name(format!("kiln-helper-{index}"))
                    .spawn(move || help(index - 1, &flag))
                    .ok()?;
                Some(Helper {
                    thread: handle.thread().clone(),
                    parked,
                })
            })
            .collect()
    })
}

/// A helper's life: join each region it is allowed into, spin between regions, park when
/// none came for [`SPIN`].
fn help(index: usize, parked: &AtomicBool) {
    let mut seen = SHARED.generation.load(SeqCst);
    let mut idle_since = Instant::now();
    let mut polls = 0u32;
    loop {
        let generation = SHARED.generation.load(SeqCst);
        if generation != seen {
            seen = generation;
            SHARED.inside.fetch_add(1, SeqCst);
            let job = SHARED.job.load(SeqCst);
            // SAFETY: a non-null job stays alive while `inside` counts this helper: the
            // caller withdraws it, then waits for `inside` to reach zero.
            if let Some(job) = unsafe { job.as_ref() }
                && index < job.helpers
            {
                job.mode.set();
                job.work();
            }
            SHARED.inside.fetch_sub(1, SeqCst);
            idle_since = Instant::now();
            continue;
        }
        polls = polls.wrapping_add(1);
        if !polls.is_multiple_of(64) || idle_since.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        parked.store(true, SeqCst);
        // Checked after announcing the park: a region opened before it is seen here, one
        // opened after it unparks this thread.
        if SHARED.generation.load(SeqCst) == seen {
            std::thread::park();
        }
        parked.store(false, SeqCst);
        idle_since = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_once() {
        for count in [0, 1, 2, 3, 17, 1000] {
            let runs: Vec<AtomicU32> = (0..count).map(|_| AtomicU32::new(0)).collect();
            for_each(count, |i| {
                runs[i].fetch_add(1, SeqCst);
            });
            assert!(runs.iter().all(|r| r.load(SeqCst) == 1), "count {count}");
        }
    }

    #[test]
    fn regions_from_several_threads_and_nested() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..200 {
                        for_each(4, |_| {
                            for_each(3, |_| {
                                total.fetch_add(1, SeqCst);
                            })
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(SeqCst), 4 * 200 * 4 * 3);
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_team_stays_usable() {
        let caught = catch_unwind(|| {
            for_each(8, |i| {
                if i == 5 {
                    panic!("task 5");
                }
            })
        });
        let message = caught.expect_err("the panic is resumed");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"task 5"));
        let runs = AtomicUsize::new(0);
        for_each(8, |_| {
            runs.fetch_add(1, SeqCst);
        });
        assert_eq!(runs.load(SeqCst), 8);
    }

    #[test]
    fn chunks_cover_the_data() {
        let mut data = vec![0usize; 1003];
        for_each_chunk(&mut data, 100, true, |i, chunk| {
            for (j, v) in chunk.iter_mut().enumerate() {
                *v = i * 100 + j;
            }
        });
        assert!(data.iter().enumerate().all(|(i, &v)| i == v));
    }
}
