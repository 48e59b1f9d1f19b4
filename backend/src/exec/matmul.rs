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

/// How a product reads its operands — each one's last two axes transposed first when
/// `transposed` says, and each through its [`View`] — and writes its result: into the output
/// seen with its axes permuted by `written_through` when given (a transpose of the result,
/// keeping the last axis last, folded into the product).
pub(crate) struct Operands<'a> {
    pub transposed: [bool; 2],
    pub views: [View<'a>; 2],
    pub written_through: Option<&'a [usize]>,
}

/// An operand's buffer (contiguous, row-major) seen with `shape` (a reshape's source, with the
/// same number of elements, or a slice's of its leading rows, with fewer) or its own, then
/// with its axes permuted by `perm` (a transpose's source, read through strides).
pub(crate) struct View<'a> {
    pub shape: Option<Vec<usize>>,
    pub perm: Option<&'a [usize]>,
}

/// An operand as the product reads it: a pointer, and per axis a size and an element stride.
struct Strided<T> {
    ptr: *const T,
    shape: Vec<usize>,
    strides: Vec<usize>,
}

impl<T> Strided<T> {
    fn of(array: &ArrayD<T>, view: &View<'_>) -> Strided<T> {
        let shape = view.shape.as_deref().unwrap_or(array.shape());
        assert!(
            shape.iter().product::<usize>() <= array.len(),
            "a view within its buffer"
        );
        let mut strides = vec![1; shape.len()];
        for axis in (0..shape.len().saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1] * shape[axis + 1];
        }
        let (shape, strides) = match view.perm {
            Some(perm) => (
                perm.iter().map(|&p| shape[p]).collect(),
                perm.iter().map(|&p| strides[p]).collect(),
            ),
            None => (shape.to_vec(), strides),
        };
        Strided {
            ptr: array.as_ptr(),
            shape,
            strides,
        }
    }

    /// Whether the matrices are stacked contiguously, row after row.
    fn contiguous(&self) -> bool {
        let mut expected = 1;
        for (&size, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if size != 1 && stride != expected {
                return false;
            }
            expected *= size;
        }
        true
    }
}

/// Computes `a @ b` into `out`, which has the result's shape: overwriting it, or with
/// `onto: Some(scale)` adding `scale · (a @ b)` to it.
pub(crate) fn matmul(
    a: &Array,
    b: &Array,
    out: &mut Array,
    operands: Operands<'_>,
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
        transposed,
        views,
        written_through,
    }: Operands<'_>,
    scale: Scale<T>,
    threads: bool,
) {
    let plain = |view: &View<'_>| view.shape.is_none() && view.perm.is_none();
    if x.ndim() == 2 && y.ndim() == 2 && views.iter().all(plain) && written_through.is_none() {
        // A product of two matrices as they are (a dense layer's): no batch, no views, and so
        // none of the general path's per-call vectors (~0.2 µs of a 64×16×16 product's 0.6).
        return matrices([x, y], z, transposed, scale, threads);
    }
    let [a, b] = [Strided::of(x, &views[0]), Strided::of(y, &views[1])];
    let out = Strided::of(
        &*z,
        &View {
            shape: None,
            perm: written_through,
        },
    );
    // SAFETY: the operands' views stay within their buffers (a view's shape has at most its
    // element count, checked in `Strided::of`; a permutation reorders axes), as does the output's, which does not
    // overlap them.
    unsafe { batched(&a, &b, z.as_mut_ptr(), &out, transposed, scale, threads) }
}

/// `z = x·y` (or `z += scale·x·y`) for two row-major matrices, each transposed first when
/// `transposed` says.
fn matrices<T: Copy + 'static + num_traits::Zero + num_traits::One>(
    [x, y]: [&ArrayD<T>; 2],
    z: &mut ArrayD<T>,
    [transpose_a, transpose_b]: [bool; 2],
    scale: Scale<T>,
    threads: bool,
) {
    let (xs, ys) = (x.shape(), y.shape());
    let (m, n) = (z.shape()[0], z.shape()[1]);
    let k = if transpose_a { xs[0] } else { xs[1] };
    // (column, row) element strides of each operand as an m×k and a k×n matrix.
    let strides = |columns: usize, transposed: bool| match transposed {
        true => (columns as isize, 1),
        false => (1, columns as isize),
    };
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if let Scale::Overwrite = scale {
            z.fill(T::zero());
        }
        return;
    }
    let product = Product {
        m,
        k,
        a: x.as_ptr(),
        a_strides: strides(xs[1], transpose_a),
        b: y.as_ptr(),
        b_strides: strides(ys[1], transpose_b),
        scale,
        split_rows: splits_rows(transpose_a, n, k),
    };
    let split = threads && m * n * k >= PARALLEL_FLOPS;
    // SAFETY: `z` is a contiguous m×n matrix (row stride n), disjoint from the operands, which
    // hold the m×k and k×n matrices the strides describe.
    unsafe { product.run(n, z.as_mut_ptr(), n, split) }
}

/// # Safety
/// `a`, `b` and `out_view` describe memory within their buffers, `out` points to the output's
/// buffer, which does not overlap the operands.
unsafe fn batched<T: Copy + 'static + num_traits::Zero + num_traits::One>(
    a: &Strided<T>,
    b: &Strided<T>,
    out: *mut T,
    out_view: &Strided<T>,
    [transpose_a, transpose_b]: [bool; 2],
    scale: Scale<T>,
    threads: bool,
) {
    let out_shape = &out_view.shape[..];
    let (ra, rb, ro) = (a.shape.len(), b.shape.len(), out_shape.len());
    let (m, n) = (out_shape[ro - 2], out_shape[ro - 1]);
    let k = if transpose_a {
        a.shape[ra - 2]
    } else {
        a.shape[ra - 1]
    };
    // Element strides (column, row) of each operand as an m×k and a k×n matrix.
    let matrix = |x: &Strided<T>, r: usize, transposed: bool| {
        let (rows, columns) = (x.strides[r - 2] as isize, x.strides[r - 1] as isize);
        if transposed {
            (rows, columns)
        } else {
            (columns, rows)
        }
    };
    let (mut a_strides, b_strides) = (matrix(a, ra, transpose_a), matrix(b, rb, transpose_b));
    let batch = &out_shape[..ro - 2];
    let count: usize = batch.iter().product();
    let mut ld = out_view.strides[ro - 2];
    // `[..., M, K] @ [K, N]` with the left operand not broadcast: its matrices are one
    // `[count·M, K]` matrix, and one product of that height runs at the machine's speed where
    // `count` products of `M` rows (a transformer's 128 tokens) do not.
    let left_whole = !transpose_a && a.shape[..ra - 2] == *batch && a.contiguous();
    let right_shared = b.shape[..rb - 2].iter().all(|&d| d == 1);
    let whole = left_whole && right_shared && out_view.contiguous() && count > 1;
    let (m, count) = if whole { (count * m, 1) } else { (m, count) };
    if whole {
        // Stacked row after row, the joined matrices' rows are `k` and `n` elements apart.
        // (Not the strides of the row axes: an axis of size 1 may have any stride — a
        // transpose's view of `[1, T, K]` as `[T, 1, K]` gives its one row a stride of T·K.)
        a_strides = (1, k as isize);
        ld = n;
    }
    if count == 0 || m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if let Scale::Onto(_) = scale {
            return;
        }
        // An empty sum: zeros (the buffer may hold an earlier run's values).
        for i in 0..count * m * n {
            // SAFETY: `out` holds `count·m·n` elements, in whatever order.
            unsafe { out.add(i).write(T::zero()) };
        }
        return;
    }
    // Each operand's element offset per batch axis of the result, 0 where it is broadcast.
    let batch_strides = |x: &Strided<T>| -> Vec<usize> {
        let rank = x.shape.len() - 2;
        let mut strides = vec![0; batch.len()];
        for axis in 0..rank {
            if x.shape[axis] != 1 {
                strides[axis + batch.len() - rank] = x.strides[axis];
            }
        }
        strides
    };
    let offsets = [batch_strides(a), batch_strides(b), batch_strides(out_view)];
    // Product `i` of the batch (its index split over the batch axes, last fastest), and where
    // its output matrix starts.
    let split_rows = splits_rows(transpose_a, n, k);
    let products: Vec<(Product<T>, usize)> = (0..count)
        .map(|i| {
            let (mut at, mut rest) = ([0; 3], i);
            for axis in (0..batch.len()).rev() {
                let x = rest % batch[axis];
                rest /= batch[axis];
                for (at, strides) in at.iter_mut().zip(&offsets) {
                    *at += x * strides[axis];
                }
            }
            let product = Product {
                m,
                k,
                // SAFETY: the offsets stay within the operands (batch indices are in range).
                a: unsafe { a.ptr.add(at[0]) },
                a_strides,
                // SAFETY: as for `a`.
                b: unsafe { b.ptr.add(at[1]) },
                b_strides,
                scale,
                split_rows,
            };
            (product, at[2])
        })
        .collect();
    let threads = threads && count * m * n * k >= PARALLEL_FLOPS;
    // Many products (attention's, per head): one thread each, not each split in two — a
    // 128×64×128 product split across the team costs its synchronisation every time.
    if threads && count >= 2 * crate::team::width() {
        let out = SendPtr(out);
        crate::team::for_each(count, |i| {
            let (product, at) = &products[i];
            // SAFETY: each task writes its own output matrix, disjoint from the operands.
            unsafe { product.run(n, out.get().add(*at), ld, false) }
        });
        return;
    }
    let split = threads && m * n * k >= PARALLEL_FLOPS;
    for (product, at) in &products {
        // SAFETY: the output matrix is within `out` and disjoint from the operands.
        unsafe { product.run(n, out.add(*at), ld, split) };
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
    /// Split across threads by rows, not columns ([`splits_rows`] decides; with `b`
    /// transposed columns were better, 421 against 506 µs alone).
    pub split_rows: bool,
}

/// Whether a product split across threads gives each its rows rather than its columns: for
/// `aᵀ·b` over a short sum (each thread then packs only its rows of `a`; W5's `xᵀ·g`,
/// k = 256: 670 → 604 µs in the step, `hᵀ·g` 431 → 388) or with fewer than 32 columns a
/// thread; columns otherwise — with a long sum rows were slower on Zen 4 (gemm alone, 2
/// threads: 1024×256×2048 6.19 → 4.91 ms by columns, 256×256×2048 1.34 → 1.22, 256×256×4096
/// 2.80 → 2.60; 512×512×256 0.64 by rows against 0.68). Measured on 2 threads only.
fn splits_rows(transpose_a: bool, n: usize, k: usize) -> bool {
    transpose_a && (k < 1024 || n < 32 * crate::team::width())
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
            let (count, rows_of) = crate::team::pieces(self.m, parts, 16);
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
        let (count, columns_of) = crate::team::pieces(n, parts, 16);
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
