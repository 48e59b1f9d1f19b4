"""kiln.data and kiln.Trainer: datasets and their bad files, seeded loaders, transforms,
shards; the trainer over eager and static models, its callbacks, errors, checkpoints, resume
and plots."""

import gzip
import struct

import numpy as np
import pytest

import kiln
from kiln import data, nn


def idx(dims, values):
    return struct.pack(">BBBB", 0, 0, 8, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + bytes(values)


def mnist_folder(tmp_path, n=12):
    pixels = [i % 256 for i in range(n * 16)]
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx([n, 4, 4], pixels)))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(idx([n], [i % 10 for i in range(n)]))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(idx([2, 4, 4], pixels[:32]))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx([2], [3, 4]))
    return tmp_path


def test_datasets_from_arrays_files_and_folders(tmp_path):
    d = data.Dataset(np.arange(12, dtype=np.float32).reshape(6, 2), np.array([0, 1, 2, 0, 1, 2]))
    assert len(d) == 6 and d.classes == 3 and d.sample_shape == [2]
    x, label = d[-1]
    assert x.tolist() == [10.0, 11.0] and label == 2
    with pytest.raises(IndexError):
        d[6]
    with pytest.raises(kiln.KilnError, match="label 7 of example 1 is outside the 3 classes"):
        data.Dataset(np.zeros((2, 2)), np.array([0, 7]), classes=3)
    np.save(tmp_path / "x.npy", np.ones((4, 3), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.array([0, 1, 1, 0]))
    assert len(data.Dataset.from_npy(tmp_path / "x.npy", tmp_path / "y.npy")) == 4
    (tmp_path / "t.csv").write_text("a,b,label\n1,2,0\n3,4,1\n")
    assert data.Dataset.from_csv(tmp_path / "t.csv").labels.tolist() == [0, 1]

    (tmp_path / "m").mkdir()
    train, test, classes = data.mnist(mnist_folder(tmp_path / "m"))
    assert (len(train), len(test), train.sample_shape) == (12, 2, [1, 4, 4])
    assert classes == [str(c) for c in range(10)]
    digits = data.digits()
    assert len(digits) == 1797 and digits.reshape([1, 8, 8]).sample_shape == [1, 8, 8]


def test_bad_folders_are_errors_naming_the_file(tmp_path):
    folder = mnist_folder(tmp_path)
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx([2], [3, 11]))
    with pytest.raises(kiln.KilnError, match="t10k-labels-idx1-ubyte: label 11 of example 1"):
        data.mnist(folder)
    (folder / "t10k-labels-idx1-ubyte").write_bytes(idx([3], [3, 1, 2]))
    with pytest.raises(kiln.KilnError, match="holds labels of shape \\[3\\], but"):
        data.images(folder)
    raw = (folder / "train-images-idx3-ubyte.gz").read_bytes()
    (folder / "train-images-idx3-ubyte.gz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(kiln.KilnError, match="train-images-idx3-ubyte.gz: corrupt or truncated gzip"):
        data.mnist(folder)
    with pytest.raises(kiln.KilnError, match="not a folder"):
        data.images(tmp_path / "nowhere")


def labels(loader):
    return [y.tolist() for _, y in loader]


def test_loaders_are_seeded_transform_and_shard():
    d = data.Dataset(np.arange(10, dtype=np.float32).reshape(10, 1), np.arange(10))
    loader = data.DataLoader(d, batch_size=4, shuffle=True, seed=3)
    assert len(loader) == 3
    first, second = labels(loader), labels(loader)  # each pass is the next epoch
    assert sorted(sum(first, [])) == list(range(10)) and first != second
    loader.set_epoch(0)
    assert labels(loader) == first
    assert labels(data.DataLoader(d, 4, shuffle=True, seed=3, prefetch=0)) == first
    assert [len(b) for b in labels(data.DataLoader(d, 4, drop_last=True))] == [4, 4]
    halves = [labels(data.DataLoader(d, 4, shuffle=True, seed=3, rank=r, world_size=2)) for r in (0, 1)]
    assert [a + b for a, b in zip(*halves)] == first[:2]
    with pytest.raises(kiln.KilnError, match="does not split evenly over 3 ranks"):
        data.DataLoader(d, 4, world_size=3)

    images = data.Dataset(np.arange(12, dtype=np.float32).reshape(2, 1, 2, 3), np.array([0, 1]))
    flip = data.DataLoader(images, 2, transforms=[data.RandomHorizontalFlip(p=1.0), data.Normalize(1.0, 2.0)])
    x, _ = next(iter(flip))
    assert x[0, 0, 0].tolist() == [0.5, 0.0, -0.5]
    with pytest.raises(kiln.KilnError, match="RandomCrop needs image examples"):
        next(iter(data.DataLoader(d, 2, transforms=[data.RandomCrop(2)])))


def mlp():
    kiln.reset()
    kiln.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return model, kiln.optim.Adam(model.parameters(), lr=0.01)


def digit_loaders():
    train, test = data.digits().split(0.2, seed=0)
    return data.DataLoader(train, 32, shuffle=True, seed=1), data.DataLoader(test, 200)


def test_an_eager_model_trains_evaluates_and_plots(tmp_path):
    train, test = digit_loaders()
    model, opt = mlp()
    events = []
    trainer = kiln.Trainer(model, opt, validation=test, progress=False).on(
        lambda e: events.append(e["kind"])
    )
    history = trainer.fit(train, 3)
    assert len(history["epochs"]) == 3 and history["stopped"] is None
    assert history["epochs"][2]["validation"]["accuracy"] > 0.85
    assert len(history["step_losses"]) == 3 * len(train)
    assert events[:3] == ["epoch_begin", "step_begin", "step_end"] and events[-1] == "epoch_end"
    metrics, confusion = trainer.evaluate(test)
    assert sum(map(sum, confusion)) == metrics["examples"] == len(test.dataset)
    assert metrics["top_k"] >= metrics["accuracy"]
    trainer.plot_history(tmp_path / "curves.svg")
    kiln.Trainer.plot_confusion(tmp_path / "confusion.svg", confusion, range(10))
    assert (tmp_path / "curves.svg").read_text().startswith("<svg")
    assert "<rect" in (tmp_path / "confusion.svg").read_text()


def test_an_interrupted_run_resumes_to_the_same_result(tmp_path):
    train, test = digit_loaders()
    model, opt = mlp()
    straight = kiln.Trainer(model, opt, validation=test, progress=False).fit(train, 2)
    expected = [p.numpy().copy() for p in model.parameters()]

    model, opt = mlp()
    path = tmp_path / "ckpt.safetensors"
    stopping = kiln.Trainer(model, opt, validation=test, progress=False, checkpoint=path,
                            checkpoint_every=5)
    stopping.on(lambda e: e["kind"] == "step_end" and e["epoch"] == 1 and e["step"] == 12)
    assert stopping.fit(train, 2)["stopped"]

    model, opt = mlp()
    resumed = kiln.Trainer(model, opt, validation=test, progress=False)
    assert resumed.resume(path) and resumed.epoch == 1
    history = resumed.fit(train, 2)
    assert history["step_losses"] == straight["step_losses"]
    assert history["epochs"] == [dict(e, seconds=h["seconds"]) for e, h in zip(straight["epochs"], history["epochs"])]
    for p, want in zip(model.parameters(), expected):
        assert np.array_equal(p.numpy(), want)


def test_a_static_program_trains_with_the_same_trainer(tmp_path):
    p = kiln.static.Program(seed=0)
    x = p.placeholder("x", "float32", [None, 64])
    y = p.placeholder("y", "int64", [None])
    h = kiln.static.layers.dense(p, x, 32, "relu")
    logits = kiln.static.layers.dense(p, h, 10)
    loss = kiln.static.layers.softmax_cross_entropy(p, logits, y)
    target = kiln.optim.Adam(lr=0.01).minimize(p, loss)
    session = kiln.Session(p)
    train, test = digit_loaders()
    path = tmp_path / "static.safetensors"
    trainer = kiln.Trainer.static(session, x, y, logits, loss, target, validation=test,
                                  progress=False, checkpoint=path)
    history = trainer.fit(train, 3)
    assert history["epochs"][-1]["validation"]["accuracy"] > 0.85
    again = kiln.Trainer.static(kiln.Session(p), x, y, logits, loss, target, progress=False)
    assert again.resume(path) and again.epoch == 3


def test_errors_in_python_code_reach_the_caller_unchanged():
    train, _ = digit_loaders()
    model, opt = mlp()

    def broken(event):
        if event["kind"] == "step_end":
            raise ValueError("from the callback")

    with pytest.raises(ValueError, match="from the callback"):
        kiln.Trainer(model, opt, progress=False).on(broken).fit(train, 1)

    def bad_loss(logits, labels):
        raise ZeroDivisionError("in the loss")

    with pytest.raises(ZeroDivisionError, match="in the loss"):
        kiln.Trainer(model, opt, loss=bad_loss, progress=False).fit(train, 1)
    with pytest.raises(TypeError, match="no option epochs"):
        kiln.Trainer(model, opt, epochs=3)


def test_the_example_trains_and_resumes(tmp_path):
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).parents[1] / "examples" / "fashion_mnist.py"
    run = lambda epochs: subprocess.run(  # noqa: E731
        [sys.executable, str(example), "--epochs", str(epochs), "--out", str(tmp_path)],
        capture_output=True, text=True, check=True).stdout
    first = run(1)
    assert "epoch 1: training loss" in first and "test accuracy" in first
    assert (tmp_path / "curves.svg").exists() and (tmp_path / "confusion.svg").exists()
    second = run(2)
    assert "epoch 1:" not in second and "epoch 2: training loss" in second
