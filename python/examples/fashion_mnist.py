"""Fashion-MNIST (or the built-in digits) with kiln.data and kiln.Trainer: an MLP written as a
PyTorch user writes it, trained with Adam, validated each epoch, checkpointed, and drawn.

    python python/examples/fashion_mnist.py [--epochs 3] [--data DIR] [--out DIR]

With Debian's ``dataset-fashion-mnist`` installed it trains on Fashion-MNIST's 60,000
images; otherwise on the built-in 8x8 digits (``--data DIR`` names any MNIST-format folder).
"""

import argparse
import pathlib

import kiln
from kiln import data, nn


class MLP(nn.Layer):
    def __init__(self, inputs, hidden=256, classes=10):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.fc1(self.flatten(x)).relu())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--data", help="an MNIST-format folder")
    parser.add_argument("--out", default="target/fashion_mnist_py")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    train, test, source, class_names = data.images(args.data)
    print(f"data: {source} ({len(train)} training and {len(test)} test images)")
    kiln.manual_seed(0)
    shape = train.sample_shape
    model = MLP(shape[0] * shape[1] * shape[2])
    optimizer = kiln.optim.Adam(model.parameters(), lr=1e-3)
    train_loader = data.DataLoader(train, batch_size=64, shuffle=True, seed=1,
                                   transforms=[data.Normalize(0.5, 0.5)])
    test_loader = data.DataLoader(test, batch_size=1000, transforms=[data.Normalize(0.5, 0.5)])

    trainer = kiln.Trainer(model, optimizer, validation=test_loader,
                           checkpoint=out / "checkpoint.safetensors")
    trainer.resume(out / "checkpoint.safetensors")  # goes on where an earlier run stopped
    trainer.on(lambda e: e["kind"] == "epoch_end" and print(
        f"epoch {e['epoch'] + 1}: training loss {e['train']['loss']:.4f}, "
        f"test accuracy {100 * e['validation']['accuracy']:.1f} %"))
    trainer.fit(train_loader, args.epochs)

    metrics, confusion = trainer.evaluate(test_loader)
    trainer.plot_history(out / "curves.svg")
    kiln.Trainer.plot_confusion(out / "confusion.svg", confusion, class_names)
    print(f"test accuracy {100 * metrics['accuracy']:.1f} % (top-5 {100 * metrics['top_k']:.1f} %)")
    print(f"wrote {out / 'curves.svg'}, {out / 'confusion.svg'} and {out / 'checkpoint.safetensors'}")


if __name__ == "__main__":
    main()
