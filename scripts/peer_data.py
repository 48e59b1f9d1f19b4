"""Writes the W5, W9, W10 and W11 batches and initial weights of the peers' benchmarks as .npy files, so
Kiln's training steps start from the same points and their losses after 110 steps are comparable.

usage: python peer_data.py PEERS_DIR OUT_DIR
  PEERS_DIR holds the peers' scripts (bench_w5_mlp.py, bench_w9_cnn.py, bench_w10_rnn.py,
  bench_w11_transformer.py); their
  init() is the one
  source of the data.
"""
import os
import sys

import numpy as np


def main():
    peers, out = sys.argv[1:3]
    sys.path.insert(0, os.path.abspath(peers))
    import bench_w5_mlp

    import bench_w9_cnn

    import bench_w10_rnn

    import bench_w11_transformer

    os.makedirs(out, exist_ok=True)
    x, y, params = bench_w5_mlp.init()
    save(out, "w5", x, y, params)
    x, y, convs, dense = bench_w9_cnn.init()
    save(out, "w9", x, y, convs + dense)
    x, y, params = bench_w10_rnn.init()
    save(out, "w10", x, y, params)
    x, y, params = bench_w11_transformer.init()
    save(out, "w11", x, y, params)
    print(f"W5, W9, W10 and W11 data -> {out}")


def save(out, workload, x, y, params):
    """`<workload>_x`, `_y`, then `_w<i>` and `_b<i>` for each layer, from 1."""
    np.save(os.path.join(out, f"{workload}_x.npy"), x)
    np.save(os.path.join(out, f"{workload}_y.npy"), y)
    for i, (w, b) in enumerate(params, start=1):
        np.save(os.path.join(out, f"{workload}_w{i}.npy"), w)
        np.save(os.path.join(out, f"{workload}_b{i}.npy"), b)


if __name__ == "__main__":
    main()
