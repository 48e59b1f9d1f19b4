//! Compiled f32 reductions are accurate at any length: every form — along rows, down columns,
//! over whole arrays, accumulated with the inner axis reduced too, a mean, a sum inside a
//! fused kernel, a column sum split across threads, batch-norm statistics and a bias
//! gradient through the autodiff pass — over 2¹⁰ … 2²⁴ elements, on data with a large
//! offset (`1000 + U(0, 1)`, where a running f32 sum drifts by percents) and on magnitudes
//! from 10⁻³ to 10³, within 1e-6 relative of the sum in f64 (the plan's blocked f32
//! partials added into f64 totals; `backend/src/jit/plan.rs`).

use kiln::backend::Array;
use kiln::backend::random::Stream;
use kiln::ir::{DType, ReduceOp, Shape, Value};
use kiln::runtime::{Fetch, Program, RuntimeResult, Session};

/// How a test input's elements are drawn.
#[derive(Clone, Copy, Debug)]
enum Data {
    /// `1000 + U(0, 1)`.
    Offset,
    /// `10^U(-3, 3)`.
    Magnitudes,
}

impl Data {
    fn array(self, shape: &[usize], seed: u64) -> Array {
        let stream = Stream::new(seed, 0);
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n as u64)
            .map(|i| match self {
                Data::Offset => 1000.0 + stream.uniform(i, 0.0, 1.0),
                Data::Magnitudes => 10f64.powf(stream.uniform(i, -3.0, 3.0)),
            } as f32)
            .collect();
        Array::F32(ndarray::ArrayD::from_shape_vec(shape.to_vec(), values).unwrap())
    }
}

/// One form: the input's shape for `n` reduced elements, the program, and the f64 reference.
struct Form {
    name: &'static str,
    /// The largest `n` it is run at (the input is `n` times the results' count).
    max: usize,
    shape: fn(usize) -> Vec<usize>,
    build: fn(&mut Program, Value) -> RuntimeResult<Value>,
    reference: fn(&[f32], &[usize]) -> Vec<f64>,
}

/// Sums of `x` (row-major, of `shape`) over every axis but `kept`, in f64, of `f(x)`.
fn sums(x: &[f32], shape: &[usize], kept: &[usize], f: impl Fn(f64) -> f64) -> Vec<f64> {
    let out_len: usize = kept.iter().map(|&a| shape[a]).product();
    let mut out = vec![0.0; out_len];
    let mut index = vec![0; shape.len()];
    for &v in x {
        let mut o = 0;
        for &a in kept {
            o = o * shape[a] + index[a];
        }
        out[o] += f(f64::from(v));
        for a in (0..shape.len()).rev() {
            index[a] += 1;
            if index[a] < shape[a] {
                break;
            }
            index[a] = 0;
        }
    }
    out
}

fn sum(p: &mut Program, x: Value, axes: Vec<usize>) -> RuntimeResult<Value> {
    Ok(p.reduce(ReduceOp::Sum, x, axes, false)?)
}

const FORMS: &[Form] = &[
    Form {
        name: "a row",
        max: 1 << 24,
        shape: |n| vec![1, n],
        build: |p, x| sum(p, x, vec![1]),
        reference: |x, s| sums(x, s, &[0], |v| v),
    },
    Form {
        name: "a row's mean",
        max: 1 << 22,
        shape: |n| vec![2, n],
        build: |p, x| Ok(p.reduce(ReduceOp::Mean, x, vec![1], false)?),
        reference: |x, s| {
            let n = s[1] as f64;
            sums(x, s, &[0], |v| v).into_iter().map(|t| t / n).collect()
        },
    },
    Form {
        name: "a row of a fused product (x·x·0.001)",
        max: 1 << 22,
        shape: |n| vec![2, n],
        build: |p, x| {
            let c = p.scalar(DType::F32, 0.001)?;
            let xc = p.mul(x, c)?;
            let y = p.mul(xc, x)?;
            sum(p, y, vec![1])
        },
        reference: |x, s| sums(x, s, &[0], |v| f64::from((v as f32 * 0.001) * v as f32)),
    },
    Form {
        name: "columns",
        max: 1 << 22,
        shape: |n| vec![n, 4],
        build: |p, x| sum(p, x, vec![0]),
        reference: |x, s| sums(x, s, &[1], |v| v),
    },
    Form {
        name: "three columns (no whole vector step)",
        max: 1 << 20,
        shape: |n| vec![n, 3],
        build: |p, x| sum(p, x, vec![0]),
        reference: |x, s| sums(x, s, &[1], |v| v),
    },
    Form {
        name: "columns of exp(x·0.001), split across threads",
        max: 1 << 18,
        shape: |n| vec![n, 64],
        build: |p, x| {
            let c = p.scalar(DType::F32, 0.001)?;
            let y = p.mul(x, c)?;
            let e = p.exp(y)?;
            sum(p, e, vec![0])
        },
        reference: |x, s| sums(x, s, &[1], |v| f64::from(v as f32 * 0.001).exp()),
    },
    Form {
        name: "a whole array",
        max: 1 << 24,
        shape: |n| vec![n / 16, 16],
        build: |p, x| sum(p, x, vec![0, 1]),
        reference: |x, s| sums(x, s, &[], |v| v),
    },
    Form {
        name: "leading and inner axes at once",
        max: 1 << 22,
        shape: |n| vec![n / 32, 2, 32],
        build: |p, x| sum(p, x, vec![0, 2]),
        reference: |x, s| sums(x, s, &[1], |v| v),
    },
    Form {
        name: "batch-norm statistics (a mean over N, H, W)",
        max: 1 << 22,
        shape: |n| vec![n / 64, 2, 8, 8],
        build: |p, x| Ok(p.reduce(ReduceOp::Mean, x, vec![0, 2, 3], false)?),
        reference: |x, s| {
            let n = (s[0] * s[2] * s[3]) as f64;
            sums(x, s, &[1], |v| v).into_iter().map(|t| t / n).collect()
        },
    },
    Form {
        name: "a bias gradient (of Σ(x + b)·0.5 by the autodiff pass)",
        max: 1 << 20,
        shape: |n| vec![n, 8],
        build: |p, x| {
            let b = p.placeholder("b", DType::F32, Shape::fixed(&[8]))?;
            let shape = p.value_type(x).shape.clone();
            let bb = p.broadcast_to(b, &shape)?;
            let y = p.add(x, bb)?;
            let half = p.scalar(DType::F32, 0.5)?;
            let y = p.mul(y, half)?;
            let yy = p.mul(y, x)?;
            let loss = sum(p, yy, vec![0, 1])?;
            Ok(p.gradients(loss, &[b])?[0])
        },
        // d/db Σ (x + b)·0.5·x = Σ 0.5·x over each column.
        reference: |x, s| sums(x, s, &[1], |v| f64::from(0.5 * v as f32)),
    },
];

#[test]
fn compiled_f32_reductions_hold_1e_6_of_f64_at_any_length() {
    let mut failures = Vec::new();
    for form in FORMS {
        for log in (10..=24).step_by(2) {
            let n = 1usize << log;
            if n > form.max {
                continue;
            }
            for data in [Data::Offset, Data::Magnitudes] {
                let shape = (form.shape)(n);
                let mut p = Program::new();
                let x = p
                    .placeholder("x", DType::F32, Shape::fixed(&shape))
                    .unwrap();
                let y = (form.build)(&mut p, x).unwrap();
                let input = data.array(&shape, log as u64);
                let mut feeds = vec![("x", input.clone())];
                if form.name.starts_with("a bias gradient") {
                    feeds.push(("b", Array::zeros(DType::F32, &[8])));
                }
                let mut session = Session::new(&p).unwrap();
                let got = session.run(&[Fetch::Value(y)], &feeds).unwrap();
                let got = got[0].to_f64_vec();
                let Array::F32(values) = &input else {
                    unreachable!()
                };
                let want = (form.reference)(values.as_slice().unwrap(), &shape);
                assert_eq!(got.len(), want.len(), "{}", form.name);
                let worst = (got.iter().zip(&want))
                    .map(|(g, w)| (g - w).abs() / w.abs())
                    .fold(0.0, f64::max);
                if worst.is_nan() || worst > 1e-6 {
                    failures.push(format!("{} over 2^{log}, {data:?}: {worst:.2e}", form.name));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "relative errors over 1e-6:\n{}",
        failures.join("\n")
    );
}
