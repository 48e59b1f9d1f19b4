//! Helpers the pass tests share: a program through some passes, and deterministic inputs.

#![allow(dead_code)] // each test file uses some of them

use kiln_backend::Array;
use kiln_ir::{Module, parse_and_verify, verify_module};
use kiln_passes::PassManager;
use ndarray::{ArrayD, IxDyn};

/// `input` (IR text) through `passes`, verified after each.
#[track_caller]
pub(crate) fn optimised(input: &str, passes: &[&str]) -> Module {
    let mut module = parse_and_verify(input).unwrap_or_else(|e| panic!("{}", e.render(input)));
    PassManager::from_names(passes)
        .unwrap()
        .verify_each(true)
        .run(&mut module)
        .unwrap();
    verify_module(&module).unwrap();
    module
}

/// An f32 array of `shape` with small, varied values.
pub(crate) fn ramp(shape: &[usize], scale: f32) -> Array {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) * scale)
        .collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}
