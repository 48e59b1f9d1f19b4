"""Exports torchvision's architectures (random weights, eval mode) to ONNX for
scripts/onnx_bench.py, each as OUT_DIR/NAME/model.onnx with a dynamic batch axis: the
networks people deploy on CPUs, covering depthwise convolutions with squeeze-excitation
(MobileNet, EfficientNet), grouped convolutions (RegNet, ShuffleNet), 7×7 depthwise with
layer norm (ConvNeXt), plain residual networks and a vision transformer.

usage: python scripts/torchvision_export.py OUT_DIR [NAME ...]   (OUT_DIR: target/onnx-tv)
       needs torch and torchvision (PyPI) and scripts/onnx-requirements.txt
"""

import os
import sys
import warnings

import torch
import torchvision

MODELS = [
    "mobilenet_v2",
    "mobilenet_v3_small",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "mnasnet1_0",
    "regnet_y_400mf",
    "shufflenet_v2_x1_0",
    "resnet18",
    "convnext_tiny",
    "vit_b_16",
]


def export(name, out_dir):
    path = os.path.join(out_dir, name, "model.onnx")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                          opset_version=17)
    return path


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "target/onnx-tv"
    for name in sys.argv[2:] or MODELS:
        print(export(name, out_dir), flush=True)


if __name__ == "__main__":
    main()
