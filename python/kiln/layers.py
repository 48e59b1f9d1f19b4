"""Layers and losses for static programs, taking the program first (as in Rust). Each layer
with parameters names them ``<name>.<parameter>``; without a ``name``, the first free
``<kind><n>`` is taken."""


def _p(program, function):
    from .static import Program
    if not isinstance(program, Program):
        raise TypeError(f"layers.{function}(): the first argument is the Program, not "
                        f"{type(program).__name__}")
    return program._program


def _fresh(program, kind):
    taken = {n.split(".")[0] for n in program.parameter_names()}
    return next(f"{kind}{i}" for i in range(len(taken) + 1) if f"{kind}{i}" not in taken)


def _layer(program, kind, name, x, **options):
    native = _p(program, kind)
    return native.static_layer(kind, name or _fresh(program, kind), x, **options)


def dense(program, x, units, activation=None, name=None):
    """``activation(x @ w + b)`` with parameters ``<name>.w`` and ``<name>.b``."""
    return _p(program, "dense").dense(name or _fresh(program, "dense"), x, units, activation)


def conv2d(program, x, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
           activation=None, name=None):
    """``activation(conv2d(x, w) + b)`` over NCHW ``x``, with parameters ``<name>.w``
    (OIHW) and ``<name>.b``."""
    return _layer(program, "conv2d", name, x, out_channels=out_channels,
                  kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation,
                  groups=groups, activation=activation)[0]


def max_pool2d(program, x, kernel_size, stride=None, padding=0):
    """The largest element of each NCHW window; ``stride`` defaults to the window."""
    return _layer(program, "max_pool2d", "pool", x, kernel_size=kernel_size,
                  stride=stride or kernel_size, padding=padding)[0]


def avg_pool2d(program, x, kernel_size, stride=None, padding=0):
    """The mean of each NCHW window (padding counts as zeros)."""
    return _layer(program, "avg_pool2d", "pool", x, kernel_size=kernel_size,
                  stride=stride or kernel_size, padding=padding)[0]


def global_avg_pool(program, x):
    """The mean of each channel of NCHW ``x``: ``[N, C]``."""
    return _layer(program, "global_avg_pool", "pool", x)[0]


def layer_norm(program, x, eps=1e-5, name=None):
    """Normalisation over the last axis with parameters ``<name>.gamma`` and ``.beta``."""
    return _layer(program, "layer_norm", name, x, eps=eps)[0]


def batch_norm(program, channels, momentum=0.1, eps=1e-5, name=None):
    """A batch normalisation over ``channels`` (NC or NCHW): ``bn.train(x)`` gives ``(y,
    update)`` — fetch ``update`` with the training step to keep the running averages —
    and ``bn.eval(x)`` normalises with them. Both share the parameters."""
    native = _p(program, "batch_norm")
    return native.batch_norm(name or _fresh(program, "batch_norm"), channels, momentum, eps)


def lstm(program, x, hidden_size, name=None):
    """An LSTM over ``x: [N, T, D]``: ``(every step's h [N, T, H], the last h [N, H])``."""
    return tuple(_layer(program, "lstm", name, x, hidden_size=hidden_size))


def gru(program, x, hidden_size, name=None):
    """A GRU over ``x: [N, T, D]``: ``(every step's h [N, T, H], the last h [N, H])``."""
    return tuple(_layer(program, "gru", name, x, hidden_size=hidden_size))


def self_attention(program, x, dim, name=None):
    """Single-head self-attention over ``x: [N, T, D]`` through ``dim`` features."""
    return _layer(program, "self_attention", name, x, dim=dim)[0]


def embedding(program, indices, num_embeddings, embedding_dim, name=None):
    """Rows of a ``[num_embeddings, embedding_dim]`` table (``<name>.w``) at integer
    ``indices``."""
    return _layer(program, "embedding", name, indices, num_embeddings=num_embeddings,
                  embedding_dim=embedding_dim)[0]


def _loss(program, kind, args):
    return _p(program, kind).layer(kind, list(args))


def mse(program, prediction, target):
    """The mean of ``(prediction - target) ** 2`` over every element (a scalar). Raises
    ``kiln.ShapeError`` when the shapes differ."""
    return _loss(program, "mse", [prediction, target])


def softmax_cross_entropy(program, logits, labels):
    """The mean cross-entropy of ``logits`` ``[N, C]`` against integer ``labels`` ``[N]``.
    Raises ``kiln.ShapeError`` when the class count is not fixed or the batches differ."""
    return _loss(program, "softmax_cross_entropy", [logits, labels])


def sigmoid_cross_entropy(program, logits, labels):
    """The mean binary cross-entropy of ``logits`` against float ``labels`` in [0, 1], of
    the same shape."""
    return _loss(program, "sigmoid_cross_entropy", [logits, labels])


def accuracy(program, logits, labels):
    """The fraction of rows whose largest logit is at the integer label (a scalar)."""
    return _loss(program, "accuracy", [logits, labels])


def softmax(program, x):
    """The softmax of ``x`` along its last axis."""
    return _loss(program, "softmax", [x])


def log_softmax(program, x):
    """The log-softmax of ``x`` along its last axis."""
    return _loss(program, "log_softmax", [x])


def mean(program, x):
    """The mean of every element of ``x`` (a scalar)."""
    return _loss(program, "mean", [x])


def flatten(program, x):
    """``x`` ``[N, ...]`` as ``[N, product of the rest]``."""
    return _loss(program, "flatten", [x])
