//! Layers and losses for static programs, built from IR ops.

use crate::error::RuntimeResult;
use crate::init::Init;
use crate::program::Program;
use kiln_ir::{ArgOp, CompareOp, DType, ReduceOp, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Identity,
    Relu,
    Tanh,
    Sigmoid,
}

pub fn activation(p: &mut Program, x: Value, a: Activation) -> RuntimeResult<Value> {
    Ok(match a {
        Activation::Identity => x,
        Activation::Relu => p.relu(x)?,
        Activation::Tanh => p.tanh(x)?,
        Activation::Sigmoid => p.sigmoid(x)?,
    })
}

/// A fully connected layer `act(x @ w + b)`, with parameters `<name>.w` (`[in, units]`;
/// Kaiming-uniform for ReLU, Xavier-uniform otherwise) and `<name>.b` (zeros). Applying it
/// twice reuses the same parameters (a GAN's discriminator sees real and fake data).
#[derive(Clone, Copy, Debug)]
pub struct Dense {
    pub w: Value,
    pub b: Value,
    pub act: Activation,
}

impl Dense {
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

    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let h = p.matmul(x, self.w)?;
        let h = p.add(h, self.b)?;
        activation(p, h, self.act)
    }
}

/// A [`Dense`] layer created and applied to `x` at once.
pub fn dense(
    p: &mut Program,
    name: &str,
    x: Value,
    units: usize,
    act: Activation,
) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let inputs = ty
        .shape
        .dims()
        .last()
        .and_then(|d| d.as_fixed())
        .ok_or_else(|| kiln_ir::BuildError {
            error: kiln_ir::TypeError {
                op: "dense",
                message: format!("the input's last dimension must be fixed, found {ty}"),
            },
            loc: kiln_ir::Loc::Unknown,
        })?;
    Dense::new(p, name, inputs, units, act)?.apply(p, x)
}

/// `log(softmax(x))` along `axis`, computed stably as `x - max - log(sum(exp(x - max)))`.
pub fn log_softmax(p: &mut Program, x: Value, axis: usize) -> RuntimeResult<Value> {
    let m = p.reduce(ReduceOp::Max, x, vec![axis], true)?;
    let z = p.sub(x, m)?;
    let e = p.exp(z)?;
    let s = p.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    let lse = p.log(s)?;
    Ok(p.sub(z, lse)?)
}

pub fn softmax(p: &mut Program, x: Value, axis: usize) -> RuntimeResult<Value> {
    let m = p.reduce(ReduceOp::Max, x, vec![axis], true)?;
    let z = p.sub(x, m)?;
    let e = p.exp(z)?;
    let s = p.reduce(ReduceOp::Sum, e, vec![axis], true)?;
    Ok(p.div(e, s)?)
}

/// Mean softmax cross-entropy of `logits` `[N, C]` against integer `labels` `[N]`.
pub fn softmax_cross_entropy(
    p: &mut Program,
    logits: Value,
    labels: Value,
) -> RuntimeResult<Value> {
    let ty = p.value_type(logits).clone();
    let classes = ty
        .shape
        .dims()
        .last()
        .and_then(|d| d.as_fixed())
        .unwrap_or(0);
    let logp = log_softmax(p, logits, ty.rank() - 1)?;
    let onehot = p.one_hot(labels, classes, ty.dtype)?;
    let picked = p.mul(logp, onehot)?;
    let per_row = p.reduce(ReduceOp::Sum, picked, vec![ty.rank() - 1], false)?;
    let m = mean(p, per_row)?;
    Ok(p.neg(m)?)
}

/// Mean binary cross-entropy of `sigmoid(logits)` against `targets` in [0, 1], computed
/// stably as `max(x, 0) - x·z + log(1 + exp(-|x|))`.
pub fn sigmoid_cross_entropy(
    p: &mut Program,
    logits: Value,
    targets: Value,
) -> RuntimeResult<Value> {
    let dtype = p.value_type(logits).dtype;
    let zero = p.scalar(dtype, 0.0)?;
    let one = p.scalar(dtype, 1.0)?;
    let pos = p.binary(kiln_ir::BinaryOp::Max, logits, zero)?;
    let xz = p.mul(logits, targets)?;
    let a = p.abs(logits)?;
    let na = p.neg(a)?;
    let e = p.exp(na)?;
    let e1 = p.add(one, e)?;
    let soft = p.log(e1)?;
    let l = p.sub(pos, xz)?;
    let l = p.add(l, soft)?;
    mean(p, l)
}

/// Mean squared error.
pub fn mse(p: &mut Program, pred: Value, target: Value) -> RuntimeResult<Value> {
    let d = p.sub(pred, target)?;
    let d2 = p.mul(d, d)?;
    mean(p, d2)
}

/// The mean over every axis: a scalar.
pub fn mean(p: &mut Program, x: Value) -> RuntimeResult<Value> {
    let axes = (0..p.value_type(x).rank()).collect();
    Ok(p.reduce(ReduceOp::Mean, x, axes, false)?)
}

/// The fraction of rows of `logits` whose arg-max equals the label, as an f32 scalar.
pub fn accuracy(p: &mut Program, logits: Value, labels: Value) -> RuntimeResult<Value> {
    let rank = p.value_type(logits).rank();
    let pred = p.arg_reduce(ArgOp::ArgMax, logits, rank - 1, false)?;
    let labels = p.cast(labels, DType::I64)?;
    let hit = p.compare(CompareOp::Eq, pred, labels)?;
    let hit = p.cast(hit, DType::F32)?;
    mean(p, hit)
}

/// Layer normalisation over the last axis with parameters `<name>.gamma` (ones) and
/// `<name>.beta` (zeros).
pub fn layer_norm(p: &mut Program, name: &str, x: Value, eps: f64) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let last = ty.rank() - 1;
    let width = ty.shape.dims()[last].as_fixed().unwrap_or(1);
    let gamma = p.parameter(&format!("{name}.gamma"), ty.dtype, &[width], Init::Ones)?;
    let beta = p.parameter(&format!("{name}.beta"), ty.dtype, &[width], Init::Zeros)?;
    let mu = p.reduce(ReduceOp::Mean, x, vec![last], true)?;
    let d = p.sub(x, mu)?;
    let d2 = p.mul(d, d)?;
    let var = p.reduce(ReduceOp::Mean, d2, vec![last], true)?;
    let eps = p.scalar(ty.dtype, eps)?;
    let ve = p.add(var, eps)?;
    let inv = p.rsqrt(ve)?;
    let xhat = p.mul(d, inv)?;
    let scaled = p.mul(xhat, gamma)?;
    Ok(p.add(scaled, beta)?)
}
