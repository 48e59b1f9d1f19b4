"""W15 greedy decoding of a GPT-2-124M-shaped model with a KV cache (Kiln's workload; the peers'
side, in their harness's format).

W14's decoding (bench_w14_decode.py: a 64-token prompt prefilled, 256 tokens decoded greedily at
batch 1, each framework with its cache) for GPT-2's small sizes: a 50,257-token vocabulary, a
context of 1,024, width 768, 12 heads, 12 layers (124 M parameters, the output head tied to the
token embedding). Random weights with GPT-2's initialisation (seed 0; the positions N(0, 1), as
W14's, so the tokens vary and check the frameworks against each other). Each token reads every
weight once (~497 MB in f32), so the memory-bandwidth bound is the STREAM copy rate over the
weight bytes a token; Kiln's record (peer_workloads w15) measures that rate on this machine.

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it beside the peers'
bench_common.py and runs it through their run_one.py.
"""
import bench_w14_decode as w14
import numpy as np

SIZES = w14.Sizes(vocab=50257, context=1024, width=768, heads=12, layers=12)


def init():
    """The prompt (int64 [1, 64]) and the weights by gpt_torch.py's names and PyTorch's
    layouts."""
    rng = np.random.default_rng(0)
    w = w14.gpt_weights(rng, SIZES, position_std=1.0)
    prompt = rng.integers(0, SIZES.vocab, size=(1, w14.PROMPT)).astype(np.int64)
    return prompt, w


if __name__ == "__main__":
    w14.main("w15", SIZES, init)
