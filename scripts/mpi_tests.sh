#!/usr/bin/env bash
# The MPI checks (CI runs them; they need OpenMPI, and libclang to build rsmpi):
# `examples/data_parallel` under `mpirun -n 2` and `-n 3`, all-reduce and parameter-server
# modes, must print one report per rank and the final loss of one process on the whole global
# batch (to 1e-5 relative); a rank that fails or dies must stop the job with an error, not a
# hang; ranks whose programs differ must be refused before data moves; a resume from rank 0's
# checkpoint must end where an uninterrupted run ends; and a build without MPI must refuse to
# run under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

# mpirun refuses root without these; containers have no single-copy mechanism for vader.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# Fail a stuck run instead of waiting on it.
export KILN_COMM_TIMEOUT=60

expect_stop() {
  local label="$1" pattern="$2"; shift 2
  echo "== $label: mpirun $*"
  local status=0 log
  log=$(mktemp)
  timeout 120 mpirun "$@" >"$log" 2>&1 || status=$?
  cat "$log"
  if [[ $status -eq 0 ]]; then echo "FAIL: $label: the job succeeded"; exit 1; fi
  if [[ $status -eq 124 ]]; then echo "FAIL: $label: the job hung"; exit 1; fi
  grep -q "$pattern" "$log" || { echo "FAIL: $label: no \`$pattern\` in the output"; exit 1; }
  echo "ok: $label: stopped with status $status"
}

# A build without MPI under mpirun: each copy would train alone and print the one-process
# loss. It must refuse, naming the build command. (A debug build: `cargo test` built it
# already, and a release build without the feature would compile the workspace once more.)
cargo build --locked --example data_parallel
expect_stop "a build without MPI under mpirun" "no MPI support" \
  -n 2 target/debug/examples/data_parallel --steps 2

# The ranks' runs: a debug build, as the one above. Each run takes under a second in debug, and
# a release build with the feature would compile the workspace once more (8 minutes in CI).
cargo build --locked --features mpi --example data_parallel
bin=target/debug/examples/data_parallel
steps=40

final_loss() { awk '/^final loss/ { print $3 }' | tail -1; }

# (Not `tee /dev/stderr`: with output sent to a file, that reopens and truncates it.)
alone_out=$("$bin" --steps "$steps")
echo "$alone_out"
alone=$(echo "$alone_out" | final_loss)
echo "one process, whole global batch: final loss $alone"

run_and_compare() {
  local label="$1"; shift
  echo "== $label: mpirun $*"
  local out
  out=$(timeout 300 mpirun "$@" "$bin" --steps "$steps" "${EXTRA[@]}")
  echo "$out"
  [[ "$(echo "$out" | tail -1)" == final\ loss* ]] || { echo "FAIL: $label: the last line is not the final loss"; exit 1; }
  # One report of each rank, gathered by rank 0, and one final loss: copies that each trained
  # alone (a build without MPI) would print rank 0 N times.
  local ranks="$2" reported finals
  reported=$(echo "$out" | grep -c '^rank [0-9]*:' || true)
  finals=$(echo "$out" | grep -c '^final loss' || true)
  local distinct
  distinct=$(echo "$out" | grep -o '^rank [0-9]*:' | sort -u | wc -l)
  if [[ "$reported" -ne "$ranks" || "$distinct" -ne "$ranks" || "$finals" -ne 1 ]]; then
    echo "FAIL: $label: $reported rank lines ($distinct distinct) and $finals final losses for $ranks ranks"; exit 1
  fi
  local got
  got=$(echo "$out" | final_loss)
  awk -v a="$got" -v b="$alone" -v l="$label" 'BEGIN {
    d = a - b; if (d < 0) d = -d;
    if (d > 1e-5 * (b < 0 ? -b : b)) { printf "FAIL: %s: final loss %s, one process %s\n", l, a, b; exit 1 }
    printf "ok: %s: final loss %s equals one process %s\n", l, a, b }'
}

EXTRA=();                   run_and_compare "all-reduce, 2 ranks" -n 2
EXTRA=();                   run_and_compare "all-reduce, 3 ranks" -n 3 --oversubscribe
EXTRA=(--bucket-kib 4);     run_and_compare "all-reduce, 3 ranks, 4 KiB buckets" -n 3 --oversubscribe
EXTRA=(--zero);             run_and_compare "ZeRO-1, 2 ranks" -n 2
EXTRA=(--zero);             run_and_compare "ZeRO-1, 3 ranks" -n 3 --oversubscribe
EXTRA=(--mode ps);          run_and_compare "parameter server, 1 trainer" -n 2
EXTRA=(--mode ps);          run_and_compare "parameter server, 2 trainers" -n 3 --oversubscribe
EXTRA=(--mode ps --servers 2); run_and_compare "2 parameter servers, 2 trainers" -n 4 --oversubscribe


# Gradients as bf16: MPI sends bf16 in two phases, in-process ranks gather the rounded values;
# both round alike, so the two runs end on the same loss.
threads_bf16=$("$bin" --threads 2 --steps "$steps" --bf16 | final_loss)
mpi_bf16=$(timeout 300 mpirun -n 2 "$bin" --steps "$steps" --bf16 | final_loss)
if [[ -z "$mpi_bf16" || "$threads_bf16" != "$mpi_bf16" ]]; then
  echo "FAIL: bf16 all-reduce: MPI ends at $mpi_bf16, in-process ranks at $threads_bf16"; exit 1
fi
echo "ok: bf16 all-reduce, 2 ranks: final loss $mpi_bf16 over MPI and in-process (exact: $alone)"

# Resuming from a checkpoint that rank 0 alone loads continues exactly as an uninterrupted
# run: the session start broadcasts the optimizer's moments and step with the parameters.
checkpoint=$(mktemp -d)/half.safetensors
timeout 300 mpirun -n 2 "$bin" --steps 15 --save "$checkpoint" >/dev/null
EXTRA=(--resume "$checkpoint" --from-step 15)
run_and_compare "all-reduce, 2 ranks, resumed at step 15 from rank 0's checkpoint" -n 2

# Ranks whose programs differ are refused on every rank before any data moves, naming the
# first difference (MPI alone would truncate a message on one rank and return Ok on another).
expect_stop "ranks that bucket gradients differently" "communication does not match" \
  -n 2 "$bin" --steps 4 --skew-buckets-rank 1
expect_stop "ranks that build different models" "the ranks run different models" \
  -n 2 "$bin" --steps 4 --skew-width-rank 1

expect_stop "a rank that fails" "rank 1: injected failure at step 2" \
  -n 3 --oversubscribe "$bin" --steps "$steps" --fail-rank 1
expect_stop "a rank that dies" "exited with non-zero status" \
  -n 3 --oversubscribe "$bin" --steps "$steps" --exit-rank 2
echo "MPI checks passed"
