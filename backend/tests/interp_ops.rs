//! Every op through the reference interpreter, against values computed by hand or by an
//! independent formula, for every dtype the op accepts, including the error cases.

use kiln_backend::{Array, CustomOpError, CustomOps, Interpreter, StateStore};
use kiln_ir::{
    ArgOp, AxisSlice, BinaryOp, BuildResult, CompareOp, Conv2dAttrs, DType, FunctionBuilder,
    Initializer, Literal, Module, Pool2dAttrs, PoolKind, ReduceOp, Shape, StateDecl, Type, UnaryOp,
    Value, verify_module,
};
use ndarray::{ArrayD, IxDyn};

fn f32s(shape: &[usize], v: &[f32]) -> Array {
    Array::F32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}
fn f64s(shape: &[usize], v: &[f64]) -> Array {
    Array::F64(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}
fn i32s(shape: &[usize], v: &[i32]) -> Array {
    Array::I32(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}
fn i64s(shape: &[usize], v: &[i64]) -> Array {
    Array::I64(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}
fn bools(shape: &[usize], v: &[bool]) -> Array {
    Array::Bool(ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap())
}

/// Builds a function over arguments typed like `args`, verifies it, and runs it.
fn eval_in(
    module: &mut Module,
    state: &mut StateStore,
    args: Vec<Array>,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> Result<Vec<Array>, String> {
    let mut b = FunctionBuilder::new("f");
    let params: Vec<Value> = args
        .iter()
        .enumerate()
        .map(|(i, a)| b.arg(&format!("a{i}"), a.ty()))
        .collect();
    let results = build(&mut b, &params).map_err(|e| e.to_string())?;
    let func = b.finish(&results).map_err(|e| e.to_string())?;
    module.add_function(func);
    verify_module(module).map_err(|e| e.to_string())?;
    Interpreter::new(module)
        .run("f", args, state)
        .map_err(|e| e.to_string())
}

fn eval(
    args: Vec<Array>,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
) -> Result<Vec<Array>, String> {
    eval_in(&mut Module::new(), &mut StateStore::new(), args, build)
}

fn eval1(
    args: Vec<Array>,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) -> Array {
    eval(args, |b, p| Ok(vec![build(b, p)?])).unwrap().remove(0)
}

fn eval_err(
    args: Vec<Array>,
    build: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Value>,
) -> String {
    eval(args, |b, p| Ok(vec![build(b, p)?])).unwrap_err()
}

fn values(a: &Array) -> Vec<f64> {
    a.to_f64_vec()
}

fn unary(op: UnaryOp, x: Array) -> Array {
    eval1(vec![x], |b, p| b.unary(op, p[0]))
}

#[track_caller]
fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!(
            g == w || (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn unary_float_ops_match_hand_values() {
    let x = [-1.5, 0.0, 0.5, 2.0];
    let cases: [(UnaryOp, [f64; 4]); 16] = [
        (UnaryOp::Neg, [1.5, -0.0, -0.5, -2.0]),
        (UnaryOp::Abs, [1.5, 0.0, 0.5, 2.0]),
        (UnaryOp::Sign, [-1.0, 0.0, 1.0, 1.0]),
        (UnaryOp::Relu, [0.0, 0.0, 0.5, 2.0]),
        (
            UnaryOp::Exp,
            [
                0.22313016014842982,
                1.0,
                1.6487212707001282,
                7.38905609893065,
            ],
        ),
        (
            UnaryOp::Tanh,
            [
                -0.9051482536448664,
                0.0,
                0.46211715726000974,
                0.9640275800758169,
            ],
        ),
        (
            UnaryOp::Sigmoid,
            [
                0.18242552380635635,
                0.5,
                0.6224593312018546,
                0.8807970779778823,
            ],
        ),
        (
            UnaryOp::Softplus,
            [
                0.2014132779827524,
                std::f64::consts::LN_2,
                0.9740769841801067,
                2.1269280110429727,
            ],
        ),
        (
            UnaryOp::Erf,
            [
                -0.9661051464753108,
                0.0,
                0.5204998778130465,
                0.9953222650189527,
            ],
        ),
        (
            UnaryOp::Sin,
            [
                -0.9974949866040544,
                0.0,
                0.479425538604203,
                0.9092974268256817,
            ],
        ),
        (
            UnaryOp::Cos,
            [
                0.0707372016677029,
                1.0,
                0.8775825618903728,
                -0.4161468365471424,
            ],
        ),
        (UnaryOp::Floor, [-2.0, 0.0, 0.0, 2.0]),
        (UnaryOp::Ceil, [-1.0, 0.0, 1.0, 2.0]),
        (UnaryOp::Round, [-2.0, 0.0, 0.0, 2.0]),
        (
            UnaryOp::Recip,
            [-0.6666666666666666, f64::INFINITY, 2.0, 0.5],
        ),
        (
            UnaryOp::Rsqrt,
            [
                f64::NAN,
                f64::INFINITY,
                std::f64::consts::SQRT_2,
                std::f64::consts::FRAC_1_SQRT_2,
            ],
        ),
    ];
    for (op, want) in cases {
        close(&values(&unary(op, f64s(&[4], &x))), &want, 1e-15);
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        close(&values(&unary(op, f32s(&[4], &x32))), &want, 2e-7);
    }
    let pos = [0.25, 1.0, 4.0];
    close(
        &values(&unary(UnaryOp::Log, f64s(&[3], &pos))),
        &[-1.3862943611198906, 0.0, 1.3862943611198906],
        1e-15,
    );
    close(
        &values(&unary(UnaryOp::Sqrt, f64s(&[3], &pos))),
        &[0.5, 1.0, 2.0],
        0.0,
    );
}

#[test]
fn float_edge_cases() {
    // Rounding is half to even; sigmoid never overflows; relu and sign keep NaN.
    let halves = f64s(&[4], &[0.5, 1.5, 2.5, -0.5]);
    assert_eq!(
        values(&unary(UnaryOp::Round, halves)),
        [0.0, 2.0, 2.0, -0.0]
    );
    let extreme = f32s(&[2], &[-1000.0, 1000.0]);
    assert_eq!(values(&unary(UnaryOp::Sigmoid, extreme)), [0.0, 1.0]);
    let nan = f32s(&[1], &[f32::NAN]);
    assert!(values(&unary(UnaryOp::Relu, nan.clone()))[0].is_nan());
    assert!(values(&unary(UnaryOp::Sign, nan))[0].is_nan());
}

#[test]
fn unary_integer_and_bool_ops() {
    let x = i32s(&[4], &[i32::MIN, -3, 0, 7]);
    assert_eq!(
        values(&unary(UnaryOp::Neg, x.clone())),
        [i32::MIN as f64, 3.0, 0.0, -7.0],
        "wraps"
    );
    assert_eq!(
        values(&unary(UnaryOp::Abs, x.clone())),
        [i32::MIN as f64, 3.0, 0.0, 7.0],
        "wraps"
    );
    assert_eq!(
        values(&unary(UnaryOp::Sign, x.clone())),
        [-1.0, -1.0, 0.0, 1.0]
    );
    assert_eq!(values(&unary(UnaryOp::Relu, x)), [0.0, 0.0, 0.0, 7.0]);
    let i = i64s(&[2], &[-5, 5]);
    assert_eq!(values(&unary(UnaryOp::Abs, i)), [5.0, 5.0]);
    let b = bools(&[2], &[true, false]);
    assert_eq!(unary(UnaryOp::Not, b), bools(&[2], &[false, true]));
}

fn binary(op: BinaryOp, a: Array, b: Array) -> Result<Array, String> {
    eval(vec![a, b], |bld, p| Ok(vec![bld.binary(op, p[0], p[1])?])).map(|mut v| v.remove(0))
}

#[test]
fn binary_float_ops() {
    let a = f64s(&[4], &[1.0, -2.0, 3.0, f64::NAN]);
    let b = f64s(&[4], &[4.0, 0.5, -3.0, 1.0]);
    let cases: [(BinaryOp, [f64; 4]); 7] = [
        (BinaryOp::Add, [5.0, -1.5, 0.0, f64::NAN]),
        (BinaryOp::Sub, [-3.0, -2.5, 6.0, f64::NAN]),
        (BinaryOp::Mul, [4.0, -1.0, -9.0, f64::NAN]),
        (BinaryOp::Div, [0.25, -4.0, -1.0, f64::NAN]),
        (BinaryOp::Max, [4.0, 0.5, 3.0, f64::NAN]),
        (BinaryOp::Min, [1.0, -2.0, -3.0, f64::NAN]),
        (BinaryOp::Pow, [1.0, f64::NAN, 1.0 / 27.0, f64::NAN]),
    ];
    for (op, want) in cases {
        close(
            &values(&binary(op, a.clone(), b.clone()).unwrap()),
            &want,
            1e-15,
        );
    }
    // f32 with NumPy broadcasting through the builder: [2,1] + [3] -> [2,3].
    let col = f32s(&[2, 1], &[10.0, 20.0]);
    let row = f32s(&[3], &[1.0, 2.0, 3.0]);
    let sum = binary(BinaryOp::Add, col, row).unwrap();
    assert_eq!(sum.shape(), &[2, 3]);
    assert_eq!(values(&sum), [11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
}

#[test]
fn binary_integer_ops_wrap_and_truncate() {
    let a = i32s(&[4], &[i32::MAX, -7, 7, 6]);
    let b = i32s(&[4], &[1, 2, -2, 3]);
    assert_eq!(
        values(&binary(BinaryOp::Add, a.clone(), b.clone()).unwrap()),
        [i32::MIN as f64, -5.0, 5.0, 9.0]
    );
    assert_eq!(
        values(&binary(BinaryOp::Div, a.clone(), b.clone()).unwrap()),
        [i32::MAX as f64, -3.0, -3.0, 2.0]
    );
    assert_eq!(
        values(&binary(BinaryOp::Mul, a.clone(), b.clone()).unwrap()),
        [i32::MAX as f64, -14.0, -14.0, 18.0]
    );
    assert_eq!(
        values(&binary(BinaryOp::Max, a.clone(), b.clone()).unwrap()),
        [i32::MAX as f64, 2.0, 7.0, 6.0]
    );
    let zero = i32s(&[4], &[1, 0, 1, 1]);
    let err = binary(BinaryOp::Div, a, zero).unwrap_err();
    assert!(
        err.contains("`div` at") && err.contains("integer division by zero"),
        "{err}"
    );
    let big = i64s(&[1], &[i64::MIN]);
    let minus_one = i64s(&[1], &[-1]);
    assert_eq!(
        values(&binary(BinaryOp::Div, big, minus_one).unwrap()),
        [i64::MIN as f64],
        "wraps"
    );
}

#[test]
fn bool_ops_and_comparisons() {
    let p = bools(&[4], &[true, true, false, false]);
    let q = bools(&[4], &[true, false, true, false]);
    assert_eq!(
        binary(BinaryOp::And, p.clone(), q.clone()).unwrap(),
        bools(&[4], &[true, false, false, false])
    );
    assert_eq!(
        binary(BinaryOp::Or, p.clone(), q.clone()).unwrap(),
        bools(&[4], &[true, true, true, false])
    );
    assert_eq!(
        binary(BinaryOp::Xor, p, q).unwrap(),
        bools(&[4], &[false, true, true, false])
    );

    let a = i64s(&[3], &[1, 2, 3]);
    let b = i64s(&[3], &[2, 2, 2]);
    let cmp = |op| {
        eval1(vec![a.clone(), b.clone()], |bld, p| {
            bld.compare(op, p[0], p[1])
        })
    };
    assert_eq!(cmp(CompareOp::Eq), bools(&[3], &[false, true, false]));
    assert_eq!(cmp(CompareOp::Ne), bools(&[3], &[true, false, true]));
    assert_eq!(cmp(CompareOp::Lt), bools(&[3], &[true, false, false]));
    assert_eq!(cmp(CompareOp::Le), bools(&[3], &[true, true, false]));
    assert_eq!(cmp(CompareOp::Gt), bools(&[3], &[false, false, true]));
    assert_eq!(cmp(CompareOp::Ge), bools(&[3], &[false, true, true]));
    let nan = f32s(&[1], &[f32::NAN]);
    let eq = eval1(vec![nan.clone(), nan.clone()], |bld, p| {
        bld.compare(CompareOp::Eq, p[0], p[1])
    });
    let ne = eval1(vec![nan.clone(), nan], |bld, p| {
        bld.compare(CompareOp::Ne, p[0], p[1])
    });
    assert_eq!((eq, ne), (bools(&[1], &[false]), bools(&[1], &[true])));
}

#[test]
fn select_and_cast() {
    let c = bools(&[3], &[true, false, true]);
    let out = eval1(
        vec![c, f32s(&[3], &[1.0, 2.0, 3.0]), f32s(&[], &[-1.0])],
        |b, p| b.select(p[0], p[1], p[2]),
    );
    assert_eq!(values(&out), [1.0, -1.0, 3.0]);

    let x = f32s(&[5], &[3e9, -3e9, f32::NAN, -2.7, 2.7]);
    let to_i32 = eval1(vec![x.clone()], |b, p| b.cast(p[0], DType::I32));
    assert_eq!(
        to_i32,
        i32s(&[5], &[i32::MAX, i32::MIN, 0, -2, 2]),
        "saturating, NaN gives 0"
    );
    let to_bool = eval1(vec![x], |b, p| b.cast(p[0], DType::Bool));
    assert_eq!(to_bool, bools(&[5], &[true, true, true, true, true]));
    let back = eval1(vec![bools(&[2], &[true, false])], |b, p| {
        b.cast(p[0], DType::F64)
    });
    assert_eq!(back, f64s(&[2], &[1.0, 0.0]));
    let wide = eval1(vec![i64s(&[2], &[1 << 40, -1])], |b, p| {
        b.cast(p[0], DType::I32)
    });
    assert_eq!(
        wide,
        i32s(&[2], &[0, -1]),
        "integer narrowing keeps the low bits"
    );
}

/// Every permutation of ranks 0 to 4 over shapes with axes of 0, 1, odd sizes and sizes past
/// the 16-element tiles of batched matrix transposes (NCHW ↔ NHWC), in both kernels — the
/// interpreter's and the executor's, into a buffer — against ndarray's permuted view.
#[test]
fn transpose_matches_a_permuted_view_for_every_permutation() {
    fn permutations(rank: usize) -> Vec<Vec<usize>> {
        if rank == 0 {
            return vec![vec![]];
        }
        let mut all = Vec::new();
        for p in permutations(rank - 1) {
            for at in 0..=p.len() {
                let mut q = p.clone();
                q.insert(at, rank - 1);
                all.push(q);
            }
        }
        all
    }
    let shapes: [&[usize]; 8] = [
        &[],
        &[5],
        &[3, 17],
        &[2, 1, 4],
        &[2, 19, 5, 7],
        &[3, 4, 2, 2],
        &[2, 0, 3, 4],
        &[1, 33, 18, 1],
    ];
    for shape in shapes {
        let count: usize = shape.iter().product();
        let x = ArrayD::from_shape_vec(IxDyn(shape), (0..count as i64).collect()).unwrap();
        for perm in permutations(shape.len()) {
            let want = x.clone().permuted_axes(IxDyn(&perm));
            let want = Array::I64(want.as_standard_layout().into_owned());
            let got = kiln_backend::interp::kernels::transpose(&Array::I64(x.clone()), &perm);
            assert_eq!(got.unwrap(), want, "{shape:?} by {perm:?}");
            let mut into = Array::zeros(DType::I64, want.shape());
            kiln_backend::interp::kernels::transpose_into(&Array::I64(x.clone()), &perm, &mut into)
                .unwrap();
            assert_eq!(into, want, "{shape:?} by {perm:?}, into a buffer");
        }
    }
    // A buffer of another shape is refused, not overrun.
    let x = Array::I64(ArrayD::from_shape_vec(IxDyn(&[2, 3]), (0..6).collect()).unwrap());
    let mut wrong = Array::zeros(DType::I64, &[2, 3]);
    let err = kiln_backend::interp::kernels::transpose_into(&x, &[1, 0], &mut wrong);
    assert!(err.unwrap_err().to_string().contains("into [2, 3]"));
}

#[test]
fn layout_ops() {
    let x = i32s(&[2, 3], &[0, 1, 2, 3, 4, 5]);
    let b = eval1(vec![i32s(&[3], &[7, 8, 9])], |b, p| {
        b.broadcast_to(p[0], &Shape::fixed(&[2, 3]))
    });
    assert_eq!(b, i32s(&[2, 3], &[7, 8, 9, 7, 8, 9]));
    let r = eval1(vec![x.clone()], |b, p| {
        b.reshape(p[0], Shape::fixed(&[3, 1, 2]))
    });
    assert_eq!(r, i32s(&[3, 1, 2], &[0, 1, 2, 3, 4, 5]));
    let t = eval1(vec![x.clone()], |b, p| b.transpose(p[0], vec![1, 0]));
    assert_eq!(t, i32s(&[3, 2], &[0, 3, 1, 4, 2, 5]));
    let cube = f32s(&[2, 3, 4], &(0..24).map(|v| v as f32).collect::<Vec<_>>());
    let t3 = eval1(vec![cube], |b, p| b.transpose(p[0], vec![2, 0, 1]));
    assert_eq!(t3.shape(), &[4, 2, 3]);
    // t3[k, i, j] = cube[i, j, k] = 12i + 4j + k
    let want: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f64)))
        .collect();
    assert_eq!(values(&t3), want);
    let s = eval1(vec![x.clone()], |b, p| {
        b.slice(
            p[0],
            vec![
                AxisSlice::Range {
                    start: 1,
                    end: 2,
                    step: 1,
                },
                AxisSlice::Range {
                    start: 0,
                    end: 3,
                    step: 2,
                },
            ],
        )
    });
    assert_eq!(s, i32s(&[1, 2], &[3, 5]));
    let c = eval1(vec![x.clone(), i32s(&[2, 1], &[9, 9])], |b, p| {
        b.concat(&[p[0], p[1]], 1)
    });
    assert_eq!(c, i32s(&[2, 4], &[0, 1, 2, 9, 3, 4, 5, 9]));
    let empty = eval1(vec![x], |b, p| {
        b.slice(
            p[0],
            vec![
                AxisSlice::Full,
                AxisSlice::Range {
                    start: 2,
                    end: 2,
                    step: 1,
                },
            ],
        )
    });
    assert_eq!(empty.shape(), &[2, 0]);
}

fn reduce(op: ReduceOp, x: Array, axes: Vec<usize>, keep: bool) -> Result<Array, String> {
    eval(vec![x], |b, p| Ok(vec![b.reduce(op, p[0], axes, keep)?])).map(|mut v| v.remove(0))
}

#[test]
fn reductions() {
    let x = f64s(&[2, 3], &[1.0, 5.0, 3.0, -4.0, 2.0, 6.0]);
    let sum0 = reduce(ReduceOp::Sum, x.clone(), vec![0], false).unwrap();
    assert_eq!(sum0, f64s(&[3], &[-3.0, 7.0, 9.0]));
    let mean1 = reduce(ReduceOp::Mean, x.clone(), vec![1], true).unwrap();
    assert_eq!(mean1, f64s(&[2, 1], &[3.0, 4.0 / 3.0]));
    let max_all = reduce(ReduceOp::Max, x.clone(), vec![0, 1], false).unwrap();
    assert_eq!(max_all, f64s(&[], &[6.0]));
    let min_all = reduce(ReduceOp::Min, x.clone(), vec![1, 0], true).unwrap();
    assert_eq!(min_all, f64s(&[1, 1], &[-4.0]));
    let none = reduce(ReduceOp::Sum, x, vec![], false).unwrap();
    assert_eq!(none.shape(), &[2, 3], "no axes: the identity");
    let nan = f32s(&[3], &[1.0, f32::NAN, 2.0]);
    assert!(values(&reduce(ReduceOp::Max, nan, vec![0], false).unwrap())[0].is_nan());
    let ints = i32s(&[2], &[i32::MAX, 1]);
    assert_eq!(
        values(&reduce(ReduceOp::Sum, ints, vec![0], false).unwrap()),
        [i32::MIN as f64],
        "wraps"
    );
    // f32 sums accumulate in f64: 1 + 1e-8 * 1e4 keeps the small terms.
    let mut many = vec![1e-8f32; 10_000];
    many[0] = 1.0;
    let s = values(&reduce(ReduceOp::Sum, f32s(&[10_000], &many), vec![0], false).unwrap())[0];
    assert_eq!(s, (1.0f64 + 9_999.0 * 1e-8f32 as f64) as f32 as f64);
    let empty = f32s(&[2, 0], &[]);
    assert_eq!(
        values(&reduce(ReduceOp::Sum, empty.clone(), vec![1], false).unwrap()),
        [0.0, 0.0]
    );
    assert!(values(&reduce(ReduceOp::Mean, empty.clone(), vec![1], false).unwrap())[0].is_nan());
    let err = reduce(ReduceOp::Max, empty, vec![1], false).unwrap_err();
    assert!(
        err.contains("`reduce_max` over an empty axis has no value"),
        "{err}"
    );
}

#[test]
fn arg_reductions_pick_first_extreme_and_nan() {
    let x = f32s(
        &[2, 4],
        &[1.0, 7.0, 7.0, -2.0, 3.0, f32::NAN, 9.0, f32::NAN],
    );
    let amax = eval1(vec![x.clone()], |b, p| {
        b.arg_reduce(ArgOp::ArgMax, p[0], 1, false)
    });
    assert_eq!(amax, i64s(&[2], &[1, 1]));
    let amin = eval1(vec![x], |b, p| b.arg_reduce(ArgOp::ArgMin, p[0], 1, true));
    assert_eq!(amin, i64s(&[2, 1], &[3, 1]));
    let cols = eval1(vec![i32s(&[2, 2], &[5, 1, 4, 8])], |b, p| {
        b.arg_reduce(ArgOp::ArgMax, p[0], 0, false)
    });
    assert_eq!(cols, i64s(&[2], &[0, 1]));
}

#[test]
fn matmul_plain_transposed_batched_and_integer() {
    let a = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f32s(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    let ab = eval1(vec![a.clone(), b.clone()], |bld, p| bld.matmul(p[0], p[1]));
    assert_eq!(values(&ab), [58.0, 64.0, 139.0, 154.0]);
    // (aᵀ)ᵀ @ (bᵀ)ᵀ through the flags gives the same product.
    let at = f32s(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let bt = f32s(&[2, 3], &[7.0, 9.0, 11.0, 8.0, 10.0, 12.0]);
    let flags = eval1(vec![at, bt], |bld, p| bld.matmul_t(p[0], p[1], true, true));
    assert_eq!(flags, ab);
    // Batch dims broadcast: [2,1,2,3] @ [3,3,2] -> [2,3,2,2].
    let lhs: Vec<f64> = (0..12).map(|v| v as f64).collect();
    let rhs: Vec<f64> = (0..18).map(|v| (v % 5) as f64 - 2.0).collect();
    let batched = eval1(
        vec![f64s(&[2, 1, 2, 3], &lhs), f64s(&[3, 3, 2], &rhs)],
        |bld, p| bld.matmul(p[0], p[1]),
    );
    assert_eq!(batched.shape(), &[2, 3, 2, 2]);
    let mut want = Vec::new();
    for i in 0..2 {
        for j in 0..3 {
            for r in 0..2 {
                for c in 0..2 {
                    want.push(
                        (0..3)
                            .map(|k| lhs[i * 6 + r * 3 + k] * rhs[j * 6 + k * 2 + c])
                            .sum::<f64>(),
                    );
                }
            }
        }
    }
    assert_eq!(values(&batched), want);
    let ia = i64s(&[1, 2], &[i64::MAX, 1]);
    let ib = i64s(&[2, 1], &[2, 3]);
    let prod = eval1(vec![ia, ib], |bld, p| bld.matmul(p[0], p[1]));
    assert_eq!(
        prod,
        i64s(&[1, 1], &[i64::MAX.wrapping_mul(2).wrapping_add(3)]),
        "wraps"
    );
}

#[test]
fn gather_one_hot_iota() {
    let table = f32s(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let idx = i64s(&[2, 2], &[2, 0, 1, 1]);
    let g = eval1(vec![table.clone(), idx], |b, p| b.gather(p[0], p[1], 0));
    assert_eq!(g.shape(), &[2, 2, 2]);
    assert_eq!(values(&g), [20.0, 21.0, 0.0, 1.0, 10.0, 11.0, 10.0, 11.0]);
    let cols = eval1(vec![table.clone(), i32s(&[3], &[1, 1, 0])], |b, p| {
        b.gather(p[0], p[1], 1)
    });
    assert_eq!(
        values(&cols),
        [1.0, 1.0, 0.0, 11.0, 11.0, 10.0, 21.0, 21.0, 20.0]
    );
    for bad in [3, -1] {
        let err = eval_err(vec![table.clone(), i64s(&[1], &[bad])], |b, p| {
            b.gather(p[0], p[1], 0)
        });
        assert!(
            err.contains(&format!("index {bad} is out of range for axis 0 of size 3")),
            "{err}"
        );
    }
    let oh = eval1(vec![i32s(&[3], &[2, 0, 1])], |b, p| {
        b.one_hot(p[0], 3, DType::F32)
    });
    assert_eq!(values(&oh), [0., 0., 1., 1., 0., 0., 0., 1., 0.]);
    let ohb = eval1(vec![i64s(&[1], &[1])], |b, p| {
        b.one_hot(p[0], 2, DType::Bool)
    });
    assert_eq!(ohb, bools(&[1, 2], &[false, true]));
    let err = eval_err(vec![i64s(&[1], &[5])], |b, p| {
        b.one_hot(p[0], 3, DType::F32)
    });
    assert!(err.contains("label 5 is out of range for depth 3"), "{err}");
    let io = eval1(vec![], |b, _| {
        b.iota(Type::new(DType::F32, Shape::fixed(&[2, 3])), 1)
    });
    assert_eq!(values(&io), [0., 1., 2., 0., 1., 2.]);
}

#[test]
fn random_ops_are_seeded_and_in_range() {
    let ty = Type::new(DType::F32, Shape::fixed(&[10_000]));
    let draw = |seed: u64, counter: u64| {
        let mut b = FunctionBuilder::new("f");
        let u = b.random_uniform(ty.clone(), -2.0, 3.0, seed).unwrap();
        let n = b.random_normal(ty.clone(), 1.0, 0.5, seed).unwrap();
        let mut m = Module::new();
        m.add_function(b.finish(&[u, n]).unwrap());
        Interpreter::new(&m)
            .with_rng_counter(counter)
            .run("f", vec![], &mut StateStore::new())
            .unwrap()
    };
    let first = draw(3, 0);
    let u = values(&first[0]);
    assert!(u.iter().all(|&v| (-2.0..=3.0).contains(&v)));
    let mean = u.iter().sum::<f64>() / u.len() as f64;
    assert!((mean - 0.5).abs() < 0.05, "{mean}");
    let n = values(&first[1]);
    let nmean = n.iter().sum::<f64>() / n.len() as f64;
    let nstd = (n.iter().map(|v| (v - nmean).powi(2)).sum::<f64>() / n.len() as f64).sqrt();
    assert!(
        (nmean - 1.0).abs() < 0.02 && (nstd - 0.5).abs() < 0.02,
        "{nmean} {nstd}"
    );
    assert_eq!(first, draw(3, 0));
    assert_ne!(first, draw(4, 0));
    assert_ne!(first, draw(3, 1));
}

#[test]
fn stores_commit_when_the_function_returns() {
    let decl = StateDecl {
        name: "counter".into(),
        ty: Type::scalar(DType::F32),
        init: Initializer::constant(1.0),
    };
    let mut module = Module::new();
    module.declare_state(decl.clone()).unwrap();
    let mut state = StateStore::initialize(&module).unwrap();
    let results = eval_in(&mut module, &mut state, vec![], |b, _| {
        let v = b.load(&decl)?;
        let two = b.scalar(DType::F32, 2.0)?;
        let doubled = b.mul(v, two)?;
        b.store(&decl, doubled)?;
        // A load after the store still reads the value the function was called with.
        let again = b.load(&decl)?;
        Ok(vec![again])
    })
    .unwrap();
    assert_eq!(values(&results[0]), [1.0]);
    assert_eq!(values(state.get("counter").unwrap()), [2.0]);
}

#[test]
fn cond_and_while() {
    let pick = |p: bool| {
        eval1(vec![bools(&[], &[p]), f32s(&[2], &[1.0, 2.0])], |b, a| {
            let (x, p) = (a[1], a[0]);
            Ok(b.cond(p, |b| Ok(vec![b.exp(x)?]), |b| Ok(vec![b.neg(x)?]))?[0])
        })
    };
    close(&values(&pick(true)), &[1f64.exp(), 2f64.exp()], 1e-6);
    assert_eq!(values(&pick(false)), [-1.0, -2.0]);
    // Sum of 1..=n with a while loop; n = 0 runs the body zero times.
    for n in [0, 1, 10] {
        let out = eval(vec![i64s(&[], &[n])], |b, a| {
            let n = a[0];
            let zero = b.scalar(DType::I64, 0.0)?;
            b.while_loop(
                &[zero, zero],
                |b, c| b.compare(CompareOp::Lt, c[0], n),
                |b, c| {
                    let one = b.scalar(DType::I64, 1.0)?;
                    let i = b.add(c[0], one)?;
                    Ok(vec![i, b.add(c[1], i)?])
                },
            )
        })
        .unwrap();
        assert_eq!(values(&out[1]), [(n * (n + 1) / 2) as f64]);
    }
}

struct Doubler;

impl CustomOps for Doubler {
    fn call(&self, name: &str, args: &[Array]) -> Result<Vec<Array>, CustomOpError> {
        match (name, args) {
            ("double", [Array::F32(x)]) => Ok(vec![Array::F32(x * 2.0)]),
            _ => Err(CustomOpError(format!("unknown op {name}"))),
        }
    }
}

#[test]
fn custom_op_calls_go_to_the_registry() {
    let mut b = FunctionBuilder::new("f");
    let x = b.arg("x", Type::new(DType::F32, Shape::fixed(&[2])));
    let y = b
        .call(
            "double",
            &[x],
            vec![Type::new(DType::F32, Shape::fixed(&[2]))],
        )
        .unwrap();
    let z = b
        .call(
            "triple",
            &[x],
            vec![Type::new(DType::F32, Shape::fixed(&[2]))],
        )
        .unwrap();
    let mut m = Module::new();
    m.add_function(b.finish(&[y[0]]).unwrap());
    let mut state = StateStore::new();
    let args = || vec![f32s(&[2], &[1.0, 2.5])];
    let err = Interpreter::new(&m)
        .run("f", args(), &mut state)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no custom ops are registered"), "{err}");
    let out = Interpreter::new(&m)
        .with_custom_ops(&Doubler)
        .run("f", args(), &mut state);
    let err = out.unwrap_err().to_string();
    assert!(
        err.contains("custom op @triple: unknown op triple"),
        "{err}"
    );
    let _ = z;
    // Without the failing call, the registry's result comes back.
    let mut b = FunctionBuilder::new("g");
    let x = b.arg("x", Type::new(DType::F32, Shape::fixed(&[2])));
    let y = b
        .call(
            "double",
            &[x],
            vec![Type::new(DType::F32, Shape::fixed(&[2]))],
        )
        .unwrap();
    m.add_function(b.finish(&y).unwrap());
    let out = Interpreter::new(&m)
        .with_custom_ops(&Doubler)
        .run("g", args(), &mut state)
        .unwrap();
    assert_eq!(values(&out[0]), [2.0, 5.0]);
}

#[test]
fn symbolic_dims_bind_from_arguments() {
    let mut b = FunctionBuilder::new("f");
    let t = Type::new(DType::F32, Shape(vec!["N".into()]));
    let x = b.arg("x", t.clone());
    let y = b.arg("y", t);
    let s = b.add(x, y).unwrap();
    let mut m = Module::new();
    m.add_function(b.finish(&[s]).unwrap());
    let run =
        |a: Array, c: Array| Interpreter::new(&m).run("f", vec![a, c], &mut StateStore::new());
    assert_eq!(
        values(&run(f32s(&[2], &[1., 2.]), f32s(&[2], &[3., 4.])).unwrap()[0]),
        [4.0, 6.0]
    );
    assert_eq!(
        run(f32s(&[0], &[]), f32s(&[0], &[])).unwrap()[0].shape(),
        &[0]
    );
    let err = run(f32s(&[2], &[1., 2.]), f32s(&[3], &[1., 2., 3.]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "argument %y of @f: expected f32[N], found f32[3]: dimension 0 is 3, but N is already bound to 2"
    );
    let err = run(
        f32s(&[2], &[1., 2.]),
        Array::F64(ndarray::arr1(&[1.0, 2.0]).into_dyn()),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("the dtype is f64"), "{err}");
}

#[test]
fn constants_splat_and_fill() {
    let splat = eval1(vec![f32s(&[3, 2], &[0.0; 6])], |b, p| {
        let ty = b.value_type(p[0]).clone();
        b.constant(Literal::F32(vec![1.5]), ty)
    });
    assert_eq!(values(&splat), [1.5; 6]);
    let dense = eval1(vec![], |b, _| {
        b.constant(
            Literal::I32(vec![1, 2, 3, 4]),
            Type::new(DType::I32, Shape::fixed(&[2, 2])),
        )
    });
    assert_eq!(dense, i32s(&[2, 2], &[1, 2, 3, 4]));
}

#[test]
fn pad_places_elements_with_gaps() {
    let x = i32s(&[2, 2], &[1, 2, 3, 4]);
    let p = eval1(vec![x], |b, a| {
        b.pad(a[0], vec![1, 0], vec![0, 2], vec![1, 1])
    });
    // rows: 1 + 2 + 1 (interior) = 4; cols: 2 + 1 (interior) + 2 (high) = 5
    assert_eq!(
        p,
        i32s(
            &[4, 5],
            &[0, 0, 0, 0, 0, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0]
        )
    );
    let empty = eval1(vec![f32s(&[0], &[])], |b, a| {
        b.pad(a[0], vec![2], vec![1], vec![3])
    });
    assert_eq!(values(&empty), [0.0, 0.0, 0.0]);
    let flags = eval1(vec![bools(&[1], &[true])], |b, a| {
        b.pad(a[0], vec![1], vec![0], vec![0])
    });
    assert_eq!(flags, bools(&[2], &[false, true]));
}

#[test]
fn scatter_add_is_the_transpose_of_gather() {
    let updates = f32s(&[3, 2], &[1.0, 2.0, 10.0, 20.0, 100.0, 200.0]);
    let idx = i64s(&[3], &[2, 0, 2]);
    let out = eval1(vec![updates, idx], |b, a| {
        b.scatter_add(a[0], a[1], 0, Shape::fixed(&[4, 2]))
    });
    assert_eq!(
        values(&out),
        [10.0, 20.0, 0.0, 0.0, 101.0, 202.0, 0.0, 0.0],
        "repeats accumulate"
    );
    let cols = i32s(&[2, 2], &[5, 6, 7, 8]);
    let at = i32s(&[2], &[1, 1]);
    let out = eval1(vec![cols, at], |b, a| {
        b.scatter_add(a[0], a[1], 1, Shape::fixed(&[2, 3]))
    });
    assert_eq!(out, i32s(&[2, 3], &[0, 11, 0, 0, 15, 0]));
    let err = eval_err(vec![f32s(&[1], &[1.0]), i64s(&[1], &[4])], |b, a| {
        b.scatter_add(a[0], a[1], 0, Shape::fixed(&[4]))
    });
    assert!(
        err.contains("index 4 is out of range for axis 0 of size 4"),
        "{err}"
    );
}

/// conv2d by its definition: zero-pad the input explicitly, then for every output position sum
/// the products of each tap with the input element it covers (dilated), per group.
fn conv2d_reference(x: &ArrayD<f64>, w: &ArrayD<f64>, attrs: &Conv2dAttrs) -> ArrayD<f64> {
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (o, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let [(pt, pb), (pl, pr)] = attrs.padding;
    let (hp, wp) = (h + pt + pb, wd + pl + pr);
    let mut padded = ArrayD::<f64>::zeros(IxDyn(&[n, c, hp, wp]));
    padded
        .slice_mut(ndarray::s![.., .., pt..pt + h, pl..pl + wd])
        .assign(x);
    let [sh, sw] = attrs.strides;
    let [dh, dw] = attrs.dilation;
    let oh = (hp - dh * (kh - 1) - 1) / sh + 1;
    let ow = (wp - dw * (kw - 1) - 1) / sw + 1;
    let og = o / attrs.groups;
    ArrayD::from_shape_fn(IxDyn(&[n, o, oh, ow]), |i| {
        let (b, oc, y, xx) = (i[0], i[1], i[2], i[3]);
        let group = oc / og;
        let mut sum = 0.0;
        for ci in 0..cg {
            for ky in 0..kh {
                for kx in 0..kw {
                    let v = padded[[b, group * cg + ci, y * sh + ky * dh, xx * sw + kx * dw]];
                    sum += v * w[[oc, ci, ky, kx]];
                }
            }
        }
        sum
    })
}

#[test]
fn conv2d_matches_its_definition() {
    let cases = [
        ([1, 1, 4, 4], [1, 1, 3, 3], Conv2dAttrs::default()),
        (
            [2, 3, 6, 5],
            [4, 3, 3, 2],
            Conv2dAttrs {
                strides: [2, 1],
                padding: [(1, 2), (0, 1)],
                dilation: [1, 2],
                groups: 1,
                channels_last: false,
            },
        ),
        (
            [1, 4, 5, 5],
            [6, 2, 3, 3],
            Conv2dAttrs {
                padding: [(1, 1), (1, 1)],
                groups: 2,
                ..Conv2dAttrs::default()
            },
        ),
    ];
    for (xs, ws, attrs) in cases {
        let n: usize = xs.iter().product();
        let m: usize = ws.iter().product();
        let x: Vec<f64> = (0..n).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        let w: Vec<f64> = (0..m).map(|i| ((i * 5) % 7) as f64 * 0.5 - 1.5).collect();
        let (xa, wa) = (f64s(&xs, &x), f64s(&ws, &w));
        let got = eval1(vec![xa.clone(), wa.clone()], |b, p| {
            b.conv2d(p[0], p[1], attrs)
        });
        let (Array::F64(xr), Array::F64(wr)) = (&xa, &wa) else {
            unreachable!()
        };
        let want = conv2d_reference(xr, wr, &attrs);
        assert_eq!(got.shape(), want.shape());
        close(
            &values(&got),
            &want.iter().copied().collect::<Vec<_>>(),
            1e-12,
        );
        // f32 gives the same values (small integers and halves are exact).
        let x32: Vec<f32> = x.iter().map(|&v| v as f32).collect();
        let w32: Vec<f32> = w.iter().map(|&v| v as f32).collect();
        let got32 = eval1(vec![f32s(&xs, &x32), f32s(&ws, &w32)], |b, p| {
            b.conv2d(p[0], p[1], attrs)
        });
        close(
            &values(&got32),
            &want.iter().copied().collect::<Vec<_>>(),
            1e-4,
        );
    }
}

#[test]
fn pooling_matches_hand_values() {
    // One 4x4 plane: rows 0..4 of 1..16.
    let x = f32s(
        &[1, 1, 4, 4],
        &(1..=16).map(|v| v as f32).collect::<Vec<_>>(),
    );
    let two = Pool2dAttrs::new([2, 2], [2, 2]);
    let max = eval1(vec![x.clone()], |b, p| b.max_pool2d(p[0], two));
    assert_eq!(values(&max), [6.0, 8.0, 14.0, 16.0]);
    let avg = eval1(vec![x.clone()], |b, p| b.avg_pool2d(p[0], two));
    assert_eq!(values(&avg), [3.5, 5.5, 11.5, 13.5]);
    // Padding: −∞ for max, zeros in the average (the window's size is the divisor).
    let padded = Pool2dAttrs {
        window: [2, 2],
        strides: [2, 2],
        padding: [(1, 1), (1, 1)],
        channels_last: false,
    };
    let max = eval1(vec![x.clone()], |b, p| b.max_pool2d(p[0], padded));
    assert_eq!(
        values(&max),
        [1.0, 3.0, 4.0, 9.0, 11.0, 12.0, 13.0, 15.0, 16.0]
    );
    let avg = eval1(vec![x.clone()], |b, p| b.avg_pool2d(p[0], padded));
    assert_eq!(values(&avg)[..3], [0.25, 1.25, 1.0]);
    // The gradient of max pooling goes to each window's largest element.
    let g = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let dx = eval1(vec![x, g], |b, p| {
        b.pool(PoolKind::MaxGrad, two, &[p[0], p[1]])
    });
    let mut want = vec![0.0; 16];
    (want[5], want[7], want[13], want[15]) = (1.0, 2.0, 3.0, 4.0);
    assert_eq!(values(&dx), want);
    // NaN propagates through max pooling.
    let nan = f32s(&[1, 1, 2, 2], &[1.0, f32::NAN, 3.0, 2.0]);
    let max = eval1(vec![nan], |b, p| b.max_pool2d(p[0], two));
    assert!(values(&max)[0].is_nan());
}

#[test]
fn window_ops_reject_bad_geometry_naming_the_op_and_shapes() {
    let x = f32s(&[1, 4, 5, 5], &[0.0; 100]);
    let cases: [(Vec<Array>, Conv2dAttrs, &str); 4] = [
        (
            vec![x.clone(), f32s(&[2, 4, 7, 7], &[0.0; 392])],
            Conv2dAttrs::default(),
            "kernel 7x7 dilated by [1, 1] is larger than the input 5x5",
        ),
        (
            vec![x.clone(), f32s(&[3, 2, 3, 3], &[0.0; 54])],
            Conv2dAttrs {
                groups: 2,
                ..Conv2dAttrs::default()
            },
            "groups=2 must divide the input channels (4) and the output channels (3)",
        ),
        (
            vec![x.clone(), f32s(&[2, 3, 3, 3], &[0.0; 54])],
            Conv2dAttrs::default(),
            "take 3 input channels per group, but the input f32[1,4,5,5] has 4",
        ),
        (
            vec![x.clone(), f32s(&[2, 4, 3, 3], &[0.0; 72])],
            Conv2dAttrs {
                strides: [0, 1],
                ..Conv2dAttrs::default()
            },
            "strides must be at least 1",
        ),
    ];
    for (args, attrs, expected) in cases {
        let err = eval(args, |b, p| Ok(vec![b.conv2d(p[0], p[1], attrs)?])).unwrap_err();
        assert!(err.contains("conv2d") && err.contains(expected), "{err}");
    }
    let big = Pool2dAttrs::new([6, 6], [1, 1]);
    let err = eval(vec![x], |b, p| Ok(vec![b.max_pool2d(p[0], big)?])).unwrap_err();
    assert!(
        err.contains("max_pool2d") && err.contains("window 6x6 is larger than the input 5x5"),
        "{err}"
    );
}

#[test]
fn update_slice_replaces_one_slice() {
    let array = f32s(&[3, 2], &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
    let row = f32s(&[2], &[7.0, 8.0]);
    let out = eval1(vec![array.clone(), row, i64s(&[], &[1])], |b, p| {
        b.update_slice(p[0], p[1], p[2], 0)
    });
    assert_eq!(values(&out), [0.0, 1.0, 7.0, 8.0, 20.0, 21.0]);
    let column = f32s(&[3], &[-1.0, -2.0, -3.0]);
    let out = eval1(
        vec![array.clone(), column.clone(), i32s(&[], &[0])],
        |b, p| b.update_slice(p[0], p[1], p[2], 1),
    );
    assert_eq!(values(&out), [-1.0, 1.0, -2.0, 11.0, -3.0, 21.0]);
    let err = eval_err(vec![array.clone(), column, i32s(&[], &[2])], |b, p| {
        b.update_slice(p[0], p[1], p[2], 1)
    });
    assert!(
        err.contains("index 2 is out of range for axis 1 of size 2"),
        "{err}"
    );
    // A value that does not fit the slice is a type error where the op is built.
    let mut b = kiln_ir::FunctionBuilder::new("f");
    let a = b.arg(
        "a",
        kiln_ir::Type::new(DType::F32, kiln_ir::Shape::fixed(&[3, 2])),
    );
    let v = b.arg(
        "v",
        kiln_ir::Type::new(DType::F32, kiln_ir::Shape::fixed(&[3])),
    );
    let i = b.arg(
        "i",
        kiln_ir::Type::new(DType::I32, kiln_ir::Shape::fixed(&[])),
    );
    let err = b.update_slice(a, v, i, 0).unwrap_err().to_string();
    assert!(
        err.contains("does not fit a slice of f32[3,2] along axis 0"),
        "{err}"
    );
}
