"""Optimizers and learning-rate schedules. Eager: ``Adam(model.parameters(), lr)`` with
``step()`` and ``zero_grad()``. Static: ``SGD(lr=0.1).minimize(loss)`` returns a target
for ``Session.run``. Every keyword has PyTorch's name and meaning, and a value an optimizer
cannot use is refused when it is built (``ValueError``; an unknown keyword is a
``TypeError``) — none is ignored. Schedules (``StepLR``, ``CosineAnnealingLR``, ``LinearLR``
for warm-up) change an eager optimizer's ``lr`` from its next step on."""

import math

from . import _kiln


class Optimizer:
    """An update rule. Eagerly: ``Rule(model.parameters(), lr)``, then ``zero_grad()``,
    ``loss.backward()``, ``step()``. For a static program: ``Rule(lr=…).minimize(loss)``.
    Raises ``TypeError`` when used the other way round."""

    kind = None

    def __init__(self, params, lr, options):
        if isinstance(params, (int, float)) and not isinstance(params, bool):
            params, lr = None, float(params)
        self._lr = float(lr)
        self.options = options
        self._params = list(params) if params is not None else None
        self._eager = None
        _kiln.check_optimizer(self.kind, self._lr, **options)  # a bad option fails here
        if self._params is not None:
            self._optimizer()

    @property
    def lr(self):
        """The learning rate. Setting it changes an eager optimizer's next steps (a static
        program's update keeps the rate it was built with)."""
        return self._lr

    @lr.setter
    def lr(self, value):
        if self._eager is not None:
            self._eager.set_lr(float(value))
        self._lr = float(value)

    def _optimizer(self):
        if self._params is None:
            raise TypeError(f"{type(self).__name__}(lr) is for static programs: use minimize()")
        if self._eager is None:
            self._eager = _kiln.EagerOptimizer(self.kind, self._params, self._lr, **self.options)
        return self._eager

    def step(self):
        """Updates every parameter with the gradient ``backward()`` left (zero if none)."""
        self._optimizer().step()

    def zero_grad(self):
        """Forgets the parameters' gradients."""
        if self._params is not None:
            for p in self._params:
                p.clear_gradient()

    def minimize(self, program_or_loss, loss=None, parameters=None, name=None, var_list=None):
        """Adds ``loss``'s gradients and this rule's updates to its program (of
        ``parameters`` — or ``var_list``, TF's name: parameters' ``Var`` objects or names —,
        or of all); returns the target to fetch. ``minimize(loss)`` finds the program from
        the loss; ``minimize(program, loss)`` checks that it is the loss's. The optimizer's
        target and state are named ``name`` (by default its kind, then ``sgd_1``… when
        another optimizer of the program took it). A name that is no parameter, or a list the
        loss does not depend on, raises ``kiln.KilnError``."""
        from .static import Program, Var
        if var_list is not None:
            if parameters is not None:
                raise TypeError("minimize: give parameters or var_list, not both")
            parameters = var_list
        if parameters is not None:
            parameters = [parameters] if isinstance(parameters, (Var, str)) else list(parameters)
        program, loss = (None, program_or_loss) if loss is None else (program_or_loss, loss)
        if not isinstance(loss, Var):
            raise TypeError(f"minimize: the loss is a Var of a program, not {type(loss).__name__}"
                            " (eagerly: loss.backward() and step())")
        if program is not None and not isinstance(program, Program):
            raise TypeError(f"minimize(program, loss): a Program, not {type(program).__name__}")
        native = loss.program if program is None else program._program
        return native.minimize(self.kind, self._lr, loss, parameters, name=name, **self.options)


class SGD(Optimizer):
    """Stochastic gradient descent, as PyTorch's: ``g += weight_decay * w``; with a
    ``momentum``, ``v = momentum * v + (1 - dampening) * g`` and the step is ``v`` (or
    ``g + momentum * v`` with ``nesterov``); ``w -= lr * step``."""

    kind = "sgd"

    def __init__(self, params=None, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        options = dict(momentum=float(momentum), dampening=float(dampening),
                       weight_decay=float(weight_decay), nesterov=bool(nesterov))
        super().__init__(params, lr, options)


class Momentum(SGD):
    """SGD with momentum (0.9 unless given), as PyTorch writes it: ``v = momentum * v + g``,
    ``w -= lr * v``."""

    def __init__(self, params=None, lr=0.01, momentum=0.9, dampening=0.0, weight_decay=0.0,
                 nesterov=False):
        super().__init__(params, lr, momentum, dampening, weight_decay, nesterov)


class Adam(Optimizer):
    """Adam with PyTorch's bias correction: ``betas`` for the moments, ``eps`` in the
    denominator, ``weight_decay`` added to the gradient (L2). ``amsgrad`` is not supported
    (``amsgrad=True`` raises ``ValueError``)."""

    kind = "adam"
    _decoupled = False

    def __init__(self, params=None, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False):
        if amsgrad:
            raise ValueError(f"{type(self).__name__}: amsgrad is not supported")
        options = dict(betas=tuple(float(b) for b in betas), eps=float(eps),
                       weight_decay=float(weight_decay), decoupled=self._decoupled)
        super().__init__(params, lr, options)


class AdamW(Adam):
    """Adam with decoupled weight decay, as PyTorch's ``AdamW``: ``w -= lr * weight_decay *
    w`` before each Adam step."""

    _decoupled = True

    def __init__(self, params=None, lr=0.001, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class LRScheduler:
    """Sets ``optimizer.lr`` from its learning rate when the schedule was made (``base_lr``)
    and the count of ``step()`` calls (``last_epoch``), as PyTorch's schedulers do: call
    ``step()`` once per epoch (or per batch, for a warm-up counted in steps)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.base_lr = optimizer.lr
        self.last_epoch = 0
        optimizer.lr = self.lr_at(0)

    def lr_at(self, epoch):
        """The learning rate after ``epoch`` steps of the schedule."""
        raise NotImplementedError

    def step(self):
        """Advances the schedule by one and sets the optimizer's learning rate."""
        self.last_epoch += 1
        self.optimizer.lr = self.lr_at(self.last_epoch)

    def get_last_lr(self):
        """The learning rate the schedule set last, in a list (as PyTorch's)."""
        return [self.optimizer.lr]


class StepLR(LRScheduler):
    """``base_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer, step_size, gamma=0.1):
        if step_size < 1:
            raise ValueError(f"StepLR: step_size {step_size} must be 1 or more")
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(optimizer)

    def lr_at(self, epoch):
        """``base_lr * gamma ** (epoch // step_size)``."""
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """From ``base_lr`` down to ``eta_min`` along half a cosine over ``T_max`` steps."""

    def __init__(self, optimizer, T_max, eta_min=0.0):  # noqa: N803 (PyTorch's name)
        if T_max < 1:
            raise ValueError(f"CosineAnnealingLR: T_max {T_max} must be 1 or more")
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(optimizer)

    def lr_at(self, epoch):
        """``eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``."""
        t = min(epoch, self.T_max)
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class LinearLR(LRScheduler):
    """A linear ramp of the factor from ``start_factor`` to ``end_factor`` over
    ``total_iters`` steps, then ``end_factor``: a warm-up with the defaults' shape."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5):
        if not (0 < start_factor <= 1 and 0 <= end_factor <= 1) or total_iters < 1:
            raise ValueError("LinearLR: factors in (0, 1] and [0, 1], total_iters 1 or more")
        self.start_factor, self.end_factor = float(start_factor), float(end_factor)
        self.total_iters = int(total_iters)
        super().__init__(optimizer)

    def lr_at(self, epoch):
        """``base_lr`` times the factor ``epoch`` steps along the ramp."""
        along = min(epoch, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * along)
