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
import math
import os
import tempfile
import time

import bench_common as bc
import numpy as np

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 65, 320, 128, 4, 4
PROMPT, NEW = 64, 256
WARMUP, RUNS = 2, 10
FWS = ["torch", "torch_compile", "jax_jit"]
BLOCK = ("norm1", "attention.q", "attention.k", "attention.v", "attention.o", "norm2", "ff1",
         "ff2")


def init():
    """The prompt (int64 [1, PROMPT]) and the weights by gpt_torch.py's names (PyTorch's
    layouts: a Linear weight [out, in])."""
    rng = np.random.default_rng(0)
    w = {}

    def normal(shape, std):
        return rng.normal(0.0, std, shape).astype(np.float32)
    # The positions at N(0, 1), not GPT-2's 0.02: with untrained blocks they then steer the
    # greedy choice, the tokens vary, and the first tokens check the frameworks against each
    # other (at 0.02 every framework repeats one token).
    w["gpt.tokens.weight"] = normal((VOCAB, WIDTH), 0.02)
    w["gpt.positions.weight"] = normal((CONTEXT, WIDTH), 1.0)
    residual = 0.02 / math.sqrt(2 * LAYERS)
    for i in range(LAYERS):
        for part in BLOCK:
            name = f"gpt.block{i}.{part}"
            if part.startswith("norm"):
                w[f"{name}.weight"] = np.ones(WIDTH, np.float32)
                w[f"{name}.bias"] = np.zeros(WIDTH, np.float32)
                continue
            fan_out = 4 * WIDTH if part == "ff1" else WIDTH
            fan_in = 4 * WIDTH if part == "ff2" else WIDTH
            std = residual if part in ("attention.o", "ff2") else 0.02
            w[f"{name}.weight"] = normal((fan_out, fan_in), std)
            w[f"{name}.bias"] = np.zeros(fan_out, np.float32)
    w["gpt.norm.weight"] = np.ones(WIDTH, np.float32)
    w["gpt.norm.bias"] = np.zeros(WIDTH, np.float32)
    prompt = rng.integers(0, VOCAB, size=(1, PROMPT)).astype(np.int64)
    return prompt, w


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


def report(name, case, first, summ, tokens):
    bc.emit("w14", name, case, summ, unit="ms",
            extra={"first_generation_s": first, "tokens_per_s": 1.0 / summ["median"],
                   "first_tokens": tokens[:16]})


def run_torch(fw, prompt, w):
    if fw == "torch_compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
    torch = bc.setup_torch()
    import torch.nn.functional as F
    t = {k: torch.from_numpy(v) for k, v in w.items()}
    dh = WIDTH // HEADS

    def lin(x, name):
        return F.linear(x, t[f"{name}.weight"], t[f"{name}.bias"])

    def norm(x, name):
        return F.layer_norm(x, (WIDTH,), t[f"{name}.weight"], t[f"{name}.bias"], 1e-5)

    def heads(x):
        return x.view(x.shape[0], x.shape[1], HEADS, dh).transpose(1, 2)

    def forward(idx, pos, cache, masked):
        """Logits of the last position of idx [1, T] at positions pos..pos+T, the cache
        written there; attending to the first pos + T positions (masked: to all, under a
        mask)."""
        steps = idx.shape[1]
        at = pos + torch.arange(steps)
        x = t["gpt.tokens.weight"][idx] + t["gpt.positions.weight"][at]
        for i in range(LAYERS):
            b = f"gpt.block{i}"
            h = norm(x, f"{b}.norm1")
            q, k, v = (heads(lin(h, f"{b}.attention.{p}")) for p in "qkv")
            kc, vc = cache[i]
            kc.index_copy_(2, at, k)
            vc.index_copy_(2, at, v)
            if masked:
                allowed = torch.arange(CONTEXT)[None, :] <= at[:, None]
                ctx = F.scaled_dot_product_attention(q, kc, vc, attn_mask=allowed)
            else:
                end = pos + steps
                ctx = F.scaled_dot_product_attention(q, kc[:, :, :end], vc[:, :, :end],
                                                     is_causal=steps > 1)
            x = x + lin(ctx.transpose(1, 2).reshape(1, steps, WIDTH), f"{b}.attention.o")
            h = lin(F.gelu(lin(norm(x, f"{b}.norm2"), f"{b}.ff1")), f"{b}.ff2")
            x = x + h
        return norm(x[:, -1], "gpt.norm") @ t["gpt.tokens.weight"].T

    masked = fw == "torch_compile"
    step = torch.compile(forward) if masked else forward
    idx0 = torch.from_numpy(prompt)

    def generate():
        with torch.inference_mode():
            cache = [tuple(torch.zeros(1, HEADS, CONTEXT, dh) for _ in range(2))
                     for _ in range(LAYERS)]
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
    report(name, case, first, summ, tokens)


def run_jax(prompt, w):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    from jax import lax
    p = {k: jnp.asarray(v) for k, v in w.items()}
    dh = WIDTH // HEADS

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
        allowed = jnp.arange(CONTEXT)[None, :] <= at[:, None]
        new = []
        for i in range(LAYERS):
            b = f"gpt.block{i}"
            h = norm(x, f"{b}.norm1")
            q, k, v = (lin(h, f"{b}.attention.{n}").reshape(1, steps, HEADS, dh) for n in "qkv")
            kc = lax.dynamic_update_slice(cache[i][0], k, (0, pos, 0, 0))
            vc = lax.dynamic_update_slice(cache[i][1], v, (0, pos, 0, 0))
            new.append((kc, vc))
            ctx = jax.nn.dot_product_attention(q, kc, vc, mask=allowed[None, None])
            x = x + lin(ctx.reshape(1, steps, WIDTH), f"{b}.attention.o")
            x = x + lin(jax.nn.gelu(lin(norm(x, f"{b}.norm2"), f"{b}.ff1"), approximate=False),
                        f"{b}.ff2")
        logits = norm(x[:, -1], "gpt.norm") @ p["gpt.tokens.weight"].T
        return jnp.argmax(logits, -1)[:, None], new

    step = jax.jit(forward, donate_argnums=2)
    idx0 = jnp.asarray(prompt)

    def generate():
        cache = [(jnp.zeros((1, CONTEXT, HEADS, dh)), jnp.zeros((1, CONTEXT, HEADS, dh)))
                 for _ in range(LAYERS)]
        token, cache = step(idx0, 0, cache)
        out = [token]
        for i in range(NEW - 1):
            token, cache = step(token, PROMPT + i, cache)
            out.append(token)
        return [int(tk[0, 0]) for tk in out]
    first, summ, tokens = timed(generate)
    report("jax.jit", "jit prefill and decode step (static cache + mask, donated)", first,
           summ, tokens)


def run(fw):
    prompt, w = init()
    if fw.startswith("torch"):
        run_torch(fw, prompt, w)
    else:
        run_jax(prompt, w)


if __name__ == "__main__":
    fw = bc.parse_fw(FWS)
    try:
        run(fw)
    except Exception as e:
        import traceback; traceback.print_exc()
        bc.emit_error("w14", fw, "(whole run)", e)
        raise SystemExit(1)
