//! The digits MLP trained on several ranks, with a fixed global batch and seed: every run
//! prints a throughput line per rank and `final loss X` last, and every way of running it
//! gives the final loss of one process training on the whole global batch.
//!
//!     cargo run --release --example data_parallel -- --threads 4 --steps 50
//!         (in-process ranks: threads of one process; `--threads 1` is plain training)
//!     cargo build --release --features mpi --example data_parallel
//!     mpirun -n 2 target/release/examples/data_parallel --steps 50
//!     mpirun -n 3 target/release/examples/data_parallel --mode ps --steps 50
//!         (rank 0 the parameter server; `--servers K` for K server ranks)
//!
//! Options: `--batch B` (the global batch, 240; a multiple of the training ranks), `--hidden H`
//! (the hidden layer's width, 64),
//! `--bucket-kib K` (the all-reduce bucket size), `--zero` (ZeRO stage 1: the optimizer state
//! sharded over the ranks), `--bf16` (gradients all-reduced as bfloat16: half the bytes), `--save PATH` (rank 0 saves the state after
//! the last step), `--resume PATH --from-step S` (rank 0 alone loads that checkpoint; steps
//! S.. follow, as in an uninterrupted run).

use kiln::demos::data_parallel::{parse_args, print_reports, run_threads};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let (config, threads) = parse_args(std::env::args().skip(1))?;
    #[cfg(feature = "mpi")]
    if kiln::backend::comm::mpi::launched_by_mpirun() {
        return run_mpi(&config, threads);
    }
    let reports = run_threads(&config, threads)?;
    print_reports(&reports);
    Ok(())
}

/// One MPI rank: trains, then rank 0 prints every rank's line (gathered in rank order).
#[cfg(feature = "mpi")]
fn run_mpi(
    config: &kiln::demos::data_parallel::Config,
    threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    if threads != 1 {
        return Err("--threads and mpirun do not mix: mpirun -n N starts the ranks".into());
    }
    let comm = kiln::backend::comm::mpi::world()?;
    let _installed = comm.install();
    let report = match kiln::demos::data_parallel::train_rank(config) {
        Ok(r) => r,
        Err(e) => {
            comm.abort(&e.to_string());
            return Err(e.into());
        }
    };
    let reports = kiln::demos::data_parallel::gather_reports(&comm, report)?;
    if comm.rank() == 0 {
        print_reports(&reports);
    }
    Ok(())
}
