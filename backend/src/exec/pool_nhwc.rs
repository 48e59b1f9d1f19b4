//! Max pooling of channels-last tensors (`[N, H, W, C]`, the `channels_last` pass's layout)
//! and its gradient, for the executor. Each tap of a window is a run of `C` contiguous
//! channels, so every step is a loop over the channels with selects, not branches, that the
//! compiler vectorises; 2×2 windows that tile the image run sixteen channels at a time in
//! AVX-512 registers where the CPU has them (`pool_avx512.rs`, through [`Tiled2x2`]). As the NCHW loops (`pool.rs`), max pooling may record each window's
//! argmax for each channel (its tap among the window's clipped taps, row-major, one byte:
//! windows of fewer than 255 taps, `argmax_fits`; the schedule sends others to the
//! interpreter) for
//! the gradient of the same input, which then adds each window's gradient there without
//! searching again; samples split across the team's threads.

use super::pool::{Argmax, NO_TAP, PARALLEL_ELEMENTS, Tiled2x2, takes_over};
use crate::interp::kernels::FloatElem;
use kiln_ir::Pool2dAttrs;
use std::ops::Range;
use std::sync::Mutex;

/// One channels-last max pooling (or gradient) call's geometry.
pub(super) struct ChannelsLast<'a> {
    pub(super) attrs: &'a Pool2dAttrs,
    /// The input's `[N, H, W, C]` and the pooled `[OH, OW]`.
    pub(super) input: [usize; 4],
    pub(super) pooled: [usize; 2],
    pub(super) threads: bool,
}

impl ChannelsLast<'_> {
    /// Whether the windows are 2×2 and tile each image exactly (`Tiled2x2`'s loops).
    fn tiled_2x2(&self) -> bool {
        let [_, h, w, _] = self.input;
        self.attrs.window == [2, 2] && super::pool::tiles(self.attrs, [h, w], self.pooled)
    }

    /// Each pooled position's input rows and columns (clipped to the input).
    fn windows(&self) -> Vec<(Range<usize>, Range<usize>)> {
        let ([_, h, w, _], [oh, ow]) = (self.input, self.pooled);
        let rows = (0..oh).map(|y| self.attrs.input_range(0, y, h));
        (rows.flat_map(|r| (0..ow).map(move |x| (r.clone(), self.attrs.input_range(1, x, w)))))
            .collect()
    }

    /// Runs `sample(n, out, taps)` for each sample, `out` and `taps` its `per_out` and
    /// `per_tap` elements, on the team's threads when allowed and worth it.
    fn per_sample<T: Send>(
        &self,
        (out, per_out): (&mut [T], usize),
        (taps, per_tap): (&mut [u8], usize),
        sample: impl Fn(usize, &mut [T], &mut [u8]) + Sync,
    ) {
        let n = self.input[0];
        if per_out == 0 {
            // No element to write (no channel, or no position).
            return;
        }
        let taps: Vec<&mut [u8]> = match per_tap {
            0 => (0..n).map(|_| &mut [][..]).collect(),
            _ => taps.chunks_mut(per_tap).collect(),
        };
        let mut samples: Vec<_> = (out.chunks_mut(per_out).zip(taps)).collect();
        let image: usize = self.input[1..].iter().product();
        let parallel = self.threads && image * n >= PARALLEL_ELEMENTS;
        if !parallel {
            for (s, (out, taps)) in samples.into_iter().enumerate() {
                sample(s, out, taps);
            }
            return;
        }
        // Small images are cheap: a task takes enough of them to outweigh its own cost. Each
        // run of samples is taken by exactly one task; the locks are never contended.
        let per_task = PARALLEL_ELEMENTS.div_ceil(image.max(1));
        let tasks: Vec<_> = samples.chunks_mut(per_task).map(Mutex::new).collect();
        crate::team::for_each(tasks.len(), |t| {
            if let Ok(mut run) = tasks[t].lock() {
                for (i, (out, taps)) in run.iter_mut().enumerate() {
                    sample(t * per_task + i, out, taps)
                }
            }
        });
    }

    /// Max pooling of `x` into `out` (`[N, OH, OW, C]`), recording each window's argmax in
    /// `record` (empty: none).
    pub(super) fn max<T: Tiled2x2 + Send + Sync>(
        &self,
        x: &[T],
        out: &mut [T],
        record: &mut Argmax,
    ) {
        let ([_, h, w, c], [oh, ow]) = (self.input, self.pooled);
        let windows = self.windows();
        let tiled_2x2 = self.tiled_2x2();
        let per_tap = if record.is_empty() { 0 } else { oh * ow * c };
        self.per_sample((out, oh * ow * c), (record, per_tap), |s, out, taps| {
            let x = &x[s * h * w * c..][..h * w * c];
            let recording = (!taps.is_empty()).then_some(&mut *taps);
            if tiled_2x2 && T::max_2x2_channels_last(x, [w, c], out, recording) {
                return;
            }
            let mut at = vec![NO_TAP; c];
            for (i, (rows, cols)) in windows.iter().enumerate() {
                let best = &mut out[i * c..][..c];
                first_max(x, (rows, cols), [w, c], best, &mut at);
                if !taps.is_empty() {
                    taps[i * c..][..c].copy_from_slice(&at);
                }
            }
        });
    }

    /// The gradient of max pooling: each window's `g` added at its argmax — `read` (recorded
    /// by the pooling of `x`) when given, else found again in `x` — into `out`, `x`'s shape.
    pub(super) fn max_grad<T: Tiled2x2 + Send + Sync>(
        &self,
        x: &[T],
        g: &[T],
        read: Option<&[u8]>,
        out: &mut [T],
    ) {
        let ([_, h, w, c], [oh, ow]) = (self.input, self.pooled);
        let windows = self.windows();
        let tiled_2x2 = self.tiled_2x2();
        let (image, pooled) = (h * w * c, oh * ow * c);
        self.per_sample((out, image), (&mut [], 0), |s, out, _| {
            if let (true, Some(read)) = (tiled_2x2, read) {
                let (taps, g) = (&read[s * pooled..][..pooled], &g[s * pooled..][..pooled]);
                if T::max_2x2_channels_last_from(taps, [w, c], g, out) {
                    return;
                }
            }
            out.fill(T::zero());
            let x = &x[s * image..][..image];
            let (mut at, mut best) = (vec![NO_TAP; c], vec![T::zero(); c]);
            for (i, (rows, cols)) in windows.iter().enumerate() {
                let window = s * oh * ow + i;
                let at = match read {
                    Some(read) => &read[window * c..][..c],
                    None => {
                        first_max(x, (rows, cols), [w, c], &mut best, &mut at);
                        &at[..]
                    }
                };
                let g = &g[window * c..][..c];
                let taps = rows
                    .clone()
                    .flat_map(|row| cols.clone().map(move |col| (row, col)));
                for (k, (row, col)) in taps.enumerate() {
                    let to = &mut out[(row * w + col) * c..][..c];
                    for ((to, &g), &at) in to.iter_mut().zip(g).zip(at) {
                        // Selects, not branches: the compiler vectorises over the channels.
                        *to = *to + if usize::from(at) == k { g } else { T::zero() };
                    }
                }
            }
        });
    }
}

/// The largest of each channel over the window `(rows, cols)` of one sample `x` (`[H, W, C]`
/// with `[w, c]` its last two sizes) into `best`, and the first tap that holds it into `at`
/// (by `pool.rs`'s rule, [`takes_over`]; `NO_TAP` and −∞ for no tap).
fn first_max<T: FloatElem>(
    x: &[T],
    (rows, cols): (&Range<usize>, &Range<usize>),
    [w, c]: [usize; 2],
    best: &mut [T],
    at: &mut [u8],
) {
    best.fill(T::neg_infinity());
    at.fill(NO_TAP);
    let taps = rows
        .clone()
        .flat_map(|row| cols.clone().map(move |col| (row, col)));
    for (k, (row, col)) in taps.enumerate() {
        let tap = &x[(row * w + col) * c..][..c];
        for ((best, at), &v) in best.iter_mut().zip(at.iter_mut()).zip(tap) {
            let take = takes_over(v, *best, *at);
            *best = if take { v } else { *best };
            *at = if take { k as u8 } else { *at };
        }
    }
    for v in best.iter_mut().filter(|v| v.is_nan()) {
        *v = T::nan();
    }
}
