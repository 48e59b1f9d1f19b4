"""The seeds' static-graph API from Python, written as the design notes and TF1/Keras users
write it: ``minimize(loss, var_list)``, gradients as values, ``assign``, ``kiln.function``
and feeds from any value, parameters from arrays — and the forms that cannot be right
refused with errors that say why."""

import numpy as np
import pytest

import kiln
from kiln.static import Program, Session, assign, assign_add, gradients


def affine():
    """The computational-graph essay's ``y = Wx + b``, with ``Wx`` left unnamed."""
    p = Program()
    x = p.placeholder("x", "float32", [None, 2])
    W = p.parameter("W", init=np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32))
    b = p.parameter("b", init=np.array([0.5, -0.5], dtype=np.float32))
    Wx = x @ W
    y = Wx + b
    return p, x, W, b, Wx, y


def test_minimize_takes_a_var_list_of_vars_or_names():
    p, x, W, b, Wx, y = affine()
    t = p.placeholder("t", "float32", [None, 2])
    loss = kiln.static.layers.mse(p, y, t)
    step = kiln.optim.SGD(lr=0.1).minimize(p, loss, var_list=[b])
    s = Session(p)
    feed = {x: np.ones((4, 2), np.float32), t: np.zeros((4, 2), np.float32)}
    before = s.run(loss, feed)
    for _ in range(5):
        s.run(step, feed)
    assert s.run(loss, feed) < before
    np.testing.assert_array_equal(s.state("W"), [[1, 2], [3, 4]])   # not in var_list
    assert not np.allclose(s.state("b"), [0.5, -0.5])
    by_name = kiln.optim.SGD(lr=0.1).minimize(loss, var_list=["W"])
    s.run(by_name, feed)
    assert not np.allclose(s.state("W"), [[1, 2], [3, 4]])


def test_var_list_errors_name_what_is_wrong():
    p, x, W, b, Wx, y = affine()
    loss = kiln.static.layers.mean(p, y)
    with pytest.raises(kiln.KilnError, match="is not a parameter of the program"):
        kiln.optim.SGD(lr=0.1).minimize(loss, var_list=[Wx])
    with pytest.raises(kiln.KilnError, match="`w` is not a parameter of the program; its "
                                             "parameters are: W, b"):
        kiln.optim.SGD(lr=0.1).minimize(loss, var_list=["w"])
    unused = p.parameter("unused", [2], init=1.0)
    with pytest.raises(kiln.KilnError, match="depends on none of the parameters"):
        kiln.optim.SGD(lr=0.1).minimize(loss, var_list=[unused])
    with pytest.raises(TypeError, match="parameters or var_list, not both"):
        kiln.optim.SGD(lr=0.1).minimize(loss, parameters=["W"], var_list=[W])


def test_gradients_are_values_to_fetch_and_differentiate_again():
    p = Program()
    x = p.placeholder("x", "float64", [3])
    w = p.parameter("w", init=np.array(0.7))
    loss = (x * w).tanh().sum()
    dw, dx = gradients(loss, [w, x])
    (d2w,) = gradients(dw, w)
    xs = np.array([0.3, -1.2, 2.0])
    got_dw, got_dx, got_d2w = Session(p).run([dw, dx, d2w], {x: xs})
    sech2 = 1 - np.tanh(xs * 0.7) ** 2
    np.testing.assert_allclose(got_dw, np.sum(xs * sech2), rtol=1e-12)
    np.testing.assert_allclose(got_dx, 0.7 * sech2, rtol=1e-12)
    np.testing.assert_allclose(got_d2w, np.sum(-2 * xs**2 * np.tanh(xs * 0.7) * sech2),
                               rtol=1e-12)
    # Against central differences in f64, as every gradient is checked.
    f = lambda w_: np.sum(np.tanh(xs * w_))   # noqa: E731
    h = 1e-6
    np.testing.assert_allclose(got_dw, (f(0.7 + h) - f(0.7 - h)) / (2 * h), rtol=1e-8)


def test_a_gradient_is_refused_when_a_feed_cuts_its_path():
    p, x, W, b, Wx, y = affine()
    loss = kiln.static.layers.mean(p, y)
    (dW,) = gradients(loss, [W])
    s = Session(p)
    with pytest.raises(kiln.FeedError, match="lies between `W` and"):
        s.run(dW, {Wx: np.ones((1, 2), np.float32)})
    # From x, it is W's gradient; the loss alone may be evaluated from Wx.
    np.testing.assert_allclose(s.run(dW, {x: np.ones((1, 2), np.float32)}), np.full((2, 2), 0.5))
    assert s.run(loss, {Wx: np.zeros((1, 2), np.float32)}) == 0.0


def test_assign_updates_a_variable_from_a_placeholders_value():
    p = Program()
    v = p.parameter("v", init=np.zeros(2, np.float32), trainable=False)
    x = p.placeholder("x", "float32", [2])
    update = assign(v, x)
    count = p.parameter("count", [], init=0.0, trainable=False)
    tick = assign_add(count, 1.0)
    reset = assign(v, 0.0)
    s = Session(p)
    assert s.run(update, {x: np.array([3.0, 4.0], np.float32)}) is None
    np.testing.assert_array_equal(s.state("v"), [3, 4])
    s.run([tick, tick])
    s.run(tick)
    assert s.state("count") == 2.0   # one target fetched twice in a run applies once
    s.run(reset)
    np.testing.assert_array_equal(s.state("v"), [0, 0])
    assert p.parameter_names() == []   # buffers are not trained
    with pytest.raises(kiln.ShapeError, match=r"@v has type f32\[2\], the stored value f32\[3\]"):
        assign(v, p.placeholder("wide", "float32", [3]))
    with pytest.raises(kiln.KilnError, match="assign: `x` is not a parameter or other state"):
        assign(x, v)


def test_a_function_evaluates_from_any_value():
    p, x, W, b, Wx, y = affine()
    from_wx = kiln.function([Wx], [y])
    (out,) = from_wx(np.array([[0.0, 0.0], [1.0, 1.0]], np.float32))
    np.testing.assert_array_equal(out, [[0.5, -0.5], [1.5, 0.5]])
    (direct,) = kiln.function([x], [y])(np.ones((1, 2), np.float32))
    np.testing.assert_array_equal(direct, [[4.5, 5.5]])


def test_feeds_keyed_by_any_var_named_or_not():
    p, x, W, b, Wx, y = affine()
    s = Session(p)
    np.testing.assert_array_equal(s.run(y, {Wx: np.array([[10.0, 20.0]], np.float32)}),
                                  [[10.5, 19.5]])
    Wx.set_name("Wx")
    np.testing.assert_array_equal(s.run(y, {"Wx": np.array([[1.0, 1.0]], np.float32)}),
                                  [[1.5, 0.5]])
    with pytest.raises(kiln.FeedError, match="fed twice in one run"):
        s.run(y, {"x": np.ones((1, 2), np.float32), x: np.ones((1, 2), np.float32)})


def test_parameters_from_arrays(tmp_path):
    p = Program()
    w = p.parameter("w", init=[[1.0, 2.0]])
    assert w.shape == [1, 2]
    k = p.parameter("k", init=np.array([1, 2**53 + 1], np.int64), trainable=False)
    d = p.parameter("d", init=np.arange(3), dtype="float64")
    s = Session(p)
    assert s.state("w").dtype == np.float32 and s.state("d").dtype == np.float64
    assert s.state("k")[1] == 2**53 + 1
    p.save(tmp_path / "m.kir", [w])
    assert "state @w : f32[1,2] = values([[1.0, 2.0]])" in (tmp_path / "m.kir").read_text()
    assert k.shape == [2] and d.shape == [3]
    with pytest.raises(ValueError, match=r"shape \[2, 2\], but the array's is \[1, 2\]"):
        p.parameter("bad", [2, 2], init=[[1.0, 2.0]])
    with pytest.raises(TypeError, match="give a shape, or an array"):
        p.parameter("none")
