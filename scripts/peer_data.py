"""Writes the W5, W9, W10 and W11 batches and initial weights of the peers' benchmarks as .npy files, so
Kiln's training steps start from the same points and their losses after 110 steps are comparable;
W13's batch and weights (as `examples/gpt.rs match` reads them); and W14's and W15's prompts
(.npy) and weights (safetensors files with PyTorch's names and layouts, which Kiln loads with
`StateDictLayout::PyTorch`).

usage: python peer_data.py PEERS_DIR OUT_DIR
  PEERS_DIR holds the peers' scripts (bench_w5_mlp.py, bench_w9_cnn.py, bench_w10_rnn.py,
  bench_w11_transformer.py, bench_w13_gpt_step.py, bench_w14_decode.py,
  bench_w15_decode.py); their init() is the one source of the data.
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

    import bench_w13_gpt_step

    import bench_w14_decode

    import bench_w15_decode

    os.makedirs(out, exist_ok=True)
    x, y, params = bench_w5_mlp.init()
    save(out, "w5", x, y, params)
    x, y, convs, dense = bench_w9_cnn.init()
    save(out, "w9", x, y, convs + dense)
    x, y, params = bench_w10_rnn.init()
    save(out, "w10", x, y, params)
    x, y, params = bench_w11_transformer.init()
    save(out, "w11", x, y, params)
    save_w13(os.path.join(out, "w13"), bench_w13_gpt_step)
    for workload, module in (("w14", bench_w14_decode), ("w15", bench_w15_decode)):
        prompt, weights = module.init()
        np.save(os.path.join(out, f"{workload}_prompt.npy"), prompt)
        save_safetensors(os.path.join(out, f"{workload}.safetensors"), weights)
    print(f"W5, W9, W10, W11, W13, W14 and W15 data -> {out}")


def save_w13(out, w13):
    """W13 as `examples/gpt.rs match` reads a run (demos::gpt::replay): init.safetensors, the
    batch once for each of the 110 steps and once more for the loss after them (x.npy, y.npy:
    i64[111, batch, context]) and meta.json."""
    x, y, weights = w13.init()
    os.makedirs(out, exist_ok=True)
    save_safetensors(os.path.join(out, "init.safetensors"), weights)
    for name, a in (("x.npy", x), ("y.npy", y)):
        np.save(os.path.join(out, name), np.broadcast_to(a, (111,) + a.shape).copy())
    meta = dict(w13.META, vocab=w13.SIZES.vocab, context=w13.SIZES.context, batch=w13.BATCH)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


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
