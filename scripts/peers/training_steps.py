"""What Kiln's own training-step workloads (W9, W10, W11) share: the W5 timing protocol and the
record they write, in the peers' harness format (bench_common.py)."""
import time

import bench_common as bc

WARMUP, STEPS = 10, 100


def timed_loop(step):
    """step() runs one full training step and returns only when its results are ready: the first
    call timed alone, WARMUP - 1 more, then STEPS timed one by one."""
    t0 = time.perf_counter(); step(); first = time.perf_counter() - t0
    for _ in range(WARMUP - 1):
        step()
    samples = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return first, bc.summarize(samples)


def torch_train(opt, train_loss, loss, xx, yy):
    """The step `opt.zero_grad; train_loss(xx, yy).backward(); opt.step()` timed by
    timed_loop; returns the first step's time, the summary and `loss(xx, yy)` after the last
    step (train_loss may be loss compiled)."""
    import torch

    def step():
        opt.zero_grad(set_to_none=True)
        train_loss(xx, yy).backward()
        opt.step()
    first, summ = timed_loop(step)
    with torch.no_grad():
        return first, summ, float(loss(xx, yy))


def jax_sgd(jax, lossf, params, xx, yy, lr):
    """jit(value_and_grad(lossf) + SGD update) with donated params, timed by timed_loop;
    returns the first step's time, the summary and the loss after the last step."""
    def train_step(p, xx, yy):
        l, g = jax.value_and_grad(lossf)(p, xx, yy)
        return jax.tree_util.tree_map(lambda a, d: a - lr * d, p, g), l
    train_step = jax.jit(train_step, donate_argnums=0)
    st = {"p": params}

    def step():
        st["p"], st["l"] = train_step(st["p"], xx, yy)
        jax.block_until_ready(st["p"])
    first, summ = timed_loop(step)
    return first, summ, float(jax.jit(lossf)(st["p"], xx, yy))


def jax_adam(jax, lossf, params, xx, yy, lr, b1=0.9, b2=0.999, eps=1e-8):
    """As jax_sgd with Adam in PyTorch's form (w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)),
    params and both moments donated."""
    import jax.numpy as jnp
    tree = jax.tree_util

    def train_step(state, xx, yy):
        p, m, v, t = state
        l, g = jax.value_and_grad(lossf)(p, xx, yy)
        t = t + 1
        m = tree.tree_map(lambda a, d: b1 * a + (1 - b1) * d, m, g)
        v = tree.tree_map(lambda a, d: b2 * a + (1 - b2) * d * d, v, g)
        c1, c2 = 1 - b1 ** t, jnp.sqrt(1 - b2 ** t)
        p = tree.tree_map(lambda w, a, b: w - lr / c1 * a / (jnp.sqrt(b) / c2 + eps), p, m, v)
        return (p, m, v, t), l
    train_step = jax.jit(train_step, donate_argnums=0)
    zeros = tree.tree_map(jnp.zeros_like, params)
    st = {"s": (params, zeros, tree.tree_map(jnp.zeros_like, params), jnp.float32(0))}

    def step():
        st["s"], st["l"] = train_step(st["s"], xx, yy)
        jax.block_until_ready(st["s"])
    first, summ = timed_loop(step)
    return first, summ, float(jax.jit(lossf)(st["s"][0], xx, yy))


def report(workload, name, case, first, summ, final_loss, loss0):
    bc.emit(workload, name, case, summ, unit="ms",
            extra={"first_step_s": first, "loss_after_110_steps": final_loss,
                   "initial_loss_f64": loss0})


def main(workload, fws, run):
    """Runs run(fw) for the framework named by --fw; a failure is recorded, then exits 1."""
    fw = bc.parse_fw(fws)
    try:
        run(fw)
    except Exception as e:
        import traceback; traceback.print_exc()
        bc.emit_error(workload, fw, "(whole run)", e)
        raise SystemExit(1)
