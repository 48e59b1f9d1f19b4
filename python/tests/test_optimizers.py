"""Optimizers do what their keywords say — checked against PyTorch's update rules written in
numpy — refuse what they cannot do when built, and follow learning-rate schedules."""

import math

import numpy as np
import pytest

import kiln
from kiln import nn, optim

W0 = np.array([[0.5, -1.0], [2.0, 0.25]], dtype=np.float32)
TARGET = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)


def quadratic_steps(make, steps=4):
    """Parameter values after each step of minimizing sum((w - T)^2 * w) (a gradient that
    depends on w), eagerly."""
    kiln.reset()
    layer = nn.Layer()
    layer.w = layer.create_parameter("w", [2, 2], kiln.init.Constant(0.0))
    layer.w.set_value(W0)
    opt = make(layer.parameters())
    seen = []
    for _ in range(steps):
        opt.zero_grad()
        w = layer.w.tensor()
        loss = ((w - kiln.tensor(TARGET)) * (w - kiln.tensor(TARGET)) * w).sum()
        loss.backward()
        opt.step()
        seen.append(layer.w.numpy().copy())
    return seen


def gradient(w):
    d = w - TARGET
    return 2 * d * w + d * d


def reference_sgd(lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, steps=4):
    w, v, seen = W0.astype(np.float64), None, []
    for _ in range(steps):
        g = gradient(w) + weight_decay * w
        if momentum:
            v = g if v is None else momentum * v + (1 - dampening) * g
            g = g + momentum * v if nesterov else v
        w = w - lr * g
        seen.append(w)
    return seen


def reference_adam(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled=False, steps=4):
    w, m, v, seen = W0.astype(np.float64), 0.0, 0.0, []
    for t in range(1, steps + 1):
        g = gradient(w)
        if decoupled:
            w = w - lr * weight_decay * w
        else:
            g = g + weight_decay * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        w = w - lr / (1 - betas[0] ** t) * m / (np.sqrt(v) / math.sqrt(1 - betas[1] ** t) + eps)
        seen.append(w)
    return seen


SGD_CASES = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, nesterov=True),
    dict(momentum=0.8, dampening=0.5),
    dict(momentum=0.8, dampening=0.5, nesterov=False, weight_decay=0.05),
    dict(momentum=0.9, weight_decay=0.1),
    dict(weight_decay=0.2),
]


@pytest.mark.parametrize("options", SGD_CASES, ids=str)
def test_sgd_keywords_follow_pytorch(options):
    got = quadratic_steps(lambda ps: optim.SGD(ps, lr=0.05, **options))
    for a, b in zip(got, reference_sgd(0.05, **options)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("options,decoupled", [
    (dict(), False), (dict(weight_decay=0.1), False), (dict(betas=(0.8, 0.99), eps=1e-6), False),
    (dict(weight_decay=0.1), True)], ids=str)
def test_adam_and_adamw_follow_pytorch(options, decoupled):
    make = optim.AdamW if decoupled else optim.Adam
    got = quadratic_steps(lambda ps: make(ps, lr=0.01, **options))
    expected = reference_adam(0.01, decoupled=decoupled, **options)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_the_static_rule_is_the_eager_rule(tmp_path):
    # The eager side declares the same state (w, the velocity, the step counter) under the
    # same names, so its checkpoint starts the static program from W0.
    options = dict(momentum=0.8, dampening=0.5, weight_decay=0.1)
    kiln.reset()
    layer = nn.Layer()
    layer.w = layer.create_parameter("w", [2, 2], kiln.init.Constant(0.0))
    layer.w.set_value(W0)
    optim.SGD(layer.parameters(), lr=0.05, **options)
    kiln.save_parameters(tmp_path / "start.safetensors")
    p = kiln.static.Program(seed=0)
    w = p.parameter(layer.w.name, [2, 2])
    t = p.placeholder("t", "float32", [2, 2])
    loss = ((w - t) * (w - t) * w).sum()
    train = optim.SGD(lr=0.05, **options).minimize(p, loss)
    session = kiln.Session(p)
    session.load(tmp_path / "start.safetensors")
    seen = []
    for _ in range(4):
        session.run(train, {"t": TARGET})
        seen.append(session.state(layer.w.name))
    for a, b in zip(seen, reference_sgd(0.05, **options)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_what_an_optimizer_cannot_do_is_refused_when_built():
    kiln.reset()
    params = nn.Linear(2, 2).parameters()
    with pytest.raises(TypeError):
        optim.SGD(params, lr=0.1, betas=(0.9, 0.99))
    with pytest.raises(ValueError, match="Nesterov momentum needs a momentum"):
        optim.SGD(params, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="learning rate -1"):
        optim.SGD(params, lr=-1.0)
    with pytest.raises(ValueError, match="betas"):
        optim.Adam(params, betas=(1.5, 0.9))
    with pytest.raises(ValueError, match="amsgrad is not supported"):
        optim.Adam(params, amsgrad=True)
    with pytest.raises(ValueError, match="weight_decay -0.1"):
        optim.AdamW(params, weight_decay=-0.1)
    with pytest.raises(ValueError, match="dampening applies to a momentum"):
        optim.SGD(lr=0.1, dampening=0.5)  # a static program's optimizer, refused as early


def test_schedules_set_the_rate_of_the_next_steps():
    kiln.reset()
    layer = nn.Linear(2, 1)
    opt = optim.SGD(layer.parameters(), lr=1.0)
    steps = optim.StepLR(opt, step_size=2, gamma=0.5)
    rates = []
    for _ in range(5):
        rates.append(opt.lr)
        steps.step()
    assert rates == [1.0, 1.0, 0.5, 0.5, 0.25]
    cosine = optim.CosineAnnealingLR(optim.SGD(layer.parameters(), lr=0.1), T_max=4)
    seen = [cosine.get_last_lr()[0]]
    for _ in range(4):
        cosine.step()
        seen.append(cosine.get_last_lr()[0])
    np.testing.assert_allclose(seen, [0.1 * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(5)])
    warm = optim.LinearLR(optim.SGD(layer.parameters(), lr=0.3), start_factor=0.1, total_iters=2)
    seen = [warm.optimizer.lr]
    for _ in range(3):
        warm.step()
        seen.append(warm.optimizer.lr)
    np.testing.assert_allclose(seen, [0.03, 0.165, 0.3, 0.3])

    # The rate set is the rate the next step uses: w moves by lr * g.
    kiln.reset()
    layer = nn.Layer()
    layer.w = layer.create_parameter("w", [1], kiln.init.Constant(1.0))
    opt = optim.SGD(layer.parameters(), lr=0.5)
    moves = []
    for lr in [0.5, 0.25]:
        opt.lr = lr
        opt.zero_grad()
        before = layer.w.numpy().copy()
        (layer.w.tensor() * 2.0).sum().backward()  # gradient 2
        opt.step()
        moves.append(float((before - layer.w.numpy())[0]))
    np.testing.assert_allclose(moves, [1.0, 0.5])
