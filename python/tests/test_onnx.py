"""kiln.onnx: an ONNX model imported, compiled and called with numpy arrays."""

from pathlib import Path

import numpy as np
import pytest

import kiln

ROOT = Path(__file__).resolve().parents[2]
MLP = ROOT / "tests" / "onnx" / "mlp.onnx"
X = np.load(ROOT / "tests" / "onnx" / "x.npy")
# onnxruntime 1.32's output for this model and input (the book's console sample checks the same
# numbers through `kiln run`).
ORT = np.array([[0.0009853712, 0.9966838, 0.0023308806], [2.9777518e-09, 1.0, 4.6850925e-08]], np.float32)


def test_a_model_runs_by_position_and_by_name():
    model = kiln.onnx.load(MLP)
    assert model.inputs == ["x"] and model.outputs == ["probs"]
    (by_position,) = model(X)
    (by_name,) = model(x=X)
    assert by_position.dtype == np.float32 and by_position.shape == (2, 3)
    np.testing.assert_allclose(by_position, ORT, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(by_position, by_name)


def test_any_batch_size_runs():
    model = kiln.onnx.load(str(MLP))
    (probs,) = model(np.tile(X, (5, 1)))
    assert probs.shape == (10, 3)
    np.testing.assert_allclose(probs[:2], ORT, rtol=1e-5, atol=1e-7)


def test_bad_calls_and_files_raise_kiln_errors():
    model = kiln.onnx.load(MLP)
    with pytest.raises(kiln.FeedError, match="no input 'y'"):
        model(y=X)
    with pytest.raises(kiln.FeedError, match="takes 1 inputs"):
        model(X, X)
    with pytest.raises(kiln.KilnError):
        model(X.astype(np.float64))
    with pytest.raises(kiln.KilnError, match="cannot read"):
        kiln.onnx.load(ROOT / "no-such-model.onnx")
    with pytest.raises(kiln.KilnError, match="not a valid ONNX model|invalid model"):
        kiln.onnx.load(ROOT / "tests" / "onnx" / "x.npy")


def test_matches_onnxruntime_when_installed():
    ort = pytest.importorskip("onnxruntime")
    expected = ort.InferenceSession(str(MLP)).run(None, {"x": X})[0]
    np.testing.assert_allclose(kiln.onnx.load(MLP)(X)[0], expected, rtol=1e-5, atol=1e-7)


def _cnn():
    kiln.manual_seed(0)
    return kiln.nn.Sequential(
        kiln.nn.Conv2d(1, 4, 3, padding=1), kiln.nn.BatchNorm(4), kiln.nn.ReLU(),
        kiln.nn.MaxPool2d(2), kiln.nn.Flatten(), kiln.nn.Linear(4 * 4 * 4, 3))


def test_export_writes_what_kiln_onnx_load_reads_back(tmp_path):
    net = _cnn().eval()
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32)
    expected = net(kiln.tensor(x)).numpy()
    kiln.onnx.export(net, (x,), tmp_path / "cnn.onnx")
    model = kiln.onnx.load(tmp_path / "cnn.onnx")
    np.testing.assert_allclose(model(x)[0], expected, rtol=1e-5, atol=1e-6)
    # The batch is a dynamic axis: another batch size runs from the same file.
    x5 = np.tile(x, (3, 1, 1, 1))[:5]
    np.testing.assert_allclose(model(x5)[0], net(kiln.tensor(x5)).numpy(), rtol=1e-5, atol=1e-6)

    encoder = kiln.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                              activation="gelu", batch_first=True, norm_first=True)
    tokens = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    kiln.onnx.export(encoder, kiln.tensor(tokens), tmp_path / "encoder.onnx")
    back = kiln.onnx.load(tmp_path / "encoder.onnx")(tokens)[0]
    np.testing.assert_allclose(back, encoder(kiln.tensor(tokens)).numpy(), rtol=1e-5, atol=1e-5)


def test_exported_models_run_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    net = _cnn().eval()
    kiln.onnx.export(net, np.zeros((1, 1, 8, 8), np.float32), tmp_path / "cnn.onnx")
    x = np.random.default_rng(2).standard_normal((7, 1, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(str(tmp_path / "cnn.onnx"), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    np.testing.assert_allclose(session.run(None, {name: x})[0], net(kiln.tensor(x)).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_recurrent_layers_export_as_lstm_and_gru_nodes(tmp_path):
    kiln.manual_seed(3)
    # Batch first: export keeps the first axis dynamic, and the steps must be fixed.
    x = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)
    layers = [(kiln.nn.LSTM(3, 5, num_layers=2, batch_first=True), b"LSTM"),
              (kiln.nn.GRU(3, 5, batch_first=True), b"GRU")]
    for layer, op in layers:
        path = tmp_path / f"{op.decode().lower()}.onnx"
        kiln.onnx.export(lambda x: layer(x)[0], x, path)
        # One node per layer (the op type is a string in the protobuf; no other name has
        # capitals), not the unrolled steps.
        data = path.read_bytes()
        assert data.count(op + b":") == layer.num_layers and b"Sigmoid" not in data
        expected = layer(kiln.tensor(x))[0].numpy()
        np.testing.assert_allclose(kiln.onnx.load(path)(x)[0], expected, rtol=1e-5, atol=1e-6)
        try:
            import onnxruntime as ort
        except ImportError:
            continue
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (name,) = [i.name for i in session.get_inputs()]
        np.testing.assert_allclose(session.run(None, {name: x})[0], expected, rtol=1e-5, atol=1e-6)


def test_dynamic_axes_other_than_the_first(tmp_path):
    kiln.manual_seed(4)
    lstm = kiln.nn.LSTM(3, 5)  # PyTorch's layout: x is [T, N, D], the batch on axis 1
    x = np.random.default_rng(4).standard_normal((4, 2, 3)).astype(np.float32)
    kiln.onnx.export(lambda x: lstm(x)[0], x, tmp_path / "lstm.onnx", dynamic_axes={"x": [1]})
    model = kiln.onnx.load(tmp_path / "lstm.onnx")
    x7 = np.random.default_rng(5).standard_normal((4, 7, 3)).astype(np.float32)
    np.testing.assert_allclose(model(x7)[0], lstm(kiln.tensor(x7))[0].numpy(), rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(kiln.KilnError):  # the steps stay fixed
        model(x7[:3])
    # to_static takes the same argument; a call must fit every fixed axis.
    compiled = kiln.to_static(lambda x: lstm(x)[0], dynamic_axes={0: {1: "batch"}})
    np.testing.assert_allclose(compiled(kiln.tensor(x7)).numpy(), model(x7)[0], rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(kiln.ShapeError, match=r"traced as float32\[4, x_1, 3\]"):
        compiled(kiln.tensor(x7[:3]))
    with pytest.raises(ValueError, match="dynamic axis 3 of argument `x`"):
        kiln.onnx.export(lambda x: lstm(x)[0], x, tmp_path / "bad.onnx", dynamic_axes=[[3]])


def test_what_onnx_cannot_express_is_refused_and_nothing_written(tmp_path):
    class Cube(kiln.PyLayer):
        @staticmethod
        def forward(inputs):
            return inputs[0] ** 3

        @staticmethod
        def backward(inputs, outputs, grads):
            return 3 * inputs[0] ** 2 * grads[0]

    with pytest.raises(kiln.KilnError, match="custom op .* has no ONNX form"):
        kiln.onnx.export(lambda x: Cube.apply(x), np.ones((2, 3), np.float32), tmp_path / "cube.onnx")
    assert list(tmp_path.iterdir()) == []
