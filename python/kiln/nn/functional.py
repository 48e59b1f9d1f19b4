"""Functions of tensors, as ``torch.nn.functional``'s: each is the runtime's one composite or
op — the one its layer uses — so it runs eagerly, traces under ``to_static`` and has its
gradient. ``import kiln.nn.functional as F``."""

from .. import _kiln as _native


def _check_tensor(x, function):
    """``x`` as a tensor (a parameter's current value); a ``TypeError`` naming ``function``
    for anything else (as PyTorch raises)."""
    if isinstance(x, _native.Parameter):
        return x.tensor()
    if not isinstance(x, _native.Tensor):
        raise TypeError(f"{function}(): the input must be a kiln.Tensor, not {type(x).__name__}")
    return x


def relu(x):
    """``max(x, 0)`` elementwise."""
    return _check_tensor(x, "relu").relu()


def gelu(x):
    """GELU with the exact normal CDF: ``x * Φ(x)`` (PyTorch's default)."""
    return _native.functional("gelu", [x])


def sigmoid(x):
    """``1 / (1 + exp(-x))`` elementwise."""
    return _check_tensor(x, "sigmoid").sigmoid()


def tanh(x):
    """``tanh(x)`` elementwise."""
    return _check_tensor(x, "tanh").tanh()


def softmax(x, dim=-1):
    """The softmax along ``dim``."""
    return _check_tensor(x, "softmax").softmax(dim)


def log_softmax(x, dim=-1):
    """The log-softmax along ``dim``."""
    return _check_tensor(x, "log_softmax").log_softmax(dim)


def cross_entropy(logits, labels):
    """Mean softmax cross-entropy of ``logits: [N, C]`` against integer ``labels: [N]``."""
    return _native.loss("cross_entropy", logits, labels)


def mse_loss(prediction, target):
    """The mean of ``(prediction - target) ** 2``."""
    return _native.loss("mse", prediction, target)


def binary_cross_entropy_with_logits(logits, targets):
    """Mean sigmoid cross-entropy of ``logits`` against 0/1 ``targets``."""
    return _native.loss("binary_cross_entropy_with_logits", logits, targets)


def linear(x, weight, bias=None):
    """``x @ weight + bias`` with Kiln's layout, ``weight: [in, out]`` (PyTorch's is
    ``[out, in]``: pass ``weight.T`` from a PyTorch state)."""
    y = _check_tensor(x, "linear").matmul(weight)
    return y if bias is None else y + bias


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution of NCHW ``x`` with OIHW ``weight`` (and a bias ``[O]``)."""
    inputs = [x, weight] if bias is None else [x, weight, bias]
    return _native.functional("conv2d", inputs, stride=stride, padding=padding,
                              dilation=dilation, groups=groups)


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """The largest element of each window (NCHW); ``stride`` defaults to the window."""
    return _native.functional("max_pool2d", [x], kernel_size=kernel_size,
                              stride=stride or kernel_size, padding=padding)


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """The mean of each window (NCHW; padding counts as zeros); ``stride`` defaults to the
    window."""
    return _native.functional("avg_pool2d", [x], kernel_size=kernel_size,
                              stride=stride or kernel_size, padding=padding)


def layer_norm(x, weight, bias, eps=1e-5):
    """Normalisation over the last axis, scaled by ``weight`` and shifted by ``bias``."""
    return _native.functional("layer_norm", [x, weight, bias], eps=eps)


def dropout(x, p=0.5, training=True):
    """Zeroes each element with probability ``p`` and scales the rest by ``1/(1-p)`` when
    ``training``; the identity otherwise."""
    return _native.functional("dropout", [x], p=p, training=training)


def embedding(indices, weight):
    """The rows of ``weight`` at integer ``indices``."""
    return _native.functional("embedding", [indices, weight])


def flatten(x):
    """``[N, ...]`` as ``[N, product of the rest]``."""
    return _native.functional("flatten", [x])
