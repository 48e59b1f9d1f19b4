//! The interpreter's kernels: one function per op family, written for clarity and exactness.
//!
//! Semantics that compiled kernels must match:
//! - Integer arithmetic wraps; integer division truncates toward zero and fails on zero.
//! - `max`, `min`, `relu`, `reduce_max`, `reduce_min` propagate NaN; `argmax`/`argmin` pick the
//!   first NaN, else the first extreme element.
//! - `round` rounds half to even (as NumPy and PyTorch do).
//! - f32 sums and means accumulate in f64 and round once.
//! - Reducing an empty axis with `reduce_max`/`reduce_min`/`arg*` is an error; a mean of no
//!   elements is NaN.

use crate::array::Array;
use crate::map_array;
use crate::random::Stream;
use kiln_ir::{
    ArgOp, AxisSlice, BinaryOp, CompareOp, DType, Distribution, Literal, ReduceOp, UnaryOp,
};
use ndarray::{Array3, ArrayD, ArrayView2, ArrayViewD, Axis, Ix2, IxDyn, Slice, Zip};

/// A kernel's failure, described for the user; the interpreter adds which op and where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OpError(pub String);

impl From<String> for OpError {
    fn from(message: String) -> OpError {
        OpError(message)
    }
}

impl From<&str> for OpError {
    fn from(message: &str) -> OpError {
        OpError(message.to_owned())
    }
}

/// The result of a kernel.
pub type KernelResult<T> = Result<T, OpError>;

fn dtype_error(op: &str, dtype: DType) -> OpError {
    OpError(format!("`{op}` is not defined for {dtype}"))
}

fn mismatch(op: &str, a: &Array, b: &Array) -> OpError {
    OpError(format!("`{op}` operands differ: {} vs {}", a.ty(), b.ty()))
}

/// The float operations the kernels need beyond `num_traits::Float`.
pub trait FloatElem: num_traits::Float + Copy + 'static {
    /// The error function.
    fn erf(self) -> Self;
    /// Rounds half to even.
    fn round_even(self) -> Self;
    /// The value as f64.
    fn as_f64(self) -> f64;
    /// The f64 `v`, rounded to this type.
    fn from_f64(v: f64) -> Self;
}

impl FloatElem for f32 {
    fn erf(self) -> f32 {
        libm::erff(self)
    }
    fn round_even(self) -> f32 {
        self.round_ties_even()
    }
    fn as_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
}

impl FloatElem for f64 {
    fn erf(self) -> f64 {
        libm::erf(self)
    }
    fn round_even(self) -> f64 {
        self.round_ties_even()
    }
    fn as_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> f64 {
        v
    }
}

/// Wrapping integer arithmetic for i32 and i64.
pub trait IntElem: Copy + Ord + 'static {
    /// Zero.
    const ZERO: Self;
    /// Addition that wraps on overflow.
    fn wrapping_add(self, o: Self) -> Self;
    /// Subtraction that wraps on overflow.
    fn wrapping_sub(self, o: Self) -> Self;
    /// Multiplication that wraps on overflow.
    fn wrapping_mul(self, o: Self) -> Self;
    /// Negation that wraps (`-MIN` is `MIN`).
    fn wrapping_neg(self) -> Self;
    /// Absolute value that wraps (`|MIN|` is `MIN`).
    fn wrapping_abs(self) -> Self;
    /// `None` when `o` is zero.
    fn checked_trunc_div(self, o: Self) -> Option<Self>;
    /// -1, 0 or 1.
    fn signum(self) -> Self;
}

macro_rules! impl_int_elem {
    ($($t:ty),*) => {$(
        impl IntElem for $t {
            const ZERO: $t = 0;
            fn wrapping_add(self, o: $t) -> $t { <$t>::wrapping_add(self, o) }
            fn wrapping_sub(self, o: $t) -> $t { <$t>::wrapping_sub(self, o) }
            fn wrapping_mul(self, o: $t) -> $t { <$t>::wrapping_mul(self, o) }
            fn wrapping_neg(self) -> $t { <$t>::wrapping_neg(self) }
            fn wrapping_abs(self) -> $t { <$t>::wrapping_abs(self) }
            fn checked_trunc_div(self, o: $t) -> Option<$t> {
                (o != 0).then(|| <$t>::wrapping_div(self, o))
            }
            fn signum(self) -> $t { <$t>::signum(self) }
        }
    )*};
}

impl_int_elem!(i32, i64);

/// The larger of `a` and `b` (`a` when equal), NaN if either is (as `max` and `reduce_max`
/// propagate it). Written as selects: which operand is larger is data, and the executor's
/// pooling calls this per tap, where a mispredicted branch costs more than the comparison.
#[inline]
pub(crate) fn nan_max<T: num_traits::Float>(a: T, b: T) -> T {
    let larger = if b > a { b } else { a };
    if a.is_nan() || b.is_nan() {
        T::nan()
    } else {
        larger
    }
}

fn nan_min<T: num_traits::Float>(a: T, b: T) -> T {
    if a.is_nan() || b.is_nan() {
        T::nan()
    } else if a <= b {
        a
    } else {
        b
    }
}

fn standard<T: Clone>(a: ArrayViewD<'_, T>) -> ArrayD<T> {
    a.as_standard_layout().into_owned()
}

// ----- elementwise -----

/// `op(x)`, elementwise.
pub fn unary(op: UnaryOp, x: &Array) -> KernelResult<Array> {
    Ok(match x {
        Array::F32(a) => Array::F32(unary_float(op, a)?),
        Array::F64(a) => Array::F64(unary_float(op, a)?),
        Array::I32(a) => Array::I32(unary_int(op, a)?),
        Array::I64(a) => Array::I64(unary_int(op, a)?),
        Array::Bool(a) => match op {
            UnaryOp::Not => Array::Bool(a.mapv(|v| !v)),
            _ => return Err(dtype_error(op.name(), DType::Bool)),
        },
    })
}

fn unary_float<T: FloatElem>(op: UnaryOp, a: &ArrayD<T>) -> KernelResult<ArrayD<T>> {
    Ok(a.mapv(unary_float_fn(op)?))
}

/// The scalar function of a float unary op: what the interpreter maps over arrays, and what
/// compiled kernels call where the op table gives the op a helper symbol.
pub fn unary_float_fn<T: FloatElem>(op: UnaryOp) -> KernelResult<fn(T) -> T> {
    Ok(match op {
        UnaryOp::Neg => |x| -x,
        UnaryOp::Abs => |x| x.abs(),
        UnaryOp::Sign => |x| {
            if x.is_nan() || x == T::zero() {
                x
            } else {
                x.signum()
            }
        },
        UnaryOp::Relu => |x| {
            if x.is_nan() || x > T::zero() {
                x
            } else {
                T::zero()
            }
        },
        UnaryOp::Exp => |x| x.exp(),
        UnaryOp::Log => |x| x.ln(),
        UnaryOp::Sqrt => |x| x.sqrt(),
        UnaryOp::Rsqrt => |x| x.sqrt().recip(),
        UnaryOp::Recip => |x| x.recip(),
        UnaryOp::Tanh => |x| x.tanh(),
        UnaryOp::Sigmoid => |x| {
            // Two forms so that exp never overflows.
            if x >= T::zero() {
                T::one() / (T::one() + (-x).exp())
            } else {
                let e = x.exp();
                e / (T::one() + e)
            }
        },
        // max(x, 0) + log(1 + exp(-|x|)): exp never overflows, and log1p keeps small tails.
        UnaryOp::Softplus => |x| x.max(T::zero()) + (-x.abs()).exp().ln_1p(),
        UnaryOp::Erf => |x| x.erf(),
        UnaryOp::Sin => |x| x.sin(),
        UnaryOp::Cos => |x| x.cos(),
        UnaryOp::Floor => |x| x.floor(),
        UnaryOp::Ceil => |x| x.ceil(),
        UnaryOp::Round => |x| x.round_even(),
        UnaryOp::StopGradient => |x| x,
        UnaryOp::Not => return Err(dtype_error(op.name(), DType::F32)),
    })
}

fn unary_int<T: IntElem>(op: UnaryOp, a: &ArrayD<T>) -> KernelResult<ArrayD<T>> {
    let f: fn(T) -> T = match op {
        UnaryOp::Neg => |x| x.wrapping_neg(),
        UnaryOp::Abs => |x| x.wrapping_abs(),
        UnaryOp::Sign => |x| x.signum(),
        UnaryOp::Relu => |x| x.max(T::ZERO),
        _ => return Err(format!("`{}` is not defined for integers", op.name()).into()),
    };
    Ok(a.mapv(f))
}

fn zip_map<A: Copy, B: Copy, T>(
    x: &ArrayD<A>,
    y: &ArrayD<B>,
    f: impl Fn(A, B) -> T,
) -> KernelResult<ArrayD<T>> {
    if x.shape() != y.shape() {
        return Err(format!("operand shapes differ: {:?} vs {:?}", x.shape(), y.shape()).into());
    }
    // Contiguous operands (the common case) skip the general iterator.
    if let (Some(a), Some(b)) = (x.as_slice(), y.as_slice()) {
        let values: Vec<T> = a.iter().zip(b).map(|(&a, &b)| f(a, b)).collect();
        // SAFETY: one value per element of `x`, in row-major order (`x` is contiguous and
        // in standard order, as `as_slice` guarantees).
        return Ok(unsafe { ArrayD::from_shape_vec_unchecked(x.raw_dim(), values) });
    }
    Ok(Zip::from(x).and(y).map_collect(|&a, &b| f(a, b)))
}

/// [`zip_map`] for a result of the operands' type: a contiguous left operand is cloned and
/// updated in place, which skips building a shape and strides (the eager per-op cost).
fn zip_same<T: Copy>(
    x: &ArrayD<T>,
    y: &ArrayD<T>,
    f: impl Fn(T, T) -> T,
) -> KernelResult<ArrayD<T>> {
    if x.shape() == y.shape()
        && x.is_standard_layout()
        && let Some(b) = y.as_slice()
    {
        let mut out = x.clone();
        if let Some(values) = out.as_slice_mut() {
            for (v, &b) in values.iter_mut().zip(b) {
                *v = f(*v, b);
            }
            return Ok(out);
        }
    }
    zip_map(x, y, f)
}

/// `op(a, b)`, elementwise, on operands of one type.
pub fn binary(op: BinaryOp, a: &Array, b: &Array) -> KernelResult<Array> {
    Ok(match (a, b) {
        (Array::F32(x), Array::F32(y)) => Array::F32(binary_float(op, x, y)?),
        (Array::F64(x), Array::F64(y)) => Array::F64(binary_float(op, x, y)?),
        (Array::I32(x), Array::I32(y)) => Array::I32(binary_int(op, x, y)?),
        (Array::I64(x), Array::I64(y)) => Array::I64(binary_int(op, x, y)?),
        (Array::Bool(x), Array::Bool(y)) => Array::Bool(binary_bool(op, x, y)?),
        _ => return Err(mismatch(op.name(), a, b)),
    })
}

fn binary_float<T: FloatElem>(
    op: BinaryOp,
    x: &ArrayD<T>,
    y: &ArrayD<T>,
) -> KernelResult<ArrayD<T>> {
    // One `zip_same` per op, so that each loop has its operation inlined.
    match op {
        BinaryOp::Add => zip_same(x, y, |a, b| a + b),
        BinaryOp::Sub => zip_same(x, y, |a, b| a - b),
        BinaryOp::Mul => zip_same(x, y, |a, b| a * b),
        BinaryOp::Div => zip_same(x, y, |a, b| a / b),
        BinaryOp::Max => zip_same(x, y, nan_max),
        BinaryOp::Min => zip_same(x, y, nan_min),
        BinaryOp::Pow => zip_same(x, y, pow),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
            Err(format!("`{}` is defined for bool only", op.name()).into())
        }
    }
}

/// `pow` on floats; compiled kernels call it as `kiln_pow` and `kiln_powf`.
pub fn pow<T: FloatElem>(a: T, b: T) -> T {
    a.powf(b)
}

fn binary_int<T: IntElem>(op: BinaryOp, x: &ArrayD<T>, y: &ArrayD<T>) -> KernelResult<ArrayD<T>> {
    let f: fn(T, T) -> T = match op {
        BinaryOp::Add => |a, b| a.wrapping_add(b),
        BinaryOp::Sub => |a, b| a.wrapping_sub(b),
        BinaryOp::Mul => |a, b| a.wrapping_mul(b),
        BinaryOp::Max => |a, b| a.max(b),
        BinaryOp::Min => |a, b| a.min(b),
        BinaryOp::Div => {
            if y.iter().any(|&d| d == T::ZERO) {
                return Err("integer division by zero".into());
            }
            |a, b| a.checked_trunc_div(b).unwrap_or(T::ZERO)
        }
        BinaryOp::Pow | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
            return Err(format!("`{}` is not defined for integers", op.name()).into());
        }
    };
    zip_same(x, y, f)
}

fn binary_bool(op: BinaryOp, x: &ArrayD<bool>, y: &ArrayD<bool>) -> KernelResult<ArrayD<bool>> {
    let f: fn(bool, bool) -> bool = match op {
        BinaryOp::And => |a, b| a & b,
        BinaryOp::Or => |a, b| a | b,
        BinaryOp::Xor => |a, b| a ^ b,
        _ => return Err(dtype_error(op.name(), DType::Bool)),
    };
    zip_map(x, y, f)
}

/// The comparison `op(a, b)`, elementwise: a bool array.
pub fn compare(op: CompareOp, a: &Array, b: &Array) -> KernelResult<Array> {
    fn typed<T: PartialOrd + Copy>(
        op: CompareOp,
        x: &ArrayD<T>,
        y: &ArrayD<T>,
    ) -> KernelResult<ArrayD<bool>> {
        let f: fn(T, T) -> bool = match op {
            CompareOp::Eq => |a, b| a == b,
            CompareOp::Ne => |a, b| a != b,
            CompareOp::Lt => |a, b| a < b,
            CompareOp::Le => |a, b| a <= b,
            CompareOp::Gt => |a, b| a > b,
            CompareOp::Ge => |a, b| a >= b,
        };
        zip_map(x, y, f)
    }
    Ok(Array::Bool(match (a, b) {
        (Array::F32(x), Array::F32(y)) => typed(op, x, y)?,
        (Array::F64(x), Array::F64(y)) => typed(op, x, y)?,
        (Array::I32(x), Array::I32(y)) => typed(op, x, y)?,
        (Array::I64(x), Array::I64(y)) => typed(op, x, y)?,
        (Array::Bool(x), Array::Bool(y)) => typed(op, x, y)?,
        _ => return Err(mismatch(op.name(), a, b)),
    }))
}

/// `cond ? a : b`, elementwise.
pub fn select(cond: &Array, a: &Array, b: &Array) -> KernelResult<Array> {
    let Array::Bool(c) = cond else {
        return Err(format!("the condition must be bool, found {}", cond.ty()).into());
    };
    fn typed<T: Copy>(c: &ArrayD<bool>, x: &ArrayD<T>, y: &ArrayD<T>) -> KernelResult<ArrayD<T>> {
        if c.shape() != x.shape() || x.shape() != y.shape() {
            return Err("operand shapes differ".into());
        }
        Ok(Zip::from(c)
            .and(x)
            .and(y)
            .map_collect(|&c, &x, &y| if c { x } else { y }))
    }
    Ok(match (a, b) {
        (Array::F32(x), Array::F32(y)) => Array::F32(typed(c, x, y)?),
        (Array::F64(x), Array::F64(y)) => Array::F64(typed(c, x, y)?),
        (Array::I32(x), Array::I32(y)) => Array::I32(typed(c, x, y)?),
        (Array::I64(x), Array::I64(y)) => Array::I64(typed(c, x, y)?),
        (Array::Bool(x), Array::Bool(y)) => Array::Bool(typed(c, x, y)?),
        _ => return Err(mismatch("select", a, b)),
    })
}

// ----- layout -----

/// `x` broadcast to `shape`, NumPy-style.
pub fn broadcast(x: &Array, shape: &[usize]) -> KernelResult<Array> {
    let fail = || format!("{:?} does not broadcast to {shape:?}", x.shape());
    Ok(map_array!(x, a => standard(a.broadcast(IxDyn(shape)).ok_or_else(fail)?)))
}

/// The elements of `x`, row-major, in `shape`.
pub fn reshape(x: &Array, shape: &[usize]) -> KernelResult<Array> {
    if shape.iter().product::<usize>() != x.len() {
        return Err(format!("cannot reshape {:?} to {shape:?}", x.shape()).into());
    }
    Ok(
        map_array!(x, a => ArrayD::from_shape_vec(IxDyn(shape), a.iter().cloned().collect())
        .map_err(|e| OpError(e.to_string()))?),
    )
}

/// The axes of `x` permuted by `perm`.
pub fn transpose(x: &Array, perm: &[usize]) -> KernelResult<Array> {
    check_permutation(x, perm)?;
    Ok(map_array!(x, a => {
        let a = a.as_standard_layout();
        let dims: Vec<usize> = perm.iter().map(|&p| a.shape()[p]).collect();
        let mut out = ArrayD::from_elem(IxDyn(&dims), Default::default());
        let to = out.as_slice_mut().expect("fresh arrays are standard");
        permute_into(a.as_slice().expect("standard"), a.shape(), perm, to);
        out
    }))
}

/// [`transpose`] into `out`, which has the result's shape and dtype (the executor's buffer).
pub fn transpose_into(x: &Array, perm: &[usize], out: &mut Array) -> KernelResult<()> {
    check_permutation(x, perm)?;
    let dims: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    if out.shape() != dims.as_slice() {
        let shape = out.shape();
        return Err(format!("transpose of {:?} by {perm:?} into {shape:?}", x.shape()).into());
    }
    macro_rules! into {
        ($($variant:ident),*) => {
            match (x, out) {
                $((Array::$variant(a), Array::$variant(out)) => {
                    let a = a.as_standard_layout();
                    let to = out.as_slice_mut().expect("executor buffers are contiguous");
                    permute_into(a.as_slice().expect("standard"), a.shape(), perm, to);
                })*
                (x, out) => {
                    return Err(format!("transpose of {} into {}", x.ty(), out.ty()).into());
                }
            }
        };
    }
    into!(F32, F64, I32, I64, Bool);
    Ok(())
}

fn check_permutation(x: &Array, perm: &[usize]) -> KernelResult<()> {
    let mut seen = vec![false; x.shape().len()];
    let valid = perm.len() == seen.len()
        && perm
            .iter()
            .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
    match valid {
        true => Ok(()),
        false => Err(format!("{perm:?} is not a permutation for {:?}", x.shape()).into()),
    }
}

/// `x` (row-major, `shape`) with its axes permuted by `perm` (valid) into `out`, row-major.
/// Axes that stay adjacent and in order move as one; a batch of matrices transposed (NCHW ↔
/// NHWC is one, `[N, C, H·W]` ↔ `[N, H·W, C]`) goes tile by tile, and any other permutation
/// walks the result in order, each run along its last axis read at the input's stride for
/// that axis, with an odometer over the others (ndarray's walk of a permuted dynamic-rank
/// view took ~20 ns an element: 1.4 ms for the digits CNN's 256 KiB of pooled values; runs
/// of two elements still took ~2 ns).
fn permute_into<T: Copy>(x: &[T], shape: &[usize], perm: &[usize], out: &mut [T]) {
    let (merged, merged_perm) = merge_axes(shape, perm);
    let rank = merged.len();
    let swaps_last_two = rank >= 2
        && merged_perm[rank - 2..] == [rank - 1, rank - 2]
        && (0..rank - 2).all(|k| merged_perm[k] == k);
    if !swaps_last_two {
        return walked(x, &merged, &merged_perm, out);
    }
    let (rows, cols) = (merged[rank - 2], merged[rank - 1]);
    if rows * cols > 0 {
        for (x, out) in x
            .chunks_exact(rows * cols)
            .zip(out.chunks_exact_mut(rows * cols))
        {
            transpose_matrix(x, [rows, cols], out);
        }
    }
}

/// `shape` and `perm` with each run of input axes that the permutation keeps adjacent and in
/// order merged into one axis: the merged shape (input order) and permutation.
fn merge_axes(shape: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    // Runs of the result's axes, each its input axes `first..first + len`.
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &p in perm {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == p => *len += 1,
            _ => runs.push((p, 1)),
        }
    }
    let mut by_input: Vec<usize> = (0..runs.len()).collect();
    by_input.sort_by_key(|&r| runs[r].0);
    let merged = (by_input.iter())
        .map(|&r| shape[runs[r].0..][..runs[r].1].iter().product())
        .collect();
    let mut merged_perm = vec![0; runs.len()];
    for (position, &r) in by_input.iter().enumerate() {
        merged_perm[r] = position;
    }
    (merged, merged_perm)
}

/// The `[rows, cols]` matrix `x` transposed into `out`, in square tiles that stay in cache.
pub(crate) fn transpose_matrix<T: Copy>(x: &[T], [rows, cols]: [usize; 2], out: &mut [T]) {
    const TILE: usize = 16;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    out[c * rows + r] = x[r * cols + c];
                }
            }
        }
    }
}

/// [`permute_into`] for any permutation of `x` (row-major, `shape`) into `out`: the result walked
/// in order.
fn walked<T: Copy>(x: &[T], shape: &[usize], perm: &[usize], out: &mut [T]) {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let steps: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let (Some(&inner), Some(&step)) = (dims.last(), steps.last()) else {
        // A scalar.
        out.copy_from_slice(x);
        return;
    };
    let outer = dims.len() - 1;
    let (mut index, mut base) = (vec![0; outer], 0);
    for row in out.chunks_exact_mut(inner.max(1)) {
        for (k, v) in row.iter_mut().enumerate() {
            *v = x[base + k * step];
        }
        for axis in (0..outer).rev() {
            index[axis] += 1;
            base += steps[axis];
            if index[axis] < dims[axis] {
                break;
            }
            base -= steps[axis] * dims[axis];
            index[axis] = 0;
        }
    }
}

/// A range of each axis of `x`.
pub fn slice(x: &Array, axes: &[AxisSlice]) -> KernelResult<Array> {
    if axes.len() != x.shape().len() {
        return Err(format!("{} ranges for rank {}", axes.len(), x.shape().len()).into());
    }
    for (range, &size) in axes.iter().zip(x.shape()) {
        if let AxisSlice::Range { start, end, step } = *range
            && (step == 0 || start > end || end > size)
        {
            return Err(
                format!("range {range} is out of bounds for an axis of size {size}").into(),
            );
        }
    }
    let info = |d: ndarray::AxisDescription| match axes[d.axis.index()] {
        AxisSlice::Full => Slice::from(..),
        AxisSlice::Range { start, end, step } => {
            Slice::new(start as isize, Some(end as isize), step as isize)
        }
    };
    Ok(map_array!(x, a => standard(a.slice_each_axis(info))))
}

/// Zeros with `x` placed at `low + i * (interior + 1)` along each axis.
pub fn pad(x: &Array, low: &[usize], high: &[usize], interior: &[usize]) -> KernelResult<Array> {
    let rank = x.shape().len();
    if low.len() != rank || high.len() != rank || interior.len() != rank {
        return Err(format!("padding needs one entry per axis of rank {rank}").into());
    }
    let out_shape: Vec<usize> = (x.shape().iter().enumerate())
        .map(|(a, &n)| kiln_ir::infer::padded_size(n, low[a], high[a], interior[a]))
        .collect::<Option<_>>()
        .ok_or("the padded size overflows")?;
    if x.is_empty() {
        return Ok(Array::zeros(x.dtype(), &out_shape));
    }
    // Every bound below is at most the padded size, which the output's allocation bounds; a
    // step past `isize::MAX` only happens on an axis of one element, where it is never taken.
    let place = |d: ndarray::AxisDescription| {
        let a = d.axis.index();
        let step = interior[a].saturating_add(1).min(isize::MAX as usize);
        let end = low[a] + (x.shape()[a] - 1) * step + 1;
        Slice::new(low[a] as isize, Some(end as isize), step as isize)
    };
    let mut out = Array::zeros(x.dtype(), &out_shape);
    match (&mut out, x) {
        (Array::F32(o), Array::F32(v)) => o.slice_each_axis_mut(place).assign(v),
        (Array::F64(o), Array::F64(v)) => o.slice_each_axis_mut(place).assign(v),
        (Array::I32(o), Array::I32(v)) => o.slice_each_axis_mut(place).assign(v),
        (Array::I64(o), Array::I64(v)) => o.slice_each_axis_mut(place).assign(v),
        (Array::Bool(o), Array::Bool(v)) => o.slice_each_axis_mut(place).assign(v),
        _ => unreachable!("zeros has the operand's dtype"),
    }
    Ok(out)
}

/// `xs` joined along `axis`.
pub fn concat(xs: &[&Array], axis: usize) -> KernelResult<Array> {
    let Some(first) = xs.first() else {
        return Err("concat of nothing".into());
    };
    macro_rules! views {
        ($variant:ident) => {
            xs.iter()
                .map(|x| match x {
                    Array::$variant(a) => Ok(a.view()),
                    other => Err(mismatch("concat", first, other)),
                })
                .collect::<KernelResult<Vec<_>>>()?
        };
    }
    let join = |e: ndarray::ShapeError| format!("cannot concatenate along axis {axis}: {e}");
    Ok(match first {
        Array::F32(_) => Array::F32(ndarray::concatenate(Axis(axis), &views!(F32)).map_err(join)?),
        Array::F64(_) => Array::F64(ndarray::concatenate(Axis(axis), &views!(F64)).map_err(join)?),
        Array::I32(_) => Array::I32(ndarray::concatenate(Axis(axis), &views!(I32)).map_err(join)?),
        Array::I64(_) => Array::I64(ndarray::concatenate(Axis(axis), &views!(I64)).map_err(join)?),
        Array::Bool(_) => {
            Array::Bool(ndarray::concatenate(Axis(axis), &views!(Bool)).map_err(join)?)
        }
    }
    .into_standard_layout())
}

/// [`concat`] into `out`, which has the result's shape and dtype (the executor's buffer):
/// for each index of the axes before `axis`, each input's run of elements copied whole (a
/// channels-last concatenation of channels interleaves runs of a position's channels, which
/// ndarray's strided copy took ~1.5 ns an element to do).
pub fn concat_into(xs: &[&Array], axis: usize, out: &mut Array) -> KernelResult<()> {
    let shape = out.shape().to_vec();
    let fits = |x: &Array| {
        x.shape().len() == shape.len()
            && (x.shape().iter().zip(&shape).enumerate()).all(|(a, (d, e))| a == axis || d == e)
    };
    let total: usize = xs
        .iter()
        .map(|x| x.shape().get(axis).copied().unwrap_or(0))
        .sum();
    if axis >= shape.len() || total != shape[axis] || !xs.iter().all(|x| fits(x)) {
        let shapes: Vec<_> = xs.iter().map(|x| x.shape().to_vec()).collect();
        return Err(
            format!("cannot concatenate {shapes:?} along axis {axis} into {shape:?}").into(),
        );
    }
    if let Some(x) = xs.iter().find(|x| x.dtype() != out.dtype()) {
        return Err(format!("concat of {} into {}", x.ty(), out.ty()).into());
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let runs: Vec<usize> = xs.iter().map(|x| x.shape()[axis] * inner).collect();
    macro_rules! into {
        ($($variant:ident),*) => {
            match out {
                $(Array::$variant(out) => {
                    let inputs: Vec<_> = (xs.iter())
                        .map(|x| match x {
                            Array::$variant(a) => a.as_standard_layout(),
                            _ => unreachable!("the dtypes were checked"),
                        })
                        .collect();
                    let slices: Vec<&[_]> =
                        inputs.iter().map(|a| a.as_slice().expect("standard")).collect();
                    let out = out.as_slice_mut().expect("executor buffers are contiguous");
                    copy_runs(&slices, &runs, outer, out);
                })*
            }
        };
    }
    into!(F32, F64, I32, I64, Bool);
    Ok(())
}

/// For each of `outer` rows of `out`, each input's next run of `runs[i]` elements in turn.
fn copy_runs<T: Copy>(xs: &[&[T]], runs: &[usize], outer: usize, out: &mut [T]) {
    let mut at = 0;
    for row in 0..outer {
        for (x, &run) in xs.iter().zip(runs) {
            out[at..at + run].copy_from_slice(&x[row * run..][..run]);
            at += run;
        }
    }
}

// ----- reductions -----

/// Folds `x` over `axes` (largest first, so indices stay valid), then restores kept dims.
fn fold_axes<T: Clone, A: Clone>(
    x: &ArrayD<T>,
    axes: &[usize],
    keep_dims: bool,
    init: A,
    lift: impl Fn(&T) -> A,
    fold: impl Fn(&A, &A) -> A,
) -> ArrayD<A> {
    if x.is_empty() {
        // Every fold is of nothing: `init` everywhere, without walking a huge empty axis
        // (`[0, 2^40]` folded over its second axis would take 2^40 steps).
        let shape: Vec<usize> = (x.shape().iter().enumerate())
            .filter_map(|(a, &n)| match axes.contains(&a) {
                true => keep_dims.then_some(1),
                false => Some(n),
            })
            .collect();
        return ArrayD::from_elem(IxDyn(&shape), init);
    }
    let mut acc: ArrayD<A> = x.map(lift);
    let mut sorted = axes.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    for &axis in &sorted {
        acc = acc.fold_axis(Axis(axis), init.clone(), |a, b| fold(a, b));
    }
    if keep_dims {
        sorted.reverse();
        for &axis in &sorted {
            acc.insert_axis_inplace(Axis(axis));
        }
    }
    acc
}

/// `op` over `axes` of `x`.
pub fn reduce(op: ReduceOp, x: &Array, axes: &[usize], keep_dims: bool) -> KernelResult<Array> {
    let rank = x.shape().len();
    if let Some(&bad) = axes.iter().find(|&&a| a >= rank) {
        return Err(format!("axis {bad} is out of range for rank {rank}").into());
    }
    let count = (axes.iter()).fold(1usize, |acc, &a| acc.saturating_mul(x.shape()[a]));
    if count == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) {
        return Err(format!("`{}` over an empty axis has no value", op.name()).into());
    }
    Ok(match x {
        Array::F32(a) => Array::F32(reduce_float(op, a, axes, keep_dims, count)),
        Array::F64(a) => Array::F64(reduce_float(op, a, axes, keep_dims, count)),
        Array::I32(a) => Array::I32(reduce_int(op, a, axes, keep_dims)?),
        Array::I64(a) => Array::I64(reduce_int(op, a, axes, keep_dims)?),
        Array::Bool(_) => return Err(dtype_error(op.name(), DType::Bool)),
    })
}

fn reduce_float<T: FloatElem>(
    op: ReduceOp,
    x: &ArrayD<T>,
    axes: &[usize],
    keep_dims: bool,
    count: usize,
) -> ArrayD<T> {
    let to64 = |v: &T| v.as_f64();
    let sum = || fold_axes(x, axes, keep_dims, 0.0f64, to64, |a, b| a + b);
    match op {
        ReduceOp::Sum => sum().mapv(T::from_f64),
        ReduceOp::Mean => sum().mapv(|s| T::from_f64(s / count as f64)),
        ReduceOp::Max => fold_axes(
            x,
            axes,
            keep_dims,
            T::neg_infinity(),
            |v| *v,
            |a, b| nan_max(*a, *b),
        ),
        ReduceOp::Min => fold_axes(
            x,
            axes,
            keep_dims,
            T::infinity(),
            |v| *v,
            |a, b| nan_min(*a, *b),
        ),
    }
}

fn reduce_int<T: IntElem + num_traits::Bounded>(
    op: ReduceOp,
    x: &ArrayD<T>,
    axes: &[usize],
    keep_dims: bool,
) -> KernelResult<ArrayD<T>> {
    Ok(match op {
        ReduceOp::Sum => fold_axes(
            x,
            axes,
            keep_dims,
            T::ZERO,
            |v| *v,
            |a, b| a.wrapping_add(*b),
        ),
        ReduceOp::Max => fold_axes(x, axes, keep_dims, T::min_value(), |v| *v, |a, b| *a.max(b)),
        ReduceOp::Min => fold_axes(x, axes, keep_dims, T::max_value(), |v| *v, |a, b| *a.min(b)),
        ReduceOp::Mean => return Err("`reduce_mean` is defined for floats only".into()),
    })
}

/// The index of the extreme element of `x` along `axis`.
pub fn arg_reduce(op: ArgOp, x: &Array, axis: usize, keep_dims: bool) -> KernelResult<Array> {
    let rank = x.shape().len();
    if axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    if x.shape()[axis] == 0 {
        return Err(format!("`{}` over an empty axis has no value", op.name()).into());
    }
    fn typed<T: PartialOrd + Copy>(
        x: &ArrayD<T>,
        axis: usize,
        max: bool,
        is_nan: fn(T) -> bool,
    ) -> ArrayD<i64> {
        x.map_axis(Axis(axis), |lane| {
            let mut best = 0usize;
            for (i, &v) in lane.iter().enumerate() {
                if is_nan(v) {
                    return i as i64;
                }
                let better = if max { v > lane[best] } else { v < lane[best] };
                if better {
                    best = i;
                }
            }
            best as i64
        })
    }
    let max = op == ArgOp::ArgMax;
    let mut out = match x {
        Array::F32(a) => typed(a, axis, max, f32::is_nan),
        Array::F64(a) => typed(a, axis, max, f64::is_nan),
        Array::I32(a) => typed(a, axis, max, |_| false),
        Array::I64(a) => typed(a, axis, max, |_| false),
        Array::Bool(_) => return Err(dtype_error(op.name(), DType::Bool)),
    };
    if keep_dims {
        out.insert_axis_inplace(Axis(axis));
    }
    Ok(Array::I64(out))
}

// ----- contraction -----

/// NumPy broadcasting of two concrete shapes.
fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i < rank - s.len() {
            1
        } else {
            s[i - (rank - s.len())]
        }
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// `c + scale · (a @ b)`, rounded as the program it replaces rounds: the product, times
/// `scale` in the product's dtype, added to `c`.
pub fn matmul_acc([a, b, c]: [&Array; 3], [ta, tb]: [bool; 2], scale: f64) -> KernelResult<Array> {
    let product = matmul(a, b, ta, tb)?;
    let factor = Array::from_literal(&Literal::scalar(product.dtype(), scale), product.shape())
        .expect("a splat fills any shape");
    binary(BinaryOp::Add, c, &binary(BinaryOp::Mul, &product, &factor)?)
}

/// The batched matrix product, each operand's last two axes swapped first if asked.
pub fn matmul(a: &Array, b: &Array, transpose_a: bool, transpose_b: bool) -> KernelResult<Array> {
    Ok(match (a, b) {
        (Array::F32(x), Array::F32(y)) => {
            Array::F32(batched_matmul(x, y, transpose_a, transpose_b, |p, q| {
                p.dot(&q)
            })?)
        }
        (Array::F64(x), Array::F64(y)) => {
            Array::F64(batched_matmul(x, y, transpose_a, transpose_b, |p, q| {
                p.dot(&q)
            })?)
        }
        (Array::I32(x), Array::I32(y)) => {
            Array::I32(batched_matmul(x, y, transpose_a, transpose_b, int_matmul)?)
        }
        (Array::I64(x), Array::I64(y)) => {
            Array::I64(batched_matmul(x, y, transpose_a, transpose_b, int_matmul)?)
        }
        _ => return Err(mismatch("matmul", a, b)),
    })
}

fn int_matmul<T: IntElem + num_traits::Zero>(
    p: ArrayView2<'_, T>,
    q: ArrayView2<'_, T>,
) -> ndarray::Array2<T> {
    let (m, k) = p.dim();
    let n = q.dim().1;
    ndarray::Array2::from_shape_fn((m, n), |(i, j)| {
        (0..k).fold(T::ZERO, |acc, l| {
            acc.wrapping_add(p[(i, l)].wrapping_mul(q[(l, j)]))
        })
    })
}

fn batched_matmul<T: Clone + num_traits::Zero>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    transpose_a: bool,
    transpose_b: bool,
    mm: impl Fn(ArrayView2<'_, T>, ArrayView2<'_, T>) -> ndarray::Array2<T>,
) -> KernelResult<ArrayD<T>> {
    let (ra, rb) = (a.ndim(), b.ndim());
    if ra < 2 || rb < 2 {
        return Err("matmul operands need rank 2 or more".into());
    }
    let mut va = a.view();
    let mut vb = b.view();
    if transpose_a {
        va.swap_axes(ra - 2, ra - 1);
    }
    if transpose_b {
        vb.swap_axes(rb - 2, rb - 1);
    }
    let (m, k) = (va.shape()[ra - 2], va.shape()[ra - 1]);
    let (k2, n) = (vb.shape()[rb - 2], vb.shape()[rb - 1]);
    if k != k2 {
        return Err(format!("contraction sizes differ: {k} vs {k2}").into());
    }
    let batch = broadcast_dims(&va.shape()[..ra - 2], &vb.shape()[..rb - 2])
        .ok_or("batch dimensions do not broadcast")?;
    let batch_size: usize = batch.iter().product();
    let full = |mut dims: Vec<usize>, r: usize, c: usize| {
        dims.extend([r, c]);
        dims
    };
    let a3 = va
        .broadcast(IxDyn(&full(batch.clone(), m, k)))
        .ok_or("lhs does not broadcast")?
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((batch_size, m, k))
        .map_err(|e| OpError(e.to_string()))?;
    let b3 = vb
        .broadcast(IxDyn(&full(batch.clone(), k, n)))
        .ok_or("rhs does not broadcast")?
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order((batch_size, k, n))
        .map_err(|e| OpError(e.to_string()))?;
    let mut out = Array3::<T>::zeros((batch_size, m, n));
    for i in 0..batch_size {
        let p = a3
            .index_axis(Axis(0), i)
            .into_dimensionality::<Ix2>()
            .map_err(|e| OpError(e.to_string()))?;
        let q = b3
            .index_axis(Axis(0), i)
            .into_dimensionality::<Ix2>()
            .map_err(|e| OpError(e.to_string()))?;
        out.index_axis_mut(Axis(0), i).assign(&mm(p, q));
    }
    out.into_shape_with_order(IxDyn(&full(batch, m, n)))
        .map_err(|e| OpError(e.to_string()))
}

// ----- indexing and sources -----

fn indices(idx: &Array) -> KernelResult<Vec<i64>> {
    match idx {
        Array::I32(a) => Ok(a.iter().map(|&v| v as i64).collect()),
        Array::I64(a) => Ok(a.iter().copied().collect()),
        other => Err(format!("indices must be i32 or i64, found {}", other.ty()).into()),
    }
}

/// `idx` as positions along an axis of `size`; an index outside it is an error.
fn positions(idx: &Array, axis: usize, size: usize) -> KernelResult<Vec<usize>> {
    indices(idx)?
        .into_iter()
        .map(|i| {
            usize::try_from(i)
                .ok()
                .filter(|&u| u < size)
                .ok_or_else(|| {
                    OpError(format!(
                        "index {i} is out of range for axis {axis} of size {size}"
                    ))
                })
        })
        .collect()
}

/// `shape` around `axis`: the elements before it, its size, the elements after it.
fn around(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}

/// `table` indexed by `idx` along `axis`.
pub fn gather(table: &Array, idx: &Array, axis: usize) -> KernelResult<Array> {
    let rank = table.shape().len();
    if axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    let mut shape = table.shape()[..axis].to_vec();
    shape.extend_from_slice(idx.shape());
    shape.extend_from_slice(&table.shape()[axis + 1..]);
    let mut out = Array::zeros(table.dtype(), &shape);
    gather_into(table, idx, axis, &mut out)?;
    Ok(out)
}

/// `gather(table, idx, axis)` written into `out`, an array of the result's shape (the
/// compiled executor's buffer, or a fresh one): one copy of `inner` elements per index.
pub fn gather_into(table: &Array, idx: &Array, axis: usize, out: &mut Array) -> KernelResult<()> {
    let rank = table.shape().len();
    if axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    let (outer, size, inner) = around(table.shape(), axis);
    let positions = positions(idx, axis, size)?;
    if out.len() != outer * positions.len() * inner || out.dtype() != table.dtype() {
        return Err(format!("`gather` cannot write {} into {}", table.ty(), out.ty()).into());
    }
    fn copy<T: Copy>(t: &ArrayD<T>, o: &mut ArrayD<T>, positions: &[usize], dims: [usize; 3]) {
        let [outer, size, inner] = dims;
        let t = t.as_standard_layout();
        let t = t.as_slice().expect("a standard-layout table");
        let o = o.as_slice_mut().expect("a standard-layout output");
        let k = positions.len();
        for p in 0..outer {
            for (j, &at) in positions.iter().enumerate() {
                let (from, to) = ((p * size + at) * inner, (p * k + j) * inner);
                o[to..to + inner].copy_from_slice(&t[from..from + inner]);
            }
        }
    }
    let dims = [outer, size, inner];
    match (table, out) {
        (Array::F32(t), Array::F32(o)) => copy(t, o, &positions, dims),
        (Array::F64(t), Array::F64(o)) => copy(t, o, &positions, dims),
        (Array::I32(t), Array::I32(o)) => copy(t, o, &positions, dims),
        (Array::I64(t), Array::I64(o)) => copy(t, o, &positions, dims),
        (Array::Bool(t), Array::Bool(o)) => copy(t, o, &positions, dims),
        _ => unreachable!("the dtypes were checked"),
    }
    Ok(())
}

/// `array` with its slice at the scalar `index` along `axis` replaced by `value`.
pub fn update_slice(
    array: &Array,
    value: &Array,
    index: &Array,
    axis: usize,
) -> KernelResult<Array> {
    let mut out = array.clone().into_standard_layout();
    update_slice_in_place(&mut out, value, index, axis)?;
    Ok(out)
}

/// The slice of `array` at the scalar `index` along `axis`, without that axis: the elements
/// [`update_slice_in_place`] would write over (which puts them back).
pub fn slice_at(array: &Array, index: &Array, axis: usize) -> KernelResult<Array> {
    let rank = array.shape().len();
    if axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    let at = match positions(index, axis, array.shape()[axis])?[..] {
        [at] => at,
        _ => return Err(format!("the index must be a scalar, found {}", index.ty()).into()),
    };
    let ranges: Vec<AxisSlice> = (0..rank)
        .map(|a| match a == axis {
            true => AxisSlice::Range {
                start: at,
                end: at + 1,
                step: 1,
            },
            false => AxisSlice::Full,
        })
        .collect();
    let mut slice = self::slice(array, &ranges)?;
    let mut shape = array.shape().to_vec();
    shape.remove(axis);
    slice.reshape_in_place(&shape);
    Ok(slice)
}

/// Writes `value` over the slice of `out` (standard layout) at the scalar `index` along
/// `axis`: the only elements `update_slice` changes, so a buffer that already holds the
/// array is updated in O(slice).
pub fn update_slice_in_place(
    out: &mut Array,
    value: &Array,
    index: &Array,
    axis: usize,
) -> KernelResult<()> {
    let rank = out.shape().len();
    if axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}").into());
    }
    let (outer, size, inner) = around(out.shape(), axis);
    let at = match positions(index, axis, size)?[..] {
        [at] => at,
        _ => return Err(format!("the index must be a scalar, found {}", index.ty()).into()),
    };
    if value.len() != outer * inner || value.dtype() != out.dtype() {
        return Err(format!("{} does not fit a slice of {}", value.ty(), out.ty()).into());
    }
    fn write<T: Copy>(
        o: &mut ArrayD<T>,
        v: &ArrayD<T>,
        at: usize,
        [outer, size, inner]: [usize; 3],
    ) {
        let v = v.as_standard_layout();
        let v = v.as_slice().expect("a standard-layout value");
        let o = o.as_slice_mut().expect("a standard-layout array");
        for p in 0..outer {
            let to = (p * size + at) * inner;
            o[to..to + inner].copy_from_slice(&v[p * inner..(p + 1) * inner]);
        }
    }
    let dims = [outer, size, inner];
    match (out, value) {
        (Array::F32(o), Array::F32(v)) => write(o, v, at, dims),
        (Array::F64(o), Array::F64(v)) => write(o, v, at, dims),
        (Array::I32(o), Array::I32(v)) => write(o, v, at, dims),
        (Array::I64(o), Array::I64(v)) => write(o, v, at, dims),
        (Array::Bool(o), Array::Bool(v)) => write(o, v, at, dims),
        _ => unreachable!("the dtypes were checked"),
    }
    Ok(())
}

/// Zeros of `shape` with `updates` added at `indices` along `axis`; repeats accumulate.
pub fn scatter_add(
    updates: &Array,
    idx: &Array,
    axis: usize,
    shape: &[usize],
) -> KernelResult<Array> {
    let mut out = Array::zeros(updates.dtype(), shape);
    scatter_add_into(updates, idx, axis, &mut out)?;
    Ok(out)
}

/// `scatter_add(updates, idx, axis, shape)` written into `out`, an array of `shape`.
pub fn scatter_add_into(
    updates: &Array,
    idx: &Array,
    axis: usize,
    out: &mut Array,
) -> KernelResult<()> {
    let shape = out.shape().to_vec();
    if axis >= shape.len() {
        return Err(format!("axis {axis} is out of range for rank {}", shape.len()).into());
    }
    let (outer, size, inner) = around(&shape, axis);
    let positions = positions(idx, axis, size)?;
    if updates.len() != outer * positions.len() * inner {
        return Err(format!(
            "updates {:?} do not fit {} indices into {shape:?}",
            updates.shape(),
            positions.len()
        )
        .into());
    }
    fn accumulate<T: Copy + Default>(
        o: &mut ArrayD<T>,
        u: &ArrayD<T>,
        positions: &[usize],
        [outer, size, inner]: [usize; 3],
        add: fn(T, T) -> T,
    ) {
        let u = u.as_standard_layout();
        let u = u.as_slice().expect("standard-layout updates");
        let o = o.as_slice_mut().expect("a standard-layout output");
        o.fill(T::default());
        let k = positions.len();
        for p in 0..outer {
            for (j, &at) in positions.iter().enumerate() {
                let (to, from) = ((p * size + at) * inner, (p * k + j) * inner);
                for (x, &y) in o[to..to + inner].iter_mut().zip(&u[from..from + inner]) {
                    *x = add(*x, y);
                }
            }
        }
    }
    let dims = [outer, size, inner];
    match (out, updates) {
        (Array::F32(o), Array::F32(u)) => accumulate(o, u, &positions, dims, |a, b| a + b),
        (Array::F64(o), Array::F64(u)) => accumulate(o, u, &positions, dims, |a, b| a + b),
        (Array::I32(o), Array::I32(u)) => accumulate(o, u, &positions, dims, i32::wrapping_add),
        (Array::I64(o), Array::I64(u)) => accumulate(o, u, &positions, dims, i64::wrapping_add),
        _ => {
            return Err(format!("`scatter_add` is not defined for {}", updates.dtype()).into());
        }
    }
    Ok(())
}

/// Integer labels as one-hot vectors of `depth`.
pub fn one_hot(labels: &Array, depth: usize, dtype: DType) -> KernelResult<Array> {
    let mut shape = labels.shape().to_vec();
    shape.push(depth);
    let mut out = Array::zeros(dtype, &shape);
    one_hot_into(labels, depth, &mut out)?;
    Ok(out)
}

/// `one_hot(labels, depth)` written into `out`, an array of the result's shape (the compiled
/// executor's buffer, or a fresh one). A label outside `0..depth` is an error.
pub fn one_hot_into(labels: &Array, depth: usize, out: &mut Array) -> KernelResult<()> {
    fn fill<T: Copy + From<bool>>(
        labels: &Array,
        depth: usize,
        out: &mut ArrayD<T>,
    ) -> KernelResult<()> {
        let labels: Box<dyn Iterator<Item = i64>> = match labels {
            Array::I32(a) => Box::new(a.iter().map(|&x| i64::from(x))),
            Array::I64(a) => Box::new(a.iter().copied()),
            other => return Err(format!("indices must be i32 or i64, found {}", other.ty()).into()),
        };
        let out = out.as_slice_mut().expect("a standard-layout output");
        out.fill(T::from(false));
        for (i, label) in labels.enumerate() {
            let l = usize::try_from(label)
                .ok()
                .filter(|&l| l < depth)
                .ok_or_else(|| {
                    OpError(format!("label {label} is out of range for depth {depth}"))
                })?;
            out[i * depth + l] = T::from(true);
        }
        Ok(())
    }
    match out {
        Array::F32(a) => fill(labels, depth, a),
        Array::F64(a) => fill(labels, depth, a),
        Array::I32(a) => fill(labels, depth, a),
        Array::I64(a) => fill(labels, depth, a),
        Array::Bool(a) => fill(labels, depth, a),
    }
}

/// The index along `axis` of every element of `shape`.
pub fn iota(shape: &[usize], axis: usize, dtype: DType) -> KernelResult<Array> {
    if axis >= shape.len() {
        return Err(format!("axis {axis} is out of range for rank {}", shape.len()).into());
    }
    let idx = ArrayD::from_shape_fn(IxDyn(shape), |i| i[axis] as i64);
    Ok(Array::I64(idx).cast(dtype))
}

/// A draw of `dist` with `shape`: computed in f64, rounded once to `dtype`.
pub fn random(dist: Distribution, stream: Stream, shape: &[usize], dtype: DType) -> Array {
    let mut out = Array::zeros(dtype, shape);
    random_into(dist, stream, &mut out);
    out
}

/// `random(dist, stream, …)` written into `out`, which gives the shape and dtype: element `i`
/// is draw `i` of the stream, computed in f64 and rounded once.
pub fn random_into(dist: Distribution, stream: Stream, out: &mut Array) {
    let draw = |i: usize| match dist {
        Distribution::Uniform { low, high } => stream.uniform(i as u64, low.0, high.0),
        Distribution::Normal { mean, std } => stream.normal(i as u64, mean.0, std.0),
    };
    fn fill<T>(a: &mut ArrayD<T>, f: impl Fn(usize) -> T) {
        let a = a.as_slice_mut().expect("a standard-layout output");
        a.iter_mut().enumerate().for_each(|(i, x)| *x = f(i));
    }
    match out {
        Array::F32(a) => fill(a, |i| draw(i) as f32),
        Array::F64(a) => fill(a, draw),
        Array::I32(a) => fill(a, |i| draw(i) as i32),
        Array::I64(a) => fill(a, |i| draw(i) as i64),
        Array::Bool(a) => fill(a, |i| draw(i) != 0.0),
    }
}
