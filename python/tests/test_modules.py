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
