"""ONNX models in Kiln: ``kiln.onnx.load(path)`` imports a model (its graph as Kiln IR, its
initializers as parameters), compiles it, and returns a predictor that takes and returns numpy
arrays; ``kiln.onnx.export(fn, example_inputs, path)`` writes a function or layer as a model.

    model = kiln.onnx.load("model.onnx")
    probs, = model(x)                  # positional, in the order of model.inputs
    probs, = model(x=x)                # or by the model's input names
    kiln.onnx.export(net, (x,), "net.onnx")   # traced on x; the batch stays dynamic

Unsupported nodes are all listed in one ``KilnError``; see the book's "Importing and exporting
ONNX models".
"""

import os
from os import PathLike
from typing import Union

import numpy as np

from . import _kiln


class OnnxModel:
    """An imported, compiled ONNX model: call it with numpy arrays (or anything
    ``np.asarray`` takes), positionally or by input name; it returns a list of arrays, one per
    graph output (``outputs``)."""

    def __init__(self, predictor: _kiln.Predictor):
        self._predictor = predictor

    @property
    def inputs(self) -> list[str]:
        """The graph's input names, in call order (initializers excluded)."""
        return self._predictor.inputs

    @property
    def outputs(self) -> list[str]:
        """The graph's output names, in the order results are returned."""
        return self._predictor.outputs

    def __call__(self, *args, **feeds) -> list[np.ndarray]:
        if feeds:
            unknown = sorted(set(feeds) - set(self.inputs))
            if unknown:
                raise _kiln.FeedError(f"the model has no input {unknown[0]!r}; its inputs are {self.inputs}")
            named = [n for n in self.inputs[len(args):]]
            missing = [n for n in named if n not in feeds]
            if missing:
                raise _kiln.FeedError(f"no value for input {missing[0]!r}")
            args = args + tuple(feeds[n] for n in named)
        if len(args) != len(self.inputs):
            raise _kiln.FeedError(f"the model takes {len(self.inputs)} inputs ({self.inputs}), not {len(args)}")
        return self._predictor(*args)

    def __repr__(self) -> str:
        return f"OnnxModel(inputs={self.inputs}, outputs={self.outputs})"


def load(path: Union[str, PathLike]) -> OnnxModel:
    """Imports the ONNX model at ``path`` and compiles it."""
    return OnnxModel(_kiln.load_onnx(path))


def export(fn, example_inputs, path: Union[str, PathLike], opset: int = 18,
           dynamic_axes=None) -> None:
    """Writes ``fn`` — a function of tensors, a ``Layer`` (call ``.eval()`` first: in training
    mode a ``BatchNorm`` writes its running statistics, which then become inputs and outputs
    of the model, as every written state does) or a ``kiln.to_static`` function
    — as an ONNX model at ``path``, traced on ``example_inputs`` (a tensor, an array, or a
    tuple of them). The parameters' current values become initializers; the first dimension
    of every input is a dynamic axis ``N``, unless ``dynamic_axes`` (as ``kiln.to_static``
    takes it: ``{"x": [1]}`` for a sequence ``[T, N, D]``) names others. Raises ``KilnError``
    naming the op ONNX cannot express (a custom ``PyLayer``, a random draw); nothing is
    written then."""
    from . import tensor
    from .jit import StaticFunction

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    tensors = [t if isinstance(t, _kiln.Tensor) else tensor(np.asarray(t)) for t in example_inputs]
    if isinstance(fn, StaticFunction):
        if dynamic_axes is not None:
            raise ValueError("export: a to_static function has its dynamic axes already; "
                             "pass dynamic_axes to kiln.to_static")
        static = fn
    else:
        static = StaticFunction(fn, dynamic_axes)
    static(*tensors)  # traces on the first call
    static._compiled.export_onnx(os.fspath(path), opset)
