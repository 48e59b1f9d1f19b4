//! Layers and losses for static programs, built from IR ops.

use crate::composite;
pub use crate::composite::Activation;
use crate::error::RuntimeResult;
use crate::init::Init;
use crate::program::Program;
use kiln_ir::{Conv2dAttrs, DType, Pool2dAttrs, Value};

/// `act(x)` (see [`composite::activation`]).
#[track_caller]
pub fn activation(p: &mut Program, x: Value, a: Activation) -> RuntimeResult<Value> {
    Ok(composite::activation(p, x, a)?)
}

/// A fully connected layer `act(x @ w + b)`, with parameters `<name>.w` (`[in, units]`;
/// Kaiming-uniform for ReLU, Xavier-uniform otherwise) and `<name>.b` (zeros). Applying it
/// twice reuses the same parameters (a GAN's discriminator sees real and fake data).
#[derive(Clone, Copy, Debug)]
pub struct Dense {
    /// The weights, `[inputs, units]`.
    pub w: Value,
    /// The bias, `[units]`.
    pub b: Value,
    /// The activation applied after.
    pub act: Activation,
}

impl Dense {
    /// Declares the layer's parameters `<name>.w` and `<name>.b`.
    pub fn new(
        p: &mut Program,
        name: &str,
        inputs: usize,
        units: usize,
        act: Activation,
    ) -> RuntimeResult<Dense> {
        let init = if act == Activation::Relu {
            Init::KaimingUniform
        } else {
            Init::XavierUniform
        };
        let w = p.parameter(&format!("{name}.w"), DType::F32, &[inputs, units], init)?;
        let b = p.parameter(&format!("{name}.b"), DType::F32, &[units], Init::Zeros)?;
        Ok(Dense { w, b, act })
    }

    /// `act(x @ w + b)`.
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let h = p.matmul(x, self.w)?;
        let h = p.add(h, self.b)?;
        activation(p, h, self.act)
    }
}

/// A [`Dense`] layer created and applied to `x` at once.
#[track_caller]
pub fn dense(
    p: &mut Program,
    name: &str,
    x: Value,
    units: usize,
    act: Activation,
) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let inputs = composite::fixed_last_dim("dense", "input", &ty)?;
    Dense::new(p, name, inputs, units, act)?.apply(p, x)
}

/// A 2-D convolution layer `act(conv2d(x, w) + b)` over NCHW, with parameters `<name>.w`
/// (`[out, in/groups, KH, KW]`; Kaiming-uniform for ReLU, Xavier-uniform otherwise, with the
/// convolution's fans) and `<name>.b` (zeros).
#[derive(Clone, Copy, Debug)]
pub struct Conv2d {
    /// The weights.
    pub w: Value,
    /// The bias, `[out]`.
    pub b: Value,
    /// Strides, padding, dilation, groups.
    pub attrs: Conv2dAttrs,
    /// The activation applied after.
    pub act: Activation,
}

impl Conv2d {
    /// Declares the layer's parameters for `inputs` channels in and `outputs` out.
    pub fn new(
        p: &mut Program,
        name: &str,
        [inputs, outputs]: [usize; 2],
        kernel: [usize; 2],
        attrs: Conv2dAttrs,
        act: Activation,
    ) -> RuntimeResult<Conv2d> {
        let init = if act == Activation::Relu {
            Init::KaimingUniform
        } else {
            Init::XavierUniform
        };
        let shape = [outputs, inputs / attrs.groups.max(1), kernel[0], kernel[1]];
        let w = p.parameter(&format!("{name}.w"), DType::F32, &shape, init)?;
        let b = p.parameter(&format!("{name}.b"), DType::F32, &[outputs], Init::Zeros)?;
        Ok(Conv2d { w, b, attrs, act })
    }

    /// `act(conv2d(x, w) + b)`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let h = composite::conv2d_bias(p, x, self.w, self.b, self.attrs)?;
        activation(p, h, self.act)
    }
}

/// A [`Conv2d`] layer with `outputs` channels and a `kernel`, created and applied to NCHW `x`.
#[track_caller]
pub fn conv2d(
    p: &mut Program,
    name: &str,
    x: Value,
    outputs: usize,
    kernel: [usize; 2],
    attrs: Conv2dAttrs,
    act: Activation,
) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let inputs = match ty.shape.dims() {
        [_, c, _, _] => c.as_fixed(),
        _ => None,
    }
    .ok_or_else(|| {
        composite::error(
            "conv2d",
            format!("the input must be NCHW with fixed channels, found {ty}"),
        )
    })?;
    Conv2d::new(p, name, [inputs, outputs], kernel, attrs, act)?.apply(p, x)
}

/// The largest element of each window of NCHW `x`.
#[track_caller]
pub fn max_pool2d(p: &mut Program, x: Value, attrs: Pool2dAttrs) -> RuntimeResult<Value> {
    Ok(p.max_pool2d(x, attrs)?)
}

/// The mean of each window of NCHW `x` (padding counts as zeros).
#[track_caller]
pub fn avg_pool2d(p: &mut Program, x: Value, attrs: Pool2dAttrs) -> RuntimeResult<Value> {
    Ok(p.avg_pool2d(x, attrs)?)
}

/// The mean over the spatial axes of NCHW `x`: `[N, C]`.
#[track_caller]
pub fn global_avg_pool(p: &mut Program, x: Value) -> RuntimeResult<Value> {
    Ok(composite::global_avg_pool(p, x)?)
}

/// Every axis but the first in one: `[N, C, H, W]` → `[N, C·H·W]`.
#[track_caller]
pub fn flatten(p: &mut Program, x: Value) -> RuntimeResult<Value> {
    Ok(composite::flatten(p, x)?)
}

/// `log(softmax(x))` along `axis` (see [`composite::log_softmax`]).
#[track_caller]
pub fn log_softmax(p: &mut Program, x: Value, axis: usize) -> RuntimeResult<Value> {
    Ok(composite::log_softmax(p, x, axis)?)
}

/// `softmax(x)` along `axis` (see [`composite::softmax`]).
#[track_caller]
pub fn softmax(p: &mut Program, x: Value, axis: usize) -> RuntimeResult<Value> {
    Ok(composite::softmax(p, x, axis)?)
}

/// Mean softmax cross-entropy of `logits` `[N, C]` against integer `labels` `[N]`.
#[track_caller]
pub fn softmax_cross_entropy(
    p: &mut Program,
    logits: Value,
    labels: Value,
) -> RuntimeResult<Value> {
    Ok(composite::softmax_cross_entropy(p, logits, labels)?)
}

/// Mean binary cross-entropy of `sigmoid(logits)` against `targets` in [0, 1].
#[track_caller]
pub fn sigmoid_cross_entropy(
    p: &mut Program,
    logits: Value,
    targets: Value,
) -> RuntimeResult<Value> {
    Ok(composite::sigmoid_cross_entropy(p, logits, targets)?)
}

/// Mean squared error.
#[track_caller]
pub fn mse(p: &mut Program, pred: Value, target: Value) -> RuntimeResult<Value> {
    Ok(composite::mse(p, pred, target)?)
}

/// The mean over every axis: a scalar.
#[track_caller]
pub fn mean(p: &mut Program, x: Value) -> RuntimeResult<Value> {
    Ok(composite::mean_all(p, x)?)
}

/// The fraction of rows of `logits` whose arg-max equals the label, as an f32 scalar.
#[track_caller]
pub fn accuracy(p: &mut Program, logits: Value, labels: Value) -> RuntimeResult<Value> {
    Ok(composite::accuracy(p, logits, labels)?)
}

/// Layer normalisation over the last axis with parameters `<name>.gamma` (ones) and
/// `<name>.beta` (zeros).
#[track_caller]
pub fn layer_norm(p: &mut Program, name: &str, x: Value, eps: f64) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let width = composite::fixed_last_dim("layer_norm", "input", &ty)?;
    let gamma = p.parameter(&format!("{name}.gamma"), ty.dtype, &[width], Init::Ones)?;
    let beta = p.parameter(&format!("{name}.beta"), ty.dtype, &[width], Init::Zeros)?;
    Ok(composite::layer_norm(p, x, gamma, beta, eps)?)
}
