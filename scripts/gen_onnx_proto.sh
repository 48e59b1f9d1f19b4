#!/usr/bin/env bash
# Regenerates onnx/src/proto.rs from the vendored onnx/proto/onnx.proto (copied from the pinned
# onnx wheel) with protox and prost-build: no protoc, and nothing of this runs in a normal build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release --locked --quiet --manifest-path onnx/codegen/Cargo.toml \
    --target-dir target/onnx-codegen
echo "wrote onnx/src/proto.rs"
