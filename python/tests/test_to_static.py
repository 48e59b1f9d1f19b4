"""to_static: a traced function or layer computes what the eager code computes, shows its IR,
and trains with the updates minimize adds."""

import numpy as np
import pytest

import kiln
from kiln import nn


@pytest.fixture(autouse=True)
def fresh():
    kiln.reset()
    kiln.manual_seed(0)


class Classifier(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.fc1(x).tanh()).softmax(-1)


def test_a_traced_layer_gives_the_eager_values_for_any_batch():
    model = Classifier()
    compiled = kiln.to_static(model)
    rng = np.random.default_rng(0)
    for batch in [5, 17]:
        x = kiln.tensor(rng.normal(size=[batch, 8]).astype(np.float32))
        with kiln.no_grad():
            eager = model(x).numpy()
        np.testing.assert_allclose(compiled(x).numpy(), eager, rtol=1e-5, atol=1e-6)
    ir = compiled.ir()
    assert "matmul" in ir and "tanh" in ir and "func @forward" in ir


def test_the_decorator_and_a_pylayer_traced_as_a_call():
    class Square(kiln.PyLayer):
        @staticmethod
        def forward(inputs):
            return inputs[0] ** 2

        @staticmethod
        def backward(inputs, outputs, grads):
            return [2 * inputs[0] * grads[0]]

    @kiln.to_static
    def f(x):
        return Square.apply(x).sum(axis=1) + 1.0

    x = kiln.tensor(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    np.testing.assert_allclose(f(x).numpy(), [6.0, 26.0])
    assert "call @pylayer" in f.ir()


def test_a_compiled_training_step_matches_eager_training():
    rng = np.random.default_rng(1)
    x = rng.normal(size=[32, 8]).astype(np.float32)
    labels = rng.integers(0, 3, size=[32])
    one_hot = np.eye(3, dtype=np.float32)[labels]

    def loss_of(model, xs, ys):
        p = model(xs)
        return -((p + 1e-6).log() * ys).sum(-1).mean()

    def train(compiled):
        kiln.reset()
        kiln.manual_seed(7)
        model = Classifier()
        xs, ys = kiln.tensor(x), kiln.tensor(one_hot)
        losses = []
        if compiled:
            step = kiln.to_static(lambda a, b: loss_of(model, a, b))
            step.minimize(kiln.optim.SGD(lr=0.5))
            for _ in range(20):
                losses.append(step.train_step(xs, ys).item())
        else:
            opt = kiln.optim.SGD(model.parameters(), lr=0.5)
            for _ in range(20):
                opt.zero_grad()
                loss = loss_of(model, xs, ys)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses

    eager, compiled = train(False), train(True)
    np.testing.assert_allclose(compiled, eager, rtol=1e-4)
    assert eager[-1] < eager[0]


def test_a_traced_model_saved_and_served_gives_the_same_values(tmp_path):
    model = Classifier()
    compiled = kiln.to_static(model)
    x = kiln.tensor(np.random.default_rng(2).normal(size=[4, 8]).astype(np.float32))
    expected = compiled(x).numpy()
    (tmp_path / "model.kir").write_text(compiled.ir())
    kiln.save_parameters(tmp_path / "params.safetensors")
    predict = kiln.load_predictor(tmp_path / "model.kir", tmp_path / "params.safetensors")
    np.testing.assert_allclose(predict(x.numpy())[0], expected, rtol=1e-6)


def test_losses_trace_too():
    model = Classifier()

    @kiln.to_static
    def loss(x, labels):
        return kiln.nn.cross_entropy(model(x).log(), labels)

    x = kiln.tensor(np.random.default_rng(3).normal(size=[6, 8]).astype(np.float32))
    labels = kiln.tensor(np.array([0, 1, 2, 0, 1, 2]))
    with kiln.no_grad():
        eager = kiln.nn.cross_entropy(model(x).log(), labels).item()
    assert loss(x, labels).item() == pytest.approx(eager, rel=1e-5)
