#!/usr/bin/env bash
# The proof that the checklist at the top of `ir/src/op.rs` is true (issue 25): a throwaway
# unary op, `cube` (x³), added to a copy of the workspace step by step as the checklist says.
# After each step the compiler must name exactly the places the next step fills — a place
# forgotten is a compile error, never a panic at run time — and at the end the op's kernels
# match the interpreter on every path (the JIT differential tests iterate the op table) and
# its gradient matches finite differences.
#
# usage: scripts/checklist_op.sh   (a copy in target/checklist; about 4 minutes after `cargo test`)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WS="$ROOT/target/checklist/ws"
# The workspace's own build directory: the copy's crates build beside the originals (their paths
# differ, so do their hashes) and reuse every dependency the tests have built.
export CARGO_TARGET_DIR="$ROOT/target"

# shellcheck source=checklist_lib.sh
source "$ROOT/scripts/checklist_lib.sh"
# Type checking names the same errors as a build, without code generation; the two test
# binaries the last step runs are the only ones built.
CHECK=(cargo check --offline -p kiln-backend -p kiln-passes --tests)
copy_workspace Cargo.toml Cargo.lock ir backend passes runtime onnx src benches examples tests data
separate_artifacts Cargo.toml kiln-ir kiln-backend kiln-passes kiln-runtime kiln-onnx kiln

STEP="1. the row in the table"
patch ir/src/op.rs '                Neg = "neg", neg, Numeric, Cheap, F32x4, None;' '
                Cube = "cube", cube, Float, Cheap, F32x4, None;'
expect_errors backend/src/interp/kernels.rs backend/src/jit/bodies.rs \
  backend/src/jit/codegen/elementwise.rs

STEP="2. the interpreter's scalar function; 4. the f32 body (and no integer code)"
patch backend/src/interp/kernels.rs '        UnaryOp::Neg => |x| -x,' '
        UnaryOp::Cube => |x| x * x * x,'
patch backend/src/jit/bodies.rs '        UnaryOp::Neg => l.neg(x),' '
        UnaryOp::Cube => {
            let square = l.mul(x, x);
            l.mul(square, x)
        }'
patch backend/src/jit/codegen/elementwise.rs '                UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sqrt' '
                | UnaryOp::Cube'
expect_errors passes/src/autodiff/rules.rs

STEP="3. the gradient rule"
patch passes/src/autodiff/rules.rs '        UnaryOp::Neg => b.neg(g)?,' '
        // d x³ = 3x²
        UnaryOp::Cube => {
            let square = b.mul(x, x)?;
            let three = scalar(b, x, 3.0)?;
            let slope = b.mul(square, three)?;
            b.mul(g, slope)?
        }'
expect_errors passes/tests/grad_check.rs

STEP="5. the tests: its domain in the gradient check"
patch passes/tests/grad_check.rs '                UnaryOp::Neg
                | UnaryOp::Abs' '
                | UnaryOp::Cube'
expect_errors

# Runs `cargo test` with the arguments after `count`; at least `count` tests must have run and
# passed (a renamed test must not turn this into a run of nothing).
expect_passed() {
  local count=$1 out
  shift
  out=$(cargo test --offline "$@" 2>&1) || { echo "$out"; exit 1; }
  echo "$out" | grep -E "^test |test result"
  echo "$out" | grep -qE "test result: ok\. ([$count-9]|[1-9][0-9]+) passed" \
    || { echo "checklist: fewer than $count tests ran: $*"; exit 1; }
}

echo "checklist: the op against the interpreter (every path) and finite differences"
expect_passed 3 -p kiln-backend --test jit_ops -- unary_ops every_op_in_a_tile_program \
  every_vector_op_runs_in_a_tile_program
expect_passed 1 -p kiln-passes --test grad_check -- unary_ops
echo "checklist: a new op by the checklist alone compiles, computes and differentiates"
