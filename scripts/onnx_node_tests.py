"""Writes the ONNX backend node tests of the installed `onnx` wheel to a folder, in ONNX's own
layout: NAME/model.onnx, NAME/test_data_set_0/{input,output}_I.pb, plus NAME/meta.json with the
case's tolerances and op types. The wheel ships no data files for these cases; this generates
them from `onnx.backend.test.case.node.collect_testcases()`.

usage: python scripts/onnx_node_tests.py OUT_DIR
"""

import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


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


if __name__ == "__main__":
    main(sys.argv[1])
