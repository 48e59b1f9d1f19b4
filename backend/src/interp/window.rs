//! The interpreter's kernels for the window ops: `conv2d` and its two transposes, and the
//! pooling ops with their gradients, on NCHW arrays.
//!
//! Every convolution is one loop over the taps that land inside the input: output position
//! `(oh, ow)` and kernel tap `(kh, kw)` read input row `oh·stride − pad_low + kh·dilation`.
//! The three ops differ only in which of input, weights and output they accumulate into, so
//! they share that loop ([`for_each_tap`]). Sums accumulate in f64 and round once, as the
//! other reductions do.

use super::kernels::{FloatElem, KernelResult, OpError, transpose};
use crate::array::Array;
use kiln_ir::{Conv2dAttrs, ConvKind, NCHW_TO_NHWC, NHWC_TO_NCHW, Pool2dAttrs, PoolKind};
use ndarray::{ArrayD, IxDyn};
use std::borrow::Cow;

/// Sizes of one convolution: input `[n, c, h, w]`, weights `[o, c / groups, kh, kw]`,
/// output `[n, o, oh, ow]`, and the channel groups. The executor's convolutions share it.
#[derive(Clone, Copy)]
pub(crate) struct ConvDims {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) o: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
    pub(crate) groups: usize,
}

impl ConvDims {
    /// The sizes of input `x`, weights `w` and output `y` (shapes), or what is wrong.
    pub(crate) fn of(x: &[usize], w: &[usize], y: &[usize], groups: usize) -> KernelResult<Self> {
        match (x, w, y) {
            (&[n, c, h, wd], &[o, _, kh, kw], &[_, _, oh, ow]) => Ok(ConvDims {
                n,
                c,
                h,
                w: wd,
                o,
                kh,
                kw,
                oh,
                ow,
                groups,
            }),
            _ => Err(OpError(format!(
                "`conv2d` needs NCHW input, OIHW weights and NCHW output, found {x:?}, {w:?}, {y:?}"
            ))),
        }
    }
    /// Input channels per group.
    pub(crate) fn cg(&self) -> usize {
        self.c / self.groups
    }
    /// Output channels per group.
    pub(crate) fn og(&self) -> usize {
        self.o / self.groups
    }
    /// Kernel taps: `KH · KW`.
    pub(crate) fn taps(&self) -> usize {
        self.kh * self.kw
    }
    /// Weights per output channel (the executor's patch-matrix columns): `C/g · KH · KW`.
    pub(crate) fn k(&self) -> usize {
        self.cg() * self.taps()
    }
    /// Output positions per sample.
    pub(crate) fn p(&self) -> usize {
        self.oh * self.ow
    }
    /// Elements of one sample's group of input channels.
    pub(crate) fn image(&self) -> usize {
        self.cg() * self.h * self.w
    }
}

/// Runs `conv2d` (or a transpose) of `attrs` on `a` and `b`; `out_shape` is the result's.
/// A channels-last op (`[N, H, W, C]` activations: `activations` marks each operand's, then
/// the result's) by its NCHW loops `nchw`: the activations transposed to NCHW, the result back.
fn in_nchw(
    activations: [bool; 3],
    args: &[&Array],
    out_shape: &[usize],
    nchw: impl FnOnce(&[&Array], &[usize]) -> KernelResult<Array>,
) -> KernelResult<Array> {
    let transposed: Vec<Cow<Array>> = (args.iter().zip(activations))
        .map(|(a, activation)| match activation {
            true => transpose(a, &NHWC_TO_NCHW).map(Cow::Owned),
            false => Ok(Cow::Borrowed(*a)),
        })
        .collect::<KernelResult<_>>()?;
    let args: Vec<&Array> = transposed.iter().map(|a| a.as_ref()).collect();
    if !activations[2] {
        return nchw(&args, out_shape);
    }
    let shape: Vec<usize> = match out_shape {
        [_, _, _, _] => NHWC_TO_NCHW.iter().map(|&a| out_shape[a]).collect(),
        _ => {
            return Err(OpError(format!(
                "a channels-last result must be NHWC, found {out_shape:?}"
            )));
        }
    };
    transpose(&nchw(&args, &shape)?, &NCHW_TO_NHWC)
}

pub(super) fn conv2d(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    a: &Array,
    b: &Array,
    out_shape: &[usize],
) -> KernelResult<Array> {
    if attrs.channels_last {
        let activations = match kind {
            ConvKind::Forward | ConvKind::InputGrad { .. } => [true, false, true],
            ConvKind::FilterGrad { .. } => [true, true, false],
        };
        let nchw = Conv2dAttrs {
            channels_last: false,
            ..*attrs
        };
        return in_nchw(activations, &[a, b], out_shape, |args, shape| {
            conv2d(kind, &nchw, args[0], args[1], shape)
        });
    }
    match (a, b) {
        (Array::F32(a), Array::F32(b)) => Ok(Array::F32(conv_typed(kind, attrs, a, b, out_shape)?)),
        (Array::F64(a), Array::F64(b)) => Ok(Array::F64(conv_typed(kind, attrs, a, b, out_shape)?)),
        _ => Err(OpError(format!(
            "`conv2d` takes two arrays of one float dtype, found {} and {}",
            a.ty(),
            b.ty()
        ))),
    }
}

fn conv_typed<T: FloatElem>(
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    out_shape: &[usize],
) -> KernelResult<ArrayD<T>> {
    let (x_shape, w_shape, y_shape) = match kind {
        ConvKind::Forward => (a.shape(), b.shape(), out_shape),
        ConvKind::InputGrad { .. } => (out_shape, b.shape(), a.shape()),
        ConvKind::FilterGrad { .. } => (a.shape(), out_shape, b.shape()),
    };
    let d = ConvDims::of(x_shape, w_shape, y_shape, attrs.groups)?;
    let (a, b) = (a.as_standard_layout(), b.as_standard_layout());
    let (a, b) = (
        a.as_slice().expect("standard"),
        b.as_slice().expect("standard"),
    );
    let mut acc = vec![0.0f64; out_shape.iter().product()];
    match kind {
        ConvKind::Forward => for_each_tap(&d, attrs, |xi, wi, yi| {
            acc[yi] += a[xi].as_f64() * b[wi].as_f64();
        }),
        ConvKind::InputGrad { .. } => for_each_tap(&d, attrs, |xi, wi, yi| {
            acc[xi] += a[yi].as_f64() * b[wi].as_f64();
        }),
        ConvKind::FilterGrad { .. } => for_each_tap(&d, attrs, |xi, wi, yi| {
            acc[wi] += a[xi].as_f64() * b[yi].as_f64();
        }),
    }
    finish(acc, out_shape)
}

/// Calls `f(input index, weight index, output index)` for every tap that lands inside the
/// input (flat row-major indices).
fn for_each_tap(d: &ConvDims, attrs: &Conv2dAttrs, mut f: impl FnMut(usize, usize, usize)) {
    let (cg, og) = (d.cg(), d.og());
    for n in 0..d.n {
        for o in 0..d.o {
            let g = o / og;
            for oh in 0..d.oh {
                for ow in 0..d.ow {
                    let yi = ((n * d.o + o) * d.oh + oh) * d.ow + ow;
                    for ci in 0..cg {
                        let c = g * cg + ci;
                        for kh in 0..d.kh {
                            let Some(ih) = attrs.input_index(0, oh, kh, d.h) else {
                                continue;
                            };
                            for kw in 0..d.kw {
                                let Some(iw) = attrs.input_index(1, ow, kw, d.w) else {
                                    continue;
                                };
                                let xi = ((n * d.c + c) * d.h + ih) * d.w + iw;
                                let wi = ((o * cg + ci) * d.kh + kh) * d.kw + kw;
                                f(xi, wi, yi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Runs a pooling op (or its gradient) of `attrs` on `args`; `out_shape` is the result's.
pub(super) fn pool2d(
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    args: &[&Array],
    out_shape: &[usize],
) -> KernelResult<Array> {
    if attrs.channels_last {
        let nchw = Pool2dAttrs {
            channels_last: false,
            ..*attrs
        };
        return in_nchw([true; 3], args, out_shape, |args, shape| {
            pool2d(kind, &nchw, args, shape)
        });
    }
    match args {
        [Array::F32(x)] => Ok(Array::F32(pool_typed(kind, attrs, x, None, out_shape)?)),
        [Array::F64(x)] => Ok(Array::F64(pool_typed(kind, attrs, x, None, out_shape)?)),
        [Array::F32(x), Array::F32(g)] => {
            Ok(Array::F32(pool_typed(kind, attrs, x, Some(g), out_shape)?))
        }
        [Array::F64(x), Array::F64(g)] => {
            Ok(Array::F64(pool_typed(kind, attrs, x, Some(g), out_shape)?))
        }
        _ => Err(OpError(format!(
            "pooling takes float arrays of one dtype, found {}",
            args.iter()
                .map(|a| a.ty().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

fn pool_typed<T: FloatElem>(
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    a: &ArrayD<T>,
    g: Option<&ArrayD<T>>,
    out_shape: &[usize],
) -> KernelResult<ArrayD<T>> {
    // The window runs over the input; `pooled` is the pooled (output) shape.
    let (input, pooled) = match kind {
        PoolKind::Max | PoolKind::Avg => (a.shape().to_vec(), out_shape.to_vec()),
        PoolKind::MaxGrad => (
            a.shape().to_vec(),
            g.map_or(Vec::new(), |g| g.shape().to_vec()),
        ),
        PoolKind::AvgGrad { .. } => (out_shape.to_vec(), a.shape().to_vec()),
    };
    let (&[n, c, h, w], &[_, _, oh, ow]) = (&input[..], &pooled[..]) else {
        return Err(OpError(format!(
            "pooling needs NCHW arrays, found {input:?} and {pooled:?}"
        )));
    };
    let a = a.as_standard_layout();
    let a = a.as_slice().expect("standard");
    let g = g.map(|g| g.as_standard_layout().into_owned());
    let g = g.as_ref().map(|g| g.as_slice().expect("standard"));
    let area = attrs.window_area();
    let mut acc = vec![0.0f64; out_shape.iter().product()];
    for plane in 0..n * c {
        for y in 0..oh {
            for x in 0..ow {
                let out = (plane * oh + y) * ow + x;
                let taps = window_taps(attrs, y, x, h, w).map(|(ih, iw)| (plane * h + ih) * w + iw);
                match kind {
                    PoolKind::Max => {
                        acc[out] = taps
                            .map(|i| a[i].as_f64())
                            .fold(f64::NEG_INFINITY, super::kernels::nan_max)
                    }
                    // From +0 as the compiled loops start (`sum` of nothing is -0).
                    PoolKind::Avg => {
                        acc[out] = taps.map(|i| a[i].as_f64()).fold(0.0, |s, v| s + v) / area
                    }
                    PoolKind::MaxGrad => {
                        let g = g.expect("max_pool2d_grad has a gradient operand");
                        if let Some(at) = first_max(taps, a) {
                            acc[at] += g[out].as_f64();
                        }
                    }
                    PoolKind::AvgGrad { .. } => {
                        for i in taps {
                            acc[i] += a[out].as_f64() / area;
                        }
                    }
                }
            }
        }
    }
    finish(acc, out_shape)
}

/// The input positions of the window at output `(y, x)` that lie inside the input, rows
/// outermost.
fn window_taps(
    attrs: &Pool2dAttrs,
    y: usize,
    x: usize,
    h: usize,
    w: usize,
) -> impl Iterator<Item = (usize, usize)> + use<> {
    let cols = attrs.input_range(1, x, w);
    attrs
        .input_range(0, y, h)
        .flat_map(move |ih| cols.clone().map(move |iw| (ih, iw)))
}

/// The first position holding the largest value (the first NaN, if any): where a max
/// pooling gradient goes.
pub(crate) fn first_max<T: FloatElem>(taps: impl Iterator<Item = usize>, a: &[T]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for i in taps {
        let v = a[i].as_f64();
        match best {
            Some((_, b)) if b.is_nan() || !(v > b || v.is_nan()) => {}
            _ => best = Some((i, v)),
        }
    }
    best.map(|(i, _)| i)
}

fn finish<T: FloatElem>(acc: Vec<f64>, shape: &[usize]) -> KernelResult<ArrayD<T>> {
    let values = acc.into_iter().map(T::from_f64).collect();
    ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| OpError(e.to_string()))
}
