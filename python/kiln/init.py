"""Initializers for parameters: ``kiln.init.Constant(0.1)``, ``Normal(0, 0.02)``, …"""


class Initializer:
    """How a parameter's first value is drawn (seeded by ``kiln.manual_seed`` and its name)."""

    def __init__(self, *spec):
        self._spec = spec

    def spec(self):
        """The initializer as the native module takes it: a name, or a list of the name and
        its arguments."""
        return list(self._spec) if len(self._spec) > 1 else self._spec[0]

    def __repr__(self):
        return f"kiln.init.{type(self).__name__}{self._spec[1:]}"


class Constant(Initializer):
    """Every element ``value`` (a number)."""

    def __init__(self, value):
        super().__init__("constant", float(value))


class Zeros(Initializer):
    """Every element 0."""

    def __init__(self):
        super().__init__("zeros")


class Ones(Initializer):
    """Every element 1."""

    def __init__(self):
        super().__init__("ones")


class Uniform(Initializer):
    """Uniform on ``[low, high)``."""

    def __init__(self, low=-1.0, high=1.0):
        super().__init__("uniform", float(low), float(high))


class Normal(Initializer):
    """Normal with ``mean`` and standard deviation ``std``."""

    def __init__(self, mean=0.0, std=1.0):
        super().__init__("normal", float(mean), float(std))


class XavierUniform(Initializer):
    """Glorot's uniform: bound ``sqrt(6 / (fan_in + fan_out))``."""

    def __init__(self):
        super().__init__("xavier_uniform")


class XavierNormal(Initializer):
    """Glorot's normal: std ``sqrt(2 / (fan_in + fan_out))``."""

    def __init__(self):
        super().__init__("xavier_normal")


class KaimingUniform(Initializer):
    """He's uniform for ReLU layers: bound ``sqrt(6 / fan_in)``."""

    def __init__(self):
        super().__init__("kaiming_uniform")


class KaimingNormal(Initializer):
    """He's normal for ReLU layers: std ``sqrt(2 / fan_in)``."""

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
