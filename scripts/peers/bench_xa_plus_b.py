"""`x·a + b` over 2²⁰ f32 in PyTorch, the peer of Kiln's criterion micro-workload
(`cargo bench --bench workloads -- xa_plus_b`): preallocated outputs, 1 and 2 threads,
median of 7 rounds of 200 calls, in µs per call.

usage: target/peers/.venv/bin/python scripts/peers/bench_xa_plus_b.py
"""
import statistics
import time

import torch

N, CALLS, ROUNDS = 1 << 20, 200, 7


def per_call_us(threads):
    torch.set_num_threads(threads)
    x = torch.rand(N)
    t, o = torch.empty(N), torch.empty(N)
    rounds = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(CALLS):
            torch.mul(x, 0.7, out=t)
            torch.add(t, 0.1, out=o)
        rounds.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(rounds)


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    for threads in (1, 2):
        print(f"x*a+b over 2^20 f32, {threads} thread(s): {per_call_us(threads):.1f} us")
