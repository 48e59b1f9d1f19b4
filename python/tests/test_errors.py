"""Every Kiln error is a kiln.KilnError with Rust's message; Python exceptions raised inside
a PyLayer or a Layer's forward propagate with their traceback."""

import numpy as np
import pytest

import kiln
from kiln import static
from kiln.static import layers


def test_a_shape_error_names_the_op_and_both_shapes():
    a = kiln.tensor(np.ones([2, 3], np.float32))
    b = kiln.tensor(np.ones([4, 5], np.float32))
    with pytest.raises(kiln.ShapeError) as e:
        a @ b
    message = str(e.value)
    assert "matmul" in message and "f32[2,3]" in message and "f32[4,5]" in message
    assert "test_errors.py:" in message  # where the user's code built it
    assert isinstance(e.value, kiln.KilnError)


def test_a_missing_feed_names_the_placeholder():
    p = static.Program()
    x = p.placeholder("images", "float32", [None, 4])
    out = layers.dense(p, x, 2, name="fc")
    with pytest.raises(kiln.FeedError, match=r"missing feed for placeholder `images`: f32\[N,4\]"):
        kiln.Session(p).run(out)


def test_a_wrongly_shaped_feed_names_the_placeholder_and_both_shapes():
    p = static.Program()
    x = p.placeholder("x", "float32", [None, 4])
    out = layers.dense(p, x, 2, name="fc")
    with pytest.raises(kiln.FeedError, match="feed `x`"):
        kiln.Session(p).run(out, {"x": np.ones([3, 5], np.float32)})


def test_an_exception_in_a_pylayer_propagates_with_its_traceback():
    class Broken(kiln.PyLayer):
        @staticmethod
        def forward(inputs):
            raise ValueError("the numpy code failed")

        @staticmethod
        def backward(inputs, outputs, grads):
            return grads

    with pytest.raises(ValueError, match="the numpy code failed") as e:
        Broken.apply(kiln.tensor(np.ones([2], np.float32)))
    # Its traceback reaches the line that raised; Kiln's error is its cause.
    assert e.traceback[-1].name == "forward"
    assert isinstance(e.value.__cause__, kiln.KilnError)
    assert "custom op @pylayer" in str(e.value.__cause__)
    # Raised again from a compiled program.

    @kiln.to_static
    def f(x):
        return Broken.apply(x)

    with pytest.raises(ValueError, match="the numpy code failed"):
        f(kiln.tensor(np.ones([2], np.float32)))


def test_an_exception_in_a_traced_forward_propagates_as_itself():
    class Net(kiln.nn.Layer):
        def forward(self, x):
            raise KeyError("no such feature")

    with pytest.raises(KeyError, match="no such feature"):
        kiln.to_static(Net())(kiln.tensor(np.ones([2, 2], np.float32)))


def test_unknown_dtypes_and_bad_checkpoints():
    with pytest.raises(TypeError, match="complex128"):
        kiln.tensor(np.ones([2], np.complex128))
    with pytest.raises(kiln.CheckpointError):
        kiln.load_parameters("/nonexistent/params.safetensors")


def test_the_stubs_list_every_op_method():
    # Editors complete from kiln/_kiln.pyi; every elementwise op of the op table is there.
    import pathlib

    stub = (pathlib.Path(kiln.__file__).parent / "_kiln.pyi").read_text()
    for name in kiln._kiln.unary_ops():
        if name != "not":
            assert f"def {name}(self) -> Tensor" in stub, name
            assert hasattr(kiln.Tensor, name)
