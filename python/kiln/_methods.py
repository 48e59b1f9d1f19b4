"""Methods made from the op table, for eager tensors and static values alike."""


def unary_method(name):
    """The method for the op table's elementwise op ``name``, documented."""

    def method(self):
        return self._unary(name)

    method.__name__ = name
    method.__doc__ = (
        f"``{name}`` of every element (the op table's elementwise op), a new value. "
        "Raises ``kiln.ShapeError`` for a dtype the op does not take."
    )
    return method
