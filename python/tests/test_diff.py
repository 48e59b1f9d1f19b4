"""kiln.diff: a function eagerly against compiled by to_static, op by op, named by the caller's
Python line; the first op to make a NaN in each run."""

import inspect

import numpy as np

import kiln
from kiln import nn


def line_of(marker):
    """The line of this file holding ``marker`` (a comment at the end of the line)."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(marker))


def test_a_layer_agrees_eager_and_compiled():
    kiln.manual_seed(0)
    layer = nn.Linear(3, 4)
    x = kiln.tensor(np.array([[0.5, -1.0, 2.0], [0.25, 1.5, -0.75]], np.float32))
    report = kiln.diff(lambda t: layer(t).tanh().exp().mean(), x)
    assert report.agree, str(report)
    assert report.first is None and report.non_finite == []
    assert report.compared >= 4
    assert str(report).startswith("agree: ")


def test_the_first_nan_is_named_at_the_python_line():
    x = kiln.tensor(np.array([[0.5, -1.0], [2.0, -3.0]], np.float32))

    def f(t):
        s = t.abs()
        l = t.log()  # the NaNs
        return (l + s).exp()

    report = kiln.diff(f, x)
    assert not report.agree
    assert [n["run"] for n in report.non_finite] == ["eager", "compiled", "interpreted"], str(report)
    for n in report.non_finite:
        assert n["op"] == "log"
        assert n["line"] == f"{__file__}:{line_of('# the NaNs')}", str(report)
        assert (n["nan"], n["inf"]) == (2, 0)


def test_inputs_must_be_tensors():
    try:
        kiln.diff(lambda t: t, np.ones(3, np.float32))
    except TypeError as e:
        assert "input 0 is a ndarray, not a kiln.Tensor" in str(e)
    else:
        raise AssertionError("no TypeError")
