//! Properties of the text form and of the interpreter over random input:
//! - every random well-typed module verifies, prints, parses back equal, and prints the same;
//! - the interpreter returns `Ok` or `Err` on every verified program, never panics;
//! - random text and mutated programs get `Ok` or `Err` from the parser, never a panic, and
//!   whatever parses and verifies round-trips.

mod common;

use common::random_programs::{Gen, random_module};
use kiln::backend::{Array, CustomOpError, CustomOps, Interpreter, StateStore};
use kiln::ir::{DType, Module, parse_and_verify, parse_module, verify_module};
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

fn assert_round_trip(module: &Module) -> Result<(), TestCaseError> {
    let text = module.to_string();
    let parsed = parse_module(&text).map_err(|e| TestCaseError::fail(e.render(&text)))?;
    prop_assert!(parsed == *module, "parse(print(m)) != m for\n{text}");
    prop_assert_eq!(parsed.to_string(), text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn random_modules_verify_and_round_trip(seed in any::<u64>(), size in 1usize..40) {
        let module = random_module(seed, size);
        if let Err(e) = verify_module(&module) {
            return Err(TestCaseError::fail(e.render(&module)));
        }
        assert_round_trip(&module)?;
    }

    #[test]
    fn the_interpreter_never_panics_on_verified_programs(seed in any::<u64>(), size in 1usize..30) {
        let module = random_module(seed, size);
        let mut g = Gen::new(seed ^ 0xa5a5);
        let mut state = StateStore::initialize(&module).unwrap();
        for func in &module.functions {
            let n = g.below(4);
            let m = g.below(4);
            let args: Vec<Array> = func
                .arg_types()
                .map(|t| {
                    let dims: Vec<usize> = t
                        .shape
                        .dims()
                        .iter()
                        .map(|d| d.as_fixed().unwrap_or(if d.to_string() == "N" { n } else { m }))
                        .collect();
                    random_array(&mut g, t.dtype, &dims)
                })
                .collect();
            let result = Interpreter::new(&module)
                .with_custom_ops(&Identity)
                .run_function(func, args, &mut state);
            if let Ok(results) = result {
                prop_assert_eq!(results.len(), func.result_types().len());
            }
        }
    }

    #[test]
    fn random_text_never_panics_the_parser(text in "\\PC{0,200}") {
        let _ = parse_and_verify(&text);
    }

    #[test]
    fn mutated_programs_parse_or_fail_cleanly(which in 0usize..7, seed in any::<u64>(), edits in 1usize..6) {
        let text = mutate(&corpus()[which], seed, edits);
        if let Ok(module) = parse_and_verify(&text) {
            assert_round_trip(&module)?;
        }
    }
}

struct Identity;

impl CustomOps for Identity {
    fn call(&self, _: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        Ok(vec![args[0].clone()])
    }
}

fn random_array(g: &mut Gen, dtype: DType, dims: &[usize]) -> Array {
    let n: usize = dims.iter().product();
    let values: Vec<f64> = (0..n).map(|_| g.below(9) as f64 - 4.0).collect();
    Array::F64(ArrayD::from_shape_vec(IxDyn(dims), values).unwrap()).cast(dtype)
}

fn corpus() -> Vec<String> {
    let mut files: Vec<_> = std::fs::read_dir(common::root().join("tests/programs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

/// Applies `edits` random edits: delete a span, insert a token, duplicate or drop a line.
fn mutate(text: &str, seed: u64, edits: usize) -> String {
    const TOKENS: &[&str] = &[
        "%x",
        "%0",
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        ":",
        ",",
        "=",
        "->",
        "@w",
        "f32[N]",
        "i64[]",
        "-",
        "1e999",
        "nan",
        "-inf",
        "\"",
        "@\"",
        "cond",
        "while",
        "yield",
        "return",
        "then",
        "body",
        "0:1:0",
        "{axes=[9]}",
        "\n",
        "const",
        "[[",
        "99999999999999999999",
        "%",
    ];
    let mut g = Gen::new(seed);
    let mut chars: Vec<char> = text.chars().collect();
    for _ in 0..edits {
        let at = g.below(chars.len() + 1);
        match g.below(4) {
            0 => {
                let end = (at + 1 + g.below(8)).min(chars.len());
                chars.drain(at.min(end)..end);
            }
            1 => {
                let token = g.pick(TOKENS);
                chars.splice(at..at, format!(" {token} ").chars());
            }
            _ => {
                let mut lines: Vec<String> = chars
                    .iter()
                    .collect::<String>()
                    .lines()
                    .map(str::to_owned)
                    .collect();
                if lines.is_empty() {
                    continue;
                }
                let i = g.below(lines.len());
                if g.chance(50) {
                    let line = lines[i].clone();
                    lines.insert(i, line);
                } else {
                    lines.remove(i);
                }
                chars = lines.join("\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}
