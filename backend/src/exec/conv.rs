//! Convolutions for the executor: im2col and gemm. Each chunk of samples and channel group
//! becomes one matrix product: the chunk's windows are laid out as columns
//! (`[C/g·KH·KW, samples·OH·OW]`), so the convolution is `w_g · cols`, its input gradient
//! `w_gᵀ · g` scattered back (col2im), and its filter gradient `g · colsᵀ`. A whole batch of
//! small images is one chunk: one gemm per layer, large enough to use every core, where a
//! gemm per sample (`[64, 16, 288]` for the digits CNN) was too small to. The interpreter's direct loops are the oracle these
//! are tested against (`runtime/tests/op_info.rs`).

use super::matmul::PARALLEL_FLOPS;
use crate::Array;
use gemm::Parallelism;
use kiln_ir::{Conv2dAttrs, ConvKind};
use ndarray::ArrayD;
use num_traits::{One, Zero};
use rayon::prelude::*;
use std::cell::RefCell;

/// Sizes of one convolution: input `[n, c, h, w]`, weights `[o, c/groups, kh, kw]`, output
/// `[n, o, oh, ow]`; `k` and `p` are the rows and columns of the column matrix.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    groups: usize,
}

impl Dims {
    fn of(x: &[usize], w: &[usize], y: &[usize], groups: usize) -> Dims {
        Dims {
            n: x[0],
            c: x[1],
            h: x[2],
            w: x[3],
            o: w[0],
            kh: w[2],
            kw: w[3],
            oh: y[2],
            ow: y[3],
            groups,
        }
    }
    /// Input channels per group.
    fn cg(&self) -> usize {
        self.c / self.groups
    }
    /// Output channels per group.
    fn og(&self) -> usize {
        self.o / self.groups
    }
    /// Rows of the column matrix: `C/g · KH · KW`.
    fn k(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    /// Columns of the column matrix per sample: output positions.
    fn p(&self) -> usize {
        self.oh * self.ow
    }
    /// The input channel (within its group) and kernel tap of column-matrix row `row`.
    fn tap(&self, row: usize) -> (usize, usize, usize) {
        (
            row / (self.kh * self.kw),
            row / self.kw % self.kh,
            row % self.kw,
        )
    }
    /// Where input channel `ci` of group `g` of sample `n` starts.
    fn plane(&self, n: usize, g: usize, ci: usize) -> usize {
        ((n * self.c) + g * self.cg() + ci) * self.h * self.w
    }
    /// Where output channel `o` of group `g` of sample `n` starts.
    fn output_row(&self, n: usize, g: usize, o: usize) -> usize {
        ((n * self.o) + g * self.og() + o) * self.p()
    }
}

thread_local! {
    static SCRATCH_F32: RefCell<Scratch<f32>> = RefCell::new(Scratch::default());
    static SCRATCH_F64: RefCell<Scratch<f64>> = RefCell::new(Scratch::default());
}

/// The column matrix and a gradient or output matrix, kept between calls.
struct Scratch<T> {
    cols: Vec<T>,
    mat: Vec<T>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            cols: Vec::new(),
            mat: Vec::new(),
        }
    }
}

/// The most column-matrix elements one chunk of samples may take (16 MiB of f32): a batch of
/// small images is one matrix, so each gemm is large enough to run well on every core.
const COLUMN_BUDGET: usize = 1 << 22;

/// Runs `conv2d` (or a transpose, by `kind`) of `a` and `b` into `out`, which has the
/// result's shape. Float arrays of one dtype (the schedule sends no others).
pub(crate) fn conv2d(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    a: &Array,
    b: &Array,
    out: &mut Array,
    threads: bool,
) {
    match (a, b, out) {
        (Array::F32(a), Array::F32(b), Array::F32(out)) => SCRATCH_F32
            .with_borrow_mut(|s| typed(kind, attrs, [a, b], out, threads, COLUMN_BUDGET, s)),
        (Array::F64(a), Array::F64(b), Array::F64(out)) => SCRATCH_F64
            .with_borrow_mut(|s| typed(kind, attrs, [a, b], out, threads, COLUMN_BUDGET, s)),
        _ => unreachable!("the executor runs only float convolutions through gemm"),
    }
}

/// The element types convolutions run in.
trait Elem: Copy + Zero + One + std::ops::AddAssign + Send + Sync + 'static {}
impl<T: Copy + Zero + One + std::ops::AddAssign + Send + Sync + 'static> Elem for T {}

/// A run of whole samples `n0..n0 + count` and one channel group: the unit the column matrix
/// (`[K, count·P]`, column `(n − n0)·P + position`) is built for.
#[derive(Clone, Copy)]
struct Chunk {
    n0: usize,
    count: usize,
    group: usize,
}

/// The convolution with column matrices of at most `budget` elements (but one sample).
fn typed<T: Elem>(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    [a, b]: [&ArrayD<T>; 2],
    out: &mut ArrayD<T>,
    threads: bool,
    budget: usize,
    scratch: &mut Scratch<T>,
) {
    let (x, w, y) = match kind {
        ConvKind::Forward => (a.shape(), b.shape(), out.shape()),
        ConvKind::InputGrad { .. } => (out.shape(), b.shape(), a.shape()),
        ConvKind::FilterGrad { .. } => (a.shape(), out.shape(), b.shape()),
    };
    let d = Dims::of(x, w, y, attrs.groups);
    let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
    let (a, b) = (
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
    );
    let out = out.as_slice_mut().expect("executor buffers are contiguous");
    let per_chunk = (budget / (d.k() * d.p()).max(1)).clamp(1, d.n.max(1));
    if !matches!(kind, ConvKind::Forward) {
        out.fill(T::zero());
    }
    let run = Run::new(d, attrs, threads);
    for n0 in (0..d.n).step_by(per_chunk) {
        for group in 0..d.groups {
            let chunk = Chunk {
                n0,
                count: per_chunk.min(d.n - n0),
                group,
            };
            match kind {
                ConvKind::Forward => run.forward(chunk, a, b, out, scratch),
                ConvKind::InputGrad { .. } => run.input_grad(chunk, a, b, out, scratch),
                ConvKind::FilterGrad { .. } => run.filter_grad(chunk, a, b, out, scratch),
            }
        }
    }
}

/// One convolution call's sizes and settings.
struct Run {
    d: Dims,
    threads: bool,
    /// For each column-matrix row and output position, the input element it reads, counted
    /// from the start of its group's channels in one sample (`PADDING` where it reads
    /// padding): the window geometry worked out once per call, not per sample.
    offsets: Vec<u32>,
}

/// The offset of a column-matrix entry that reads padding.
const PADDING: u32 = u32::MAX;

impl Run {
    fn new(d: Dims, attrs: &Conv2dAttrs, threads: bool) -> Run {
        let mut offsets = Vec::with_capacity(d.k() * d.p());
        for row in 0..d.k() {
            let (ci, kh, kw) = d.tap(row);
            for oh in 0..d.oh {
                let ih = attrs.input_index(0, oh, kh, d.h);
                for ow in 0..d.ow {
                    let iw = attrs.input_index(1, ow, kw, d.w);
                    offsets.push(match (ih, iw) {
                        (Some(ih), Some(iw)) => ((ci * d.h + ih) * d.w + iw) as u32,
                        _ => PADDING,
                    });
                }
            }
        }
        Run {
            d,
            threads,
            offsets,
        }
    }

    fn gemm(&self, flops: usize) -> Gemm {
        Gemm {
            parallelism: if self.threads && flops >= PARALLEL_FLOPS {
                Parallelism::Rayon(0)
            } else {
                Parallelism::None
            },
        }
    }

    /// `y = w_g · cols`, then each sample's rows moved to its place in `y` (`[N, O, P]`).
    fn forward<T: Elem>(&self, c: Chunk, x: &[T], w: &[T], y: &mut [T], s: &mut Scratch<T>) {
        let (k, og, cols) = (self.d.k(), self.d.og(), c.count * self.d.p());
        let columns = prefix(&mut s.cols, k * cols);
        self.im2col(c, x, columns);
        let product = prefix(&mut s.mat, og * cols);
        self.gemm(og * k * cols).run(
            product,
            false,
            [og, cols, k],
            (&w[c.group * og * k..], 1, k),
            (columns, 1, cols),
        );
        self.scatter(c, product, y);
    }

    /// `cols = w_gᵀ · g`, then each column added back to the input element it came from.
    fn input_grad<T: Elem>(&self, c: Chunk, g: &[T], w: &[T], dx: &mut [T], s: &mut Scratch<T>) {
        let (k, og, cols) = (self.d.k(), self.d.og(), c.count * self.d.p());
        let grad = prefix(&mut s.mat, og * cols);
        self.gather(c, g, grad);
        let columns = prefix(&mut s.cols, k * cols);
        self.gemm(og * k * cols).run(
            columns,
            false,
            [k, cols, og],
            (&w[c.group * og * k..], k, 1),
            (grad, 1, cols),
        );
        self.col2im(c, columns, dx);
    }

    /// `dw_g += g · colsᵀ`.
    fn filter_grad<T: Elem>(&self, c: Chunk, x: &[T], g: &[T], dw: &mut [T], s: &mut Scratch<T>) {
        let (k, og, cols) = (self.d.k(), self.d.og(), c.count * self.d.p());
        let columns = prefix(&mut s.cols, k * cols);
        self.im2col(c, x, columns);
        let grad = prefix(&mut s.mat, og * cols);
        self.gather(c, g, grad);
        let dst = &mut dw[c.group * og * k..(c.group + 1) * og * k];
        self.gemm(og * k * cols).run(
            dst,
            c.n0 > 0,
            [og, k, cols],
            (grad, 1, cols),
            (columns, cols, 1),
        );
    }

    /// Lays the chunk's windows out as the `K × count·P` matrix `cols`.
    fn im2col<T: Elem>(&self, c: Chunk, x: &[T], cols: &mut [T]) {
        let d = &self.d;
        let (p, row_len) = (d.p(), c.count * d.p());
        let group = d.cg() * d.h * d.w;
        for_each_chunk(cols, row_len, self.threads, |row_index, row| {
            let offsets = &self.offsets[row_index * p..][..p];
            for n in 0..c.count {
                let base = d.plane(c.n0 + n, c.group, 0);
                let group = &x[base..base + group];
                for (to, &at) in row[n * p..(n + 1) * p].iter_mut().zip(offsets) {
                    *to = if at == PADDING {
                        T::zero()
                    } else {
                        group[at as usize]
                    };
                }
            }
        });
    }

    /// The adjoint of [`Run::im2col`]: adds each column entry to the input element it came
    /// from, sample by sample (each sample's plane is written by one thread).
    fn col2im<T: Elem>(&self, c: Chunk, cols: &[T], dx: &mut [T]) {
        let d = &self.d;
        let (p, row_len, sample) = (d.p(), c.count * d.p(), d.c * d.h * d.w);
        let group = d.cg() * d.h * d.w;
        let samples = &mut dx[c.n0 * sample..(c.n0 + c.count) * sample];
        for_each_chunk(samples, sample, self.threads, |n, dx| {
            let base = d.plane(0, c.group, 0);
            let dx = &mut dx[base..base + group];
            for row_index in 0..d.k() {
                let offsets = &self.offsets[row_index * p..][..p];
                let row = &cols[row_index * row_len + n * p..][..p];
                for (&v, &at) in row.iter().zip(offsets) {
                    if at != PADDING {
                        dx[at as usize] += v;
                    }
                }
            }
        });
    }

    /// Copies the chunk's group of `g` (`[N, O, P]`) into `mat` as `[O/g, count·P]`.
    fn gather<T: Elem>(&self, c: Chunk, g: &[T], mat: &mut [T]) {
        let d = &self.d;
        let (p, row_len) = (d.p(), c.count * d.p());
        for_each_chunk(mat, row_len, self.threads, |o, row| {
            for n in 0..c.count {
                let from = d.output_row(c.n0 + n, c.group, o);
                row[n * p..(n + 1) * p].copy_from_slice(&g[from..from + p]);
            }
        });
    }

    /// The inverse of [`Run::gather`]: `mat` (`[O/g, count·P]`) into the chunk's group of `y`.
    fn scatter<T: Elem>(&self, c: Chunk, mat: &[T], y: &mut [T]) {
        let d = &self.d;
        let (p, row_len, sample) = (d.p(), c.count * d.p(), d.o * d.p());
        let samples = &mut y[c.n0 * sample..(c.n0 + c.count) * sample];
        for_each_chunk(samples, sample, self.threads, |n, y| {
            for o in 0..d.og() {
                let to = d.output_row(0, c.group, o);
                y[to..to + p].copy_from_slice(&mat[o * row_len + n * p..][..p]);
            }
        });
    }
}

/// Calls `f(index, chunk)` on each `size`-element chunk of `data`, on rayon's threads when
/// `threads` allows and there is more than one chunk.
fn for_each_chunk<T: Send>(
    data: &mut [T],
    size: usize,
    threads: bool,
    f: impl Fn(usize, &mut [T]) + Send + Sync,
) {
    if size == 0 {
        return;
    }
    if threads && data.len() > size {
        data.par_chunks_mut(size)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        data.chunks_mut(size).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// The first `len` elements of `v`, grown if it is shorter (never shrunk, so a buffer is
/// zeroed once, not each time a larger convolution follows a smaller one). Every element is
/// written before it is read, so values left from an earlier call do not matter.
fn prefix<T: Zero + Clone>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::zero());
    }
    &mut v[..len]
}

/// One gemm call: `dst (m×n) = [dst +] lhs (m×k) · rhs (k×n)`, operands given with their
/// (column, row) element strides.
struct Gemm {
    parallelism: Parallelism,
}

impl Gemm {
    fn run<T: Copy + Zero + One + 'static>(
        &self,
        dst: &mut [T],
        accumulate: bool,
        [m, n, k]: [usize; 3],
        (lhs, lhs_cs, lhs_rs): (&[T], usize, usize),
        (rhs, rhs_cs, rhs_rs): (&[T], usize, usize),
    ) {
        let last = |cs: usize, rs: usize, rows: usize, cols: usize| {
            (rows.max(1) - 1) * rs + (cols.max(1) - 1) * cs
        };
        assert!(dst.len() >= m * n, "gemm destination too small");
        assert!(
            m * k == 0 || last(lhs_cs, lhs_rs, m, k) < lhs.len(),
            "lhs out of bounds"
        );
        assert!(
            k * n == 0 || last(rhs_cs, rhs_rs, k, n) < rhs.len(),
            "rhs out of bounds"
        );
        let alpha = if accumulate { T::one() } else { T::zero() };
        // SAFETY: the asserts above keep every element gemm reads within `lhs` and `rhs` and
        // every element it writes within `dst`, which borrows exclusively (so no overlap).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                accumulate,
                lhs.as_ptr(),
                lhs_cs as isize,
                lhs_rs as isize,
                rhs.as_ptr(),
                rhs_cs as isize,
                rhs_rs as isize,
                alpha,
                T::one(),
                false,
                false,
                false,
                self.parallelism,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;

    fn ramp(shape: &[usize], scale: f64) -> ArrayD<f64> {
        let n = shape.iter().product::<usize>();
        let values = (0..n)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) * scale)
            .collect();
        ArrayD::from_shape_vec(IxDyn(shape), values).expect("the shape's size")
    }

    /// Chunks of a few samples (the path a batch of large images takes) give what one chunk
    /// of the whole batch gives, for the convolution and both its transposes.
    #[test]
    fn chunked_batches_match_one_chunk() {
        let attrs = Conv2dAttrs {
            strides: [1, 2],
            padding: [(1, 0), (1, 1)],
            dilation: [1, 1],
            groups: 2,
        };
        let (x, w, y) = ([5, 4, 5, 6], [6, 2, 3, 2], [5, 6, 4, 4]);
        let kinds = [
            (ConvKind::Forward, x, w, y),
            (ConvKind::InputGrad { input: [5, 6] }, y, w, x),
            (ConvKind::FilterGrad { kernel: [3, 2] }, x, y, w),
        ];
        for (kind, a, b, out) in kinds {
            let (a, b) = (ramp(&a, 0.5), ramp(&b, 0.25));
            let run = |budget| {
                let mut result = ArrayD::zeros(IxDyn(&out));
                let mut scratch = Scratch::default();
                typed(
                    kind,
                    &attrs,
                    [&a, &b],
                    &mut result,
                    false,
                    budget,
                    &mut scratch,
                );
                result
            };
            // One sample's column matrix has 2·3·2 × 16 = 192 elements: a budget of 400
            // makes chunks of two samples (and a last one of one).
            assert_eq!(run(400), run(COLUMN_BUDGET), "{kind:?}");
        }
    }
}
