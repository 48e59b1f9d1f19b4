"""Optimizers. Eager: ``Adam(model.parameters(), lr)`` with ``step()`` and ``zero_grad()``.
Static: ``SGD(lr).minimize(program, loss)`` returns a target for ``Session.run``."""

from . import _kiln


class Optimizer:
    """An update rule. Eagerly: ``Rule(model.parameters(), lr)``, then ``zero_grad()``,
    ``loss.backward()``, ``step()``. For a static program: ``Rule(lr).minimize(program,
    loss)``. Raises ``TypeError`` when used the other way round."""

    kind = None

    def __init__(self, params=None, lr=0.01, **options):
        if isinstance(params, (int, float)) and not isinstance(params, bool):
            params, lr = None, float(params)
        self.lr = float(lr)
        self.options = options
        self._params = list(params) if params is not None else None
        self._eager = None

    def _optimizer(self):
        if self._params is None:
            raise TypeError(f"{type(self).__name__}(lr) is for static programs: use minimize()")
        if self._eager is None:
            self._eager = _kiln.EagerOptimizer(self.kind, self._params, self.lr, **self.options)
        return self._eager

    def step(self):
        """Updates every parameter with the gradient ``backward()`` left (zero if none)."""
        self._optimizer().step()

    def zero_grad(self):
        """Forgets the parameters' gradients."""
        if self._params is not None:
            for p in self._params:
                p.clear_gradient()

    def minimize(self, program, loss, parameters=None, name=None):
        """Adds ``loss``'s gradients and this rule's updates to ``program`` (of the named
        ``parameters``, or all); returns the target to fetch."""
        return program._program.minimize(
            self.kind, self.lr, loss, parameters, name=name, **self.options
        )


class SGD(Optimizer):
    """Gradient descent: ``w -= lr * g``."""

    kind = "sgd"


class Momentum(Optimizer):
    """SGD with momentum, as PyTorch writes it: ``v = momentum * v + g``, ``w -= lr * v``."""

    kind = "momentum"

    def __init__(self, params=None, lr=0.01, momentum=0.9):
        super().__init__(params, lr, momentum=float(momentum))


class Adam(Optimizer):
    """Adam with PyTorch's bias correction: ``betas`` for the moments, ``eps`` in the
    denominator."""

    kind = "adam"

    def __init__(self, params=None, lr=0.001, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, lr, betas=tuple(betas), eps=float(eps))
