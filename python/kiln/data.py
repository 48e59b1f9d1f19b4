"""Data: datasets in memory (numpy arrays, ``.npy`` and CSV files, MNIST-format folders such as
Fashion-MNIST, the built-in digits), per-example transforms, and the ``DataLoader`` that
shuffles (seeded: the same batches on every run), transforms and batches them on a
background thread, optionally one rank's share of each batch.

    train, test, source, classes = kiln.data.images()   # Fashion-MNIST if installed
    loader = kiln.data.DataLoader(train, batch_size=64, shuffle=True, seed=1,
                                  transforms=[kiln.data.Normalize(0.5, 0.25)])
    for x, y in loader:          # numpy arrays: float32 [64, 1, 28, 28], int64 [64]
        ...
"""

from . import _kiln

Dataset = _kiln.Dataset
DataLoader = _kiln.DataLoader
digits = _kiln.digits
mnist = _kiln.mnist
images = _kiln.images
FASHION_MNIST_DIR = _kiln.FASHION_MNIST_DIR
FASHION_MNIST_HINT = _kiln.FASHION_MNIST_HINT

__all__ = [
    "DataLoader",
    "Dataset",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_HINT",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "digits",
    "images",
    "mnist",
]


def _values(v):
    return [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def Normalize(mean, std):  # noqa: N802 (named as the transform it makes, as torchvision's)
    """``(x - mean) / std`` per channel: one value, or one per channel of ``[C, H, W]``."""
    return _kiln.transform("normalize", mean=_values(mean), std=_values(std))


def RandomCrop(padding):  # noqa: N802
    """A random shift of up to ``padding`` pixels each way, filled with zeros (torchvision's
    ``RandomCrop(size, padding)`` with the image's own size)."""
    return _kiln.transform("random_crop", padding=int(padding))


def RandomHorizontalFlip(p=0.5):  # noqa: N802
    """A left–right mirror with probability ``p``."""
    return _kiln.transform("random_horizontal_flip", p=float(p))
