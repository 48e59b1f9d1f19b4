"""Kiln from Python.

Eager tensors with ``backward()``, ``nn.Layer`` subclasses and ``PyLayer`` custom ops written
in Python, ``to_static`` to compile them, static ``Program``\\s run in a ``Session``, and
optimizers for both — all on Kiln's one IR and compiled kernels.

Thread safety: gradients, parameters, compiled functions and trainers belong to the thread
that made them (Kiln's eager context is per thread); using one from another thread raises
``KilnError``, while a plain tensor (no gradient) works anywhere. Programs and sessions may
move between threads; ``Session.run`` releases the GIL while it
computes, and a session runs one ``run`` at a time.
"""

from . import _kiln
from ._methods import unary_method as _unary_method
from ._kiln import (
    cat,
    cond,
    stack,
    CheckpointError,
    CommunicationError,
    FeedError,
    IrError,
    KilnError,
    RunError,
    ShapeError,
    Parameter,
    Tensor,
    load_predictor,
    manual_seed,
    no_grad,
    set_flush_denormal,
    save_parameters,
    load_parameters,
)
from . import data, init, nn, onnx, optim
from . import static
from .autograd import PyLayer
from .jit import DiffReport, diff, to_static
from .static import Session, function
from .train import Trainer

__version__ = _kiln.__version__

__all__ = [
    "CheckpointError",
    "CommunicationError",
    "FeedError",
    "IrError",
    "KilnError",
    "Parameter",
    "PyLayer",
    "RunError",
    "Session",
    "ShapeError",
    "Tensor",
    "cat",
    "cond",
    "stack",
    "float32",
    "float64",
    "int32",
    "int64",
    "bool_",
    "Trainer",
    "data",
    "function",
    "init",
    "load_parameters",
    "load_predictor",
    "manual_seed",
    "nn",
    "no_grad",
    "optim",
    "reset",
    "save_parameters",
    "set_flush_denormal",
    "static",
    "tensor",
    "to_static",
    "diff",
    "DiffReport",
]


def reset():
    """Forgets this thread's parameters, gradients and recorded ops, and restarts layer
    naming, so that a model built again gets the same names (and so the same seeded values)."""
    _kiln.reset()
    nn._counts.clear()


# dtypes by their numpy names, for ``kiln.tensor(data, dtype=kiln.float32)`` and ``t.to(...)``.
float32, float64, int32, int64, bool_ = "float32", "float64", "int32", "int64", "bool"


def tensor(data, dtype=None, requires_grad=False):
    """An eager tensor holding ``data`` (a numpy array, list or number; Python floats
    become float32), converted to ``dtype`` when given (``kiln.float32``, ``"int64"``, …).
    With ``requires_grad``, ``backward()`` computes its gradient."""
    if dtype is not None:
        import numpy as np
        data = np.asarray(data, dtype=str(dtype))
    return _kiln.tensor(data, requires_grad)


def _install_tensor_methods():
    # The op table's elementwise ops (tanh, exp, sigmoid, …) become methods: one list, in Rust.
    for name in _kiln.unary_ops():
        if not hasattr(Tensor, name):
            setattr(Tensor, name, _unary_method(name))
    binary = {
        "__add__": "add", "__sub__": "sub", "__mul__": "mul", "__truediv__": "div",
        "__pow__": "pow",
    }
    for dunder, op in binary.items():
        setattr(Tensor, dunder, lambda self, other, _op=op: self._binary(_op, other))
        rname = "__r" + dunder[2:]
        setattr(Tensor, rname, lambda self, other, _op=op: self._binary(_op, other, True))
    compare = {"__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
               "__eq__": "eq", "__ne__": "ne"}
    for dunder, op in compare.items():
        setattr(Tensor, dunder, lambda self, other, _op=op: self._compare(_op, other)
                if other is not None else _op == "ne")
    Tensor.__hash__ = object.__hash__  # by identity, as PyTorch's tensors
    Tensor.view = Tensor.reshape
    Tensor.to = lambda self, dtype: self.astype(str(dtype))
    Tensor.to.__doc__ = "The values converted to ``dtype`` (``kiln.float32``, ``\"int64\"``, …)."
    Tensor.tolist = lambda self: self.numpy().tolist()
    Tensor.tolist.__doc__ = "The elements as (nested) Python numbers."
    Tensor.__neg__ = lambda self: self._unary("neg")
    Tensor.__matmul__ = lambda self, other: self.matmul(other)
    Tensor.T = property(lambda self: self.transpose(), doc="The tensor with its axes reversed.")


_install_tensor_methods()


def _install_parameter_as_tensor():
    # A parameter is a tensor, as in PyTorch: its tensor methods, operators and indexing act
    # on its current value (recorded for gradients), so `x @ self.weight` and `p.sum()` work.
    # `==` stays identity for parameters, which are kept in lists and dicts.
    Parameter = _kiln.Parameter
    skip = {"__eq__", "__ne__", "__hash__", "__init__", "__new__", "__repr__", "__getattribute__",
            "__setattr__", "__delattr__", "__doc__", "__module__", "__class__", "__dict__",
            "__init_subclass__", "__subclasshook__", "__reduce__", "__reduce_ex__", "__dir__",
            "__sizeof__", "__format__", "__str__"}
    for name in dir(Tensor):
        if name in skip or hasattr(Parameter, name) and not name.startswith("__"):
            continue
        attr = getattr(Tensor, name)
        if isinstance(attr, property) or not callable(attr):
            continue
        if name.startswith("__") and name in vars(object) and name not in ("__lt__", "__le__", "__gt__", "__ge__"):
            continue
        method = lambda self, *a, _n=name, **k: getattr(self.tensor(), _n)(*a, **k)  # noqa: E731
        method.__doc__ = attr.__doc__
        setattr(Parameter, name, method)
    for name in ("dtype", "ndim", "T", "requires_grad"):
        if hasattr(Tensor, name) and not hasattr(Parameter, name):
            doc = getattr(Tensor, name).__doc__
            setattr(Parameter, name, property(lambda self, _n=name: getattr(self.tensor(), _n), doc=doc))


_install_parameter_as_tensor()
