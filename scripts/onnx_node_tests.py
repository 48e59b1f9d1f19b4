"""Writes the ONNX backend node tests of the installed `onnx` wheel to a folder, in ONNX's own
layout: NAME/model.onnx, NAME/test_data_set_0/{input,output}_I.pb, plus NAME/meta.json with the
case's tolerances and op types. The wheel ships no data files for these cases; this generates
them from `onnx.backend.test.case.node.collect_testcases()`.

It also writes the wheel's `data/light` models (resnet50, squeezenet, vgg19, ...) to
OUT_DIR/../onnx-models/NAME in the same layout, with the input ONNX's runner feeds them
(`generate_dummy_data(random=False)`) and the expected output the wheel ships.

usage: python scripts/onnx_node_tests.py OUT_DIR
"""

import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.model import collect_testcases as collect_model_testcases
from onnx.backend.test.case.node import collect_testcases
from onnx.backend.test.runner import Runner


def tensor(value, name):
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return numpy_helper.from_array(np.asarray(value), name)
    return None  # sequences, maps, optionals: not Kiln tensors


def main(out):
    warnings.simplefilter("ignore")
    cases = [c for c in collect_testcases(None) if c.kind == "node"]
    written = 0
    for case in cases:
        folder = os.path.join(out, case.name)
        os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
        with open(os.path.join(folder, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        graph = case.model.graph
        tensors_only = True
        for kind, values, infos in (("input", inputs, graph.input), ("output", outputs, graph.output)):
            for i, value in enumerate(values):
                name = infos[i].name if i < len(infos) else f"{kind}_{i}"
                t = tensor(value, name)
                if t is None:
                    tensors_only = False
                    continue
                path = os.path.join(folder, "test_data_set_0", f"{kind}_{i}.pb")
                with open(path, "wb") as f:
                    f.write(t.SerializeToString())
        meta = {
            "rtol": case.rtol,
            "atol": case.atol,
            "op_types": sorted({n.op_type for n in graph.node}),
            "tensors_only": tensors_only,
            "onnx": onnx.__version__,
        }
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f)
        written += 1
    print(f"wrote {written} node test cases (onnx {onnx.__version__}) to {out}")


def light_models(out):
    data = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    written = []
    for case in collect_model_testcases():
        if not (case.url or "").startswith("onnx/backend/test/data/light/"):
            continue
        name = case.model_name
        model = onnx.load(os.path.join(data, f"light_{name}.onnx"))
        folder = os.path.join(out, name)
        os.makedirs(os.path.join(folder, "test_data_set_0"), exist_ok=True)
        onnx.save(model, os.path.join(folder, "model.onnx"))
        inits = {i.name for i in model.graph.initializer}
        inputs = [x for x in model.graph.input if x.name not in inits]
        for i, x in enumerate(inputs):
            value = Runner.generate_dummy_data(x, seed=0, name=name, random=False)
            with open(os.path.join(folder, "test_data_set_0", f"input_{i}.pb"), "wb") as f:
                f.write(numpy_helper.from_array(value).SerializeToString())
        with open(os.path.join(data, f"light_{name}_output_0.pb"), "rb") as src:
            expected = src.read()
        with open(os.path.join(folder, "test_data_set_0", "output_0.pb"), "wb") as f:
            f.write(expected)
        meta = {"rtol": case.rtol, "atol": case.atol, "onnx": onnx.__version__}
        with open(os.path.join(folder, "meta.json"), "w") as f:
            json.dump(meta, f)
        written.append(name)
    print(f"wrote {len(written)} models ({', '.join(written)}) to {out}")


if __name__ == "__main__":
    main(sys.argv[1])
    light_models(os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "onnx-models"))
