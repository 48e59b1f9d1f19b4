"""Static programs: placeholders, parameters and layers added to a ``Program``, run in a
``kiln.Session`` with feeds and fetches."""


import sys as _sys

import numpy as _np

from . import _kiln, init as _init
from ._methods import unary_method as _unary_method
from . import layers  # noqa: F401  (kiln.static.layers)

# `from kiln.static.layers import dense` works as the attribute does.
_sys.modules[__name__ + ".layers"] = layers

Var = _kiln.Var
Target = _kiln.Target


class Program:
    """A static program under construction (``seed`` seeds its parameters)."""

    def __init__(self, seed=0):
        self._program = _kiln.Program(seed)

    def placeholder(self, name, dtype, shape):
        """A value fed at each run; ``None`` in ``shape`` is a dimension of any size."""
        return self._program.placeholder(name, str(dtype), list(shape))

    def parameter(self, name, shape=None, init=None, dtype=None, trainable=True):
        """A parameter ``name`` of ``shape``, first drawn by ``init``: a ``kiln.init``
        initializer, a number (zeros by default), or an array (Keras's ``variable(value)``:
        the shape and dtype are the array's unless given; the text IR declares it with
        ``values(...)``). ``trainable=False`` makes state no optimizer updates (a buffer:
        a counter, a value ``assign`` sets). Raises ``kiln.KilnError`` for a name already
        taken, ``ValueError`` for a shape the array does not have."""
        if isinstance(init, (_np.ndarray, list, tuple)) or hasattr(init, "__array__"):
            value = _np.asarray(init) if dtype is None else _np.asarray(init, dtype=str(dtype))
            if shape is not None and tuple(shape) != value.shape:
                raise ValueError(f"parameter `{name}`: shape {list(shape)}, but the array's "
                                 f"is {list(value.shape)}")
            if isinstance(init, (list, tuple)) and dtype is None and value.dtype == _np.float64:
                value = value.astype(_np.float32)   # Python floats are f32, as everywhere
            return self._program.parameter_from(name, value, trainable)
        if shape is None:
            raise TypeError(f"parameter `{name}`: give a shape, or an array as init")
        return self._program.parameter(name, list(shape), _init._spec(init),
                                       str(dtype or "float32"), trainable)

    def parameter_names(self):
        """The names of the program's parameters, in the order they were made."""
        return self._program.parameter_names()

    def ir(self):
        """The whole graph as text IR."""
        return self._program.ir()

    def save(self, path, outputs, name="predict"):
        """Saves the function computing ``outputs`` (and the state it reads) as text IR."""
        return self._program.save(str(path), list(outputs), name)


class Session:
    """Runs any part of a ``Program`` with feeds and fetches, over one set of parameters
    (initialised when the session starts). The GIL is released while a run computes; runs
    from several threads take turns. ``with Session(program) as s:`` closes it at the end of
    the block."""

    def __init__(self, program):
        if isinstance(program, Program):
            program = program._program
        elif not isinstance(program, _kiln.Program):
            raise TypeError(f"Session(program): a kiln.static.Program, not {type(program).__name__}")
        self._native = _kiln.Session(program)

    @property
    def _session(self):
        if self._native is None:
            raise _kiln.KilnError("this Session was closed (its `with` block ended)")
        return self._native

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        """Frees the session's parameters and compiled code; using it afterwards is an
        error."""
        self._native = None

    def run(self, fetches, feed=None):
        """Runs what ``fetches`` (a Var, a Target, a name, or a list of them) need with
        ``feed``: keys are names or ``Var`` objects — placeholders, or any other value of the
        program, named or not, which is then not computed (evaluate from any position).
        Returns numpy arrays (``None`` for a target). A feed that would cut the path of a
        fetched update or gradient raises ``kiln.FeedError`` saying which."""
        return self._session.run(fetches, feed or {})

    def state(self, name):
        """The value of state ``name`` (a parameter or an optimizer moment)."""
        return self._session.state(name)

    def save(self, path):
        """Saves every parameter and optimizer state (safetensors, written atomically)."""
        self._session.save(str(path))

    def load(self, path):
        """Loads a checkpoint; on error nothing changes."""
        self._session.load(str(path))


def gradients(loss, wrt):
    """The gradients of the scalar ``loss`` with respect to ``wrt`` (a Var or a list of them:
    parameters, placeholders or any float value), added to the program as Vars to fetch —
    or to differentiate again (``gradients(gradients(loss, [w])[0], [w])`` is the second
    derivative). Returns a list, one per ``wrt``; a value ``loss`` does not depend on gets
    zeros. TF's ``tf.gradients``; ``minimize`` adds these and the updates."""
    single = isinstance(wrt, Var)
    wrt = [wrt] if single else list(wrt)
    if not isinstance(loss, Var) or not all(isinstance(w, Var) for w in wrt):
        raise TypeError("gradients(loss, wrt): a Var and Vars of one program")
    return loss.program.gradients(loss, wrt)


def assign(var, value):
    """A target that stores ``value`` (a Var, a number or an array) into the parameter or
    state ``var`` when a session fetches it: TF's ``assign``, the design notes' "variable
    updated from a placeholder's value". Raises ``kiln.KilnError`` when ``var`` is not
    state, ``kiln.ShapeError`` when the types differ."""
    if not isinstance(var, Var):
        raise TypeError(f"assign(var, value): var is a Var of a program, not {type(var).__name__}")
    return var.program.assign([(var, value)])


def assign_add(var, delta):
    """``assign(var, var + delta)``."""
    return assign(var, var + delta)


def assign_sub(var, delta):
    """``assign(var, var - delta)``."""
    return assign(var, var - delta)


def function(inputs, outputs, updates=(), session=None):
    """A Keras-style function: call it with arrays for ``inputs`` (any Vars of the program:
    placeholders, or intermediates to evaluate from) to get
    ``outputs`` as numpy arrays and apply ``updates``: targets (from ``minimize``), or
    ``(var, new_value)`` pairs that store ``new_value`` into the parameter or state ``var``
    loads. It runs in ``session``, or in the program's default session, which every such
    function of the program shares."""
    inputs, outputs = list(inputs), list(outputs)
    first = (inputs or outputs or [None])[0]
    if not isinstance(first, Var):
        raise TypeError("function(inputs, outputs): inputs and outputs are Vars of a program")
    pairs = [u for u in updates if isinstance(u, tuple)]
    targets = [u for u in updates if not isinstance(u, tuple)]
    if pairs:
        targets.append(first.program.assign(pairs))
    native = first.program.default_session() if session is None else session._session
    return _kiln.Function(native, inputs, outputs, targets)


def _install_var_methods():
    for name in _kiln.unary_ops():
        if not hasattr(Var, name):
            setattr(Var, name, _unary_method(name))
    for dunder, op in {"__add__": "add", "__sub__": "sub", "__mul__": "mul",
                       "__truediv__": "div", "__pow__": "pow"}.items():
        setattr(Var, dunder, lambda self, other, _op=op: self._binary(_op, other))
        setattr(Var, "__r" + dunder[2:], lambda self, other, _op=op: self._binary(_op, other, True))
    Var.__neg__ = lambda self: self._unary("neg")
    Var.__matmul__ = lambda self, other: self.matmul(other)


_install_var_methods()
