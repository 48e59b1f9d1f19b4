"""``to_static``: trace eager code into a compiled program with the same values."""

import functools

from . import _kiln
from .nn import Layer


class StaticFunction:
    """A function (or layer) compiled by tracing on its first call; later calls run the
    compiled program. ``ir()`` is the traced program's text IR."""

    def __init__(self, fn):
        self._fn = fn
        self._compiled = None
        self._signature = None
        self._minimize = []
        functools.update_wrapper(self, fn.forward if isinstance(fn, Layer) else fn)

    def _trace(self, tensors):
        signature = [(f"x{i}", t.dtype, [None] + list(t.shape[1:])) for i, t in enumerate(tensors)]
        fn = self._fn

        def body(args):
            out = fn(*args)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        self._compiled = _kiln.to_static(body, signature)
        self._signature = signature
        for kind, lr, output, options in self._minimize:
            self._compiled.minimize(kind, lr, output, **options)

    def __call__(self, *tensors):
        if self._compiled is None:
            self._trace(tensors)
        out = self._compiled.call(list(tensors))
        return out[0] if len(out) == 1 else out

    def train_step(self, *tensors):
        """Runs the outputs and applies the updates ``minimize`` added; returns the outputs."""
        if self._compiled is None:
            self._trace(tensors)
        out = self._compiled.call(list(tensors), True)
        return out[0] if len(out) == 1 else out

    def minimize(self, optimizer, output=0):
        """Adds ``optimizer``'s update (a ``kiln.optim`` rule, e.g. ``SGD(lr=0.1)``) of every
        parameter the ``output``-th output (a scalar loss) depends on."""
        entry = (optimizer.kind, optimizer.lr, output, optimizer.options)
        self._minimize.append(entry)
        if self._compiled is not None:
            self._compiled.minimize(entry[0], entry[1], output, **entry[3])
        return self

    def ir(self):
        """The traced program as text IR. Raises ``kiln.KilnError`` before the first call
        (the function is traced then)."""
        if self._compiled is None:
            raise _kiln.KilnError("call the function once first: it is traced on its first call")
        return self._compiled.ir()


def to_static(fn):
    """Compiles ``fn`` (a function of tensors, or a ``Layer``) by tracing; usable as a
    decorator. The batch (first) dimension stays symbolic."""
    return StaticFunction(fn)
