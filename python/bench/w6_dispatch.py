"""W6 from Python: eager dispatch overhead, 10,000 iterations of ``y = x + x`` on a 4-element
float32 tensor; microseconds per op = loop time / 10,000, median (min..max) of 25 timed loops
after 2 warm-up loops (the protocol of ../shared/baselines/bench_w6_dispatch.py).

    python python/bench/w6_dispatch.py            # kiln, and numpy and torch when installed
"""

import statistics
import time

import numpy as np

ITERS = 10_000


def measure(x):
    def loop():
        for _ in range(ITERS):
            y = x + x
        return y

    for _ in range(2):
        loop()
    times = []
    for _ in range(25):
        start = time.perf_counter()
        loop()
        times.append((time.perf_counter() - start) / ITERS * 1e6)
    return statistics.median(times), min(times), max(times)


def main():
    x_np = np.arange(4, dtype=np.float32)
    cases = []
    import kiln

    cases.append(("kiln eager (kiln.tensor, no gradient)", kiln.tensor(x_np)))
    cases.append(("kiln eager (requires_grad=True)", kiln.tensor(x_np, requires_grad=True)))
    cases.append(("numpy", x_np))
    try:
        import torch

        torch.set_num_threads(1)
        cases.append((f"torch {torch.__version__} eager", torch.from_numpy(x_np)))
        cases.append(("torch eager (requires_grad=True)", torch.from_numpy(x_np.copy()).requires_grad_()))
    except ImportError:
        print("torch is not installed: measuring kiln and numpy only")
    for name, x in cases:
        median, low, high = measure(x)
        print(f"{name:45s} {median:7.3f} µs per op  ({low:.3f}..{high:.3f})")


if __name__ == "__main__":
    main()
