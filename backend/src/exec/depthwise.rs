//! Depthwise convolutions — each group one input channel, as in MobileNet, EfficientNet and
//! ConvNeXt — computed directly, plane by plane, with no patch matrix.
//!
//! Through im2col such a convolution is one product per channel of a single output row
//! (`[1, K]·[K, P]`, K the 9 or 49 taps): gemm's packing and dispatch cost more than its few
//! flops, and the patch matrix is `K` times the input. Here each output row is a sum of `K`
//! shifted input rows scaled by one weight each, accumulated in a row that stays in L1; at
//! unit stride the sums are contiguous and vectorise at the CPU's width (the same loops
//! compiled for AVX-512 or AVX2 with FMA, chosen at run time as `KILN_VECTOR_MATH` allows,
//! and a portable build below them). Each output element sums its taps in the interpreter's
//! order (rows of the window, then columns), so results differ from the oracle only where a
//! fused multiply-add rounds once instead of twice.
//!
//! Small unit-stride planes run on a wide grid instead ([`Wide`]): each tap one contiguous
//! multiply-add over the whole padded plane. Channels split over the team's threads; the epilogue runs on each sample as it is
//! finished. Gradients and channels-last activations take the patch-matrix path.

use super::conv::Written;
use crate::interp::window::ConvDims;
use crate::jit::tile_program::{Isa, isa};
use crate::team::for_each_chunk;
use kiln_ir::{Conv2dAttrs, ConvKind};
use num_traits::Float;

/// Whether `conv2d` of `kind` runs here: a forward convolution of NCHW activations whose
/// groups each read one input channel (any channel multiplier, window, stride, dilation and
/// padding).
pub(super) fn suits(kind: ConvKind, attrs: &Conv2dAttrs, d: &ConvDims) -> bool {
    matches!(kind, ConvKind::Forward) && !attrs.channels_last && d.groups > 1 && d.cg() == 1
}

/// Output elements a thread's share of a sample should have at least, so that splitting a
/// small layer over the team costs less than it saves.
const ELEMENTS_PER_TASK: usize = 4096;

/// The depthwise convolution of NCHW `x` with OIHW weights `w` into `out` ([`suits`]),
/// splitting each sample's channels over the threads when `threads`, and calling `written`
/// on each sample once it is whole.
pub(super) fn forward<T: Float + Send + Sync>(
    d: &ConvDims,
    attrs: &Conv2dAttrs,
    [x, w]: [&[T]; 2],
    out: &mut [T],
    threads: bool,
    written: Option<Written>,
) {
    let geometry = Geometry::new(d, attrs);
    let wide = Wide::new(d, attrs);
    let plane = d.oh * d.ow;
    let per_sample = d.o * plane;
    let planes_per_task = match threads && crate::team::width() > 1 {
        true => ELEMENTS_PER_TASK.div_ceil(plane.max(1)).max(1),
        false => d.o.max(1),
    };
    for (n, sample) in out.chunks_mut(per_sample).enumerate() {
        let input = &x[n * d.c * d.h * d.w..][..d.c * d.h * d.w];
        for_each_chunk(sample, planes_per_task * plane, threads, |task, planes| {
            let first = task * planes_per_task;
            let (mut padded, mut grid) = (Vec::new(), Vec::new());
            for (i, out_plane) in planes.chunks_mut(plane).enumerate() {
                let o = first + i;
                let c = o / d.og();
                let in_plane = &input[c * d.h * d.w..][..d.h * d.w];
                let taps = &w[o * d.kh * d.kw..][..d.kh * d.kw];
                match &wide {
                    // A padding tap adds `w·0`: not zero when `w` is not finite.
                    Some(wide) if taps.iter().all(|t| t.is_finite()) => {
                        wide.pad(in_plane, &mut padded);
                        grid.resize(wide.len, T::zero());
                        wide_plane_at(isa(), wide, &padded, taps, &mut grid);
                        wide.crop(&grid, out_plane);
                    }
                    _ => depthwise_plane(&geometry, in_plane, taps, out_plane),
                }
            }
        });
        if let Some(written) = written {
            written(n..n + 1, sample.as_mut_ptr().cast());
        }
    }
}

/// One plane's sizes and its window's placement, with each window column's output span.
pub(super) struct Geometry {
    h: usize,
    w: usize,
    kh: usize,
    ow: usize,
    row_stride: usize,
    row_dilation: usize,
    rows_before: usize,
    column_stride: usize,
    /// Per window column: the outputs `lo..hi` whose tap falls inside the input row, and the
    /// input column the first of them reads (the same for every row, so found once).
    columns: Vec<(usize, usize, usize)>,
}

impl Geometry {
    fn new(d: &ConvDims, attrs: &Conv2dAttrs) -> Geometry {
        let [stride, dilation, before] = [attrs.strides[1], attrs.dilation[1], attrs.padding[1].0];
        let columns = (0..d.kw)
            .map(|k| {
                // Output `o` reads input `o·stride + offset − before`, inside `0..d.w`.
                let offset = k * dilation;
                let lo = before.saturating_sub(offset).div_ceil(stride);
                let hi = match (d.w + before).checked_sub(offset + 1) {
                    Some(last) => (last / stride + 1).min(d.ow),
                    None => 0,
                };
                let lo = lo.min(hi);
                (lo, hi, (lo * stride + offset).saturating_sub(before))
            })
            .collect();
        Geometry {
            h: d.h,
            w: d.w,
            kh: d.kh,
            ow: d.ow,
            row_stride: attrs.strides[0],
            row_dilation: attrs.dilation[0],
            rows_before: attrs.padding[0].0,
            column_stride: stride,
            columns,
        }
    }

    /// The input row output row `oh` reads at window row `kh`, if it is inside the input.
    fn input_row(&self, oh: usize, kh: usize) -> Option<usize> {
        let row = (oh * self.row_stride + kh * self.row_dilation).checked_sub(self.rows_before)?;
        (row < self.h).then_some(row)
    }
}

/// What the wide grid's length is a multiple of: the compiler's vector loop (four AVX-512
/// registers of f32 an iteration), so that no element is left to its scalar remainder.
const LANES: usize = 64;

/// The most elements a wide grid may have: with its padded input it then stays in L1 (a
/// 112×112 plane on the grid was slower than by rows: 0.77–0.83 against 0.56–0.68 ms for 32
/// channels).
const WIDE_ELEMENTS: usize = 4096;

/// A unit-stride plane computed on the **wide grid**: the input padded into rows of `wp`
/// columns, and the output computed on rows of the same width, of which the first `ow` are
/// kept. Output `i` of the grid then reads padded input `i + offset` for each tap, so each
/// tap is one contiguous multiply-add over the whole plane. The row loops of [`plane`] left
/// rows shorter than the compiler's unrolled vector loop (MobileNet's 14×14 and 7×7 planes)
/// scalar: 1.04 against 0.38 ms for a 14×14 layer of 576 channels.
struct Wide {
    w: usize,
    top: usize,
    left: usize,
    /// Columns of a padded row, and of a grid row.
    wp: usize,
    ow: usize,
    /// Per tap (window rows, then columns): where its input starts in the padded plane.
    offsets: Vec<usize>,
    /// The grid's elements: `oh · wp`, rounded up to a multiple of [`LANES`].
    len: usize,
}

impl Wide {
    /// The wide grid of a small unit-stride convolution, else `None`.
    fn new(d: &ConvDims, attrs: &Conv2dAttrs) -> Option<Wide> {
        let [(top, _), (left, right)] = attrs.padding;
        let wp = left + d.w + right;
        let len = (d.oh * wp).next_multiple_of(LANES);
        if attrs.strides != [1, 1] || len > WIDE_ELEMENTS {
            return None;
        }
        let [dh, dw] = attrs.dilation;
        let offsets = (0..d.kh)
            .flat_map(|kh| (0..d.kw).map(move |kw| kh * dh * wp + kw * dw))
            .collect();
        Some(Wide {
            w: d.w,
            top,
            left,
            wp,
            ow: d.ow,
            offsets,
            len,
        })
    }

    /// `plane` padded with zeros into `padded`: rows of `wp`, and zeros past the last row as
    /// far as the last tap reads on the grid (which covers the bottom padding: the grid has
    /// as many rows as the padded input less the window's extent).
    fn pad<T: Float>(&self, plane: &[T], padded: &mut Vec<T>) {
        let last = self.offsets.last().copied().unwrap_or(0);
        padded.clear();
        padded.resize(self.len + last, T::zero());
        for (r, row) in plane.chunks_exact(self.w).enumerate() {
            padded[(self.top + r) * self.wp + self.left..][..self.w].copy_from_slice(row);
        }
    }

    /// The first `ow` columns of each of the grid's rows, into `out` (as many rows).
    fn crop<T: Float>(&self, grid: &[T], out: &mut [T]) {
        for (row, from) in out.chunks_exact_mut(self.ow).zip(grid.chunks(self.wp)) {
            row.copy_from_slice(&from[..self.ow]);
        }
    }
}

/// [`wide_plane`] compiled for `level`, which the CPU must have ([`Isa::supported`]).
fn wide_plane_at<T: Float>(level: Isa, g: &Wide, padded: &[T], taps: &[T], grid: &mut [T]) {
    debug_assert!(level.supported());
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the caller's level is one the CPU has.
        Isa::Avx512 => return unsafe { wide_plane_avx512(g, padded, taps, grid) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { wide_plane_avx2(g, padded, taps, grid) },
        Isa::Off => {}
    }
    wide_plane(g, padded, taps, grid, |w, x, acc| acc + w * x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn wide_plane_avx512<T: Float>(g: &Wide, padded: &[T], taps: &[T], grid: &mut [T]) {
    wide_plane(g, padded, taps, grid, T::mul_add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn wide_plane_avx2<T: Float>(g: &Wide, padded: &[T], taps: &[T], grid: &mut [T]) {
    wide_plane(g, padded, taps, grid, T::mul_add)
}

/// The grid of one plane: zero, then each tap's weight times the padded input from the tap's
/// offset, in the interpreter's order of taps.
#[inline(always)]
fn wide_plane<T: Float>(
    g: &Wide,
    padded: &[T],
    taps: &[T],
    grid: &mut [T],
    mul_add: impl Fn(T, T, T) -> T + Copy,
) {
    grid.fill(T::zero());
    for (&weight, &offset) in taps.iter().zip(&g.offsets) {
        // One plain loop: in blocks of 16 as arrays, the compiler vectorised across the
        // blocks instead, with gathers and scatters, several times slower.
        let from = &padded[offset..][..grid.len()];
        for (acc, &x) in grid.iter_mut().zip(from) {
            *acc = mul_add(weight, x, *acc);
        }
    }
}

/// Writes one output plane: the convolution of `input` (one channel) with `taps`, by the
/// loops of [`plane`] compiled for the widest instruction set this CPU has (and
/// `KILN_VECTOR_MATH` allows), with fused multiply-adds where it has them.
fn depthwise_plane<T: Float>(g: &Geometry, input: &[T], taps: &[T], out: &mut [T]) {
    plane_at(isa(), g, input, taps, out)
}

/// [`plane`] compiled for `level`, which the CPU must have ([`Isa::supported`]).
fn plane_at<T: Float>(level: Isa, g: &Geometry, input: &[T], taps: &[T], out: &mut [T]) {
    debug_assert!(level.supported());
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the caller's level is one the CPU has.
        Isa::Avx512 => return unsafe { plane_avx512(g, input, taps, out) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { plane_avx2(g, input, taps, out) },
        Isa::Off => {}
    }
    plane(g, input, taps, out, |w, x, acc| acc + w * x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn plane_avx512<T: Float>(g: &Geometry, input: &[T], taps: &[T], out: &mut [T]) {
    plane(g, input, taps, out, T::mul_add)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn plane_avx2<T: Float>(g: &Geometry, input: &[T], taps: &[T], out: &mut [T]) {
    plane(g, input, taps, out, T::mul_add)
}

/// One output plane, row by row: each row starts at zero and gains each tap's weight times
/// the input row the tap reads, over the outputs whose tap is inside the input (the rest
/// read padding, zero).
#[inline(always)]
fn plane<T: Float>(
    g: &Geometry,
    input: &[T],
    taps: &[T],
    out: &mut [T],
    mul_add: impl Fn(T, T, T) -> T + Copy,
) {
    let stride = g.column_stride;
    for (oh, row) in out.chunks_exact_mut(g.ow).enumerate() {
        row.fill(T::zero());
        for kh in 0..g.kh {
            let Some(ih) = g.input_row(oh, kh) else {
                continue;
            };
            let in_row = &input[ih * g.w..][..g.w];
            let weights = &taps[kh * g.columns.len()..][..g.columns.len()];
            for (&weight, &(lo, hi, iw)) in weights.iter().zip(&g.columns) {
                let outs = &mut row[lo..hi];
                if stride == 1 {
                    for (acc, &x) in outs.iter_mut().zip(&in_row[iw..]) {
                        *acc = mul_add(weight, x, *acc);
                    }
                } else {
                    for (acc, &x) in outs.iter_mut().zip(in_row[iw..].iter().step_by(stride)) {
                        *acc = mul_add(weight, x, *acc);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Array, Interpreter};
    use kiln_ir::{Module, Op};
    use ndarray::{ArrayD, IxDyn};

    /// Values whose products and sums are exact in f64 (and in f32 at these sizes).
    fn ramp(shape: &[usize], scale: f64) -> ArrayD<f64> {
        let n = shape.iter().product::<usize>();
        let values = (0..n).map(|i| ((i * 37 % 11) as f64 - 5.0) * scale);
        ArrayD::from_shape_vec(IxDyn(shape), values.collect()).expect("the shape's size")
    }

    /// The interpreter's convolution (the oracle), and the shape of its result.
    fn oracle(attrs: &Conv2dAttrs, x: &ArrayD<f64>, w: &ArrayD<f64>) -> ArrayD<f64> {
        let (xs, ws) = (x.shape(), w.shape());
        let out = [
            xs[0],
            ws[0],
            attrs.output_size(0, xs[2], ws[2]).expect("fits"),
            attrs.output_size(1, xs[3], ws[3]).expect("fits"),
        ];
        let op = Op::Conv2d {
            kind: ConvKind::Forward,
            attrs: *attrs,
        };
        let module = Module::new();
        let args = [Array::F64(x.clone()), Array::F64(w.clone())];
        let result = Interpreter::new(&module).eval_op(&op, &[&args[0], &args[1]], &[out.to_vec()]);
        match result.expect("the interpreter runs it").remove(0) {
            Array::F64(y) => y,
            other => panic!("f64 expected, found {}", other.ty()),
        }
    }

    /// Runs [`forward`] on `x` and `w`, with threads or without.
    fn direct(
        attrs: &Conv2dAttrs,
        x: &ArrayD<f64>,
        w: &ArrayD<f64>,
        shape: &[usize],
        threads: bool,
    ) -> ArrayD<f64> {
        let d = ConvDims::of(x.shape(), w.shape(), shape, attrs.groups).expect("shapes");
        assert!(suits(ConvKind::Forward, attrs, &d));
        let mut out = ArrayD::from_elem(IxDyn(shape), f64::NAN);
        let slices = [
            x.as_slice().expect("standard"),
            w.as_slice().expect("standard"),
        ];
        forward(
            &d,
            attrs,
            slices,
            out.as_slice_mut().expect("standard"),
            threads,
            None,
        );
        out
    }

    /// Every window, stride, dilation, padding (uneven, and wider than the window) and
    /// channel multiplier gives the interpreter's result exactly, with and without threads.
    #[test]
    fn depthwise_convolutions_match_the_interpreter() {
        let mut cases = 0;
        for (kernel, strides, dilation, padding) in [
            ([3, 3], [1, 1], [1, 1], [(1, 1), (1, 1)]),
            ([3, 3], [2, 2], [1, 1], [(0, 1), (1, 0)]),
            ([5, 5], [1, 2], [1, 1], [(2, 2), (2, 2)]),
            ([7, 7], [1, 1], [1, 1], [(3, 3), (3, 3)]),
            ([3, 3], [1, 1], [2, 2], [(2, 2), (2, 2)]),
            ([3, 1], [2, 1], [1, 1], [(0, 0), (0, 0)]),
            ([3, 3], [1, 1], [1, 1], [(4, 0), (0, 5)]),
            ([5, 5], [3, 3], [2, 1], [(1, 3), (2, 2)]),
        ] {
            for (channels, multiplier, batch, size) in
                [(4, 1, 2, [9, 11]), (3, 2, 1, [6, 4]), (32, 1, 1, [12, 12])]
            {
                let attrs = Conv2dAttrs {
                    strides,
                    padding,
                    dilation,
                    groups: channels,
                    channels_last: false,
                };
                let x = ramp(&[batch, channels, size[0], size[1]], 0.5);
                let w = ramp(&[channels * multiplier, 1, kernel[0], kernel[1]], 0.25);
                let Some(_) = attrs.output_size(0, size[0], kernel[0]) else {
                    continue;
                };
                let Some(_) = attrs.output_size(1, size[1], kernel[1]) else {
                    continue;
                };
                let expected = oracle(&attrs, &x, &w);
                for threads in [false, true] {
                    let got = direct(&attrs, &x, &w, expected.shape(), threads);
                    assert_eq!(
                        got, expected,
                        "{kernel:?} {strides:?} {dilation:?} {padding:?}, {channels}×{multiplier}, threads {threads}"
                    );
                }
                cases += 1;
            }
        }
        assert!(cases >= 20, "{cases} cases ran");
    }

    /// A weight that is not finite gives what the interpreter gives, whose padding taps add
    /// nothing (on the wide grid they would add `∞·0`, NaN, at the border).
    #[test]
    fn infinite_weights_match_the_interpreter_at_the_border() {
        let attrs = Conv2dAttrs {
            strides: [1, 1],
            padding: [(1, 1), (1, 1)],
            dilation: [1, 1],
            groups: 2,
            channels_last: false,
        };
        let x = ramp(&[1, 2, 5, 6], 0.5).mapv(|v| v + 1.0);
        let mut w = ramp(&[2, 1, 3, 3], 0.25);
        w[[1, 0, 0, 0]] = f64::INFINITY;
        let expected = oracle(&attrs, &x, &w);
        assert!(expected[[0, 1, 0, 0]].is_finite() && expected[[0, 1, 1, 1]].is_infinite());
        let got = direct(&attrs, &x, &w, expected.shape(), false);
        let same = |a: &f64, b: &f64| a == b || (a.is_nan() && b.is_nan());
        assert!(
            got.iter().zip(&expected).all(|(a, b)| same(a, b)),
            "{got} against {expected}"
        );
    }

    /// In f32, at each instruction-set level this CPU has, within rounding of the
    /// interpreter's f64 sums.
    #[test]
    fn f32_depthwise_is_within_rounding_at_each_level() {
        for stride in [1, 2] {
            let attrs = Conv2dAttrs {
                strides: [stride, stride],
                padding: [(1, 1), (1, 1)],
                dilation: [1, 1],
                groups: 1,
                channels_last: false,
            };
            let x = ArrayD::from_shape_fn(IxDyn(&[1, 1, 13, 37]), |i| {
                ((i[2] * 3 + i[3]) as f64 * 0.37).sin()
            });
            let w = ArrayD::from_shape_fn(IxDyn(&[1, 1, 3, 3]), |i| {
                ((i[2] * 3 + i[3]) as f64 * 0.71).cos()
            });
            let expected = oracle(&attrs, &x, &w);
            let (x32, w32) = (x.mapv(|v| v as f32), w.mapv(|v| v as f32));
            let d = ConvDims::of(x.shape(), w.shape(), expected.shape(), 1).expect("shapes");
            let (g, wide) = (Geometry::new(&d, &attrs), Wide::new(&d, &attrs));
            assert_eq!(wide.is_some(), stride == 1);
            let (x32, w32) = (
                x32.as_slice().expect("standard"),
                w32.as_slice().expect("standard"),
            );
            let mut padded = Vec::new();
            for level in Isa::ALL.into_iter().filter(|l| l.supported()) {
                let mut out = vec![f32::NAN; expected.len()];
                plane_at(level, &g, x32, w32, &mut out);
                let mut outs = vec![out];
                if let Some(wide) = &wide {
                    wide.pad(x32, &mut padded);
                    let mut grid = vec![f32::NAN; wide.len];
                    wide_plane_at(level, wide, &padded, w32, &mut grid);
                    let mut out = vec![f32::NAN; expected.len()];
                    wide.crop(&grid, &mut out);
                    outs.push(out);
                }
                for (got, want) in outs.iter().flatten().zip(expected.iter().cycle()) {
                    let error = (f64::from(*got) - want).abs();
                    assert!(
                        error <= 1e-5 * (1.0 + want.abs()),
                        "{}, stride {stride}: {got} against {want}",
                        level.name()
                    );
                }
            }
        }
    }
}
