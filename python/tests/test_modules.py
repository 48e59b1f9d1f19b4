"""Modules as PyTorch users use them: paths of parameters, state_dict / load_state_dict
(strict or not, all or nothing), ModuleList, zero_grad."""

import numpy as np
import pytest

import kiln
from kiln import nn


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 4)])
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = x.reshape([x.shape[0], 8])
        for block in self.blocks:
            h = block(h).relu()
        return self.head(h)


def test_paths_and_state_dicts_carry_over_between_instances():
    kiln.reset()
    kiln.manual_seed(1)
    a = Net()
    kiln.manual_seed(2)
    b = Net()
    keys = [k for k, _ in a.named_parameters()]
    assert keys == ["conv.w", "conv.b", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                    "blocks.1.bias", "head.weight", "head.bias"]
    assert len(a.blocks) == 2 and [type(l) for l in a.blocks] == [nn.Linear, nn.Linear]
    x = kiln.tensor(np.arange(16, dtype=np.float32).reshape(2, 8) / 16)
    assert not np.allclose(a(x).numpy(), b(x).numpy())
    state = a.state_dict()
    assert sorted(state) == sorted(keys) and all(isinstance(v, np.ndarray) for v in state.values())
    assert b.load_state_dict(state) == ([], [])
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    state["head.bias"][:] = 7.0  # a copy: the model is untouched
    assert not np.any(a.head.bias.numpy() == 7.0)


def test_load_state_dict_refuses_what_does_not_fit_and_changes_nothing():
    kiln.reset()
    net = Net()
    before = net.state_dict()
    partial = {k: v for k, v in before.items() if k != "head.bias"}
    partial["extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(kiln.KilnError, match=r"missing \['head.bias'\], unexpected \['extra.weight'\]"):
        net.load_state_dict(partial)
    missing, unexpected = net.load_state_dict(partial, strict=False)
    assert (missing, unexpected) == (["head.bias"], ["extra.weight"])
    wrong = dict(before, **{"head.weight": np.zeros((3, 3), np.float32), "conv.b": before["conv.b"] + 1})
    with pytest.raises(kiln.ShapeError, match=r"`head.weight` has shape \(4, 3\), the state_dict's \(3, 3\)"):
        net.load_state_dict(wrong)
    np.testing.assert_array_equal(net.state_dict()["conv.b"], before["conv.b"])


def test_zero_grad_forgets_every_gradient():
    kiln.reset()
    net = Net()
    x = kiln.tensor(np.ones((2, 8), np.float32))
    net(x).sum().backward()
    assert all(p.grad is not None for p in net.blocks[0].parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    with pytest.raises(TypeError, match="ModuleList holds layers"):
        nn.ModuleList([3])


def test_batch_norm_options_and_buffers_in_the_state_dict():
    kiln.reset()
    bn = nn.BatchNorm2d(3, eps=1e-3, momentum=0.5)
    x = kiln.tensor(np.random.default_rng(0).normal(2.0, 1.0, size=[8, 3, 4, 4]).astype(np.float32))
    bn(x)
    state = bn.state_dict()
    assert sorted(state) == ["beta", "gamma", "running_mean", "running_var"]
    batch_mean = x.numpy().mean(axis=(0, 2, 3))
    np.testing.assert_allclose(state["running_mean"], 0.5 * batch_mean, rtol=1e-5)
    # eps reaches the normalisation: in eval mode y = (x - mean) / sqrt(var + eps).
    bn.eval()
    y = bn(x).numpy()
    rm, rv = state["running_mean"], state["running_var"]
    want = (x.numpy() - rm[None, :, None, None]) / np.sqrt(rv[None, :, None, None] + 1e-3)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    # A fresh layer given the state_dict normalises the same way (the running statistics
    # travel with it: without them, eval mode would silently use zeros and ones).
    other = nn.BatchNorm2d(3, eps=1e-3).eval()
    other.load_state_dict(state)
    np.testing.assert_allclose(other(x).numpy(), y, rtol=1e-6)
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchNorm(3, momentum=1.5)


def test_transpose_swaps_two_axes_as_pytorch_and_permute_reorders():
    x = kiln.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    assert x.transpose(0, 1).shape == (3, 2, 4)
    assert x.transpose(-1, 0).shape == (4, 3, 2)
    square = kiln.tensor(np.arange(4, dtype=np.float32).reshape(2, 2))
    np.testing.assert_array_equal(square.transpose(0, 1).numpy(), square.numpy().T)
    np.testing.assert_array_equal(x.permute(2, 0, 1).numpy(), x.numpy().transpose(2, 0, 1))
    with pytest.raises(TypeError, match="permute"):
        x.transpose(2, 0, 1)


def test_a_parameter_is_a_tensor():
    kiln.reset()
    m = nn.Linear(3, 2)
    x = kiln.tensor(np.ones([4, 3], np.float32))
    y = x @ m.weight + m.bias                       # operators and methods take parameters
    np.testing.assert_allclose(y.numpy(), np.ones([4, 3]) @ m.weight.numpy() + m.bias.numpy(), rtol=1e-6)
    assert (m.weight * 2).shape == (3, 2) and m.weight.T.shape == (2, 3) and m.weight[0].shape == (2,)
    assert m.weight.dtype == "float32" and nn.functional.relu(m.weight).shape == (3, 2)
    (x @ m.weight).sum().backward()                 # and gradients reach the parameter
    np.testing.assert_allclose(m.weight.grad.numpy(), np.full([3, 2], 4.0))
    assert isinstance(m.weight, kiln.Parameter) and m.weight in m.parameters()
