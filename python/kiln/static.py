"""Static programs: placeholders, parameters and layers added to a ``Program``, run in a
``kiln.Session`` with feeds and fetches."""


from . import _kiln, init as _init
from ._methods import unary_method as _unary_method
from . import layers  # noqa: F401  (kiln.static.layers)

Var = _kiln.Var
Target = _kiln.Target


class Program:
    """A static program under construction (``seed`` seeds its parameters)."""

    def __init__(self, seed=0):
        self._program = _kiln.Program(seed)

    def placeholder(self, name, dtype, shape):
        """A value fed at each run; ``None`` in ``shape`` is a dimension of any size."""
        return self._program.placeholder(name, str(dtype), list(shape))

    def parameter(self, name, shape, init=None, dtype="float32"):
        """A trainable parameter ``name`` of ``shape``, first drawn by ``init`` (a
        ``kiln.init`` initializer or a number; zeros by default). Raises ``kiln.KilnError``
        for a name already taken."""
        return self._program.parameter(name, list(shape), _init._spec(init), dtype)

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
        """Runs what ``fetches`` (a Var, a Target, a name, or a list of them) need, feeding
        placeholders by name or by their ``Var``; returns numpy arrays (``None`` for a
        target)."""
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


def function(inputs, outputs, updates=(), session=None):
    """A Keras-style function: call it with arrays for ``inputs`` (placeholders) to get
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
