"""``to_static``: trace eager code into a compiled program with the same values."""

import functools
import inspect

from . import _kiln
from .nn import Layer


class StaticFunction:
    """A function (or layer) compiled by tracing on its first call; later calls run the
    compiled program. ``ir()`` is the traced program's text IR."""

    def __init__(self, fn, dynamic_axes=None):
        self._fn = fn
        self._compiled = None
        self._signature = None
        self._minimize = []
        self._dynamic_axes = dynamic_axes
        functools.update_wrapper(self, fn.forward if isinstance(fn, Layer) else fn)

    def _argument_names(self, count):
        """The traced function's parameter names (``x0``, ``x1``… where it has none), so
        that its inputs and errors name them."""
        try:
            params = inspect.signature(self.__wrapped__).parameters.values()
            names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            names = []
        return [names[i] if i < len(names) else f"x{i}" for i in range(count)]

    def _check(self, tensors):
        for name, t in zip(self._argument_names(len(tensors)), tensors):
            if not isinstance(t, _kiln.Tensor):
                raise TypeError(f"{self.__name__}: argument `{name}` is a {type(t).__name__}; "
                                "a compiled function takes kiln.Tensor arguments")
        if self._signature is None:
            return
        if len(tensors) != len(self._signature):
            raise TypeError(f"{self.__name__} was traced with {len(self._signature)} "
                            f"argument(s), called with {len(tensors)}")
        for (name, dtype, shape), t in zip(self._signature, tensors):
            fits = len(t.shape) == len(shape) and all(
                d is None or d == n for d, n in zip(shape, t.shape))
            if t.dtype != dtype or not fits:
                traced = ", ".join(_symbol(name, i) if d is None else str(d)
                                   for i, d in enumerate(shape))
                raise _kiln.ShapeError(
                    f"{self.__name__}: argument `{name}` is {t.dtype}{list(t.shape)}, but it was "
                    f"traced as {dtype}[{traced}] (a compiled function keeps the dtype and "
                    "shape of its first call, but for its dynamic axes)")

    def _dynamic(self, i, name, rank):
        """The dynamic axes of argument ``i`` (named ``name``) of rank ``rank``."""
        spec = self._dynamic_axes
        if isinstance(spec, dict):
            axes = spec.get(name, spec.get(i, []))
        else:
            axes = spec[i] if i < len(spec) else []
        if isinstance(axes, dict):  # torch.onnx's {axis: name}: the names are Kiln's own
            axes = list(axes)
        for a in axes:
            if not isinstance(a, int) or not -rank <= a < rank:
                raise ValueError(f"{self.__name__}: dynamic axis {a!r} of argument `{name}`, "
                                 f"which has {rank} axes")
        return {a % rank for a in axes}

    def _trace(self, tensors):
        names = self._argument_names(len(tensors))
        if self._dynamic_axes is None:  # the batch: the first axis of every argument
            signature = [(name, t.dtype, [None] + list(t.shape[1:]))
                         for name, t in zip(names, tensors)]
        else:
            signature = []
            for i, (name, t) in enumerate(zip(names, tensors)):
                dynamic = self._dynamic(i, name, len(t.shape))
                shape = [None if a in dynamic else n for a, n in enumerate(t.shape)]
                signature.append((name, t.dtype, shape))
        fn = self._fn

        def body(args):
            out = fn(*args)
            return list(out) if isinstance(out, (list, tuple)) else [out]

        self._compiled = _kiln.to_static(body, signature)
        self._signature = signature
        for kind, lr, output, options in self._minimize:
            self._compiled.minimize(kind, lr, output, **options)

    def __call__(self, *tensors):
        self._check(tensors)
        if self._compiled is None:
            self._trace(tensors)
        out = self._compiled.call(list(tensors))
        return out[0] if len(out) == 1 else out

    def train_step(self, *tensors):
        """Runs the outputs and applies the updates ``minimize`` added; returns the outputs."""
        self._check(tensors)
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


def _symbol(name, axis):
    """The symbol of a dynamic axis: ``N`` for the first (the batch, shared by every
    argument), ``<argument>_<axis>`` for another."""
    return "N" if axis == 0 else f"{name}_{axis}"


def to_static(fn=None, *, dynamic_axes=None):
    """Compiles ``fn`` (a function of tensors, or a ``Layer``) by tracing; usable as a
    decorator (``@to_static`` or ``@to_static(dynamic_axes=...)``). The batch (first)
    dimension stays symbolic; ``dynamic_axes`` chooses other axes instead: a list with one
    list of axes per argument, or a dict from an argument's name or position to its axes
    (``{"x": [1]}`` for a sequence ``[T, N, D]``; torch.onnx's ``{1: "batch"}`` form is read
    too). Axis 0 is the symbol ``N``, shared by all arguments; axis ``k`` of argument ``x``
    is ``x_k``."""
    if fn is None:
        return lambda f: StaticFunction(f, dynamic_axes)
    return StaticFunction(fn, dynamic_axes)


class DiffReport:
    """What ``kiln.diff`` found: ``agree``; ``first``, the first op whose eager and compiled
    values differ (a dict: ``op``, ``line`` — your source line —, ``eager`` and ``compiled``
    summaries, ``max_abs_error``, ``max_rel_error``) or ``None``; ``non_finite``, for each run
    (``eager``, ``compiled``, ``interpreted``) that made a NaN or infinity, the first op that
    did; ``compared``, how many ops were compared. ``str(report)`` says it in words."""

    def __init__(self, report):
        self.agree = report["agree"]
        self.first = report["first"]
        self.non_finite = report["non_finite"]
        self.compared = report["compared"]
        self._text = report["text"]

    def __str__(self):
        return self._text

    def __repr__(self):
        return f"DiffReport(agree={self.agree}, compared={self.compared}, first={self.first!r})"


def diff(fn, *inputs):
    """Runs ``fn`` on ``inputs`` eagerly and compiled by ``to_static`` (and interpreted),
    compares every op's values, and names the first that differs — and the first op of each
    run to make a NaN or infinity — by your source line. Returns a ``DiffReport``."""
    for i, t in enumerate(inputs):
        if not isinstance(t, _kiln.Tensor):
            raise TypeError(f"kiln.diff: input {i} is a {type(t).__name__}, not a kiln.Tensor")

    def body(args):
        out = fn(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]

    return DiffReport(_kiln.diff(body, list(inputs)))
