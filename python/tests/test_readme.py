"""The README's Python example runs as written, and gives what its comments say."""

import pathlib
import re

import numpy as np


def test_the_readme_example_runs(capsys):
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Python\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    names = {}
    exec(compile(code, "README.md", "exec"), names)
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
    # The static program trained: y = 3 is fitted.
    feeds = {"x": np.ones([8, 2], np.float32), "y": np.full([8, 1], 3.0, np.float32)}
    final = np.asarray(names["session"].run(names["loss"], feeds))
    assert final.max() < 1e-3, final
