"""The transformer layers: multi-head self-attention against its definition in numpy, a causal
layer blind to later tokens, PyTorch's settings Kiln lacks refused by name, and a layer that
trains under to_static."""

import numpy as np
import pytest

import kiln
from kiln import nn


def numpy_attention(x, params, heads, causal):
    """Batched multi-head self-attention with biased projections, in float64."""
    n, t, d = x.shape
    dh = d // heads
    x = x.astype(np.float64)

    def project(part):
        return x @ params[f"{part}.w"].astype(np.float64) + params[f"{part}.b"]

    def split(h):
        return h.reshape(n, t, heads, dh).transpose(0, 2, 1, 3)

    q, k, v = (split(project(p)) for p in "qkv")
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    if causal:
        s = np.where(np.tril(np.ones((t, t), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = (p @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
    return ctx @ params["o.w"].astype(np.float64) + params["o.b"]


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_self_attention_matches_its_definition(causal):
    kiln.reset()
    kiln.manual_seed(3)
    layer = nn.MultiheadSelfAttention(8, 2, causal=causal)
    rng = np.random.default_rng(0)
    params = {name: rng.uniform(-0.5, 0.5, p.numpy().shape).astype(np.float32)
              for name, p in layer.named_parameters()}
    assert sorted(params) == sorted(f"{p}.{w}" for p in "qkvo" for w in "wb")
    assert layer.load_state_dict(params) == ([], [])
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    got = layer(kiln.tensor(x)).numpy()
    np.testing.assert_allclose(got, numpy_attention(x, params, 2, causal), rtol=1e-4, atol=1e-5)


def test_a_causal_encoder_layer_does_not_see_later_tokens():
    kiln.reset()
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True, causal=True)
    x = np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)
    later = x.copy()
    later[:, 4:] += 3.0
    a, b = layer(kiln.tensor(x)).numpy(), layer(kiln.tensor(later)).numpy()
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_pytorchs_settings_kiln_lacks_are_refused_by_name():
    with pytest.raises(ValueError, match="dropout=0.1.*activation='relu'.*batch_first=False"):
        nn.TransformerEncoderLayer(8, 2)
    with pytest.raises(ValueError, match="3 heads must divide the width 8"):
        nn.MultiheadSelfAttention(8, 3)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True)
    x = kiln.tensor(np.zeros((1, 3, 8), np.float32))
    with pytest.raises(ValueError, match="is_causal=True needs"):
        layer(x, is_causal=True)
    with pytest.raises(NotImplementedError, match="masks per call"):
        layer(x, src_mask=np.zeros((3, 3), np.float32))


def test_an_encoder_layer_trains_under_to_static():
    kiln.reset()
    kiln.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True, causal=True)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6, 8)).astype(np.float32)
    y = np.zeros_like(x)
    y[:, 1:] = x[:, :-1]

    def loss(xx, yy):
        return nn.functional.mse_loss(layer(xx), yy)

    step = kiln.to_static(loss).minimize(kiln.optim.Adam(lr=1e-2))
    xs, ys = kiln.tensor(x), kiln.tensor(y)
    first = step.train_step(xs, ys).item()
    for _ in range(30):
        last = step.train_step(xs, ys).item()
    assert last < 0.8 * first
