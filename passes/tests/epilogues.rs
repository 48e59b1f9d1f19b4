//! `order_epilogues`: the reshapes, loads and constants between a convolution and the kernel
//! that reads its output move to before the convolution (IR text in, IR text out), nothing
//! else moves, and the interpreter gives the same results, bit for bit.

mod common;

use common::ramp;
use kiln_backend::{Interpreter, StateStore};
use kiln_ir::{Module, parse_and_verify};
use kiln_passes::PassManager;

const CONV_BIAS: &str = "module {
  state @w : f32[4,1,3,3] = uniform(low=-1.0, high=1.0, seed=3)
  state @b : f32[4] = uniform(low=-1.0, high=1.0, seed=4)
  func @f(%x: f32[2,1,6,6]) -> f32[2,4,6,6] {
    %w = load @w : f32[4,1,3,3]
    %c = conv2d %x, %w {strides=[1, 1], padding=[(1, 1), (1, 1)], dilation=[1, 1], groups=1} : f32[2,4,6,6]
    %b = load @b : f32[4]
    %b4 = reshape %b : f32[1,4,1,1]
    %zero = const 0.0 : f32[2,4,6,6]
    %bb = broadcast %b4 : f32[2,4,6,6]
    %z = add %c, %bb : f32[2,4,6,6]
    %h = max %z, %zero : f32[2,4,6,6]
    return %h
  }
}";

/// The names of `@f`'s body instructions' results, in order.
fn order(module: &Module) -> Vec<String> {
    let text = module.to_string();
    (text.lines())
        .filter_map(|l| l.trim().strip_prefix('%'))
        .filter_map(|l| l.split(" = ").next())
        .map(str::to_owned)
        .collect()
}

fn run(module: &Module) -> Vec<kiln_backend::Array> {
    let mut state = StateStore::initialize(module).unwrap();
    Interpreter::new(module)
        .run("f", vec![ramp(&[2, 1, 6, 6], 0.3)], &mut state)
        .unwrap()
}

#[test]
fn a_biass_load_reshape_and_constant_move_before_the_convolution() {
    let before = parse_and_verify(CONV_BIAS).unwrap();
    let after = common::optimised(CONV_BIAS, &["order_epilogues"]);
    // The run stops at the broadcast, the first instruction after the convolution that is
    // none of the three kinds.
    assert_eq!(
        order(&after),
        ["w", "b", "b4", "zero", "c", "bb", "z", "h"],
        "{after}"
    );
    assert_eq!(run(&before), run(&after));
}

#[test]
fn nothing_that_reads_the_convolution_moves() {
    let reads = CONV_BIAS.replace(
        "%b4 = reshape %b : f32[1,4,1,1]",
        "%b4 = reshape %b : f32[1,4,1,1]\n    %flat = reshape %c : f32[2,144]",
    );
    let reads = reads
        .replace("return %h", "return %h, %flat")
        .replace("-> f32[2,4,6,6] {", "-> (f32[2,4,6,6], f32[2,144]) {");
    let after = common::optimised(&reads, &["order_epilogues"]);
    assert_eq!(
        order(&after),
        ["w", "b", "b4", "c", "flat", "zero", "bb", "z", "h"],
        "{after}"
    );
}

#[test]
fn the_pass_counts_and_explains_what_it_moved() {
    let mut module = parse_and_verify(CONV_BIAS).unwrap();
    let reports = PassManager::from_names(&["order_epilogues"])
        .unwrap()
        .explain(true)
        .run(&mut module)
        .unwrap();
    assert_eq!(
        reports[0]
            .stats
            .get("instructions moved before convolutions"),
        Some("3")
    );
    let explained = reports[0].explanations.concat();
    assert!(
        explained.contains("`%b = load @b : f32[4]`, `%b4 = reshape %b : f32[1,4,1,1]`"),
        "{explained}"
    );
    assert!(
        explained.contains("moved before `%c = conv2d"),
        "{explained}"
    );
}
