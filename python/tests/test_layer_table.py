"""The package's layer kinds against the native layer table (`runtime/src/layer_kind.rs`):
every kind Python names exists in the form it is called in, and every form the table lists
is reachable from Python, so a layer added on one side only fails here."""

import ast
import inspect
from pathlib import Path

import pytest

import kiln
from kiln import _kiln, nn

PACKAGE = Path(kiln.__file__).parent
TABLE = {name: set(forms) for name, forms in _kiln.layer_kinds()}


def calls_naming_a_kind(path, callee):
    """The first string argument of every call to `callee` (a name or an attribute) in `path`."""
    kinds = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name != callee:
            continue
        args = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if args:
            kinds.add(args[0].value)
    return kinds


def python_kinds(form):
    if form == "eager":
        return {
            cls.kind
            for _, cls in inspect.getmembers(nn, inspect.isclass)
            if issubclass(cls, nn.Layer) and getattr(cls, "kind", None) is not None
        }
    if form == "static":
        return calls_naming_a_kind(PACKAGE / "layers.py", "_layer")
    return calls_naming_a_kind(PACKAGE / "nn" / "functional.py", "functional")


def test_the_table_is_not_empty_and_its_forms_are_the_three():
    assert len(TABLE) >= 10
    assert set().union(*TABLE.values()) == {"eager", "static", "functional"}


@pytest.mark.parametrize("form", ["eager", "static", "functional"])
def test_python_calls_each_form_of_exactly_the_kinds_the_table_gives_it(form):
    python = python_kinds(form)
    native = {name for name, forms in TABLE.items() if form in forms}
    assert python, f"no {form} layer found in the package: the scan is broken"
    assert python - native == set(), f"Python calls {form} kinds the table lacks"
    assert native - python == set(), f"the table's {form} kinds Python never calls"


def test_a_kind_in_a_form_it_lacks_is_a_clear_error():
    with pytest.raises(TypeError, match="`batch_norm` has no functional form"):
        _kiln.functional("batch_norm", [kiln.tensor([1.0])])
    with pytest.raises(TypeError, match="Kiln has no eager layer `conv3d`"):
        _kiln.NativeLayer("conv3d", "c")
