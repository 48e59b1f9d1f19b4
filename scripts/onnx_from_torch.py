"""Exports small PyTorch models to ONNX with their inputs and torch's outputs, in ONNX's test
layout (NAME/model.onnx, NAME/test_data_set_0/{input,output}_I.pb, NAME/meta.json), for
onnx/tests/node_tests.rs (`torch_exports`). Needs torch and onnx (e.g. the peers' venv of
scripts/compare_peers.sh with `pip install -r scripts/onnx-requirements.txt`).

usage: python scripts/onnx_from_torch.py OUT_DIR        (OUT_DIR: target/onnx-torch)
"""

import json
import os
import sys
import warnings

import torch
from onnx import numpy_helper
from torch import nn


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.fc = nn.Conv2d(8, 16, 3, stride=2), nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = nn.functional.adaptive_avg_pool2d(torch.relu(self.conv2(x)), 1)
        return torch.log_softmax(self.fc(torch.flatten(x, 1)), dim=-1)


class Recurrent(nn.Module):
    def __init__(self, cell):
        super().__init__()
        kind = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = kind(6, 8, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.fc(out[:, -1])


class Attention(nn.Module):
    """A pre-norm self-attention block with a GELU feed-forward, written out (the legacy
    exporter cannot trace nn.TransformerEncoderLayer's fused path)."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads, self.norm1, self.norm2 = heads, nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 32), nn.GELU(), nn.Linear(32, d))

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        split = lambda z: z.reshape(n, t, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        w = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((w @ v).transpose(1, 2).reshape(n, t, d))
        return x + self.ff(self.norm2(x))


class Encoder(nn.Module):
    """A BERT-style classifier: token and position embeddings, two post-norm
    nn.TransformerEncoderLayer blocks (GELU), a 2-class head on the first token. At batch 1
    its tokens `[1, T, d]` were read as `[T, 1, d]` through a transpose, which the compiled
    product mis-strode (NaN; issue 48)."""

    def __init__(self, vocab=1000, d=128, heads=4, ff=512, t=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(t, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 2)

    def forward(self, ids):
        h = self.tok(ids) + self.pos(torch.arange(ids.shape[1]).unsqueeze(0))
        return self.head(self.enc(h)[:, 0])


def cases():
    torch.manual_seed(0)
    cnn = Cnn()
    with torch.no_grad():  # running statistics that are not the defaults
        cnn.bn.running_mean.uniform_(-0.5, 0.5)
        cnn.bn.running_var.uniform_(0.5, 2.0)
    yield "torch_cnn", cnn, torch.randn(4, 1, 12, 12), None
    yield "torch_cnn_dynamic_batch", cnn, torch.randn(4, 1, 12, 12), {"x": {0: "batch"}}
    yield "torch_lstm", Recurrent("lstm"), torch.randn(3, 5, 6), None
    yield "torch_gru", Recurrent("gru"), torch.randn(3, 5, 6), None
    yield "torch_lstm_dynamic_batch", Recurrent("lstm"), torch.randn(3, 5, 6), {"x": {0: "batch"}}
    yield "torch_attention", Attention(), torch.randn(2, 7, 16), None
    yield "torch_attention_dynamic_batch", Attention(), torch.randn(2, 7, 16), {"x": {0: "batch"}}
    encoder = Encoder()
    for batch in (1, 8):
        yield f"torch_encoder_batch{batch}", encoder, torch.randint(0, 1000, (batch, 64)), "dynamo"


def main(out):
    warnings.simplefilter("ignore")
    for name, model, x, dynamic in cases():
        model.eval()
        folder = os.path.join(out, name)
        os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
        path = os.path.join(folder, "model.onnx")
        if dynamic == "dynamo":  # as a user exports today (torch.export, then ONNX)
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"],
                              output_names=["y"])
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"],
                              output_names=["y"], dynamic_axes=dynamic, opset_version=17)
        with torch.no_grad():
            y = model(x)
        for kind, value in (("input", x), ("output", y)):
            t = numpy_helper.from_array(value.numpy())
            with open(os.path.join(folder, "test_data_set_0", f"{kind}_0.pb"), "wb") as f:
                f.write(t.SerializeToString())
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump({"rtol": 1e-4, "atol": 1e-5, "torch": torch.__version__}, f)
    print(f"wrote the torch exports to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
