"""Every Python sample of the book (docs/src) and the README runs as written; the Python
guide's and the README's give what their comments say."""

import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOOK = ROOT / "docs" / "src"


def samples():
    """(page, index, code) for each ```python block of the book and the README."""
    found = []
    for page in [*sorted(BOOK.rglob("*.md")), ROOT / "README.md"]:
        for i, code in enumerate(re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)):
            found.append((str(page.relative_to(BOOK if page.is_relative_to(BOOK) else ROOT)), i, code))
    return found


def run(page, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    names = {}
    exec(compile(code, page, "exec"), names)
    return names


def test_the_book_has_python_samples():
    assert any(page == "guides/python.md" for page, _, _ in samples())


@pytest.mark.parametrize("page,index,code", samples(), ids=lambda v: str(v)[:40])
def test_every_sample_runs(page, index, code, tmp_path, monkeypatch):
    run(page, code, tmp_path, monkeypatch)


def test_the_python_guide_gives_what_its_comments_say(tmp_path, monkeypatch, capsys):
    page, _, code = next(s for s in samples() if s[0] == "guides/python.md")
    names = run(page, code, tmp_path, monkeypatch)
    printed = capsys.readouterr().out
    assert printed.split()[0].startswith("1.2")
    # "1.2, and 0.12 everywhere": the value and the gradient the comments promise.
    np.testing.assert_allclose(names["out"].item(), 1.2, rtol=1e-6)
    np.testing.assert_allclose(names["x"].grad.numpy(), np.full([2, 2], 0.12), rtol=1e-5)
    # The custom op is tanh, and the compiled model gives the eager value.
    x = names["x"].numpy()
    np.testing.assert_allclose(names["Tanh"].apply(names["x"]).numpy(), np.tanh(x), rtol=1e-6)
    compiled = names["compiled"]
    np.testing.assert_allclose(compiled(names["x"]).item(), 1.2, rtol=1e-6)
    assert compiled.ir().lstrip().startswith("module")
    # The static program trained: y = 3 is fitted (the last line printed is its loss).
    final = float(printed.split()[-1])
    assert final < 1e-3, printed


def test_the_readme_model_trains_compiles_and_reloads(tmp_path, monkeypatch, capsys):
    _, _, code = next(s for s in samples() if s[0] == "README.md")
    names = run("README.md", code, tmp_path, monkeypatch)   # its own assert: the reload agrees
    printed = capsys.readouterr().out
    assert names["accuracy"] > 0.95, printed                # "about 97 %"
    assert (tmp_path / "net.npz").exists()
    assert sorted(np.load(tmp_path / "net.npz")) == sorted(names["model"].state_dict())


def test_the_static_guide_gives_what_its_comments_say(tmp_path, monkeypatch, capsys):
    """The computational graph from Python: each printed value is the comment's."""
    graph, gan = [code for page, _, code in samples() if page == "guides/static-programs.md"]
    names = run("guides/static-programs.md", graph, tmp_path, monkeypatch)
    s, x, y, Wx = names["s"], names["x"], names["y"], names["Wx"]
    xs = names["xs"]
    np.testing.assert_array_equal(s.state("W"), np.ones((3, 2)))   # after the assign
    np.testing.assert_allclose(s.run(y, {Wx: np.array([[5.0, 6.0]], np.float32)}), [[5.1, 6.1]],
                               rtol=1e-6)
    np.testing.assert_allclose(s.run(names["db"], {x: xs}), [0.5, 0.5])
    np.testing.assert_allclose(s.run(names["d2"], {x: xs}), [2.0, 2.0])
    np.testing.assert_allclose(names["from_Wx"](np.zeros((1, 2), np.float32))[0], [[0.1, 0.1]],
                               rtol=1e-6)
    printed = capsys.readouterr().out
    assert printed.startswith("[[1.1 2.1]]\n[[5.1 6.1]]\n[0.5 0.5]\n[2. 2.]\n"), printed


def test_the_gan_trained_by_sub_graphs_learns_the_real_mean(tmp_path, monkeypatch, capsys):
    _, gan = [code for page, _, code in samples() if page == "guides/static-programs.md"]
    names = run("guides/static-programs.md", gan, tmp_path, monkeypatch)
    assert abs(names["samples"].mean() - 4.0) < 0.5, capsys.readouterr().out
    # Each step trained only its own network's parameters: two optimizers, two sets.
    assert sorted(n.split(".")[0] for n in names["p"].parameter_names()) == ["disc"] * 6 + ["gen"] * 6
