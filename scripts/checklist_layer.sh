#!/usr/bin/env bash
# The proof that the book's "Adding a layer" checklist (docs/src/contributing/adding-a-layer.md)
# is true for its native steps: a throwaway functional layer, `softsign` (x / (1 + |x|)), added
# to a copy of the workspace by the checklist's steps. After each step the compiler must name
# exactly the files the next step fills: the row in the layer table is a compile error in every
# Python dispatcher until each says what it does with the kind. The Python steps are proved by
# `python/tests/test_layer_table.py`, which fails while a form the table lists has no Python
# caller, or a caller names a kind the table lacks.
#
# usage: PYO3_PYTHON=<a venv's python> scripts/checklist_layer.sh
#        (a copy in target/checklist-layer; about a minute, once `python/target` holds a build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WS="$ROOT/target/checklist-layer/ws"
: "${PYO3_PYTHON:?set PYO3_PYTHON to the Python the bindings build against}"
# The workspace's build directory (where CI's clippy checked the bindings; python/Cargo.lock
# pins the workspace's versions): the copy's crates build beside the originals and reuse every
# dependency already checked there.
export CARGO_TARGET_DIR="$ROOT/target"

# shellcheck source=checklist_lib.sh
source "$ROOT/scripts/checklist_lib.sh"
CHECK=(cargo check --offline --manifest-path python/Cargo.toml)
copy_workspace Cargo.toml Cargo.lock ir backend passes runtime onnx src benches examples tests data python
separate_artifacts python/Cargo.toml kiln-ir kiln-backend kiln-passes kiln-runtime kiln-onnx kiln kiln-python

STEP="2. the row in the layer table"
patch runtime/src/layer_kind.rs '    Gelu = "gelu": [Functional];' '
    /// x / (1 + |x|).
    Softsign = "softsign": [Functional];'
expect_errors src/eager.rs src/graph.rs

STEP="3. each dispatcher's arm: the form it has, and the forms it lacks"
patch python/src/eager.rs '        LayerKind::Gelu => arity(1).map(|_| t[0].gelu())?,' '
        LayerKind::Softsign => arity(1).map(|_| {
            let denominator = t[0].unary(UnaryOp::Abs)?.binary_scalar(BinaryOp::Add, 1.0)?;
            t[0].binary(BinaryOp::Div, &denominator)
        })?,'
patch python/src/eager.rs '        LayerKind::Gelu => return Err(layer_kind_error(kind.no_form(LayerForm::Eager))),' '
        LayerKind::Softsign => return Err(layer_kind_error(kind.no_form(LayerForm::Eager))),'
patch python/src/graph.rs '                | LayerKind::Gelu' '
                | LayerKind::Softsign'
expect_errors

echo "checklist: a new layer by the checklist alone builds in every dispatcher"
