//! Matrix products through the `gemm` crate: batched (batch axes broadcast NumPy-style), a
//! transposed operand read in place through its strides. (A transposed right operand used to
//! be copied first: on the AMD machine gemm read it at half speed. On the Intel machine the
//! copy cost more than it saved — W5's step 3.8 ms with it, 3.4 without, same run order.)
use crate::Array;
use gemm::Parallelism;
use ndarray::ArrayD;

/// Below this many multiply-adds a second thread costs more than it saves (measured on the
/// 2-core machines: gemm's two-thread mode pays from about 256³).
pub(crate) const PARALLEL_FLOPS: usize = 256 * 256 * 256;

/// Computes `a @ b` (each operand's last two axes transposed first when asked) into `out`,
/// which has the result's shape.
pub(crate) fn matmul(
    a: &Array,
    b: &Array,
    out: &mut Array,
    transpose_a: bool,
    transpose_b: bool,
    threads: bool,
) {
    match (a, b, out) {
        (Array::F32(x), Array::F32(y), Array::F32(z)) => {
            typed(x, y, z, transpose_a, transpose_b, threads)
        }
        (Array::F64(x), Array::F64(y), Array::F64(z)) => {
            typed(x, y, z, transpose_a, transpose_b, threads)
        }
        _ => unreachable!("the executor runs only float matmuls through gemm"),
    }
}

fn typed<T: Copy + 'static + num_traits::Zero + num_traits::One>(
    x: &ArrayD<T>,
    y: &ArrayD<T>,
    z: &mut ArrayD<T>,
    transpose_a: bool,
    transpose_b: bool,
    threads: bool,
) {
    let zp = z.as_mut_ptr();
    // SAFETY: the three arrays are contiguous with the shapes passed.
    unsafe {
        batched(
            x.as_ptr(),
            x.shape(),
            y.as_ptr(),
            y.shape(),
            zp,
            z.shape(),
            transpose_a,
            transpose_b,
            threads,
        )
    }
}

/// # Safety
/// `a`, `b` and `out` point to contiguous row-major arrays of the shapes given, `out` not
/// overlapping the others.
#[allow(clippy::too_many_arguments)]
unsafe fn batched<T: Copy + 'static + num_traits::Zero + num_traits::One>(
    a: *const T,
    a_shape: &[usize],
    b: *const T,
    b_shape: &[usize],
    out: *mut T,
    out_shape: &[usize],
    transpose_a: bool,
    transpose_b: bool,
    threads: bool,
) {
    let (ra, rb, ro) = (a_shape.len(), b_shape.len(), out_shape.len());
    let (m, n) = (out_shape[ro - 2], out_shape[ro - 1]);
    let (a_rows, a_cols) = (a_shape[ra - 2], a_shape[ra - 1]);
    let (b_rows, b_cols) = (b_shape[rb - 2], b_shape[rb - 1]);
    let k = if transpose_a { a_rows } else { a_cols };
    // Element strides (column, row) of each operand as an m×k and a k×n matrix.
    let (a_cs, a_rs) = if transpose_a {
        (a_cols as isize, 1)
    } else {
        (1, a_cols as isize)
    };
    let (b_cs, b_rs) = if transpose_b {
        (b_cols as isize, 1)
    } else {
        (1, b_cols as isize)
    };
    let batch = &out_shape[..ro - 2];
    let count: usize = batch.iter().product();
    if count == 0 || m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: zeros (the buffer may hold an earlier run's values).
        for i in 0..count * m * n {
            // SAFETY: `out` holds `count·m·n` elements.
            unsafe { out.add(i).write(T::zero()) };
        }
        return;
    }
    // Offsets of each operand's matrix for a batch index, with broadcast axes fixed at 0.
    let batch_strides = |shape: &[usize], matrix: usize| -> Vec<usize> {
        let rank = shape.len() - 2;
        let mut strides = vec![0; batch.len()];
        let mut stride = matrix;
        for axis in (0..rank).rev() {
            let target = axis + batch.len() - rank;
            if shape[axis] != 1 {
                strides[target] = stride;
            }
            stride *= shape[axis];
        }
        strides
    };
    let a_strides = batch_strides(a_shape, a_rows * a_cols);
    let b_strides = batch_strides(b_shape, b_rows * b_cols);
    let parallelism = if threads && m * n * k >= PARALLEL_FLOPS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    let mut index = vec![0usize; batch.len()];
    for i in 0..count {
        let (mut a_off, mut b_off) = (0, 0);
        for (axis, &x) in index.iter().enumerate() {
            a_off += x * a_strides[axis];
            b_off += x * b_strides[axis];
        }
        // SAFETY: within the operand.
        let b_matrix = unsafe { b.add(b_off) };
        // SAFETY: the offsets stay within the operands (batch indices are in range), and the
        // output matrix `i` is disjoint from the operands.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.add(i * m * n),
                1,
                n as isize,
                false,
                a.add(a_off),
                a_cs,
                a_rs,
                b_matrix,
                b_cs,
                b_rs,
                T::zero(),
                T::one(),
                false,
                false,
                false,
                parallelism,
            );
        }
        // The next batch index, last axis fastest.
        for axis in (0..batch.len()).rev() {
            index[axis] += 1;
            if index[axis] < batch[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}
