"""Writes the W5, W9, W10 and W11 batches and initial weights of the peers' benchmarks as .npy files, so
Kiln's training steps start from the same points and their losses after 110 steps are comparable;
and W14's prompt (.npy) and weights (a safetensors file with PyTorch's names and layouts, which
Kiln loads with `StateDictLayout::PyTorch`).

usage: python peer_data.py PEERS_DIR OUT_DIR
  PEERS_DIR holds the peers' scripts (bench_w5_mlp.py, bench_w9_cnn.py, bench_w10_rnn.py,
  bench_w11_transformer.py, bench_w14_decode.py); their init() is the one source of the data.
"""
import json
import os
import struct
import sys

import numpy as np


def main():
    peers, out = sys.argv[1:3]
    sys.path.insert(0, os.path.abspath(peers))
    import bench_w5_mlp

    import bench_w9_cnn

    import bench_w10_rnn

    import bench_w11_transformer

    import bench_w14_decode

    os.makedirs(out, exist_ok=True)
    x, y, params = bench_w5_mlp.init()
    save(out, "w5", x, y, params)
    x, y, convs, dense = bench_w9_cnn.init()
    save(out, "w9", x, y, convs + dense)
    x, y, params = bench_w10_rnn.init()
    save(out, "w10", x, y, params)
    x, y, params = bench_w11_transformer.init()
    save(out, "w11", x, y, params)
    prompt, weights = bench_w14_decode.init()
    np.save(os.path.join(out, "w14_prompt.npy"), prompt)
    save_safetensors(os.path.join(out, "w14.safetensors"), weights)
    print(f"W5, W9, W10, W11 and W14 data -> {out}")


def save(out, workload, x, y, params):
    """`<workload>_x`, `_y`, then `_w<i>` and `_b<i>` for each layer, from 1."""
    np.save(os.path.join(out, f"{workload}_x.npy"), x)
    np.save(os.path.join(out, f"{workload}_y.npy"), y)
    for i, (w, b) in enumerate(params, start=1):
        np.save(os.path.join(out, f"{workload}_w{i}.npy"), w)
        np.save(os.path.join(out, f"{workload}_b{i}.npy"), b)


def save_safetensors(path, arrays):
    """`arrays` (name -> f32 array) in the safetensors format: the header's length (u64, little
    endian), the JSON header, then each tensor's bytes (the peers' environment may lack the
    safetensors package)."""
    header, offset = {}, 0
    for name, a in arrays.items():
        size = a.astype("<f4").nbytes
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in arrays.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


if __name__ == "__main__":
    main()
