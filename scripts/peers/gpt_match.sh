#!/usr/bin/env bash
# Kiln's GPT recipe against PyTorch from the same initial weights and batches (issue 51):
# Kiln writes the recipe's first batches, PyTorch trains on them from its own seeded weights
# (saved as its state_dict), Kiln loads those weights (StateDictLayout::PyTorch) and trains on
# the same batches, compiled and eagerly; each per-step loss must be within 1e-4 relative.
#   scripts/peers/gpt_match.sh [PYTHON] [STEPS]     (a Python with torch and safetensors)
#   GPT_TIME=N   also time N steps of PyTorch eager and torch.compile on the same batches
#                (Kiln's median step is printed by `gpt match`)
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${1:-python3}"
steps="${2:-50}"
dir=target/gpt-match
cargo run --release --locked --example gpt -- batches "$dir" --steps "$steps"
"$python" scripts/peers/gpt_torch.py "$dir" ${GPT_TIME:+--time "$GPT_TIME"}
cargo run --release --locked --example gpt -- match "$dir" | tail -1
cargo run --release --locked --example gpt -- match "$dir" --eager | tail -1
