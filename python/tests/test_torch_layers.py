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
    out_t, _ = reference(xt)
    w = np.random.default_rng(7).uniform(-1, 1, size=out_t.shape).astype(np.float32)
    (out_t * torch.tensor(w)).sum().backward()

    xk = kiln.tensor(x, requires_grad=True)
    out_k = layer(xk)
    (out_k * kiln.tensor(w)).sum().backward()

    np.testing.assert_allclose(out_k.numpy(), out_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xk.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    for kp, tp in zip(kiln_params, torch_params):
        np.testing.assert_allclose(kp(), tp(), rtol=1e-4, atol=1e-5)


def test_lstm_matches_torch():
    n, t, d, h = 2, 5, 3, 4
    ref = torch.nn.LSTM(d, h, batch_first=True)
    layer = nn.LSTM(d, h)
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
    layer = nn.GRU(d, h)
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
