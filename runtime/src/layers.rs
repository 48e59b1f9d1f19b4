//! Layers and losses for static programs, built from IR ops.

use crate::composite;
pub use crate::composite::Activation;
use crate::error::RuntimeResult;
use crate::init::Init;
use crate::program::{Program, Target};
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

/// Batch normalisation over the channel axis (1) of `[N, C]` or `[N, C, H, W]` (PyTorch's
/// `BatchNorm1d`/`BatchNorm2d`), with parameters `<name>.gamma` (ones) and `<name>.beta`
/// (zeros) and running statistics `<name>.running_mean` (zeros) and `<name>.running_var`
/// (ones), which are state but not trained.
///
/// [`BatchNorm::train`] normalises with the batch's statistics and returns a target that
/// stores the running averages (fetch it with the optimizer's); [`BatchNorm::eval`]
/// normalises with the running statistics.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    /// The scale `[C]`.
    pub gamma: Value,
    /// The shift `[C]`.
    pub beta: Value,
    /// The running mean and its value in the program.
    pub running_mean: (kiln_ir::StateDecl, Value),
    /// The running (unbiased) variance and its value in the program.
    pub running_var: (kiln_ir::StateDecl, Value),
    /// The weight of a batch in the running averages (PyTorch's default: 0.1).
    pub momentum: f64,
    /// Added to the variance.
    pub eps: f64,
    name: String,
}

impl BatchNorm {
    /// Declares the layer's parameters and running statistics for `channels`.
    pub fn new(p: &mut Program, name: &str, channels: usize) -> RuntimeResult<BatchNorm> {
        let gamma = p.parameter(
            &format!("{name}.gamma"),
            DType::F32,
            &[channels],
            Init::Ones,
        )?;
        let beta = p.parameter(
            &format!("{name}.beta"),
            DType::F32,
            &[channels],
            Init::Zeros,
        )?;
        let ty = kiln_ir::Type::new(DType::F32, kiln_ir::Shape::fixed(&[channels]));
        let constant = kiln_ir::Initializer::constant;
        let running_mean = p.state(&format!("{name}.running_mean"), ty.clone(), constant(0.0))?;
        let running_var = p.state(&format!("{name}.running_var"), ty, constant(1.0))?;
        Ok(BatchNorm {
            gamma,
            beta,
            running_mean,
            running_var,
            momentum: 0.1,
            eps: 1e-5,
            name: name.to_owned(),
        })
    }

    /// Training mode: `x` normalised with its batch statistics, and the target storing the
    /// running averages of them.
    #[track_caller]
    pub fn train(&self, p: &mut Program, x: Value) -> RuntimeResult<(Value, Target)> {
        let [mean, var, unbiased] = composite::batch_moments(p, x)?;
        let y = composite::batch_norm(p, x, [mean, var], [self.gamma, self.beta], self.eps)?;
        let mut stores = Vec::new();
        for ((decl, running), batch) in [(&self.running_mean, mean), (&self.running_var, unbiased)]
        {
            let next = composite::running_average(p, *running, batch, self.momentum)?;
            stores.push(p.store(decl, next)?);
        }
        let target = p.add_target(&format!("{}.stats", self.name), stores)?;
        Ok((y, target))
    }

    /// Evaluation mode: `x` normalised with the running statistics.
    #[track_caller]
    pub fn eval(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let stats = [self.running_mean.1, self.running_var.1];
        Ok(composite::batch_norm(
            p,
            x,
            stats,
            [self.gamma, self.beta],
            self.eps,
        )?)
    }
}

/// Single-head self-attention over `[N, T, D]` (see [`composite::self_attention`]), with
/// parameters `<name>.wq`, `<name>.wk`, `<name>.wv` `[D, d]` and `<name>.wo` `[d, D]`
/// (Xavier-uniform).
#[derive(Clone, Copy, Debug)]
pub struct SelfAttention {
    /// Query, key, value and output weights.
    pub weights: [Value; 4],
}

impl SelfAttention {
    /// Declares the layer's parameters for `features` in and out and `dim` inside.
    pub fn new(
        p: &mut Program,
        name: &str,
        features: usize,
        dim: usize,
    ) -> RuntimeResult<SelfAttention> {
        let [wq, wk, wv, wo] = composite::attention_weights(name, features, dim)
            .map(|(name, shape)| p.parameter(&name, DType::F32, &shape, Init::XavierUniform));
        Ok(SelfAttention {
            weights: [wq?, wk?, wv?, wo?],
        })
    }

    /// The attention's output `[N, T, D]`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        Ok(composite::self_attention(p, x, self.weights)?)
    }
}

/// Multi-head self-attention over `[N, T, D]` with biased projections, as PyTorch's
/// `nn.MultiheadAttention`: `q, k, v = x·w + b` ([`Dense`] layers `<name>.q`, `.k`, `.v`,
/// `[D, D]` each), each of `heads` heads attends with `D/heads` features (causally if asked,
/// see [`composite::multi_head_attention`]), and `<name>.o` projects the joined heads.
#[derive(Clone, Copy, Debug)]
pub struct MultiHeadAttention {
    /// The query, key, value and output projections.
    pub projections: [Dense; 4],
    /// The number of heads.
    pub heads: usize,
    /// Whether token `i` sees only tokens `j ≤ i`.
    pub causal: bool,
}

impl MultiHeadAttention {
    /// Declares the projections for `width` features in and out.
    pub fn new(
        p: &mut Program,
        name: &str,
        width: usize,
        heads: usize,
        causal: bool,
    ) -> RuntimeResult<MultiHeadAttention> {
        let projection = |p: &mut Program, part| {
            Dense::new(
                p,
                &format!("{name}.{part}"),
                width,
                width,
                Activation::Identity,
            )
        };
        Ok(MultiHeadAttention {
            projections: [
                projection(p, "q")?,
                projection(p, "k")?,
                projection(p, "v")?,
                projection(p, "o")?,
            ],
            heads,
            causal,
        })
    }

    /// The attention's output `[N, T, D]`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let [wq, wk, wv, wo] = self.projections;
        let qkv = [wq.apply(p, x)?, wk.apply(p, x)?, wv.apply(p, x)?];
        let context = composite::multi_head_attention(p, qkv, self.heads, self.causal)?;
        wo.apply(p, context)
    }
}

/// A pre-norm transformer encoder layer over `[N, T, D]` (PyTorch's
/// `nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout=0)`):
/// `x + attention(norm1(x))`, then `x + ff2(gelu(ff1(norm2(x))))`. Parameters
/// `<name>.norm1`, `.attention` ([`MultiHeadAttention`]), `.norm2` ([`LayerNorm`]), `.ff1`
/// (`[D, F]`) and `.ff2` (`[F, D]`).
#[derive(Clone, Copy, Debug)]
pub struct TransformerEncoderLayer {
    /// The norm before the attention.
    pub norm1: LayerNorm,
    /// The self-attention.
    pub attention: MultiHeadAttention,
    /// The norm before the feed-forward block.
    pub norm2: LayerNorm,
    /// The feed-forward block's widening layer (GELU).
    pub ff1: Dense,
    /// The feed-forward block's narrowing layer.
    pub ff2: Dense,
}

impl TransformerEncoderLayer {
    /// Declares a layer of `width` features, `heads` heads and a feed-forward block `ff` wide.
    pub fn new(
        p: &mut Program,
        name: &str,
        [width, heads, ff]: [usize; 3],
        causal: bool,
    ) -> RuntimeResult<TransformerEncoderLayer> {
        let sub = |part: &str| format!("{name}.{part}");
        Ok(TransformerEncoderLayer {
            norm1: LayerNorm::new(p, &sub("norm1"), width, 1e-5)?,
            attention: MultiHeadAttention::new(p, &sub("attention"), width, heads, causal)?,
            norm2: LayerNorm::new(p, &sub("norm2"), width, 1e-5)?,
            ff1: Dense::new(p, &sub("ff1"), width, ff, Activation::Gelu)?,
            ff2: Dense::new(p, &sub("ff2"), ff, width, Activation::Identity)?,
        })
    }

    /// The layer's output `[N, T, D]`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        let a = self.norm1.apply(p, x)?;
        let a = self.attention.apply(p, a)?;
        let x = p.add(x, a)?;
        let f = self.norm2.apply(p, x)?;
        let f = self.ff1.apply(p, f)?;
        let f = self.ff2.apply(p, f)?;
        Ok(p.add(x, f)?)
    }
}

/// An LSTM layer over sequences `[N, T, D]` (see [`composite::lstm`]), with parameters
/// `<name>.w_ih` `[D, 4H]`, `<name>.w_hh` `[H, 4H]` (both `U(−1/√H, 1/√H)`, as PyTorch) and
/// `<name>.b` `[4H]` (zeros).
#[derive(Clone, Copy, Debug)]
pub struct Lstm {
    /// Input weights.
    pub w_ih: Value,
    /// Recurrent weights.
    pub w_hh: Value,
    /// The bias.
    pub b: Value,
}

impl Lstm {
    /// Declares the layer's parameters for `inputs` features and `hidden` units.
    pub fn new(p: &mut Program, name: &str, inputs: usize, hidden: usize) -> RuntimeResult<Lstm> {
        let init = recurrent_init(hidden);
        Ok(Lstm {
            w_ih: p.parameter(
                &format!("{name}.w_ih"),
                DType::F32,
                &[inputs, 4 * hidden],
                init,
            )?,
            w_hh: p.parameter(
                &format!("{name}.w_hh"),
                DType::F32,
                &[hidden, 4 * hidden],
                init,
            )?,
            b: p.parameter(&format!("{name}.b"), DType::F32, &[4 * hidden], Init::Zeros)?,
        })
    }

    /// Every step's hidden state `[N, T, H]` and the last one `[N, H]`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<(Value, Value)> {
        let (sequence, [h, _]) = composite::lstm(p, x, self.w_ih, self.w_hh, self.b)?;
        Ok((sequence, h))
    }
}

/// A GRU layer over sequences `[N, T, D]` (see [`composite::gru`]), with parameters
/// `<name>.w_ih` `[D, 3H]`, `<name>.w_hh` `[H, 3H]` (`U(−1/√H, 1/√H)`) and biases
/// `<name>.b_ih`, `<name>.b_hh` `[3H]` (zeros).
#[derive(Clone, Copy, Debug)]
pub struct Gru {
    /// Input and recurrent weights.
    pub weights: [Value; 2],
    /// Input and recurrent biases.
    pub biases: [Value; 2],
}

impl Gru {
    /// Declares the layer's parameters for `inputs` features and `hidden` units.
    pub fn new(p: &mut Program, name: &str, inputs: usize, hidden: usize) -> RuntimeResult<Gru> {
        let init = recurrent_init(hidden);
        let shape = |rows: usize| [rows, 3 * hidden];
        Ok(Gru {
            weights: [
                p.parameter(&format!("{name}.w_ih"), DType::F32, &shape(inputs), init)?,
                p.parameter(&format!("{name}.w_hh"), DType::F32, &shape(hidden), init)?,
            ],
            biases: [
                p.parameter(
                    &format!("{name}.b_ih"),
                    DType::F32,
                    &[3 * hidden],
                    Init::Zeros,
                )?,
                p.parameter(
                    &format!("{name}.b_hh"),
                    DType::F32,
                    &[3 * hidden],
                    Init::Zeros,
                )?,
            ],
        })
    }

    /// Every step's hidden state `[N, T, H]` and the last one `[N, H]`.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<(Value, Value)> {
        Ok(composite::gru(p, x, self.weights, self.biases)?)
    }
}

/// PyTorch's recurrent initialisation: `U(−1/√H, 1/√H)`.
pub fn recurrent_init(hidden: usize) -> Init {
    let k = 1.0 / (hidden.max(1) as f64).sqrt();
    Init::Uniform { low: -k, high: k }
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

/// Layer normalisation over the last axis (see [`composite::layer_norm`]) with parameters
/// `<name>.gamma` (ones) and `<name>.beta` (zeros).
#[derive(Clone, Copy, Debug)]
pub struct LayerNorm {
    /// The scale, `[D]`.
    pub gamma: Value,
    /// The shift, `[D]`.
    pub beta: Value,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Declares f32 parameters for `width` features.
    pub fn new(p: &mut Program, name: &str, width: usize, eps: f64) -> RuntimeResult<LayerNorm> {
        LayerNorm::of(p, name, DType::F32, width, eps)
    }

    fn of(
        p: &mut Program,
        name: &str,
        dtype: DType,
        width: usize,
        eps: f64,
    ) -> RuntimeResult<LayerNorm> {
        Ok(LayerNorm {
            gamma: p.parameter(&format!("{name}.gamma"), dtype, &[width], Init::Ones)?,
            beta: p.parameter(&format!("{name}.beta"), dtype, &[width], Init::Zeros)?,
            eps,
        })
    }

    /// `x` normalised over its last axis, scaled and shifted.
    #[track_caller]
    pub fn apply(&self, p: &mut Program, x: Value) -> RuntimeResult<Value> {
        Ok(composite::layer_norm(
            p, x, self.gamma, self.beta, self.eps,
        )?)
    }
}

/// A [`LayerNorm`] created and applied to `x` at once.
#[track_caller]
pub fn layer_norm(p: &mut Program, name: &str, x: Value, eps: f64) -> RuntimeResult<Value> {
    let ty = p.value_type(x).clone();
    let width = composite::fixed_last_dim("layer_norm", "input", &ty)?;
    LayerNorm::of(p, name, ty.dtype, width, eps)?.apply(p, x)
}
