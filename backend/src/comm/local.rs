//! The in-process transport: ranks are threads of one process (several devices of one
//! machine). A collective is a rendezvous: each rank deposits its message, the last to arrive
//! combines them in rank order (so every rank, and every run, gets the same bits), and all
//! take the result. Messages between two ranks queue in a mailbox per (from, to, tag).

use super::{CommError, Communicator, Transport};
use crate::Array;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `size` communicators over one in-process group, rank 0 first, waiting at most the
/// default timeout ([`super::DEFAULT_TIMEOUT`], or `KILN_COMM_TIMEOUT`).
pub fn group(size: usize) -> Vec<Communicator> {
    group_with_timeout(size, super::timeout_from_env())
}

/// `size` communicators over one in-process group whose waits end after `timeout`.
pub fn group_with_timeout(size: usize, timeout: Duration) -> Vec<Communicator> {
    let group = Arc::new(Group {
        size,
        state: Mutex::new(State {
            deposits: (0..size).map(|_| None).collect(),
            ..State::default()
        }),
        changed: Condvar::new(),
    });
    (0..size)
        .map(|rank| {
            let local = Local {
                rank,
                group: group.clone(),
                timeout,
            };
            Communicator::new(local).with_timeout(timeout)
        })
        .collect()
}

/// Runs `f` on `size` threads, each with its rank's communicator installed, and returns their
/// results in rank order. A rank that returns an error or panics aborts the group, so the
/// others fail instead of waiting; a panic is raised again here once the others have ended.
///
/// It never hangs: a rank that neither returns nor communicates within the timeout
/// ([`super::DEFAULT_TIMEOUT`], `KILN_COMM_TIMEOUT`) of the last other rank's end is reported
/// as [`CommError::Stuck`] and left running.
///
/// Each rank is a device: its parallel kernels run on a thread pool of its own, with the
/// machine's cores shared out among the ranks (one each, at least), so that ranks do not
/// queue behind each other in one pool.
pub fn run<R, E, F>(size: usize, f: F) -> Vec<Result<R, E>>
where
    R: Send + 'static,
    E: std::fmt::Display + From<CommError> + Send + 'static,
    F: Fn(&Communicator) -> Result<R, E> + Send + Sync + 'static,
{
    run_with_timeout(size, super::timeout_from_env(), f)
}

/// [`run`] with every wait bounded by `timeout`.
pub fn run_with_timeout<R, E, F>(size: usize, timeout: Duration, f: F) -> Vec<Result<R, E>>
where
    R: Send + 'static,
    E: std::fmt::Display + From<CommError> + Send + 'static,
    F: Fn(&Communicator) -> Result<R, E> + Send + Sync + 'static,
{
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let per_rank = (cores / size.max(1)).max(1);
    let f = Arc::new(f);
    let (done, finished) = mpsc::channel();
    let handles: Vec<JoinHandle<()>> = (group_with_timeout(size, timeout).into_iter())
        .map(|comm| {
            let (f, done) = (f.clone(), done.clone());
            let rank = comm.rank();
            std::thread::Builder::new()
                .name(format!("kiln-rank{rank}"))
                .spawn(move || {
                    let result = catch_unwind(AssertUnwindSafe(|| run_rank(&comm, per_rank, &*f)));
                    match &result {
                        Ok(Err(e)) => comm.abort(&e.to_string()),
                        Err(_) => comm.abort("it panicked"),
                        Ok(Ok(_)) => {}
                    }
                    // Leave the group before reporting, so that the others stop waiting.
                    drop(comm);
                    let _ = done.send((rank, result));
                })
                .expect("a thread per rank")
        })
        .collect();
    drop(done);
    let mut results: Vec<Option<std::thread::Result<Result<R, E>>>> =
        (0..size).map(|_| None).collect();
    let mut deadline: Option<Instant> = None;
    for _ in 0..size {
        let next = match deadline {
            None => finished.recv().ok(),
            Some(d) => finished
                .recv_timeout(d.saturating_duration_since(Instant::now()))
                .ok(),
        };
        let Some((rank, result)) = next else { break };
        results[rank] = Some(result);
        deadline = Some(Instant::now() + timeout);
    }
    for (handle, result) in handles.into_iter().zip(&results) {
        if result.is_some() {
            let _ = handle.join();
        }
    }
    (results.into_iter().enumerate())
        .map(|(rank, result)| match result {
            Some(Ok(r)) => r,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => Err(CommError::Stuck { rank, timeout }.into()),
        })
        .collect()
}

/// One rank's `f`, on a thread pool of `threads` with the communicator installed where `f`
/// runs.
fn run_rank<R: Send, E: Send>(
    comm: &Communicator,
    threads: usize,
    f: &(impl Fn(&Communicator) -> Result<R, E> + Sync),
) -> Result<R, E> {
    let rank = comm.rank();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-rank{rank}-{i}"))
        .build();
    let run = || {
        let _installed = comm.install();
        f(comm)
    };
    match pool {
        Ok(pool) => pool.install(run),
        Err(_) => run(),
    }
}

struct Group {
    size: usize,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Completed collectives so far.
    generation: u64,
    /// This collective's messages, by rank, with what each rank asked for.
    deposits: Vec<Option<(Array, Kind)>>,
    arrived: usize,
    /// The last completed collective's result.
    result: Option<Arc<Array>>,
    mail: HashMap<(usize, usize, u64), VecDeque<Array>>,
    /// The first failure: (rank, message).
    failed: Option<(usize, String)>,
    /// Ranks whose transport is gone.
    left: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Sum,
    Broadcast(usize),
    ReduceScatter,
    AllGather,
}

struct Local {
    rank: usize,
    group: Arc<Group>,
    timeout: Duration,
}

impl Local {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.group
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Why waiting must stop, if it must.
    fn check(&self, state: &State) -> Result<(), CommError> {
        if let Some((rank, message)) = &state.failed {
            return Err(CommError::PeerFailed {
                rank: *rank,
                message: message.clone(),
            });
        }
        Ok(())
    }

    /// Waits on the group until `done` holds, failing on a failure, after the timeout, or
    /// when a rank it waits for has left: `from` one peer, or every rank (`None`). (A rank
    /// that finished its work and left while this one waits for a message from another is
    /// no reason to fail.)
    fn wait_until<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        op: &'static str,
        from: Option<usize>,
        mut done: impl FnMut(&mut State) -> bool,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        let deadline = Instant::now() + self.timeout;
        let spin_until = Instant::now() + super::SPIN;
        loop {
            if done(&mut state) {
                return Ok(state);
            }
            self.check(&state)?;
            let gone = (state.left.iter()).find(|&&r| from.is_none_or(|peer| peer == r));
            if let Some(&rank) = gone {
                return Err(CommError::PeerFailed {
                    rank,
                    message: format!("it stopped before `{op}` completed"),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: self.rank,
                    op,
                    timeout: self.timeout,
                });
            }
            state = if now < spin_until {
                // The others are likely microseconds away: poll before sleeping.
                drop(state);
                std::thread::yield_now();
                self.lock()
            } else {
                (self.group.changed)
                    .wait_timeout(state, deadline - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            };
        }
    }

    fn collective(&mut self, data: &mut Array, kind: Kind) -> Result<(), CommError> {
        let op = match kind {
            Kind::Sum => "all_reduce",
            Kind::Broadcast(_) => "collective_broadcast",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
        };
        let mut state = self.lock();
        self.check(&state)?;
        if let Some((first, (message, first_kind))) =
            (state.deposits.iter().enumerate()).find_map(|(r, d)| d.as_ref().map(|d| (r, d)))
            && (*first_kind != kind || message.ty() != data.ty())
        {
            let mismatch = format!(
                "rank {first} entered {first_kind:?} of {}, rank {} {kind:?} of {}: the ranks \
                 run different programs or shapes",
                message.ty(),
                self.rank,
                data.ty()
            );
            state.failed = Some((self.rank, mismatch.clone()));
            self.group.changed.notify_all();
            return Err(CommError::Mismatch {
                rank: self.rank,
                message: mismatch,
            });
        }
        let generation = state.generation;
        let message = std::mem::replace(data, Array::zeros(data.dtype(), &[0]));
        state.deposits[self.rank] = Some((message, kind));
        state.arrived += 1;
        if state.arrived == self.group.size {
            let deposits: Vec<Array> = (state.deposits.iter_mut())
                .map(|d| d.take().expect("every rank deposited").0)
                .collect();
            state.result = Some(Arc::new(combine(deposits, kind)));
            state.arrived = 0;
            state.generation += 1;
            self.group.changed.notify_all();
        }
        let state = self.wait_until(state, op, None, |s| s.generation > generation)?;
        let result = state.result.as_ref().expect("a completed collective");
        *data = match kind {
            Kind::ReduceScatter => super::block(result, self.rank, self.group.size),
            _ => (**result).clone(),
        };
        Ok(())
    }
}

/// The ranks' messages combined in rank order.
fn combine(mut deposits: Vec<Array>, kind: Kind) -> Array {
    match kind {
        Kind::Broadcast(root) => deposits.swap_remove(root),
        Kind::AllGather => {
            let parts: Vec<&Array> = deposits.iter().collect();
            crate::interp::kernels::concat(&parts, 0)
                .expect("deposits of one collective share a type (checked on arrival)")
        }
        Kind::Sum | Kind::ReduceScatter => {
            let mut rest = deposits.into_iter();
            let mut sum = rest.next().expect("at least one rank");
            for d in rest {
                add_into(&mut sum, &d);
            }
            sum
        }
    }
}

fn add_into(sum: &mut Array, d: &Array) {
    match (sum, d) {
        (Array::F32(s), Array::F32(d)) => *s += d,
        (Array::F64(s), Array::F64(d)) => *s += d,
        (Array::I32(s), Array::I32(d)) => s.zip_mut_with(d, |a, &b| *a = a.wrapping_add(b)),
        (Array::I64(s), Array::I64(d)) => s.zip_mut_with(d, |a, &b| *a = a.wrapping_add(b)),
        (Array::Bool(s), Array::Bool(d)) => s.zip_mut_with(d, |a, &b| *a |= b),
        _ => unreachable!("deposits of one collective share a type (checked on arrival)"),
    }
}

impl Transport for Local {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.group.size
    }

    fn all_reduce_sum(&mut self, data: &mut Array) -> Result<(), CommError> {
        self.collective(data, Kind::Sum)
    }

    fn broadcast(&mut self, data: &mut Array, root: usize) -> Result<(), CommError> {
        self.collective(data, Kind::Broadcast(root))
    }

    fn reduce_scatter_sum(&mut self, mut data: Array) -> Result<Array, CommError> {
        self.collective(&mut data, Kind::ReduceScatter)?;
        Ok(data)
    }

    fn all_gather(&mut self, mut data: Array) -> Result<Array, CommError> {
        self.collective(&mut data, Kind::AllGather)?;
        Ok(data)
    }

    fn send(&mut self, data: &Array, peer: usize, tag: u64) -> Result<(), CommError> {
        let mut state = self.lock();
        self.check(&state)?;
        let mailbox = state.mail.entry((self.rank, peer, tag)).or_default();
        mailbox.push_back(data.clone());
        self.group.changed.notify_all();
        Ok(())
    }

    fn recv(&mut self, data: &mut Array, peer: usize, tag: u64) -> Result<(), CommError> {
        let key = (peer, self.rank, tag);
        let state = self.lock();
        let mut received = None;
        let _state = self.wait_until(state, "recv", Some(peer), |s| {
            received = s.mail.get_mut(&key).and_then(VecDeque::pop_front);
            received.is_some()
        })?;
        let message = received.expect("the wait ends with a message");
        if message.ty() != data.ty() {
            return Err(CommError::Mismatch {
                rank: self.rank,
                message: format!(
                    "received {} from rank {peer} (tag {tag}) where {} was expected",
                    message.ty(),
                    data.ty()
                ),
            });
        }
        *data = message;
        Ok(())
    }

    fn abort(&mut self, message: &str) {
        let mut state = self.lock();
        state.failed.get_or_insert((self.rank, message.to_owned()));
        self.group.changed.notify_all();
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.left.push(self.rank);
        self.group.changed.notify_all();
    }
}
