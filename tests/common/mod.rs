//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub(crate) mod random_programs;

use kiln::backend::{Array, Interpreter, StateStore};
use kiln::ir::{Module, parse_module, verify_module};
use ndarray::{ArrayD, IxDyn};
use std::path::{Path, PathBuf};

pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the `kiln` tool from the repository's root, as a user runs it.
pub(crate) fn kiln(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("the kiln binary runs")
}

/// Reads, parses and verifies a corpus program, failing the test with the rendered error.
pub(crate) fn load(path: &Path) -> Module {
    let source = std::fs::read_to_string(path).unwrap();
    let module = parse_module(&source).unwrap_or_else(|e| panic!("{}", e.render(&source)));
    if let Err(e) = verify_module(&module) {
        panic!("{}", e.render_source(&source));
    }
    module
}

pub(crate) fn program(name: &str) -> Module {
    load(&root().join("tests/programs").join(name))
}

pub(crate) fn f32s(shape: &[usize], data: &[f64]) -> Array {
    let values = data.iter().map(|&x| x as f32).collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

pub(crate) fn f64s(shape: &[usize], data: &[f64]) -> Array {
    Array::F64(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

pub(crate) fn i64s(shape: &[usize], data: &[i64]) -> Array {
    Array::I64(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

pub(crate) fn i32s(shape: &[usize], data: &[i32]) -> Array {
    Array::I32(ArrayD::from_shape_vec(IxDyn(shape), data.to_vec()).unwrap())
}

pub(crate) fn run(
    module: &Module,
    func: &str,
    args: Vec<Array>,
    state: &mut StateStore,
) -> Vec<Array> {
    Interpreter::new(module)
        .run(func, args, state)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Deterministic pseudo-random test data in [-1, 1).
pub(crate) fn data(n: usize, seed: u64) -> Vec<f64> {
    let s = kiln::backend::random::Stream::new(seed, 0);
    (0..n as u64).map(|i| s.uniform(i, -1.0, 1.0)).collect()
}

/// Asserts `got` equals `want` elementwise within `tol` (absolute + relative).
#[track_caller]
pub(crate) fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(
            ok,
            "element {i}: got {g}, want {w} (tol {tol})\n got: {got:?}\nwant: {want:?}"
        );
    }
}
