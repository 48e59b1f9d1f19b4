//! Convolutions for the executor: im2col and gemm, channels last.
//!
//! Each chunk of samples and channel group becomes one matrix product. The chunk's input is
//! first laid out channels last (`[n, h, w, c/g]`), so that its **patch matrix** — one row per
//! output position, one column per weight (`(kh, kw, c)`, channel fastest) — is built by copying
//! runs of `C/g` contiguous channels rather than single elements. Then, with `W'` the weights
//! in the same `(kh, kw, c)` order:
//! - the convolution is `patches · W'ᵀ` (`[positions, O/g]`), moved back to NCHW;
//! - its input gradient is `g · W'` (`[positions, K]`), each row added back to the input
//!   elements it came from (col2im);
//! - its filter gradient is `gᵀ · patches` (`[O/g, K]`), summed over the chunks.
//!
//! A chunk is as many samples as make a patch matrix and product of about [`CHUNK_BYTES`], so
//! that the chunk's channels-last image, patch matrix and product rows stay in a core's L2
//! cache from the step that writes them to the step that reads them. When there are enough
//! chunks, each runs whole on one thread (its gemm single-threaded; a filter gradient's chunks
//! summed per thread); otherwise each step of a chunk splits over the threads. The
//! interpreter's direct loops are the oracle these are tested against
//! (`runtime/tests/op_info.rs`, and the chunking test below).

use super::depthwise;
use super::matmul::{PARALLEL_FLOPS, Product, Scale};
use crate::Array;
use crate::interp::kernels::transpose_matrix;
use crate::interp::window::ConvDims;
use crate::team::for_each_chunk;
use kiln_ir::{Conv2dAttrs, ConvKind};
use ndarray::ArrayD;
use num_traits::{One, Zero};
use std::borrow::Cow;
use std::cell::RefCell;

thread_local! {
    static SCRATCH_F32: RefCell<Scratch<f32>> = RefCell::new(Scratch::default());
    static SCRATCH_F64: RefCell<Scratch<f64>> = RefCell::new(Scratch::default());
}

/// Buffers kept between calls: the channels-last input (or input gradient), the patch matrix,
/// and the output (or output gradient) as `[positions, O/g]`.
struct Scratch<T> {
    image: Vec<T>,
    patches: Vec<T>,
    rows: Vec<T>,
}

impl<T> Default for Scratch<T> {
    fn default() -> Self {
        Scratch {
            image: Vec::new(),
            patches: Vec::new(),
            rows: Vec::new(),
        }
    }
}

/// The bytes of scratch space one call of `conv2d` (or a transpose) takes beyond its operands
/// and output — the offsets table; for each thread running chunks, one chunk's channels-last
/// image, patch matrix and product rows; the weights in patch order; the filter gradient's
/// partial sums per thread — and the shape of one chunk's patch matrix, for shapes
/// `[a, b, out]` as the executor passes them; or why the call cannot run here at all. This is
/// checked against the memory limit before anything is allocated.
pub(crate) fn scratch(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    shapes: [&[usize]; 3],
    elem_bytes: usize,
) -> Result<(u128, [u128; 2]), String> {
    let d = dims(kind, attrs.groups, attrs.channels_last, shapes)?;
    if depthwise::suits(kind, attrs, &d) {
        return Ok((0, [0, 0])); // computed in place, with no patch matrix
    }
    if d.image() >= PADDING as usize {
        return Err(format!(
            "one sample's channel group has {} elements, more than the compiled \
             convolution's 32-bit offsets reach (run it with the interpreter)",
            d.image()
        ));
    }
    let n = |v: usize| v as u128;
    let (k, p, width) = (n(d.k()), n(d.p()), n(crate::team::width()));
    let budget = CHUNK_BYTES / elem_bytes.max(1);
    let (per_chunk, across) = chunking(&d, budget, true);
    // As `typed` runs it: a run of positions of one sample, or a chunk of whole samples.
    let (rows, samples) = match positions_per_run(kind, &d, budget) {
        Some(positions) => (n(positions), 1),
        None => (n(per_chunk) * p, n(per_chunk)),
    };
    let per_thread = rows * (k + n(d.og())) + samples * n(d.image());
    let chunk_threads = if across { width } else { 1 };
    let elements = chunk_threads * per_thread + n(d.o) * k * (1 + width);
    let bytes = elements.saturating_mul(n(elem_bytes)) + 4 * p * n(d.taps());
    Ok((bytes, [rows, k]))
}

/// Called with each run of samples a convolution (or its input gradient) has finished
/// writing and the address of the first of them in the output: the executor runs the kernel
/// that alone reads the output on those samples while they are still in cache (an epilogue:
/// a bias and an activation, say). Filter gradients do not call it.
pub(crate) type Written<'a> = &'a (dyn Fn(std::ops::Range<usize>, *mut u8) + Sync);

/// Runs `conv2d` (or a transpose, by `kind`) of `a` and `b` into `out`, which has the
/// result's shape, calling `written` on each run of samples written. Float arrays of one
/// dtype (the schedule sends no others).
pub(crate) fn conv2d(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    [a, b]: [&Array; 2],
    packed: Option<&Array>,
    out: &mut Array,
    threads: bool,
    written: Option<Written>,
) {
    match (a, b, out) {
        (Array::F32(a), Array::F32(b), Array::F32(out)) => typed(
            (kind, attrs, [a, b], threads, CHUNK_BYTES / 4),
            packed.and_then(f32::slice_of),
            out,
            written,
        ),
        (Array::F64(a), Array::F64(b), Array::F64(out)) => typed(
            (kind, attrs, [a, b], threads, CHUNK_BYTES / 8),
            packed.and_then(f64::slice_of),
            out,
            written,
        ),
        _ => unreachable!("the executor runs only float convolutions through gemm"),
    }
}

/// The weights `w` of a convolution (or its input gradient) with operand and result shapes
/// `shapes`, in the patch order its products read, when the call takes that path and the
/// order is not `w`'s own (more than one channel and one tap a group); else `None`. The
/// executor packs a model's weights once this way and passes them to each later call as
/// `conv2d`'s `packed`: reordering them on every call took 12 % of ResNet-18's time at batch
/// 1, on one thread while the other waited.
pub(crate) fn packed_weights(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    shapes: [&[usize]; 3],
    w: &Array,
) -> Option<Array> {
    let d = dims(kind, attrs.groups, attrs.channels_last, shapes).ok()?;
    let im2col = !depthwise::suits(kind, attrs, &d) && !is_pointwise(&d, attrs);
    if matches!(kind, ConvKind::FilterGrad { .. }) || !im2col || d.cg() == 1 || d.taps() == 1 {
        return None;
    }
    let mut packed = w.clone();
    match &mut packed {
        Array::F32(p) => p
            .as_slice_mut()?
            .copy_from_slice(&patch_order(&d, f32::slice_of(w)?)),
        Array::F64(p) => p
            .as_slice_mut()?
            .copy_from_slice(&patch_order(&d, f64::slice_of(w)?)),
        _ => return None,
    }
    Some(packed)
}

/// The element types convolutions run in, each with its thread's scratch buffers.
trait Elem: num_traits::Float + std::ops::AddAssign + Send + Sync + 'static {
    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<Self>) -> R) -> R;
    /// The elements of `array` when it holds this type, in memory order.
    fn slice_of(array: &Array) -> Option<&[Self]>;
}

impl Elem for f32 {
    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<f32>) -> R) -> R {
        SCRATCH_F32.with_borrow_mut(f)
    }
    fn slice_of(array: &Array) -> Option<&[f32]> {
        match array {
            Array::F32(a) => a.as_slice(),
            _ => None,
        }
    }
}

impl Elem for f64 {
    fn with_scratch<R>(f: impl FnOnce(&mut Scratch<f64>) -> R) -> R {
        SCRATCH_F64.with_borrow_mut(f)
    }
    fn slice_of(array: &Array) -> Option<&[f64]> {
        match array {
            Array::F64(a) => a.as_slice(),
            _ => None,
        }
    }
}

/// A run of `count` whole samples and one channel group: the unit a patch matrix
/// (`[count·P, K]`, row `sample·P + position`) is built for. The slices a chunk's steps are
/// given hold its samples only.
#[derive(Clone, Copy)]
struct Chunk {
    count: usize,
    group: usize,
}

/// What a convolution computes: its kind, geometry, operands, whether it may use threads, and
/// about how many elements a chunk's patch matrix and product may take (but one sample's at least).
type Call<'a, T> = (ConvKind, &'a Conv2dAttrs, [&'a ArrayD<T>; 2], bool, usize);

/// The bytes a chunk's patch matrix and product aim at: with the chunk's image they stay in a
/// core's L2 cache from the step that writes them to the step that reads them (a whole
/// batch's matrix — 4.7 MB for the digits CNN's second layer — went to memory and back). The
/// product counts: a first layer's (`K = 9`, 32 channels) is 3.5 times its patch matrix, and
/// counting it took that convolution's forward pass from 542 and 526 to 489 and 481 µs
/// (profiled, two runs each).
const CHUNK_BYTES: usize = 256 << 10;

/// Samples per chunk for a `budget` (elements) of patch matrix and product, and whether the
/// chunks run in parallel (each on one thread, its steps single-threaded) rather than one after
/// another (each step split over the threads). Chunks in parallel come in a multiple of the
/// threads.
fn chunking(d: &ConvDims, budget: usize, threads: bool) -> (usize, bool) {
    let width = crate::team::width();
    let per_sample = ((d.k() + d.og()) * d.p()).max(1);
    let chunks = (d.n * per_sample)
        .div_ceil(budget.max(1))
        .clamp(1, d.n.max(1));
    let flops = d.n * d.k() * d.p() * d.og();
    if !threads || width <= 1 || chunks < 2 || flops < PARALLEL_FLOPS {
        return (d.n.div_ceil(chunks), false);
    }
    let chunks = chunks.next_multiple_of(width).min(d.n);
    (d.n.div_ceil(chunks), true)
}

/// The sizes of a convolution of `kind` with operand and result shapes `[a, b, out]`, its
/// activations laid out channels last when `channels_last`.
fn dims(
    kind: ConvKind,
    groups: usize,
    channels_last: bool,
    [a, b, out]: [&[usize]; 3],
) -> Result<ConvDims, String> {
    let (x, w, y) = match kind {
        ConvKind::Forward => (a, b, out),
        ConvKind::InputGrad { .. } => (out, b, a),
        ConvKind::FilterGrad { .. } => (a, out, b),
    };
    let nchw = |s: &[usize]| match s {
        [n, h, w, c] if channels_last => vec![*n, *c, *h, *w],
        _ => s.to_vec(),
    };
    ConvDims::of(&nchw(x), w, &nchw(y), groups).map_err(|e| e.0)
}

/// The convolution of `call` into `out`, `written` called on each run of samples.
/// `packed`: the weights in patch order, when [`packed_weights`] made them.
fn typed<T: Elem>(
    call: Call<'_, T>,
    packed: Option<&[T]>,
    out: &mut ArrayD<T>,
    written: Option<Written>,
) {
    let (kind, attrs, [a, b], threads, budget) = call;
    let shapes = [a.shape(), b.shape(), out.shape()];
    let d = dims(kind, attrs.groups, attrs.channels_last, shapes)
        .expect("the verifier checked the shapes");
    let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
    let (a, b) = (
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
    );
    let out = out.as_slice_mut().expect("executor buffers are contiguous");
    if [d.n, d.k(), d.p(), d.h * d.w].contains(&0) {
        // No sample, no weight, no output position or no input element: every sum is empty.
        out.fill(T::zero());
        if !matches!(kind, ConvKind::FilterGrad { .. }) {
            after(written, 0..d.n, out);
        }
        return;
    }
    if depthwise::suits(kind, attrs, &d) {
        let threads = threads && d.n * d.o * d.p() * d.taps() >= PARALLEL_FLOPS;
        return depthwise::forward(&d, attrs, [a, b], out, threads, written);
    }
    let (per_chunk, across) = chunking(&d, budget, threads);
    let threads = threads && !across;
    if is_pointwise(&d, attrs) && attrs.channels_last {
        let gemm = Gemm::split(threads || across, d.n * d.p() * d.c * d.o);
        Pointwise::channels_last(&d, gemm, kind, [a, b], out);
        return after(written, 0..d.n, out);
    }
    if is_pointwise(&d, attrs) {
        return Pointwise { d, threads }.run(kind, across, [a, b], out, written);
    }
    let run = Run::new(d, attrs, threads);
    let in_patch_order = || packed.map_or_else(|| Cow::Owned(patch_order(&d, b)), Cow::Borrowed);
    match (kind, positions_per_run(kind, &d, budget)) {
        (ConvKind::Forward, Some(positions)) => {
            run.forward_by_positions(positions, across, [a, &in_patch_order()], out, written)
        }
        (ConvKind::FilterGrad { .. }, Some(positions)) => {
            run.filter_grad_by_positions(positions, across, [a, b], out)
        }
        (ConvKind::FilterGrad { .. }, None) => {
            run.filter_grad_in_chunks(per_chunk, across, [a, b], out)
        }
        _ => run.in_chunks(
            kind,
            per_chunk,
            across,
            [a, &in_patch_order()],
            out,
            written,
        ),
    }
}

/// Tells `written` (if any) that `samples` are written, `out` holding them.
fn after<T>(written: Option<Written>, samples: std::ops::Range<usize>, out: &mut [T]) {
    if let Some(written) = written {
        written(samples, out.as_mut_ptr().cast());
    }
}

/// For a sample whose patch matrix alone is larger than a chunk's `budget` (elements): how
/// many output positions the convolution and its filter gradient take at a time (at least
/// 16). The input gradient, whose patches add into overlapping windows, takes whole samples.
///
/// Each run reads all of a group's weights (or sums into all of its filter gradient): a
/// sample with fewer positions than output channels, whose weights outweigh its patch matrix,
/// is not split (ResNet-18's 3×3 layers of 512 channels on 7×7 images read their 9.4 MB of
/// weights four times, 16 positions at a time).
fn positions_per_run(kind: ConvKind, d: &ConvDims, budget: usize) -> Option<usize> {
    let positions = (budget / d.k().max(1)).max(16);
    let split = positions < d.p() && d.og() <= d.p() && !matches!(kind, ConvKind::InputGrad { .. });
    split.then_some(positions)
}

/// Whether each output element reads one input position (1×1 windows, stride 1, no
/// padding): the convolution is then a matrix product per sample and group of its NCHW planes
/// as they are (`[C/g, H·W]`), with no layout passes and no patch matrix. Most of a ResNet's
/// convolutions are.
fn is_pointwise(d: &ConvDims, attrs: &Conv2dAttrs) -> bool {
    attrs.is_pointwise([d.kh, d.kw]) && (d.oh, d.ow) == (d.h, d.w)
}

/// A pointwise convolution (or a transpose): one gemm per sample and group, samples in
/// parallel when there are enough of them, else each gemm split over the threads.
struct Pointwise {
    d: ConvDims,
    /// Whether each product may split over the team's threads.
    threads: bool,
}

impl Pointwise {
    /// A pointwise convolution (or a transpose) of channels-last activations: one product
    /// over every sample's positions, `[N·P, C]` against the weights `[O, C]`.
    fn channels_last<T: Elem>(
        d: &ConvDims,
        gemm: Gemm,
        kind: ConvKind,
        [a, b]: [&[T]; 2],
        out: &mut [T],
    ) {
        let (rows, c, o) = (d.n * d.p(), d.c, d.o);
        match kind {
            // y = x · Wᵀ: [N·P, O] = [N·P, C] · [C, O].
            ConvKind::Forward => gemm.run(out, false, [rows, o, c], (a, 1, c), (b, c, 1)),
            // dx = dy · W: [N·P, C] = [N·P, O] · [O, C].
            ConvKind::InputGrad { .. } => gemm.run(out, false, [rows, c, o], (a, 1, o), (b, 1, c)),
            // dW = dyᵀ · x: [O, C] = [O, N·P] · [N·P, C].
            ConvKind::FilterGrad { .. } => gemm.run(out, false, [o, c, rows], (b, o, 1), (a, 1, c)),
        }
    }

    fn run<T: Elem>(
        &self,
        kind: ConvKind,
        across: bool,
        [a, b]: [&[T]; 2],
        out: &mut [T],
        written: Option<Written>,
    ) {
        let d = &self.d;
        let (cg, og, p) = (d.cg(), d.og(), d.p());
        let (x_sample, y_sample) = (d.c * p, d.o * p);
        let gemm = Gemm::split(self.threads, og * cg * p);
        match kind {
            // y_n,g = W_g · x_n,g: [O/g, P] = [O/g, C/g] · [C/g, P].
            ConvKind::Forward => for_each_chunk(out, y_sample, across, |n, y| {
                for g in 0..d.groups {
                    let (x, w) = (&a[n * x_sample + g * cg * p..], &b[g * og * cg..]);
                    let y = &mut y[g * og * p..][..og * p];
                    gemm.run(y, false, [og, p, cg], (w, 1, cg), (x, 1, p));
                }
                after(written, n..n + 1, y)
            }),
            // dx_n,g = W_gᵀ · dy_n,g: [C/g, P] = [C/g, O/g] · [O/g, P].
            ConvKind::InputGrad { .. } => for_each_chunk(out, x_sample, across, |n, dx| {
                for g in 0..d.groups {
                    let (dy, w) = (&a[n * y_sample + g * og * p..], &b[g * og * cg..]);
                    let dx = &mut dx[g * cg * p..][..cg * p];
                    gemm.run(dx, false, [cg, p, og], (w, cg, 1), (dy, 1, p));
                }
                after(written, n..n + 1, dx)
            }),
            // dW_g = Σ_n dy_n,g · x_n,gᵀ: [O/g, C/g] = [O/g, P] · [P, C/g], [`summed`] over the
            // samples.
            ConvKind::FilterGrad { .. } => {
                let dw = summed(d.n, out.len(), across, |samples, dw| {
                    for n in samples {
                        for g in 0..d.groups {
                            let x = &a[n * x_sample + g * cg * p..];
                            let dy = &b[n * y_sample + g * og * p..];
                            let dw = &mut dw[g * og * cg..][..og * cg];
                            gemm.run(dw, true, [og, cg, p], (dy, 1, p), (x, p, 1));
                        }
                    }
                });
                out.copy_from_slice(&dw);
            }
        }
    }
}

/// One convolution call's sizes and settings.
struct Run {
    d: ConvDims,
    /// Whether a chunk's steps split their work over the team's threads.
    threads: bool,
    /// Whether the activations are laid out channels last (one group): the image is the
    /// input itself, the product's rows are the output's, and no layout pass runs.
    channels_last: bool,
    /// For each output position and kernel tap, where the tap's channels start in a sample's
    /// channels-last image (`PADDING` where it reads padding): the window geometry worked out
    /// once per call, not per sample.
    offsets: Vec<u32>,
}

/// The offset of a tap that reads padding.
const PADDING: u32 = u32::MAX;

impl Run {
    fn new(d: ConvDims, attrs: &Conv2dAttrs, threads: bool) -> Run {
        let mut offsets = Vec::with_capacity(d.p() * d.taps());
        for oh in 0..d.oh {
            for ow in 0..d.ow {
                for kh in 0..d.kh {
                    let ih = attrs.input_index(0, oh, kh, d.h);
                    for kw in 0..d.kw {
                        let iw = attrs.input_index(1, ow, kw, d.w);
                        offsets.push(match (ih, iw) {
                            (Some(ih), Some(iw)) => ((ih * d.w + iw) * d.cg()) as u32,
                            _ => PADDING,
                        });
                    }
                }
            }
        }
        Run {
            d,
            threads,
            channels_last: attrs.channels_last,
            offsets,
        }
    }

    fn gemm(&self, flops: usize) -> Gemm {
        Gemm::split(self.threads, flops)
    }

    /// The elements of `v` that belong to `samples`, `v` holding `per_sample` a sample.
    fn samples<T>(v: &[T], samples: std::ops::Range<usize>, per_sample: usize) -> &[T] {
        &v[samples.start * per_sample..samples.end * per_sample]
    }

    /// The convolution or its input gradient, chunk by chunk of `per_chunk` samples (in
    /// parallel when `across`), group by group; the weights in patch order.
    fn in_chunks<T: Elem>(
        &self,
        kind: ConvKind,
        per_chunk: usize,
        across: bool,
        [a, weights]: [&[T]; 2],
        out: &mut [T],
        written: Option<Written>,
    ) {
        let d = &self.d;
        let (in_sample, out_sample) = match kind {
            ConvKind::Forward => (d.c * d.h * d.w, d.o * d.p()),
            _ => (d.o * d.p(), d.c * d.h * d.w),
        };
        for_each_chunk(out, per_chunk * out_sample, across, |i, out| {
            let n0 = i * per_chunk;
            let count = out.len() / out_sample;
            let a = Self::samples(a, n0..n0 + count, in_sample);
            T::with_scratch(|s| {
                for group in 0..d.groups {
                    let c = Chunk { count, group };
                    if kind != ConvKind::Forward {
                        self.input_grad(c, a, weights, out, s);
                    } else {
                        let Scratch {
                            image,
                            patches,
                            rows,
                        } = &mut *s;
                        let patches = self.patch_matrix(c, a, image, patches);
                        self.forward(c, patches, weights, out, rows);
                    }
                }
            });
            after(written, n0..n0 + count, out)
        });
    }

    /// The filter gradient, chunk by chunk of `per_chunk` samples, [`summed`] over the chunks
    /// (in parallel when `across`): a run of chunks per thread rather than every other chunk,
    /// so the sums go in the samples' order (with every other chunk, the loss W9 prints after
    /// 110 steps moved in its sixth digit).
    fn filter_grad_in_chunks<T: Elem>(
        &self,
        per_chunk: usize,
        across: bool,
        [x, g]: [&[T]; 2],
        out: &mut [T],
    ) {
        let d = &self.d;
        let chunks = d.n.div_ceil(per_chunk);
        let dw = summed(chunks, d.o * d.k(), across, |run, dw| {
            T::with_scratch(|s| {
                for n0 in run.map(|chunk| chunk * per_chunk) {
                    let samples = n0..(n0 + per_chunk).min(d.n);
                    let x = Self::samples(x, samples.clone(), d.c * d.h * d.w);
                    let g = Self::samples(g, samples.clone(), d.o * d.p());
                    for group in 0..d.groups {
                        let c = Chunk {
                            count: samples.len(),
                            group,
                        };
                        let Scratch {
                            image,
                            patches,
                            rows,
                        } = &mut *s;
                        let patches = self.patch_matrix(c, x, image, patches);
                        self.filter_grad(c, patches, g, dw, rows);
                    }
                }
            })
        });
        self.weights_from_patch_order(&dw, out);
    }

    /// The convolution of samples whose patch matrices are each larger than a chunk's: each
    /// sample (on one thread when `across`) a run of `positions` output positions at a time,
    /// whose patch matrix and product stay in cache; gemm writes `W'_g · patchesᵀ`, each output
    /// channel's run of positions a row, copied into its plane. The weights in patch order.
    ///
    /// A sample at a time (not `across`: batch 1) splits its runs over the threads, each run's
    /// patches and product on one: with each product split instead, one thread built every
    /// patch matrix while the other waited (15 % of ResNet-18's time at batch 1).
    fn forward_by_positions<T: Elem>(
        &self,
        positions: usize,
        across: bool,
        [x, weights]: [&[T]; 2],
        y: &mut [T],
        written: Option<Written>,
    ) {
        let d = &self.d;
        let (k, og, p, taps) = (d.k(), d.og(), d.p(), d.taps());
        let runs = p.div_ceil(positions);
        let runs_in_parallel = !across && self.threads && crate::team::width() > 1 && runs > 1;
        for_each_chunk(y, d.o * p, across, |n, y| {
            let x = Self::samples(x, n..n + 1, d.c * d.h * d.w);
            let out = Disjoint::new(y);
            for group in 0..d.groups {
                let mut image = T::with_scratch(|s| std::mem::take(&mut s.image));
                let im = self.channels_last(Chunk { count: 1, group }, x, &mut image);
                let w = &weights[group * og * k..];
                let run = |r: usize| {
                    T::with_scratch(|s| {
                        let (p0, len) = (r * positions, positions.min(p - r * positions));
                        let patches = prefix(&mut s.patches, len * k);
                        windows(
                            d.cg(),
                            im,
                            &self.offsets[p0 * taps..][..len * taps],
                            patches,
                        );
                        let gemm = Gemm::split(self.threads && !runs_in_parallel, og * len * k);
                        // A run's few positions as gemm's columns, not its rows: as rows, gemm
                        // packs all the weights again for each run (VGG-19's 28×28×512
                        // layers took 144 ms each in a first-run profile; the network 940 ms,
                        // 398–444 ms with this order).
                        let product = prefix(&mut s.rows, og * len);
                        gemm.run(product, false, [og, len, k], (w, 1, k), (patches, k, 1));
                        if self.channels_last {
                            // SAFETY: a run writes its own positions of the sample only.
                            let y = unsafe { out.part(p0 * og, len * og) };
                            return transpose_matrix(product, [og, len], y);
                        }
                        for (o, row) in product.chunks_exact(len).enumerate() {
                            // SAFETY: as above, in each channel's plane.
                            let y = unsafe { out.part((group * og + o) * p + p0, len) };
                            y.copy_from_slice(row);
                        }
                    })
                };
                match runs_in_parallel {
                    true => crate::team::for_each(runs, run),
                    false => (0..runs).for_each(run),
                }
                T::with_scratch(|s| s.image = image);
            }
            after(written, n..n + 1, y)
        });
    }

    /// The filter gradient of samples whose patch matrices are each larger than a chunk's:
    /// `dW'_g += dy_g · patches` a run of `positions` output positions at a time, reading
    /// `dy`'s planes in place; [`summed`] over the samples.
    fn filter_grad_by_positions<T: Elem>(
        &self,
        positions: usize,
        across: bool,
        [x, g]: [&[T]; 2],
        out: &mut [T],
    ) {
        let d = &self.d;
        let (k, og, p) = (d.k(), d.og(), d.p());
        let dw = summed(d.n, d.o * k, across, |samples, dw| {
            T::with_scratch(|s| {
                for n in samples {
                    let x = Self::samples(x, n..n + 1, d.c * d.h * d.w);
                    for group in 0..d.groups {
                        let Scratch { image, patches, .. } = &mut *s;
                        let image = self.channels_last(Chunk { count: 1, group }, x, image);
                        let dw = &mut dw[group * og * k..][..og * k];
                        self.position_runs(image, positions, patches, |p0, patches| {
                            let len = patches.len() / k;
                            let dy = match self.channels_last {
                                true => (&g[(n * p + p0) * d.o..], d.o, 1),
                                false => (&g[(n * d.o + group * og) * p + p0..], 1, p),
                            };
                            let gemm = self.gemm(og * len * k);
                            gemm.run(dw, true, [og, k, len], dy, (patches, 1, k));
                        });
                    }
                }
            })
        });
        self.weights_from_patch_order(&dw, out);
    }

    /// Calls `each(p0, patches)` for each run of `positions` output positions (from `p0`) of one
    /// sample's channels-last `image`, with the run's patch matrix built in `patches`.
    fn position_runs<T: Elem>(
        &self,
        image: &[T],
        positions: usize,
        patches: &mut Vec<T>,
        mut each: impl FnMut(usize, &[T]),
    ) {
        let (k, p, taps) = (self.d.k(), self.d.p(), self.d.taps());
        for p0 in (0..p).step_by(positions) {
            let len = positions.min(p - p0);
            let patches = prefix(patches, len * k);
            windows(
                self.d.cg(),
                image,
                &self.offsets[p0 * taps..][..len * taps],
                patches,
            );
            each(p0, patches);
        }
    }

    /// The product of the patches and the weights, then moved to NCHW (`scratch`). A short
    /// contraction (a first layer's `K = 9`) makes the product cheap and the move the cost:
    /// it writes `W'_g · patchesᵀ`, each output channel's planes in a row, moved by whole
    /// planes. Otherwise gemm is faster writing `patches · W'_gᵀ`, a row per position, which
    /// is moved element by element.
    fn forward<T: Elem>(
        &self,
        c: Chunk,
        patches: &[T],
        w: &[T],
        y: &mut [T],
        scratch: &mut Vec<T>,
    ) {
        let (k, og, positions) = (self.d.k(), self.d.og(), c.count * self.d.p());
        let (gemm, w) = (self.gemm(og * k * positions), &w[c.group * og * k..]);
        if self.channels_last {
            let y = &mut y[..positions * og];
            return gemm.run(y, false, [positions, og, k], (patches, 1, k), (w, k, 1));
        }
        let product = prefix(scratch, positions * og);
        if k <= og {
            gemm.run(
                product,
                false,
                [og, positions, k],
                (w, 1, k),
                (patches, k, 1),
            );
            self.channels_to_nchw(c, product, y);
        } else {
            gemm.run(
                product,
                false,
                [positions, og, k],
                (patches, 1, k),
                (w, k, 1),
            );
            self.rows_to_nchw(c, product, y);
        }
    }

    /// `patches = g · W'_g`, then each patch added back to the input elements it came from.
    fn input_grad<T: Elem>(&self, c: Chunk, g: &[T], w: &[T], dx: &mut [T], s: &mut Scratch<T>) {
        let (k, og, positions) = (self.d.k(), self.d.og(), c.count * self.d.p());
        let rows = match self.channels_last {
            true => &g[..positions * og],
            false => {
                let rows = prefix(&mut s.rows, positions * og);
                self.nchw_to_rows(c, g, rows);
                rows
            }
        };
        let patches = prefix(&mut s.patches, positions * k);
        self.gemm(og * k * positions).run(
            patches,
            false,
            [positions, k, og],
            (rows, 1, og),
            (&w[c.group * og * k..], 1, k),
        );
        if self.d.c == 1 || self.channels_last {
            // Channels last already (one channel: NCHW is too).
            let image = self.d.image();
            return self.col2im(patches, &mut dx[..c.count * image]);
        }
        let image = prefix(&mut s.image, c.count * self.d.image());
        self.col2im(patches, image);
        self.channels_last_to_nchw(c, image, dx);
    }

    /// `dW'_g += g · patches`, with `g` as `[O/g, count·P]`. The product is long and narrow
    /// (`[64, 288]` from 4,096 positions in the digits CNN), so rather than leave gemm to
    /// split its few output blocks, each thread sums the products of its share of the
    /// positions, and the partial sums are added.
    fn filter_grad<T: Elem>(
        &self,
        c: Chunk,
        patches: &[T],
        g: &[T],
        dw: &mut [T],
        grad: &mut Vec<T>,
    ) {
        let (k, og, positions) = (self.d.k(), self.d.og(), c.count * self.d.p());
        // `g` as `[O/g, count·P]`: the rows of a channels-last `g` read across, else gathered.
        let (grad, column, row) = match self.channels_last {
            true => (&g[..positions * og], og, 1),
            false => {
                let grad = prefix(grad, positions * og);
                self.gather(c, g, grad);
                (&*grad, 1, positions)
            }
        };
        let dw = &mut dw[c.group * og * k..(c.group + 1) * og * k];
        let part = |run: std::ops::Range<usize>, dst: &mut [T]| {
            let (grad, patches) = (&grad[run.start * column..], &patches[run.start * k..]);
            let shape = [og, k, run.len()];
            let single = Gemm { threads: false };
            single.run(dst, true, shape, (grad, column, row), (patches, 1, k));
        };
        if !(self.threads && og * k * positions >= PARALLEL_FLOPS) {
            return part(0..positions, dw);
        }
        let sum = summed(positions, og * k, true, part);
        for (to, v) in dw.iter_mut().zip(sum) {
            *to += v;
        }
    }

    /// The chunk's group of `g` (`[N, O, P]`) as `[O/g, count·P]`: runs of `P` copied.
    fn gather<T: Elem>(&self, c: Chunk, g: &[T], grad: &mut [T]) {
        let d = &self.d;
        let (p, row_len) = (d.p(), c.count * d.p());
        for_each_chunk(grad, row_len, self.threads, |o, row| {
            for (n, to) in row.chunks_exact_mut(p).enumerate() {
                let from = (n * d.o + c.group * d.og() + o) * p;
                to.copy_from_slice(&g[from..from + p]);
            }
        });
    }

    /// The chunk's patch matrix `[count·P, K]`, built in `patches` through `image`.
    fn patch_matrix<'s, T: Elem>(
        &self,
        c: Chunk,
        x: &'s [T],
        image: &'s mut Vec<T>,
        patches: &'s mut Vec<T>,
    ) -> &'s [T] {
        let image = self.channels_last(c, x, image);
        let patches = prefix(patches, c.count * self.d.p() * self.d.k());
        self.im2col(image, patches);
        patches
    }

    /// The chunk's group of input channels, `[count, h, w, C/g]`: `x` itself when it has one
    /// channel, else laid out in `scratch`.
    fn channels_last<'a, T: Elem>(&self, c: Chunk, x: &'a [T], scratch: &'a mut Vec<T>) -> &'a [T] {
        let image = self.d.image();
        if self.d.c == 1 || self.channels_last {
            return &x[..c.count * image];
        }
        let to = prefix(scratch, c.count * image);
        self.nchw_to_channels_last(c, x, to);
        to
    }

    /// The chunk's group of input channels, `[count, h, w, C/g]`.
    fn nchw_to_channels_last<T: Elem>(&self, c: Chunk, x: &[T], image: &mut [T]) {
        let d = &self.d;
        let plane = d.h * d.w;
        for_each_chunk(image, d.image(), self.threads, |n, image| {
            let from = &x[(n * d.c + c.group * d.cg()) * plane..][..d.image()];
            for (ci, channel) in from.chunks_exact(plane).enumerate() {
                for (at, &v) in channel.iter().enumerate() {
                    image[at * d.cg() + ci] = v;
                }
            }
        });
    }

    /// The inverse of [`Run::nchw_to_channels_last`], into the chunk's group of `dx`.
    fn channels_last_to_nchw<T: Elem>(&self, c: Chunk, image: &[T], dx: &mut [T]) {
        let d = &self.d;
        let (plane, sample) = (d.h * d.w, d.c * d.h * d.w);
        let samples = &mut dx[..c.count * sample];
        for_each_chunk(samples, sample, self.threads, |n, dx| {
            let image = &image[n * d.image()..][..d.image()];
            let to = &mut dx[c.group * d.image()..][..d.image()];
            for (ci, channel) in to.chunks_exact_mut(plane).enumerate() {
                for (at, v) in channel.iter_mut().enumerate() {
                    *v = image[at * d.cg() + ci];
                }
            }
        });
    }

    /// Lays the chunk's windows out as the patch matrix `[count·P, K]`: for each output
    /// position, each tap's `C/g` channels (zeros for padding).
    fn im2col<T: Elem>(&self, image: &[T], patches: &mut [T]) {
        let d = &self.d;
        let (cg, per_sample) = (d.cg(), d.p() * d.k());
        for_each_chunk(patches, per_sample, self.threads, |n, patches| {
            let image = &image[n * d.image()..][..d.image()];
            windows(cg, image, &self.offsets, patches)
        });
    }

    /// The adjoint of [`Run::im2col`]: the chunk's input gradient, channels last, as the sum
    /// of each patch entry into the element it came from (each sample by one thread).
    fn col2im<T: Elem>(&self, patches: &[T], image: &mut [T]) {
        let d = &self.d;
        let (cg, per_sample) = (d.cg(), d.p() * d.k());
        for_each_chunk(image, d.image(), self.threads, |n, image| {
            image.fill(T::zero());
            let patches = &patches[n * per_sample..][..per_sample];
            for (from, &at) in patches.chunks_exact(cg).zip(&self.offsets) {
                if at != PADDING {
                    let to = &mut image[at as usize..][..cg];
                    for (t, &v) in to.iter_mut().zip(from) {
                        *t += v;
                    }
                }
            }
        });
    }

    /// The chunk's group of `g` (`[N, O, P]`) as rows `[count·P, O/g]`.
    fn nchw_to_rows<T: Elem>(&self, c: Chunk, g: &[T], rows: &mut [T]) {
        let d = &self.d;
        let (p, og) = (d.p(), d.og());
        for_each_chunk(rows, p * og, self.threads, |n, rows| {
            let from = &g[(n * d.o + c.group * og) * p..][..og * p];
            for (o, channel) in from.chunks_exact(p).enumerate() {
                for (q, &v) in channel.iter().enumerate() {
                    rows[q * og + o] = v;
                }
            }
        });
    }

    /// The inverse of [`Run::nchw_to_rows`], into the chunk's group of `y`.
    fn rows_to_nchw<T: Elem>(&self, c: Chunk, rows: &[T], y: &mut [T]) {
        let d = &self.d;
        let (p, og, sample) = (d.p(), d.og(), d.o * d.p());
        let samples = &mut y[..c.count * sample];
        for_each_chunk(samples, sample, self.threads, |n, y| {
            let rows = &rows[n * p * og..][..p * og];
            let to = &mut y[c.group * og * p..][..og * p];
            for (o, channel) in to.chunks_exact_mut(p).enumerate() {
                for (q, v) in channel.iter_mut().enumerate() {
                    *v = rows[q * og + o];
                }
            }
        });
    }

    /// `channels` (`[O/g, count·P]`, each channel's planes of the chunk's samples in a row)
    /// into the chunk's group of `y`: a plane at a time.
    fn channels_to_nchw<T: Elem>(&self, c: Chunk, channels: &[T], y: &mut [T]) {
        let d = &self.d;
        let (p, og, sample) = (d.p(), d.og(), d.o * d.p());
        let samples = &mut y[..c.count * sample];
        for_each_chunk(samples, sample, self.threads, |n, y| {
            let to = &mut y[c.group * og * p..][..og * p];
            for (o, plane) in to.chunks_exact_mut(p).enumerate() {
                plane.copy_from_slice(&channels[(o * c.count + n) * p..][..p]);
            }
        });
    }

    /// The inverse of [`patch_order`], into `w`.
    fn weights_from_patch_order<T: Elem>(&self, patch_order: &[T], w: &mut [T]) {
        let (cg, taps) = (self.d.cg(), self.d.taps());
        let rows = patch_order.chunks_exact(self.d.k());
        for (from, to) in rows.zip(w.chunks_exact_mut(self.d.k())) {
            for ci in 0..cg {
                for t in 0..taps {
                    to[ci * taps + t] = from[t * cg + ci];
                }
            }
        }
    }
}

/// An output the tasks of one [`crate::team::for_each`] write in disjoint parts.
struct Disjoint<T> {
    start: *mut T,
    len: usize,
}

// SAFETY: the tasks write disjoint elements (the promise of each caller of `part`).
unsafe impl<T: Send> Sync for Disjoint<T> {}

impl<T> Disjoint<T> {
    fn new(data: &mut [T]) -> Disjoint<T> {
        Disjoint {
            start: data.as_mut_ptr(),
            len: data.len(),
        }
    }

    /// Elements `from..from + len`.
    ///
    /// # Safety
    /// No other task reads or writes them while the slice lives, and the output outlives it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn part(&self, from: usize, len: usize) -> &mut [T] {
        assert!(from + len <= self.len, "a part within the output");
        // SAFETY: in bounds (above); exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.start.add(from), len) }
    }
}

/// `w` (`[O, C/g, KH, KW]`) as `[O, KH, KW, C/g]`, the patch matrix's column order.
fn patch_order<T: Elem>(d: &ConvDims, w: &[T]) -> Vec<T> {
    let (cg, taps) = (d.cg(), d.taps());
    let mut out = Vec::with_capacity(w.len());
    for from in w.chunks_exact(d.k()) {
        out.extend((0..taps).flat_map(|t| (0..cg).map(move |ci| from[ci * taps + t])));
    }
    out
}

/// The sum of `len`-element partial results, each from `add` over a range of `0..items`
/// (samples, or chunks of them): in parallel when `across`, each thread a run of consecutive
/// items, the threads' sums then added in the items' order (as a product over all of them
/// split in parts does).
fn summed<T: Elem>(
    items: usize,
    len: usize,
    across: bool,
    add: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) -> Vec<T> {
    let workers = if across {
        crate::team::width().clamp(1, items.max(1))
    } else {
        1
    };
    let own = items.div_ceil(workers);
    let mut partials = vec![vec![T::zero(); len]; workers];
    for_each_chunk(&mut partials, 1, across, |worker, sum| {
        add(
            (worker * own).min(items)..((worker + 1) * own).min(items),
            &mut sum[0],
        )
    });
    let mut partials = partials.into_iter();
    let mut sum = partials.next().expect("one worker at least");
    for partial in partials {
        for (to, v) in sum.iter_mut().zip(partial) {
            *to += v;
        }
    }
    sum
}

/// The windows of one sample's channels-last `image` (`C/g` channels a position) whose taps
/// `offsets` lists, for a run of output positions, as rows of `patches` (zeros for padding).
fn windows<T: Elem>(cg: usize, image: &[T], offsets: &[u32], patches: &mut [T]) {
    if cg == 1 {
        // One channel: a gather (a copy call per element would cost more).
        for (to, &at) in patches.iter_mut().zip(offsets) {
            *to = if at == PADDING {
                T::zero()
            } else {
                image[at as usize]
            };
        }
        return;
    }
    for (to, &at) in patches.chunks_exact_mut(cg).zip(offsets) {
        if at == PADDING {
            to.fill(T::zero());
        } else {
            to.copy_from_slice(&image[at as usize..][..cg]);
        }
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
    /// Split the columns over the team's threads.
    threads: bool,
}

impl Gemm {
    /// A product of `flops` multiply-adds, split over the threads when `threads` allows and
    /// it is large enough to gain.
    fn split(threads: bool, flops: usize) -> Gemm {
        Gemm {
            threads: threads && flops >= PARALLEL_FLOPS,
        }
    }

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
        let product = Product {
            m,
            k,
            a: lhs.as_ptr(),
            a_strides: (lhs_cs as isize, lhs_rs as isize),
            b: rhs.as_ptr(),
            b_strides: (rhs_cs as isize, rhs_rs as isize),
            scale: if accumulate {
                Scale::Onto(T::one())
            } else {
                Scale::Overwrite
            },
            split_rows: false,
        };
        // SAFETY: the asserts above keep every element gemm reads within `lhs` and `rhs` and
        // every element it writes within `dst`, which borrows exclusively (so no overlap).
        unsafe { product.run(n, dst.as_mut_ptr(), n, self.threads) }
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

    /// Chunks of a few samples give what one chunk of the whole batch gives, for the
    /// convolution and both its transposes, one after another and (when the team has threads)
    /// in parallel. The ramps' values are exact in f64, so every order of summing agrees.
    #[test]
    fn chunked_batches_match_one_chunk() {
        let attrs = Conv2dAttrs {
            strides: [1, 2],
            padding: [(1, 0), (1, 1)],
            dilation: [1, 1],
            groups: 2,
            channels_last: false,
        };
        // Enough samples and work for chunks to run in parallel.
        let (x, w, y) = ([32, 4, 15, 16], [48, 2, 3, 2], [32, 48, 14, 9]);
        let dims = ConvDims::of(&x, &w, &y, 2).expect("shapes");
        assert_eq!(chunking(&dims, 12_000, false), (3, false));
        if crate::team::width() > 1 {
            assert_eq!(chunking(&dims, 12_000, true), (3, true));
        }
        let kinds = [
            (ConvKind::Forward, x, w, y),
            (ConvKind::InputGrad { input: [15, 16] }, y, w, x),
            (ConvKind::FilterGrad { kernel: [3, 2] }, x, y, w),
        ];
        // One sample's patch matrix and product have 126 positions × (2·3·2 weights + 24
        // channels) = 4,536 elements: a budget of 12,000 makes chunks of three samples (and a
        // last one of two).
        budget_changes_nothing(&attrs, &kinds, 12_000);
    }

    /// Each of `kinds` (kind and operand and result shapes) run with a patch-matrix `budget`,
    /// one after another and with threads, gives what it gives with no budget. The ramps'
    /// values are exact in f64, so every order of summing agrees.
    fn budget_changes_nothing(attrs: &Conv2dAttrs, kinds: &[Case], budget: usize) {
        for &(kind, a, b, out) in kinds {
            let (a, b) = (ramp(&a, 0.5), ramp(&b, 0.25));
            let run = |threads, budget| conv((kind, attrs, [&a, &b], threads, budget), &out);
            let whole = run(false, usize::MAX);
            assert_eq!(run(false, budget), whole, "{kind:?}");
            assert_eq!(run(true, budget), whole, "{kind:?}, with threads");
            let packed = packed_weights(
                kind,
                attrs,
                [a.shape(), b.shape(), &out],
                &Array::F64(b.clone()),
            );
            if let Some(Array::F64(packed)) = packed {
                let mut result = ArrayD::zeros(IxDyn(&out));
                let call = (kind, attrs, [&a, &b], true, budget);
                typed(call, packed.as_slice(), &mut result, None);
                assert_eq!(result, whole, "{kind:?}, with packed weights");
            } else {
                assert!(
                    matches!(kind, ConvKind::FilterGrad { .. }),
                    "{kind:?} packs"
                );
            }
        }
    }

    /// A call's kind, operand shapes and result shape.
    type Case = (ConvKind, [usize; 4], [usize; 4], [usize; 4]);

    /// Samples whose patch matrices are larger than a chunk's, run a few output positions at a
    /// time (samples in parallel when the team has threads), give what whole samples give,
    /// for the convolution and its filter gradient.
    #[test]
    fn samples_by_runs_of_positions_match_whole_samples() {
        let attrs = Conv2dAttrs {
            strides: [1, 2],
            padding: [(1, 1), (1, 0)],
            dilation: [1, 1],
            groups: 2,
            channels_last: false,
        };
        let (x, w, y) = ([8, 8, 32, 32], [64, 4, 3, 2], [8, 64, 32, 16]);
        // 512 positions × 4·3·2 weights a sample: a budget of 2,400 takes 100 positions at a
        // time, and there is enough work (3.1 MFLOP) for samples to run in parallel.
        let dims = ConvDims::of(&x, &w, &y, 2).expect("shapes");
        assert_eq!(
            positions_per_run(ConvKind::Forward, &dims, 2_400),
            Some(100)
        );
        if crate::team::width() > 1 {
            assert!(chunking(&dims, 2_400, true).1, "samples in parallel");
        }
        let kinds = [
            (ConvKind::Forward, x, w, y),
            (ConvKind::FilterGrad { kernel: [3, 2] }, x, y, w),
        ];
        budget_changes_nothing(&attrs, &kinds, 2_400);
        // One sample: its runs of positions split over the threads.
        let (x, y) = ([1, 8, 32, 32], [1, 64, 32, 16]);
        let one = ConvDims::of(&x, &w, &y, 2).expect("shapes");
        assert_eq!(chunking(&one, 2_400, true), (1, false));
        budget_changes_nothing(&attrs, &[(ConvKind::Forward, x, w, y)], 2_400);
    }

    /// A sample with more output channels than positions is not split into runs of
    /// positions: each run would read all the weights again.
    #[test]
    fn few_positions_and_many_channels_run_whole_samples() {
        let many = ConvDims::of(&[1, 512, 7, 7], &[512, 512, 3, 3], &[1, 512, 7, 7], 1);
        let many = many.expect("shapes");
        assert_eq!(positions_per_run(ConvKind::Forward, &many, 65_536), None);
    }

    /// Pointwise convolutions (one gemm per sample of the NCHW planes as they are) give what
    /// the im2col path gives, for the convolution and both transposes, samples one after
    /// another and in parallel.
    #[test]
    fn pointwise_convolutions_match_patch_matrices() {
        let attrs = Conv2dAttrs {
            strides: [1, 1],
            padding: [(0, 0), (0, 0)],
            dilation: [1, 1],
            groups: 2,
            channels_last: false,
        };
        let (x, w, y) = ([9, 6, 7, 5], [8, 3, 1, 1], [9, 8, 7, 5]);
        let dims = ConvDims::of(&x, &w, &y, 2).expect("shapes");
        assert!(is_pointwise(&dims, &attrs));
        let kinds = [
            (ConvKind::Forward, x, w, y),
            (ConvKind::InputGrad { input: [7, 5] }, y, w, x),
            (ConvKind::FilterGrad { kernel: [1, 1] }, x, y, w),
        ];
        for (kind, a, b, out) in kinds {
            let (a, b) = (ramp(&a, 0.5), ramp(&b, 0.25));
            let slices = [a.as_slice().unwrap(), b.as_slice().unwrap()];
            let mut patches = ArrayD::zeros(IxDyn(&out));
            let run = Run::new(dims, &attrs, false);
            let target = patches.as_slice_mut().unwrap();
            match kind {
                ConvKind::FilterGrad { .. } => run.filter_grad_in_chunks(4, false, slices, target),
                _ => run.in_chunks(kind, 4, false, slices, target, None),
            }
            for across in [false, true] {
                let mut pointwise = ArrayD::zeros(IxDyn(&out));
                let target = pointwise.as_slice_mut().unwrap();
                let threads = !across;
                Pointwise { d: dims, threads }.run(kind, across, slices, target, None);
                assert_eq!(
                    pointwise, patches,
                    "{kind:?}, samples in parallel: {across}"
                );
            }
        }
    }

    /// `call` into a new array of shape `out`.
    fn conv(call: Call<'_, f64>, out: &[usize]) -> ArrayD<f64> {
        let mut result = ArrayD::zeros(IxDyn(out));
        typed(call, None, &mut result, None);
        result
    }
}
