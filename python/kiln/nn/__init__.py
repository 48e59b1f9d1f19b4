"""Layers for eager code: subclass ``Layer``, set layers and parameters as attributes, write
``forward``. Calling a layer runs ``forward``."""

import math

from .. import _kiln, init as _init
from . import functional


class Layer:
    """A module of eager code. Attributes that are layers or parameters register themselves:
    ``parameters()`` finds them, in the order they were set."""

    def __init__(self, name=None):
        object.__setattr__(self, "_layers", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_name", name or _unique(type(self).__name__.lower()))

    def __setattr__(self, key, value):
        if "_layers" not in self.__dict__:
            raise RuntimeError(f"call super().__init__() in {type(self).__name__}.__init__ first")
        if isinstance(value, Layer):
            self._layers[key] = value
        elif isinstance(value, _kiln.Parameter):
            self._params[key] = value
        object.__setattr__(self, key, value)

    def full_name(self):
        """The layer's unique name, the prefix of its parameters' names."""
        return self._name

    def create_parameter(self, name, shape, init=None, dtype="float32"):
        """A parameter named ``<layer>.<name>`` of ``shape``."""
        return _kiln.parameter(f"{self._name}.{name}", list(shape), _init._spec(init), dtype)

    def parameters(self):
        """Every parameter of this layer and of the layers it holds."""
        found = list(self._params.values())
        for layer in self._layers.values():
            found.extend(layer.parameters())
        return found

    def named_parameters(self, prefix=""):
        """``(path, parameter)`` for every parameter of this layer and the layers it holds,
        the path made of attribute names as PyTorch makes it (``fc1.weight``), so that it is
        the same in every instance of a model (``parameter.name`` is Kiln's unique name)."""
        found = [(prefix + key, p) for key, p in self._params.items()]
        for key, layer in self._layers.items():
            found.extend(layer.named_parameters(f"{prefix}{key}."))
        return found

    def named_buffers(self, prefix=""):
        """``(path, buffer)`` for the state the layers keep but do not train (batch norm's
        ``running_mean`` and ``running_var``), with paths as ``named_parameters`` makes them."""
        found = [(prefix + key, b) for key, b in self._buffers.items()]
        for key, layer in self._layers.items():
            found.extend(layer.named_buffers(f"{prefix}{key}."))
        return found

    def buffers(self):
        """Every buffer of this layer and of the layers it holds."""
        return [b for _, b in self.named_buffers()]

    def _state(self):
        return dict(self.named_parameters()) | dict(self.named_buffers())

    def state_dict(self):
        """Every parameter's and buffer's value by its path (``named_parameters``,
        ``named_buffers``), as numpy arrays (copies): what ``load_state_dict`` takes, in this
        or another instance of the model."""
        return {name: p.numpy().copy() for name, p in self._state().items()}

    def load_state_dict(self, state_dict, strict=True):
        """Sets parameters and buffers from ``state_dict`` (path → array). With ``strict``, a
        path missing from either side is a ``KilnError`` naming them all; otherwise the paths
        that matched nothing are returned as ``(missing_keys, unexpected_keys)``. A shape
        that does not fit is a ``ShapeError`` naming the path. Nothing changes unless every
        value fits."""
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"load_state_dict takes a dict of arrays, not {type(state_dict).__name__}")
        own = self._state()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise _kiln.KilnError(
                f"load_state_dict: missing {missing or 'nothing'}, unexpected {unexpected or 'nothing'}"
                " (strict=False loads the rest)")
        import numpy as np
        values = {}
        for key, p in own.items():
            if key not in state_dict:
                continue
            value = np.asarray(state_dict[key])
            if tuple(value.shape) != tuple(p.shape):
                raise _kiln.ShapeError(
                    f"load_state_dict: `{key}` has shape {tuple(p.shape)}, the state_dict's "
                    f"{tuple(value.shape)}")
            values[key] = value.astype(p.numpy().dtype, copy=False)
        for key, value in values.items():
            own[key].set_value(value)
        return _IncompatibleKeys(missing, unexpected)

    def zero_grad(self):
        """Forgets the gradients of every parameter of the layer (``clear_gradients``)."""
        self.clear_gradients()

    def train(self):
        """Training mode for this layer and every layer it holds (dropout drops, batch norm
        uses the batch's statistics); returns the layer."""
        for layer in [self, *self._sublayers()]:
            layer._set_training(True)
        return self

    def eval(self):
        """Evaluation mode for this layer and every layer it holds (dropout passes through,
        batch norm uses its running statistics); returns the layer."""
        for layer in [self, *self._sublayers()]:
            layer._set_training(False)
        return self

    def _set_training(self, training):
        object.__setattr__(self, "training", training)

    def _sublayers(self):
        for layer in self._layers.values():
            yield layer
            yield from layer._sublayers()

    def clear_gradients(self):
        """Forgets the gradients of every parameter of the layer."""
        for p in self.parameters():
            p.clear_gradient()

    def forward(self, *inputs):
        """The layer's output from its input tensors. Subclasses override it; calling the
        layer calls it."""
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *inputs, **options):
        return self.forward(*inputs, **options)


_counts = {}


class _IncompatibleKeys(tuple):
    """``(missing_keys, unexpected_keys)`` of a non-strict ``load_state_dict``."""

    def __new__(cls, missing, unexpected):
        return super().__new__(cls, (missing, unexpected))

    @property
    def missing_keys(self):
        """Paths of the model the state_dict did not have."""
        return self[0]

    @property
    def unexpected_keys(self):
        """Paths of the state_dict the model does not have."""
        return self[1]


def _unique(base):
    n = _counts.get(base, 0)
    _counts[base] = n + 1
    return f"{base}_{n}"


class Linear(Layer):
    """``x @ weight + bias``, ``weight: [in, out]``; without a bias when ``bias=False``."""

    def __init__(self, in_features, out_features, bias=True, weight_init=None, bias_init=None,
                 name=None):
        super().__init__(name or _unique("linear"))
        self.weight = self.create_parameter(
            "w", [in_features, out_features], weight_init or _init.KaimingUniform()
        )
        if bias:
            self.bias = self.create_parameter("b", [out_features], bias_init or _init.Zeros())
        else:
            object.__setattr__(self, "bias", None)

    def forward(self, x):
        """``x @ weight + bias`` for ``x: [N, in_features]``. Raises ``kiln.ShapeError`` on
        another width."""
        bias = None if self.bias is None else self.bias.tensor()
        return functional.linear(x, self.weight.tensor(), bias)


class Sequential(Layer):
    """Layers applied in order."""

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, f"layer{i}", layer)
        object.__setattr__(self, "_order", list(layers))

    def forward(self, x):
        """``x`` through each layer in turn."""
        for layer in self._order:
            x = layer(x)
        return x


class ModuleList(Layer):
    """Layers in a list: indexed, iterated, appended; their parameters register (paths
    ``0.weight``, ``1.weight``, …). Calling it is an error: use its layers."""

    def __init__(self, layers=()):
        super().__init__()
        object.__setattr__(self, "_list", [])
        for layer in layers:
            self.append(layer)

    def append(self, layer):
        """Adds ``layer`` at the end; returns the list."""
        if not isinstance(layer, Layer):
            raise TypeError(f"ModuleList holds layers, not {type(layer).__name__}")
        setattr(self, str(len(self._list)), layer)
        self._list.append(layer)
        return self

    def __getitem__(self, i):
        return self._list[i]

    def __len__(self):
        return len(self._list)

    def __iter__(self):
        return iter(self._list)

    def forward(self, *inputs):
        """A ModuleList is not called: iterate over its layers."""
        raise TypeError("a ModuleList is not called: iterate over its layers")


class _Native(Layer):
    """One of Kiln's built-in layers, run by Rust; its parameters register like any."""

    kind = None

    def __init__(self, name=None, **options):
        super().__init__(name or _unique(self.kind))
        object.__setattr__(self, "_native", _kiln.NativeLayer(self.kind, self._name, **options))
        for p in self._native.parameters():
            self._params[p.name[len(self._name) + 1:]] = p
        for b in self._native.buffers():
            self._buffers[b.name[len(self._name) + 1:]] = b

    def forward(self, x):
        return self._native.forward(x)

    def _set_training(self, training):
        # The native layer keeps its own mode: a container's train()/eval() reaches it here.
        super()._set_training(training)
        self._native.set_training(training)


class Conv2d(_Native):
    """2-D convolution over NCHW: ``Conv2d(in_channels, out_channels, kernel_size, stride=1,
    padding=0, dilation=1, groups=1)``."""

    kind = "conv2d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 dilation=1, groups=1, name=None):
        super().__init__(name, in_channels=in_channels, out_channels=out_channels,
                         kernel_size=kernel_size, stride=stride, padding=padding,
                         dilation=dilation, groups=groups)


class MaxPool2d(_Native):
    """Max pooling over NCHW windows of ``kernel_size``, moving by ``stride`` (default: the
    window), with ``padding`` on each side."""

    kind = "max_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, name=None):
        super().__init__(name, kernel_size=kernel_size, stride=stride or kernel_size,
                         padding=padding)


class AvgPool2d(_Native):
    """Average pooling over NCHW windows of ``kernel_size``, moving by ``stride`` (default:
    the window), with ``padding`` (zeros, counted) on each side."""

    kind = "avg_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, name=None):
        super().__init__(name, kernel_size=kernel_size, stride=stride or kernel_size,
                         padding=padding)


class Flatten(_Native):
    """``[N, ...]`` as ``[N, product of the rest]``."""

    kind = "flatten"


class GlobalAvgPool(_Native):
    """The mean of each channel of NCHW input: ``[N, C]``."""

    kind = "global_avg_pool"


class BatchNorm(_Native):
    """Batch normalisation over the channels of NC or NCHW input: in training mode with the
    batch's statistics, updating the running averages (``running = (1 - momentum) * running
    + momentum * batch``, the variance unbiased, as PyTorch); in evaluation mode with them.
    ``eps`` is added to the variance."""

    kind = "batch_norm"

    def __init__(self, channels, eps=1e-5, momentum=0.1, name=None):
        super().__init__(name, channels=channels, eps=eps, momentum=momentum)


# PyTorch's names: one layer serves NC and NCHW input.
BatchNorm1d = BatchNorm2d = BatchNorm


class LayerNorm(_Native):
    """Layer normalisation over the last axis (``width`` features), with a learned scale and
    shift; ``eps`` in the denominator."""

    kind = "layer_norm"

    def __init__(self, width, eps=1e-5, name=None):
        super().__init__(name, width=width, eps=eps)


class _Recurrent(Layer):
    """A stack of ``num_layers`` recurrent layers, as PyTorch's: input ``[T, N, input_size]``
    (``[N, T, input_size]`` with ``batch_first``), from zero initial states. Weights are
    PyTorch's transposed (``w_ih: [input_size, G * hidden_size]``), drawn from
    ``U(-1/sqrt(hidden_size), 1/sqrt(hidden_size))``; biases start at zero. Layer ``k > 0``'s
    parameters end in ``_l{k}``."""

    kind = None

    def __init__(self, input_size, hidden_size, num_layers=1, batch_first=False, name=None):
        super().__init__(name or _unique(self.kind))
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"{type(self).__name__}: num_layers {num_layers} and hidden_size "
                             f"{hidden_size} must be 1 or more")
        self.hidden_size, self.num_layers, self.batch_first = hidden_size, num_layers, batch_first
        bound = 1.0 / math.sqrt(hidden_size)
        for layer in range(num_layers):
            inputs = input_size if layer == 0 else hidden_size
            suffix = "" if layer == 0 else f"_l{layer}"
            for key, shape, uniform in self._shapes(inputs, hidden_size):
                init = _init.Uniform(-bound, bound) if uniform else _init.Zeros()
                setattr(self, key + suffix, self.create_parameter(key + suffix, shape, init))

    def _layer_params(self, layer):
        suffix = "" if layer == 0 else f"_l{layer}"
        return [self._params[key + suffix].tensor() for key, _, _ in self._shapes(1, 1)]

    def _run(self, x, hx):
        if hx is not None:
            raise _kiln.KilnError(f"{type(self).__name__}: initial states other than zeros "
                                  "are not supported; call it without hx")
        functional._check_tensor(x, type(self).__name__)
        x = x if self.batch_first else x.transpose(0, 1)
        finals = []
        for layer in range(self.num_layers):
            x, *last = _kiln.recurrent(self.kind, [x, *self._layer_params(layer)])
            finals.append(last)
        out = x if self.batch_first else x.transpose(0, 1)
        return out, [_kiln.stack([f[i] for f in finals]) for i in range(len(finals[0]))]


class LSTM(_Recurrent):
    """An LSTM (gates ``i, f, g, o``, one bias per layer: PyTorch's two, added). Returns
    ``(output, (h_n, c_n))`` as PyTorch: every step's hidden state of the last layer, and
    each layer's last hidden and cell state ``[num_layers, N, hidden_size]``."""

    kind = "lstm"

    @staticmethod
    def _shapes(d, h):
        return [("w_ih", [d, 4 * h], True), ("w_hh", [h, 4 * h], True), ("b", [4 * h], False)]

    def forward(self, x, hx=None):
        """``(output, (h_n, c_n))`` for ``x`` (``hx``, initial states, must be ``None``)."""
        out, (h_n, c_n) = self._run(x, hx)
        return out, (h_n, c_n)


class GRU(_Recurrent):
    """A GRU (PyTorch's gate equations, ``r, z, n``, both biases). Returns ``(output, h_n)``
    as PyTorch: every step's hidden state of the last layer, and each layer's last hidden
    state ``[num_layers, N, hidden_size]``."""

    kind = "gru"

    @staticmethod
    def _shapes(d, h):
        return [("w_ih", [d, 3 * h], True), ("w_hh", [h, 3 * h], True),
                ("b_ih", [3 * h], False), ("b_hh", [3 * h], False)]

    def forward(self, x, hx=None):
        """``(output, h_n)`` for ``x`` (``hx``, the initial state, must be ``None``)."""
        out, (h_n,) = self._run(x, hx)
        return out, h_n


class Embedding(_Native):
    """Rows of a ``[vocab, dim]`` table by integer index."""

    kind = "embedding"

    def __init__(self, vocab, dim, name=None):
        super().__init__(name, vocab=vocab, dim=dim)


class SelfAttention(_Native):
    """Single-head scaled dot-product self-attention over ``[N, T, features]``, projecting
    to ``dim``."""

    kind = "self_attention"

    def __init__(self, features, dim, name=None):
        super().__init__(name, features=features, dim=dim)


def _check_heads(embed_dim, num_heads):
    if num_heads <= 0 or embed_dim % num_heads:
        raise ValueError(f"{num_heads} heads must divide the width {embed_dim}")


class MultiheadSelfAttention(_Native):
    """Multi-head self-attention over ``[N, T, embed_dim]``: biased query, key, value and output
    projections (parameters ``q``, ``k``, ``v``, ``o``, weights ``[embed_dim, embed_dim]``),
    ``num_heads`` heads of ``embed_dim / num_heads`` features; with ``causal``, token ``i``
    sees tokens ``j <= i``. Unlike PyTorch's ``nn.MultiheadAttention`` it attends ``x`` to
    itself, batch first: ``forward(x)`` gives the output alone. A ``ValueError`` unless
    ``num_heads`` divides ``embed_dim``."""

    kind = "multi_head_attention"

    def __init__(self, embed_dim, num_heads, causal=False, name=None):
        _check_heads(embed_dim, num_heads)
        super().__init__(name, embed_dim=embed_dim, num_heads=num_heads, causal=causal)


class TransformerEncoderLayer(_Native):
    """PyTorch's ``nn.TransformerEncoderLayer`` in the one form Kiln has: pre-norm, batch first,
    GELU, no dropout — ``x + attention(norm1(x))``, then ``x + ff2(gelu(ff1(norm2(x))))``. Its
    arguments are PyTorch's; settings Kiln lacks (PyTorch's defaults ``dropout=0.1``,
    ``activation="relu"``, ``batch_first=False``, ``norm_first=False`` among them) are a
    ``ValueError`` naming them, never a quietly different layer. ``causal=True`` masks every
    call causally (PyTorch's square subsequent mask with ``is_causal=True``)."""

    kind = "transformer_encoder_layer"

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, causal=False,
                 name=None):
        kiln_has = {"dropout": (dropout, 0.0), "activation": (activation, "gelu"),
                    "layer_norm_eps": (layer_norm_eps, 1e-5), "batch_first": (batch_first, True),
                    "norm_first": (norm_first, True)}
        other = [f"{k}={got!r}" for k, (got, want) in kiln_has.items() if got != want]
        if other:
            raise ValueError(
                "TransformerEncoderLayer: Kiln's is pre-norm, batch first, GELU, without dropout "
                "(dropout=0.0, activation='gelu', layer_norm_eps=1e-5, batch_first=True, "
                f"norm_first=True); got {', '.join(other)}")
        _check_heads(d_model, nhead)
        super().__init__(name, d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                         causal=causal)
        object.__setattr__(self, "causal", causal)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        """The layer's output for ``src`` ``[N, T, d_model]``. Masks are not taken per call:
        ``src_mask`` or ``src_key_padding_mask`` is a ``NotImplementedError``, and
        ``is_causal=True`` a ``ValueError`` unless the layer was made with ``causal=True``."""
        if src_mask is not None or src_key_padding_mask is not None:
            raise NotImplementedError(
                "TransformerEncoderLayer: masks per call are not supported; make the layer "
                "with causal=True for a causal mask")
        if is_causal and not self.causal:
            raise ValueError("TransformerEncoderLayer: is_causal=True needs the layer made "
                             "with causal=True")
        return self._native.forward(src)


class GPT(_Native):
    """A decoder-only transformer as nanoGPT's: token and learned position embeddings,
    ``layers`` pre-norm blocks of causal self-attention (``heads`` heads) and a GELU MLP of
    ``4 * width``, a final layer norm and the output head tied to the token embedding, with
    GPT-2's initialisation. ``forward(idx)`` maps tokens ``[N, T]`` (int64, ``T <= context``)
    to logits ``[N, T, vocab_size]``; its parameters are named as Rust's ``Gpt`` names them
    (``tokens.table``, ``block0.attention.q.w``, ``block0.norm1.gamma``, …; Linear weights
    ``[in, out]``)."""

    kind = "gpt"

    def __init__(self, vocab_size, context, width=128, heads=4, layers=4, name=None):
        _check_heads(width, heads)
        super().__init__(name, vocab_size=vocab_size, context=context, width=width,
                         heads=heads, layers=layers)
        object.__setattr__(self, "vocab_size", vocab_size)
        object.__setattr__(self, "context", context)

    def loss(self, idx, targets):
        """The mean cross-entropy of predicting ``targets`` ``[N, T]`` (each token's
        successor) from ``idx`` ``[N, T]``."""
        return functional.cross_entropy(self(idx), targets)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None,
                 greedy=False, seed=0, stop=(), use_cache=True):
        """Each row of ``idx`` (token ids: a list of lists, or an int array ``[B, T]``)
        followed by up to ``max_new_tokens`` tokens, as lists of ints. A token is drawn from
        the softmax of the last logits over ``temperature`` (nanoGPT's ``generate``), kept to
        the ``top_k`` likeliest and to the smallest set holding ``top_p`` of the mass, from a
        generator seeded by ``seed`` (one for the batch, row after row); ``greedy`` (or
        ``temperature=0``) takes the likeliest instead. A row ends after a token of ``stop``,
        which is kept. Past the context, each token sees the last ``context`` ones.

        With ``use_cache`` (the default) the rows go as one batch through a KV cache — a
        prefill per prompt length and one decode program for every position; prompts of
        different lengths are padded on the left and their padding masked out (each row's
        positions count from its first token); without it each row is generated alone, its
        whole window computed again for every token (the same tokens at batch 1 or greedy,
        slower)."""
        rows = idx.tolist() if hasattr(idx, "tolist") else idx
        rows = [[int(t) for t in row] for row in rows]
        if not rows:
            raise ValueError("GPT.generate: no prompts")
        return self._native.generate(rows, int(max_new_tokens), bool(greedy), float(temperature),
                                     top_k, top_p, int(seed), [int(t) for t in stop],
                                     bool(use_cache))


class Dropout(_Native):
    """Zeroes each element with probability ``p`` in training mode (scaling the rest by
    ``1 / (1 - p)``); the identity in evaluation mode."""

    kind = "dropout"

    def __init__(self, p=0.5, seed=0, name=None):
        super().__init__(name, p=p, seed=seed)


class ReLU(Layer):
    """``max(x, 0)``."""

    def forward(self, x):
        """``max(x, 0)`` elementwise."""
        return functional.relu(x)


class Tanh(Layer):
    """``tanh(x)``."""

    def forward(self, x):
        """``tanh(x)`` elementwise."""
        return functional.tanh(x)


class GELU(Layer):
    """GELU with the exact normal CDF (PyTorch's default)."""

    def forward(self, x):
        """``x * Φ(x)`` elementwise."""
        return functional.gelu(x)


class CrossEntropyLoss(Layer):
    """Mean softmax cross-entropy: ``CrossEntropyLoss()(logits, labels)``."""

    def forward(self, logits, labels):
        """Mean cross-entropy of ``logits: [N, C]`` against integer ``labels: [N]``."""
        return cross_entropy(logits, labels)


class MSELoss(Layer):
    """Mean squared error: ``MSELoss()(prediction, target)``."""

    def forward(self, prediction, target):
        """The mean of ``(prediction - target) ** 2``."""
        return mse(prediction, target)


class Sigmoid(Layer):
    """``1 / (1 + exp(-x))``."""

    def forward(self, x):
        """``1 / (1 + exp(-x))`` elementwise."""
        return functional.sigmoid(x)


# The losses are kiln.nn.functional's (one definition), under the names kiln.nn has had.
cross_entropy = functional.cross_entropy
mse = functional.mse_loss
binary_cross_entropy_with_logits = functional.binary_cross_entropy_with_logits


def accuracy(logits, labels):
    """The fraction of rows whose largest logit is the label."""
    return _kiln.loss("accuracy", logits, labels)

