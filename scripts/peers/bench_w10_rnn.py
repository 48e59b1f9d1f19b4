"""W10 recurrent network training step (Kiln's workload; the peers' side, in their harness's format).

h ← tanh(x_t·W + b + h·U + c) over T = 64 steps from h = 0, batch 64, width 256 (inputs and
state); loss mean((h_T − y)²) of the last state; plain SGD, lr 0.1; gradients through the loop.
Kiln runs the loop as a `while` (`src/workloads.rs::rnn_step`). The sequence, target and
initial weights are drawn once with numpy (seed 0; weights uniform ±1/√256, PyTorch's
nn.RNN bounds), so every framework starts from the same point.
Timing as W5: 10 warm-up steps (the first is the compile / first call), then 100 steps timed
individually; median (min..max) ms per full step (forward + backward + update).

Lives in Kiln's scripts/peers/; scripts/compare_peers.sh copies it beside the peers'
bench_common.py and runs it through their run_one.py.
"""
import bench_common as bc
import training_steps
from training_steps import timed_loop
import numpy as np

T, B, H, LR = 64, 64, 256, 0.1
FWS = ["torch", "torch_loop", "jax_scan", "jax_fori"]


def init():
    """The sequence x [T,B,H] f32, target y [B,H] f32, and [(W [in,out], b), (U, c)]."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    y = rng.uniform(-0.5, 0.5, (B, H)).astype(np.float32)
    bound = 1.0 / np.sqrt(H)
    params = [(rng.uniform(-bound, bound, (H, H)).astype(np.float32),
               rng.uniform(-bound, bound, (H,)).astype(np.float32)) for _ in range(2)]
    return x, y, params


def loss_np(x, y, params):
    """The initial loss in f64 (a check on every framework's first step)."""
    (w, b), (u, c) = [(a.astype(np.float64), d.astype(np.float64)) for a, d in params]
    h = np.zeros((B, H))
    for t in range(T):
        h = np.tanh(x[t] @ w + b + h @ u + c)
    return float(((h - y) ** 2).mean())


def report(name, case, first, summ, final_loss, loss0):
    training_steps.report("w10", name, case, first, summ, final_loss, loss0)


def run_torch(fw, x, y, params, loss0):
    torch = bc.setup_torch()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    if fw == "torch":
        rnn = torch.nn.RNN(H, H, nonlinearity="tanh")
        with torch.no_grad():
            (w, b), (u, c) = params
            rnn.weight_ih_l0.copy_(torch.from_numpy(w.T.copy()))
            rnn.bias_ih_l0.copy_(torch.from_numpy(b))
            rnn.weight_hh_l0.copy_(torch.from_numpy(u.T.copy()))
            rnn.bias_hh_l0.copy_(torch.from_numpy(c))
        weights = list(rnn.parameters())

        def lossf():
            _, h = rnn(tx)
            return ((h[0] - ty) ** 2).mean()
        name, case = "torch eager", "nn.RNN (tanh) + optim.SGD"
    else:
        weights = [torch.from_numpy(a.copy()).requires_grad_() for p in params for a in p]

        def lossf():
            w, b, u, c = weights
            h = torch.zeros(B, H)
            for t in range(T):
                h = torch.tanh(tx[t] @ w + b + h @ u + c)
            return ((h - ty) ** 2).mean()
        name, case = "torch eager", "Python loop over 64 steps + optim.SGD"
    opt = torch.optim.SGD(weights, lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = lossf()
        loss.backward()
        opt.step()
    first, summ = timed_loop(step)
    with torch.no_grad():
        final = float(lossf())
    report(name, case, first, summ, final, loss0)


def run_jax(fw, x, y, params, loss0):
    jax = bc.setup_jax()
    import jax.numpy as jnp
    p = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params]
    jx, jy = jnp.asarray(x), jnp.asarray(y)

    def lossf(p, xs, yy):
        (w, b), (u, c) = p

        def cell(h, xt):
            return jnp.tanh(xt @ w + b + h @ u + c)
        h0 = jnp.zeros((B, H), jnp.float32)
        if fw == "jax_scan":
            h, _ = jax.lax.scan(lambda h, xt: (cell(h, xt), None), h0, xs)
        else:
            h = jax.lax.fori_loop(0, T, lambda t, h: cell(h, xs[t]), h0)
        return jnp.mean((h - yy) ** 2)

    first, summ, final = training_steps.jax_sgd(jax, lossf, p, jx, jy, LR)
    loop = "lax.scan" if fw == "jax_scan" else "lax.fori_loop"
    report("jax.jit", f"jit(value_and_grad({loop}) + SGD update), donated params", first, summ,
           final, loss0)


def run(fw):
    x, y, params = init()
    loss0 = loss_np(x, y, params)
    print(f"# initial loss (numpy f64) = {loss0:.6f}")
    if fw.startswith("torch"):
        run_torch(fw, x, y, params, loss0)
    else:
        run_jax(fw, x, y, params, loss0)


if __name__ == "__main__":
    training_steps.main("w10", FWS, run)
