//! Every kernel op × dtype × sample shape, compiled by the JIT and checked against the
//! reference interpreter: exactly for integers, bools and layout, within stated tolerances for
//! float approximations. Shapes include size-0 dimensions, size-1 (broadcast) dimensions,
//! lengths with and without a vector tail, and non-contiguous inputs.

use kiln_backend::jit::tile_program::{self, Isa};
use kiln_backend::jit::{self, KernelError, Path, Split, Status};
use kiln_backend::random::SplitMix64;
use kiln_backend::{Array, Interpreter, StateStore};
use kiln_ir::{
    BinaryOp, BuildResult, CompareOp, Cost, DType, DTypeClass, Dim, FunctionBuilder, Helper,
    Literal, Module, ReduceOp, Shape, Type, UnaryOp, Value,
};
use ndarray::{ArrayD, IxDyn};

/// Sample shapes: scalar, empty, one element, a vector tail only, vectors and a tail,
/// several rows, size-1 axes, rank 3.
const SHAPES: &[&[usize]] = &[
    &[],
    &[0],
    &[1],
    &[3],
    &[13],
    &[2, 0],
    &[4, 9],
    &[3, 1, 5],
    &[2, 3, 17],
];

/// A deterministic generator (SplitMix64).
struct Gen(SplitMix64);

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen(SplitMix64::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Floats in [-4, 4), with special values sprinkled in when `specials`.
    fn float(&mut self, specials: bool) -> f64 {
        const SPECIAL: &[f64] = &[
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-30,
            -1e30,
            88.0,
            -90.0,
            0.5,
        ];
        if specials && self.next().is_multiple_of(7) {
            SPECIAL[(self.next() % SPECIAL.len() as u64) as usize]
        } else {
            self.unit() * 8.0 - 4.0
        }
    }

    fn int(&mut self, nonzero: bool) -> i64 {
        let x = (self.next() % 101) as i64 - 50;
        if nonzero && x == 0 { 7 } else { x }
    }

    fn array(&mut self, dtype: DType, shape: &[usize], specials: bool, nonzero: bool) -> Array {
        let n: usize = shape.iter().product();
        let s = IxDyn(shape);
        match dtype {
            DType::F32 => Array::F32(ArrayD::from_shape_fn(s, |_| self.float(specials) as f32)),
            DType::F64 => Array::F64(ArrayD::from_shape_fn(s, |_| self.float(specials))),
            DType::I32 => Array::I32(ArrayD::from_shape_fn(s, |_| self.int(nonzero) as i32)),
            DType::I64 => Array::I64(ArrayD::from_shape_fn(s, |_| self.int(nonzero))),
            DType::Bool => {
                let _ = n;
                Array::Bool(ArrayD::from_shape_fn(s, |_| self.next().is_multiple_of(2)))
            }
        }
    }
}

const DTYPES: &[DType] = &[DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];

fn accepts(class: DTypeClass, dtype: DType) -> bool {
    match class {
        DTypeClass::Float => dtype.is_float(),
        DTypeClass::Numeric => dtype.is_numeric(),
        DTypeClass::Bool => dtype == DType::Bool,
        DTypeClass::Any => true,
    }
}

fn fixed(shape: &[usize]) -> Shape {
    Shape::fixed(shape)
}

/// How closely a compiled float result must match the interpreter's.
#[derive(Clone, Copy)]
struct Tolerance {
    abs: f64,
    rel: f64,
}

const EXACT: Tolerance = Tolerance { abs: 0.0, rel: 0.0 };
/// f32 approximations of transcendental functions (a few ULPs) and FMA rounding.
const APPROX: Tolerance = Tolerance {
    abs: 1e-6,
    rel: 4e-6,
};
/// Sums in a different order (the interpreter accumulates in f64).
const SUMS: Tolerance = Tolerance {
    abs: 1e-4,
    rel: 1e-4,
};

fn close(got: f64, want: f64, tol: Tolerance) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got == want {
        return true;
    }
    if got.is_infinite() || want.is_infinite() {
        return false;
    }
    (got - want).abs() <= tol.abs + tol.rel * want.abs()
}

/// Builds a kernel function over arguments of `types`, then runs it compiled and interpreted
/// on `inputs` and compares.
fn check(
    what: &str,
    types: &[Type],
    inputs: Vec<Array>,
    tol: Tolerance,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) {
    let mut b = FunctionBuilder::new("k");
    let args: Vec<Value> = types
        .iter()
        .enumerate()
        .map(|(i, t)| b.arg(&format!("a{i}"), t.clone()))
        .collect();
    let results = match build(&mut b, &args) {
        Ok(r) => r,
        Err(_) => return, // not a well-typed combination
    };
    let func = b.finish(&results).expect("a well-typed kernel");
    let mut module = Module::new();
    module.add_function(func.clone());
    let want =
        Interpreter::new(&module).run_function(&func, inputs.clone(), &mut StateStore::default());
    let kernel = jit::kernel(&func).unwrap_or_else(|e| panic!("{what}: {e}\n{func}"));
    let refs: Vec<&Array> = inputs.iter().collect();
    // Both codes of each stage (Cranelift's alone, and with tile programs where a stage has
    // them) against the interpreter, and against each other: they give the same bits, but
    // for a NaN's sign and payload (which operand's NaN an op passes on differs between the
    // two compilers' code, as a random input with NaNs showed).
    let on_programs = kernel.call_with(&refs, Path::Programs);
    let got = kernel.call_with(&refs, Path::Cranelift);
    if let (Ok(a), Ok(b)) = (&got, &on_programs) {
        for (x, y) in a.iter().zip(b) {
            let bits = |v: &Array| {
                v.to_f64_vec()
                    .iter()
                    .map(|f| if f.is_nan() { u64::MAX } else { f.to_bits() })
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(x), bits(y), "{what}: the two paths differ\n{func}");
        }
    }
    assert_eq!(got.is_ok(), on_programs.is_ok(), "{what}");
    match (got, want) {
        (Ok(got), Ok(want)) => {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.dtype(), w.dtype(), "{what}");
                assert_eq!(g.shape(), w.shape(), "{what}");
                // f64 at f64's precision, not f32's.
                let tol = match g.dtype() {
                    DType::F32 => tol,
                    DType::F64 => Tolerance {
                        abs: tol.abs.min(1e-12),
                        rel: tol.rel.min(1e-10),
                    },
                    _ => EXACT,
                };
                for (i, (a, e)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                    assert!(
                        close(*a, e, tol),
                        "{what}: element {i} is {a}, the interpreter gives {e}\ninputs: {inputs:?}\n{func}"
                    );
                }
            }
        }
        (Err(KernelError::Status(s)), Err(e)) => {
            let expected = e.to_string();
            let fits = match s {
                Status::IntegerDivisionByZero => expected.contains("division by zero"),
                Status::EmptyReduction => expected.contains("empty axis"),
            };
            assert!(
                fits,
                "{what}: the kernel reports {s:?}, the interpreter {expected}"
            );
        }
        (got, want) => panic!("{what}: the kernel gives {got:?}, the interpreter {want:?}\n{func}"),
    }
}

/// Approximate where f32 kernels compute the op inline with a polynomial (the op table's
/// transcendental ops that call a helper only for f64); exact everywhere else.
fn unary_tolerance(op: UnaryOp) -> Tolerance {
    if op.cost() == Cost::Transcendental && op.helper() == Helper::F64 {
        APPROX
    } else {
        EXACT
    }
}

#[test]
fn unary_ops() {
    let mut g = Gen::new(1);
    for &op in UnaryOp::ALL {
        for &dtype in DTYPES.iter().filter(|&&d| accepts(op.operand_class(), d)) {
            for shape in SHAPES {
                let ty = Type::new(dtype, fixed(shape));
                let x = g.array(dtype, shape, true, false);
                let what = format!("{} {dtype}{shape:?}", op.name());
                check(&what, &[ty], vec![x], unary_tolerance(op), |b, a| {
                    Ok(vec![b.unary(op, a[0])?])
                });
            }
        }
    }
}

#[test]
fn binary_ops() {
    let mut g = Gen::new(2);
    for &op in BinaryOp::ALL {
        for &dtype in DTYPES.iter().filter(|&&d| accepts(op.operand_class(), d)) {
            for shape in SHAPES {
                // Same shapes, and the second operand broadcast from a row (or a scalar).
                let rhs_shapes: Vec<Vec<usize>> = vec![
                    shape.to_vec(),
                    shape.iter().skip(1).copied().collect(),
                    vec![],
                ];
                for rhs in rhs_shapes {
                    let types = [
                        Type::new(dtype, fixed(shape)),
                        Type::new(dtype, fixed(&rhs)),
                    ];
                    let nonzero = op == BinaryOp::Div;
                    let inputs = vec![
                        g.array(dtype, shape, true, false),
                        g.array(dtype, &rhs, true, nonzero),
                    ];
                    let what = format!("{} {dtype}{shape:?} {rhs:?}", op.name());
                    let tol = if op == BinaryOp::Pow { APPROX } else { EXACT };
                    check(&what, &types, inputs, tol, |b, a| {
                        Ok(vec![b.binary(op, a[0], a[1])?])
                    });
                }
            }
        }
    }
}

#[test]
fn integer_division_by_zero_is_reported() {
    for dtype in [DType::I32, DType::I64] {
        let shape = [2usize, 5];
        let types = [
            Type::new(dtype, fixed(&shape)),
            Type::new(dtype, fixed(&shape)),
        ];
        let x = Gen::new(3).array(dtype, &shape, false, false);
        let mut d = Gen::new(4).array(dtype, &shape, false, true);
        match &mut d {
            Array::I32(a) => a[[1, 3]] = 0,
            Array::I64(a) => a[[1, 3]] = 0,
            _ => unreachable!(),
        }
        check("div by zero", &types, vec![x, d], EXACT, |b, a| {
            Ok(vec![b.div(a[0], a[1])?])
        });
    }
    // MIN / -1 wraps, as the interpreter's wrapping division does.
    let types = [
        Type::new(DType::I32, fixed(&[2])),
        Type::new(DType::I32, fixed(&[2])),
    ];
    let x = Array::I32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![i32::MIN, 9]).unwrap());
    let d = Array::I32(ArrayD::from_shape_vec(IxDyn(&[2]), vec![-1, -2]).unwrap());
    check("MIN / -1", &types, vec![x, d], EXACT, |b, a| {
        Ok(vec![b.div(a[0], a[1])?])
    });
}

#[test]
fn comparisons_and_select() {
    let mut g = Gen::new(5);
    for &op in CompareOp::ALL {
        for &dtype in DTYPES.iter().filter(|&&d| accepts(op.operand_class(), d)) {
            for shape in SHAPES {
                let types = [
                    Type::new(dtype, fixed(shape)),
                    Type::new(dtype, fixed(shape)),
                ];
                let mut inputs = vec![
                    g.array(dtype, shape, true, false),
                    g.array(dtype, shape, true, false),
                ];
                // Some equal elements, so that equality is exercised.
                if let (Array::F32(a), Array::F32(b)) = (&inputs[0].clone(), &mut inputs[1]) {
                    b.iter_mut()
                        .zip(a.iter())
                        .step_by(3)
                        .for_each(|(y, x)| *y = *x);
                }
                let what = format!("{} {dtype}{shape:?}", op.name());
                check(&what, &types, inputs.clone(), EXACT, |b, a| {
                    Ok(vec![b.compare(op, a[0], a[1])?])
                });
                // The comparison feeding a select (the vector mask path for f32).
                let what = format!("select({}) {dtype}{shape:?}", op.name());
                check(&what, &types, inputs, EXACT, |b, a| {
                    let c = b.compare(op, a[0], a[1])?;
                    Ok(vec![b.select(c, a[0], a[1])?])
                });
            }
        }
    }
    // Bool logic on masks selecting floats, and a bool stored (as bytes: Cranelift's code).
    let shape = [3usize, 11];
    let types = [
        Type::new(DType::F32, fixed(&shape)),
        Type::new(DType::F32, fixed(&shape)),
    ];
    let inputs = vec![
        g.array(DType::F32, &shape, true, false),
        g.array(DType::F32, &shape, true, false),
    ];
    check("mask logic", &types, inputs, APPROX, |b, a| {
        let mut out = mask_groups(b, a)?;
        let as_bool = b.cast(out[0], DType::Bool)?;
        out.push(as_bool);
        Ok(out)
    });
}

#[test]
fn casts() {
    let mut g = Gen::new(6);
    for &from in DTYPES {
        for &to in DTYPES {
            for shape in SHAPES {
                let ty = Type::new(from, fixed(shape));
                let x = g.array(from, shape, true, false);
                let what = format!("cast {from} to {to} {shape:?}");
                check(&what, &[ty], vec![x], EXACT, |b, a| {
                    Ok(vec![b.cast(a[0], to)?])
                });
            }
        }
    }
}

/// Every subset of `0..rank`.
fn axis_sets(rank: usize) -> Vec<Vec<usize>> {
    (0..1u32 << rank)
        .map(|m| (0..rank).filter(|a| m & (1 << a) != 0).collect())
        .collect()
}

#[test]
fn reductions() {
    let mut g = Gen::new(7);
    for &op in ReduceOp::ALL {
        for &dtype in DTYPES.iter().filter(|&&d| accepts(op.operand_class(), d)) {
            for shape in SHAPES {
                for axes in axis_sets(shape.len()) {
                    for keep_dims in [false, true] {
                        let ty = Type::new(dtype, fixed(shape));
                        let x = g.array(dtype, shape, false, false);
                        let what = format!(
                            "{} {dtype}{shape:?} axes {axes:?} keep {keep_dims}",
                            op.name()
                        );
                        let axes = axes.clone();
                        check(&what, &[ty], vec![x], SUMS, |b, a| {
                            Ok(vec![b.reduce(op, a[0], axes, keep_dims)?])
                        });
                    }
                }
            }
        }
    }
}

/// Reductions that keep the last axis, computing a transcendental function per element and
/// large enough to split across threads by columns (1,000 and 500 columns, no multiple of a thread's 16; a
/// kept middle axis; kept dimensions): the same bits on one, two and three threads, and the
/// interpreter's sums.
#[test]
fn column_reductions_split_across_threads_keep_their_bits() {
    let mut g = Gen::new(11);
    let cases: [(&[usize], &[usize], bool); 4] = [
        (&[700, 1000], &[0], false),
        (&[40, 30, 500], &[1], false),
        (&[40, 30, 500], &[1], true),
        (&[40, 30, 500], &[0, 1], true),
    ];
    for (shape, axes, keep_dims) in cases {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let what = format!("{} of exp(x)·x over {axes:?} of {shape:?}", op.name());
            let mut b = FunctionBuilder::new("k");
            let x = b.arg("x", Type::new(DType::F32, fixed(shape)));
            let e = b.exp(x).unwrap();
            let operand = b.mul(e, x).unwrap();
            let r = b.reduce(op, operand, axes.to_vec(), keep_dims).unwrap();
            let func = b.finish(&[r]).unwrap();
            let kernel = jit::kernel(&func).unwrap();
            let stages = 0..kernel.plan.stages.len();
            assert!(
                stages.map(|i| kernel.split(i)).any(|s| s == Split::Columns),
                "{what}: a stage split by columns"
            );
            let input = g.array(DType::F32, shape, false, false);
            let on = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build();
                let got = pool.unwrap().install(|| kernel.call(&[&input])).unwrap();
                let bits: Vec<u64> = got[0].to_f64_vec().iter().map(|f| f.to_bits()).collect();
                (got, bits)
            };
            let (one, bits) = on(1);
            for threads in [2, 3] {
                assert!(
                    on(threads).1 == bits,
                    "{what}: {threads} threads differ from one"
                );
            }
            let mut module = Module::new();
            module.add_function(func.clone());
            let want = Interpreter::new(&module)
                .run_function(&func, vec![input], &mut StateStore::default())
                .unwrap();
            for (a, e) in one[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
                assert!(close(*a, e, SUMS), "{what}: {a}, the interpreter {e}");
            }
        }
    }
}

#[test]
fn iota_constants_and_broadcasts() {
    for &dtype in &[DType::F32, DType::F64, DType::I32, DType::I64] {
        for shape in SHAPES {
            for axis in 0..shape.len() {
                let what = format!("iota {dtype}{shape:?} axis {axis}");
                let ty = Type::new(dtype, fixed(shape));
                check(&what, &[], vec![], EXACT, |b, _| {
                    let i = b.iota(ty.clone(), axis)?;
                    let two = b.scalar(dtype, 2.0)?;
                    Ok(vec![i, b.mul(i, two)?])
                });
            }
        }
    }
    // A column and a row broadcast against each other.
    let mut g = Gen::new(8);
    let types = [
        Type::new(DType::F32, fixed(&[5, 1])),
        Type::new(DType::F32, fixed(&[1, 9])),
    ];
    let inputs = vec![
        g.array(DType::F32, &[5, 1], false, false),
        g.array(DType::F32, &[1, 9], false, false),
    ];
    check("outer sum", &types, inputs, EXACT, |b, a| {
        Ok(vec![b.add(a[0], a[1])?])
    });
}

#[test]
fn non_contiguous_inputs() {
    let mut g = Gen::new(9);
    let x = g.array(DType::F32, &[6, 10], false, false);
    let Array::F32(a) = &x else { unreachable!() };
    let transposed = Array::F32(a.t().to_owned().reversed_axes().reversed_axes());
    let view = Array::F32(a.clone().reversed_axes());
    let ty = Type::new(DType::F32, fixed(&[10, 6]));
    check(
        "transposed input",
        std::slice::from_ref(&ty),
        vec![view],
        APPROX,
        |b, a| Ok(vec![b.unary(UnaryOp::Exp, a[0])?]),
    );
    check(
        "transposed copy",
        &[ty],
        vec![transposed],
        APPROX,
        |b, a| Ok(vec![b.unary(UnaryOp::Tanh, a[0])?]),
    );
}

/// Fused patterns the passes produce: one kernel per pattern.
#[test]
fn fused_patterns() {
    let mut g = Gen::new(10);
    let n = Dim::sym("N");
    let rows = |c: usize| Type::new(DType::F32, Shape(vec![n.clone(), Dim::Fixed(c)]));
    // Softmax, log-softmax and a layer norm: several reductions along rows, in one stage.
    for c in [1usize, 7, 8, 33] {
        let x = g.array(DType::F32, &[5, c], false, false);
        check("softmax", &[rows(c)], vec![x.clone()], APPROX, |b, a| {
            let m = b.reduce(ReduceOp::Max, a[0], vec![1], true)?;
            let d = b.sub(a[0], m)?;
            let e = b.unary(UnaryOp::Exp, d)?;
            let s = b.reduce(ReduceOp::Sum, e, vec![1], true)?;
            let ls = b.unary(UnaryOp::Log, s)?;
            Ok(vec![b.div(e, s)?, b.sub(d, ls)?])
        });
        check("layer norm", &[rows(c)], vec![x], APPROX, |b, a| {
            let mean = b.reduce(ReduceOp::Mean, a[0], vec![1], true)?;
            let d = b.sub(a[0], mean)?;
            let sq = b.mul(d, d)?;
            let var = b.reduce(ReduceOp::Mean, sq, vec![1], false)?;
            let eps = b.scalar(DType::F32, 1e-5)?;
            let ve = b.add(var, eps)?;
            let r = b.unary(UnaryOp::Rsqrt, ve)?;
            let r = b.reshape(r, Shape(vec![n.clone(), Dim::Fixed(1)]))?;
            Ok(vec![b.mul(d, r)?, var])
        });
    }
    // A bias gradient (column sum) next to an elementwise output.
    let x = g.array(DType::F32, &[37, 21], false, false);
    check("column sum", &[rows(21)], vec![x], SUMS, |b, a| {
        let r = b.unary(UnaryOp::Relu, a[0])?;
        let s = b.reduce(ReduceOp::Sum, r, vec![0], false)?;
        let total = b.reduce(ReduceOp::Sum, s, vec![0], false)?;
        Ok(vec![s, r, total])
    });
    // Channel-wise NCHW kernels, whose axes collapse (`[N,C,H,W]` walked as `[N,C,H·W]`): a
    // bias and ReLU forward, and its gradient with the bias gradient (a sum over N, H, W).
    let nchw = Type::new(
        DType::F32,
        Shape(vec![n.clone(), 6.into(), 3.into(), 5.into()]),
    );
    let channel = Type::new(DType::F32, fixed(&[1, 6, 1, 1]));
    let x = g.array(DType::F32, &[4, 6, 3, 5], false, false);
    let bias = g.array(DType::F32, &[1, 6, 1, 1], false, false);
    let types = [nchw.clone(), channel];
    check(
        "bias relu (NCHW)",
        &types,
        vec![x.clone(), bias],
        EXACT,
        |b, a| {
            let shape = b.value_type(a[0]).shape.clone();
            let bias = b.broadcast_to(a[1], &shape)?;
            let y = b.add(a[0], bias)?;
            Ok(vec![b.unary(UnaryOp::Relu, y)?])
        },
    );
    let grad = g.array(DType::F32, &[4, 6, 3, 5], false, false);
    let types = [nchw.clone(), nchw];
    check(
        "bias gradient (NCHW)",
        &types,
        vec![x, grad],
        SUMS,
        |b, a| {
            let zero = b.scalar(DType::F32, 0.0)?;
            let shape = b.value_type(a[0]).shape.clone();
            let zeros = b.broadcast_to(zero, &shape)?;
            let on = b.compare(CompareOp::Gt, a[0], zeros)?;
            let dx = b.select(on, a[1], zeros)?;
            let db = b.reduce(ReduceOp::Sum, dx, vec![0, 2, 3], true)?;
            let rows = b.reduce(ReduceOp::Max, dx, vec![3], true)?;
            Ok(vec![dx, db, rows])
        },
    );
    // The same value yielded twice, and an input yielded as it is.
    let x = g.array(DType::F32, &[3, 4], false, false);
    check("repeated outputs", &[rows(4)], vec![x], EXACT, |b, a| {
        let y = b.unary(UnaryOp::Neg, a[0])?;
        Ok(vec![y, a[0], y])
    });
    // A constant-only kernel.
    check("constant", &[], vec![], EXACT, |b, _| {
        let c = b.constant(
            Literal::F32(vec![2.5]),
            Type::new(DType::F32, fixed(&[3, 5])),
        )?;
        Ok(vec![b.unary(UnaryOp::Neg, c)?])
    });
}

/// Rows long enough for tiles (512 elements), and not multiples of the vector width: the
/// kernels' groups run as tile programs, a tile shorter at the row's end (a reduction's last
/// elements in Cranelift's scalar tail).
#[test]
fn long_rows_in_tile_programs() {
    let mut g = Gen::new(11);
    let n = Dim::sym("N");
    let rows = |c: usize| Type::new(DType::F32, Shape(vec![n.clone(), Dim::Fixed(c)]));
    for c in [13usize, 512, 1100, 2049] {
        let x = g.array(DType::F32, &[3, c], false, false);
        let bias = g.array(DType::F32, &[c], false, false);
        let col = Type::new(DType::F32, fixed(&[c]));
        // `1 + tanh` cancels where tanh is near −1: a few ULPs of tanh, absolutely.
        let gelu_tol = Tolerance {
            abs: 1e-5,
            ..APPROX
        };
        check(
            "gelu (tanh)",
            &[rows(c), col],
            vec![x.clone(), bias],
            gelu_tol,
            |b, a| {
                let shape = b.value_type(a[0]).shape.clone();
                let bias = b.broadcast_to(a[1], &shape)?;
                let v = b.add(a[0], bias)?;
                let v3 = b.mul(v, v)?;
                let v3 = b.mul(v3, v)?;
                let k = b.scalar(DType::F32, 0.044715)?;
                let inner = b.mul(v3, k)?;
                let inner = b.add(v, inner)?;
                let t = b.unary(UnaryOp::Tanh, inner)?;
                let one = b.scalar(DType::F32, 1.0)?;
                let t1 = b.add(t, one)?;
                Ok(vec![b.mul(v, t1)?])
            },
        );
        check("softmax", &[rows(c)], vec![x.clone()], APPROX, |b, a| {
            let m = b.reduce(ReduceOp::Max, a[0], vec![1], true)?;
            let d = b.sub(a[0], m)?;
            let e = b.unary(UnaryOp::Exp, d)?;
            let s = b.reduce(ReduceOp::Sum, e, vec![1], true)?;
            Ok(vec![b.div(e, s)?])
        });
        // Transcendentals of transcendentals, and several ops in one tile.
        check("nested", &[rows(c)], vec![x.clone()], SUMS, |b, a| {
            let t = b.unary(UnaryOp::Tanh, a[0])?;
            let e = b.unary(UnaryOp::Exp, t)?;
            let s = b.unary(UnaryOp::Sigmoid, a[0])?;
            let p = b.unary(UnaryOp::Softplus, a[0])?;
            let ax = b.unary(UnaryOp::Abs, a[0])?;
            let l = b.unary(UnaryOp::Log, ax)?;
            let r = b.unary(UnaryOp::Erf, l)?;
            let y = b.add(e, s)?;
            let y = b.add(y, p)?;
            let total = b.reduce(ReduceOp::Sum, r, vec![1], false)?;
            Ok(vec![y, r, total])
        });
    }
}

/// Every f32 op again beside an `exp` on rows long enough to vectorise, so that its group
/// becomes a tile program where the CPU runs them: each op's program form against the
/// interpreter and (in `check`) against Cranelift's own bits, special values included.
#[test]
fn every_op_in_a_tile_program() {
    let mut g = Gen::new(3);
    let f32 = DType::F32;
    let beside_exp = |b: &mut FunctionBuilder, x: Value, y: Value| -> BuildResult<Vec<Value>> {
        Ok(vec![y, b.unary(UnaryOp::Exp, x)?])
    };
    for shape in [&[3, 37][..], &[2, 130], &[1029]] {
        let ty = Type::new(f32, fixed(shape));
        let row = &shape[shape.len() - 1..];
        for &op in UnaryOp::ALL
            .iter()
            .filter(|&&o| accepts(o.operand_class(), f32))
        {
            let x = g.array(f32, shape, true, false);
            let what = format!("{} beside exp {shape:?}", op.name());
            check(&what, std::slice::from_ref(&ty), vec![x], APPROX, |b, a| {
                let y = b.unary(op, a[0])?;
                beside_exp(b, a[0], y)
            });
        }
        for &op in BinaryOp::ALL
            .iter()
            .filter(|&&o| accepts(o.operand_class(), f32))
        {
            for rhs in [shape, row, &[]] {
                let types = [ty.clone(), Type::new(f32, fixed(rhs))];
                let inputs = vec![
                    g.array(f32, shape, true, false),
                    g.array(f32, rhs, true, false),
                ];
                let what = format!("{} beside exp {shape:?} {rhs:?}", op.name());
                check(&what, &types, inputs, APPROX, |b, a| {
                    let y = b.binary(op, a[0], a[1])?;
                    beside_exp(b, a[0], y)
                });
            }
        }
        // Pairs of cheap ops, which a program runs as one fused pass, the intermediate on
        // either side of the second op.
        let cheap = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul];
        for (first, then, swap) in (cheap.iter()).flat_map(|&f| {
            cheap
                .iter()
                .flat_map(move |&t| [(f, t, false), (f, t, true)])
        }) {
            for rhs in [shape, row, &[]] {
                let types = [ty.clone(), Type::new(f32, fixed(rhs)), ty.clone()];
                let inputs = vec![
                    g.array(f32, shape, true, false),
                    g.array(f32, rhs, true, false),
                    g.array(f32, shape, true, false),
                ];
                let what = format!(
                    "{} then {} (swapped: {swap}) beside exp {shape:?} {rhs:?}",
                    first.name(),
                    then.name()
                );
                check(&what, &types, inputs, APPROX, |b, a| {
                    let t = b.binary(first, a[0], a[1])?;
                    let y = match swap {
                        false => b.binary(then, t, a[2])?,
                        true => b.binary(then, a[2], t)?,
                    };
                    beside_exp(b, a[0], y)
                });
            }
            // The pair then scaled, by a scalar on either side (one pass with its scale),
            // and by a tile (no scale: two passes).
            for (by, scale_first) in [(&[][..], false), (&[][..], true), (shape, false)] {
                let types = [ty.clone(), ty.clone(), Type::new(f32, fixed(by))];
                let inputs = vec![
                    g.array(f32, shape, true, false),
                    g.array(f32, shape, true, false),
                    g.array(f32, by, true, false),
                ];
                let what = format!(
                    "{} then {} (swapped: {swap}) scaled by {by:?} (scale first: {scale_first})",
                    first.name(),
                    then.name()
                );
                check(&what, &types, inputs, APPROX, |b, a| {
                    let t = b.binary(first, a[0], a[1])?;
                    let y = match swap {
                        false => b.binary(then, t, a[0])?,
                        true => b.binary(then, a[0], t)?,
                    };
                    let z = match scale_first {
                        false => b.binary(BinaryOp::Mul, y, a[2])?,
                        true => b.binary(BinaryOp::Mul, a[2], y)?,
                    };
                    beside_exp(b, a[0], z)
                });
            }
        }
        for &op in ReduceOp::ALL {
            let x = g.array(f32, shape, true, false);
            let what = format!("{} beside exp {shape:?}", op.name());
            check(&what, std::slice::from_ref(&ty), vec![x], SUMS, |b, a| {
                let y = b.reduce(op, a[0], vec![shape.len() - 1], false)?;
                beside_exp(b, a[0], y)
            });
        }
    }
}

/// A stage with both codes takes one by its row length alone: the same code on every call,
/// from the first (before, its first calls alternated between the two and timed them).
#[test]
fn a_stage_with_both_codes_chooses_one_by_its_row_length() {
    let mut b = FunctionBuilder::new("k");
    let x = b.arg("x", Type::new(DType::F32, fixed(&[64, 1024])));
    let y = b.unary(UnaryOp::Tanh, x).unwrap();
    let z = b.unary(UnaryOp::Exp, y).unwrap();
    let func = b.finish(&[z]).unwrap();
    let kernel = jit::kernel(&func).unwrap();
    let stage = &kernel.stages[0];
    if tile_program::isa() == Isa::Off {
        assert!(stage.programs.is_none());
        return;
    }
    assert_eq!(stage.program_ops, ["exp", "tanh", "tile program"]);
    assert_eq!(stage.path_for(jit::PROGRAMS_MIN_ROW), Path::Programs);
    assert_eq!(stage.path_for(jit::PROGRAMS_MIN_ROW - 1), Path::Cranelift);
    let input = Gen::new(12).array(DType::F32, &[64, 1024], false, false);
    let first = kernel.call(&[&input]).unwrap();
    for _ in 0..10 {
        assert_eq!(kernel.call(&[&input]).unwrap(), first, "the paths differ");
    }
}

/// The ISA level tile programs run at in this process, named in the output: when a parent
/// test (or CI, on a machine with AVX-512) sets `KILN_EXPECT_ISA`, it must be that one; with no
/// cap, it is the best this CPU has, so no test silently runs below the machine's width.
#[test]
fn isa_in_use() {
    let isa = tile_program::isa();
    eprintln!("tile programs run at: {}", isa.name());
    if let Ok(expected) = std::env::var("KILN_EXPECT_ISA") {
        assert_eq!(isa.name(), expected);
    }
    if std::env::var("KILN_VECTOR_MATH").is_err() {
        let best = (Isa::ALL.into_iter()).filter(|i| i.supported()).max();
        assert_eq!(Some(isa), best, "below the CPU's best");
    }
}

/// The differential tests again in child processes whose `KILN_VECTOR_MATH` caps the tile
/// programs at each lower level — AVX2, and off (Cranelift's code alone, as on a CPU without
/// AVX2) — so every code shipped is checked against the interpreter on this machine.
#[test]
fn differential_tests_at_every_isa_level() {
    let exe = std::env::current_exe().expect("the test binary");
    for cap in [Isa::Off, Isa::Avx2] {
        let expected = (Isa::ALL.into_iter())
            .filter(|&i| i <= cap && i.supported())
            .max()
            .expect("off is always supported");
        let out = std::process::Command::new(&exe)
            .args(["--exact", "isa_in_use", "unary_ops", "fused_patterns"])
            .args(["long_rows_in_tile_programs", "every_op_in_a_tile_program"])
            .args(["masks_in_tile_programs"])
            .args(["--test-threads", "1"])
            .env("KILN_VECTOR_MATH", cap.name())
            .env("KILN_EXPECT_ISA", expected.name())
            .output()
            .expect("the test binary runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("6 passed"),
            "KILN_VECTOR_MATH={}:\n{stdout}\n{}",
            cap.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `f32[N, 6, 3, 5]`: activations of 6 channels.
fn nchw_type(n: &Dim) -> Type {
    Type::new(
        DType::F32,
        Shape(vec![n.clone(), 6.into(), 3.into(), 5.into()]),
    )
}

/// The NCHW bias kernel of `fused_patterns` is planned over collapsed axes: `[N, 6, 15]`.
#[test]
fn channel_axes_collapse() {
    let n = Dim::sym("N");
    let mut b = FunctionBuilder::new("k");
    let x = b.arg("x", nchw_type(&n));
    let bias = b.arg("b", Type::new(DType::F32, fixed(&[1, 6, 1, 1])));
    let shape = b.value_type(x).shape.clone();
    let spread = b.broadcast_to(bias, &shape).unwrap();
    let y = b.add(x, spread).unwrap();
    let func = b.finish(&[y]).unwrap();
    let kernel = jit::kernel(&func).unwrap();
    let domain = &kernel.plan.stages[0].domain;
    assert_eq!(*domain, Shape(vec![n.clone(), 6.into(), 15.into()]));
}

/// A bias gradient (a sum over N, H and W) is a row sum along `H·W` in the rows stage, then a
/// one-thread sum over N of the `[N, 6, 1]` row sums only.
#[test]
fn reductions_split_off_their_last_axis() {
    let n = Dim::sym("N");
    let mut b = FunctionBuilder::new("k");
    let g = b.arg("g", nchw_type(&n));
    let relu = b.unary(UnaryOp::Relu, g).unwrap();
    let db = b.reduce(ReduceOp::Sum, relu, vec![0, 2, 3], true).unwrap();
    let func = b.finish(&[relu, db]).unwrap();
    let kernel = jit::kernel(&func).unwrap();
    let domains: Vec<(Shape, bool)> = (kernel.plan.stages.iter())
        .map(|s| (s.domain.clone(), s.accumulate))
        .collect();
    let rows = Shape(vec![n.clone(), 6.into(), 15.into()]);
    let row_sums = Shape(vec![n, 6.into(), 1.into()]);
    assert_eq!(domains, vec![(rows, false), (row_sums, true)]);
}

#[test]
fn symbolic_sizes_compile_once() {
    let n = Dim::sym("N");
    let ty = Type::new(DType::F32, Shape(vec![n, Dim::Fixed(6)]));
    let mut b = FunctionBuilder::new("k");
    let x = b.arg("x", ty);
    let e = b.unary(UnaryOp::Exp, x).unwrap();
    let s = b.reduce(ReduceOp::Sum, e, vec![1], true).unwrap();
    let y = b.div(e, s).unwrap();
    let func = b.finish(&[y]).unwrap();
    let first = jit::kernel(&func).unwrap();
    for rows in [0usize, 1, 3, 100, 1000] {
        let x = Gen::new(rows as u64).array(DType::F32, &[rows, 6], false, false);
        let k = jit::kernel(&func).unwrap();
        assert!(
            std::sync::Arc::ptr_eq(&k, &first),
            "the cached kernel serves every size"
        );
        let y = k.call(&[&x]).unwrap();
        assert_eq!(y[0].shape(), &[rows, 6]);
    }
    // A function with the same text, built separately, hits the cache too.
    let again = jit::kernel(&func.clone()).unwrap();
    assert!(std::sync::Arc::ptr_eq(&again, &first));
}

/// A tile program reading one register twice (`t·t`) freed its scratch tile twice, so two
/// later values shared one tile while both were live: a silent wrong answer on the program's
/// path. Found when an Adam update (this kernel's shape, with an `exp` so that its stage has a
/// program) gave another loss under parameter servers than in one process.
#[test]
fn a_program_reading_a_register_twice_frees_its_tile_once() {
    let ty = Type::new(DType::F32, fixed(&[1024]));
    let inputs: Vec<Array> = (0..3)
        .map(|i| Gen::new(40 + i).array(DType::F32, &[1024], false, false))
        .collect();
    check(
        "adam-like update",
        &[ty.clone(), ty.clone(), ty],
        inputs,
        APPROX,
        |b, a| {
            let (x, m, v) = (a[0], a[1], a[2]);
            let scalar = |b: &mut FunctionBuilder, c: f64| b.scalar(DType::F32, c);
            let three = scalar(b, 3.0)?;
            let g = b.div(x, three)?;
            let (c1, c2) = (scalar(b, 0.9)?, scalar(b, 0.1)?);
            let m1 = b.mul(m, c1)?;
            let g1 = b.mul(g, c2)?;
            let m_next = b.add(m1, g1)?;
            let g2 = b.mul(g, g)?;
            let (c3, c4) = (scalar(b, 0.999)?, scalar(b, 0.001)?);
            let v1 = b.mul(v, c3)?;
            let g3 = b.mul(g2, c4)?;
            let v_next = b.add(v1, g3)?;
            let root = b.unary(UnaryOp::Sqrt, v_next)?;
            let eps = scalar(b, 1e-8)?;
            let denom = b.add(root, eps)?;
            let step = b.div(m_next, denom)?;
            let lr = scalar(b, 0.01)?;
            let scaled = b.mul(step, lr)?;
            let w = b.sub(x, scaled)?;
            let e = b.unary(UnaryOp::Exp, w)?;
            Ok(vec![m_next, v_next, w, e])
        },
    );
}

/// The masks' ops — comparisons, selects, bool logic, casts between f32 and bool — in the
/// groups tile programs run, on rows long and short, beside a transcendental: their programs
/// against the interpreter and against Cranelift's bits (in `check`).
fn mask_groups(b: &mut FunctionBuilder, a: &[Value]) -> BuildResult<Vec<Value>> {
    let lt = b.compare(CompareOp::Lt, a[0], a[1])?;
    let one = b.scalar(DType::F32, 1.0)?;
    let gt = b.compare(CompareOp::Gt, a[0], one)?;
    let not_gt = b.unary(UnaryOp::Not, gt)?;
    let both = b.binary(BinaryOp::And, lt, not_gt)?;
    let either = b.binary(BinaryOp::Or, lt, gt)?;
    let neither = b.binary(BinaryOp::Xor, both, either)?;
    let as_float = b.cast(neither, DType::F32)?;
    let e = b.unary(UnaryOp::Exp, a[1])?;
    let picked = b.select(both, e, as_float)?;
    let nonzero = b.cast(a[0], DType::Bool)?;
    let masked = b.select(nonzero, picked, a[1])?;
    // A row-level bool: a comparison of two scalars.
    let zero = b.scalar(DType::F32, 0.0)?;
    let always = b.compare(CompareOp::Le, zero, one)?;
    let shape = b.value_type(a[0]).shape.clone();
    let always = b.broadcast_to(always, &shape)?;
    let kept = b.select(always, masked, zero)?;
    let relu_grad = b.compare(CompareOp::Ge, a[0], zero)?;
    let relu_grad = b.select(relu_grad, a[1], zero)?;
    Ok(vec![kept, relu_grad])
}

#[test]
fn masks_in_tile_programs() {
    let mut g = Gen::new(13);
    for shape in [&[3, 37][..], &[2, 130], &[1029]] {
        let ty = Type::new(DType::F32, fixed(shape));
        let types = [ty.clone(), ty];
        let mut inputs = vec![
            g.array(DType::F32, shape, true, false),
            g.array(DType::F32, shape, true, false),
        ];
        // Zeros and equal pairs, so that every comparison and cast has both answers.
        if let (Array::F32(a), Array::F32(b)) = (&inputs[0].clone(), &mut inputs[1]) {
            (b.iter_mut().zip(a.iter()).step_by(3)).for_each(|(y, x)| *y = *x);
        }
        if let Array::F32(a) = &mut inputs[0] {
            a.iter_mut().step_by(5).for_each(|x| *x = 0.0);
        }
        check(
            &format!("masks {shape:?}"),
            &types,
            inputs,
            APPROX,
            mask_groups,
        );
    }
}

/// Every op with an f32 vector form, and the masks' ops, run in a tile program where the CPU
/// runs them (a group a program cannot hold falls back to Cranelift's 128-bit code, slower
/// but right, so only this test would notice).
#[test]
fn every_vector_op_runs_in_a_tile_program() {
    if tile_program::isa() == Isa::Off {
        return;
    }
    let ty = Type::new(DType::F32, fixed(&[1029]));
    let in_program = |what: &str, build: &dyn Fn(&mut FunctionBuilder, Value, Value) -> Value| {
        let mut b = FunctionBuilder::new("k");
        let (x, y) = (b.arg("x", ty.clone()), b.arg("y", ty.clone()));
        let z = build(&mut b, x, y);
        let func = b.finish(&[z]).unwrap();
        let kernel = jit::kernel(&func).unwrap();
        let ops = &kernel.stages[0].program_ops;
        assert!(
            ops.contains(&"tile program"),
            "{what}: no tile program\n{func}"
        );
    };
    for &op in UnaryOp::ALL {
        if op.vector_form() == kiln_ir::VectorForm::F32x4 && accepts(op.operand_class(), DType::F32)
        {
            in_program(op.name(), &|b, x, _| b.unary(op, x).unwrap());
        }
    }
    for &op in BinaryOp::ALL {
        if op.vector_form() == kiln_ir::VectorForm::F32x4 && accepts(op.operand_class(), DType::F32)
        {
            in_program(op.name(), &|b, x, y| b.binary(op, x, y).unwrap());
        }
    }
    in_program("masks", &|b, x, y| mask_groups(b, &[x, y]).unwrap()[0]);
}
