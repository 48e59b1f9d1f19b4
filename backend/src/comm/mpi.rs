//! The MPI transport (feature `mpi`): ranks are processes started by `mpirun`, over rsmpi.
//! MPI is initialised on the communicator's worker thread, which makes every MPI call
//! (`MPI_THREAD_FUNNELED`), and finalised there when the last handle is dropped.
//!
//! A rank that fails calls `MPI_Abort`, and `mpirun` stops the others; a rank that exits
//! with an error makes `mpirun` stop the job the same way.

use super::{CommError, Communicator, Transport};
use crate::Array;
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives, Destination, Root, Source};

/// Whether this process was started by `mpirun` (OpenMPI, MPICH or PMIx variables are set).
pub fn launched_by_mpirun() -> bool {
    super::mpirun_world_size().is_some()
}

/// This process's communicator over `MPI_COMM_WORLD`. MPI may be initialised once per process.
///
/// Unless `RAYON_NUM_THREADS` says otherwise, the node's cores are shared out among the ranks
/// mpirun started on it, so that they do not oversubscribe the cores.
pub fn world() -> Result<Communicator, CommError> {
    share_cores();
    Communicator::spawn(|| {
        let failed = |message: String| CommError::Transport { rank: 0, message };
        let (universe, provided) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| failed("MPI is already initialised in this process".into()))?;
        if provided < Threading::Funneled {
            return Err(failed(format!(
                "MPI provides thread level {provided:?}; Kiln needs Funneled (every call from one thread)"
            )));
        }
        let world = universe.world();
        Ok(Mpi {
            rank: world.rank() as usize,
            size: world.size() as usize,
            world,
            send: None,
            _universe: universe,
        })
    })
}

/// Sizes the kernels' thread pool to this rank's share of the node's cores (a no-op when the
/// pool already runs, or when `RAYON_NUM_THREADS` sets it).
fn share_cores() {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return;
    }
    let local_ranks = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
        .unwrap_or(1)
        .max(1);
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads((cores / local_ranks).max(1))
        .build_global();
}

struct Mpi {
    rank: usize,
    size: usize,
    world: SimpleCommunicator,
    /// The last all-reduce's send buffer, reused while sizes repeat (a step's buckets do), so
    /// that a large buffer is not faulted in afresh at every call.
    send: Option<Array>,
    /// Finalises MPI when dropped, on the worker thread.
    _universe: Universe,
}

/// `$f` applied to the array's elements as a mutable slice, whatever its dtype.
macro_rules! with_slice_mut {
    ($array:expr, $s:ident => $body:expr) => {
        crate::with_array!($array, a => {
            let $s = a.as_slice_mut().expect("messages are contiguous");
            $body
        })
    };
}

impl Mpi {
    fn tag(&self, tag: u64) -> Result<i32, CommError> {
        // MPI guarantees tags up to 32767.
        i32::try_from(tag)
            .ok()
            .filter(|&t| t <= 32767)
            .ok_or_else(|| CommError::Transport {
                rank: self.rank,
                message: format!("tag {tag} is above MPI's guaranteed limit of 32767"),
            })
    }
}

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&mut self, data: &mut Array) -> Result<(), CommError> {
        // rsmpi has no MPI_IN_PLACE: the operands go from a copy.
        let send = match self.send.take() {
            Some(mut s) if s.dtype() == data.dtype() && s.len() == data.len() => {
                s.copy_elements_from(data);
                s
            }
            _ => data.clone(),
        };
        let world = &self.world;
        macro_rules! reduce {
            ($($variant:ident => $op:expr),*) => {
                match (&send, data) {
                    $((Array::$variant(s), Array::$variant(r)) => world.all_reduce_into(
                        s.as_slice().expect("messages are contiguous"),
                        r.as_slice_mut().expect("messages are contiguous"),
                        $op,
                    ),)*
                    _ => unreachable!("the send buffer is a copy of the data"),
                }
            };
        }
        reduce!(
            F32 => SystemOperation::sum(),
            F64 => SystemOperation::sum(),
            I32 => SystemOperation::sum(),
            I64 => SystemOperation::sum(),
            Bool => SystemOperation::logical_or()
        );
        self.send = Some(send);
        Ok(())
    }

    fn reduce_scatter_sum(&mut self, data: &Array) -> Result<Array, CommError> {
        let mut out = Array::zeros(data.dtype(), &[data.len() / self.size]);
        let world = &self.world;
        macro_rules! reduce {
            ($($variant:ident => $op:expr),*) => {
                match (data, &mut out) {
                    $((Array::$variant(s), Array::$variant(r)) => world.reduce_scatter_block_into(
                        s.as_slice().expect("messages are contiguous"),
                        r.as_slice_mut().expect("messages are contiguous"),
                        $op,
                    ),)*
                    _ => unreachable!("the result has the message's dtype"),
                }
            };
        }
        reduce!(
            F32 => SystemOperation::sum(),
            F64 => SystemOperation::sum(),
            I32 => SystemOperation::sum(),
            I64 => SystemOperation::sum(),
            Bool => SystemOperation::logical_or()
        );
        Ok(out)
    }

    fn all_gather(&mut self, data: &Array) -> Result<Array, CommError> {
        let mut out = Array::zeros(data.dtype(), &[data.len() * self.size]);
        let world = &self.world;
        crate::with_array!(data, d => {
            let send = d.as_slice().expect("messages are contiguous");
            with_slice_mut!(&mut out, r => world.all_gather_into(send, r))
        });
        Ok(out)
    }

    fn broadcast(&mut self, data: &mut Array, root: usize) -> Result<(), CommError> {
        let root = self.world.process_at_rank(root as i32);
        with_slice_mut!(data, s => root.broadcast_into(s));
        Ok(())
    }

    fn send(&mut self, data: &Array, peer: usize, tag: u64) -> Result<(), CommError> {
        let tag = self.tag(tag)?;
        let peer = self.world.process_at_rank(peer as i32);
        crate::with_array!(data, a => peer.send_with_tag(a.as_slice().expect("contiguous"), tag));
        Ok(())
    }

    fn recv(&mut self, data: &mut Array, peer: usize, tag: u64) -> Result<(), CommError> {
        let tag = self.tag(tag)?;
        let peer = self.world.process_at_rank(peer as i32);
        with_slice_mut!(data, s => {
            peer.receive_into_with_tag(s, tag);
        });
        Ok(())
    }

    fn abort(&mut self, message: &str) {
        eprintln!(
            "kiln: rank {} failed, stopping every rank: {message}",
            self.rank
        );
        self.world.abort(1);
    }
}
