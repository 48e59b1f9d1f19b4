//! Sliding windows over the two spatial axes of NCHW tensors: the geometry of `conv2d` and of
//! the pooling ops, their output sizes, and their attributes in the text form.
//!
//! Along each spatial axis, a window of `k` taps `dilation` apart slides by `stride` over the
//! input padded with `(low, high)` elements; the output has
//! `(size + low + high - dilation·(k - 1) - 1) / stride + 1` positions (PyTorch's and XLA's
//! formula). Convolution pads with zeros; max pooling with −∞; average pooling counts padding
//! as zeros in the average (PyTorch's `count_include_pad=True`).

use crate::op::Attr;

/// What is wrong with a convolution's or a pooling's window attributes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// Strides, dilation or a window with a zero.
    #[error("{name} must be at least 1, found {values:?}")]
    NotPositive {
        /// The attribute.
        name: &'static str,
        /// Its values.
        values: [usize; 2],
    },
    /// A convolution of zero groups.
    #[error("groups must be at least 1")]
    NoGroups,
    /// A pooling padded by as much as its window on one side (a window of padding alone).
    #[error("padding {padding:?} on axis {axis} must be smaller than the window {window}")]
    PaddingTooLarge {
        /// The axis's padding, before and after.
        padding: (usize, usize),
        /// The axis.
        axis: usize,
        /// The window's size along it.
        window: usize,
    },
}

/// The geometry of a 2-D convolution: strides, padding and dilation per spatial axis (H, W),
/// and the number of channel groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Conv2dAttrs {
    /// How far the window moves per output position.
    pub strides: [usize; 2],
    /// Elements added before and after each spatial axis.
    pub padding: [(usize, usize); 2],
    /// The distance between the window's taps.
    pub dilation: [usize; 2],
    /// Channel groups: each output channel sees `C / groups` input channels.
    pub groups: usize,
    /// Whether the input, the output and their gradients are laid out channels last
    /// (`[N, H, W, C]`, the `channels_last` pass's choice) rather than `[N, C, H, W]`; the
    /// weights stay `[O, C/groups, KH, KW]`.
    pub channels_last: bool,
}

impl Default for Conv2dAttrs {
    fn default() -> Conv2dAttrs {
        Conv2dAttrs {
            strides: [1, 1],
            padding: [(0, 0), (0, 0)],
            dilation: [1, 1],
            groups: 1,
            channels_last: false,
        }
    }
}

impl Conv2dAttrs {
    /// Whether a convolution with a `window` (KH, KW) is pointwise: a 1×1 window at unit
    /// strides without padding, so each output position reads its own input position (a
    /// product over the channels).
    pub fn is_pointwise(&self, window: [usize; 2]) -> bool {
        window == [1, 1] && self.strides == [1, 1] && self.padding == [(0, 0), (0, 0)]
    }

    /// The output size along spatial axis `axis` for an input of `size` and a kernel of
    /// `kernel` taps; `None` if the dilated kernel is larger than the padded input.
    pub fn output_size(&self, axis: usize, size: usize, kernel: usize) -> Option<usize> {
        output_size(
            size,
            self.padding[axis],
            kernel,
            self.dilation[axis],
            self.strides[axis],
        )
    }

    /// The input index along spatial axis `axis` that output position `out` and kernel tap
    /// `tap` read, or `None` where that falls in the padding (of an input of `size`). Inlined:
    /// kernels call it per element from other crates.
    #[inline]
    pub fn input_index(&self, axis: usize, out: usize, tap: usize, size: usize) -> Option<usize> {
        (out * self.strides[axis] + tap * self.dilation[axis])
            .checked_sub(self.padding[axis].0)
            .filter(|&i| i < size)
    }

    /// The output positions `0..outputs` along spatial axis `axis` whose input index for
    /// kernel tap `tap` falls inside an input of `size` (not in the padding), and the input
    /// index of the first of them; the others follow `strides[axis]` apart. A kernel copies
    /// that run and fills the rest with the padding value, instead of testing each position.
    pub fn inside(
        &self,
        axis: usize,
        tap: usize,
        size: usize,
        outputs: usize,
    ) -> (std::ops::Range<usize>, usize) {
        let stride = self.strides[axis];
        let offset = tap * self.dilation[axis];
        let low = self.padding[axis].0;
        // Output `o` reads input `o·stride + offset − low`, inside when in `0..size`.
        let first = low.saturating_sub(offset).div_ceil(stride).min(outputs);
        let end = (size + low)
            .saturating_sub(offset)
            .div_ceil(stride)
            .clamp(first, outputs);
        let start = first.saturating_mul(stride).saturating_add(offset);
        (first..end, start.saturating_sub(low))
    }

    /// What is wrong with the attributes themselves, if anything.
    pub fn check(&self) -> Result<(), WindowError> {
        check_positive("strides", &self.strides)?;
        check_positive("dilation", &self.dilation)?;
        if self.groups == 0 {
            return Err(WindowError::NoGroups);
        }
        Ok(())
    }

    /// The attributes the text form prints.
    pub fn attributes(&self) -> Vec<(&'static str, Attr)> {
        let mut attributes = vec![
            ("strides", ints(&self.strides)),
            ("padding", pairs(&self.padding)),
            ("dilation", ints(&self.dilation)),
            ("groups", Attr::Int(self.groups as i128)),
        ];
        layout_attribute(&mut attributes, self.channels_last);
        attributes
    }
}

/// The geometry of 2-D pooling: window, strides and padding per spatial axis (H, W).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pool2dAttrs {
    /// The window's size.
    pub window: [usize; 2],
    /// How far the window moves per output position.
    pub strides: [usize; 2],
    /// Elements added before and after each spatial axis.
    pub padding: [(usize, usize); 2],
    /// Whether the input, the output and their gradients are laid out channels last
    /// (`[N, H, W, C]`) rather than `[N, C, H, W]`.
    pub channels_last: bool,
}

impl Pool2dAttrs {
    /// A `window` moved by `strides`, without padding.
    pub fn new(window: [usize; 2], strides: [usize; 2]) -> Pool2dAttrs {
        Pool2dAttrs {
            window,
            strides,
            padding: [(0, 0), (0, 0)],
            channels_last: false,
        }
    }

    /// The window's area, the divisor of average pooling (padding counts), in `f64` so that
    /// no window size overflows it.
    pub fn window_area(&self) -> f64 {
        self.window[0] as f64 * self.window[1] as f64
    }

    /// The output size along spatial axis `axis` for an input of `size`; `None` if the
    /// window is larger than the padded input.
    pub fn output_size(&self, axis: usize, size: usize) -> Option<usize> {
        output_size(
            size,
            self.padding[axis],
            self.window[axis],
            1,
            self.strides[axis],
        )
    }

    /// The input indices along spatial axis `axis` that the window of output position `out`
    /// covers, clipped to an input of `size` (padding covers no input).
    #[inline]
    pub fn input_range(&self, axis: usize, out: usize, size: usize) -> std::ops::Range<usize> {
        let start = out * self.strides[axis];
        let low = start.saturating_sub(self.padding[axis].0).min(size);
        let high = (start + self.window[axis])
            .saturating_sub(self.padding[axis].0)
            .min(size);
        low..high.max(low)
    }

    /// What is wrong with the attributes themselves, if anything.
    pub fn check(&self) -> Result<(), WindowError> {
        check_positive("window", &self.window)?;
        check_positive("strides", &self.strides)?;
        for (axis, &padding) in self.padding.iter().enumerate() {
            let window = self.window[axis];
            if padding.0 >= window || padding.1 >= window {
                return Err(WindowError::PaddingTooLarge {
                    padding,
                    axis,
                    window,
                });
            }
        }
        Ok(())
    }

    /// The attributes the text form prints.
    pub fn attributes(&self) -> Vec<(&'static str, Attr)> {
        let mut attributes = vec![
            ("window", ints(&self.window)),
            ("strides", ints(&self.strides)),
            ("padding", pairs(&self.padding)),
        ];
        layout_attribute(&mut attributes, self.channels_last);
        attributes
    }
}

/// The permutation (a `transpose`'s `perm`) that lays an `[N, C, H, W]` tensor out channels
/// last (`[N, H, W, C]`).
pub const NCHW_TO_NHWC: [usize; 4] = [0, 2, 3, 1];
/// The inverse of [`NCHW_TO_NHWC`].
pub const NHWC_TO_NCHW: [usize; 4] = [0, 3, 1, 2];

/// The axes of height and width of an activation: `[2, 3]` (NCHW), or `[1, 2]` channels last.
pub fn spatial_axes(channels_last: bool) -> [usize; 2] {
    if channels_last { [1, 2] } else { [2, 3] }
}

/// `channels_last=true` when it is (the default layout, NCHW, is not printed).
fn layout_attribute(attributes: &mut Vec<(&'static str, Attr)>, channels_last: bool) {
    if channels_last {
        attributes.push(("channels_last", Attr::Bool(true)));
    }
}

/// Which of the convolution ops: the convolution or one of its two transposes (its
/// gradients, which are convolutions too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConvKind {
    /// `conv2d %x, %w`: `x` `[N, C, H, W]` with weights `[O, C/groups, KH, KW]` gives
    /// `[N, O, H2, W2]`; cross-correlation on the padded input, as PyTorch's `conv2d`.
    Forward,
    /// `conv2d_input_grad %g, %w`: the gradient with respect to `x` of `⟨g, conv2d(x, w)⟩`,
    /// `[N, C, H, W]` (a transposed convolution); the result type states `H` and `W`.
    InputGrad {
        /// The input's spatial size `(H, W)`.
        input: [usize; 2],
    },
    /// `conv2d_filter_grad %x, %g`: the gradient with respect to `w` of `⟨g, conv2d(x, w)⟩`,
    /// `[O, C/groups, KH, KW]`; the result type states `KH` and `KW`.
    FilterGrad {
        /// The kernel's spatial size `(KH, KW)`.
        kernel: [usize; 2],
    },
}

/// Which of the pooling ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// `max_pool2d %x`: the largest element of each window (padding is −∞).
    Max,
    /// `avg_pool2d %x`: the mean of each window, padding counted as zeros.
    Avg,
    /// `max_pool2d_grad %x, %g`: each window's `g` added at the position of its (first)
    /// largest element of `x`; the result has `x`'s type.
    MaxGrad,
    /// `avg_pool2d_grad %g`: each window's `g`, divided by the window's size, spread over the
    /// window; the result type states the input's `H` and `W`.
    AvgGrad {
        /// The input's spatial size `(H, W)`.
        input: [usize; 2],
    },
}

/// Output positions along one axis; `None` when the window does not fit once.
fn output_size(
    size: usize,
    (low, high): (usize, usize),
    kernel: usize,
    dilation: usize,
    stride: usize,
) -> Option<usize> {
    let padded = size.checked_add(low)?.checked_add(high)?;
    let span = dilation
        .checked_mul(kernel.checked_sub(1)?)?
        .checked_add(1)?;
    Some(padded.checked_sub(span)? / stride.max(1) + 1)
}

fn check_positive(name: &'static str, values: &[usize; 2]) -> Result<(), WindowError> {
    if values.contains(&0) {
        return Err(WindowError::NotPositive {
            name,
            values: *values,
        });
    }
    Ok(())
}

fn ints(values: &[usize; 2]) -> Attr {
    Attr::Ints(values.iter().map(|&v| v as i64).collect())
}

fn pairs(values: &[(usize, usize); 2]) -> Attr {
    Attr::Pairs(values.iter().map(|&(a, b)| (a as i64, b as i64)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_sizes_follow_the_usual_formula() {
        let same = Conv2dAttrs {
            padding: [(1, 1), (1, 1)],
            ..Conv2dAttrs::default()
        };
        assert_eq!(same.output_size(0, 8, 3), Some(8));
        let strided = Conv2dAttrs {
            strides: [2, 2],
            ..Conv2dAttrs::default()
        };
        assert_eq!(strided.output_size(0, 7, 3), Some(3));
        let dilated = Conv2dAttrs {
            dilation: [2, 2],
            ..Conv2dAttrs::default()
        };
        assert_eq!(dilated.output_size(0, 5, 3), Some(1));
        assert_eq!(dilated.output_size(0, 4, 3), None);
        assert_eq!(Pool2dAttrs::new([2, 2], [2, 2]).output_size(1, 7), Some(3));
        assert_eq!(Pool2dAttrs::new([9, 9], [1, 1]).output_size(1, 8), None);
    }

    #[test]
    fn inside_is_where_input_index_is_some() {
        for stride in 1..4 {
            for dilation in 1..3 {
                for low in 0..4 {
                    let attrs = Conv2dAttrs {
                        strides: [stride, 1],
                        padding: [(low, 1), (0, 0)],
                        dilation: [dilation, 1],
                        groups: 1,
                        channels_last: false,
                    };
                    for (size, tap, outputs) in [(5, 0, 4), (5, 2, 6), (1, 1, 3), (0, 0, 2)] {
                        let (run, first) = attrs.inside(0, tap, size, outputs);
                        for o in 0..outputs {
                            let index = attrs.input_index(0, o, tap, size);
                            assert_eq!(index.is_some(), run.contains(&o), "{attrs:?} {o}");
                            if let Some(i) = index {
                                assert_eq!(i, first + (o - run.start) * stride);
                            }
                        }
                    }
                }
            }
        }
    }
}
