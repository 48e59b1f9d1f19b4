//! NumPy-style indexing of eager tensors: [`Tensor::index`] with positions, ranges, new axes,
//! an ellipsis and one integer tensor, and [`Tensor::masked`] with a boolean mask — each a
//! slice, a reshape and a gather, so that it differentiates and traces like any op. Python's
//! `Tensor.__getitem__` converts its key into [`Index`] items and forwards here.

use super::{EagerError, EagerResult, Tensor};
use kiln_backend::Array;
use kiln_ir::{AxisSlice, DType, Dim, Shape};

/// One item of an index, as NumPy and PyTorch spell them.
#[derive(Clone)]
pub enum Index {
    /// `t[i]`: one position, negative from the end; the axis is dropped.
    At(i64),
    /// `t[start:stop:step]`, with Python's meaning of each bound (absent: the end; negative:
    /// from the end; clamped to the axis). The step must be 1 or more.
    Range {
        /// The first position.
        start: Option<i64>,
        /// One past the last position.
        stop: Option<i64>,
        /// The stride.
        step: Option<i64>,
    },
    /// `t[None]`: a new axis of size 1.
    NewAxis,
    /// `t[...]`: every axis no other item takes.
    Ellipsis,
    /// `t[indices]`: an integer tensor gathering along its axis (one per index).
    Gather(Tensor),
}

impl Index {
    /// `:`, the whole axis.
    pub const FULL: Index = Index::Range {
        start: None,
        stop: None,
        step: None,
    };

    fn takes_an_axis(&self) -> bool {
        !matches!(self, Index::NewAxis | Index::Ellipsis)
    }
}

fn index_error(message: String) -> EagerError {
    EagerError::Index(message)
}

impl Tensor {
    /// The tensor indexed by `items` (see [`Index`]): a slice of the ranges and positions, a
    /// reshape for the dropped and added axes, and a gather for an integer tensor. Axes of a
    /// traced size take only [`Index::FULL`].
    pub fn index(&self, items: &[Index]) -> EagerResult<Tensor> {
        let dims = self.ty().shape.dims().to_vec();
        let rank = dims.len();
        let taken = items.iter().filter(|i| i.takes_an_axis()).count();
        if taken > rank {
            return Err(index_error(format!(
                "{taken} indices for a tensor of rank {rank}"
            )));
        }
        let mut plan = Plan::default();
        let mut axis = 0;
        for item in items {
            match item {
                Index::NewAxis => plan.dims.push(Dim::Fixed(1)),
                Index::Ellipsis => {
                    for _ in 0..rank - taken {
                        plan.keep(&dims[axis]);
                        axis += 1;
                    }
                }
                item => {
                    plan.take(item, axis, &dims[axis])?;
                    axis += 1;
                }
            }
        }
        for d in &dims[axis..] {
            plan.keep(d);
        }
        plan.apply(self)
    }

    /// The elements where `mask` is true, in order: a mask of the tensor's shape picks
    /// elements, one of its first axis picks rows. Eager only (the result's size depends on
    /// the mask's values).
    pub fn masked(&self, mask: &Array) -> EagerResult<Tensor> {
        if self.is_traced() {
            return Err(EagerError::Usage(
                "a boolean mask while tracing with to_static: the result's size would depend on \
                 the values; use cond, or multiply by the mask as a number"
                    .into(),
            ));
        }
        let shape = self.to_array()?.shape().to_vec();
        let chosen: Vec<i64> = (mask.to_f64_vec().iter().enumerate())
            .filter(|(_, v)| **v != 0.0)
            .map(|(i, _)| i as i64)
            .collect();
        let indices = Tensor::new(Array::I64(ndarray::Array1::from(chosen).into_dyn()));
        if mask.shape() == shape.as_slice() {
            let flat = self.reshape(Shape::fixed(&[shape.iter().product()]))?;
            flat.gather(&indices, 0)
        } else if mask.shape().len() == 1 && shape.first() == Some(&mask.len()) {
            self.gather(&indices, 0)
        } else {
            Err(index_error(format!(
                "a boolean mask of shape {:?} for a tensor of shape {shape:?}: give one of its \
                 shape or of its first axis",
                mask.shape()
            )))
        }
    }
}

/// What an index does: the slice of each source axis, the result's dimensions, and the
/// gather (the result axis it runs along, the indices).
#[derive(Default)]
struct Plan {
    ranges: Vec<AxisSlice>,
    dims: Vec<Dim>,
    gather: Option<(usize, Tensor)>,
}

impl Plan {
    fn keep(&mut self, d: &Dim) {
        self.ranges.push(AxisSlice::Full);
        self.dims.push(d.clone());
    }

    /// Item `item`, which takes source axis `axis` of size `d`.
    fn take(&mut self, item: &Index, axis: usize, d: &Dim) -> EagerResult<()> {
        let fixed = || {
            d.as_fixed().ok_or_else(|| {
                index_error(format!(
                    "axis {axis} has the traced size {d}: index it with `:` only"
                ))
            })
        };
        match item {
            Index::Range {
                start: None,
                stop: None,
                step: None | Some(1),
            } => self.keep(d),
            &Index::Range { start, stop, step } => {
                let n = fixed()?;
                let step = step.unwrap_or(1);
                if step < 1 {
                    return Err(index_error(
                        "slices step forward (a step of 1 or more)".into(),
                    ));
                }
                let bound = |b: Option<i64>, default: usize| {
                    b.map_or(default, |b| {
                        let b = if b < 0 { b + n as i64 } else { b };
                        b.clamp(0, n as i64) as usize
                    })
                };
                let start = bound(start, 0);
                let range = AxisSlice::Range {
                    start,
                    end: bound(stop, n).max(start),
                    step: step as usize,
                };
                self.dims.push(Dim::Fixed(range.len(n)));
                self.ranges.push(range);
            }
            &Index::At(i) => {
                let n = fixed()? as i64;
                let at = if i < 0 { i + n } else { i };
                if !(0..n).contains(&at) {
                    return Err(index_error(format!(
                        "index {i} is out of range for axis {axis} of size {n}"
                    )));
                }
                let at = at as usize;
                self.ranges.push(AxisSlice::Range {
                    start: at,
                    end: at + 1,
                    step: 1,
                });
            }
            Index::Gather(indices) => {
                if self.gather.is_some() {
                    return Err(index_error(
                        "one integer array per index: index again for another axis".into(),
                    ));
                }
                if indices.dtype().is_float() || indices.dtype() == DType::Bool {
                    return Err(index_error(format!(
                        "an index of {}: use ints, slices, one integer array or a boolean mask",
                        indices.dtype()
                    )));
                }
                self.gather = Some((self.dims.len(), indices.clone()));
                self.keep(d);
            }
            Index::NewAxis | Index::Ellipsis => unreachable!("items that take no axis"),
        }
        Ok(())
    }

    fn apply(self, t: &Tensor) -> EagerResult<Tensor> {
        let mut result = t.clone();
        if self.ranges.iter().any(|r| *r != AxisSlice::Full) {
            result = result.slice(self.ranges)?;
        }
        if result.ty().shape.dims() != self.dims.as_slice() {
            result = result.reshape(Shape(self.dims))?;
        }
        if let Some((at, indices)) = self.gather {
            result = result.gather(&indices, at)?;
        }
        Ok(result)
    }
}
