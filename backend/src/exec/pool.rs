//! Pooling for the executor: direct loops over each window's rows, with the bounds of the
//! window clipped once per output position (`Pool2dAttrs::input_range`) instead of per tap,
//! and the planes (sample × channel) split across threads. The interpreter's kernels are the
//! oracle these are tested against (`runtime/tests/op_info.rs`).

use crate::Array;
use crate::interp::kernels::{FloatElem, nan_max};
use crate::interp::window::first_max;
use kiln_ir::{Pool2dAttrs, PoolKind};
use ndarray::{ArrayD, CowArray, IxDyn};
use std::ops::Range;

/// Runs a pooling op (or its gradient, by `kind`) on `args` into `out`, which has the
/// result's shape, one plane (sample and channel) per task, on the team's threads when `threads`
/// allows. Float arrays of one dtype (the schedule sends no others).
pub(crate) fn pool2d(
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    args: &[&Array],
    out: &mut Array,
    threads: bool,
) {
    match (args, out) {
        ([Array::F32(x)], Array::F32(out)) => Planes::new(kind, attrs, x, None, threads).into(out),
        ([Array::F64(x)], Array::F64(out)) => Planes::new(kind, attrs, x, None, threads).into(out),
        ([Array::F32(x), Array::F32(g)], Array::F32(out)) => {
            Planes::new(kind, attrs, x, Some(g), threads).into(out)
        }
        ([Array::F64(x), Array::F64(g)], Array::F64(out)) => {
            Planes::new(kind, attrs, x, Some(g), threads).into(out)
        }
        _ => unreachable!("the executor runs only float pooling natively"),
    }
}

/// Below this many input elements, pooling stays on the calling thread; and the input
/// elements one task takes.
const PARALLEL_ELEMENTS: usize = 1 << 14;

/// One pooling call: the operands as row-major slices and the sizes of one plane.
struct Planes<'a, T: FloatElem> {
    kind: PoolKind,
    attrs: &'a Pool2dAttrs,
    a: CowArray<'a, T, IxDyn>,
    g: Option<CowArray<'a, T, IxDyn>>,
    /// The input plane's and the pooled plane's sizes.
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    threads: bool,
}

impl<'a, T: FloatElem + Send + Sync> Planes<'a, T> {
    fn new(
        kind: PoolKind,
        attrs: &'a Pool2dAttrs,
        a: &'a ArrayD<T>,
        g: Option<&'a ArrayD<T>>,
        threads: bool,
    ) -> Self {
        Planes {
            kind,
            attrs,
            a: a.as_standard_layout(),
            g: g.map(|g| g.as_standard_layout()),
            h: 0,
            w: 0,
            oh: 0,
            ow: 0,
            threads,
        }
    }

    /// Computes into `out`, plane by plane.
    fn into(mut self, out: &mut ArrayD<T>) {
        // The plane the windows run over, and the pooled plane.
        let (input, pooled) = match (self.kind, &self.g) {
            (PoolKind::Max | PoolKind::Avg, _) => (self.a.shape(), out.shape()),
            (PoolKind::MaxGrad, Some(g)) => (self.a.shape(), g.shape()),
            (PoolKind::AvgGrad { .. }, _) => (out.shape(), self.a.shape()),
            (PoolKind::MaxGrad, None) => unreachable!("max_pool2d_grad has a gradient"),
        };
        (self.h, self.w, self.oh, self.ow) = (input[2], input[3], pooled[2], pooled[3]);
        let out_plane = out.shape()[2] * out.shape()[3];
        let parallel = self.threads && input.iter().product::<usize>() >= PARALLEL_ELEMENTS;
        let out = out.as_slice_mut().expect("executor buffers are contiguous");
        if out_plane == 0 {
            return;
        }
        let a = self.a.as_slice().expect("standard");
        let g = (self.g.as_ref()).map(|g| g.as_slice().expect("standard"));
        let columns: Vec<_> = (0..self.ow)
            .map(|x| self.attrs.input_range(1, x, self.w))
            .collect();
        // Planes of small images are tiny: a task takes enough of them to outweigh its own
        // cost.
        let per_task = PARALLEL_ELEMENTS.div_ceil((self.h * self.w).max(1));
        let this = &self;
        // 2×2 windows that tile the planes tile a task's run of planes too (its rows pair up
        // within each plane): one call per task, not per plane.
        let tiled_2x2 = matches!(self.kind, PoolKind::Max | PoolKind::MaxGrad)
            && self.attrs.window == [2, 2]
            && self.tiles();
        let (image, pooled) = (self.h * self.w, self.oh * self.ow);
        let task = |(t, planes): (usize, &mut [T])| {
            let (first, count) = (t * per_task, planes.len() / out_plane);
            if tiled_2x2 {
                let a = &a[first * image..(first + count) * image];
                return match g {
                    None => max_2x2(a, this.w, planes),
                    Some(g) => {
                        max_2x2_grad(a, this.w, &g[first * pooled..][..count * pooled], planes)
                    }
                };
            }
            for (i, o) in planes.chunks_mut(out_plane).enumerate() {
                this.plane(first + i, a, g, &columns, o);
            }
        };
        if parallel {
            crate::team::for_each_chunk(out, out_plane * per_task, true, |t, planes| {
                task((t, planes))
            });
        } else {
            task((0, out));
        }
    }

    /// Whether the windows tile the input exactly: no padding, strides equal to the window,
    /// and no input left over.
    fn tiles(&self) -> bool {
        let Pool2dAttrs {
            window, strides, ..
        } = *self.attrs;
        let unpadded = self.attrs.padding == [(0, 0), (0, 0)];
        unpadded
            && window == strides
            && self.oh * window[0] == self.h
            && self.ow * window[1] == self.w
    }

    /// Plane `index` of the result: one pass over the pooled positions, each reading its
    /// window's clipped rows and columns. `a` and `g` are the operands' elements, `columns` each pooled column's input columns.
    fn plane(
        &self,
        index: usize,
        a: &[T],
        g: Option<&[T]>,
        columns: &[Range<usize>],
        out: &mut [T],
    ) {
        let (h, w, oh, ow) = (self.h, self.w, self.oh, self.ow);
        let area = T::from_f64(self.attrs.window_area());
        let windows = (0..oh).flat_map(|y| {
            let rows = self.attrs.input_range(0, y, h);
            (columns.iter()).map(move |cols| (rows.clone(), cols.clone()))
        });
        match self.kind {
            PoolKind::Max => {
                let plane = &a[index * h * w..][..h * w];
                for (at, (rows, cols)) in windows.enumerate() {
                    let mut m = T::neg_infinity();
                    for r in rows {
                        for &v in &plane[r * w..][cols.clone()] {
                            m = nan_max(m, v);
                        }
                    }
                    out[at] = m;
                }
            }
            PoolKind::Avg => {
                let plane = &a[index * h * w..][..h * w];
                for (at, (rows, cols)) in windows.enumerate() {
                    let mut sum = 0.0;
                    for r in rows {
                        sum += (plane[r * w..][cols.clone()].iter())
                            .map(|v| v.as_f64())
                            .sum::<f64>();
                    }
                    out[at] = T::from_f64(sum) / area;
                }
            }
            PoolKind::MaxGrad => {
                let plane = &a[index * h * w..][..h * w];
                let g = &g.expect("max_pool2d_grad has a gradient")[index * oh * ow..][..oh * ow];
                out.fill(T::zero());
                for ((rows, cols), &grad) in windows.zip(g) {
                    let taps = rows.flat_map(|r| cols.clone().map(move |c| r * w + c));
                    if let Some(i) = first_max(taps, plane) {
                        out[i] = out[i] + grad;
                    }
                }
            }
            PoolKind::AvgGrad { .. } => {
                let g = &a[index * oh * ow..][..oh * ow];
                out.fill(T::zero());
                for ((rows, cols), &grad) in windows.zip(g) {
                    let share = grad / area;
                    for r in rows {
                        for v in &mut out[r * w..][cols.clone()] {
                            *v = *v + share;
                        }
                    }
                }
            }
        }
    }
}

/// Max pooling of one plane (rows `w` long) by 2×2 windows that tile it: each pair of input
/// rows walked in steps of two, so the loop carries no index arithmetic or bounds checks.
fn max_2x2<T: FloatElem>(plane: &[T], w: usize, out: &mut [T]) {
    for (lines, out_row) in plane.chunks_exact(2 * w).zip(out.chunks_exact_mut(w / 2)) {
        let (top, bottom) = lines.split_at(w);
        let pairs = top.chunks_exact(2).zip(bottom.chunks_exact(2));
        for (m, (t, b)) in out_row.iter_mut().zip(pairs) {
            *m = nan_max(nan_max(t[0], t[1]), nan_max(b[0], b[1]));
        }
    }
}

/// The gradient of [`max_2x2`]: each window's gradient at its first largest element (or first
/// NaN), zeros elsewhere, every element written once.
fn max_2x2_grad<T: FloatElem>(plane: &[T], w: usize, g: &[T], out: &mut [T]) {
    let rows = plane.chunks_exact(2 * w).zip(out.chunks_exact_mut(2 * w));
    for ((lines, out_lines), g_row) in rows.zip(g.chunks_exact(w / 2)) {
        let (top, bottom) = lines.split_at(w);
        let (out_top, out_bottom) = out_lines.split_at_mut(w);
        let windows = (top.chunks_exact(2).zip(bottom.chunks_exact(2))).zip(
            out_top
                .chunks_exact_mut(2)
                .zip(out_bottom.chunks_exact_mut(2)),
        );
        for (((t, b), (ot, ob)), &grad) in windows.zip(g_row) {
            // Taps in row-major order; a tap wins when it is larger than the best so far or the
            // first NaN.
            let taps = [t[0], t[1], b[0], b[1]];
            let mut best = 0;
            for (i, &v) in taps.iter().enumerate().skip(1) {
                let current = taps[best];
                let take = !current.is_nan() && (v > current || v.is_nan());
                best = if take { i } else { best };
            }
            let at = |i: usize| if best == i { grad } else { T::zero() };
            (ot[0], ot[1], ob[0], ob[1]) = (at(0), at(1), at(2), at(3));
        }
    }
}
