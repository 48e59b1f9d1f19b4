"""Kiln against onnxruntime on ONNX models: the time to load (Kiln: import + compile;
onnxruntime: session creation with its graph optimisations) and the inference latency at
batch 1 and a larger batch, alternating the two runtimes in one process.

MODELS_DIR is the onnx wheel's zoo (three of its models, data/light, at batch 1 and 32;
written by scripts/onnx_node_tests.py) or any folder of NAME/model.onnx, such as
scripts/torchvision_export.py's (every model in it, at batch 1 and 8). A batch comes from the
same model with its input's first dimension set and a reshape's leading 1 (the batch the
model was exported with) set to -1, for both runtimes.

usage: python scripts/onnx_bench.py [MODELS_DIR] [NAME ...]   (default target/onnx-models);
       needs kiln (pip install ./python) and scripts/onnx-requirements.txt
"""

import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import kiln
from compare_table import machine

MODELS = ["squeezenet", "resnet50", "densenet121"]


def with_batch(path, batch):
    model = onnx.load(path)
    inits = {t.name: t for t in model.graph.initializer}
    data = next(i for i in model.graph.input if i.name not in inits)
    data.type.tensor_type.shape.dim[0].dim_value = batch
    for output in model.graph.output:
        output.type.tensor_type.shape.dim[0].dim_value = batch
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] in inits:
            shape = numpy_helper.to_array(inits[node.input[1]]).copy()
            if shape[0] == 1:
                shape[0] = -1
                inits[node.input[1]].CopyFrom(numpy_helper.from_array(shape, node.input[1]))
    out = os.path.join(tempfile.mkdtemp(), f"batch{batch}.onnx")
    onnx.save(model, out)
    return out, data


def timed(f, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name, models_dir, batches):
    rows = []
    for batch, runs in batches:
        path, info = with_batch(os.path.join(models_dir, name, "model.onnx"), batch)
        shape = [d.dim_value for d in info.type.tensor_type.shape.dim]
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        start = time.perf_counter()
        model = kiln.onnx.load(path)
        kiln_load = time.perf_counter() - start
        start = time.perf_counter()
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        ort_load = time.perf_counter() - start
        feed = {info.name: x}
        ours, theirs = model(x)[0], session.run(None, feed)[0]
        agree = np.allclose(ours, theirs, rtol=1e-3, atol=1e-5)
        for _ in range(2):  # warm both
            model(x), session.run(None, feed)
        k, o = [], []
        for _ in range(3):  # alternate, three rounds
            k.append(timed(lambda: model(x), runs))
            o.append(timed(lambda: session.run(None, feed), runs))
        rows.append((name, batch, kiln_load, ort_load, min(k), min(o), agree))
    return rows


def main():
    models_dir = sys.argv[1] if len(sys.argv) > 1 else "target/onnx-models"
    names = sys.argv[2:]
    zoo = all(os.path.exists(os.path.join(models_dir, m, "model.onnx")) for m in MODELS)
    if not names:
        names = MODELS if zoo else sorted(
            m for m in os.listdir(models_dir)
            if os.path.exists(os.path.join(models_dir, m, "model.onnx")))
    batches = ((1, 20), (32, 5)) if zoo else ((1, 20), (8, 5))
    print(f"onnxruntime {ort.__version__}, onnx {onnx.__version__}; {machine()}")
    print("| model | batch | load Kiln | load onnxruntime | latency Kiln | latency onnxruntime | ratio | outputs agree |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for name, batch, kl, ol, k, o, agree in bench(name, models_dir, batches):
            print(f"| {name} | {batch} | {kl * 1e3:.0f} ms | {ol * 1e3:.0f} ms | {k * 1e3:.2f} ms "
                  f"| {o * 1e3:.2f} ms | {o / k:.2f}x | {'yes' if agree else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
