"""Static programs from Python with the layers the Rust API has, feeds keyed by Var,
``with Session``, ``minimize(loss)`` finding the program, a second optimizer named on its own,
and Keras-style ``(var, new_value)`` updates."""

import numpy as np
import pytest

import kiln
from kiln import static
from kiln.static import layers


def images(n=4, seed=0):
    return np.random.default_rng(seed).normal(size=[n, 1, 8, 8]).astype(np.float32)


def test_a_cnn_with_batch_norm_trains_in_a_session_fed_by_var():
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 1, 8, 8])
    y = p.placeholder("y", "int64", [None])
    h = layers.conv2d(p, x, 4, 3, padding=1, activation="relu", name="conv")
    bn = layers.batch_norm(p, 4, momentum=0.5, name="bn")
    train_h, stats = bn.train(h)
    logits = layers.dense(p, layers.flatten(p, layers.max_pool2d(p, train_h, 2)), 3, name="fc")
    loss = layers.softmax_cross_entropy(p, logits, y)
    eval_logits = layers.dense(p, layers.flatten(p, layers.max_pool2d(p, bn.eval(h), 2)), 3,
                               name="fc_eval")
    step = kiln.optim.Adam(lr=0.01).minimize(loss)          # the program found from the loss
    assert "conv.w" in p.parameter_names() and "bn.gamma" in p.parameter_names()
    xs, ys = images(), np.array([0, 1, 2, 0])
    with kiln.Session(p) as s:
        first = s.run(loss, {x: xs, y: ys})                  # feeds keyed by Var
        for _ in range(30):
            s.run([step, stats], {"x": xs, y: ys})
        assert s.run(loss, {x: xs, y: ys}) < first / 2
        assert not np.allclose(s.state("bn.running_mean"), 0)   # the update target ran
        assert s.run(eval_logits, {x: xs}).shape == (4, 3)
    with pytest.raises(kiln.KilnError, match="closed"):
        s.run(loss, {x: xs, y: ys})


def test_recurrent_attention_embedding_and_norm_layers_build_and_run():
    p = static.Program(seed=1)
    tokens = p.placeholder("tokens", "int64", [None, 5])
    e = layers.embedding(p, tokens, 10, 6, name="emb")
    seq, last = layers.lstm(p, e, 4, name="lstm")
    gseq, glast = layers.gru(p, e, 3)
    a = layers.self_attention(p, e, 8)
    n = layers.layer_norm(p, a)
    pooled = layers.global_avg_pool(p, layers.avg_pool2d(p, p.placeholder("img", "float32", [None, 2, 4, 4]), 2))
    s = kiln.Session(p)
    ids = np.arange(10).reshape(2, 5) % 10
    out = s.run([seq, last, gseq, glast, n], {tokens: ids})
    assert [o.shape for o in out] == [(2, 5, 4), (2, 4), (2, 5, 3), (2, 3), (2, 5, 6)]
    np.testing.assert_allclose(out[0][:, -1], out[1])        # the last step is the last state
    np.testing.assert_allclose(out[4].mean(-1), 0, atol=1e-5)
    img = np.ones([2, 2, 4, 4], np.float32)
    np.testing.assert_allclose(s.run(pooled, {"img": img}), np.ones([2, 2]))
    assert p.parameter_names() == [
        "emb.w", "lstm.w_ih", "lstm.w_hh", "lstm.b", "gru0.w_ih", "gru0.w_hh", "gru0.b_ih",
        "gru0.b_hh", "self_attention0.wq", "self_attention0.wk", "self_attention0.wv",
        "self_attention0.wo", "layer_norm0.gamma", "layer_norm0.beta",
    ]


def test_a_second_optimizer_is_named_on_its_own_or_refused_by_name():
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 2])
    g = layers.dense(p, x, 2, name="g")
    d = layers.dense(p, g, 1, name="d")
    loss = layers.mean(p, d * d)
    first = kiln.optim.SGD(lr=0.1, momentum=0.9).minimize(loss, parameters=["d.w", "d.b"])
    second = kiln.optim.SGD(lr=0.1, momentum=0.9).minimize(loss, parameters=["g.w", "g.b"])
    assert (first.name, second.name) == ("sgd.minimize", "sgd_1.minimize")
    with pytest.raises(kiln.KilnError, match="already updates this program.*name="):
        kiln.optim.SGD(lr=0.1).minimize(loss, name="sgd")
    s = kiln.Session(p)
    s.run([first, second], {x: np.ones([3, 2], np.float32)})


def test_keras_style_updates_store_new_values():
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 2])
    w = p.parameter("w", [2], init=1.0)
    out = (x * w).sum()
    step = static.function([x], [out], updates=[(w, w * 2.0)])
    assert step(np.ones([1, 2], np.float32))[0] == 2.0   # outputs read before the update
    assert step(np.ones([1, 2], np.float32))[0] == 4.0
    with pytest.raises(kiln.KilnError, match="parameter or other state"):
        static.function([x], [out], updates=[(out, out)])


@pytest.mark.parametrize(
    "misuse, error",
    [
        (lambda p, x: layers.conv2d(np.ones(3), x, 2, 3), TypeError),
        (lambda p, x: kiln.optim.SGD(lr=0.1).minimize(np.ones(3)), TypeError),
        (lambda p, x: kiln.Session(p).run(x, {x * 2.0: np.ones([1, 2], np.float32)}), kiln.KilnError),
        (lambda p, x: kiln.Session(p).run(x, {3: np.ones([1, 2], np.float32)}), TypeError),
        (lambda p, x: layers.batch_norm(p, 2, momentum=2.0), ValueError),
        (lambda p, x: layers.lstm(p, x, 3), kiln.ShapeError),
    ],
    ids=["layer-without-program", "minimize-array", "feed-not-placeholder", "feed-key-int",
         "momentum", "lstm-rank"],
)
def test_misuse_is_named(misuse, error):
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 2])
    with pytest.raises(error):
        misuse(p, x)
