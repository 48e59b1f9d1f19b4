"""Subnormal floats in compiled runs: flushed to zero by default (as TensorFlow and XLA do),
kept as IEEE numbers after ``kiln.set_flush_denormal(False)`` (torch's name for the switch)."""

import numpy as np

import kiln
from kiln import static


def halve(x_value):
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 64])
    y = x * 0.5
    return kiln.Session(p).run([y], {"x": x_value})[0]


def test_compiled_runs_flush_subnormals_unless_asked_to_keep_them():
    x = np.full((4, 64), 1e-39, dtype=np.float32)
    assert np.all(x > 0) and np.all(x < np.finfo(np.float32).tiny)
    try:
        flushes = kiln.set_flush_denormal(True)
        y = halve(x)
        if flushes:
            assert np.all(y == 0.0)
        assert kiln.set_flush_denormal(False) == flushes
        kept = halve(x)
        np.testing.assert_array_equal(kept, x * np.float32(0.5))
        assert np.all(kept > 0)
    finally:
        kiln.set_flush_denormal(True)
