//! Pooling for the executor: direct loops over each window's rows, with the bounds of the
//! window clipped once per output position (`Pool2dAttrs::input_range`) instead of per tap,
//! and the planes (sample × channel) split across threads. Max pooling paired with its
//! gradient (by the schedule) records each window's argmax, and the gradient writes from it
//! without reading the input again; the argmax is found without branches, which a CPU would
//! mispredict on every other window. The interpreter's kernels are the oracle these are
//! tested against (`runtime/tests/op_info.rs`, `tests/compiled.rs`).

use super::kept::Keeping;
use crate::Array;
use crate::interp::kernels::{FloatElem, nan_max};
use crate::interp::window::first_max;
use kiln_ir::{Pool2dAttrs, PoolKind};
use ndarray::{ArrayD, CowArray, IxDyn};
use std::ops::Range;
use std::sync::Mutex;

/// Runs a pooling op (or its gradient, by `kind`) on `args` into `out`, which has the
/// result's shape, one plane (sample and channel) per task, on the team's threads when `threads`
/// allows; max pooling records its argmax, or its gradient reads it, as `argmax` says. Float
/// arrays of one dtype (the schedule sends no others).
pub(crate) fn pool2d(
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    args: &[&Array],
    out: &mut Array,
    threads: bool,
    argmax: Keeping<Argmax>,
) {
    if attrs.channels_last {
        let call = (kind, attrs, threads, argmax);
        return match (args, out) {
            ([Array::F32(x)], Array::F32(out)) => channels_last(call, x, None, out),
            ([Array::F64(x)], Array::F64(out)) => channels_last(call, x, None, out),
            ([Array::F32(x), Array::F32(g)], Array::F32(out)) => {
                channels_last(call, x, Some(g), out)
            }
            ([Array::F64(x), Array::F64(g)], Array::F64(out)) => {
                channels_last(call, x, Some(g), out)
            }
            _ => unreachable!("the executor runs only float pooling natively"),
        };
    }
    match (args, out) {
        ([Array::F32(x)], Array::F32(out)) => {
            Planes::new(kind, attrs, x, None, threads).into(out, argmax)
        }
        ([Array::F64(x)], Array::F64(out)) => {
            Planes::new(kind, attrs, x, None, threads).into(out, argmax)
        }
        ([Array::F32(x), Array::F32(g)], Array::F32(out)) => {
            Planes::new(kind, attrs, x, Some(g), threads).into(out, argmax)
        }
        ([Array::F64(x), Array::F64(g)], Array::F64(out)) => {
            Planes::new(kind, attrs, x, Some(g), threads).into(out, argmax)
        }
        _ => unreachable!("the executor runs only float pooling natively"),
    }
}

/// Max pooling (or its gradient) of channels-last `x` (and `g`) into `out`
/// (`pool_nhwc.rs`).
fn channels_last<T: Tiled2x2 + Send + Sync>(
    (kind, attrs, threads, argmax): (PoolKind, &Pool2dAttrs, bool, Keeping<Argmax>),
    x: &ArrayD<T>,
    g: Option<&ArrayD<T>>,
    out: &mut ArrayD<T>,
) {
    let x = x.as_standard_layout();
    let g = g.map(|g| g.as_standard_layout());
    let pooled = g.as_ref().map_or(out.shape(), |g| g.shape());
    let call = super::pool_nhwc::ChannelsLast {
        attrs,
        input: x.shape().try_into().expect("NHWC"),
        pooled: [pooled[1], pooled[2]],
        threads,
    };
    let x = x.as_slice().expect("standard");
    let out = out.as_slice_mut().expect("executor buffers are contiguous");
    match (kind, argmax, &g) {
        (PoolKind::Max, Keeping::Fill(kept), _) => {
            kept.value.resize(out.len(), NO_TAP);
            kept.valid = true;
            call.max(x, out, &mut kept.value)
        }
        (PoolKind::Max, _, _) => call.max(x, out, &mut Vec::new()),
        (PoolKind::MaxGrad, argmax, Some(g)) => {
            let read = match argmax {
                Keeping::Read(kept) if kept.valid => Some(&kept.value[..]),
                _ => None,
            };
            call.max_grad(x, g.as_slice().expect("standard"), read, out)
        }
        _ => unreachable!("the schedule runs channels-last average pooling by the interpreter"),
    }
}

/// Where each window's largest element is, as its position among the window's (clipped) taps
/// in row-major order, kept by a max pooling for the gradient of the same input.
pub(crate) type Argmax = Vec<u8>;

/// The tap position that stands for "no tap" (a window wholly in the padding).
pub(super) const NO_TAP: u8 = u8::MAX;

/// Whether windows of `attrs` are small enough for their argmax to be kept.
pub(crate) fn argmax_fits(attrs: &Pool2dAttrs) -> bool {
    attrs.window[0].saturating_mul(attrs.window[1]) < usize::from(NO_TAP)
}

/// Whether the windows of `attrs` tile an input plane of `[h, w]` pooled to `[oh, ow]`
/// exactly: no padding, strides equal to the window, and no input left over.
pub(super) fn tiles(attrs: &Pool2dAttrs, [h, w]: [usize; 2], [oh, ow]: [usize; 2]) -> bool {
    let unpadded = attrs.padding == [(0, 0), (0, 0)];
    unpadded
        && attrs.window == attrs.strides
        && oh * attrs.window[0] == h
        && ow * attrs.window[1] == w
}

/// Below this many input elements, pooling stays on the calling thread; and the input
/// elements one task takes.
pub(super) const PARALLEL_ELEMENTS: usize = 1 << 14;

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

impl<'a, T: Tiled2x2 + Send + Sync> Planes<'a, T> {
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

    /// Computes into `out`, plane by plane, recording or reading the argmax as `argmax` says.
    fn into(mut self, out: &mut ArrayD<T>, argmax: Keeping<Argmax>) {
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
        let (image, pooled) = (self.h * self.w, self.oh * self.ow);
        let (recording, reading) = match (self.kind, argmax) {
            (PoolKind::Max, Keeping::Fill(kept)) => {
                kept.value.resize(out.len(), NO_TAP);
                kept.valid = true;
                (Some(&mut kept.value[..]), None)
            }
            (PoolKind::MaxGrad, Keeping::Read(kept)) if kept.valid => (None, Some(&kept.value[..])),
            _ => (None, None),
        };
        let a = self.a.as_slice().expect("standard");
        let g = (self.g.as_ref()).map(|g| g.as_slice().expect("standard"));
        let columns: Vec<_> = (0..self.ow)
            .map(|x| self.attrs.input_range(1, x, self.w))
            .collect();
        // Planes of small images are tiny: a task takes enough of them to outweigh its own
        // cost.
        let per_task = PARALLEL_ELEMENTS.div_ceil(image.max(1));
        let this = &self;
        // 2×2 windows that tile the planes tile a task's run of planes too (its rows pair up
        // within each plane): one call per task, not per plane.
        let tiled_2x2 = matches!(self.kind, PoolKind::Max | PoolKind::MaxGrad)
            && self.attrs.window == [2, 2]
            && self.tiles();
        let task = |t: usize, planes: &mut [T], record: &mut [u8]| {
            let (first, count) = (t * per_task, planes.len() / out_plane);
            let windows = first * pooled..(first + count) * pooled;
            let read = reading.map(|taps| &taps[windows.clone()]);
            if tiled_2x2 {
                let a = &a[first * image..(first + count) * image];
                return match (g, read) {
                    (None, _) if record.is_empty() => T::max_2x2(a, this.w, planes, None),
                    (None, _) => T::max_2x2(a, this.w, planes, Some(record)),
                    (Some(g), Some(taps)) => T::max_2x2_from(taps, this.w, &g[windows], planes),
                    (Some(g), None) => max_2x2_grad(a, this.w, &g[windows], planes),
                };
            }
            for (i, o) in planes.chunks_mut(out_plane).enumerate() {
                let own = i * pooled..(i + 1) * pooled;
                let taps = match (record.get_mut(own.clone()), read) {
                    (Some(record), _) => Taps::Record(record),
                    (None, Some(read)) => Taps::Read(&read[own]),
                    (None, None) => Taps::No,
                };
                this.plane(first + i, a, g, &columns, o, taps);
            }
        };
        // Each task's planes, and the argmax of its windows when it records them.
        let chunks: Vec<(&mut [T], &mut [u8])> = match recording {
            Some(taps) => (out.chunks_mut(out_plane * per_task))
                .zip(taps.chunks_mut(pooled * per_task))
                .collect(),
            None => (out.chunks_mut(out_plane * per_task))
                .map(|planes| (planes, &mut [][..]))
                .collect(),
        };
        if parallel {
            // Each chunk is taken by exactly one task; the lock is never contended.
            let chunks: Vec<_> = chunks.into_iter().map(Mutex::new).collect();
            crate::team::for_each(chunks.len(), |t| {
                if let Ok(mut chunk) = chunks[t].lock() {
                    let (planes, record) = &mut *chunk;
                    task(t, planes, record)
                }
            });
        } else {
            for (t, (planes, record)) in chunks.into_iter().enumerate() {
                task(t, planes, record)
            }
        }
    }

    /// Whether the windows tile the input plane exactly ([`tiles`]).
    fn tiles(&self) -> bool {
        tiles(self.attrs, [self.h, self.w], [self.oh, self.ow])
    }

    /// Plane `index` of the result: one pass over the pooled positions, each reading its
    /// window's clipped rows and columns. `a` and `g` are the operands' elements, `columns`
    /// each pooled column's input columns, `taps` this plane's argmax to record or read.
    fn plane(
        &self,
        index: usize,
        a: &[T],
        g: Option<&[T]>,
        columns: &[Range<usize>],
        out: &mut [T],
        taps: Taps,
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
                let window = |(rows, cols): (Range<usize>, Range<usize>)| {
                    rows.flat_map(move |r| plane[r * w..][cols.clone()].iter().copied())
                };
                if let Taps::Record(taps) = taps {
                    for ((m, k), taps) in out.iter_mut().zip(taps).zip(windows) {
                        (*m, *k) = first_max_of(window(taps));
                    }
                } else {
                    for (m, taps) in out.iter_mut().zip(windows) {
                        *m = window(taps).fold(T::neg_infinity(), nan_max);
                    }
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
                for (at, ((rows, cols), &grad)) in windows.zip(g).enumerate() {
                    let i = match taps {
                        Taps::Read(taps) if taps[at] == NO_TAP => None,
                        Taps::Read(taps) => {
                            let (k, width) = (usize::from(taps[at]), cols.len());
                            Some((rows.start + k / width) * w + cols.start + k % width)
                        }
                        _ => first_max(
                            rows.flat_map(|r| cols.clone().map(move |c| r * w + c)),
                            plane,
                        ),
                    };
                    if let Some(i) = i {
                        out[i] = out[i] + grad;
                    }
                }
            }
            PoolKind::AvgGrad { .. } if self.tiles() => {
                // Each element is in one window: its share written once, no window scans.
                let g = &a[index * oh * ow..][..oh * ow];
                let [kh, kw] = self.attrs.window;
                for (r, row) in out.chunks_exact_mut(w).enumerate() {
                    let shares = row.chunks_exact_mut(kw).zip(&g[r / kh * ow..][..ow]);
                    shares.for_each(|(taps, &grad)| taps.fill(grad / area));
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

/// One plane's argmax: recorded by max pooling, read by its gradient, or neither.
enum Taps<'a> {
    No,
    Record(&'a mut [u8]),
    Read(&'a [u8]),
}

/// The largest of `values` (the first NaN, if any, as max pooling's `nan_max` gives it) and
/// the position of the first that holds it, chosen by selects rather than branches; `(-∞,
/// NO_TAP)` for no values.
fn first_max_of<T: FloatElem>(values: impl IntoIterator<Item = T>) -> (T, u8) {
    let (mut best, mut at) = (T::neg_infinity(), NO_TAP);
    for (i, v) in values.into_iter().enumerate() {
        let take = takes_over(v, best, at);
        best = if take { v } else { best };
        at = if take { i as u8 } else { at };
    }
    (if best.is_nan() { T::nan() } else { best }, at)
}

/// Whether tap value `v` becomes a window's largest over `best`, held by tap `at` (`NO_TAP`:
/// none yet): it is larger, or the first NaN (`nan_max`'s largest), or the first tap.
pub(super) fn takes_over<T: FloatElem>(v: T, best: T, at: u8) -> bool {
    (at == NO_TAP) | (!best.is_nan() & ((v > best) | v.is_nan()))
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

/// The largest of four taps (as [`max_2x2`] gives it) and the first tap that holds it, from
/// the bits of the taps that do: no branches. A tap holds the largest when it equals it or is
/// NaN: without NaNs the second never holds, and with one no tap equals the NaN largest.
fn first_max_of_4<T: FloatElem>(taps: [T; 4]) -> (T, u8) {
    let m = nan_max(nan_max(taps[0], taps[1]), nan_max(taps[2], taps[3]));
    let holds = |i: usize| u8::from((taps[i] == m) | taps[i].is_nan()) << i;
    let bits = holds(0) | holds(1) | holds(2) | holds(3);
    (m, bits.trailing_zeros() as u8)
}

/// The element types pooling runs in, with their 2×2 max pooling over windows that tile the
/// planes and its gradient from the recorded argmax: f32's a block of sixteen windows at a
/// time in AVX-512 registers where the CPU has them (`pool_avx512.rs`), the rest by the
/// scalar loops here.
pub(crate) trait Tiled2x2: FloatElem {
    /// [`max_2x2`], recording each window's argmax in `taps` when given.
    fn max_2x2(x: &[Self], w: usize, out: &mut [Self], taps: Option<&mut [u8]>) {
        match taps {
            Some(taps) => max_2x2_recording(x, w, out, taps),
            None => max_2x2(x, w, out),
        }
    }

    /// [`max_2x2_from`].
    fn max_2x2_from(taps: &[u8], w: usize, g: &[Self], out: &mut [Self]) {
        max_2x2_from(taps, w, g, out)
    }

    /// 2×2 max pooling of channels-last `x` (`[H, W, C]` with `[W, C]` = `wc`, H and W even)
    /// into `out`, recording each window's argmax for each channel in `taps` when given, if
    /// this type has a loop for it on this CPU: whether it ran (else the caller's general loop
    /// runs).
    fn max_2x2_channels_last(
        _: &[Self],
        _: [usize; 2],
        _: &mut [Self],
        _: Option<&mut [u8]>,
    ) -> bool {
        false
    }

    /// The gradient of [`Tiled2x2::max_2x2_channels_last`] from its recorded `taps` into all
    /// of `out`, if this type has a loop for it on this CPU: whether it ran.
    fn max_2x2_channels_last_from(_: &[u8], _: [usize; 2], _: &[Self], _: &mut [Self]) -> bool {
        false
    }
}

impl Tiled2x2 for f64 {}

impl Tiled2x2 for f32 {
    fn max_2x2(x: &[f32], w: usize, out: &mut [f32], mut taps: Option<&mut [u8]>) {
        let done = match super::pool_avx512::suits(w) {
            true => super::pool_avx512::max_2x2(x, w, out, taps.as_deref_mut()),
            false => 0,
        };
        let (x, out) = (&x[4 * done..], &mut out[done..]);
        match taps {
            Some(taps) => max_2x2_recording(x, w, out, &mut taps[done..]),
            None => max_2x2(x, w, out),
        }
    }

    fn max_2x2_from(taps: &[u8], w: usize, g: &[f32], out: &mut [f32]) {
        let done = match super::pool_avx512::suits(w) {
            true => super::pool_avx512::max_2x2_from(taps, w, g, out),
            false => 0,
        };
        max_2x2_from(&taps[done..], w, &g[done..], &mut out[4 * done..])
    }

    fn max_2x2_channels_last(
        x: &[f32],
        wc: [usize; 2],
        out: &mut [f32],
        taps: Option<&mut [u8]>,
    ) -> bool {
        let suits = super::pool_avx512::suits_channels_last();
        if suits {
            super::pool_avx512::max_2x2_channels_last(x, wc, out, taps);
        }
        suits
    }

    fn max_2x2_channels_last_from(taps: &[u8], wc: [usize; 2], g: &[f32], out: &mut [f32]) -> bool {
        let suits = super::pool_avx512::suits_channels_last();
        if suits {
            super::pool_avx512::max_2x2_channels_last_from(taps, wc, g, out);
        }
        suits
    }
}

/// [`max_2x2`] that records each window's argmax in `taps`.
fn max_2x2_recording<T: FloatElem>(plane: &[T], w: usize, out: &mut [T], taps: &mut [u8]) {
    let rows = (plane.chunks_exact(2 * w).zip(out.chunks_exact_mut(w / 2)))
        .zip(taps.chunks_exact_mut(w / 2));
    for ((lines, out_row), tap_row) in rows {
        let (top, bottom) = lines.split_at(w);
        let pairs = top.chunks_exact(2).zip(bottom.chunks_exact(2));
        for ((m, k), (t, b)) in out_row.iter_mut().zip(tap_row).zip(pairs) {
            (*m, *k) = first_max_of_4([t[0], t[1], b[0], b[1]]);
        }
    }
}

/// The gradient of [`max_2x2`]: each window's gradient at its first largest element (or first
/// NaN), found again in `plane`; zeros elsewhere.
fn max_2x2_grad<T: FloatElem>(plane: &[T], w: usize, g: &[T], out: &mut [T]) {
    scatter_2x2(w, g, out, |y, x| {
        let (top, bottom) = plane[2 * y * w..][..2 * w].split_at(w);
        let (t, b) = (&top[2 * x..][..2], &bottom[2 * x..][..2]);
        first_max_of_4([t[0], t[1], b[0], b[1]]).1
    })
}

/// The gradient of [`max_2x2`] from the argmax [`max_2x2_recording`] kept.
fn max_2x2_from<T: FloatElem>(taps: &[u8], w: usize, g: &[T], out: &mut [T]) {
    scatter_2x2(w, g, out, |y, x| taps[y * (w / 2) + x])
}

/// Writes each 2×2 window of `out` (rows `w` long): the window's gradient at tap `tap(y, x)`
/// of window `(y, x)`, zeros elsewhere. Zeros first, then one store per window at a computed
/// address: a select per tap compiles to branches, which the CPU mispredicts as often as the
/// data changes.
fn scatter_2x2<T: FloatElem>(w: usize, g: &[T], out: &mut [T], tap: impl Fn(usize, usize) -> u8) {
    out.fill(T::zero());
    let rows = out.chunks_exact_mut(2 * w).zip(g.chunks_exact(w / 2));
    for (y, (out_lines, g_row)) in rows.enumerate() {
        for (x, &grad) in g_row.iter().enumerate() {
            let k = usize::from(tap(y, x));
            out_lines[(k >> 1 & 1) * w + 2 * x + (k & 1)] = grad;
        }
    }
}
