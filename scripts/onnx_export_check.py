#!/usr/bin/env python3
"""ONNX export checked by its real consumers (issue 54).

For each FILE.kir:FUNC[:CHECKPOINT] given, `kiln export` writes the function as an ONNX model;
`onnx.checker.check_model(full_check=True)` must accept it, and onnxruntime's outputs must
equal Kiln's own (`kiln run --interpret`, the reference interpreter) within 1e-5 at batch 1
and batch 7 of the same exported file (symbolic sizes are dynamic axes).

With --node-cases DIR (written by `KILN_ONNX_EXPORT_DIR=DIR cargo test -p kiln-onnx --test
node_tests`), every exported node case is checked the same way and run by onnxruntime to its
expected outputs.

    python3 scripts/onnx_export_check.py kiln-out/predict.kir:predict:kiln-out/parameters.safetensors
    python3 scripts/onnx_export_check.py --node-cases target/onnx-export
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

TOLERANCE = 1e-5


def random_input(info, batch, rng):
    """Random values for a graph input: floats in [-2, 2], integers in [0, 4), bools."""
    tensor = info.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else batch for d in tensor.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
    if dtype == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        return np.asarray(rng.integers(0, 4, size=shape), dtype)
    return np.asarray(rng.uniform(-2, 2, size=shape), dtype)


def check_close(what, got, expected, rtol, atol):
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise AssertionError(f"{what}: {got.dtype}{list(got.shape)} where "
                             f"{expected.dtype}{list(expected.shape)} was expected")
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=what)


def session(path):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def kiln_run(kiln, spec_file, func, checkpoint, feeds, work):
    """The interpreter's results for `feeds` (name -> array), in result order."""
    command = [kiln, "run", spec_file, "--func", func, "--interpret", "--out", str(work)]
    if checkpoint:
        command += ["--state", checkpoint]
    for name, value in feeds.items():
        path = work / f"feed_{name}.npy"
        np.save(path, value)
        command += ["--feed", f"{name}={path}"]
    printed = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return [np.load(p) for p in re.findall(r"written to (\S+)", printed)]


def check_program(kiln, spec, work, opset=None):
    file, func, *rest = spec.split(":")
    checkpoint = rest[0] if rest else None
    model_path = work / f"{pathlib.Path(file).stem}-{func}.onnx"
    command = [kiln, "export", file, "--func", func, "-o", str(model_path)]
    if opset:
        command += ["--opset", str(opset)]
    if checkpoint:
        command += ["--state", checkpoint]
    subprocess.run(command, check=True, capture_output=True)
    model = onnx.load(str(model_path))
    onnx.checker.check_model(model, full_check=True)
    runner = session(model_path)
    rng = np.random.default_rng(0)
    for batch in (1, 7):
        feeds = {i.name: random_input(i, batch, rng) for i in model.graph.input}
        expected = kiln_run(kiln, file, func, checkpoint, feeds, work)
        got = runner.run(None, feeds)
        for k, (g, e) in enumerate(zip(got, expected)):
            check_close(f"{spec} at batch {batch}, output {k}", g, e, TOLERANCE, TOLERANCE)
    print(f"{spec}: checker passes; onnxruntime equals kiln at batch 1 and 7")


def check_node_case(case):
    model = onnx.load(str(case / "model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    data = case / "test_data_set_0"
    read = lambda kind: [numpy_helper.to_array(onnx.load_tensor(str(p)))
                         for p in sorted(data.glob(f"{kind}_*.pb"),
                                         key=lambda p: int(p.stem.split("_")[1]))]
    inputs, expected = read("input"), read("output")
    feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
    got = session(case / "model.onnx").run(None, feeds)
    for k, (g, e) in enumerate(zip(got, expected)):
        check_close(f"output {k}", np.asarray(g), e, 1e-3, 1e-5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="*", help="FILE.kir:FUNC[:CHECKPOINT]")
    parser.add_argument("--node-cases", type=pathlib.Path, help="exported node cases")
    parser.add_argument("--kiln", default="target/release/kiln", help="the kiln binary")
    parser.add_argument("--opset", type=int, help="the opset to export the programs at")
    args = parser.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.programs:
            try:
                check_program(args.kiln, spec, pathlib.Path(tmp), args.opset)
            except Exception as e:  # report every failure, then fail
                failures.append(f"{spec}: {e}")
    if args.node_cases:
        cases = sorted(p for p in args.node_cases.iterdir() if (p / "model.onnx").is_file())
        passed = 0
        for case in cases:
            try:
                check_node_case(case)
                passed += 1
            except Exception as e:
                failures.append(f"{case.name}: {type(e).__name__}: {str(e)[:300]}")
        print(f"exported node cases in onnxruntime: {passed} pass, {len(cases) - passed} fail")
        if not cases:
            failures.append(f"no exported cases in {args.node_cases}")
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
