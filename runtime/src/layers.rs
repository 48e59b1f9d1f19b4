//! Layers and losses for static programs, built from IR ops.

use crate::composite;
pub use crate::composite::Activation;
use crate::error::RuntimeResult;
use crate::init::Init;
use crate::program::Program;
use kiln_ir::{DType, Value};

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
