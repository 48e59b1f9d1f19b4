"""Writes the W5 batch and initial weights of the peers' benchmark as .npy files, so Kiln's
W5 step starts from the same point and its loss after 110 steps is comparable.

usage: python peer_data.py PEERS_DIR OUT_DIR
  PEERS_DIR holds the peers' scripts (bench_w5_mlp.py); its init() is the one source of the data.
"""
import os
import sys

import numpy as np


def main():
    peers, out = sys.argv[1:3]
    sys.path.insert(0, os.path.abspath(peers))
    import bench_w5_mlp

    x, y, params = bench_w5_mlp.init()
    os.makedirs(out, exist_ok=True)
    np.save(os.path.join(out, "w5_x.npy"), x)
    np.save(os.path.join(out, "w5_y.npy"), y)
    for i, (w, b) in enumerate(params, start=1):
        np.save(os.path.join(out, f"w5_w{i}.npy"), w)
        np.save(os.path.join(out, f"w5_b{i}.npy"), b)
    print(f"W5 data -> {out}")


if __name__ == "__main__":
    main()
