"""kiln.nn.functional against numpy, against the layers that share its composites, and
compiled by to_static; the layer options PyTorch users pass (bias=False, pooling padding,
GELU, CrossEntropyLoss)."""

import math

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F
from kiln import nn

rng = np.random.default_rng(0)


def t(a):
    return kiln.tensor(np.asarray(a, dtype=np.float32))


def test_elementwise_and_losses_match_numpy():
    x = rng.normal(size=(3, 4)).astype(np.float32)
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(F.gelu(t(x)).numpy(), x * 0.5 * (1 + erf(x / math.sqrt(2))), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(F.relu(t(x)).numpy(), np.maximum(x, 0))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(F.softmax(t(x), dim=1).numpy(), e / e.sum(1, keepdims=True), rtol=1e-5)
    labels = np.array([0, 3, 1])
    ce = -np.log((e / e.sum(1, keepdims=True))[np.arange(3), labels]).mean()
    np.testing.assert_allclose(F.cross_entropy(t(x), kiln.tensor(labels)).item(), ce, rtol=1e-5)
    np.testing.assert_allclose(nn.CrossEntropyLoss()(t(x), kiln.tensor(labels)).item(), ce, rtol=1e-5)
    np.testing.assert_allclose(F.mse_loss(t(x), t(x * 0)).item(), (x ** 2).mean(), rtol=1e-5)
    w = rng.normal(size=(4, 2)).astype(np.float32)
    np.testing.assert_allclose(F.linear(t(x), t(w)).numpy(), x @ w, rtol=1e-5, atol=1e-6)


def test_windows_norms_embeddings_and_dropout_match_numpy():
    x = rng.normal(size=(1, 1, 4, 4)).astype(np.float32)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.array([[padded[0, 0, i:i + 2, j:j + 2].max() for j in range(0, 5, 2)] for i in range(0, 5, 2)])
    np.testing.assert_allclose(F.max_pool2d(t(x), 2, padding=1).numpy()[0, 0], want)
    assert nn.MaxPool2d(2, padding=1)(t(x)).shape == (1, 1, 3, 3)
    np.testing.assert_allclose(F.avg_pool2d(t(x), 2).numpy()[0, 0],
                               x[0, 0].reshape(2, 2, 2, 2).mean(axis=(1, 3)), rtol=1e-6)
    h = rng.normal(size=(2, 5)).astype(np.float32)
    g, b = np.full(5, 2.0, np.float32), np.full(5, 0.5, np.float32)
    norm = (h - h.mean(1, keepdims=True)) / np.sqrt(h.var(1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(F.layer_norm(t(h), t(g), t(b)).numpy(), norm, rtol=1e-4, atol=1e-5)
    table = rng.normal(size=(6, 3)).astype(np.float32)
    ids = np.array([[5, 0], [2, 2]])
    np.testing.assert_allclose(F.embedding(kiln.tensor(ids), t(table)).numpy(), table[ids])
    ones = t(np.ones((200, 50)))
    assert F.dropout(ones, 0.3, training=False).numpy().min() == 1.0
    kept = F.dropout(ones, 0.3).numpy()
    assert set(np.unique(kept)) <= {0.0, np.float32(1 / 0.7)}
    assert abs((kept == 0).mean() - 0.3) < 0.02


def test_conv2d_is_the_layers_convolution_with_its_gradient():
    kiln.reset()
    layer = nn.Conv2d(2, 3, 3, padding=1)
    params = dict(layer.named_parameters())
    x = t(rng.normal(size=(2, 2, 5, 5)))
    by_layer = layer(x)
    by_function = F.conv2d(x, params["w"].tensor(), params["b"].tensor(), padding=1)
    np.testing.assert_allclose(by_function.numpy(), by_layer.numpy(), rtol=1e-6)
    w = kiln.tensor(params["w"].numpy(), requires_grad=True)
    F.conv2d(x, w, padding=1).sum().backward()
    assert w.grad.numpy().shape == (3, 2, 3, 3) and np.abs(w.grad.numpy()).sum() > 0

    @kiln.to_static
    def compiled(images):
        h = F.max_pool2d(F.gelu(F.conv2d(images, params["w"].tensor(), params["b"].tensor(), padding=1)), 2)
        return F.flatten(h)

    eager = F.flatten(F.max_pool2d(F.gelu(by_layer), 2))
    np.testing.assert_allclose(compiled(x).numpy(), eager.numpy(), rtol=1e-5, atol=1e-6)


def test_layer_options():
    kiln.reset()
    no_bias = nn.Linear(3, 2, bias=False)
    assert [k for k, _ in no_bias.named_parameters()] == ["weight"] and no_bias.bias is None
    x = t(np.ones((1, 3)))
    np.testing.assert_allclose(no_bias(x).numpy(), no_bias.weight.numpy().sum(0, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(nn.GELU()(t([0.0, 1.0])).numpy(), [0.0, 0.8413447], rtol=1e-5)
    with pytest.raises(TypeError, match="takes 1 tensors"):
        kiln._kiln.functional("gelu", [x, x])
