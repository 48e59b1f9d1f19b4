"""W13 the GPT recipe's training step (Kiln's workload; the peers' side, in their harness's
format).

nanoGPT's CPU recipe (examples/gpt.rs; scripts/peers/gpt_torch.py is its PyTorch peer): a GPT of
4 layers, 4 heads, width 128 and context 64 over a 65-token vocabulary, batch 12; a step is the
forward pass, the cross-entropy over every position, the backward pass, the gradients clipped at
global norm 1, and AdamW (β 0.9/0.99, ε 1e-8, decay 0.1 on the matrices only) at the learning
rate of nanoGPT's warm-up and cosine (peak 1e-3 after 100 steps, 1e-4 at step 2,000).
The weights are drawn once with numpy (seed 0; GPT-2's initialisation, bench_w14_decode.py's
gpt_weights), the batch too (12 windows of 65 random tokens: inputs and the next token), so
every framework starts from the same point and trains on the same batch.
Timing as W5: 10 warm-up steps (the first is the compile / first call), then 100 steps timed
individually; median (min..max) ms per full step; the loss after the 110 steps.

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it beside the peers'
bench_common.py and runs it through their run_one.py.
"""
import os
import tempfile

import bench_common as bc
import bench_w14_decode as w14
import numpy as np
import training_steps

SIZES = w14.Sizes(vocab=65, context=64, width=128, heads=4, layers=4)
BATCH = 12
# The recipe's rule, in gpt_torch.py's names (Kiln's write_batches writes the same meta.json).
META = {"lr": 1e-3, "min_lr": 1e-4, "warmup": 100, "decay_end": 2000, "betas": [0.9, 0.99],
        "weight_decay": 0.1, "clip": 1.0}
FWS = ["torch", "torch_compile", "jax_jit"]


def init():
    """x, y int64 [BATCH, context] (a window and its next tokens) and the weights by
    gpt_torch.py's names and PyTorch's layouts."""
    rng = np.random.default_rng(0)
    w = w14.gpt_weights(rng, SIZES)
    windows = rng.integers(0, SIZES.vocab, size=(BATCH, SIZES.context + 1)).astype(np.int64)
    return windows[:, :-1].copy(), windows[:, 1:].copy(), w


def report(name, case, first, summ, losses):
    """losses: the first step's and the one after the 110 steps."""
    bc.emit("w13", name, case, summ, unit="ms",
            extra={"first_step_s": first, "first_loss": losses[0],
                   "loss_after_110_steps": losses[-1]})


def run_torch(fw, x, y, w):
    if fw == "torch_compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
    torch = bc.setup_torch()
    import gpt_torch
    model = gpt_torch.Model(**SIZES._asdict())
    model.load_state_dict({k: torch.from_numpy(v) for k, v in w.items()})
    optimizer = gpt_torch.optimizer_of(model, META)
    forward = model if fw == "torch" else torch.compile(model)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    done, losses = [0], []

    def step():
        for g in optimizer.param_groups:
            g["lr"] = gpt_torch.lr_at(done[0], META)
        loss = forward(tx, ty)
        if not losses:
            losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), META["clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done[0] += 1
    first, summ = training_steps.timed_loop(step)
    with torch.no_grad():
        losses.append(float(model(tx, ty)))
    if fw == "torch":
        name, case = "torch eager", "gpt_torch.Model (SDPA) + clip_grad_norm_ + AdamW (2 groups)"
    else:
        name, case = "torch.compile (inductor)", "compile(model+loss) fwd/bwd, eager clip + AdamW"
    report(name, case, first, summ, losses)


def run_jax(x, y, w):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    from jax import lax
    tree = jax.tree_util
    sizes, dh = SIZES, SIZES.width // SIZES.heads

    def lin(p, h, name):
        return h @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    def norm(p, h, name):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) * lax.rsqrt(var + 1e-5) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def lossf(p, xx, yy):
        n, steps = xx.shape
        h = p["gpt.tokens.weight"][xx] + p["gpt.positions.weight"][:steps]
        for i in range(sizes.layers):
            b = f"gpt.block{i}"
            a = norm(p, h, f"{b}.norm1")
            q, k, v = (lin(p, a, f"{b}.attention.{c}").reshape(n, steps, sizes.heads, dh)
                       for c in "qkv")
            ctx = jax.nn.dot_product_attention(q, k, v, is_causal=True)
            h = h + lin(p, ctx.reshape(n, steps, sizes.width), f"{b}.attention.o")
            f = jax.nn.gelu(lin(p, norm(p, h, f"{b}.norm2"), f"{b}.ff1"), approximate=False)
            h = h + lin(p, f, f"{b}.ff2")
        logits = norm(p, h, "gpt.norm") @ p["gpt.tokens.weight"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(logp, yy[..., None], -1).mean()

    def lr_at(t):
        """nanoGPT's get_lr at step t (from 0), as gpt_torch.lr_at."""
        warm, end, peak, floor = META["warmup"], META["decay_end"], META["lr"], META["min_lr"]
        along = jnp.minimum((t - warm) / (end - warm), 1.0)
        cosine = floor + 0.5 * (1.0 + jnp.cos(jnp.pi * along)) * (peak - floor)
        return jnp.where(t < warm, peak * (t + 1) / (warm + 1), cosine)

    b1, b2 = META["betas"]

    def train_step(state, xx, yy):
        """value_and_grad, clip_grad_norm_, then torch.optim.AdamW's update on two groups."""
        p, m, v, t = state
        loss, g = jax.value_and_grad(lossf)(p, xx, yy)
        total = jnp.sqrt(sum(jnp.sum(d * d) for d in tree.tree_leaves(g)))
        g = tree.tree_map(lambda d: d * jnp.minimum(META["clip"] / (total + 1e-6), 1.0), g)
        lr = lr_at(t)
        t = t + 1
        m = tree.tree_map(lambda a, d: b1 * a + (1 - b1) * d, m, g)
        v = tree.tree_map(lambda a, d: b2 * a + (1 - b2) * d * d, v, g)
        c1, c2 = 1 - b1 ** t, jnp.sqrt(1 - b2 ** t)

        def update(name):
            decay = META["weight_decay"] if p[name].ndim >= 2 else 0.0
            kept = p[name] * (1 - lr * decay)
            return kept - lr / c1 * m[name] / (jnp.sqrt(v[name]) / c2 + 1e-8)
        return ({name: update(name) for name in p}, m, v, t), loss

    train_step = jax.jit(train_step, donate_argnums=0)
    p = {k: jnp.asarray(a) for k, a in w.items()}
    zeros = tree.tree_map(jnp.zeros_like, p)
    st = {"s": (p, zeros, tree.tree_map(jnp.zeros_like, p), jnp.float32(0))}
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    losses = []

    def step():
        st["s"], loss = train_step(st["s"], jx, jy)
        jax.block_until_ready(st["s"])
        if not losses:
            losses.append(float(loss))
    first, summ = training_steps.timed_loop(step)
    losses.append(float(jax.jit(lossf)(st["s"][0], jx, jy)))
    report("jax.jit", "jit(value_and_grad + clip + AdamW update), donated state", first, summ,
           losses)


def run(fw):
    x, y, w = init()
    if fw.startswith("torch"):
        run_torch(fw, x, y, w)
    else:
        run_jax(x, y, w)


if __name__ == "__main__":
    training_steps.main("w13", FWS, run)
