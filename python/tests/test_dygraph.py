"""The dygraph design's examples, nearly as written, and eager tensors against numpy."""

import numpy as np
import pytest

import kiln
from kiln import nn


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    kiln.manual_seed(0)


class MLP(nn.Layer):
    def __init__(self):
        super().__init__()
        self._fc1 = nn.Linear(2, 3, weight_init=kiln.init.Constant(0.1))
        self._fc2 = nn.Linear(3, 4, weight_init=kiln.init.Constant(0.1))

    def forward(self, inputs):
        x = self._fc1(inputs)
        x = self._fc2(x)
        return x.sum()


def test_mlp_with_constant_weights_gives_its_known_output_and_gradients():
    np_inp = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    var_inp = kiln.tensor(np_inp, requires_grad=True)
    mlp = MLP()
    out = mlp(var_inp)
    # fc1: rows sum to 3 and 7, times 0.1, on 3 units; fc2: 3 × 0.3 × 0.1 and 3 × 0.7 × 0.1
    # on 4 units; the sum 4 × 0.09 + 4 × 0.21.
    assert out.numpy() == pytest.approx(1.2, rel=1e-6)
    out.backward()
    # d out / d input: every input feeds 3 × 4 paths of weight 0.1 × 0.1.
    np.testing.assert_allclose(var_inp.grad.numpy(), np.full([2, 2], 0.12), rtol=1e-6)
    names = [p.name for p in mlp.parameters()]
    assert len(names) == 4 and len(set(names)) == 4
    fc2_w = mlp._fc2.weight.grad.numpy()
    np.testing.assert_allclose(fc2_w, np.full([3, 4], 0.3 + 0.7), rtol=1e-6)


class MyPyLayer(kiln.PyLayer):
    @staticmethod
    def forward(inputs):
        return np.tanh(inputs[0])

    @staticmethod
    def backward(inputs, outputs, grads):
        return np.array(grads[0]) * (1 - np.square(np.array(outputs[0])))


def test_the_numpy_tanh_pylayer_and_its_gradient():
    np_inp = np.ones([2, 2], np.float32)
    var_inp = kiln.tensor(np_inp, requires_grad=True)
    outs = MyPyLayer.apply(var_inp)
    dy_out = np.sum(outs.numpy())
    outs.sum().backward()
    dy_grad = var_inp.grad.numpy()
    assert dy_out == pytest.approx(4 * np.tanh(1.0), rel=1e-6)
    np.testing.assert_allclose(dy_grad, np.full([2, 2], 1 - np.tanh(1.0) ** 2), rtol=1e-6)
    # The same as Kiln's own tanh.
    x = kiln.tensor(np_inp, requires_grad=True)
    x.tanh().sum().backward()
    np.testing.assert_allclose(dy_grad, x.grad.numpy(), rtol=1e-5)


def test_tensor_ops_match_numpy():
    a = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32)
    b = np.array([[1.0, 2.0], [0.5, -1.0], [-2.0, 0.25]], np.float32)
    x, y = kiln.tensor(a), kiln.tensor(b)
    np.testing.assert_allclose((x @ y).numpy(), a @ b, rtol=1e-6)
    np.testing.assert_allclose((2.0 - x).numpy(), 2.0 - a)
    np.testing.assert_allclose((x / 2).numpy(), a / 2)
    np.testing.assert_allclose((-x).numpy(), -a)
    np.testing.assert_allclose(x.exp().numpy(), np.exp(a), rtol=1e-6)
    np.testing.assert_allclose(x.relu().numpy(), np.maximum(a, 0))
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(x.mean().numpy(), a.mean(), rtol=1e-6)
    np.testing.assert_allclose(x.softmax(-1).numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-5)
    assert x.shape == (2, 3) and x.dtype == "float32"
    assert x.transpose().shape == (3, 2)
    assert kiln.tensor(np.arange(3)).dtype == "int64"
    assert kiln.tensor(2.5).item() == 2.5


def test_no_grad_records_nothing():
    w = kiln.tensor(np.ones([2], np.float32), requires_grad=True)
    with kiln.no_grad():
        y = (w * 3.0).sum()
    assert not y.requires_grad
    z = (w * 3.0).sum()
    assert z.requires_grad


def test_layers_register_their_parameters_and_train():
    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
            self.scale = self.create_parameter("scale", [1], kiln.init.Constant(1.0))

        def forward(self, x):
            return self.body(x) * self.scale.tensor()

    net = Net()
    assert len(net.parameters()) == 5
    net.eval()
    assert not net.body.training
    net.train()
    rng = np.random.default_rng(0)
    x = rng.normal(size=[32, 4]).astype(np.float32)
    target = (x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
    opt = kiln.optim.Adam(net.parameters(), lr=0.02)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss = nn.mse(net(kiln.tensor(x)), kiln.tensor(target))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


def test_kilns_built_in_layers_from_python():
    class CNN(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3, padding=1)
            self.pool = nn.MaxPool2d(2)
            self.norm = nn.BatchNorm(4)
            self.flat = nn.Flatten()
            self.fc = nn.Linear(4 * 4 * 4, 10)

        def forward(self, x):
            return self.fc(self.flat(self.pool(self.norm(self.conv(x)).relu())))

    model = CNN()
    assert len(model.parameters()) == 6  # conv w, b; batch norm scale, shift; fc w, b
    x = kiln.tensor(np.random.default_rng(0).normal(size=[2, 1, 8, 8]).astype(np.float32))
    logits = model(x)
    assert logits.shape == (2, 10)
    logits.sum().backward()
    assert model.conv.parameters()[0].grad.shape == (4, 1, 3, 3)
    seq, (h_n, c_n) = nn.LSTM(3, 5, batch_first=True)(kiln.tensor(np.ones([2, 4, 3], np.float32)))
    assert seq.shape == (2, 4, 5) and h_n.shape == c_n.shape == (1, 2, 5)
