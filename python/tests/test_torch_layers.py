"""Kiln's recurrent layers against PyTorch's, where torch is installed (skipped otherwise; the
f64 reference formulas of runtime/tests/oracles.rs check the same conventions everywhere).

Kiln's weights are PyTorch's transposed (``[D, 4H]`` against ``weight_ih_l0: [4H, D]``), with
the gate blocks in PyTorch's order: LSTM ``i, f, g, o`` with one bias (PyTorch's two, added),
GRU ``r, z, n`` with both biases."""

import numpy as np
import pytest

import kiln
from kiln import nn

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()


def _inputs(n, t, d, seed):
    return np.random.default_rng(seed).uniform(-1, 1, size=[n, t, d]).astype(np.float32)


def _compare(layer, reference, x, kiln_params, torch_params):
    xt = torch.tensor(x, requires_grad=True)
    out_t, last_t = reference(xt)
    w = np.random.default_rng(7).uniform(-1, 1, size=out_t.shape).astype(np.float32)
    (out_t * torch.tensor(w)).sum().backward()

    xk = kiln.tensor(x, requires_grad=True)
    out_k, last_k = layer(xk)
    (out_k * kiln.tensor(w)).sum().backward()

    np.testing.assert_allclose(out_k.numpy(), out_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    flat = (lambda s: list(s) if isinstance(s, tuple) else [s])
    for k, t in zip(flat(last_k), flat(last_t), strict=True):
        np.testing.assert_allclose(k.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xk.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    for kp, tp in zip(kiln_params, torch_params):
        np.testing.assert_allclose(kp(), tp(), rtol=1e-4, atol=1e-5)


def test_lstm_matches_torch():
    n, t, d, h = 2, 5, 3, 4
    ref = torch.nn.LSTM(d, h, batch_first=True)
    layer = nn.LSTM(d, h, batch_first=True)
    w_ih, w_hh, b = layer.parameters()
    w_ih.set_value(ref.weight_ih_l0.detach().numpy().T.copy())
    w_hh.set_value(ref.weight_hh_l0.detach().numpy().T.copy())
    b.set_value((ref.bias_ih_l0 + ref.bias_hh_l0).detach().numpy())
    _compare(
        layer,
        ref,
        _inputs(n, t, d, 1),
        [lambda: w_ih.grad.numpy().T, lambda: w_hh.grad.numpy().T, lambda: b.grad.numpy()],
        [
            lambda: ref.weight_ih_l0.grad.numpy(),
            lambda: ref.weight_hh_l0.grad.numpy(),
            lambda: ref.bias_ih_l0.grad.numpy(),  # equal to bias_hh_l0's: one sum
        ],
    )


def test_gru_matches_torch():
    n, t, d, h = 2, 5, 3, 4
    ref = torch.nn.GRU(d, h, batch_first=True)
    layer = nn.GRU(d, h, batch_first=True)
    w_ih, w_hh, b_ih, b_hh = layer.parameters()
    w_ih.set_value(ref.weight_ih_l0.detach().numpy().T.copy())
    w_hh.set_value(ref.weight_hh_l0.detach().numpy().T.copy())
    b_ih.set_value(ref.bias_ih_l0.detach().numpy())
    b_hh.set_value(ref.bias_hh_l0.detach().numpy())
    _compare(
        layer,
        ref,
        _inputs(n, t, d, 2),
        [
            lambda: w_ih.grad.numpy().T,
            lambda: w_hh.grad.numpy().T,
            lambda: b_ih.grad.numpy(),
            lambda: b_hh.grad.numpy(),
        ],
        [
            lambda: ref.weight_ih_l0.grad.numpy(),
            lambda: ref.weight_hh_l0.grad.numpy(),
            lambda: ref.bias_ih_l0.grad.numpy(),
            lambda: ref.bias_hh_l0.grad.numpy(),
        ],
    )


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_stacked_sequence_first_layers_match_torch(kind):
    """``num_layers=2`` and PyTorch's default layout ``[T, N, D]``: outputs and every
    layer's final states."""
    t, n, d, h = 5, 2, 3, 4
    ref = getattr(torch.nn, kind)(d, h, num_layers=2)
    layer = getattr(nn, kind)(d, h, num_layers=2)
    for k in range(2):
        suffix = "" if k == 0 else f"_l{k}"
        get = lambda name: getattr(ref, f"{name}_l{k}").detach().numpy()  # noqa: E731
        layer._params["w_ih" + suffix].set_value(get("weight_ih").T.copy())
        layer._params["w_hh" + suffix].set_value(get("weight_hh").T.copy())
        if kind == "LSTM":
            layer._params["b" + suffix].set_value(get("bias_ih") + get("bias_hh"))
        else:
            layer._params["b_ih" + suffix].set_value(get("bias_ih"))
            layer._params["b_hh" + suffix].set_value(get("bias_hh"))
    x = _inputs(t, n, d, 3)
    out_t, last_t = ref(torch.tensor(x))
    out_k, last_k = layer(kiln.tensor(x))
    np.testing.assert_allclose(out_k.numpy(), out_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    if kind == "LSTM":
        last_t, last_k = list(last_t), list(last_k)
    else:
        last_t, last_k = [last_t], [last_k]
    for k, r in zip(last_k, last_t, strict=True):
        assert k.shape == tuple(r.shape) == (2, n, h)
        np.testing.assert_allclose(k.numpy(), r.detach().numpy(), rtol=1e-5, atol=1e-6)
