//! Layers with parameters, for eager code (and, traced, for static programs).
//!
//! A [`Parameter`] is named state in this thread's scope: eagerly it is a leaf tensor whose
//! gradient `backward()` accumulates; traced it is a `load` of that state. So the same
//! parameters train eagerly and serve compiled.

use super::tensor::{apply, apply1};
use super::{EagerError, EagerResult, Tensor, with};
use crate::composite;
use crate::init::Init;
use kiln_backend::Array;
use kiln_ir::{Conv2dAttrs, DType, Loc, Pool2dAttrs, Shape, StateDecl, Type};

/// A named parameter in this thread's scope.
#[derive(Clone, Debug, PartialEq)]
pub struct Parameter {
    decl: StateDecl,
    /// The context (thread) whose scope holds the value.
    context: u64,
    /// False for buffers: state a layer keeps (running statistics) that no optimizer trains
    /// and no gradient reaches.
    trainable: bool,
}

/// FNV-1a, so a parameter's seed depends only on its name and the context seed.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Parameter {
    /// Declares a parameter `name` (made unique with a suffix if taken) initialised by `init`,
    /// seeded by the context seed and the name.
    pub fn new(name: &str, dtype: DType, shape: &[usize], init: Init) -> EagerResult<Parameter> {
        Parameter::declare(name, dtype, shape, init, true)
    }

    /// A buffer: named state like a parameter, but not trained (a layer's running
    /// statistics). It has no gradient; traced, it is state the program reads and may store.
    pub fn buffer(name: &str, dtype: DType, shape: &[usize], init: Init) -> EagerResult<Parameter> {
        Parameter::declare(name, dtype, shape, init, false)
    }

    fn declare(
        name: &str,
        dtype: DType,
        shape: &[usize],
        init: Init,
        trainable: bool,
    ) -> EagerResult<Parameter> {
        with(|cx| {
            let mut unique = name.to_owned();
            let mut n = 1;
            while cx.states.state(&unique).is_some() {
                unique = format!("{name}_{n}");
                n += 1;
            }
            let decl = StateDecl {
                ty: Type::new(dtype, Shape::fixed(shape)),
                init: init.initializer(shape, cx.seed ^ stable_hash(&unique)),
                name: unique,
            };
            cx.states
                .declare_state(decl.clone())
                .map_err(|e| EagerError::Usage(e.to_string()))?;
            let leaf = cx.new_leaf();
            cx.param_leaves.insert(decl.name.clone(), leaf);
            let module = kiln_ir::Module {
                states: vec![decl.clone()],
                functions: Vec::new(),
            };
            cx.scope.declare(&module)?;
            Ok(Parameter {
                decl,
                context: cx.id,
                trainable,
            })
        })
    }

    fn check_in(&self, cx: &super::Context) -> EagerResult<()> {
        cx.check_owner(self.context, &format!("parameter `{}`", self.decl.name))
    }

    /// An error when the parameter was made in another thread (or before a reset): its value
    /// and gradient live there.
    pub fn check_thread(&self) -> EagerResult<()> {
        with(|cx| self.check_in(cx))
    }

    /// The parameter's name (its state's name).
    pub fn name(&self) -> &str {
        &self.decl.name
    }

    /// Its state declaration.
    pub fn decl(&self) -> &StateDecl {
        &self.decl
    }

    /// The parameter as a tensor: eagerly its current value (gradients accumulate for it);
    /// while tracing, a `load` of its state.
    pub fn tensor(&self) -> EagerResult<Tensor> {
        with(|cx| {
            self.check_in(cx)?;
            if let Some(trace) = cx.trace.as_mut() {
                let v = if self.trainable {
                    trace.program.adopt_parameter(&self.decl)?
                } else {
                    trace.program.adopt_state(&self.decl)?
                };
                return Ok(trace.tensor(v));
            }
            let data = cx.scope.store().get_shared(&self.decl.name).cloned().ok_or_else(|| {
                EagerError::Usage(format!("parameter `{}` has no value in this thread (was kiln::eager::reset called?)", self.decl.name))
            })?;
            if !self.trainable {
                return Ok(Tensor::from_shared(data));
            }
            let leaf = cx.param_leaves[&self.decl.name];
            Ok(Tensor::leaf(data, leaf))
        })
    }

    /// Replaces the parameter's value with `value`, which must have its dtype and shape.
    /// Gradients already accumulated stay (as `torch.no_grad(): p.copy_(value)` keeps them).
    pub fn set(&self, value: Array) -> EagerResult<()> {
        with(|cx| {
            self.check_in(cx)?;
            if cx.trace.is_some() {
                return Err(EagerError::Usage(format!(
                    "parameter `{}` cannot be set while tracing",
                    self.decl.name
                )));
            }
            Ok(cx.scope.set(&self.decl.name, value)?)
        })
    }

    /// Gives the state `value` (of its type): eagerly at once; while tracing, as a `store`
    /// the compiled function performs at every call (a layer updating its running
    /// statistics).
    pub fn assign(&self, value: &Tensor) -> EagerResult<()> {
        if value.is_traced() {
            return with(|cx| {
                self.check_in(cx)?;
                let trace = cx.trace.as_mut().ok_or_else(|| {
                    EagerError::Usage("a traced value assigned outside its trace".into())
                })?;
                let v = trace.value_of(value)?;
                trace.program.adopt_state(&self.decl)?;
                let store = trace.program.store(&self.decl, v)?;
                trace.stores.push(store);
                Ok(())
            });
        }
        self.set(value.to_array()?)
    }

    /// The gradient accumulated by `backward()` since the last `zero_grad`.
    pub fn grad(&self) -> Option<Tensor> {
        with(|cx| {
            self.check_in(cx)?;
            let leaf = cx.param_leaves.get(&self.decl.name);
            Ok(leaf
                .and_then(|l| cx.grads.get(l))
                .cloned()
                .map(Tensor::from_shared))
        })
        .ok()
        .flatten()
    }

    /// Clears its gradient.
    pub fn zero_grad(&self) {
        let _ = with(|cx| {
            self.check_in(cx)?;
            if let Some(leaf) = cx.param_leaves.get(&self.decl.name) {
                cx.grads.remove(leaf);
            }
            Ok(())
        });
    }
}

/// A layer: a function of a tensor with named parameters, in training or evaluation mode.
pub trait Layer {
    /// Applies the layer to `x`.
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor>;

    /// The layer's parameters (and its sublayers').
    fn parameters(&self) -> Vec<Parameter> {
        Vec::new()
    }

    /// State the layer keeps but does not train (batch norm's running statistics): saved
    /// and loaded with the parameters.
    fn buffers(&self) -> Vec<Parameter> {
        Vec::new()
    }

    /// Training mode changes what some layers do (dropout); the default ignores it.
    fn set_training(&mut self, _training: bool) {}

    /// Clears the gradients of its parameters.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }
}

/// `x @ w + b`, with `w: [in, out]` (Kaiming-uniform) and `b: [out]` (zeros).
#[derive(Clone)]
pub struct Linear {
    /// The weights, `[inputs, outputs]`.
    pub w: Parameter,
    /// The bias, `[outputs]`.
    pub b: Parameter,
}

impl Linear {
    /// A layer `x @ w + b` with parameters `<name>.w` (Kaiming-uniform) and `<name>.b` (zeros).
    pub fn new(name: &str, inputs: usize, outputs: usize) -> EagerResult<Linear> {
        Ok(Linear {
            w: Parameter::new(
                &format!("{name}.w"),
                DType::F32,
                &[inputs, outputs],
                Init::KaimingUniform,
            )?,
            b: Parameter::new(&format!("{name}.b"), DType::F32, &[outputs], Init::Zeros)?,
        })
    }
}

impl Layer for Linear {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        x.matmul(&self.w.tensor()?)?.add(&self.b.tensor()?)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.w.clone(), self.b.clone()]
    }
}

/// Layers applied in order.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Layer>>,
}

impl Sequential {
    /// An empty sequence.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer`.
    pub fn push(mut self, layer: impl Layer + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }
}

impl Layer for Sequential {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        self.layers
            .iter()
            .try_fold(x.clone(), |h, layer| layer.forward(&h))
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.layers.iter().flat_map(|l| l.parameters()).collect()
    }

    fn set_training(&mut self, training: bool) {
        for l in &mut self.layers {
            l.set_training(training);
        }
    }
}

macro_rules! activation_layers {
    ($($name:ident => $method:ident),*) => {$(
        #[doc = concat!("The `", stringify!($method), "` activation as a layer.")]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name;

        impl Layer for $name {
            fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
                x.$method()
            }
        }
    )*};
}

activation_layers!(
    Relu => relu, Tanh => tanh, Sigmoid => sigmoid, Softplus => softplus, Gelu => gelu
);

/// Layer normalisation over the last axis, with a learned scale (ones) and shift (zeros).
#[derive(Clone)]
pub struct LayerNorm {
    /// The scale, initially ones.
    pub gamma: Parameter,
    /// The shift, initially zeros.
    pub beta: Parameter,
    /// Added to the variance.
    pub eps: f64,
}

impl LayerNorm {
    /// Layer normalisation over a last axis of `width`, with parameters `<name>.gamma` and `<name>.beta`.
    pub fn new(name: &str, width: usize, eps: f64) -> EagerResult<LayerNorm> {
        Ok(LayerNorm {
            gamma: Parameter::new(&format!("{name}.gamma"), DType::F32, &[width], Init::Ones)?,
            beta: Parameter::new(&format!("{name}.beta"), DType::F32, &[width], Init::Zeros)?,
            eps,
        })
    }
}

impl Layer for LayerNorm {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let (gamma, beta) = (self.gamma.tensor()?, self.beta.tensor()?);
        apply1(&[x, &gamma, &beta], Loc::caller(), |b, v| {
            composite::layer_norm(b, v[0], v[1], v[2], self.eps)
        })
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.gamma.clone(), self.beta.clone()]
    }
}

/// A 2-D convolution `conv2d(x, w) + b` over NCHW tensors.
pub struct Conv2d {
    /// The weights, `[out, in/groups, KH, KW]` (Kaiming-uniform).
    pub w: Parameter,
    /// The bias, `[out]` (zeros).
    pub b: Parameter,
    /// Strides, padding, dilation, groups.
    pub attrs: Conv2dAttrs,
}

impl Conv2d {
    /// A convolution from `inputs` to `outputs` channels with a `kernel`, as parameters
    /// `<name>.w` and `<name>.b`.
    pub fn new(
        name: &str,
        [inputs, outputs]: [usize; 2],
        kernel: [usize; 2],
        attrs: Conv2dAttrs,
    ) -> EagerResult<Conv2d> {
        let shape = [outputs, inputs / attrs.groups.max(1), kernel[0], kernel[1]];
        Ok(Conv2d {
            w: Parameter::new(
                &format!("{name}.w"),
                DType::F32,
                &shape,
                Init::KaimingUniform,
            )?,
            b: Parameter::new(&format!("{name}.b"), DType::F32, &[outputs], Init::Zeros)?,
            attrs,
        })
    }
}

impl Layer for Conv2d {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let (w, b) = (self.w.tensor()?, self.b.tensor()?);
        apply1(&[x, &w, &b], Loc::caller(), |bd, v| {
            composite::conv2d_bias(bd, v[0], v[1], v[2], self.attrs)
        })
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.w.clone(), self.b.clone()]
    }
}

/// Single-head self-attention over `[N, T, D]` tensors (see [`composite::self_attention`]).
pub struct SelfAttention {
    /// Query, key, value (`[D, d]`) and output (`[d, D]`) weights, Xavier-uniform.
    pub weights: [Parameter; 4],
}

impl SelfAttention {
    /// Attention over `features` with `dim` inside, as parameters `<name>.wq`, `.wk`, `.wv`,
    /// `.wo`.
    pub fn new(name: &str, features: usize, dim: usize) -> EagerResult<SelfAttention> {
        let [wq, wk, wv, wo] = composite::attention_weights(name, features, dim)
            .map(|(name, shape)| Parameter::new(&name, DType::F32, &shape, Init::XavierUniform));
        Ok(SelfAttention {
            weights: [wq?, wk?, wv?, wo?],
        })
    }
}

impl Layer for SelfAttention {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let w = self
            .weights
            .iter()
            .map(Parameter::tensor)
            .collect::<EagerResult<Vec<_>>>()?;
        apply1(&[x, &w[0], &w[1], &w[2], &w[3]], Loc::caller(), |b, v| {
            composite::self_attention(b, v[0], [v[1], v[2], v[3], v[4]])
        })
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.weights.to_vec()
    }
}

/// Multi-head self-attention over `[N, T, D]` tensors with biased projections (the eager twin
/// of [`crate::layers::MultiHeadAttention`], the same parameter names and composite).
#[derive(Clone)]
pub struct MultiHeadAttention {
    /// The query, key, value and output projections, `<name>.q`, `.k`, `.v`, `.o`.
    pub projections: [Linear; 4],
    /// The number of heads.
    pub heads: usize,
    /// Whether token `i` sees only tokens `j ≤ i`.
    pub causal: bool,
}

impl MultiHeadAttention {
    /// Attention over `width` features with `heads` heads.
    pub fn new(
        name: &str,
        width: usize,
        heads: usize,
        causal: bool,
    ) -> EagerResult<MultiHeadAttention> {
        let projection = |part: &str| Linear::new(&format!("{name}.{part}"), width, width);
        Ok(MultiHeadAttention {
            projections: [
                projection("q")?,
                projection("k")?,
                projection("v")?,
                projection("o")?,
            ],
            heads,
            causal,
        })
    }
}

impl Layer for MultiHeadAttention {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let [q, k, v, o] = &self.projections;
        let (q, k, v) = (q.forward(x)?, k.forward(x)?, v.forward(x)?);
        let context = apply1(&[&q, &k, &v], Loc::caller(), |b, v| {
            composite::multi_head_attention(b, [v[0], v[1], v[2]], self.heads, self.causal)
        })?;
        o.forward(&context)
    }

    fn parameters(&self) -> Vec<Parameter> {
        self.projections
            .iter()
            .flat_map(Layer::parameters)
            .collect()
    }
}

/// A pre-norm transformer encoder layer (the eager twin of
/// [`crate::layers::TransformerEncoderLayer`]): `x + attention(norm1(x))`, then
/// `x + ff2(gelu(ff1(norm2(x))))`.
#[derive(Clone)]
pub struct TransformerEncoderLayer {
    /// The norm before the attention.
    pub norm1: LayerNorm,
    /// The self-attention.
    pub attention: MultiHeadAttention,
    /// The norm before the feed-forward block.
    pub norm2: LayerNorm,
    /// The feed-forward block's widening and narrowing layers.
    pub ff: [Linear; 2],
}

impl TransformerEncoderLayer {
    /// A layer of `width` features, `heads` heads and a feed-forward block `ff` wide.
    pub fn new(
        name: &str,
        [width, heads, ff]: [usize; 3],
        causal: bool,
    ) -> EagerResult<TransformerEncoderLayer> {
        let sub = |part: &str| format!("{name}.{part}");
        Ok(TransformerEncoderLayer {
            norm1: LayerNorm::new(&sub("norm1"), width, 1e-5)?,
            attention: MultiHeadAttention::new(&sub("attention"), width, heads, causal)?,
            norm2: LayerNorm::new(&sub("norm2"), width, 1e-5)?,
            ff: [
                Linear::new(&sub("ff1"), width, ff)?,
                Linear::new(&sub("ff2"), ff, width)?,
            ],
        })
    }
}

impl Layer for TransformerEncoderLayer {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let x = x.add(&self.attention.forward(&self.norm1.forward(x)?)?)?;
        let f = self.ff[0].forward(&self.norm2.forward(&x)?)?;
        x.add(&self.ff[1].forward(&f.gelu()?)?)
    }

    fn parameters(&self) -> Vec<Parameter> {
        let mut all = self.norm1.parameters();
        all.extend(self.attention.parameters());
        all.extend(self.norm2.parameters());
        all.extend(self.ff.iter().flat_map(Layer::parameters));
        all
    }
}

/// An LSTM over sequences `[N, T, D]`: `forward` gives every step's hidden state
/// `[N, T, H]`, [`Lstm::last`] the last one (see [`composite::lstm`]).
pub struct Lstm {
    /// Input weights `[D, 4H]`.
    pub w_ih: Parameter,
    /// Recurrent weights `[H, 4H]`.
    pub w_hh: Parameter,
    /// The bias `[4H]`.
    pub b: Parameter,
}

impl Lstm {
    /// An LSTM of `hidden` units over `inputs` features, as parameters `<name>.w_ih`,
    /// `<name>.w_hh` and `<name>.b` (initialised as the static layer's).
    pub fn new(name: &str, inputs: usize, hidden: usize) -> EagerResult<Lstm> {
        let init = crate::layers::recurrent_init(hidden);
        let param = |suffix: &str, shape: &[usize], init| {
            Parameter::new(&format!("{name}.{suffix}"), DType::F32, shape, init)
        };
        Ok(Lstm {
            w_ih: param("w_ih", &[inputs, 4 * hidden], init)?,
            w_hh: param("w_hh", &[hidden, 4 * hidden], init)?,
            b: param("b", &[4 * hidden], Init::Zeros)?,
        })
    }

    /// Every step's hidden state and the last one.
    #[track_caller]
    pub fn run(&self, x: &Tensor) -> EagerResult<(Tensor, Tensor)> {
        let (w_ih, w_hh, b) = (self.w_ih.tensor()?, self.w_hh.tensor()?, self.b.tensor()?);
        let [sequence, h, _] = lstm(x, &w_ih, &w_hh, &b)?;
        Ok((sequence, h))
    }

    /// The last step's hidden state `[N, H]`.
    #[track_caller]
    pub fn last(&self, x: &Tensor) -> EagerResult<Tensor> {
        Ok(self.run(x)?.1)
    }
}

impl Layer for Lstm {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        Ok(self.run(x)?.0)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.w_ih.clone(), self.w_hh.clone(), self.b.clone()]
    }
}

/// An LSTM over `x` `[N, T, D]` with the given weights (see [`composite::lstm`]): every
/// step's hidden state `[N, T, H]`, the last hidden state and the last cell state `[N, H]`.
#[track_caller]
pub fn lstm(x: &Tensor, w_ih: &Tensor, w_hh: &Tensor, bias: &Tensor) -> EagerResult<[Tensor; 3]> {
    let out = apply(&[x, w_ih, w_hh, bias], Loc::caller(), |b, v| {
        let (sequence, [h, c]) = composite::lstm(b, v[0], v[1], v[2], v[3])?;
        Ok(vec![sequence, h, c])
    })?;
    Ok(out.try_into().expect("three results"))
}

/// A GRU over `x` `[N, T, D]` with the given weights and biases (see [`composite::gru`]):
/// every step's hidden state `[N, T, H]` and the last one `[N, H]`.
#[track_caller]
pub fn gru(x: &Tensor, weights: [&Tensor; 2], biases: [&Tensor; 2]) -> EagerResult<[Tensor; 2]> {
    let inputs = [x, weights[0], weights[1], biases[0], biases[1]];
    let out = apply(&inputs, Loc::caller(), |b, v| {
        let (sequence, h) = composite::gru(b, v[0], [v[1], v[2]], [v[3], v[4]])?;
        Ok(vec![sequence, h])
    })?;
    Ok(out.try_into().expect("two results"))
}

/// A GRU over sequences `[N, T, D]`: `forward` gives every step's hidden state, [`Gru::last`]
/// the last one (see [`composite::gru`]).
pub struct Gru {
    /// Input and recurrent weights, `[D, 3H]` and `[H, 3H]`.
    pub weights: [Parameter; 2],
    /// Input and recurrent biases, `[3H]` each.
    pub biases: [Parameter; 2],
}

impl Gru {
    /// A GRU of `hidden` units over `inputs` features, as parameters `<name>.w_ih`,
    /// `<name>.w_hh`, `<name>.b_ih` and `<name>.b_hh`.
    pub fn new(name: &str, inputs: usize, hidden: usize) -> EagerResult<Gru> {
        let init = crate::layers::recurrent_init(hidden);
        let param = |suffix: &str, shape: &[usize], init| {
            Parameter::new(&format!("{name}.{suffix}"), DType::F32, shape, init)
        };
        Ok(Gru {
            weights: [
                param("w_ih", &[inputs, 3 * hidden], init)?,
                param("w_hh", &[hidden, 3 * hidden], init)?,
            ],
            biases: [
                param("b_ih", &[3 * hidden], Init::Zeros)?,
                param("b_hh", &[3 * hidden], Init::Zeros)?,
            ],
        })
    }

    /// Every step's hidden state and the last one.
    #[track_caller]
    pub fn run(&self, x: &Tensor) -> EagerResult<(Tensor, Tensor)> {
        let [w_ih, w_hh] = [self.weights[0].tensor()?, self.weights[1].tensor()?];
        let [b_ih, b_hh] = [self.biases[0].tensor()?, self.biases[1].tensor()?];
        let [sequence, h] = gru(x, [&w_ih, &w_hh], [&b_ih, &b_hh])?;
        Ok((sequence, h))
    }

    /// The last step's hidden state `[N, H]`.
    #[track_caller]
    pub fn last(&self, x: &Tensor) -> EagerResult<Tensor> {
        Ok(self.run(x)?.1)
    }
}

impl Layer for Gru {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        Ok(self.run(x)?.0)
    }

    fn parameters(&self) -> Vec<Parameter> {
        let mut params = self.weights.to_vec();
        params.extend(self.biases.iter().cloned());
        params
    }
}

/// Batch normalisation over the channel axis of `[N, C]` or `[N, C, H, W]` tensors: in
/// training mode with the batch's statistics, updating the running averages; in evaluation
/// mode with the running averages (see [`crate::layers::BatchNorm`]). Traced with
/// `to_static` in training mode, the compiled function updates the running averages at every
/// call, as the eager layer does.
pub struct BatchNorm {
    /// The scale `[C]` (ones).
    pub gamma: Parameter,
    /// The shift `[C]` (zeros).
    pub beta: Parameter,
    /// The running mean `[C]`: a buffer.
    pub running_mean: Parameter,
    /// The running (unbiased) variance `[C]`: a buffer.
    pub running_var: Parameter,
    /// The weight of a batch in the running averages (0.1).
    pub momentum: f64,
    /// Added to the variance (1e-5).
    pub eps: f64,
    /// Training mode (the default) or evaluation mode.
    pub training: bool,
}

impl BatchNorm {
    /// Batch normalisation of `channels`, as parameters `<name>.gamma`, `<name>.beta` and
    /// buffers `<name>.running_mean`, `<name>.running_var`.
    pub fn new(name: &str, channels: usize) -> EagerResult<BatchNorm> {
        let state = |suffix: &str, init, trainable: bool| {
            let name = format!("{name}.{suffix}");
            match trainable {
                true => Parameter::new(&name, DType::F32, &[channels], init),
                false => Parameter::buffer(&name, DType::F32, &[channels], init),
            }
        };
        Ok(BatchNorm {
            gamma: state("gamma", Init::Ones, true)?,
            beta: state("beta", Init::Zeros, true)?,
            running_mean: state("running_mean", Init::Zeros, false)?,
            running_var: state("running_var", Init::Ones, false)?,
            momentum: 0.1,
            eps: 1e-5,
            training: true,
        })
    }
}

impl Layer for BatchNorm {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        let (gamma, beta) = (self.gamma.tensor()?, self.beta.tensor()?);
        let (mean, var) = (self.running_mean.tensor()?, self.running_var.tensor()?);
        let eps = self.eps;
        if !self.training {
            return apply1(&[x, &mean, &var, &gamma, &beta], Loc::caller(), |b, v| {
                composite::batch_norm(b, v[0], [v[1], v[2]], [v[3], v[4]], eps)
            });
        }
        let momentum = self.momentum;
        let mut out = apply(&[x, &mean, &var, &gamma, &beta], Loc::caller(), |b, v| {
            let [bm, bv, unbiased] = composite::batch_moments(b, v[0])?;
            let y = composite::batch_norm(b, v[0], [bm, bv], [v[3], v[4]], eps)?;
            let next_mean = composite::running_average(b, v[1], bm, momentum)?;
            let next_var = composite::running_average(b, v[2], unbiased, momentum)?;
            Ok(vec![y, next_mean, next_var])
        })?;
        let next_var = out.pop().expect("three results");
        let next_mean = out.pop().expect("three results");
        self.running_mean.assign(&next_mean)?;
        self.running_var.assign(&next_var)?;
        Ok(out.pop().expect("three results"))
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.gamma.clone(), self.beta.clone()]
    }

    fn buffers(&self) -> Vec<Parameter> {
        vec![self.running_mean.clone(), self.running_var.clone()]
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Max pooling over NCHW tensors.
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d(pub Pool2dAttrs);

impl Layer for MaxPool2d {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        x.max_pool2d(self.0)
    }
}

/// Average pooling over NCHW tensors (padding counts as zeros).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d(pub Pool2dAttrs);

impl Layer for AvgPool2d {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        x.avg_pool2d(self.0)
    }
}

/// The mean over the spatial axes: `[N, C, H, W]` → `[N, C]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalAvgPool;

impl Layer for GlobalAvgPool {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        apply1(&[x], Loc::caller(), |b, v| {
            composite::global_avg_pool(b, v[0])
        })
    }
}

/// Every axis but the first in one.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Layer for Flatten {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        x.flatten()
    }
}

/// A table of `vocab` vectors of `dim`, indexed by integer tensors.
#[derive(Clone)]
pub struct Embedding {
    /// The vectors, `[vocab, dim]`.
    pub table: Parameter,
}

impl Embedding {
    /// A table of `vocab` vectors of `dim`, normal-initialised, as `<name>.table`.
    pub fn new(name: &str, vocab: usize, dim: usize) -> EagerResult<Embedding> {
        let init = Init::Normal {
            mean: 0.0,
            std: 1.0,
        };
        Ok(Embedding {
            table: Parameter::new(&format!("{name}.table"), DType::F32, &[vocab, dim], init)?,
        })
    }
}

impl Layer for Embedding {
    /// `indices: i32/i64[...]` → `f32[..., dim]`.
    fn forward(&self, indices: &Tensor) -> EagerResult<Tensor> {
        self.table.tensor()?.gather(indices, 0)
    }

    fn parameters(&self) -> Vec<Parameter> {
        vec![self.table.clone()]
    }
}

/// Zeroes each element with probability `p` in training mode (scaling the rest by 1/(1-p));
/// the identity in evaluation mode. Each run draws a fresh mask.
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    /// The seed of the masks.
    pub seed: u64,
    /// Whether the layer is in training mode.
    pub training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, in training mode.
    pub fn new(p: f64, seed: u64) -> Dropout {
        Dropout {
            p,
            seed,
            training: true,
        }
    }
}

impl Layer for Dropout {
    fn forward(&self, x: &Tensor) -> EagerResult<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let keep = x
            .rand_like(0.0, 1.0, self.seed)?
            .compare_scalar(kiln_ir::CompareOp::Ge, self.p)?;
        let scaled = x.binary_scalar(kiln_ir::BinaryOp::Mul, 1.0 / (1.0 - self.p))?;
        let zeros = scaled.binary_scalar(kiln_ir::BinaryOp::Mul, 0.0)?;
        Tensor::select(&keep, &scaled, &zeros)
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

/// Mean softmax cross-entropy of `logits: [N, C]` against integer `labels: [N]`
/// (see [`composite::softmax_cross_entropy`]).
#[track_caller]
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> EagerResult<Tensor> {
    apply1(&[logits, labels], Loc::caller(), |b, v| {
        composite::softmax_cross_entropy(b, v[0], v[1])
    })
}

/// Mean squared error.
#[track_caller]
pub fn mse(prediction: &Tensor, target: &Tensor) -> EagerResult<Tensor> {
    apply1(&[prediction, target], Loc::caller(), |b, v| {
        composite::mse(b, v[0], v[1])
    })
}

/// Mean binary cross-entropy of `sigmoid(logits)` against `targets` in [0, 1] (see
/// [`composite::sigmoid_cross_entropy`]).
#[track_caller]
pub fn binary_cross_entropy_with_logits(logits: &Tensor, targets: &Tensor) -> EagerResult<Tensor> {
    apply1(&[logits, targets], Loc::caller(), |b, v| {
        composite::sigmoid_cross_entropy(b, v[0], v[1])
    })
}

/// The fraction of rows whose arg-max equals the label.
#[track_caller]
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> EagerResult<Tensor> {
    apply1(&[logits, labels], Loc::caller(), |b, v| {
        composite::accuracy(b, v[0], v[1])
    })
}
