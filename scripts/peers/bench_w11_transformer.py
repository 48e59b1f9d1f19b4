"""W11 transformer training step (Kiln's workload; the peers' side, in their harness's format).

A 2-layer pre-norm transformer encoder: each layer x ← x + attn(LN(x)), x ← x + FF(LN(x)) with
4-head causal self-attention (d_model 256, projections with biases) and FF = dense 1024, exact
GELU, dense 256; a final layer norm; loss mean((out − y)²). x f32[16,128,256] ~ N(0, 1) and the
target is x one token back (y_t = x_{t−1}, y_0 = 0): the causal model can learn to copy it.
Adam (lr 1e-4, betas 0.9/0.999, eps 1e-8, PyTorch's bias correction).
The data and initial weights are drawn once with numpy (seed 0; linear layers U(±1/√fan_in),
PyTorch's bounds; layer norms γ = 1, β = 0), so every framework starts from the same point.
Timing as W5: 10 warm-up steps (the first is the compile / first call), then 100 steps timed
individually; median (min..max) ms per full step (forward + backward + update).

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it beside the peers'
bench_common.py and runs it through their run_one.py.
"""
import os
import tempfile

import bench_common as bc
import training_steps
import numpy as np

B, T, D, HEADS, FF, LAYERS, LR, EPS = 16, 128, 256, 4, 1024, 2, 1e-4, 1e-5
FWS = ["torch", "torch_compile", "jax_jit"]
# One layer's (weight, bias) pairs in order; weights [in, out] as Kiln keeps them.
LAYER = (("norm1", None), ("q", (D, D)), ("k", (D, D)), ("v", (D, D)), ("o", (D, D)),
         ("norm2", None), ("ff1", (D, FF)), ("ff2", (FF, D)))


def init():
    """x, y [B,T,D] f32 and the list of (weight, bias) pairs: each layer's LAYER, then the
    final norm's (γ, β)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    y = np.zeros_like(x)
    y[:, 1:] = x[:, :-1]
    params = []
    for _ in range(LAYERS):
        for _, shape in LAYER:
            if shape is None:
                params.append((np.ones(D, np.float32), np.zeros(D, np.float32)))
            else:
                bound = 1.0 / np.sqrt(shape[0])
                params.append((rng.uniform(-bound, bound, shape).astype(np.float32),
                               rng.uniform(-bound, bound, shape[1:]).astype(np.float32)))
    params.append((np.ones(D, np.float32), np.zeros(D, np.float32)))
    return x, y, params


def layers_of(params):
    """The params list as per-layer dicts of LAYER's names, and the final norm."""
    n = len(LAYER)
    return ([dict(zip((name for name, _ in LAYER), params[i * n:(i + 1) * n]))
             for i in range(LAYERS)], params[-1])


def loss_np(x, y, params):
    """The initial loss in f64 (a check on every framework's first step)."""
    from math import erf, sqrt
    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / sqrt(2.0))))
    f64 = [(w.astype(np.float64), b.astype(np.float64)) for w, b in params]
    layers, final = layers_of(f64)

    def norm(h, gb):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(var + EPS) * gb[0] + gb[1]

    def lin(h, wb):
        return h @ wb[0] + wb[1]

    def heads(h):
        return h.reshape(B, T, HEADS, D // HEADS).transpose(0, 2, 1, 3)

    causal = np.tril(np.ones((T, T), bool))
    h = x.astype(np.float64)
    for p in layers:
        a = norm(h, p["norm1"])
        q, k, v = (heads(lin(a, p[n])) for n in "qkv")
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // HEADS)
        s = np.where(causal, s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        ctx = (s / s.sum(-1, keepdims=True)) @ v
        h = h + lin(ctx.transpose(0, 2, 1, 3).reshape(B, T, D), p["o"])
        h = h + lin(gelu(lin(norm(h, p["norm2"]), p["ff1"])), p["ff2"])
    return float(((norm(h, final) - y) ** 2).mean())


def report(name, case, first, summ, final_loss, loss0):
    training_steps.report("w11", name, case, first, summ, final_loss, loss0)


def run_torch(fw, x, y, params, loss0):
    if fw == "torch_compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
    torch = bc.setup_torch()
    import torch.nn as nn
    layers, final = layers_of(params)
    encoder = nn.Sequential(*[
        nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation="gelu",
                                   batch_first=True, norm_first=True)
        for _ in range(LAYERS)])
    norm = nn.LayerNorm(D, eps=EPS)

    def tensor(a, transpose=False):
        return torch.from_numpy(np.ascontiguousarray(a.T if transpose else a))
    with torch.no_grad():
        for layer, p in zip(encoder, layers):
            attn = layer.self_attn
            attn.in_proj_weight.copy_(torch.cat([tensor(p[n][0], True) for n in "qkv"]))
            attn.in_proj_bias.copy_(torch.cat([tensor(p[n][1]) for n in "qkv"]))
            attn.out_proj.weight.copy_(tensor(p["o"][0], True))
            attn.out_proj.bias.copy_(tensor(p["o"][1]))
            for mod, name in ((layer.linear1, "ff1"), (layer.linear2, "ff2")):
                mod.weight.copy_(tensor(p[name][0], True))
                mod.bias.copy_(tensor(p[name][1]))
            for mod, name in ((layer.norm1, "norm1"), (layer.norm2, "norm2")):
                mod.weight.copy_(tensor(p[name][0]))
                mod.bias.copy_(tensor(p[name][1]))
        norm.weight.copy_(tensor(final[0]))
        norm.bias.copy_(tensor(final[1]))
    mask = nn.Transformer.generate_square_subsequent_mask(T)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    weights = list(encoder.parameters()) + list(norm.parameters())
    opt = torch.optim.Adam(weights, lr=LR)

    def lossf(xx, yy):
        h = xx
        for layer in encoder:
            h = layer(h, src_mask=mask, is_causal=True)
        return ((norm(h) - yy) ** 2).mean()
    if fw == "torch":
        lf, name = lossf, "torch eager"
        case = "nn.TransformerEncoderLayer (norm_first, SDPA) + optim.Adam"
    else:
        lf = torch.compile(lossf)
        name, case = "torch.compile (inductor)", "compile(model+loss) fwd/bwd, eager optim.Adam"
    first, summ, final_loss = training_steps.torch_train(opt, lf, lossf, tx, ty)
    report(name, case, first, summ, final_loss, loss0)


def run_jax(x, y, params, loss0):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    p = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params]
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    def norm(h, gb):
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(var + EPS) * gb[0] + gb[1]

    def lin(h, wb):
        return h @ wb[0] + wb[1]

    def lossf(p, xx, yy):
        layers, final = layers_of(p)
        h = xx
        for q in layers:
            a = norm(h, q["norm1"])
            split = [lin(a, q[n]).reshape(B, T, HEADS, D // HEADS) for n in "qkv"]
            ctx = jax.nn.dot_product_attention(*split, is_causal=True)
            h = h + lin(ctx.reshape(B, T, D), q["o"])
            h = h + lin(jax.nn.gelu(lin(norm(h, q["norm2"]), q["ff1"]), approximate=False),
                        q["ff2"])
        return jnp.mean((norm(h, final) - yy) ** 2)

    first, summ, final = training_steps.jax_adam(jax, lossf, p, jx, jy, LR)
    report("jax.jit", "jit(value_and_grad + Adam update), donated params and moments", first,
           summ, final, loss0)


def run(fw):
    x, y, params = init()
    loss0 = loss_np(x, y, params)
    print(f"# initial loss (numpy f64) = {loss0:.6f}")
    if fw.startswith("torch"):
        run_torch(fw, x, y, params, loss0)
    else:
        run_jax(x, y, params, loss0)


if __name__ == "__main__":
    training_steps.main("w11", FWS, run)
