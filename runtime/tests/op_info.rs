//! Every op in every mode, from one table (the OpInfo idea): each case is one op with its
//! inputs and attributes, written once as builder code, and run four ways — the reference
//! interpreter, a static program in a compiled `Session`, eager tensors, and a `to_static`
//! trace — with values and gradients compared. A coverage test fails when an op of the op
//! table has no case, so a new op cannot ship untested in one mode.

use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{
    AllReduceOp, AxisSlice, BinaryOp, BuildResult, CompareOp, Conv2dAttrs, ConvKind, DType,
    FunctionBuilder, Module, Op, Pool2dAttrs, PoolKind, ReduceOp, Shape, Type, UnaryOp, Value,
};
use kiln_runtime::eager::{self, Tensor, compose};
use kiln_runtime::{Fetch, Program, Session};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeSet;

type Build = Box<dyn Fn(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>>;

struct Case {
    name: String,
    inputs: Vec<Array>,
    build: Build,
    /// Whether gradients are compared (float inputs and outputs, differentiable).
    grad: bool,
    /// Whether values are compared (random ops draw per run).
    values: bool,
}

fn case(
    name: impl Into<String>,
    inputs: Vec<Array>,
    grad: bool,
    build: impl Fn(&mut FunctionBuilder, &[Value]) -> BuildResult<Value> + 'static,
) -> Case {
    Case {
        name: name.into(),
        inputs,
        build: Box::new(build),
        grad,
        values: true,
    }
}

/// Distinct values in [-1.5, 1.5) (no ties, none near an integer boundary of rounding ops).
fn f(shape: &[usize], seed: u64) -> Array {
    let n: usize = shape.iter().product();
    let v = (0..n)
        .map(|i| (((i as u64 * 7919 + seed * 104_729) % 997) as f32 / 997.0) * 3.0 - 1.5 + 0.013)
        .collect();
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v).unwrap())
}

fn positive(shape: &[usize], seed: u64) -> Array {
    let Array::F32(a) = f(shape, seed) else {
        unreachable!()
    };
    Array::F32(a.mapv(|v| v.abs() + 0.25))
}

fn f64_of(a: Array) -> Array {
    a.cast(DType::F64)
}

fn bools(shape: &[usize], seed: u64) -> Array {
    let Array::F32(a) = f(shape, seed) else {
        unreachable!()
    };
    Array::Bool(a.mapv(|v| v > 0.0))
}

fn i64s(shape: &[usize], values: &[i64]) -> Array {
    Array::I64(ArrayD::from_shape_vec(IxDyn(shape), values.to_vec()).unwrap())
}

fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for &op in UnaryOp::ALL {
        let input = match op {
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => positive(&[2, 3], 1),
            UnaryOp::Not => bools(&[2, 3], 1),
            _ => f(&[2, 3], 1),
        };
        let grad = op != UnaryOp::Not;
        cases.push(case(op.name(), vec![input], grad, move |b, v| {
            b.unary(op, v[0])
        }));
    }
    for &op in BinaryOp::ALL {
        let (a, c) = match op {
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => (bools(&[2, 3], 2), bools(&[3], 3)),
            BinaryOp::Div => (f(&[2, 3], 2), positive(&[3], 3)),
            BinaryOp::Pow => (positive(&[2, 3], 2), f(&[3], 3)),
            _ => (f(&[2, 3], 2), f(&[3], 3)),
        };
        let grad = a.dtype() == DType::F32;
        cases.push(case(op.name(), vec![a, c], grad, move |b, v| {
            b.binary(op, v[0], v[1])
        }));
    }
    for &op in CompareOp::ALL {
        cases.push(case(
            op.name(),
            vec![f(&[2, 3], 4), f(&[2, 3], 5)],
            false,
            move |b, v| b.compare(op, v[0], v[1]),
        ));
    }
    cases.extend([
        case("const", vec![f(&[3], 6)], true, |b, v| {
            let c = b.scalar(DType::F32, 0.5)?;
            b.mul(v[0], c)
        }),
        case(
            "select",
            vec![bools(&[2, 3], 7), f(&[2, 3], 8), f(&[2, 3], 9)],
            true,
            |b, v| b.select(v[0], v[1], v[2]),
        ),
        // One rank (no communicator): the operands come back. Several ranks: tests/distributed.rs.
        case("all_reduce_sum", vec![f(&[2, 3], 40)], true, |b, v| {
            Ok(b.all_reduce(AllReduceOp::Sum, &[v[0]])?[0])
        }),
        case("all_reduce_mean", vec![f(&[2, 3], 41)], true, |b, v| {
            Ok(b.all_reduce(AllReduceOp::Mean, &[v[0]])?[0])
        }),
        case("reduce_scatter_sum", vec![f(&[2, 3], 43)], false, |b, v| {
            Ok(b.reduce_scatter(AllReduceOp::Sum, &[v[0]], 1)?[0])
        }),
        case(
            "reduce_scatter_mean",
            vec![f(&[2, 3], 44)],
            false,
            |b, v| Ok(b.reduce_scatter(AllReduceOp::Mean, &[v[0]], 1)?[0]),
        ),
        case("all_gather", vec![f(&[2, 3], 45)], false, |b, v| {
            Ok(b.all_gather(&[v[0]], 1)?[0])
        }),
        case("shard", vec![f(&[2, 3], 46)], false, |b, v| {
            Ok(b.shard(&[v[0]], 1)?[0])
        }),
        case("collective_broadcast", vec![f(&[3], 42)], false, |b, v| {
            Ok(b.collective_broadcast(&[v[0]], 0)?[0])
        }),
        case("cast", vec![f(&[2, 3], 10)], true, |b, v| {
            b.cast(v[0], DType::F64)
        }),
        case("broadcast", vec![f(&[3], 11)], true, |b, v| {
            b.broadcast_to(v[0], &Shape::fixed(&[2, 3]))
        }),
        case("reshape", vec![f(&[2, 3], 12)], true, |b, v| {
            b.reshape(v[0], Shape::fixed(&[3, 2]))
        }),
        case("transpose", vec![f(&[2, 3, 4], 13)], true, |b, v| {
            b.transpose(v[0], vec![2, 0, 1])
        }),
        case("slice", vec![f(&[4, 5], 14)], true, |b, v| {
            let r = AxisSlice::Range {
                start: 1,
                end: 5,
                step: 2,
            };
            b.slice(v[0], vec![AxisSlice::Full, r])
        }),
        case("pad", vec![f(&[2, 3], 15)], true, |b, v| {
            b.pad(v[0], vec![1, 0], vec![0, 2], vec![0, 1])
        }),
        case(
            "concat",
            vec![f(&[2, 3], 16), f(&[1, 3], 17)],
            true,
            |b, v| b.concat(&[v[0], v[1]], 0),
        ),
        case(
            "matmul",
            vec![f(&[2, 4, 3], 18), f(&[3, 5], 19)],
            true,
            |b, v| b.matmul(v[0], v[1]),
        ),
        case(
            "matmul (transposed)",
            vec![f(&[4, 3], 20), f(&[5, 4], 21)],
            true,
            |b, v| b.matmul_t(v[0], v[1], true, true),
        ),
        case(
            "matmul_acc",
            vec![f(&[4, 3], 20), f(&[5, 4], 21), f(&[3, 5], 28)],
            true,
            |b, v| {
                let op = Op::MatMulAcc {
                    transpose_a: true,
                    transpose_b: true,
                    scale: kiln_ir::F64Attr(-0.5),
                };
                Ok(b.insert(op, &[v[0], v[1], v[2]])?[0])
            },
        ),
        case(
            "gather",
            vec![f(&[4, 3], 22), i64s(&[2, 2], &[3, 0, 1, 3])],
            true,
            |b, v| b.gather(v[0], v[1], 0),
        ),
        case(
            "update_slice",
            vec![f(&[4, 3], 26), f(&[3], 27), i64s(&[], &[2])],
            true,
            |b, v| b.update_slice(v[0], v[1], v[2], 0),
        ),
        case(
            "scatter_add",
            vec![f(&[3, 2], 23), i64s(&[3], &[1, 0, 1])],
            true,
            |b, v| b.scatter_add(v[0], v[1], 0, Shape::fixed(&[2, 2])),
        ),
        case("one_hot", vec![i64s(&[3], &[2, 0, 1])], false, |b, v| {
            b.one_hot(v[0], 3, DType::F32)
        }),
        case("iota", vec![], false, |b, _| {
            b.iota(Type::new(DType::F32, Shape::fixed(&[2, 3])), 1)
        }),
    ]);
    for &op in ReduceOp::ALL {
        cases.push(case(
            op.name(),
            vec![f(&[2, 3, 4], 24)],
            true,
            move |b, v| b.reduce(op, v[0], vec![0, 2], false),
        ));
    }
    for op in [kiln_ir::ArgOp::ArgMax, kiln_ir::ArgOp::ArgMin] {
        cases.push(case(op.name(), vec![f(&[3, 4], 25)], false, move |b, v| {
            b.arg_reduce(op, v[0], 1, false)
        }));
    }
    let ty = Type::new(DType::F32, Shape::fixed(&[2, 3]));
    for (name, normal) in [("random_uniform", false), ("random_normal", true)] {
        let ty = ty.clone();
        let mut random = case(name, vec![], false, move |b, _| match normal {
            true => b.random_normal(ty.clone(), 0.0, 1.0, 5),
            false => b.random_uniform(ty.clone(), 0.0, 1.0, 5),
        });
        random.values = false;
        cases.push(random);
    }
    let conv = Conv2dAttrs {
        strides: [2, 1],
        padding: [(1, 1), (0, 1)],
        dilation: [1, 2],
        groups: 2,
        channels_last: false,
    };
    let pool = Pool2dAttrs {
        window: [2, 3],
        strides: [2, 1],
        padding: [(1, 0), (1, 1)],
        channels_last: false,
    };
    let (x, w, y) = ([2, 4, 5, 6], [6, 2, 3, 2], [2, 6, 3, 5]);
    let halves = Pool2dAttrs::new([2, 2], [2, 2]);
    let px = [2, 2, 4, 5];
    let py = [2, 2, 2, 5];
    cases.extend([
        case("conv2d", vec![f(&x, 26), f(&w, 27)], true, move |b, v| {
            b.conv2d(v[0], v[1], conv)
        }),
        case(
            "conv2d (f64)",
            vec![f64_of(f(&x, 26)), f64_of(f(&w, 27))],
            true,
            move |b, v| b.conv2d(v[0], v[1], conv),
        ),
        // One input channel (a first layer on grey images): NCHW is channels last already,
        // which the executor uses as it is; the gradients run both transposes on it.
        case(
            "conv2d (one channel)",
            vec![f(&[2, 1, 5, 6], 34), f(&[3, 1, 3, 3], 35)],
            true,
            move |b, v| {
                let same = Conv2dAttrs {
                    padding: [(1, 1), (1, 1)],
                    ..Conv2dAttrs::default()
                };
                b.conv2d(v[0], v[1], same)
            },
        ),
        case(
            "conv2d_input_grad",
            vec![f(&y, 28), f(&w, 27)],
            true,
            move |b, v| b.conv(ConvKind::InputGrad { input: [5, 6] }, conv, v[0], v[1]),
        ),
        case(
            "conv2d_filter_grad",
            vec![f(&x, 26), f(&y, 28)],
            true,
            move |b, v| b.conv(ConvKind::FilterGrad { kernel: [3, 2] }, conv, v[0], v[1]),
        ),
        case("max_pool2d", vec![f(&px, 29)], true, move |b, v| {
            b.max_pool2d(v[0], pool)
        }),
        case("avg_pool2d", vec![f(&px, 30)], true, move |b, v| {
            b.avg_pool2d(v[0], pool)
        }),
        // 2×2 windows that tile the input: the executor's row-pair loops, on one thread and
        // (32,768 elements) split across threads in tasks of several planes.
        case(
            "max_pool2d",
            vec![f(&[2, 3, 4, 6], 32)],
            true,
            move |b, v| b.max_pool2d(v[0], halves),
        ),
        case(
            "max_pool2d_grad",
            vec![f(&[2, 3, 4, 6], 32), f(&[2, 3, 2, 3], 33)],
            false,
            move |b, v| b.pool(PoolKind::MaxGrad, halves, &[v[0], v[1]]),
        ),
        case(
            "max_pool2d",
            vec![f(&[4, 8, 32, 32], 36)],
            true,
            move |b, v| b.max_pool2d(v[0], halves),
        ),
        case(
            "max_pool2d_grad",
            vec![f(&[4, 8, 32, 32], 36), f(&[4, 8, 16, 16], 37)],
            false,
            move |b, v| b.pool(PoolKind::MaxGrad, halves, &[v[0], v[1]]),
        ),
        case(
            "max_pool2d_grad",
            vec![f(&px, 29), f(&py, 31)],
            false,
            move |b, v| b.pool(PoolKind::MaxGrad, pool, &[v[0], v[1]]),
        ),
        case("avg_pool2d_grad", vec![f(&py, 31)], true, move |b, v| {
            b.pool(PoolKind::AvgGrad { input: [4, 5] }, pool, &[v[0]])
        }),
    ]);
    cases
}

/// Ops with no case here, and why.
const ELSEWHERE: &[(&str, &str)] = &[
    ("load", "state: runtime/tests/session.rs and eager.rs"),
    ("store", "state: runtime/tests/session.rs and eager.rs"),
    (
        "cond",
        "regions: the cond cases of runtime/tests/equivalence.rs",
    ),
    (
        "while",
        "regions: the while case of runtime/tests/equivalence.rs",
    ),
    ("fused", "made by the fusion pass: tests/compiled.rs"),
    (
        "call",
        "custom ops: the custom_op case of runtime/tests/equivalence.rs",
    ),
    ("send", "needs a peer rank: tests/distributed.rs"),
    ("recv", "needs a peer rank: tests/distributed.rs"),
];

#[track_caller]
fn assert_close(what: &str, got: &Array, want: &Array) {
    assert_eq!(got.ty(), want.ty(), "{what}: types");
    // f64 is held to f64's precision, not f32's.
    let tol = if got.dtype() == DType::F64 {
        1e-9
    } else {
        2e-5
    };
    for (i, (g, w)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        let close = (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan());
        assert!(close, "{what}: element {i} is {g}, expected {w}");
    }
}

fn typed_args(b: &mut FunctionBuilder, inputs: &[Array]) -> Vec<Value> {
    (inputs.iter().enumerate())
        .map(|(i, a)| b.arg(&format!("a{i}"), a.ty()))
        .collect()
}

/// The loss `sum(op(inputs) · w)` with fixed weights, so every output element matters.
fn weighted(b: &mut FunctionBuilder, out: Value) -> BuildResult<Value> {
    let ty = b.value_type(out).clone();
    let n = ty.shape.num_elements().unwrap_or(1);
    let w: Vec<f64> = (0..n).map(|i| 0.5 + (i % 7) as f64 * 0.25).collect();
    let w = b.constant(kiln_ir::Literal::F64(w), ty.with_dtype(DType::F64))?;
    let w = b.cast(w, ty.dtype)?;
    let y = b.mul(out, w)?;
    let axes = (0..ty.rank()).collect();
    b.reduce(ReduceOp::Sum, y, axes, false)
}

/// Every step of the session's compiled runs is native code, but for the documented
/// fallbacks (`kiln_backend::exec::INTERPRETER_KERNELS`): a compiled result that silently
/// came from the interpreter would make "compiled against interpreter" the interpreter
/// against itself.
#[track_caller]
fn assert_native(session: &Session, case: &str) {
    for (op, how) in session.fallbacks() {
        assert!(
            kiln_backend::exec::expected_fallback(op, how),
            "{case}: `{op}` ran as {how:?} in a compiled session; if that is intended, list it \
             in INTERPRETER_KERNELS with hand-computed cases in backend/tests/interp_ops.rs"
        );
    }
}

fn run_case(c: &Case) {
    // The interpreter: the oracle.
    let mut b = FunctionBuilder::new("f");
    let args = typed_args(&mut b, &c.inputs);
    let out = (c.build)(&mut b, &args).unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let func = b.finish(&[out]).unwrap();
    let mut module = Module::new();
    module.add_function(func);
    let want = Interpreter::new(&module)
        .run("f", c.inputs.clone(), &mut StateStore::new())
        .unwrap()
        .remove(0);

    // A static program in a compiled session.
    let mut p = Program::new();
    let placeholders: Vec<Value> = (c.inputs.iter().enumerate())
        .map(|(i, a)| {
            p.placeholder(&format!("a{i}"), a.dtype(), a.ty().shape)
                .unwrap()
        })
        .collect();
    let out = (c.build)(&mut p, &placeholders).unwrap();
    let loss = c.grad.then(|| weighted(&mut p, out).unwrap());
    let names: Vec<String> = (0..c.inputs.len()).map(|i| format!("a{i}")).collect();
    let feeds: Vec<(&str, Array)> = names
        .iter()
        .map(String::as_str)
        .zip(c.inputs.clone())
        .collect();
    let mut session = Session::new(&p).unwrap();
    let compiled = session.run(&[Fetch::Value(out)], &feeds).unwrap().remove(0);
    assert_native(&session, &c.name);

    // Eager tensors, and a trace of the same code.
    eager::reset();
    let float = |a: &Array| a.dtype().is_float() && c.grad;
    let tensors: Vec<Tensor> = (c.inputs.iter())
        .map(|a| match float(a) {
            true => Tensor::new(a.clone()).requires_grad().unwrap(),
            false => Tensor::new(a.clone()),
        })
        .collect();
    let refs: Vec<&Tensor> = tensors.iter().collect();
    let eager_out = compose(&refs, |b, v| (c.build)(b, v)).unwrap();
    let types: Vec<(&str, Type)> = names
        .iter()
        .map(String::as_str)
        .zip(c.inputs.iter().map(Array::ty))
        .collect();
    let mut traced = eager::to_static(&types, |t| {
        let refs: Vec<&Tensor> = t.iter().collect();
        let out = compose(&refs, |b, v| (c.build)(b, v))?;
        match c.grad {
            true => Ok(vec![
                out.clone(),
                compose(&[&out], |b, v| weighted(b, v[0]))?,
            ]),
            false => Ok(vec![out]),
        }
    })
    .unwrap();
    let traced_out = traced.call(&refs).unwrap().remove(0);

    for (mode, got) in [
        ("compiled", &compiled),
        ("eager", &eager_out.to_array().unwrap()),
        ("traced", &traced_out.to_array().unwrap()),
    ] {
        if c.values {
            assert_close(&format!("{} {mode}", c.name), got, &want);
        } else {
            assert_eq!(got.ty(), want.ty(), "{} {mode}", c.name);
        }
    }
    let Some(loss) = loss else { return };

    // Gradients: eager backward, the static program's gradient ops compiled, and the trace's.
    compose(&[&eager_out], |b, v| weighted(b, v[0]))
        .unwrap()
        .backward()
        .unwrap();
    let float_inputs: Vec<usize> = (0..c.inputs.len())
        .filter(|&i| float(&c.inputs[i]))
        .collect();
    let wrt: Vec<Value> = float_inputs.iter().map(|&i| placeholders[i]).collect();
    let grads = p.gradients(loss, &wrt).unwrap();
    let mut session = Session::new(&p).unwrap();
    let fetches: Vec<Fetch> = grads.iter().map(|&g| Fetch::Value(g)).collect();
    let static_grads = session.run(&fetches, &feeds).unwrap();
    assert_native(&session, &format!("{} (gradients)", c.name));
    let (_, traced_grads) = traced.gradients(&refs, 1).unwrap();
    for (k, &i) in float_inputs.iter().enumerate() {
        let eager_grad = tensors[i].grad().unwrap().to_array().unwrap();
        let traced_grad = traced_grads.inputs[i].as_ref().unwrap().to_array().unwrap();
        let what = format!("{} gradient of input {i}", c.name);
        assert_close(
            &format!("{what}, static vs eager"),
            &static_grads[k],
            &eager_grad,
        );
        assert_close(
            &format!("{what}, traced vs eager"),
            &traced_grad,
            &eager_grad,
        );
    }
}

#[test]
fn every_op_agrees_in_every_mode() {
    for c in cases() {
        run_case(&c);
    }
}

#[test]
fn every_op_of_the_op_table_has_a_case() {
    let mut covered = BTreeSet::new();
    for c in cases() {
        let mut b = FunctionBuilder::new("f");
        let args = typed_args(&mut b, &c.inputs);
        let out = (c.build)(&mut b, &args).unwrap();
        let func = b.finish(&[out]).unwrap();
        covered.extend(func.walk_insts().iter().map(|&i| func.inst(i).op.name()));
    }
    let exempt: BTreeSet<&str> = ELSEWHERE.iter().map(|(name, _)| *name).collect();
    let missing: Vec<&str> = Op::all_names()
        .into_iter()
        .filter(|name| !covered.contains(name) && !exempt.contains(name))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a case in op_info.rs: {missing:?}"
    );
}
