"""W9 digits CNN training step (Kiln's workload; the peers' side, in their harness's format).

The model of Kiln's `examples/digits_cnn.rs`: x f32[256,1,8,8] → conv 3×3 pad 1 (32, ReLU) →
max pool 2×2 → conv 3×3 pad 1 (64, ReLU) → max pool 2×2 → flatten (256) → dense 128 (ReLU)
→ dense 10; softmax cross-entropy on integer labels; plain SGD, lr 0.05.
The batch is the first 256 of the UCI digits (pixels / 16), and the initial weights are drawn
once with numpy (seed 0, PyTorch's default bounds ±1/√fan_in), so every framework starts from
the same point and the loss after 110 steps is comparable.
Timing as W5: 10 warm-up steps (the first is the compile / first call), then 100 steps timed
individually; median (min..max) ms per full step (forward + backward + update).

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it, with the digits, beside
the peers' bench_common.py and runs it through their run_one.py.
"""
import bench_common as bc
import training_steps
from training_steps import timed_loop
import gzip
import os
import tempfile
import numpy as np

B, CLASSES, LR = 256, 10, 0.05
CONVS = ((1, 32), (32, 64))  # (in, out) channels, 3×3 kernels, padding 1
DENSE = ((64 * 2 * 2, 128), (128, CLASSES))
FWS = ["torch", "torch_compile", "jax_jit", "paddle"]
DIGITS = os.environ.get("DIGITS_CSV", os.path.join(bc.HERE, "digits.csv.gz"))


def init():
    """The batch (x [B,1,8,8] f32, y [B] i64) and [(conv w OIHW, b)] + [(dense w [in,out], b)]."""
    rows = np.loadtxt(gzip.open(DIGITS, "rt"), delimiter=",", dtype=np.float32)[:B]
    x = (rows[:, :64] / 16.0).reshape(B, 1, 8, 8).astype(np.float32)
    y = rows[:, 64].astype(np.int64)
    rng = np.random.default_rng(0)

    def uniform(fan_in, shape):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    convs = [(uniform(i * 9, (o, i, 3, 3)), uniform(i * 9, (o,))) for i, o in CONVS]
    dense = [(uniform(i, (i, o)), uniform(i, (o,))) for i, o in DENSE]
    return x, y, convs, dense


def loss_np(x, y, convs, dense):
    """The initial loss in f64 (a check on every framework's first step)."""
    h = x.astype(np.float64)
    for w, b in convs:
        p = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)))
        n, c, hh, ww = h.shape
        cols = np.stack([p[:, :, i:i + hh, j:j + ww] for i in range(3) for j in range(3)], 2)
        h = np.einsum("nckhw,ock->nohw", cols, w.reshape(w.shape[0], c, 9)) + b[:, None, None]
        h = np.maximum(h, 0)
        h = h.reshape(n, -1, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    h = h.reshape(len(h), -1)
    for i, (w, b) in enumerate(dense):
        h = h @ w + b
        if i == 0:
            h = np.maximum(h, 0)
    h = h - h.max(-1, keepdims=True)
    lp = h - np.log(np.exp(h).sum(-1, keepdims=True))
    return float(-lp[np.arange(len(y)), y].mean())


def report(name, case, first, summ, final_loss, loss0):
    training_steps.report("w9", name, case, first, summ, final_loss, loss0)


def run_torch(fw, x, y, convs, dense, loss0):
    if fw == "torch_compile":
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor_cold_")
    torch = bc.setup_torch()
    import torch.nn as nn
    import torch.nn.functional as F
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    with torch.no_grad():
        for layer, (w, b) in zip([model[0], model[3]], convs):
            layer.weight.copy_(torch.from_numpy(w)); layer.bias.copy_(torch.from_numpy(b))
        for layer, (w, b) in zip([model[7], model[9]], dense):
            layer.weight.copy_(torch.from_numpy(w.T.copy())); layer.bias.copy_(torch.from_numpy(b))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def lossf(xx, yy):
        return F.cross_entropy(model(xx), yy)
    if fw == "torch":
        lf, name, case = lossf, "torch eager", "nn.Sequential + optim.SGD"
    else:
        lf = torch.compile(lossf)
        name, case = "torch.compile (inductor)", "compile(model+loss) fwd/bwd, eager optim.SGD"
    first, summ, final = training_steps.torch_train(opt, lf, lossf, tx, ty)
    report(name, case, first, summ, final, loss0)


def run_jax(x, y, convs, dense, loss0):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in convs + dense]
    jx, jy = jnp.asarray(x), jnp.asarray(y.astype(np.int32))

    def lossf(p, xx, yy):
        h = xx
        for w, b in p[:2]:
            h = jax.lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"))
            h = jax.nn.relu(h + b[None, :, None, None])
            h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        h = h.reshape(h.shape[0], -1)
        (w1, b1), (w2, b2) = p[2:]
        h = jax.nn.relu(h @ w1 + b1) @ w2 + b2
        lp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.mean(jnp.take_along_axis(lp, yy[:, None], axis=1))

    first, summ, final = training_steps.jax_sgd(jax, lossf, params, jx, jy, LR)
    report("jax.jit", "jit(value_and_grad + SGD update), donated params", first, summ, final,
           loss0)


def run_paddle(x, y, convs, dense, loss0):
    paddle = bc.setup_paddle()
    import paddle.nn as nn
    import paddle.nn.functional as F
    model = nn.Sequential(
        nn.Conv2D(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
        nn.Conv2D(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
        nn.Flatten(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, CLASSES))
    for layer, (w, b) in zip([model[0], model[3], model[7], model[9]], convs + dense):
        layer.weight.set_value(w)  # paddle Linear weights are [in, out], like Kiln's
        layer.bias.set_value(b)
    px, py = paddle.to_tensor(x), paddle.to_tensor(y)
    opt = paddle.optimizer.SGD(learning_rate=LR, parameters=model.parameters())

    def step():
        loss = F.cross_entropy(model(px), py)
        loss.backward()
        opt.step()
        opt.clear_grad()
    first, summ = timed_loop(step)
    with paddle.no_grad():
        final = float(F.cross_entropy(model(px), py))
    report("paddle dygraph", "nn.Sequential + optimizer.SGD", first, summ, final, loss0)


def run(fw):
    x, y, convs, dense = init()
    loss0 = loss_np(x, y, convs, dense)
    print(f"# initial loss (numpy f64) = {loss0:.6f}")
    if fw.startswith("torch"):
        run_torch(fw, x, y, convs, dense, loss0)
    elif fw == "jax_jit":
        run_jax(x, y, convs, dense, loss0)
    else:
        run_paddle(x, y, convs, dense, loss0)


if __name__ == "__main__":
    training_steps.main("w9", FWS, run)
