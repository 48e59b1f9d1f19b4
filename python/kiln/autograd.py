"""``PyLayer``: a custom op whose forward and backward are numpy code."""

from . import _kiln


class PyLayer:
    """Subclass with static methods over lists of numpy arrays::

        class Tanh(kiln.PyLayer):
            @staticmethod
            def forward(inputs):
                return np.tanh(inputs[0])

            @staticmethod
            def backward(inputs, outputs, grads):
                return grads[0] * (1 - outputs[0] ** 2)

        y = Tanh.apply(x)

    ``apply`` runs it eagerly (its backward is the gradient), and under ``to_static`` it is
    traced as a ``call`` op. A single array may be returned for a single output; set
    ``num_outputs`` on the class for more. An exception inside them propagates with its
    traceback.
    """

    num_outputs = 1

    @staticmethod
    def forward(inputs):
        """The op's results from ``inputs`` (a list of numpy arrays): an array, or a list of
        ``num_outputs`` arrays. Override it."""
        raise NotImplementedError

    @staticmethod
    def backward(inputs, outputs, grads):
        """The gradient of each input, from the inputs, the outputs and the outputs'
        gradients (lists of numpy arrays). Override it."""
        raise NotImplementedError

    @classmethod
    def _op_name(cls):
        name = f"pylayer.{cls.__module__}.{cls.__qualname__}".replace("<", "_").replace(">", "_")
        if cls.__dict__.get("_registered") != name:
            _kiln.register_pylayer(name, cls.forward, cls.backward, cls.num_outputs)
            cls._registered = name
        return name

    @classmethod
    def apply(cls, *inputs):
        """Runs the op on tensors ``inputs``; returns a tensor (or a list, for several
        outputs). Raises what ``forward`` raises, with Kiln's error naming the op as its
        ``__cause__``."""
        outputs = _kiln.apply_pylayer(cls._op_name(), list(inputs))
        return outputs[0] if len(outputs) == 1 else outputs
