//! Convolutions for the executor: im2col and gemm. Each sample and channel group becomes one
//! matrix product: the input's windows are laid out as columns (`[C/g·KH·KW, OH·OW]`), so
//! the convolution is `w_g · cols`, its input gradient `w_gᵀ · g` scattered back (col2im),
//! and its filter gradient `Σₙ g · colsᵀ`. The interpreter's direct loops are the oracle these
//! are tested against (`runtime/tests/op_info.rs`).

use super::matmul::PARALLEL_FLOPS;
use crate::Array;
use gemm::Parallelism;
use kiln_ir::{Conv2dAttrs, ConvKind};
use ndarray::ArrayD;
use num_traits::{One, Zero};
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
    /// Columns of the column matrix: output positions.
    fn p(&self) -> usize {
        self.oh * self.ow
    }
}

thread_local! {
    static COLUMNS_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static COLUMNS_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

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
        (Array::F32(a), Array::F32(b), Array::F32(out)) => {
            COLUMNS_F32.with_borrow_mut(|cols| typed(kind, attrs, a, b, out, threads, cols))
        }
        (Array::F64(a), Array::F64(b), Array::F64(out)) => {
            COLUMNS_F64.with_borrow_mut(|cols| typed(kind, attrs, a, b, out, threads, cols))
        }
        _ => unreachable!("the executor runs only float convolutions through gemm"),
    }
}

fn typed<T: Copy + Zero + One + std::ops::AddAssign + 'static>(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    out: &mut ArrayD<T>,
    threads: bool,
    cols: &mut Vec<T>,
) {
    let (x, w, y) = match kind {
        ConvKind::Forward => (a.shape(), b.shape(), out.shape()),
        ConvKind::InputGrad { .. } => (out.shape(), b.shape(), a.shape()),
        ConvKind::FilterGrad { .. } => (a.shape(), out.shape(), b.shape()),
    };
    let d = Dims::of(x, w, y, attrs.groups);
    cols.clear();
    cols.resize(d.k() * d.p(), T::zero());
    let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
    let (a, b) = (
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
    );
    let out = out.as_slice_mut().expect("executor buffers are contiguous");
    let parallel = threads && d.og() * d.k() * d.p() >= PARALLEL_FLOPS;
    let mm = Gemm {
        parallelism: if parallel {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        },
    };
    let (k, p, og) = (d.k(), d.p(), d.og());
    let sample = |n: usize| n * d.c * d.h * d.w;
    let output = |n: usize, g: usize| (n * d.o + g * og) * p;
    match kind {
        ConvKind::Forward => {
            for n in 0..d.n {
                for g in 0..d.groups {
                    im2col(&a[sample(n)..], &d, attrs, g, cols);
                    let dst = &mut out[output(n, g)..output(n, g) + og * p];
                    mm.run(
                        dst,
                        false,
                        [og, p, k],
                        (&b[g * og * k..], 1, k),
                        (cols, 1, p),
                    );
                }
            }
        }
        ConvKind::InputGrad { .. } => {
            out.fill(T::zero());
            for n in 0..d.n {
                for g in 0..d.groups {
                    let grad = &a[output(n, g)..output(n, g) + og * p];
                    mm.run(
                        cols,
                        false,
                        [k, p, og],
                        (&b[g * og * k..], k, 1),
                        (grad, 1, p),
                    );
                    col2im(cols, &d, attrs, g, &mut out[sample(n)..]);
                }
            }
        }
        ConvKind::FilterGrad { .. } => {
            for g in 0..d.groups {
                for n in 0..d.n {
                    im2col(&a[sample(n)..], &d, attrs, g, cols);
                    let grad = &b[output(n, g)..output(n, g) + og * p];
                    let dst = &mut out[g * og * k..(g + 1) * og * k];
                    mm.run(dst, n > 0, [og, k, p], (grad, 1, p), (cols, p, 1));
                }
            }
        }
    }
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

/// Lays group `g`'s windows of one sample `x` (`[C, H, W]`) out as the `K × P` matrix `cols`.
fn im2col<T: Copy + Zero>(x: &[T], d: &Dims, attrs: &Conv2dAttrs, g: usize, cols: &mut [T]) {
    let p = d.p();
    for ci in 0..d.cg() {
        let plane = &x[(g * d.cg() + ci) * d.h * d.w..];
        for kh in 0..d.kh {
            for kw in 0..d.kw {
                let row = &mut cols[((ci * d.kh + kh) * d.kw + kw) * p..][..p];
                for oh in 0..d.oh {
                    let ih = attrs.input_index(0, oh, kh, d.h);
                    for ow in 0..d.ow {
                        let iw = attrs.input_index(1, ow, kw, d.w);
                        row[oh * d.ow + ow] = match (ih, iw) {
                            (Some(ih), Some(iw)) => plane[ih * d.w + iw],
                            _ => T::zero(),
                        };
                    }
                }
            }
        }
    }
}

/// The adjoint of [`im2col`]: adds each column entry to the input element it came from.
fn col2im<T: Copy + Zero + std::ops::AddAssign>(
    cols: &[T],
    d: &Dims,
    attrs: &Conv2dAttrs,
    g: usize,
    x: &mut [T],
) {
    let p = d.p();
    for ci in 0..d.cg() {
        let plane = &mut x[(g * d.cg() + ci) * d.h * d.w..];
        for kh in 0..d.kh {
            for kw in 0..d.kw {
                let row = &cols[((ci * d.kh + kh) * d.kw + kw) * p..][..p];
                for oh in 0..d.oh {
                    let Some(ih) = attrs.input_index(0, oh, kh, d.h) else {
                        continue;
                    };
                    for ow in 0..d.ow {
                        if let Some(iw) = attrs.input_index(1, ow, kw, d.w) {
                            plane[ih * d.w + iw] += row[oh * d.ow + ow];
                        }
                    }
                }
            }
        }
    }
}
