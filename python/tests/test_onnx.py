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
