"""W12: epochs of the Fashion-MNIST CNN, data loading included (Kiln's workload; the peers'
side, in their harness's format).

The tour's CNN: x f32[64,1,28,28] → conv 3×3 pad 1 (32, ReLU) → max pool 2×2 → conv 3×3 pad 1
(64, ReLU) → max pool 2×2 → flatten (3136) → dense 128 (ReLU) → dense 10; softmax
cross-entropy; Adam, lr 0.001; batch 64, shuffled each epoch. The training images are read
once from Debian's dataset-fashion-mnist (the IDX files, as Kiln reads them; FASHION_MNIST_DIR
overrides the folder), scaled to [0, 1]; each epoch is timed from its first batch to its last
step — the DataLoader's shuffling and batching included — three epochs, then the test
accuracy. Each framework starts from its own default initialisation, so the losses agree
only roughly.

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh runs it through the peers' run_one.py.
"""
import gzip
import os
import time

import numpy as np

import bench_common as bc

EPOCHS, BATCH, LR = 3, 64, 1e-3
FWS = ["torch"]
DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def idx(name):
    """An IDX file of unsigned bytes, gzipped or not, as a numpy array."""
    path = os.path.join(DIR, name)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load():
    x = (idx("train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)[:, None]
    y = idx("train-labels-idx1-ubyte.gz").astype(np.int64)
    tx = (idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)[:, None]
    ty = idx("t10k-labels-idx1-ubyte.gz").astype(np.int64)
    return x, y, tx, ty


def run_torch():
    torch = bc.setup_torch()
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset
    t0 = time.perf_counter()
    x, y, tx, ty = load()
    load_s = time.perf_counter() - t0
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                        batch_size=BATCH, shuffle=True)
    samples, losses = [], []
    for _ in range(EPOCHS):
        t0, total, n = time.perf_counter(), 0.0, 0
        for xb, yb in loader:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            total, n = total + float(loss) * len(yb), n + len(yb)
        samples.append(time.perf_counter() - t0)
        losses.append(total / n)
    with torch.no_grad():
        logits = torch.cat([model(torch.from_numpy(tx[i:i + 1000])) for i in range(0, len(tx), 1000)])
        accuracy = float((logits.argmax(1).numpy() == ty).mean())
    bc.emit("w12", "torch eager", "nn.Sequential + optim.Adam, DataLoader(TensorDataset, shuffle, "
            "batch 64, num_workers=0)", bc.summarize(samples), unit="s",
            extra={"load_s": load_s, "mean_loss_last_epoch": losses[-1],
                   "test_accuracy": accuracy, "epochs": EPOCHS})


def main():
    fw = bc.parse_fw(FWS)
    try:
        run_torch()
    except Exception as e:
        import traceback; traceback.print_exc()
        bc.emit_error("w12", fw, "(whole run)", e)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
