//! Soundness of every rewrite rule: a program containing the rule's left-hand side is
//! simplified with that rule alone (preferring rewritten forms, so the right-hand side is what
//! runs), and both programs are evaluated by the interpreter on random inputs, broadcasting
//! shapes included. The rule must fire, change the program, and agree within rounding.

use kiln_backend::random::Stream;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{
    AxisSlice, BinaryOp, BuildResult, CompareOp, DType, FunctionBuilder, Literal, Module, Op,
    ReduceOp, Shape, Type, UnaryOp, Value, verify_module,
};
use kiln_passes::Pass;
use kiln_passes::simplify::{Simplify, rules};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeSet;

type Build = fn(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>;

/// A program for a rule: argument shapes (f32), and the body.
struct Case {
    rule: &'static str,
    shapes: &'static [&'static [usize]],
    /// Arguments must be positive (for square roots).
    positive: bool,
    build: Build,
}

const fn case(rule: &'static str, shapes: &'static [&'static [usize]], build: Build) -> Case {
    Case {
        rule,
        shapes,
        positive: false,
        build,
    }
}

fn splat(b: &mut FunctionBuilder, like: Value, v: f64) -> BuildResult<Value> {
    let ty = b.value_type(like).clone();
    b.constant(Literal::F32(vec![v as f32]), ty)
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        // algebra
        case("add-zero", &[&[2, 3]], |b, a| {
            let z = b.scalar(DType::F32, 0.0)?;
            b.add(a[0], z)
        }),
        case("zero-add", &[&[2, 3]], |b, a| {
            let z = splat(b, a[0], 0.0)?;
            b.add(z, a[0])
        }),
        case("sub-zero", &[&[3]], |b, a| {
            let z = splat(b, a[0], 0.0)?;
            b.sub(a[0], z)
        }),
        case("mul-one", &[&[2, 3]], |b, a| {
            let o = b.scalar(DType::F32, 1.0)?;
            b.mul(a[0], o)
        }),
        case("one-mul", &[&[4]], |b, a| {
            let o = splat(b, a[0], 1.0)?;
            b.mul(o, a[0])
        }),
        case("div-one", &[&[4]], |b, a| {
            let o = splat(b, a[0], 1.0)?;
            b.div(a[0], o)
        }),
        case("neg-neg", &[&[2, 2]], |b, a| {
            let n = b.neg(a[0])?;
            b.neg(n)
        }),
        case("add-neg", &[&[2, 3], &[2, 3]], |b, a| {
            let n = b.neg(a[1])?;
            b.add(a[0], n)
        }),
        case("sub-neg", &[&[3], &[3]], |b, a| {
            let n = b.neg(a[1])?;
            b.sub(a[0], n)
        }),
        case("neg-sub", &[&[3], &[3]], |b, a| {
            let d = b.sub(a[0], a[1])?;
            b.neg(d)
        }),
        case("neg-mul-neg", &[&[2, 3], &[2, 3]], |b, a| {
            let (x, y) = (b.neg(a[0])?, b.neg(a[1])?);
            b.mul(x, y)
        }),
        case("mul-recip", &[&[3], &[3]], |b, a| {
            let r = b.unary(UnaryOp::Recip, a[1])?;
            b.mul(a[0], r)
        }),
        case("not-eq", &[&[3], &[3]], |b, a| {
            let e = b.compare(CompareOp::Eq, a[0], a[1])?;
            b.unary(UnaryOp::Not, e)
        }),
        case("not-ne", &[&[3], &[3]], |b, a| {
            let e = b.compare(CompareOp::Ne, a[0], a[1])?;
            b.unary(UnaryOp::Not, e)
        }),
        case("select-same", &[&[3], &[3]], |b, a| {
            let c = b.compare(CompareOp::Gt, a[0], a[1])?;
            b.select(c, a[1], a[1])
        }),
        case("max-self", &[&[2, 2]], |b, a| {
            b.binary(BinaryOp::Max, a[0], a[0])
        }),
        case("min-self", &[&[2, 2]], |b, a| {
            b.binary(BinaryOp::Min, a[0], a[0])
        }),
        case("add-comm", &[&[3], &[3]], |b, a| b.add(a[0], a[1])),
        case("mul-comm", &[&[3], &[3]], |b, a| b.mul(a[0], a[1])),
        case("factor-add", &[&[2, 3], &[2, 3], &[2, 3]], |b, a| {
            let (p, q) = (b.mul(a[0], a[1])?, b.mul(a[0], a[2])?);
            b.add(p, q)
        }),
        case("factor-sub", &[&[3], &[3], &[3]], |b, a| {
            let (p, q) = (b.mul(a[0], a[1])?, b.mul(a[0], a[2])?);
            b.sub(p, q)
        }),
        case("div-div", &[&[3], &[3], &[3]], |b, a| {
            let q = b.div(a[0], a[1])?;
            b.div(q, a[2])
        }),
        case("recip-exp", &[&[2, 3]], |b, a| {
            let e = b.exp(a[0])?;
            b.unary(UnaryOp::Recip, e)
        }),
        // layout
        case("transpose-transpose", &[&[2, 3, 4]], |b, a| {
            let t = b.transpose(a[0], vec![1, 2, 0])?;
            b.transpose(t, vec![2, 0, 1])
        }),
        case("transpose-identity", &[&[2, 3]], |b, a| {
            b.insert1(Op::Transpose { perm: vec![0, 1] }, &[a[0]])
        }),
        case("reshape-reshape", &[&[2, 6]], |b, a| {
            let r = b.reshape(a[0], Shape::fixed(&[3, 4]))?;
            b.reshape(r, Shape::fixed(&[12]))
        }),
        case("broadcast-broadcast", &[&[3]], |b, a| {
            let x = b.broadcast_to(a[0], &Shape::fixed(&[2, 3]))?;
            b.broadcast_to(x, &Shape::fixed(&[4, 2, 3]))
        }),
        case("layout-identity", &[&[2, 3]], |b, a| {
            b.insert1(
                Op::Reshape {
                    shape: Shape::fixed(&[2, 3]),
                },
                &[a[0]],
            )
        }),
        case("slice-whole", &[&[2, 3]], |b, a| {
            b.slice(a[0], vec![AxisSlice::Full, AxisSlice::Full])
        }),
        case("reshape-of-broadcast-scalar", &[&[]], |b, a| {
            let x = b.broadcast_to(a[0], &Shape::fixed(&[2, 3]))?;
            b.reshape(x, Shape::fixed(&[6]))
        }),
        // broadcasts
        case("unary-of-broadcast", &[&[3]], |b, a| {
            let x = b.broadcast_to(a[0], &Shape::fixed(&[4, 3]))?;
            b.exp(x)
        }),
        case("binary-of-broadcasts", &[&[3], &[3]], |b, a| {
            let s = Shape::fixed(&[2, 3]);
            let (x, y) = (b.broadcast_to(a[0], &s)?, b.broadcast_to(a[1], &s)?);
            b.mul(x, y)
        }),
        case("binary-broadcast-splat", &[&[3]], |b, a| {
            let x = b.broadcast_to(a[0], &Shape::fixed(&[2, 3]))?;
            let two = b.scalar(DType::F32, 2.0)?;
            b.mul(x, two)
        }),
        case("broadcast-splat", &[&[2, 3]], |b, a| {
            let c = b.constant(
                Literal::F32(vec![0.5]),
                Type::new(DType::F32, Shape::fixed(&[3])),
            )?;
            let spread = b.broadcast_to(c, &Shape::fixed(&[2, 3]))?;
            b.mul(a[0], spread)
        }),
        case("reduce-neg", &[&[2, 3]], |b, a| {
            let n = b.neg(a[0])?;
            b.reduce(ReduceOp::Sum, n, vec![1], false)
        }),
        case("div-broadcast", &[&[2, 3], &[3]], |b, a| {
            let c = b.broadcast_to(a[1], &Shape::fixed(&[2, 3]))?;
            b.div(a[0], c)
        }),
        // matmul
        case("matmul-transposed-a", &[&[4, 3], &[4, 5]], |b, a| {
            let t = b.transpose(a[0], vec![1, 0])?;
            b.matmul(t, a[1])
        }),
        case("matmul-transposed-b", &[&[3, 4], &[5, 4]], |b, a| {
            let t = b.transpose(a[1], vec![1, 0])?;
            b.matmul(a[0], t)
        }),
        case("transpose-of-matmul", &[&[2, 3, 4], &[4, 5]], |b, a| {
            let m = b.matmul(a[0], a[1])?;
            b.transpose(m, vec![0, 2, 1])
        }),
    ];
    let positive: [(&'static str, Build); 2] = [
        ("recip-sqrt", |b, a| {
            let s = b.sqrt(a[0])?;
            b.unary(UnaryOp::Recip, s)
        }),
        ("div-sqrt", |b, a| {
            let s = b.sqrt(a[1])?;
            b.div(a[0], s)
        }),
    ];
    for (rule, build) in positive {
        cases.push(Case {
            rule,
            shapes: &[&[2, 3], &[2, 3]],
            positive: true,
            build,
        });
    }
    cases
}

fn random_input(shape: &[usize], seed: u64, positive: bool) -> Array {
    let s = Stream::new(seed, 0);
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n as u64)
        .map(|i| {
            if positive {
                s.uniform(i, 0.2, 2.0) as f32
            } else {
                s.uniform(i, -2.0, 2.0) as f32
            }
        })
        .collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

fn run(module: &Module, inputs: &[Array]) -> Vec<f64> {
    Interpreter::new(module)
        .run("f", inputs.to_vec(), &mut StateStore::new())
        .unwrap()
        .remove(0)
        .to_f64_vec()
}

#[test]
fn every_rule_is_sound_on_random_inputs() {
    for case in cases() {
        let mut b = FunctionBuilder::new("f");
        let args: Vec<Value> = case
            .shapes
            .iter()
            .enumerate()
            .map(|(i, s)| b.arg(&format!("x{i}"), Type::new(DType::F32, Shape::fixed(s))))
            .collect();
        let out = (case.build)(&mut b, &args).unwrap();
        let mut before = Module::new();
        before.add_function(b.finish(&[out]).unwrap());
        let mut after = before.clone();
        let mut pass = Simplify::only(&[case.rule]);
        pass.keep_input_on_ties = false;
        let stats = pass.run(&mut after).unwrap();
        let applied = stats.get("rules applied").unwrap_or_default();
        assert!(
            applied.contains(&format!("{}×", case.rule)),
            "{}: the rule did not fire ({applied})\n{before}",
            case.rule
        );
        assert!(
            after != before,
            "{}: the program did not change\n{before}",
            case.rule
        );
        if let Err(e) = verify_module(&after) {
            panic!(
                "{}: the result does not verify:\n{}",
                case.rule,
                e.render(&after)
            );
        }
        for seed in 0..3 {
            let inputs: Vec<Array> = case
                .shapes
                .iter()
                .enumerate()
                .map(|(i, s)| random_input(s, 100 * seed + i as u64, case.positive))
                .collect();
            let (want, got) = (run(&before, &inputs), run(&after, &inputs));
            for (w, g) in want.iter().zip(&got) {
                assert!(
                    (w - g).abs() <= 1e-5 * (1.0 + w.abs()),
                    "{}: {w} before, {g} after\nbefore:\n{before}\nafter:\n{after}",
                    case.rule
                );
            }
        }
    }
}

#[test]
fn every_rule_has_a_soundness_case_and_a_unique_name() {
    let names: Vec<String> = rules::all().iter().map(|r| r.name.to_string()).collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate rule names");
    let tested: BTreeSet<String> = cases().iter().map(|c| c.rule.to_owned()).collect();
    let untested: Vec<&String> = names.iter().filter(|n| !tested.contains(*n)).collect();
    assert!(
        untested.is_empty(),
        "rules without a soundness case: {untested:?}"
    );
    for name in rules::ROUNDING {
        assert!(
            names.iter().any(|n| n == name),
            "ROUNDING names an unknown rule {name}"
        );
    }
}

/// A region past `max_region_insts` is left as it is, and the statistics say so: an e-graph
/// of a million instructions takes longer than any user waits (BENCHMARKS.md, thresholds).
#[test]
fn regions_too_large_for_the_egraph_are_left_as_they_are() {
    let mut b = FunctionBuilder::new("f");
    let x = b.arg("x", Type::new(DType::F32, Shape::fixed(&[4])));
    let zero = splat(&mut b, x, 0.0).unwrap();
    let sum = b.binary(BinaryOp::Add, x, zero).unwrap();
    let mut module = Module::new();
    module.add_function(b.finish(&[sum]).unwrap());
    let insts = module.functions[0]
        .region(module.functions[0].body())
        .insts
        .len();

    let mut small_enough = Simplify::default();
    small_enough.max_region_insts = insts;
    let mut simplified = module.clone();
    let stats = small_enough.run(&mut simplified).unwrap();
    assert_ne!(simplified, module, "x + 0 was not simplified");
    assert_eq!(stats.get("regions too large, left as they are"), None);

    let mut too_large = Simplify::default();
    too_large.max_region_insts = insts - 1;
    too_large.set_explain(true);
    let mut untouched = module.clone();
    let stats = too_large.run(&mut untouched).unwrap();
    assert_eq!(untouched, module);
    assert_eq!(stats.get("regions too large, left as they are"), Some("1"));
    let explained = too_large.take_explanations().concat();
    assert!(explained.contains("is left as it is"), "{explained}");
}
