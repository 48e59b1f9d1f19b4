//! Measures communication: all-reduce time and bandwidth for 1 KiB–64 MiB f32 buffers, and
//! the W5 training step on several ranks against one rank with the whole batch. Every rank
//! runs the same fixed number of iterations (an adaptive harness would desynchronise the
//! ranks' collectives).
//!
//!     cargo run --release --example distributed_bench -- allreduce --threads 2
//!     cargo run --release --example distributed_bench -- w5 --threads 2
//!     cargo build --release --features mpi --example distributed_bench
//!     mpirun -n 2 target/release/examples/distributed_bench allreduce         (Kiln's communicator)
//!     mpirun -n 2 target/release/examples/distributed_bench allreduce --raw   (MPI_Allreduce itself)
//!     mpirun -n 2 target/release/examples/distributed_bench w5
//!
//! All-reduce lines: size, median time per call, algorithm bandwidth (size / time) and bus
//! bandwidth (× 2(n−1)/n, the traffic of a ring all-reduce), as NCCL's tests report them.

use kiln::backend::Array;
use kiln::backend::comm::{Communicator, local};
use std::time::Instant;

const SIZES_KIB: [usize; 9] = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536];

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.first().map(String::as_str).unwrap_or("allreduce");
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str, default: usize| -> Result<usize, String> {
        match args.iter().position(|a| a == name) {
            Some(i) => (args.get(i + 1))
                .and_then(|v| v.parse().ok())
                .ok_or(format!("{name} takes a number")),
            None => Ok(default),
        }
    };
    let threads = value("--threads", 1)?;
    let steps = value("--steps", 50)?;
    let bucket_bytes = 1024 * value("--bucket-kib", 0)?;
    #[cfg(feature = "mpi")]
    if kiln::backend::comm::mpi::launched_by_mpirun() {
        if flag("--raw") {
            return raw_mpi_all_reduce();
        }
        let comm = kiln::backend::comm::mpi::world()?;
        let _installed = comm.install();
        return measure(what, &comm, steps, bucket_bytes, "kiln-mpi").map_err(Into::into);
    }
    if flag("--raw") {
        return Err(
            "--raw measures MPI_Allreduce: run under mpirun, built with --features mpi".into(),
        );
    }
    if threads == 1 {
        if what != "w5" {
            return Err("the all-reduce needs --threads 2 or more (or mpirun)".into());
        }
        return w5_rank(0, 1, steps, 0).map_err(Into::into);
    }
    let what = what.to_owned();
    for result in local::run(threads, move |comm| {
        measure(&what, comm, steps, bucket_bytes, "kiln-local")
            .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
    }) {
        result.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `label` names the transport in the all-reduce lines.
fn measure(
    what: &str,
    comm: &Communicator,
    steps: usize,
    bucket_bytes: usize,
    label: &str,
) -> Result<(), String> {
    match what {
        "allreduce" => all_reduce(comm, label),
        "w5" => w5(comm, steps, bucket_bytes),
        other => Err(format!("measure `allreduce` or `w5`, not `{other}`")),
    }
}

/// Calls per size: about 256 MiB moved, between 5 and 500 calls.
fn calls(kib: usize) -> usize {
    (256 * 1024 / kib).clamp(5, 500)
}

/// The median time of `calls` calls of `f`, after `warmup` more.
fn median_seconds<E>(
    warmup: usize,
    calls: usize,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<f64, E> {
    let mut times = Vec::with_capacity(calls);
    for i in 0..warmup + calls {
        let started = Instant::now();
        f()?;
        if i >= warmup {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn report(rank: usize, ranks: usize, label: &str, kib: usize, seconds: f64) {
    if rank != 0 {
        return;
    }
    let bytes = (kib * 1024) as f64;
    let algbw = bytes / seconds / 1e9;
    let busbw = algbw * 2.0 * (ranks - 1) as f64 / ranks as f64;
    println!(
        "{label} n={ranks} {:>9} {:>10.1} µs {:>8.3} GB/s algbw {:>8.3} GB/s busbw",
        size_label(kib),
        seconds * 1e6,
        algbw,
        busbw
    );
}

fn size_label(kib: usize) -> String {
    if kib >= 1024 {
        format!("{} MiB", kib / 1024)
    } else {
        format!("{kib} KiB")
    }
}

/// Each size three ways: the buffer handed over and back (`label`: what the executor does
/// with a gradient whose last use is its all-reduce), lent (`label-lent`: copied in), and
/// lent as bfloat16 (`label-bf16`).
fn all_reduce(comm: &Communicator, label: &str) -> Result<(), String> {
    for kib in SIZES_KIB {
        let mut buffer = Some(Array::zeros(kiln::ir::DType::F32, &[kib * 256]));
        let seconds = median_seconds(2, calls(kib), || {
            let owned = buffer.take().expect("the buffer comes back");
            let mut back = comm
                .all_reduce_owned(vec![owned], false)
                .and_then(|p| p.wait())
                .map_err(|e| e.to_string())?;
            buffer = back.pop();
            Ok::<(), String>(())
        })?;
        report(comm.rank(), comm.size(), label, kib, seconds);
        let lent = buffer.expect("the buffer came back");
        let seconds = median_seconds(2, calls(kib), || {
            comm.all_reduce(&[&lent], false)
                .and_then(|p| p.wait())
                .map(drop)
                .map_err(|e| e.to_string())
        })?;
        let (rank, ranks) = (comm.rank(), comm.size());
        report(rank, ranks, &format!("{label}-lent"), kib, seconds);
        let seconds = median_seconds(2, calls(kib), || {
            comm.all_reduce_bf16(&[&lent], false)
                .and_then(|p| p.wait())
                .map(drop)
                .map_err(|e| e.to_string())
        })?;
        report(rank, ranks, &format!("{label}-bf16"), kib, seconds);
    }
    Ok(())
}

/// W5 with the batch of 256 split over the ranks; each rank prints its time per step.
fn w5(comm: &Communicator, steps: usize, bucket_bytes: usize) -> Result<(), String> {
    w5_rank(comm.rank(), comm.size(), steps, bucket_bytes).map_err(|e| e.to_string())
}

/// W5 on its share of the batch as rank `rank` of `ranks` (one rank: the whole batch, no
/// communication).
fn w5_rank(
    rank: usize,
    ranks: usize,
    steps: usize,
    bucket_bytes: usize,
) -> kiln::runtime::RuntimeResult<()> {
    let mut step = kiln::workloads::mlp_step_share(rank, ranks, bucket_bytes)?;
    let seconds = median_seconds(3, steps, || step.step().map(drop))?;
    let who = match ranks {
        1 => "one rank".to_owned(),
        _ => format!("rank {rank} of {ranks}"),
    };
    println!(
        "W5 {who}: batch {}, {:.3} ms per step (median of {steps})",
        kiln::workloads::MLP_BATCH / ranks,
        seconds * 1e3
    );
    Ok(())
}

/// `MPI_Allreduce` on the same buffers, called directly on the main thread: the floor
/// Kiln's communicator is measured against.
#[cfg(feature = "mpi")]
fn raw_mpi_all_reduce() -> Result<(), Box<dyn std::error::Error>> {
    use mpi::collective::SystemOperation;
    use mpi::traits::{Communicator as _, CommunicatorCollectives};
    let universe = mpi::initialize().ok_or("MPI is already initialised")?;
    let world = universe.world();
    let (rank, ranks) = (world.rank() as usize, world.size() as usize);
    for kib in SIZES_KIB {
        let send = vec![0f32; kib * 256];
        let mut recv = vec![0f32; kib * 256];
        let seconds = median_seconds(2, calls(kib), || {
            world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            Ok::<(), std::convert::Infallible>(())
        })?;
        report(rank, ranks, "mpi-raw", kib, seconds);
    }
    Ok(())
}
