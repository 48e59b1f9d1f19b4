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
#        (a copy in target/checklist-layer; about 2 minutes once `python/target` holds a build)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WS="$ROOT/target/checklist-layer/ws"
: "${PYO3_PYTHON:?set PYO3_PYTHON to the Python the bindings build against}"
# The bindings' own build directory (clippy's in CI): the copy's crates build beside the
# originals and reuse every dependency already checked there.
export CARGO_TARGET_DIR="$ROOT/python/target"

rm -rf "$WS" && mkdir -p "$WS"
(cd "$ROOT" && git ls-files -z -- Cargo.toml Cargo.lock ir backend passes runtime onnx src benches examples tests data python \
  | xargs -0 cp --parents -t "$WS")
cd "$WS"

# Inserts `text` after `anchor` (which must occur once) in `file`.
patch() {
  python3 - "$@" <<'EOF'
import sys
file, anchor, text = sys.argv[1:4]
s = open(file).read()
if s.count(anchor) != 1:
    sys.exit(f"checklist: the anchor in {file} is gone or not unique: {anchor!r}")
open(file, "w").write(s.replace(anchor, anchor + text))
EOF
}

# Checks the bindings; the files the errors are in must be exactly the expected ones (none: it
# builds).
expect_errors() {
  local got
  got=$(cargo check --offline --manifest-path python/Cargo.toml --message-format short 2>&1 \
    | grep -oE '^[a-z_/]+\.rs:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u | tr '\n' ' ' || true)
  local want=""
  [ $# -gt 0 ] && want=$(printf '%s\n' "$@" | sort -u | tr '\n' ' ')
  if [ "$got" != "$want" ]; then
    echo "checklist: after '$STEP' the compiler named [${got}], the checklist [${want}]"
    exit 1
  fi
  echo "checklist: after '$STEP' the compiler names [${got}]"
}

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
