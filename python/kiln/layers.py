"""Layers and losses for static programs, taking the program first (as in Rust)."""


def _p(program):
    return program._program


def dense(program, x, units, activation=None, name=None):
    """``activation(x @ w + b)`` with parameters ``<name>.w`` and ``<name>.b``."""
    return _p(program).dense(name or f"dense{len(program.parameter_names()) // 2}", x, units, activation)


def mse(program, prediction, target):
    """The mean of ``(prediction - target) ** 2`` over every element (a scalar). Raises
    ``kiln.ShapeError`` when the shapes differ."""
    return _p(program).layer("mse", [prediction, target])


def softmax_cross_entropy(program, logits, labels):
    """The mean cross-entropy of ``logits`` ``[N, C]`` against integer ``labels`` ``[N]``.
    Raises ``kiln.ShapeError`` when the class count is not fixed or the batches differ."""
    return _p(program).layer("softmax_cross_entropy", [logits, labels])


def sigmoid_cross_entropy(program, logits, labels):
    """The mean binary cross-entropy of ``logits`` against float ``labels`` in [0, 1], of
    the same shape."""
    return _p(program).layer("sigmoid_cross_entropy", [logits, labels])


def accuracy(program, logits, labels):
    """The fraction of rows whose largest logit is at the integer label (a scalar)."""
    return _p(program).layer("accuracy", [logits, labels])


def softmax(program, x):
    """The softmax of ``x`` along its last axis."""
    return _p(program).layer("softmax", [x])


def log_softmax(program, x):
    """The log-softmax of ``x`` along its last axis."""
    return _p(program).layer("log_softmax", [x])


def mean(program, x):
    """The mean of every element of ``x`` (a scalar)."""
    return _p(program).layer("mean", [x])


def flatten(program, x):
    """``x`` ``[N, ...]`` as ``[N, product of the rest]``."""
    return _p(program).layer("flatten", [x])
