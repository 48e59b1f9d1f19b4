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
