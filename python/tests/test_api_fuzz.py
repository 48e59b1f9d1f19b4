"""The API under random use: thousands of calls of random methods and functions with random
arguments (tensors of every dtype and rank, layers, programs, sessions, numbers out of range,
wrong types, None). Each call returns or raises an ordinary exception — a ``KilnError`` for
what Kiln refuses, or Python's own ``TypeError``/``ValueError``/``IndexError``/
``OverflowError`` for an argument of the wrong kind, as numpy and PyTorch raise them. Never a
``PanicException`` (pyo3's, which ``except Exception`` does not catch), never an abort, and
never a Rust source path in a message."""

import inspect
import math
import pathlib
import random
import re

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.nn import functional as F
from kiln.static import layers

# What a caller may see. Anything else — above all pyo3's PanicException, a BaseException —
# fails the test with the call that raised it.
ALLOWED = (kiln.KilnError, TypeError, ValueError, IndexError, OverflowError)

# A Rust source line in a message says nothing to a Python user (`src/eager.rs:122:41`).
RUST_PATH = re.compile(r"[\w/]+\.rs:\d+")

# Calls that run for long on valid arguments (whole epochs), not misuse.
SLOW = {"fit"}

# Seed ONNX models (node tests of the pinned onnx wheel): `kiln.onnx.load` is called on them,
# on mutants of them, and on files that are no model at all.
ONNX_SEEDS = sorted((pathlib.Path(__file__).parents[2] / "tests/onnx/fuzz_seeds").glob("*.onnx"))


def onnx_files(rng, folder):
    """Paths of models in `folder`: seeds as they are, bit-flipped, cut short, and a text file.
    Copies, never the repository's files: a random call may save over any path it is given."""
    paths = []
    for seed in ONNX_SEEDS:
        (folder / seed.name).write_bytes(seed.read_bytes())
        paths.append(str(folder / seed.name))
    for k in range(4):
        data = bytearray(rng.choice(ONNX_SEEDS).read_bytes())
        if k % 2 == 0:
            for _ in range(1 + rng.randrange(4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        else:
            data = data[: rng.randrange(len(data))]
        path = folder / f"mutant{k}.onnx"
        path.write_bytes(bytes(data))
        paths.append(str(path))
    (folder / "text.onnx").write_text("not a model")
    return paths + [str(folder / "text.onnx"), str(folder / "missing.onnx")]


def numbers():
    return [0, 1, 2, -1, 3, 2.5, -0.0, 1e30, math.nan, math.inf, 2**40, -(2**40), True]


def arrays():
    return [
        np.zeros([], np.float32),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.ones([2, 3, 4, 4], np.float32),
        np.arange(3, dtype=np.int64),
        np.array([True, False]),
        np.ones([0, 3], np.float32),
        np.full([2, 2], np.nan, np.float64),
    ]


def kiln_objects(seed):
    """A fresh pool of Kiln objects of every kind."""
    kiln.reset()
    kiln.manual_seed(seed)
    linear = nn.Linear(3, 2)
    objects = [kiln.tensor(a) for a in arrays()]
    objects += [
        kiln.tensor(np.ones([2, 3], np.float32), requires_grad=True),
        linear,
        linear.weight,
        nn.Conv2d(3, 2, 3),
        nn.MaxPool2d(2),
        nn.BatchNorm(3),
        nn.LayerNorm(3),
        nn.LSTM(3, 2),
        nn.Embedding(5, 2),
        nn.Sequential(nn.Linear(3, 3), nn.ReLU()),
        nn.CrossEntropyLoss(),
        kiln.optim.SGD(linear.parameters(), lr=0.1, momentum=0.9),
        kiln.optim.Adam(linear.parameters(), lr=0.01),
        kiln.no_grad(),
    ]
    program = kiln.static.Program(seed=seed)
    x = program.placeholder("x", "float32", [None, 3])
    out = layers.dense(program, x, 2, name="fc")
    objects += [program, x, out, kiln.Session(program), layers.mean(program, out)]
    objects += [kiln.data.Dataset(np.ones([4, 3], np.float32), np.arange(4) % 2)]
    return objects


def functions():
    return [
        kiln.tensor, kiln.cat, kiln.stack, kiln.cond, kiln.Session, kiln.to_static,
        nn.Linear, nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, nn.BatchNorm, nn.LayerNorm, nn.LSTM,
        nn.GRU, nn.Embedding, nn.Dropout, nn.SelfAttention,
        F.relu, F.softmax, F.log_softmax, F.cross_entropy, F.mse_loss, F.linear, F.conv2d,
        F.max_pool2d, F.avg_pool2d, F.layer_norm, F.dropout, F.embedding, F.flatten,
        layers.dense, layers.mse, layers.softmax_cross_entropy, layers.accuracy,
        kiln.data.Dataset, kiln.data.DataLoader, kiln.onnx.load,
    ]


DUNDERS = ["__add__", "__mul__", "__matmul__", "__getitem__", "__call__", "__bool__", "__len__",
           "__eq__", "__lt__", "__pow__", "__truediv__", "__float__", "__int__", "__iter__",
           "__enter__", "__exit__", "__neg__"]


def methods(obj):
    names = [n for n in dir(obj) if not n.startswith("_") and n not in SLOW]
    names += [d for d in DUNDERS if hasattr(obj, d)]
    return [n for n in names if callable(getattr(type(obj), n, None) or getattr(obj, n, None))]


def argument(rng, pool, models):
    kind = rng.randrange(7)
    if kind == 6:
        return rng.choice(models)
    if kind == 0:
        return rng.choice(numbers())
    if kind == 1:
        return rng.choice(arrays())
    if kind == 2:
        return rng.choice([None, "", "float32", "x", "relu", [], [1, 2], [-1, 3], (0, slice(1, 3)),
                           slice(None, None, -1), Ellipsis, {"x": np.ones([2, 3], np.float32)}])
    return rng.choice(pool)


def arity(rng, f):
    """How many arguments to pass: mostly what ``f``'s signature takes (so that calls get
    past the argument count to Kiln's own checks), sometimes any number."""
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return rng.randrange(4)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    if rng.random() < 0.1 or any(p.kind == p.VAR_POSITIONAL for p in params):
        return rng.randrange(4)
    return rng.randint(required, len(positional))


@pytest.fixture(autouse=True)
def fresh_context():
    """Random calls leave anything behind (a `no_grad` entered and never left): the next
    test starts from a reset thread."""
    yield
    kiln.reset()


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_raise_only_ordinary_exceptions(seed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a method that saves writes here
    rng = random.Random(seed)
    models = onnx_files(rng, tmp_path)
    pool = kiln_objects(seed) + loaded_models(models)
    raised, returned = {}, 0
    for call in range(2500):
        if call % 300 == 299:
            pool = kiln_objects(seed + call) + loaded_models(models)
        if rng.random() < 0.2:
            target, name = None, None
            f = rng.choice(functions())
        else:
            target = rng.choice(pool)
            candidates = methods(target)
            if not candidates:
                continue
            name = rng.choice(candidates)
            f = getattr(target, name)
        args = [argument(rng, pool, models) for _ in range(arity(rng, f))]
        what = f"{type(target).__name__}.{name}" if name else getattr(f, "__name__", f)
        try:
            result = f(*args)
            if name == "__iter__":
                next(result, None)
        except ALLOWED as e:
            raised[type(e).__name__] = raised.get(type(e).__name__, 0) + 1
            assert not RUST_PATH.search(str(e)), f"call {call}: {what}: {e}"
            continue
        except BaseException as e:  # noqa: BLE001 - reported with the call
            pytest.fail(f"call {call}: {what}{tuple(map(short, args))} raised "
                        f"{type(e).__module__}.{type(e).__name__}: {e}")
        returned += 1
        if isinstance(result, (kiln.Tensor, nn.Layer, kiln.static.Var)) and len(pool) < 60:
            pool.append(result)
    # The calls reached Kiln: some returned, and Kiln itself refused others.
    assert returned > 100 and raised.get("KilnError", 0) + raised.get("ShapeError", 0) > 50, (
        returned, raised)


def loaded_models(paths):
    """The models of `paths` that load, into the pool (their methods get called too)."""
    loaded = []
    for path in paths:
        try:
            loaded.append(kiln.onnx.load(path))
        except ALLOWED:
            pass
    return loaded


def short(a):
    if isinstance(a, np.ndarray):
        return f"array{a.shape}:{a.dtype}"
    text = repr(a)
    return text if len(text) < 40 else text[:37] + "..."
