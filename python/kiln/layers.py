"""Layers and losses for static programs, taking the program first (as in Rust)."""


def _p(program):
    return program._program


def dense(program, x, units, activation=None, name=None):
    """``activation(x @ w + b)`` with parameters ``<name>.w`` and ``<name>.b``."""
    return _p(program).dense(name or f"dense{len(program.parameter_names()) // 2}", x, units, activation)


def mse(program, prediction, target):
    return _p(program).layer("mse", [prediction, target])


def softmax_cross_entropy(program, logits, labels):
    return _p(program).layer("softmax_cross_entropy", [logits, labels])


def sigmoid_cross_entropy(program, logits, labels):
    return _p(program).layer("sigmoid_cross_entropy", [logits, labels])


def accuracy(program, logits, labels):
    return _p(program).layer("accuracy", [logits, labels])


def softmax(program, x):
    return _p(program).layer("softmax", [x])


def log_softmax(program, x):
    return _p(program).layer("log_softmax", [x])


def mean(program, x):
    return _p(program).layer("mean", [x])


def flatten(program, x):
    return _p(program).layer("flatten", [x])
