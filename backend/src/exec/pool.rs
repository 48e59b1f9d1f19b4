//! Pooling for the executor: direct loops over each window's rows, with the bounds of the
//! window clipped once per output position (`Pool2dAttrs::input_range`) instead of per tap. The interpreter's kernels are
//! the oracle these are tested against (`runtime/tests/op_info.rs`).

use crate::Array;
use crate::interp::kernels::{FloatElem, nan_max};
use crate::interp::window::first_max;
use kiln_ir::{Pool2dAttrs, PoolKind};
use ndarray::ArrayD;

/// Runs a pooling op (or its gradient, by `kind`) on `args` into `out`, which has the
/// result's shape. Float arrays of one dtype (the schedule sends no others).
pub(crate) fn pool2d(kind: PoolKind, attrs: &Pool2dAttrs, args: &[&Array], out: &mut Array) {
    match (args, out) {
        ([Array::F32(x)], Array::F32(out)) => typed(kind, attrs, x, None, out),
        ([Array::F64(x)], Array::F64(out)) => typed(kind, attrs, x, None, out),
        ([Array::F32(x), Array::F32(g)], Array::F32(out)) => typed(kind, attrs, x, Some(g), out),
        ([Array::F64(x), Array::F64(g)], Array::F64(out)) => typed(kind, attrs, x, Some(g), out),
        _ => unreachable!("the executor runs only float pooling natively"),
    }
}

fn typed<T: FloatElem>(
    kind: PoolKind,
    attrs: &Pool2dAttrs,
    a: &ArrayD<T>,
    g: Option<&ArrayD<T>>,
    out: &mut ArrayD<T>,
) {
    // The plane the windows run over, and the pooled plane.
    let (input, pooled) = match kind {
        PoolKind::Max | PoolKind::Avg => (a.shape().to_vec(), out.shape().to_vec()),
        PoolKind::MaxGrad => (
            a.shape().to_vec(),
            g.map_or(vec![0; 4], |g| g.shape().to_vec()),
        ),
        PoolKind::AvgGrad { .. } => (out.shape().to_vec(), a.shape().to_vec()),
    };
    let (planes, h, w) = (input[0] * input[1], input[2], input[3]);
    let (oh, ow) = (pooled[2], pooled[3]);
    let a = a.as_standard_layout();
    let a = a.as_slice().expect("standard");
    let g = g.map(|g| g.as_standard_layout().into_owned());
    let g = g.as_ref().map(|g| g.as_slice().expect("standard"));
    let out = out.as_slice_mut().expect("executor buffers are contiguous");
    let area_f64 = (attrs.window[0] * attrs.window[1]) as f64;
    let area = T::from_f64(area_f64);
    if matches!(kind, PoolKind::MaxGrad | PoolKind::AvgGrad { .. }) {
        out.fill(T::zero());
    }
    for plane in 0..planes {
        let base = plane * h * w;
        for y in 0..oh {
            for x in 0..ow {
                let at = (plane * oh + y) * ow + x;
                let cols = attrs.input_range(1, x, w);
                let taps = (attrs.input_range(0, y, h))
                    .flat_map(|r| cols.clone().map(move |c| base + r * w + c));
                match kind {
                    PoolKind::Max => {
                        out[at] = taps.fold(T::neg_infinity(), |m, i| nan_max(m, a[i]));
                    }
                    PoolKind::Avg => {
                        let sum: f64 = taps.map(|i| a[i].as_f64()).sum();
                        out[at] = T::from_f64(sum / area_f64);
                    }
                    PoolKind::MaxGrad => {
                        let grad = g.expect("max_pool2d_grad has a gradient")[at];
                        if let Some(i) = first_max(taps, a) {
                            out[i] = out[i] + grad;
                        }
                    }
                    PoolKind::AvgGrad { .. } => {
                        let share = a[at] / area;
                        for i in taps {
                            out[i] = out[i] + share;
                        }
                    }
                }
            }
        }
    }
}
