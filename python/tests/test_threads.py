"""Eager state belongs to the thread that made it. Touched from another thread, each of these
raised pyo3's PanicException (which `except Exception` does not catch); now a KilnError names
what belongs elsewhere, and a plain tensor (no gradient) works in any thread."""

import threading

import numpy as np
import pytest

import kiln


def in_thread(f):
    """Runs ``f`` in a new thread; returns what it returned or raises what it raised."""
    box = {}

    def run():
        try:
            box["value"] = f()
        except BaseException as e:  # noqa: BLE001 - the test inspects whatever came out
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def model():
    kiln.manual_seed(0)
    return kiln.nn.Linear(2, 1)


@pytest.mark.parametrize(
    "misuse",
    [
        lambda m, x, w: (w * 2).numpy(),
        lambda m, x, w: w.backward(),
        lambda m, x, w: m(x),
        lambda m, x, w: m.weight.set_value(np.zeros([1, 2], np.float32)),
        lambda m, x, w: m.weight.grad,
        lambda m, x, w: kiln.optim.SGD(m.parameters(), lr=0.1),
        lambda m, x, w: m.state_dict(),
    ],
    ids=["recorded-op", "backward", "forward", "set_value", "grad", "optimizer", "state_dict"],
)
def test_eager_state_of_another_thread_is_a_kiln_error(misuse):
    m = model()
    x = kiln.tensor(np.ones([3, 2], np.float32))
    w = m(x).sum()
    with pytest.raises(kiln.KilnError, match="belongs to another thread"):
        in_thread(lambda: misuse(m, x, w))


def test_a_compiled_function_and_an_optimizer_stay_in_their_thread():
    m = model()
    x = kiln.tensor(np.ones([3, 2], np.float32))
    compiled = kiln.to_static(m)
    compiled(x)
    opt = kiln.optim.SGD(m.parameters(), lr=0.1)
    m(x).sum().backward()
    with pytest.raises(kiln.KilnError, match="another thread"):
        in_thread(lambda: compiled(x))
    with pytest.raises(kiln.KilnError, match="another thread"):
        in_thread(opt.step)


def test_plain_tensors_and_batches_work_in_any_thread():
    x = kiln.tensor(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(in_thread(lambda: (x * 2 + 1).numpy()), [1, 3, 5, 7])
    w = model().weight
    detached = w.tensor().detach()
    assert in_thread(lambda: detached.numpy().shape) == tuple(w.shape)
    loader = kiln.data.DataLoader(kiln.data.digits(), batch_size=100)
    batches = iter(loader)
    assert in_thread(lambda: next(batches)[0].shape[0]) == 100


def test_a_trainer_stays_in_its_thread():
    m = model()
    trainer = kiln.Trainer(m, kiln.optim.SGD(m.parameters(), lr=0.1), progress=False)
    with pytest.raises(kiln.KilnError, match="belongs to the thread that made it"):
        in_thread(lambda: trainer.history)
    assert trainer.history["epochs"] == []


def test_runs_of_one_session_from_several_threads_take_turns():
    p = kiln.static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 64])
    out = kiln.static.layers.dense(p, x, 64, name="fc").sum()
    session = kiln.Session(p)
    feed = {x: np.ones([256, 64], np.float32)}
    want = session.run(out, feed)
    results, errors = [], []

    def work():
        try:
            results.extend(session.run(out, feed) for _ in range(20))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 80 and all(r == want for r in results)


def test_a_function_waits_for_a_run_of_its_session_in_another_thread():
    # Before: the function found the session borrowed by the other thread's run (whose GIL is
    # released while it computes) and raised RuntimeError "Already borrowed".
    p = kiln.static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 256])
    out = kiln.static.layers.dense(p, x, 256, name="fc").sum()
    session = kiln.Session(p)
    f = kiln.function([x], [out], session=session)
    data = np.ones([512, 256], np.float32)
    want = session.run(out, {x: data})
    results, errors = [], []

    def runs():
        try:
            results.extend(session.run(out, {x: data}) for _ in range(30))
        except BaseException as e:  # noqa: BLE001 - reported below (a panic too)
            errors.append(e)

    def calls():
        try:
            results.extend(f(data)[0] for _ in range(30))
        except BaseException as e:  # noqa: BLE001 - reported below (a panic too)
            errors.append(e)

    threads = [threading.Thread(target=runs), threading.Thread(target=calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 60 and all(r == want for r in results)
