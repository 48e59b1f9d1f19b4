"""W14 greedy decoding with a KV cache (Kiln's workload; the peers' side, in their harness's
format).

The GPT recipe's model (examples/gpt.rs: 4 layers, 4 heads, width 128, a 65-token vocabulary)
with a context of 320, at batch 1: a 64-token prompt prefilled, then 256 tokens decoded one at a
time, greedy. Every framework keeps a KV cache for the whole context — PyTorch eager attends to
the cache's first `pos + 1` positions (as Hugging Face's dynamic cache); torch.compile and
jax.jit attend to all of it under a mask (a static cache: one compiled step for every position),
the cache written in place (`index_copy_`; `lax.dynamic_update_slice` with the cache donated).
The weights are drawn once with numpy (seed 0; GPT-2's initialisation: N(0, 0.02), the residual
projections N(0, 0.02/√(2·layers)), biases 0, norms 1 and 0 — but the positions N(0, 1)), named as
scripts/peers/gpt_torch.py names them; the prompt is drawn from the same generator.
Timing: 2 warm-up generations (the first includes any compile), then 10 timed; the median
(min..max) of the whole generation's time (prefill included) divided by 256, in ms a token.

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it beside the peers'
bench_common.py and runs it through their run_one.py.
"""
import collections
import math
import os
import tempfile
import time

import bench_common as bc
import numpy as np

Sizes = collections.namedtuple("Sizes", "vocab context width heads layers")
SIZES = Sizes(vocab=65, context=320, width=128, heads=4, layers=4)
PROMPT, NEW = 64, 256
WARMUP, RUNS = 2, 10
FWS = ["torch", "torch_compile", "jax_jit"]
BLOCK = ("norm1", "attention.q", "attention.k", "attention.v", "attention.o", "norm2", "ff1",
         "ff2")


def init():
    """The prompt (int64 [1, PROMPT]) and the weights by gpt_torch.py's names (PyTorch's
    layouts: a Linear weight [out, in])."""
    rng = np.random.default_rng(0)
    # The positions at N(0, 1), not GPT-2's 0.02: with untrained blocks they then steer the
    # greedy choice, the tokens vary, and the first tokens check the frameworks against each
    # other (at 0.02 every framework repeats one token).
    w = gpt_weights(rng, SIZES, position_std=1.0)
    prompt = rng.integers(0, SIZES.vocab, size=(1, PROMPT)).astype(np.int64)
    return prompt, w


def gpt_weights(rng, sizes, position_std=0.02):
    """A GPT's weights drawn with GPT-2's initialisation (N(0, 0.02), the residual projections
    N(0, 0.02/√(2·layers)), biases 0, norms 1 and 0; the positions N(0, position_std)), by
    gpt_torch.py's names and PyTorch's layouts (a Linear weight [out, in])."""
    width, layers = sizes.width, sizes.layers
    w = {}

    def normal(shape, std):
        return rng.normal(0.0, std, shape).astype(np.float32)
    w["gpt.tokens.weight"] = normal((sizes.vocab, width), 0.02)
    w["gpt.positions.weight"] = normal((sizes.context, width), position_std)
    residual = 0.02 / math.sqrt(2 * layers)
    for i in range(layers):
        for part in BLOCK:
            name = f"gpt.block{i}.{part}"
            if part.startswith("norm"):
                w[f"{name}.weight"] = np.ones(width, np.float32)
                w[f"{name}.bias"] = np.zeros(width, np.float32)
                continue
            fan_out = 4 * width if part == "ff1" else width
            fan_in = 4 * width if part == "ff2" else width
            std = residual if part in ("attention.o", "ff2") else 0.02
            w[f"{name}.weight"] = normal((fan_out, fan_in), std)
            w[f"{name}.bias"] = np.zeros(fan_out, np.float32)
    w["gpt.norm.weight"] = np.ones(width, np.float32)
    w["gpt.norm.bias"] = np.zeros(width, np.float32)
    return w


def timed(generate):
    """generate() returns the new tokens; WARMUP untimed runs (the first timed alone), then
    RUNS timed. The summary is per token."""
    t0 = time.perf_counter(); tokens = generate(); first = time.perf_counter() - t0
    for _ in range(WARMUP - 1):
        generate()
    samples = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        again = generate()
        samples.append((time.perf_counter() - t0) / NEW)
    assert again == tokens, "greedy decoding is not deterministic"
    return first, bc.summarize(samples), tokens


def report(workload, name, case, first, summ, tokens):
    bc.emit(workload, name, case, summ, unit="ms",
            extra={"first_generation_s": first, "tokens_per_s": 1.0 / summ["median"],
                   "first_tokens": tokens[:16]})


def run_torch(fw, prompt, w, sizes, workload):
    if fw == "torch_compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
    torch = bc.setup_torch()
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    dh = sizes.width // sizes.heads

    def lin(x, name):
        return F.linear(x, t[f"{name}.weight"], t[f"{name}.bias"])

    def norm(x, name):
        return F.layer_norm(x, (sizes.width,), t[f"{name}.weight"], t[f"{name}.bias"], 1e-5)

    def heads(x):
        return x.view(x.shape[0], x.shape[1], sizes.heads, dh).transpose(1, 2)

    def forward(idx, pos, cache, masked):
        """Logits of the last position of idx [1, T] at positions pos..pos+T, the cache
        written there; attending to the first pos + T positions (masked: to all, under a
        mask)."""
        steps = idx.shape[1]
        at = pos + torch.arange(steps)
        x = t["gpt.tokens.weight"][idx] + t["gpt.positions.weight"][at]
        for i in range(sizes.layers):
            b = f"gpt.block{i}"
            h = norm(x, f"{b}.norm1")
            q, k, v = (heads(lin(h, f"{b}.attention.{p}")) for p in "qkv")
            kc, vc = cache[i]
            kc.index_copy_(2, at, k)
            vc.index_copy_(2, at, v)
            if masked:
                allowed = torch.arange(sizes.context)[None, :] <= at[:, None]
                ctx = F.scaled_dot_product_attention(q, kc, vc, attn_mask=allowed)
            else:
                end = pos + steps
                ctx = F.scaled_dot_product_attention(q, kc[:, :, :end], vc[:, :, :end],
                                                     is_causal=steps > 1)
            x = x + lin(ctx.transpose(1, 2).reshape(1, steps, sizes.width), f"{b}.attention.o")
            h = lin(F.gelu(lin(norm(x, f"{b}.norm2"), f"{b}.ff1")), f"{b}.ff2")
            x = x + h
        return norm(x[:, -1], "gpt.norm") @ t["gpt.tokens.weight"].T

    masked = fw == "torch_compile"
    step = torch.compile(forward) if masked else forward
    idx0 = torch.from_numpy(prompt)

    def generate():
        with torch.inference_mode():
            cache = [tuple(torch.zeros(1, sizes.heads, sizes.context, dh) for _ in range(2))
                     for _ in range(sizes.layers)]
            # The prefill is eager in both forms (one call of one shape).
            logits = forward(idx0, torch.tensor(0), cache, False)
            out = []
            for i in range(NEW):
                token = logits.argmax(-1, keepdim=True)
                out.append(int(token))
                if i + 1 < NEW:
                    logits = step(token, torch.tensor(PROMPT + i), cache, masked)
            return out
    first, summ, tokens = timed(generate)
    if fw == "torch":
        name, case = "torch eager", "inference_mode, cache sliced to pos (dynamic), SDPA"
    else:
        name, case = "torch.compile (inductor)", "compiled decode step, static cache + mask"
    report(workload, name, case, first, summ, tokens)


def run_jax(prompt, w, sizes, workload):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    from jax import lax
    p = {k: jnp.asarray(v) for k, v in w.items()}
    dh = sizes.width // sizes.heads

    def lin(x, name):
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    def norm(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) * lax.rsqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def forward(idx, pos, cache):
        steps = idx.shape[1]
        at = pos + jnp.arange(steps)
        x = p["gpt.tokens.weight"][idx] + p["gpt.positions.weight"][at]
        allowed = jnp.arange(sizes.context)[None, :] <= at[:, None]
        new = []
        for i in range(sizes.layers):
            b = f"gpt.block{i}"
            h = norm(x, f"{b}.norm1")
            q, k, v = (lin(h, f"{b}.attention.{n}").reshape(1, steps, sizes.heads, dh)
                       for n in "qkv")
            kc = lax.dynamic_update_slice(cache[i][0], k, (0, pos, 0, 0))
            vc = lax.dynamic_update_slice(cache[i][1], v, (0, pos, 0, 0))
            new.append((kc, vc))
            ctx = jax.nn.dot_product_attention(q, kc, vc, mask=allowed[None, None])
            x = x + lin(ctx.reshape(1, steps, sizes.width), f"{b}.attention.o")
            x = x + lin(jax.nn.gelu(lin(norm(x, f"{b}.norm2"), f"{b}.ff1"), approximate=False),
                        f"{b}.ff2")
        logits = norm(x[:, -1], "gpt.norm") @ p["gpt.tokens.weight"].T
        return jnp.argmax(logits, -1)[:, None], new

    step = jax.jit(forward, donate_argnums=2)
    idx0 = jnp.asarray(prompt)

    def generate():
        shape = (1, sizes.context, sizes.heads, dh)
        cache = [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(sizes.layers)]
        token, cache = step(idx0, 0, cache)
        out = [token]
        for i in range(NEW - 1):
            token, cache = step(token, PROMPT + i, cache)
            out.append(token)
        return [int(tk[0, 0]) for tk in out]
    first, summ, tokens = timed(generate)
    report(workload, "jax.jit", "jit prefill and decode step (static cache + mask, donated)",
           first, summ, tokens)


def run(fw, workload="w14", sizes=SIZES, data=init):
    """Times fw's decoding of a model of these sizes from data()'s prompt and weights."""
    prompt, w = data()
    if fw.startswith("torch"):
        run_torch(fw, prompt, w, sizes, workload)
    else:
        run_jax(prompt, w, sizes, workload)


def main(workload="w14", sizes=SIZES, data=init):
    """Runs the framework --fw names; a failure is recorded, then exits 1."""
    fw = bc.parse_fw(FWS)
    try:
        run(fw, workload, sizes, data)
    except Exception as e:
        import traceback; traceback.print_exc()
        bc.emit_error(workload, fw, "(whole run)", e)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
