"""Every public function, class and method of the package has a docstring (its arguments and
errors are said there): `help(kiln.X)` is the API reference."""

import inspect

import kiln


def public_objects():
    """(qualified name, object) for every public callable reachable from ``kiln``: module
    functions, classes and their methods and properties, each once."""
    seen, found = set(), []

    def add(name, obj):
        if id(obj) not in seen:
            seen.add(id(obj))
            found.append((name, obj))

    def walk(module, prefix, depth):
        for name in dir(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name)
            if inspect.ismodule(value):
                if value.__name__.startswith("kiln") and depth < 2:
                    walk(value, f"{prefix}{name}.", depth + 1)
            elif inspect.isclass(value):
                add(prefix + name, value)
                for attr, member in vars(value).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if callable(member) or isinstance(member, property) or inspect.isgetsetdescriptor(member):
                        add(f"{prefix}{name}.{attr}", member)
            elif callable(value):
                add(prefix + name, value)

    walk(kiln, "kiln.", 0)
    return found


def test_every_public_object_has_a_docstring():
    objects = public_objects()
    assert len(objects) > 100, "the walk reached the package"
    missing = [name for name, obj in objects if not (getattr(obj, "__doc__", None) or "").strip()]
    assert not missing, f"no docstring: {missing}"
