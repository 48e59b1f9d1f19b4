"""Initializers for parameters: ``kiln.init.Constant(0.1)``, ``Normal(0, 0.02)``, …"""


class Initializer:
    """How a parameter's first value is drawn (seeded by ``kiln.manual_seed`` and its name)."""

    def __init__(self, *spec):
        self._spec = spec

    def spec(self):
        return list(self._spec) if len(self._spec) > 1 else self._spec[0]

    def __repr__(self):
        return f"kiln.init.{type(self).__name__}{self._spec[1:]}"


class Constant(Initializer):
    def __init__(self, value):
        super().__init__("constant", float(value))


class Zeros(Initializer):
    def __init__(self):
        super().__init__("zeros")


class Ones(Initializer):
    def __init__(self):
        super().__init__("ones")


class Uniform(Initializer):
    def __init__(self, low=-1.0, high=1.0):
        super().__init__("uniform", float(low), float(high))


class Normal(Initializer):
    def __init__(self, mean=0.0, std=1.0):
        super().__init__("normal", float(mean), float(std))


class XavierUniform(Initializer):
    def __init__(self):
        super().__init__("xavier_uniform")


class XavierNormal(Initializer):
    def __init__(self):
        super().__init__("xavier_normal")


class KaimingUniform(Initializer):
    def __init__(self):
        super().__init__("kaiming_uniform")


class KaimingNormal(Initializer):
    def __init__(self):
        super().__init__("kaiming_normal")


def _spec(init):
    """An initializer's description for the native module (a name or a list)."""
    if init is None:
        return "zeros"
    if isinstance(init, Initializer):
        return init.spec()
    if isinstance(init, (int, float)):
        return ["constant", float(init)]
    raise TypeError(f"an initializer is a kiln.init.Initializer or a number, not {init!r}")
