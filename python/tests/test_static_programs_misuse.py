"""A Session follows its program as it grows, and values of two programs never mix: each of
these was a Rust panic (`PanicException`) or a silently wrong value before."""

import numpy as np
import pytest

import kiln
from kiln.static import layers


def ones(rows=4):
    return np.ones([rows, 2], np.float32)


def test_a_session_runs_what_was_added_after_it_was_made():
    p = kiln.static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 2])
    y = p.placeholder("y", "float32", [None, 1])
    session = kiln.Session(p)
    out = layers.dense(p, x, 1, name="fc")             # a value and a parameter, added later
    before = session.run(out, {"x": ones()})          # was: index out of bounds (a panic)
    assert before.shape == (4, 1)
    train = kiln.optim.SGD(lr=0.1).minimize(p, layers.mse(p, out, y))   # a target, added later
    for _ in range(50):
        session.run([train], {"x": ones(), "y": np.full([4, 1], 3.0, np.float32)})
    after = session.run(out, {"x": ones()})
    np.testing.assert_allclose(after, 3.0, rtol=1e-3)
    # The trained weights stay when the program grows again.
    doubled = out * 2.0
    np.testing.assert_allclose(session.run(doubled, {"x": ones()}), 6.0, rtol=1e-3)


def two_programs():
    p, q = kiln.static.Program(seed=0), kiln.static.Program(seed=1)
    return p, q, p.placeholder("x", "float32", [None, 2]), q.placeholder("z", "float32", [None, 2])


@pytest.mark.parametrize(
    "misuse",
    [
        lambda p, q, x, z: x + z,
        lambda p, q, x, z: x.matmul(z),
        lambda p, q, x, z: layers.dense(p, z, 3),
        lambda p, q, x, z: layers.mse(p, x, z),
        lambda p, q, x, z: kiln.optim.SGD(lr=0.1).minimize(p, layers.mean(q, z)),
        lambda p, q, x, z: kiln.Session(p).run(z, {"z": ones()}),
        lambda p, q, x, z: p.save("never.kir", [z]),
    ],
    ids=["add", "matmul", "dense", "mse", "minimize", "fetch", "save"],
)
def test_values_of_two_programs_never_mix(misuse):
    p, q, x, z = two_programs()
    with pytest.raises(kiln.KilnError, match="another Program"):
        misuse(p, q, x, z)


def test_a_target_of_another_program_is_refused():
    p, q, x, z = two_programs()
    layers.dense(q, z, 1, name="fc")
    train = kiln.optim.SGD(lr=0.1).minimize(q, layers.mean(q, layers.dense(q, z, 1, name="g")))
    with pytest.raises(kiln.KilnError, match="another Program"):
        kiln.Session(p).run([train], {"x": ones()})
