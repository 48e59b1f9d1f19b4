#!/usr/bin/env bash
# Runs the peers' benchmark scripts and Kiln's on the same workloads, one after another on this
# machine, and writes the comparison (ratios to the best peer of this run) into BENCHMARKS.md.
#
# usage: scripts/compare_peers.sh [workload ...]   (default: w2 w3 w4 w5 w6 w8 w9 w10 w11 w12 w13 w14 w15; w5 gives w7)
#   W9 (the digits CNN training step), W10 (a recurrent network's) and W11 (a transformer
#   encoder's) are Kiln's own workloads: their peer scripts are scripts/peers/bench_w9_cnn.py,
#   bench_w10_rnn.py and bench_w11_transformer.py,
#   run through the peers' run_one.py like theirs. W12 (epochs of the Fashion-MNIST CNN, data
#   loading included) needs Debian's dataset-fashion-mnist (or FASHION_MNIST_DIR) and PyTorch
#   (bench_w12_fashion_epoch.py). W13 (the GPT recipe's training step) is bench_w13_gpt_step.py;
#   W14 (greedy decoding of the GPT recipe's model through a KV cache, batch 1) is
#   bench_w14_decode.py, W15 (the same for a GPT-2-124M-shaped model, against the memory
#   bandwidth Kiln's run measures) bench_w15_decode.py.
#   PEERS_DIR=dir   the peers' scripts and Python environment (default: target/peers, copied from
#                   ../shared/baselines and installed with its install.sh on first use)
#   SKIP="w6:tinygrad ..."   peer runs to leave out (passed to run_all.sh)
#   KILN_ONLY=1     keep the peers' results of an earlier run and rerun only Kiln
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS=${PEERS_DIR:-$ROOT/target/peers}
WL=("$@")
[ ${#WL[@]} -eq 0 ] && WL=(w2 w3 w4 w5 w6 w8 w9 w10 w11 w12 w13 w14 w15)

if [ ! -x "$PEERS/.venv/bin/python" ]; then
  echo "== installing the peers into $PEERS"
  mkdir -p "$PEERS"
  cp -rn "$ROOT/../shared/baselines/." "$PEERS/"
  "$PEERS/install.sh"
fi
PY="$PEERS/.venv/bin/python"
command -v clang > /dev/null || echo "== note: tinygrad compiles its CPU kernels with clang, which is missing (apt-get install clang): its runs will fail"
# Kiln's own peer scripts (W9) and the digits they train on, beside the peers' harness.
cp "$ROOT"/scripts/peers/*.py "$ROOT/data/digits.csv.gz" "$PEERS/"

echo "== building Kiln's runner"
(cd "$ROOT" && cargo build --release --locked --example peer_workloads)
"$PY" "$ROOT/scripts/peer_data.py" "$PEERS" "$PEERS/kiln_data"

if [ -z "${KILN_ONLY:-}" ]; then
  echo "== peers (each in its own process, waiting for an idle machine)"
  SHARED=() OWN=()
  for w in "${WL[@]}"; do [[ " w9 w10 w11 w12 w13 w14 w15 " == *" $w "* ]] && OWN+=("$w") || SHARED+=("$w"); done
  [ ${#SHARED[@]} -gt 0 ] && (cd "$PEERS" && BENCH_OUT=results ./run_all.sh "${SHARED[@]}")
  for w in "${OWN[@]}"; do
    rm -f "$PEERS/results/$w.jsonl"
    case $w in
      w9) script=bench_w9_cnn.py; fws="torch torch_compile jax_jit paddle" ;;
      w10) script=bench_w10_rnn.py; fws="torch torch_loop jax_scan jax_fori" ;;
      w11) script=bench_w11_transformer.py; fws="torch torch_compile jax_jit" ;;
      w12) script=bench_w12_fashion_epoch.py; fws="torch" ;;
      w13) script=bench_w13_gpt_step.py; fws="torch torch_compile jax_jit" ;;
      w14) script=bench_w14_decode.py; fws="torch torch_compile jax_jit" ;;
      w15) script=bench_w15_decode.py; fws="torch torch_compile jax_jit" ;;
    esac
    for fw in $fws; do
      [ -n "${SKIP:-}" ] && [[ " $SKIP " == *" $w:$fw "* ]] && continue
      (cd "$PEERS" && BENCH_OUT=results python3 run_one.py "$w" "$fw" "$script" "logs/run_${w}_$fw.log")
    done
  done
else
  # Drop only Kiln's records of the earlier run.
  "$PY" "$ROOT/scripts/compare_table.py" --drop-kiln "$PEERS/results" "${WL[@]}"
fi

echo "== Kiln, on all cores and on one thread (guarded like the peers' runs)"
RUNNER="$ROOT/target/release/examples/peer_workloads"
GUARD=("$PY" "$ROOT/scripts/run_guarded.py" "$PEERS" "$PEERS/results" --)
"${GUARD[@]}" "$RUNNER" --data "$PEERS/kiln_data" "${WL[@]}"
"${GUARD[@]}" env RAYON_NUM_THREADS=1 "$RUNNER" --data "$PEERS/kiln_data" "${WL[@]}"

echo "== tables"
(cd "$PEERS" && "$PY" make_tables.py > results/tables.md)
"$PY" "$ROOT/scripts/compare_table.py" "$PEERS/results" "$ROOT/BENCHMARKS.md"
echo "comparison -> BENCHMARKS.md (all records: $PEERS/results/tables.md)"
