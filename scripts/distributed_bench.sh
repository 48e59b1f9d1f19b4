#!/usr/bin/env bash
# The communication figures of BENCHMARKS.md ("Training on several ranks"): all-reduce time
# and bandwidth through Kiln's communicators and through MPI_Allreduce itself, and the W5 step
# on 2 ranks × batch 128 against 1 rank × batch 256, each measured `rounds` times, alternating.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
cargo build --release --locked --features mpi --example distributed_bench >/dev/null
bin=target/release/examples/distributed_bench
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
for round in $(seq "$rounds"); do
  echo "== round $round: all-reduce"
  mpirun -n 2 "$bin" allreduce --raw
  mpirun -n 2 "$bin" allreduce
  "$bin" allreduce --threads 2
  echo "== round $round: W5"
  "$bin" w5 --steps 100
  "$bin" w5 --threads 2 --steps 100
  "$bin" w5 --threads 2 --steps 100 --bucket-kib 65536
  mpirun -n 2 "$bin" w5 --steps 100
  OMPI_MCA_mpi_yield_when_idle=1 mpirun -x OMPI_MCA_mpi_yield_when_idle -n 2 "$bin" w5 --steps 100
done
