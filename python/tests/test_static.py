"""Static programs from Python: the GAN trained by alternating two Session.run targets,
Keras-style functions, checkpoints and saved programs."""

import numpy as np
import pytest

import kiln
from kiln import static
from kiln.static import layers


def mlp(p, prefix, hidden):
    """A 1 → hidden → hidden → 1 tanh network whose parameters can be applied twice."""
    sizes = [1, hidden, hidden, 1]
    params = []
    for i in range(3):
        w = p.parameter(f"{prefix}.w{i}", [sizes[i], sizes[i + 1]], kiln.init.XavierUniform())
        b = p.parameter(f"{prefix}.b{i}", [sizes[i + 1]], kiln.init.Zeros())
        params.append((w, b))

    def apply(x):
        for i, (w, b) in enumerate(params):
            x = x @ w + b
            if i < 2:
                x = x.tanh()
        return x

    return apply


def test_gan_trains_by_alternating_two_session_targets():
    p = static.Program(seed=0)
    noise = p.placeholder("noise", "float32", [None, 1])
    real = p.placeholder("real", "float32", [None, 1])
    generator, discriminator = mlp(p, "gen", 16), mlp(p, "disc", 16)
    fake = generator(noise)
    d_real, d_fake = discriminator(real).sigmoid(), discriminator(fake).sigmoid()
    eps = 1e-8
    d_loss = -((d_real + eps).log() + (1.0 - d_fake + eps).log()).mean()
    g_loss = -(d_fake + eps).log().mean()
    names = p.parameter_names()
    d_names = [n for n in names if n.startswith("disc.")]
    g_names = [n for n in names if n.startswith("gen.")]
    d_train = kiln.optim.Adam(lr=0.01, betas=(0.5, 0.999)).minimize(p, d_loss, d_names, name="d_adam")
    g_train = kiln.optim.Adam(lr=0.01, betas=(0.5, 0.999)).minimize(p, g_loss, g_names, name="g_adam")
    session = kiln.Session(p)
    rng = np.random.default_rng(0)
    g_before, d_before = session.state("gen.w2").copy(), session.state("disc.w2").copy()
    start = session.run(fake, {"noise": rng.uniform(-8, 8, size=[1000, 1]).astype(np.float32)})
    for _ in range(400):
        z = rng.uniform(-8, 8, size=[64, 1]).astype(np.float32)
        r = rng.normal(4, 0.5, size=[64, 1]).astype(np.float32)
        # The discriminator's step; it does not touch the generator's parameters.
        g_now = session.state("gen.w2")
        session.run([d_train, d_loss], {"real": r, "noise": z})
        assert np.array_equal(session.state("gen.w2"), g_now)
        session.run([g_train], {"noise": rng.uniform(-8, 8, size=[64, 1]).astype(np.float32)})
    assert not np.allclose(session.state("gen.w2"), g_before)
    assert not np.allclose(session.state("disc.w2"), d_before)
    samples = session.run(fake, {"noise": rng.uniform(-8, 8, size=[1000, 1]).astype(np.float32)})
    assert abs(samples.mean() - 4.0) < abs(start.mean() - 4.0) / 2, (start.mean(), samples.mean())
    assert abs(samples.mean() - 4.0) < 0.5, samples.mean()


def test_placeholders_sessions_functions_and_errors_by_name():
    p = static.Program(seed=3)
    x = p.placeholder("x", "float32", [None, 3])
    y = p.placeholder("y", "float32", [None, 1])
    pred = layers.dense(p, x, 1, name="fc")
    loss = layers.mse(p, pred, y).set_name("loss")
    train = kiln.optim.SGD(lr=0.1).minimize(p, loss)
    session = kiln.Session(p)
    xs = np.random.default_rng(1).normal(size=[16, 3]).astype(np.float32)
    ys = xs @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    first = session.run("loss", {"x": xs, "y": ys})
    step = kiln.function([x, y], [loss], [train], session=session)
    for _ in range(400):
        step(xs, ys)
    last = session.run(loss, {"x": xs, "y": ys})
    # Without a session, functions of one program share its default session.
    fit = kiln.function([x, y], [loss], [train])
    evaluate = kiln.function([x, y], [loss])
    before = evaluate(xs, ys)[0]
    for _ in range(50):
        fit(xs, ys)
    assert evaluate(xs, ys)[0] < before
    assert last < 0.01 * first
    np.testing.assert_allclose(session.state("fc.w").ravel(), [1.0, -2.0, 0.5], atol=0.05)
    with pytest.raises(kiln.FeedError, match="missing feed for placeholder `y`"):
        session.run(loss, {"x": xs})


def test_checkpoints_and_saved_programs(tmp_path):
    p = static.Program(seed=5)
    x = p.placeholder("x", "float32", [None, 4])
    out = layers.dense(p, x, 2, "tanh", name="fc")
    session = kiln.Session(p)
    xs = np.ones([3, 4], np.float32)
    before = session.run(out, {"x": xs})
    session.save(tmp_path / "params.safetensors")
    p.save(tmp_path / "model.kir", [out])
    # Another session starts from other values (another seed), then loads the checkpoint.
    other = static.Program(seed=9)
    x2 = other.placeholder("x", "float32", [None, 4])
    out2 = layers.dense(other, x2, 2, "tanh", name="fc")
    restored = kiln.Session(other)
    assert not np.allclose(restored.run(out2, {"x": xs}), before)
    restored.load(tmp_path / "params.safetensors")
    np.testing.assert_allclose(restored.run(out2, {"x": xs}), before)
    predict = kiln.load_predictor(tmp_path / "model.kir", tmp_path / "params.safetensors")
    np.testing.assert_allclose(predict(xs)[0], before)
    # A checkpoint that does not fit is refused, and the session keeps its values.
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(kiln.CheckpointError):
        restored.load(tmp_path / "bad.safetensors")
    np.testing.assert_allclose(restored.run(out2, {"x": xs}), before)


# The refused cross-thread call leaves a reference in the exception's traceback, released
# later on another thread; pyo3 then leaks the tensor with an "unraisable" warning.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_sessions_and_plain_tensors_run_in_python_threads():
    import threading

    results, errors = {}, []

    def work(i):
        try:
            p = static.Program(seed=i)
            x = p.placeholder("x", "float32", [None, 8])
            out = layers.dense(p, x, 4, "relu", name="fc").sum()
            session = kiln.Session(p)
            results[i] = [session.run(out, {"x": np.ones([64, 8], np.float32)}) for _ in range(20)]
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and sorted(results) == [0, 1, 2]
    # A session can move between threads (one run at a time); so can a plain eager tensor
    # (test_threads.py: what records gradients stays with its thread).
    p = static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 2])
    out = (x * 2.0).sum()
    session = kiln.Session(p)
    moved = []
    thread = threading.Thread(target=lambda: moved.append(session.run(out, {"x": np.ones([3, 2], np.float32)})))
    thread.start()
    thread.join()
    assert moved == [12.0]
    t = kiln.tensor(np.ones([2], np.float32))
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_try(lambda: t.numpy())))
    thread.start()
    thread.join()
    np.testing.assert_array_equal(seen[0], [1.0, 1.0])


def _try(f):
    try:
        return f()
    except BaseException as e:  # noqa: BLE001 - the test inspects it
        return e
