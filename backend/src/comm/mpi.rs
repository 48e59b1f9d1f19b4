//! The MPI transport (feature `mpi`): ranks are processes started by `mpirun`, over rsmpi.
//! MPI is initialised on the communicator's worker thread, which makes every MPI call
//! (`MPI_THREAD_FUNNELED`), and finalised there when the last handle is dropped.
//!
//! A rank that fails calls `MPI_Abort`, and `mpirun` stops the others; a rank that exits
//! with an error makes `mpirun` stop the job the same way.

use super::{CommError, Communicator, Transport};
use crate::Array;
use half::bf16;
use mpi::Threading;
use mpi::collective::SystemOperation;
use mpi::datatype::Equivalence;
use mpi::environment::Universe;
use mpi::raw::AsRaw;
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
            in_place: in_place_marker(),
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
    /// This library's `MPI_IN_PLACE`, when it is known: an all-reduce then works in the
    /// message's own buffer.
    in_place: Option<InPlace>,
    /// The last all-reduce's send buffer (when `in_place` is unknown), reused while sizes repeat (a step's buckets do), so
    /// that a large buffer is not faulted in afresh at every call.
    send: Option<Array>,
    /// Finalises MPI when dropped, on the worker thread.
    _universe: Universe,
}

/// The address MPI takes as `MPI_IN_PLACE`.
#[derive(Clone, Copy)]
struct InPlace(usize);

/// `MPI_IN_PLACE`, which rsmpi does not export: a macro in `mpi.h`, `(void *) 1` in Open MPI
/// and `(void *) -1` in MPICH and its derivatives (both unchanged since MPI-2). Another
/// library's is not guessed: its all-reduces go from a copy.
fn in_place_marker() -> Option<InPlace> {
    let version = mpi::environment::library_version().ok()?;
    if version.contains("Open MPI") {
        Some(InPlace(1))
    } else if version.contains("MPICH") {
        Some(InPlace(usize::MAX))
    } else {
        None
    }
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

/// The sum for a dtype's reductions (a logical or for bool, as the in-process transport adds).
fn sum_of(dtype: kiln_ir::DType) -> SystemOperation {
    match dtype {
        kiln_ir::DType::Bool => SystemOperation::logical_or(),
        _ => SystemOperation::sum(),
    }
}

/// `$body` with `$s` the first array's elements and `$r` the second's, mutable (one dtype).
macro_rules! both_slices {
    (($send:expr, $recv:expr), ($s:ident, $r:ident) => $body:expr) => {
        match ($send, $recv) {
            (Array::F32(a), Array::F32(b)) => both_slices!(@ a, b, $s, $r, $body),
            (Array::F64(a), Array::F64(b)) => both_slices!(@ a, b, $s, $r, $body),
            (Array::I32(a), Array::I32(b)) => both_slices!(@ a, b, $s, $r, $body),
            (Array::I64(a), Array::I64(b)) => both_slices!(@ a, b, $s, $r, $body),
            (Array::Bool(a), Array::Bool(b)) => both_slices!(@ a, b, $s, $r, $body),
            _ => unreachable!("a reduction's buffers share a dtype"),
        }
    };
    (@ $a:ident, $b:ident, $s:ident, $r:ident, $body:expr) => {{
        let $s = $a.as_slice().expect("messages are contiguous");
        let $r = $b.as_slice_mut().expect("messages are contiguous");
        $body
    }};
}

/// `MPI_Allreduce` of `data` in its own buffer.
fn in_place_sum<T: Equivalence>(
    world: &SimpleCommunicator,
    rank: usize,
    marker: InPlace,
    data: &mut ndarray::ArrayD<T>,
    op: SystemOperation,
) -> Result<(), CommError> {
    let failed = |message: String| CommError::Transport { rank, message };
    let data = data
        .as_slice_mut()
        .ok_or_else(|| failed("a message is not contiguous".into()))?;
    let count = i32::try_from(data.len())
        .map_err(|_| failed(format!("{} elements exceed MPI's count", data.len())))?;
    // SAFETY: `marker` is this library's MPI_IN_PLACE (see `in_place_marker`), which makes
    // MPI read the operands from the receive buffer; that buffer is `data`, live and
    // exclusively borrowed for the call, holding `count` elements of `T`'s MPI datatype. The
    // communicator and the op are valid handles, and this is the thread MPI was initialised on.
    let code = unsafe {
        mpi::ffi::MPI_Allreduce(
            marker.0 as *const std::ffi::c_void,
            data.as_mut_ptr().cast(),
            count,
            T::equivalent_datatype().as_raw(),
            op.as_raw(),
            world.as_raw(),
        )
    };
    match code {
        0 => Ok(()),
        code => Err(failed(format!(
            "MPI_Allreduce failed with error code {code}"
        ))),
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
        let op = sum_of(data.dtype());
        if let Some(marker) = self.in_place {
            let (world, rank) = (&self.world, self.rank);
            return crate::with_array!(data, a => in_place_sum(world, rank, marker, a, op));
        }
        // Without MPI_IN_PLACE the operands go from a copy.
        let send = match self.send.take() {
            Some(mut s) if s.dtype() == data.dtype() && s.len() == data.len() => {
                s.copy_elements_from(data);
                s
            }
            _ => data.clone(),
        };
        let world = &self.world;
        both_slices!((&send, data), (s, r) => world.all_reduce_into(s, r, op));
        self.send = Some(send);
        Ok(())
    }

    fn reduce_scatter_sum(&mut self, data: Array) -> Result<Array, CommError> {
        let mut out = Array::zeros(data.dtype(), &[data.len() / self.size]);
        let (world, op) = (&self.world, sum_of(data.dtype()));
        both_slices!((&data, &mut out), (s, r) => world.reduce_scatter_block_into(s, r, op));
        Ok(out)
    }

    fn all_gather(&mut self, data: Array) -> Result<Array, CommError> {
        let mut out = Array::zeros(data.dtype(), &[data.len() * self.size]);
        let world = &self.world;
        crate::with_array!(&data, d => {
            let send = d.as_slice().expect("messages are contiguous");
            with_slice_mut!(&mut out, r => world.all_gather_into(send, r))
        });
        Ok(out)
    }

    /// Half the bytes of an f32 all-reduce: the bf16 values go in blocks, each rank summing
    /// its block of every rank's (in f32, in rank order) and rounding it, then every rank
    /// gathers the rounded sums: a reduce-scatter and an all-gather, as a ring all-reduce
    /// does, with the same result as the default method.
    fn all_reduce_sum_bf16(&mut self, data: &mut Array) -> Result<(), CommError> {
        let Array::F32(values) = data else {
            return self.all_reduce_sum(data);
        };
        let values = values.as_slice_mut().expect("messages are contiguous");
        let block = values.len().div_ceil(self.size);
        let mut send = vec![0u16; block * self.size];
        for (s, &x) in send.iter_mut().zip(values.iter()) {
            *s = bf16::from_f32(x).to_bits();
        }
        let mut received = vec![0u16; send.len()];
        self.world.all_to_all_into(&send[..], &mut received[..]);
        let mine: Vec<u16> = (0..block)
            .map(|i| {
                let sum: f32 = (0..self.size)
                    .map(|r| bf16::from_bits(received[r * block + i]).to_f32())
                    .sum();
                bf16::from_f32(sum).to_bits()
            })
            .collect();
        self.world.all_gather_into(&mine[..], &mut received[..]);
        for (x, &b) in values.iter_mut().zip(&received) {
            *x = bf16::from_bits(b).to_f32();
        }
        Ok(())
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
