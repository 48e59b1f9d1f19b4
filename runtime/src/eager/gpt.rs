//! A GPT (Radford et al. 2019, as nanoGPT writes it) from Kiln's layers: token and learned
//! position embeddings, pre-norm blocks of causal multi-head self-attention and a GELU MLP
//! four times as wide, a final layer norm, and an output head tied to the token embedding.
//! Eager like any [`Layer`], compiled by tracing it with `to_static`.

use super::nn::{Embedding, Layer, LayerNorm, Linear, MultiHeadAttention, TransformerEncoderLayer};
use super::tensor::apply1;
use super::{EagerError, EagerResult, Parameter, Tensor};
use crate::init::Init;
use crate::sampling::Sampling;
use kiln_backend::random::SplitMix64;
use kiln_ir::{AxisSlice, DType, Loc, Shape, Type};

/// A GPT's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab: usize,
    /// The longest sequence (the position table's rows).
    pub context: usize,
    /// Features per token.
    pub width: usize,
    /// Attention heads (dividing `width`).
    pub heads: usize,
    /// Blocks.
    pub layers: usize,
}

impl GptConfig {
    /// nanoGPT's CPU recipe for characters: 4 layers, 4 heads, width 128, context 64.
    pub fn nano(vocab: usize) -> GptConfig {
        GptConfig {
            vocab,
            context: 64,
            width: 128,
            heads: 4,
            layers: 4,
        }
    }

    fn check(&self) -> EagerResult<()> {
        let sizes = [
            self.vocab,
            self.context,
            self.width,
            self.heads,
            self.layers,
        ];
        if sizes.contains(&0) || !self.width.is_multiple_of(self.heads) {
            return Err(EagerError::Usage(format!(
                "a GPT needs sizes above 0 and a width divisible by the heads: {self:?}"
            )));
        }
        Ok(())
    }
}

/// The model (see the module documentation). Parameters are named `<name>.tokens.table`,
/// `<name>.positions.table`, `<name>.block<i>.…` (a [`TransformerEncoderLayer`]'s names) and
/// `<name>.norm.…`; weights start as GPT-2's: normal with std 0.02, the two projections back
/// into the residual stream at 0.02/√(2·layers), biases zero.
#[derive(Clone)]
pub struct Gpt {
    /// The name its parameters are named after.
    pub name: String,
    /// The sizes.
    pub config: GptConfig,
    /// Token embeddings, `[vocab, width]`, also the output head.
    pub tokens: Embedding,
    /// Position embeddings, `[context, width]`.
    pub positions: Embedding,
    /// The blocks, pre-norm and causal.
    pub blocks: Vec<TransformerEncoderLayer>,
    /// The norm before the head.
    pub norm: LayerNorm,
}

/// Token ids of `shape` as an i64 tensor.
pub(super) fn tokens_tensor(shape: &[usize], ids: Vec<i64>) -> EagerResult<Tensor> {
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), ids)
        .map_err(|e| EagerError::Usage(e.to_string()))?;
    Ok(Tensor::new(kiln_backend::Array::I64(array)))
}

/// A layer `x @ w + b` with GPT-2's initialisation: `w` normal with std `std`, `b` zeros.
fn linear(name: &str, inputs: usize, outputs: usize, std: f64) -> EagerResult<Linear> {
    let w = Init::Normal { mean: 0.0, std };
    Ok(Linear {
        w: Parameter::new(&format!("{name}.w"), DType::F32, &[inputs, outputs], w)?,
        b: Parameter::new(&format!("{name}.b"), DType::F32, &[outputs], Init::Zeros)?,
    })
}

fn embedding(name: &str, rows: usize, width: usize) -> EagerResult<Embedding> {
    let init = Init::Normal {
        mean: 0.0,
        std: 0.02,
    };
    let table = Parameter::new(&format!("{name}.table"), DType::F32, &[rows, width], init)?;
    Ok(Embedding { table })
}

fn block(name: &str, config: &GptConfig) -> EagerResult<TransformerEncoderLayer> {
    let (width, sub) = (config.width, |part: &str| format!("{name}.{part}"));
    let residual_std = 0.02 / ((2 * config.layers) as f64).sqrt();
    let projection =
        |part: &str, std: f64| linear(&sub(&format!("attention.{part}")), width, width, std);
    Ok(TransformerEncoderLayer {
        norm1: LayerNorm::new(&sub("norm1"), width, 1e-5)?,
        attention: MultiHeadAttention {
            projections: [
                projection("q", 0.02)?,
                projection("k", 0.02)?,
                projection("v", 0.02)?,
                projection("o", residual_std)?,
            ],
            heads: config.heads,
            causal: true,
        },
        norm2: LayerNorm::new(&sub("norm2"), width, 1e-5)?,
        ff: [
            linear(&sub("ff1"), width, 4 * width, 0.02)?,
            linear(&sub("ff2"), 4 * width, width, residual_std)?,
        ],
    })
}

impl Gpt {
    /// A GPT of `config`'s sizes with parameters named after `name`.
    pub fn new(name: &str, config: GptConfig) -> EagerResult<Gpt> {
        config.check()?;
        let blocks = (0..config.layers)
            .map(|i| block(&format!("{name}.block{i}"), &config))
            .collect::<EagerResult<_>>()?;
        Ok(Gpt {
            name: name.to_owned(),
            config,
            tokens: embedding(&format!("{name}.tokens"), config.vocab, config.width)?,
            positions: embedding(&format!("{name}.positions"), config.context, config.width)?,
            blocks,
            norm: LayerNorm::new(&format!("{name}.norm"), config.width, 1e-5)?,
        })
    }

    /// The mean cross-entropy of predicting `targets` (`[N, T]`, each token's successor) from
    /// `tokens` (`[N, T]`).
    #[track_caller]
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> EagerResult<Tensor> {
        super::nn::cross_entropy(&self.forward(tokens)?, targets)
    }

    /// `prompt` followed by `count` tokens drawn by `sampling`, each from the logits of the
    /// whole prefix (its last `context` tokens) computed again; stops early after a token of
    /// `stop`, which is kept.
    pub fn generate(
        &self,
        prompt: &[i64],
        count: usize,
        sampling: &Sampling,
        stop: &[i64],
    ) -> EagerResult<Vec<i64>> {
        if prompt.is_empty() {
            return Err(EagerError::Usage("generate: the prompt is empty".into()));
        }
        let _no_grad = super::no_grad();
        let mut rng = SplitMix64::new(sampling.seed);
        let mut tokens = prompt.to_vec();
        for _ in 0..count {
            let window = &tokens[tokens.len().saturating_sub(self.config.context)..];
            let input = tokens_tensor(&[1, window.len()], window.to_vec())?;
            let logits = self.forward(&input)?.to_f64_vec()?;
            let last = &logits[logits.len() - self.config.vocab..];
            let next = sampling.sample(last, &mut rng) as i64;
            tokens.push(next);
            if stop.contains(&next) {
                break;
            }
        }
        Ok(tokens)
    }
}

/// Where a GPT's tokens `[N, T]` sit.
#[derive(Clone, Copy)]
pub(super) enum Positions<'t> {
    /// At positions `0..T`.
    FromZero,
    /// Row `n` padded on the left by `pads[n]` slots (i64 `[N]`): its positions count from
    /// its first token, `t − pads[n]` (the padding's are 0).
    Padded(&'t Tensor),
    /// One token a row at the integer scalar `slot`, row `n` at position `slot − pads[n]`.
    At { slot: &'t Tensor, pads: &'t Tensor },
}

impl Gpt {
    /// Token and position embeddings of `tokens` (`[N, T]`) at `positions`.
    pub(super) fn embed(&self, tokens: &Tensor, positions: Positions) -> EagerResult<Tensor> {
        let ty = tokens.ty();
        let steps = match ty.shape.dims() {
            [_, t] => t.as_fixed(),
            _ => None,
        };
        let steps = steps.filter(|&t| (1..=self.config.context).contains(&t));
        let many = !matches!(positions, Positions::At { .. });
        let Some(steps) = steps.filter(|&t| many || t == 1) else {
            return Err(EagerError::Usage(format!(
                "a GPT reads tokens [N, T] with 1 ≤ T ≤ {} (its context; T = 1 at a position), \
                 not {ty}",
                self.config.context
            )));
        };
        let table = self.positions.table.tensor()?;
        // Padded rows: as many as pads (`[N]`).
        let rows = |pads: &Tensor| pads.ty().shape.dims().first().cloned().unwrap_or(1.into());
        let embedded = match positions {
            Positions::FromZero => {
                let rows = AxisSlice::Range {
                    start: 0,
                    end: steps,
                    step: 1,
                };
                table.slice(vec![rows, AxisSlice::Full])?
            }
            Positions::Padded(pads) => {
                let index = apply1(&[pads], Loc::caller(), |b, v| {
                    let slots = b.iota(Type::new(DType::I64, Shape::fixed(&[1, steps])), 1)?;
                    let pads = b.reshape(v[0], Shape(vec![rows(pads), 1.into()]))?;
                    let along = b.sub(slots, pads)?;
                    let first = b.scalar(DType::I64, 0.0)?;
                    b.maximum(along, first)
                })?;
                table.gather(&index, 0)?
            }
            Positions::At { slot, pads } => {
                let index = apply1(&[slot, pads], Loc::caller(), |b, v| {
                    let slot = b.cast(v[0], DType::I64)?;
                    b.sub(slot, v[1])
                })?;
                let shape = Shape(vec![rows(pads), 1.into(), self.config.width.into()]);
                table.gather(&index, 0)?.reshape(shape)?
            }
        };
        self.tokens.forward(tokens)?.add(&embedded)
    }

    /// The logits of the last block's output `x`: the final norm, then the tied head.
    pub(super) fn head(&self, x: &Tensor) -> EagerResult<Tensor> {
        let x = self.norm.forward(x)?;
        x.matmul_t(&self.tokens.table.tensor()?, false, true)
    }
}

impl Layer for Gpt {
    /// `tokens: i32/i64[N, T]` (`T` at most the context) → logits `f32[N, T, vocab]`.
    fn forward(&self, tokens: &Tensor) -> EagerResult<Tensor> {
        let mut x = self.embed(tokens, Positions::FromZero)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.head(&x)
    }

    fn parameters(&self) -> Vec<Parameter> {
        let mut all = self.tokens.parameters();
        all.extend(self.positions.parameters());
        all.extend(self.blocks.iter().flat_map(Layer::parameters));
        all.extend(self.norm.parameters());
        all
    }
}
