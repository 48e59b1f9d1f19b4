"""The training loop, written once (in Rust, as ``kiln::train``): ``Trainer`` runs an eager
model and its optimizer — or a static program in a session — over a ``kiln.data.DataLoader``,
with callbacks, metrics (loss, accuracy, top-k), a progress bar, validation, checkpoints
(parameters and optimizer state, atomic, mid-epoch too) and ``resume``, early stopping, and
plots of the history and of a confusion matrix."""

from . import _kiln, nn


class Trainer:
    """Trains ``model`` (a ``kiln.nn.Layer``) with ``optimizer`` (made over its parameters)
    on ``loss(logits, labels)`` (cross-entropy by default).

    ``validation``: a ``DataLoader`` measured after each epoch. ``checkpoint``: a file written
    after each epoch (and every ``checkpoint_every`` steps); ``resume(path)`` goes on from it.
    ``patience``: stop when the validation loss has not improved by ``min_delta`` for that
    many epochs. ``progress``: a progress bar on a terminal. ``top_k``: the k of top-k
    accuracy."""

    def __init__(self, model, optimizer, loss=None, **options):
        loss = loss or nn.cross_entropy
        optimizer._optimizer()  # its moments exist from now on, so `resume` can restore them

        def train_step(x, y):
            model.train()
            optimizer.zero_grad()
            logits = model(_kiln.tensor(x, False))
            value = loss(logits, _kiln.tensor(y, False))
            value.backward()
            optimizer.step()
            return value.item(), logits.numpy()

        def eval_step(x, y):
            model.eval()
            with _kiln.no_grad():
                logits = model(_kiln.tensor(x, False))
                value = loss(logits, _kiln.tensor(y, False))
            return value.item(), logits.numpy()

        self._native = _kiln.NativeTrainer(train_step, eval_step, None, **_native(options))

    @classmethod
    def static(cls, session, x, y, logits, loss, target, **options):
        """A trainer of a static program: each step feeds ``x`` and ``y`` (placeholders) and
        runs ``loss``, ``logits`` and ``target`` (from ``minimize``) in ``session``; the
        checkpoint holds the session's state. Options as for ``Trainer``."""
        names = (x.name, y.name)

        def train_step(xs, ys):
            value, out, _ = session.run([loss, logits, target], {names[0]: xs, names[1]: ys})
            return float(value), out

        def eval_step(xs, ys):
            value, out = session.run([loss, logits], {names[0]: xs, names[1]: ys})
            return float(value), out

        trainer = cls.__new__(cls)
        trainer._native = _kiln.NativeTrainer(
            train_step, eval_step, session._session, **_native(options)
        )
        return trainer

    def on(self, callback):
        """Calls ``callback(event)`` on every event: a dict whose ``kind`` is
        ``epoch_begin``, ``step_begin``, ``step_end`` (with ``loss``) or ``epoch_end`` (with
        ``train`` and ``validation`` metrics). A true result stops training after the event.
        Returns the trainer."""
        self._native.on(callback)
        return self

    def fit(self, train, epochs):
        """Trains on ``train`` (a ``DataLoader``) until ``epochs`` epochs are done (counting
        those before a ``resume``); returns the history: ``epochs`` (one dict per epoch),
        ``step_losses`` and ``stopped`` (why it stopped early, or ``None``)."""
        return self._native.fit(train, int(epochs))

    def evaluate(self, data):
        """``(metrics, confusion)`` on every batch of ``data``: loss, accuracy, top-k and the
        count of each (true, predicted) class pair."""
        return self._native.evaluate(data)

    @property
    def history(self):
        """What training measured so far (as ``fit`` returns it)."""
        return self._native.history()

    @property
    def epoch(self):
        """The epoch training goes on with (the number finished)."""
        return self._native.epoch()

    def resume(self, path):
        """Goes on from the checkpoint at ``path`` when it exists (returns whether it did): the
        parameters, the optimizer's state, the position in the epoch and the history. Nothing
        changes on error."""
        return self._native.resume(str(path))

    def save_checkpoint(self):
        """Writes the checkpoint now (atomically)."""
        self._native.save_checkpoint()

    def plot_history(self, path):
        """Draws the loss and accuracy per epoch (training and validation) as an SVG."""
        self._native.plot_history(str(path))

    @staticmethod
    def plot_confusion(path, confusion, class_names=()):
        """Draws a confusion matrix (as ``evaluate`` returns it) as an SVG."""
        _kiln.NativeTrainer.plot_confusion(str(path), confusion, [str(c) for c in class_names])


def _native(options):
    allowed = {"validation", "checkpoint", "checkpoint_every", "patience", "min_delta",
               "progress", "top_k"}
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(f"Trainer has no option {', '.join(sorted(unknown))}")
    if options.get("checkpoint") is not None:
        options["checkpoint"] = str(options["checkpoint"])
    return options
