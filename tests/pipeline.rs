//! The optimisation pipeline over real programs: every corpus program, gradient functions,
//! and the training steps of the examples. For each, the IR after every pass is snapshotted,
//! and the interpreter's results (and state updates) before and after the pipeline agree on
//! random inputs. Random programs go through the pipeline with the bit-exact rules and must
//! give identical bits.

mod common;

use common::random_programs::{Gen, random_module};
use kiln::backend::{Array, CustomOpError, CustomOps, Interpreter, StateStore};
use kiln::ir::{DType, Module, parse_module, verify_module};
use kiln::passes::Pass;
use kiln::passes::manager::{PassManager, dump_header};
use kiln::passes::{Wrt, gradient_function};
use proptest::prelude::*;

/// Random arguments for `module`'s function `name`: symbols are 3, floats in [-1, 1),
/// integers in [0, 3) (valid labels, token ids and small loop counts), booleans either way.
fn arguments(module: &Module, name: &str, seed: u64) -> Vec<Array> {
    let func = module.function(name).unwrap();
    let mut g = Gen::new(seed);
    func.arg_types()
        .map(|t| {
            let dims: Vec<usize> = t
                .shape
                .dims()
                .iter()
                .map(|d| d.as_fixed().unwrap_or(3))
                .collect();
            let n: usize = dims.iter().product();
            let values: Vec<f64> = (0..n)
                .map(|_| match t.dtype {
                    DType::F32 | DType::F64 => g.below(2000) as f64 / 1000.0 - 1.0,
                    DType::Bool => g.below(2) as f64,
                    _ => g.below(3) as f64,
                })
                .collect();
            Array::F64(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&dims), values).unwrap())
                .cast(t.dtype)
        })
        .collect()
}

/// Runs every function of `module` (before and after the default pipeline) on the same
/// inputs and state; results and final state must agree within float rounding.
fn assert_pipeline_agrees(label: &str, module: &Module) -> String {
    let mut optimised = module.clone();
    let mut dumps = String::new();
    PassManager::pipeline("default")
        .unwrap()
        .verify_each(true)
        .run_with(&mut optimised, |report, m| {
            dumps.push_str(&dump_header(report.pass));
            dumps.push('\n');
            dumps.push_str(&m.to_string());
        })
        .unwrap_or_else(|e| panic!("{label}: {e}"));
    let reparsed = parse_module(&optimised.to_string()).unwrap();
    assert!(
        reparsed == optimised,
        "{label}: the optimised module round-trips"
    );
    for func in &module.functions {
        for seed in 0..2 {
            let args = arguments(module, func.name(), seed);
            let mut before_state = StateStore::initialize(module).unwrap();
            let mut after_state = before_state.clone();
            let before = Interpreter::new(module)
                .run(func.name(), args.clone(), &mut before_state)
                .unwrap();
            let after = Interpreter::new(&optimised)
                .run(func.name(), args, &mut after_state)
                .unwrap();
            let pairs = before.iter().zip(&after).chain(
                before_state
                    .iter()
                    .map(|(n, v)| (v, after_state.get(n).unwrap())),
            );
            for (b, a) in pairs {
                assert_eq!(b.ty(), a.ty(), "{label}/@{}", func.name());
                for (x, y) in b.to_f64_vec().iter().zip(a.to_f64_vec()) {
                    let close =
                        (x - y).abs() <= 1e-5 * (1.0 + x.abs()) || (x.is_nan() && y.is_nan());
                    assert!(
                        close,
                        "{label}/@{}: {x} before the pipeline, {y} after\n{dumps}",
                        func.name()
                    );
                }
            }
        }
    }
    dumps
}

#[test]
fn corpus_programs_keep_their_results_and_snapshot_every_pass() {
    insta::glob!("programs/*.kir", |path| {
        let module = common::load(path);
        let dumps = assert_pipeline_agrees(&path.display().to_string(), &module);
        insta::assert_snapshot!(dumps);
    });
}

fn with_function(states: &Module, func: kiln::ir::Function) -> Module {
    let module = Module {
        states: states.states.clone(),
        functions: vec![func],
    };
    verify_module(&module).unwrap();
    module
}

#[test]
fn gradient_functions_keep_their_results() {
    let cases: [(&str, &str, &[&str]); 4] = [
        ("softmax_xent.kir", "loss", &["logits"]),
        (
            "layer_norm.kir",
            "layer_norm_loss",
            &["x", "@ln.gamma", "@ln.beta"],
        ),
        ("sgd_step.kir", "train_step", &["x", "@w"]),
        ("control_flow.kir", "clip_by_norm_loss", &["g"]),
    ];
    for (file, func, wrt) in cases {
        let mut module = common::program(file);
        // Functions with non-scalar results get a scalar loss: the sum of their first result.
        if module.function(func).is_none() {
            let base = func.trim_end_matches("_loss");
            let f = module.function(base).unwrap().clone();
            let mut b = kiln::ir::FunctionBuilder::resume(f);
            let out = b.function().results()[0];
            let rank = b.value_type(out).rank();
            let total = b
                .reduce(kiln::ir::ReduceOp::Sum, out, (0..rank).collect(), false)
                .unwrap();
            let mut f = b.finish(&[total]).unwrap();
            f.set_name(func);
            module.add_function(f);
        }
        let wrt: Vec<Wrt> = wrt.iter().map(|w| w.parse().unwrap()).collect();
        let grad = gradient_function(&module, module.function(func).unwrap(), 0, &wrt).unwrap();
        let label = format!("{file}:{func}_grad");
        let dumps = assert_pipeline_agrees(&label, &with_function(&module, grad));
        insta::assert_snapshot!(format!("gradient_{}", func), dumps);
    }
}

#[test]
fn training_steps_of_the_examples_keep_their_results() {
    use kiln::demos::{digits_static, gan_1d};
    let config = digits_static::Config {
        hidden: 16,
        ..Default::default()
    };
    let digits = digits_static::build(&config, digits_static::DIGITS_IMAGE).unwrap();
    let step = digits
        .program
        .export("train_step", &[digits.loss], &[digits.train]);
    let dumps = assert_pipeline_agrees(
        "digits train step",
        &with_function(digits.program.module(), step),
    );
    insta::assert_snapshot!("digits_train_step", dumps);

    let gan = gan_1d::build(&gan_1d::Config::default()).unwrap();
    for (name, loss, target) in [
        ("gan_d_step", gan.d_loss, gan.d_train),
        ("gan_g_step", gan.g_loss, gan.g_train),
    ] {
        let step = gan.program.export(name, &[loss], &[target]);
        let dumps = assert_pipeline_agrees(name, &with_function(gan.program.module(), step));
        insta::assert_snapshot!(name, dumps);
    }
}

struct Identity;

impl CustomOps for Identity {
    fn call(&self, _: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        Ok(vec![args[0].clone()])
    }
}

/// The passes whose results are bit-identical: everything, with only the exact rules.
fn exact_pipeline() -> Vec<Box<dyn Pass>> {
    use kiln::passes::{Canonicalize, ConstantFold, Cse, Dce, Fuse, Simplify, simplify};
    vec![
        Box::new(Canonicalize),
        Box::new(ConstantFold),
        Box::new(Cse),
        Box::new(Simplify::with_rules(simplify::rules::exact())),
        Box::new(Dce),
        Box::new(Fuse::default()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn random_programs_give_identical_bits_after_the_exact_pipeline(seed in any::<u64>(), size in 1usize..30) {
        let module = random_module(seed, size);
        let mut optimised = module.clone();
        let mut manager = PassManager::new().verify_each(true);
        for pass in exact_pipeline() {
            manager = manager.with_pass(pass);
        }
        if let Err(e) = manager.run(&mut optimised) {
            return Err(TestCaseError::fail(format!("{e}\n{module}")));
        }
        let mut g = Gen::new(seed ^ 0x77);
        for func in &module.functions {
            let (n, m) = (g.below(4), g.below(4));
            let args: Vec<Array> = func
                .arg_types()
                .map(|t| {
                    let dims: Vec<usize> = t.shape.dims().iter().map(|d| d.as_fixed().unwrap_or(if d.to_string() == "N" { n } else { m })).collect();
                    let count: usize = dims.iter().product();
                    let values: Vec<f64> = (0..count).map(|_| g.below(9) as f64 - 4.0).collect();
                    Array::F64(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&dims), values).unwrap()).cast(t.dtype)
                })
                .collect();
            let mut s1 = StateStore::initialize(&module).unwrap();
            let mut s2 = s1.clone();
            let Ok(before) = Interpreter::new(&module).with_custom_ops(&Identity).run(func.name(), args.clone(), &mut s1) else {
                continue;
            };
            let after = Interpreter::new(&optimised).with_custom_ops(&Identity).run(func.name(), args, &mut s2);
            let after = after.map_err(|e| TestCaseError::fail(format!("{e}\nbefore:\n{module}\nafter:\n{optimised}")))?;
            let same = |a: &Array, b: &Array| a.ty() == b.ty() && a.to_f64_vec().iter().zip(b.to_f64_vec()).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
            for (b, a) in before.iter().zip(&after) {
                prop_assert!(same(b, a), "@{}: {b} vs {a}\nbefore:\n{module}\nafter:\n{optimised}", func.name());
            }
            for (name, value) in s1.iter() {
                prop_assert!(same(value, s2.get(name).unwrap()), "state @{name}");
            }
        }
    }
}
