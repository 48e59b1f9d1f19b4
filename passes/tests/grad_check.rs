//! Finite-difference checks of every gradient rule, in f64.
//!
//! Each check builds `loss = sum(f(inputs) * w)` with fixed random weights `w` (so every output
//! element matters), derives the gradient with the autodiff pass, runs it with the reference
//! interpreter, and compares with central differences `(loss(x+h) - loss(x-h)) / 2h`.

use kiln_backend::random::Stream;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{
    AxisSlice, BinaryOp, BuildResult, CompareOp, Conv2dAttrs, ConvKind, DType, Dim, Function,
    FunctionBuilder, Literal, Module, Pool2dAttrs, PoolKind, ReduceOp, Shape, Type, UnaryOp, Value,
    verify_module,
};
use kiln_passes::append_gradients;
use ndarray::{ArrayD, IxDyn};

/// Random values in `[lo, hi)`, with a random sign when `signed`.
fn values(n: usize, seed: u64, lo: f64, hi: f64, signed: bool) -> Vec<f64> {
    let s = Stream::new(seed, 0);
    (0..n as u64)
        .map(|i| {
            let v = s.uniform(2 * i, lo, hi);
            if signed && s.unit(2 * i + 1) < 0.5 {
                -v
            } else {
                v
            }
        })
        .collect()
}

fn array(shape: &[usize], data: Vec<f64>) -> Array {
    Array::F64(ArrayD::from_shape_vec(IxDyn(shape), data).unwrap())
}

fn input(shape: &[usize], seed: u64) -> Array {
    let n = shape.iter().product();
    array(shape, values(n, seed, 0.1, 2.0, true))
}

fn positive(shape: &[usize], seed: u64) -> Array {
    let n = shape.iter().product();
    array(shape, values(n, seed, 0.2, 2.0, false))
}

struct Check {
    module: Module,
    n_inputs: usize,
}

impl Check {
    /// Builds `loss = sum(f(args) * w)` and its gradient with respect to every float input.
    fn new(
        inputs: &[Array],
        build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
    ) -> Check {
        let mut b = FunctionBuilder::new("f");
        let args: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, a)| b.arg(&format!("x{i}"), a.ty()))
            .collect();
        let out = build(&mut b, &args).unwrap();
        let out_ty = b.value_type(out).clone();
        let n = out_ty
            .shape
            .num_elements()
            .expect("checks use static shapes");
        let w = b
            .constant(
                Literal::F64(values(n, 99, 0.5, 1.5, true)),
                out_ty.with_dtype(DType::F64),
            )
            .unwrap();
        let out64 = b.cast(out, DType::F64).unwrap();
        let weighted = b.mul(out64, w).unwrap();
        let axes = (0..out_ty.rank()).collect();
        let loss = b.reduce(ReduceOp::Sum, weighted, axes, false).unwrap();
        let mut func: Function = b.finish(&[loss]).unwrap();
        let wrt: Vec<Value> = args
            .iter()
            .copied()
            .filter(|&a| func.value_type(a).dtype.is_float())
            .collect();
        let grads = append_gradients(&mut func, loss, &wrt).unwrap();
        let mut results = vec![loss];
        results.extend(&grads);
        let body = func.body();
        func.set_region_results(body, results.clone());
        func.set_result_types(
            results
                .iter()
                .map(|&v| func.value_type(v).clone())
                .collect(),
        );
        let mut module = Module::new();
        module.add_function(func);
        if let Err(e) = verify_module(&module) {
            panic!("{}", e.render(&module));
        }
        Check {
            module,
            n_inputs: inputs.len(),
        }
    }

    fn run(&self, inputs: &[Array]) -> Vec<Array> {
        Interpreter::new(&self.module)
            .with_custom_ops(&Cube)
            .run("f", inputs.to_vec(), &mut StateStore::new())
            .unwrap()
    }

    /// Compares the derived gradient of every float input with central differences.
    #[track_caller]
    fn against_finite_differences(&self, inputs: &[Array], h: f64, tol: f64) {
        assert_eq!(inputs.len(), self.n_inputs);
        let analytic = self.run(inputs);
        let mut grad_index = 1;
        for (i, input) in inputs.iter().enumerate() {
            if !input.dtype().is_float() {
                continue;
            }
            let derived = analytic[grad_index].to_f64_vec();
            grad_index += 1;
            let base = input.to_f64_vec();
            for (j, &d) in derived.iter().enumerate() {
                let at = |delta: f64| {
                    let mut moved = base.clone();
                    moved[j] += delta;
                    let arg =
                        Array::F64(ArrayD::from_shape_vec(IxDyn(input.shape()), moved).unwrap())
                            .cast(input.dtype());
                    let mut args = inputs.to_vec();
                    args[i] = arg;
                    self.run(&args)[0].to_f64_vec()[0]
                };
                let numeric = (at(h) - at(-h)) / (2.0 * h);
                let scale = 1f64.max(d.abs()).max(numeric.abs());
                assert!(
                    (d - numeric).abs() <= tol * scale,
                    "input {i}, element {j}: derived {d}, finite difference {numeric}\n{}",
                    self.module
                );
            }
        }
    }
}

fn check(
    inputs: Vec<Array>,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) {
    Check::new(&inputs, build).against_finite_differences(&inputs, 1e-6, 1e-6);
}

#[test]
fn unary_ops() {
    let shapes: [&[usize]; 3] = [&[], &[5], &[2, 3]];
    for (k, shape) in shapes.iter().enumerate() {
        let seed = k as u64;
        // Piecewise-constant ops are checked away from their jumps.
        let n = shape.iter().product();
        let away: Vec<f64> = values(n, seed, 0.2, 0.4, true)
            .iter()
            .zip(0..)
            .map(|(v, i)| v + i as f64)
            .collect();
        for &op in UnaryOp::ALL {
            let x = match op {
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Relu
                | UnaryOp::Exp
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Softplus
                | UnaryOp::Erf
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Recip => input(shape, seed),
                UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => positive(shape, seed),
                UnaryOp::Sign | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round => {
                    array(shape, away.clone())
                }
                UnaryOp::Not => continue, // bool: never differentiated
                // Its derivative is zero by definition, which differences cannot see (tested
                // below).
                UnaryOp::StopGradient => continue,
            };
            check(vec![x], |b, a| b.unary(op, a[0]));
        }
    }
}

/// `stop_gradient` is the identity whose derivative is taken as zero: the gradient of
/// `sum(x · stop_gradient(x) · w)` is `x · w`, not `2x · w`.
#[test]
fn stop_gradient_passes_no_gradient() {
    let x = input(&[5], 3);
    let check = Check::new(std::slice::from_ref(&x), |b, a| {
        let held = b.stop_gradient(a[0])?;
        b.mul(a[0], held)
    });
    let out = check.run(std::slice::from_ref(&x));
    let w = values(5, 99, 0.5, 1.5, true);
    let want: Vec<f64> = (x.to_f64_vec().iter().zip(&w))
        .map(|(x, w)| x * w)
        .collect();
    assert_eq!(out[1].to_f64_vec(), want);
}

#[test]
fn binary_ops_with_broadcasting() {
    let pairs: [(&[usize], &[usize]); 4] = [
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[2, 1], &[1, 3]),
        (&[], &[4]),
    ];
    for (k, (sa, sb)) in pairs.iter().enumerate() {
        let seed = 10 + 2 * k as u64;
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Max,
            BinaryOp::Min,
        ] {
            check(vec![input(sa, seed), input(sb, seed + 1)], |b, a| {
                b.binary(op, a[0], a[1])
            });
        }
        check(vec![positive(sa, seed), input(sb, seed + 1)], |b, a| {
            b.binary(BinaryOp::Pow, a[0], a[1])
        });
    }
}

#[test]
fn max_and_min_split_ties() {
    let x = array(&[3], vec![1.0, 2.0, 3.0]);
    let check = Check::new(&[x.clone(), x.clone()], |b, a| {
        b.binary(BinaryOp::Max, a[0], a[1])
    });
    let out = check.run(&[x.clone(), x]);
    let (ga, gb) = (out[1].to_f64_vec(), out[2].to_f64_vec());
    assert_eq!(ga, gb, "a tie shares the gradient equally");
    assert!(ga.iter().all(|&v| v != 0.0));
}

#[test]
fn select_and_cast() {
    check(
        vec![input(&[2, 3], 1), input(&[2, 3], 2), input(&[3], 3)],
        |b, a| {
            let c = b.compare(CompareOp::Gt, a[0], a[2])?;
            b.select(c, a[0], a[1])
        },
    );
    // f32 through a cast: a linear function, so differences are exact up to f32 rounding.
    let x = Array::F32(ArrayD::from_shape_vec(IxDyn(&[4]), vec![0.5f32, -1.0, 2.0, 0.25]).unwrap());
    let c = Check::new(std::slice::from_ref(&x), |b, a| b.cast(a[0], DType::F64));
    c.against_finite_differences(&[x], 1e-2, 1e-4);
}

#[test]
fn layout_ops() {
    let x = || vec![input(&[2, 3, 4], 5)];
    check(x(), |b, a| {
        b.broadcast_to(a[0], &Shape::fixed(&[3, 2, 3, 4]))
    });
    check(vec![input(&[3, 1], 6)], |b, a| {
        b.broadcast_to(a[0], &Shape::fixed(&[2, 3, 5]))
    });
    check(x(), |b, a| b.reshape(a[0], Shape::fixed(&[4, 6])));
    check(x(), |b, a| b.transpose(a[0], vec![2, 0, 1]));
    let range = |start, end, step| AxisSlice::Range { start, end, step };
    check(x(), |b, a| {
        b.slice(a[0], vec![AxisSlice::Full, range(1, 3, 1), range(0, 4, 3)])
    });
    check(x(), |b, a| {
        b.slice(a[0], vec![range(1, 2, 1), range(0, 3, 2), range(1, 1, 1)])
    });
    check(x(), |b, a| {
        b.pad(a[0], vec![1, 0, 2], vec![0, 2, 1], vec![0, 1, 2])
    });
    check(
        vec![input(&[2, 3], 7), input(&[2, 1], 8), input(&[2, 2], 9)],
        |b, a| b.concat(a, 1),
    );
}

#[test]
fn reductions() {
    for op in ReduceOp::ALL.iter().copied() {
        for (axes, keep) in [
            (vec![0], false),
            (vec![1, 2], true),
            (vec![0, 1, 2], false),
            (vec![], false),
        ] {
            // Distinct values, so max and min have no ties.
            check(vec![input(&[2, 3, 4], 20)], |b, a| {
                b.reduce(op, a[0], axes.clone(), keep)
            });
        }
    }
    // Ties share the gradient of max equally.
    let tied = array(&[4], vec![1.0, 3.0, 3.0, 2.0]);
    let c = Check::new(std::slice::from_ref(&tied), |b, a| {
        b.reduce(ReduceOp::Max, a[0], vec![0], false)
    });
    let g = c.run(&[tied])[1].to_f64_vec();
    assert_eq!(g[0], 0.0);
    assert_eq!(g[1], g[2]);
    assert_eq!(g[3], 0.0);
}

#[test]
fn matmul_every_transpose_and_batch_broadcast() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let sa: &[usize] = if ta { &[4, 3] } else { &[3, 4] };
        let sb: &[usize] = if tb { &[5, 4] } else { &[4, 5] };
        check(vec![input(sa, 30), input(sb, 31)], |b, a| {
            b.matmul_t(a[0], a[1], ta, tb)
        });
    }
    // A weight shared by the batch: its gradient is one product of the stacked rows.
    check(vec![input(&[2, 3, 4], 32), input(&[4, 2], 33)], |b, a| {
        b.matmul(a[0], a[1])
    });
    check(
        vec![input(&[2, 2, 3, 4], 38), input(&[5, 4], 39)],
        |b, a| b.matmul_t(a[0], a[1], false, true),
    );
    check(vec![input(&[2, 4, 3], 40), input(&[4, 5], 41)], |b, a| {
        b.matmul_t(a[0], a[1], true, false)
    });
    check(
        vec![input(&[2, 1, 3, 4], 34), input(&[3, 4, 2], 35)],
        |b, a| b.matmul(a[0], a[1]),
    );
    check(
        vec![input(&[3, 4, 2], 36), input(&[3, 5, 4], 37)],
        |b, a| b.matmul_t(a[0], a[1], true, true),
    );
}

#[test]
fn matmul_acc_every_transpose() {
    use kiln_ir::{F64Attr, Op};
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let sa: &[usize] = if ta { &[4, 3] } else { &[3, 4] };
        let sb: &[usize] = if tb { &[5, 4] } else { &[4, 5] };
        let inputs = vec![input(sa, 42), input(sb, 43), input(&[3, 5], 44)];
        check(inputs, |b, a| {
            let op = Op::MatMulAcc {
                transpose_a: ta,
                transpose_b: tb,
                scale: F64Attr(-0.3),
            };
            Ok(b.insert(op, &[a[0], a[1], a[2]])?[0])
        });
    }
}

#[test]
fn gather_and_scatter_add() {
    let idx = Array::I64(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![2, 0, 2, 1]).unwrap());
    check(vec![input(&[3, 4], 40), idx.clone()], |b, a| {
        b.gather(a[0], a[1], 0)
    });
    check(vec![input(&[4, 3], 41), idx.clone()], |b, a| {
        b.gather(a[0], a[1], 1)
    });
    check(vec![input(&[2, 2, 5], 42), idx], |b, a| {
        b.scatter_add(a[0], a[1], 0, Shape::fixed(&[3, 5]))
    });
}

#[test]
fn cond_both_branches_and_captured_values() {
    for take in [true, false] {
        let p = Array::Bool(ndarray::arr0(take).into_dyn());
        check(vec![p, input(&[3], 50), input(&[3], 51)], |b, a| {
            let (x, y) = (a[1], a[2]);
            let r = b.cond(
                a[0],
                |b| {
                    let t = b.tanh(x)?;
                    Ok(vec![b.mul(t, y)?])
                },
                |b| {
                    let e = b.exp(y)?;
                    Ok(vec![b.add(e, y)?])
                },
            )?;
            b.mul(r[0], x)
        });
    }
}

/// A two-layer perceptron with softmax cross-entropy on integer labels.
#[test]
fn mlp_with_softmax_cross_entropy() {
    let labels = Array::I64(ArrayD::from_shape_vec(IxDyn(&[4]), vec![2, 0, 1, 2]).unwrap());
    let inputs = vec![
        input(&[4, 5], 60),
        input(&[5, 6], 61),
        input(&[6], 62),
        input(&[6, 3], 63),
        labels,
    ];
    check(inputs, |b, a| {
        let (x, w1, b1, w2, y) = (a[0], a[1], a[2], a[3], a[4]);
        let h = b.matmul(x, w1)?;
        let h = b.add(h, b1)?;
        let h = b.relu(h)?;
        let logits = b.matmul(h, w2)?;
        let m = b.reduce(ReduceOp::Max, logits, vec![1], true)?;
        let z = b.sub(logits, m)?;
        let e = b.exp(z)?;
        let s = b.reduce(ReduceOp::Sum, e, vec![1], true)?;
        let lse = b.log(s)?;
        let logp = b.sub(z, lse)?;
        let onehot = b.one_hot(y, 3, DType::F64)?;
        let picked = b.mul(logp, onehot)?;
        let per_row = b.reduce(ReduceOp::Sum, picked, vec![1], false)?;
        let mean = b.reduce(ReduceOp::Mean, per_row, vec![0], false)?;
        b.neg(mean)
    });
}

#[test]
fn layer_norm() {
    check(
        vec![input(&[3, 5], 70), input(&[5], 71), input(&[5], 72)],
        |b, a| {
            let (x, gamma, beta) = (a[0], a[1], a[2]);
            let mu = b.reduce(ReduceOp::Mean, x, vec![1], true)?;
            let d = b.sub(x, mu)?;
            let d2 = b.mul(d, d)?;
            let var = b.reduce(ReduceOp::Mean, d2, vec![1], true)?;
            let eps = b.scalar(DType::F64, 1e-5)?;
            let ve = b.add(var, eps)?;
            let inv = b.rsqrt(ve)?;
            let xhat = b.mul(d, inv)?;
            let scaled = b.mul(xhat, gamma)?;
            b.add(scaled, beta)
        },
    );
}

#[test]
fn tanh_sigmoid_network() {
    check(
        vec![input(&[3, 2], 80), input(&[2, 4], 81), input(&[4, 1], 82)],
        |b, a| {
            let h = b.matmul(a[0], a[1])?;
            let h = b.tanh(h)?;
            let o = b.matmul(h, a[2])?;
            b.sigmoid(o)
        },
    );
}

/// Gradients of functions with a symbolic batch dimension run at any batch size.
#[test]
fn symbolic_batch_mean() {
    let mut b = FunctionBuilder::new("f");
    let x = b.arg(
        "x",
        Type::new(DType::F64, Shape(vec![Dim::sym("N"), Dim::Fixed(2)])),
    );
    let sq = b.mul(x, x).unwrap();
    let loss = b.reduce(ReduceOp::Mean, sq, vec![0, 1], false).unwrap();
    let mut func = b.finish(&[loss]).unwrap();
    let grads = append_gradients(&mut func, loss, &[x]).unwrap();
    let body = func.body();
    func.set_region_results(body, grads.clone());
    func.set_result_types(vec![func.value_type(grads[0]).clone()]);
    let mut module = Module::new();
    module.add_function(func);
    verify_module(&module).unwrap();
    for n in [1usize, 3] {
        let data: Vec<f64> = (0..2 * n).map(|v| v as f64).collect();
        let g = Interpreter::new(&module)
            .run(
                "f",
                vec![array(&[n, 2], data.clone())],
                &mut StateStore::new(),
            )
            .unwrap();
        let want: Vec<f64> = data.iter().map(|v| 2.0 * v / (2 * n) as f64).collect();
        for (got, want) in g[0].to_f64_vec().iter().zip(&want) {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
    }
}

#[test]
fn integer_paths_stop_gradients_and_unused_inputs_get_zeros() {
    let x = input(&[3], 90);
    let c = Check::new(&[x.clone(), input(&[3], 91)], |b, a| {
        let i = b.cast(a[0], DType::I32)?;
        let back = b.cast(i, DType::F64)?;
        let _unused = b.exp(a[1])?;
        b.mul(back, back)
    });
    let out = c.run(&[x, input(&[3], 91)]);
    assert_eq!(out[1].to_f64_vec(), [0.0; 3], "through an integer cast");
    assert_eq!(
        out[2].to_f64_vec(),
        [0.0; 3],
        "an input the loss does not use"
    );
}

/// `x ← tanh(x·w + 0.1)` three times: gradients flow to the initial value and to the captured
/// weight through every iteration.
#[test]
fn while_with_a_fixed_trip_count() {
    check(vec![input(&[2, 3], 100), input(&[3], 101)], |b, a| {
        let (x0, w) = (a[0], a[1]);
        let zero = b.scalar(DType::I32, 0.0)?;
        let out = b.while_loop(
            &[zero, x0],
            |b, c| {
                let three = b.scalar(DType::I32, 3.0)?;
                b.compare(CompareOp::Lt, c[0], three)
            },
            |b, c| {
                let one = b.scalar(DType::I32, 1.0)?;
                let i = b.add(c[0], one)?;
                let xw = b.mul(c[1], w)?;
                let shift = b.scalar(DType::F64, 0.1)?;
                let z = b.add(xw, shift)?;
                Ok(vec![i, b.tanh(z)?])
            },
        )?;
        Ok(out[1])
    });
}

/// A counted loop that keeps its states: the counter is not the first carried value and
/// starts at 2, each trip reads one row of a captured sequence (a gather by the counter), and
/// the gradient reaches the sequence, the weight and the initial state.
#[test]
fn counted_while_keeps_its_states() {
    let inputs = vec![input(&[2, 3], 104), input(&[3], 105), input(&[5, 3], 106)];
    check(inputs.clone(), counted_rnn);
    // The forward loop keeps its states (`update_slice`) and the backward loop reads them:
    // no loop re-runs the body inside the backward one.
    let mut builder = FunctionBuilder::new("f");
    let args: Vec<Value> = ["h", "w", "xs"]
        .iter()
        .zip(&inputs)
        .map(|(n, a)| builder.arg(n, Type::new(DType::F64, Shape::fixed(a.shape()))))
        .collect();
    let loss = counted_rnn(&mut builder, &args).unwrap();
    let loss = builder
        .reduce(ReduceOp::Sum, loss, vec![0, 1], false)
        .unwrap();
    let mut func = builder.finish(&[loss]).unwrap();
    append_gradients(&mut func, loss, &args).unwrap();
    let text = func.to_string();
    assert!(text.contains("update_slice"), "{text}");
    let loops = text.matches("= while").count();
    // The original loop (dead now), the one that keeps the states, the backward loop.
    assert_eq!(loops, 3, "{text}");
}

/// A counted loop whose kept states would pass the budget (4 × 128 MiB here) is
/// differentiated by recomputation instead.
#[test]
fn counted_while_with_huge_states_recomputes() {
    let mut b = FunctionBuilder::new("f");
    let x = b.arg("x", Type::new(DType::F64, Shape::fixed(&[4096, 4096])));
    let zero = b.scalar(DType::I32, 0.0).unwrap();
    let out = b
        .while_loop(
            &[zero, x],
            |b, c| {
                let three = b.scalar(DType::I32, 3.0)?;
                b.compare(CompareOp::Lt, c[0], three)
            },
            |b, c| {
                let one = b.scalar(DType::I32, 1.0)?;
                Ok::<_, kiln_ir::BuildError>(vec![b.add(c[0], one)?, b.tanh(c[1])?])
            },
        )
        .unwrap();
    let loss = b.reduce(ReduceOp::Sum, out[1], vec![0, 1], false).unwrap();
    let mut func = b.finish(&[loss]).unwrap();
    append_gradients(&mut func, loss, &[x]).unwrap();
    assert!(!func.to_string().contains("update_slice"));
}

/// A recurrent cell of products in a counted loop: `h ← tanh(xs[t]·w + h·u + h·vᵀ + u₀)` for
/// `t` in `1..5` (the sequence has a row no trip reads), with `u` also used outside a
/// product. The weight gradients of the three products are computed after the backward loop
/// (one product of the stacked operands each); they agree with finite differences, and the
/// backward loop keeps no per-trip sum for `w` and `v`.
#[test]
fn counted_while_defers_weight_gradients() {
    let inputs = vec![
        input(&[2, 3], 120),
        input(&[4, 3], 121),
        input(&[3, 3], 122),
        input(&[3, 3], 123),
        input(&[5, 2, 4], 124),
    ];
    let cell = |b: &mut FunctionBuilder, a: &[Value]| -> BuildResult<Value> {
        let (h0, w, u, v, xs) = (a[0], a[1], a[2], a[3], a[4]);
        let one = b.scalar(DType::I32, 1.0)?;
        let out = b.while_loop(
            &[one, h0],
            |b, c| {
                let five = b.scalar(DType::I32, 5.0)?;
                b.compare(CompareOp::Lt, c[0], five)
            },
            |b, c| {
                let x = b.gather(xs, c[0], 0)?;
                let xw = b.matmul(x, w)?;
                let hu = b.matmul(c[1], u)?;
                let hv = b.matmul_t(c[1], v, false, true)?;
                let u0 = b.slice(
                    u,
                    vec![
                        AxisSlice::Range {
                            start: 0,
                            end: 1,
                            step: 1,
                        },
                        AxisSlice::Full,
                    ],
                )?;
                let z = b.add(xw, hu)?;
                let z = b.add(z, hv)?;
                let z = b.add(z, u0)?;
                let one = b.scalar(DType::I32, 1.0)?;
                Ok(vec![b.add(c[0], one)?, b.tanh(z)?])
            },
        )?;
        Ok(out[1])
    };
    check(inputs.clone(), cell);
    let text = gradient_program(&inputs, cell);
    // The count, `h`'s adjoint, per-trip sums for `xs` and for `u` (also used by the slice),
    // and the three products' adjoint stacks; no per-trip sum for `w` or `v`.
    assert_eq!(
        backward_carried(&text),
        "i32[], f64[2,3], f64[5,2,4], f64[3,3], f64[5,2,3], f64[5,2,3], f64[5,2,3]",
        "{text}"
    );
    // Nor does the backward loop build the per-trip weight products (`aᵀ·g`) at all.
    let after = text.rsplit(" body(").next().unwrap_or_default();
    let backward_body = after.split("\n  }").next().unwrap_or_default();
    assert!(!backward_body.contains("transpose_a=true"), "{text}");
}

/// An RNN cell `h ← tanh(xs[t]·w + h·u)` for `t` in `0..4`, the sequence four rows long: the
/// two products' results are the operands of one `add`, so every trip gives them the same
/// adjoint at the same row, and the backward loop fills one adjoint stack for both (the
/// second product's left operands, the states before each trip, are the first four rows of
/// the five states kept). Both weight gradients agree with finite differences.
#[test]
fn counted_while_keeps_one_adjoint_stack_for_a_cells_two_products() {
    let inputs = vec![
        input(&[2, 3], 130),
        input(&[4, 3], 131),
        input(&[3, 3], 132),
        input(&[4, 2, 4], 133),
    ];
    let cell = |b: &mut FunctionBuilder, a: &[Value]| -> BuildResult<Value> {
        let (h0, w, u, xs) = (a[0], a[1], a[2], a[3]);
        let zero = b.scalar(DType::I32, 0.0)?;
        let out = b.while_loop(
            &[zero, h0],
            |b, c| {
                let four = b.scalar(DType::I32, 4.0)?;
                b.compare(CompareOp::Lt, c[0], four)
            },
            |b, c| {
                let x = b.gather(xs, c[0], 0)?;
                let xw = b.matmul(x, w)?;
                let hu = b.matmul(c[1], u)?;
                let z = b.add(xw, hu)?;
                let one = b.scalar(DType::I32, 1.0)?;
                Ok(vec![b.add(c[0], one)?, b.tanh(z)?])
            },
        )?;
        Ok(out[1])
    };
    check(inputs.clone(), cell);
    let text = gradient_program(&inputs, cell);
    // The count, `h`'s adjoint, `xs`'s per-trip sum and one stack of the cell's adjoints.
    assert_eq!(
        backward_carried(&text),
        "i32[], f64[2,3], f64[4,2,4], f64[4,2,3]",
        "{text}"
    );
    assert!(
        text.contains("slice"),
        "the states cut to four rows:\n{text}"
    );
}

/// The function `cell` builds over f64 arguments shaped as `inputs`, with the gradients of
/// the sum of its result appended, as text.
fn gradient_program(
    inputs: &[Array],
    cell: impl Fn(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) -> String {
    let mut builder = FunctionBuilder::new("f");
    let args: Vec<Value> = (inputs.iter().enumerate())
        .map(|(i, a)| {
            builder.arg(
                &format!("a{i}"),
                Type::new(DType::F64, Shape::fixed(a.shape())),
            )
        })
        .collect();
    let result = cell(&mut builder, &args).unwrap();
    let loss = builder
        .reduce(ReduceOp::Sum, result, vec![0, 1], false)
        .unwrap();
    let mut func = builder.finish(&[loss]).unwrap();
    append_gradients(&mut func, loss, &args).unwrap();
    func.to_string()
}

/// The types the last `while` of `text` (a backward loop) carries.
fn backward_carried(text: &str) -> &str {
    let backward = text.lines().rfind(|l| l.contains("= while"));
    backward
        .and_then(|l| l.split_once(" : "))
        .and_then(|(_, rest)| rest.split_once(" cond("))
        .map_or("", |(types, _)| types)
}

/// `h ← tanh(h·w + xs[t])` for `t` in `2..5`, the counter carried second.
fn counted_rnn(b: &mut FunctionBuilder, a: &[Value]) -> Result<Value, kiln_ir::BuildError> {
    let (h0, w, xs) = (a[0], a[1], a[2]);
    let two = b.scalar(DType::I64, 2.0)?;
    let out = b.while_loop(
        &[h0, two],
        |b, c| {
            let five = b.scalar(DType::I64, 5.0)?;
            b.compare(CompareOp::Lt, c[1], five)
        },
        |b, c| {
            let x = b.gather(xs, c[1], 0)?;
            let shape = b.value_type(c[0]).shape.clone();
            let x = b.broadcast_to(x, &shape)?;
            let hw = b.mul(c[0], w)?;
            let z = b.add(hw, x)?;
            let one = b.scalar(DType::I64, 1.0)?;
            Ok(vec![b.tanh(z)?, b.add(c[1], one)?])
        },
    )?;
    Ok(out[0])
}

/// `update_slice`: the slice's gradient reaches the value, the rest the array.
#[test]
fn update_slice_routes_gradients() {
    check(vec![input(&[4, 3], 107), input(&[3], 108)], |b, a| {
        let at = b.scalar(DType::I32, 2.0)?;
        let updated = b.update_slice(a[0], a[1], at, 0)?;
        b.mul(updated, updated)
    });
    check(vec![input(&[2, 4, 3], 109), input(&[2, 3], 110)], |b, a| {
        let at = b.scalar(DType::I64, 1.0)?;
        let updated = b.update_slice(a[0], a[1], at, 1)?;
        b.tanh(updated)
    });
}

/// The trip count depends on the data (`while sum(x) < 4: x ← 1.5·x + c`), and the body holds
/// a `cond`.
#[test]
fn while_with_a_data_dependent_trip_count_and_a_cond_inside() {
    // Small starting values (sum < 1.5), so the loop runs several times.
    let x0 = array(&[3], values(3, 102, 0.2, 0.5, false));
    check(vec![x0, input(&[3], 103)], |b, a| {
        let (x0, c) = (a[0], a[1]);
        let out = b.while_loop(
            &[x0],
            |b, s| {
                let total = b.reduce(ReduceOp::Sum, s[0], vec![0], false)?;
                let four = b.scalar(DType::F64, 4.0)?;
                b.compare(CompareOp::Lt, total, four)
            },
            |b, s| {
                let x = s[0];
                let k = b.scalar(DType::F64, 1.5)?;
                let grown = b.mul(x, k)?;
                let total = b.reduce(ReduceOp::Sum, x, vec![0], false)?;
                let two = b.scalar(DType::F64, 2.0)?;
                let small = b.compare(CompareOp::Lt, total, two)?;
                let shifted = b.cond(
                    small,
                    |b| Ok(vec![b.add(grown, c)?]),
                    |b| {
                        let e = b.exp(c)?;
                        let tenth = b.scalar(DType::F64, 0.1)?;
                        let ce = b.mul(e, tenth)?;
                        Ok(vec![b.add(grown, ce)?])
                    },
                )?;
                let pos = b.abs(shifted[0])?;
                let eps = b.scalar(DType::F64, 0.05)?;
                Ok(vec![b.add(pos, eps)?])
            },
        )?;
        Ok(out[0])
    });
}

/// A custom op `cube` whose backward the interpreter finds as `cube.grad`.
struct Cube;

impl kiln_backend::CustomOps for Cube {
    fn call(&self, name: &str, args: &[Array]) -> Result<Vec<Array>, kiln_backend::CustomOpError> {
        match (name, args) {
            ("cube", [Array::F64(x)]) => Ok(vec![Array::F64(x.mapv(|v| v * v * v))]),
            // inputs, outputs, output adjoints → one gradient per input
            ("cube.grad", [Array::F64(x), _y, Array::F64(g)]) => Ok(vec![Array::F64(
                ndarray::Zip::from(x)
                    .and(g)
                    .map_collect(|&x, &g| 3.0 * x * x * g),
            )]),
            _ => Err(kiln_backend::CustomOpError(format!("no custom op {name}"))),
        }
    }
}

#[test]
fn custom_ops_use_their_own_backward() {
    check(vec![input(&[2, 3], 110), input(&[3], 111)], |b, a| {
        let ty = b.value_type(a[0]).clone();
        let cubed = b.call("cube", &[a[0]], vec![ty])?;
        b.mul(cubed[0], a[1])
    });
}

fn conv_attrs(strides: usize, pad: (usize, usize), dilation: usize, groups: usize) -> Conv2dAttrs {
    Conv2dAttrs {
        strides: [strides, strides],
        padding: [pad, (pad.1, pad.0)],
        dilation: [dilation, dilation],
        groups,
        channels_last: false,
    }
}

#[test]
fn conv2d_and_its_transposes() {
    // (input, weights, attributes): plain, padded and strided, dilated, grouped.
    let cases = [
        ([1, 2, 5, 5], [3, 2, 3, 3], conv_attrs(1, (0, 0), 1, 1)),
        ([2, 1, 6, 5], [2, 1, 3, 2], conv_attrs(2, (1, 2), 1, 1)),
        ([1, 2, 7, 7], [2, 2, 2, 3], conv_attrs(1, (1, 0), 2, 1)),
        ([2, 4, 4, 4], [6, 2, 3, 3], conv_attrs(1, (1, 1), 1, 2)),
    ];
    for (k, (x, w, attrs)) in cases.into_iter().enumerate() {
        let seed = 60 + 3 * k as u64;
        check(vec![input(&x, seed), input(&w, seed + 1)], |b, a| {
            b.conv2d(a[0], a[1], attrs)
        });
        // The transposes, each differentiated with respect to both operands.
        let y_type = {
            let mut b = FunctionBuilder::new("shape");
            let xa = b.arg("x", Type::new(DType::F64, Shape::fixed(&x)));
            let wa = b.arg("w", Type::new(DType::F64, Shape::fixed(&w)));
            let y = b.conv2d(xa, wa, attrs).unwrap();
            b.value_type(y).clone()
        };
        let y = y_type.shape.as_fixed().unwrap();
        let input_grad = ConvKind::InputGrad {
            input: [x[2], x[3]],
        };
        check(vec![input(&y, seed + 2), input(&w, seed)], |b, a| {
            b.conv(input_grad, attrs, a[0], a[1])
        });
        let filter_grad = ConvKind::FilterGrad {
            kernel: [w[2], w[3]],
        };
        check(vec![input(&x, seed + 1), input(&y, seed + 2)], |b, a| {
            b.conv(filter_grad, attrs, a[0], a[1])
        });
    }
}

/// Channels-last convolutions (`[N, H, W, C]` activations) and their transposes, and pooling,
/// differentiated with respect to every operand.
#[test]
fn channels_last_convolutions_and_pooling() {
    let attrs = Conv2dAttrs {
        channels_last: true,
        ..conv_attrs(2, (1, 2), 1, 1)
    };
    let (x, w) = ([2, 6, 5, 2], [3, 2, 3, 2]);
    check(vec![input(&x, 90), input(&w, 91)], |b, a| {
        b.conv2d(a[0], a[1], attrs)
    });
    let y = {
        let mut b = FunctionBuilder::new("shape");
        let xa = b.arg("x", Type::new(DType::F64, Shape::fixed(&x)));
        let wa = b.arg("w", Type::new(DType::F64, Shape::fixed(&w)));
        let y = b.conv2d(xa, wa, attrs).unwrap();
        b.value_type(y).shape.as_fixed().unwrap()
    };
    let input_grad = ConvKind::InputGrad {
        input: [x[1], x[2]],
    };
    check(vec![input(&y, 92), input(&w, 93)], |b, a| {
        b.conv(input_grad, attrs, a[0], a[1])
    });
    let filter_grad = ConvKind::FilterGrad {
        kernel: [w[2], w[3]],
    };
    check(vec![input(&x, 94), input(&y, 95)], |b, a| {
        b.conv(filter_grad, attrs, a[0], a[1])
    });
    let pool = Pool2dAttrs {
        window: [3, 2],
        strides: [2, 1],
        padding: [(1, 1), (0, 1)],
        channels_last: true,
    };
    check(vec![input(&[2, 5, 6, 3], 96)], |b, a| {
        b.max_pool2d(a[0], pool)
    });
    check(vec![input(&[2, 5, 6, 3], 97)], |b, a| {
        b.avg_pool2d(a[0], pool)
    });
}

#[test]
fn pooling_and_its_gradients() {
    // Random values: a window's largest element leads the next by far more than the step.
    let attrs = [
        Pool2dAttrs::new([2, 2], [2, 2]),
        Pool2dAttrs::new([3, 3], [1, 1]),
        Pool2dAttrs {
            window: [3, 2],
            strides: [2, 1],
            padding: [(1, 1), (0, 1)],
            channels_last: false,
        },
    ];
    for (k, attrs) in attrs.into_iter().enumerate() {
        let x = [2, 2, 5, 6];
        check(vec![input(&x, 70 + k as u64)], |b, a| {
            b.max_pool2d(a[0], attrs)
        });
        check(vec![input(&x, 71 + k as u64)], |b, a| {
            b.avg_pool2d(a[0], attrs)
        });
        let y = {
            let mut b = FunctionBuilder::new("shape");
            let xa = b.arg("x", Type::new(DType::F64, Shape::fixed(&x)));
            let p = b.avg_pool2d(xa, attrs).unwrap();
            b.value_type(p).shape.as_fixed().unwrap()
        };
        let avg_grad = PoolKind::AvgGrad {
            input: [x[2], x[3]],
        };
        check(vec![input(&y, 72 + k as u64)], |b, a| {
            b.pool(avg_grad, attrs, &[a[0]])
        });
    }
}
