//! Matrix products through the `gemm` crate: batched (batch axes broadcast NumPy-style), a
//! transposed operand read in place through its strides. (A transposed right operand used to
//! be copied first: on the AMD machine gemm read it at half speed. On the Intel machine the
//! copy cost more than it saved — W5's step 3.8 ms with it, 3.4 without, same run order.)
use crate::Array;
use gemm::Parallelism;
use ndarray::ArrayD;

/// Below this many multiply-adds a second thread costs more than it saves. (256³ while the
/// threads were rayon's, which made a two-thread product 26–82 µs slower than a spinning
/// helper does; with the team's helpers a 64×256×256 product takes 27 µs on two threads
/// against 47 on one, and W10's step went from 22.7 to 17.5–18.0 ms with this threshold at
/// 2²⁰ or 2²².)
pub(crate) const PARALLEL_FLOPS: usize = 1 << 20;

/// How a product reads its operands: each one's last two axes transposed first when
/// `transposed` says, and read as the shape in `seen_as` when there is one (a reshape's
/// source, with the same number of elements).
pub(crate) struct Operands {
    pub transposed: [bool; 2],
    pub seen_as: [Option<Vec<usize>>; 2],
}

/// Computes `a @ b` into `out`, which has the result's shape: overwriting it, or with
/// `onto: Some(scale)` adding `scale · (a @ b)` to it.
pub(crate) fn matmul(
    a: &Array,
    b: &Array,
    out: &mut Array,
    operands: Operands,
    onto: Option<f64>,
    threads: bool,
) {
    match (a, b, out) {
        (Array::F32(x), Array::F32(y), Array::F32(z)) => {
            let scale = onto.map_or(Scale::Overwrite, |s| Scale::Onto(s as f32));
            typed([x, y], z, operands, scale, threads)
        }
        (Array::F64(x), Array::F64(y), Array::F64(z)) => {
            let scale = onto.map_or(Scale::Overwrite, Scale::Onto);
            typed([x, y], z, operands, scale, threads)
        }
        _ => unreachable!("the executor runs only float matmuls through gemm"),
    }
}

/// Whether a product overwrites its output or is added onto it, scaled.
#[derive(Clone, Copy)]
pub(crate) enum Scale<T> {
    Overwrite,
    Onto(T),
}

fn typed<T: Copy + 'static + num_traits::Zero + num_traits::One>(
    [x, y]: [&ArrayD<T>; 2],
    z: &mut ArrayD<T>,
    Operands {
        transposed: [transpose_a, transpose_b],
        seen_as,
    }: Operands,
    scale: Scale<T>,
    threads: bool,
) {
    let [x_shape, y_shape] = [(x, &seen_as[0]), (y, &seen_as[1])].map(|(array, shape)| {
        let shape = shape.as_deref().unwrap_or(array.shape());
        assert_eq!(
            shape.iter().product::<usize>(),
            array.len(),
            "a reshape's size"
        );
        shape
    });
    let zp = z.as_mut_ptr();
    // SAFETY: the three arrays are contiguous with the shapes passed (a reshaped operand's
    // shape has its element count).
    unsafe {
        batched(
            x.as_ptr(),
            x_shape,
            y.as_ptr(),
            y_shape,
            zp,
            z.shape(),
            transpose_a,
            transpose_b,
            scale,
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
    scale: Scale<T>,
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
    // `[..., M, K] @ [K, N]` with the left operand not broadcast: its matrices are one
    // `[count·M, K]` matrix, and one product of that height runs at the machine's speed where
    // `count` products of `M` rows (a transformer's 128 tokens) do not.
    let left_whole = !transpose_a && a_shape[..ra - 2] == *batch;
    let right_shared = b_shape[..rb - 2].iter().all(|&d| d == 1);
    let (m, count) = match left_whole && right_shared && count > 1 {
        true => (count * m, 1),
        false => (m, count),
    };
    if count == 0 || m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if let Scale::Onto(_) = scale {
            return;
        }
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
    // Product `i` of the batch, its index split over the batch axes (last fastest).
    let products: Vec<Product<T>> = (0..count)
        .map(|i| {
            let (mut a_off, mut b_off, mut rest) = (0, 0, i);
            for axis in (0..batch.len()).rev() {
                let x = rest % batch[axis];
                rest /= batch[axis];
                a_off += x * a_strides[axis];
                b_off += x * b_strides[axis];
            }
            Product {
                m,
                k,
                // SAFETY: the offsets stay within the operands (batch indices are in range).
                a: unsafe { a.add(a_off) },
                a_strides: (a_cs, a_rs),
                // SAFETY: as for `a`.
                b: unsafe { b.add(b_off) },
                b_strides: (b_cs, b_rs),
                scale,
                split_rows: transpose_a,
            }
        })
        .collect();
    let threads = threads && count * m * n * k >= PARALLEL_FLOPS;
    // Many products (attention's, per head): one thread each, not each split in two — a
    // 128×64×128 product split across the team costs its synchronisation every time.
    if threads && count >= 2 * crate::team::width() {
        let out = SendPtr(out);
        crate::team::for_each(count, |i| {
            // SAFETY: each task writes its own output matrix, disjoint from the operands.
            unsafe { products[i].run(n, out.get().add(i * m * n), n, false) }
        });
        return;
    }
    for (i, product) in products.iter().enumerate() {
        // SAFETY: the output matrix `i` is within `out` and disjoint from the operands.
        unsafe {
            product.run(
                n,
                out.add(i * m * n),
                n,
                threads && m * n * k >= PARALLEL_FLOPS,
            )
        };
    }
}

/// One matrix product `dst [+]= a·b` (`m×k` by `k×n`), operands given by pointers and
/// (column, row) element strides.
pub(crate) struct Product<T> {
    pub m: usize,
    pub k: usize,
    pub a: *const T,
    pub a_strides: (isize, isize),
    pub b: *const T,
    pub b_strides: (isize, isize),
    /// Whether `dst` is overwritten or added to.
    pub scale: Scale<T>,
    /// Split across threads by rows, not columns: better where `a` is transposed (each
    /// thread then packs only its rows of it): W5's `xᵀ·g` 670 → 604 µs and `hᵀ·g` 431 → 388
    /// µs in the step; with `b` transposed columns were better (421 against 506 µs alone).
    pub split_rows: bool,
}

/// `0..len` in at most `parts` pieces of a multiple of 16 (the last may be shorter): how many,
/// and the `i`th.
fn pieces(len: usize, parts: usize) -> (usize, impl Fn(usize) -> std::ops::Range<usize>) {
    let size = len.div_ceil(parts).next_multiple_of(16);
    (len.div_ceil(size), move |i| {
        i * size..((i + 1) * size).min(len)
    })
}

// SAFETY: the operands are only read, by threads writing disjoint columns of the output.
unsafe impl<T> Sync for Product<T> {}

struct SendPtr<T>(*mut T);
// SAFETY: each thread writes its own columns of the output.
unsafe impl<T> Sync for SendPtr<T> {}
// SAFETY: as for `Sync`.
unsafe impl<T> Send for SendPtr<T> {}

impl<T> SendPtr<T> {
    /// The pointer (a method, so closures capture the wrapper, not the raw pointer).
    fn get(&self) -> *mut T {
        self.0
    }
}

impl<T: Copy + 'static + num_traits::Zero + num_traits::One> Product<T> {
    /// Computes all `n` columns into `dst` (row stride `ld`); with `threads`, each of the
    /// team's threads a run of the columns or of the rows (measured faster than gemm's own
    /// split for every W5 product but `aᵀ·b` with rayon's threads, on 2 threads: 325 against
    /// 349 µs for 256×512×512, 406 against 539 µs with `b` transposed).
    ///
    /// # Safety
    /// As for [`Product::columns`], for all `n` columns.
    pub(crate) unsafe fn run(&self, n: usize, dst: *mut T, ld: usize, threads: bool) {
        let parts = if threads { crate::team::width() } else { 1 };
        if parts <= 1 {
            // SAFETY: the caller's contract.
            return unsafe { self.columns(0..n, dst, ld) };
        }
        let dst = SendPtr(dst);
        if self.split_rows {
            let (count, rows_of) = pieces(self.m, parts);
            crate::team::for_each(count, |r| {
                let rows = rows_of(r);
                let part = Product {
                    m: rows.len(),
                    // SAFETY: row `i` of `a` starts `i·a_rs` in, within the operand.
                    a: unsafe { self.a.offset(rows.start as isize * self.a_strides.1) },
                    ..*self
                };
                // SAFETY: each task writes its own rows; the operands are only read.
                unsafe { part.columns(0..n, dst.get().add(rows.start * ld), ld) }
            });
            return;
        }
        let (count, columns_of) = pieces(n, parts);
        crate::team::for_each(count, |c| {
            // SAFETY: each task writes its own columns; the operands are only read.
            unsafe { self.columns(columns_of(c), dst.get(), ld) }
        });
    }

    /// Computes the output's `columns` into `dst` (row stride `ld`).
    ///
    /// # Safety
    /// `dst` holds `m` rows of `ld` elements, no other thread writes these columns, and the
    /// operands are valid for the product's shape.
    unsafe fn columns(&self, columns: std::ops::Range<usize>, dst: *mut T, ld: usize) {
        if columns.is_empty() {
            return;
        }
        let (a_cs, a_rs) = self.a_strides;
        let (b_cs, b_rs) = self.b_strides;
        // gemm computes `dst = α·dst + β·a·b`.
        let (alpha, beta) = match self.scale {
            Scale::Overwrite => (T::zero(), T::one()),
            Scale::Onto(scale) => (T::one(), scale),
        };
        // SAFETY: the caller's contract; column `j` of `b` starts `j·b_cs` in.
        unsafe {
            gemm::gemm(
                self.m,
                columns.len(),
                self.k,
                dst.add(columns.start),
                1,
                ld as isize,
                matches!(self.scale, Scale::Onto(_)),
                self.a,
                a_cs,
                a_rs,
                self.b.offset(columns.start as isize * b_cs),
                b_cs,
                b_rs,
                alpha,
                beta,
                false,
                false,
                false,
                Parallelism::None,
            );
        }
    }
}
