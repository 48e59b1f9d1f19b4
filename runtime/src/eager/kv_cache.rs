//! Generation with a KV cache: each block's keys and values kept as state, `[batch, heads,
//! context, width/heads]`, so that a new token attends to the cached ones instead of the whole
//! prefix being computed again. Two compiled programs: a prefill per prompt length (the
//! prompt's logits, the cache written from position 0) and one decode step for every
//! position (one token a sequence, its keys and values written into the cache in place at
//! the position it is fed). Past the context the positions no longer fit, and each step
//! prefills the last `context` tokens — exactly what generating without a cache computes.

use super::gpt::{Gpt, Positions, tokens_tensor};
use super::nn::{Layer, TransformerEncoderLayer};
use super::tensor::apply1;
use super::{EagerError, EagerResult, Parameter, StaticFunction, Tensor, to_static};
use crate::composite;
use crate::init::Init;
use crate::sampling::Sampling;
use kiln_backend::StateStore;
use kiln_backend::random::SplitMix64;
use kiln_ir::{AxisSlice, DType, Loc, Module, Shape, Type};
use std::collections::HashMap;

/// Each block's cached keys and values for `batch` sequences (buffers of the eager scope).
pub struct KvCache {
    batch: usize,
    blocks: Vec<[Parameter; 2]>,
}

impl KvCache {
    /// An empty cache of `gpt` for `batch` sequences, as buffers `<gpt>.cache<batch>.block<i>.k`
    /// and `.v`.
    pub fn new(gpt: &Gpt, batch: usize) -> EagerResult<KvCache> {
        let c = &gpt.config;
        let shape = [batch, c.heads, c.context, c.width / c.heads];
        let buffer = |i: usize, part: &str| {
            let name = format!("{}.cache{batch}.block{i}.{part}", gpt.name);
            Parameter::buffer(&name, DType::F32, &shape, Init::Zeros)
        };
        let blocks = (0..c.layers)
            .map(|i| Ok([buffer(i, "k")?, buffer(i, "v")?]))
            .collect::<EagerResult<_>>()?;
        Ok(KvCache { batch, blocks })
    }

    /// The sequences it holds.
    pub fn batch(&self) -> usize {
        self.batch
    }
}

/// `x [N, T, D]` as `[N, heads, T, D/heads]`.
fn split_heads(x: &Tensor, heads: usize) -> EagerResult<Tensor> {
    let ty = x.ty();
    let dims = ty.shape.as_fixed().unwrap_or_default();
    let [n, t, d] = dims[..] else {
        return Err(EagerError::Usage(format!(
            "split_heads: [N, T, D], not {ty}"
        )));
    };
    x.reshape(Shape::fixed(&[n, t, heads, d / heads]))?
        .transpose(&[0, 2, 1, 3])
}

/// `x [N, heads, T, d]` as `[N, T, heads·d]`.
fn join_heads(x: &Tensor) -> EagerResult<Tensor> {
    let dims = x.ty().shape.as_fixed().unwrap_or_default();
    let [n, heads, t, d] = dims[..] else {
        return Err(EagerError::Usage(format!(
            "join_heads: [N, H, T, d], not {}",
            x.ty()
        )));
    };
    x.transpose(&[0, 2, 1, 3])?
        .reshape(Shape::fixed(&[n, t, heads * d]))
}

/// A block as [`TransformerEncoderLayer::forward`] computes it, with the attention of the
/// projected queries, keys and values left to `attend`.
fn block_with(
    block: &TransformerEncoderLayer,
    x: &Tensor,
    attend: impl FnOnce([Tensor; 3]) -> EagerResult<Tensor>,
) -> EagerResult<Tensor> {
    let [q, k, v, o] = &block.attention.projections;
    let h = block.norm1.forward(x)?;
    let context = attend([q.forward(&h)?, k.forward(&h)?, v.forward(&h)?])?;
    let x = x.add(&o.forward(&context)?)?;
    let f = block.ff[0].forward(&block.norm2.forward(&x)?)?;
    x.add(&block.ff[1].forward(&f.gelu()?)?)
}

impl Gpt {
    /// The logits `[B, P, vocab]` of `tokens` (`[B, P]`, `P` at most the context) as
    /// [`Layer::forward`] gives them, each block's keys and values written into `cache`
    /// at slots `0..P` (the rest zeroed). Row `b` is padded on the left by `pads[b]` (i64
    /// `[B]`) tokens, which its later tokens neither attend to nor count in their positions:
    /// the row's logits from `pads[b]` on are those of its tokens alone.
    pub fn prefill(&self, cache: &KvCache, tokens: &Tensor, pads: &Tensor) -> EagerResult<Tensor> {
        let steps = tokens.ty().shape.as_fixed().unwrap_or_default();
        let (heads, context) = (self.config.heads, self.config.context);
        let mut x = self.embed(tokens, Positions::Padded(pads))?;
        for (block, [k_cache, v_cache]) in self.blocks.iter().zip(&cache.blocks) {
            x = block_with(block, &x, |[q, k, v]| {
                let [q, k, v] = [&q, &k, &v].map(|x| split_heads(x, heads));
                let [q, k, v] = [q?, k?, v?];
                for (cached, split) in [(k_cache, &k), (v_cache, &v)] {
                    let filled = match context - steps[1] {
                        0 => split.clone(),
                        rest => {
                            let mut shape = split.ty().shape.as_fixed().unwrap_or_default();
                            shape[2] = rest;
                            let zeros = Tensor::zeros(DType::F32, &shape);
                            Tensor::concat(&[split, &zeros], 2)?
                        }
                    };
                    cached.assign(&filled)?;
                }
                let context = apply1(&[&q, &k, &v, pads], Loc::caller(), |b, v| {
                    composite::padded_causal_attention(b, [v[0], v[1], v[2]], v[3])
                })?;
                join_heads(&context)
            })?;
        }
        self.head(&x)
    }

    /// The logits `[B, 1, vocab]` of `token` (`[B, 1]`) at slot `pos` (an i64 scalar below the
    /// context) after the `pos` slots in `cache`, whose keys and values it writes there; row
    /// `b`'s first `pads[b]` slots are padding (as [`Gpt::prefill`] wrote them).
    pub fn decode(
        &self,
        cache: &KvCache,
        token: &Tensor,
        pos: &Tensor,
        pads: &Tensor,
    ) -> EagerResult<Tensor> {
        let (heads, width) = (self.config.heads, self.config.width);
        let batch = cache.batch;
        let mut x = self.embed(token, Positions::At { slot: pos, pads })?;
        for (block, [k_cache, v_cache]) in self.blocks.iter().zip(&cache.blocks) {
            x = block_with(block, &x, |[q, k, v]| {
                let mut full = Vec::with_capacity(2);
                for (cached, value) in [(k_cache, &k), (v_cache, &v)] {
                    let slice = value.reshape(Shape::fixed(&[batch, heads, width / heads]))?;
                    let updated =
                        apply1(&[&cached.tensor()?, &slice, pos], Loc::caller(), |b, v| {
                            b.update_slice(v[0], v[1], v[2], 2)
                        })?;
                    cached.assign(&updated)?;
                    full.push(updated);
                }
                let q = split_heads(&q, heads)?;
                let inputs = [&q, &full[0], &full[1], pos, pads];
                let context = apply1(&inputs, Loc::caller(), |b, v| {
                    composite::cached_attention(b, v[0], [v[1], v[2]], v[3], v[4])
                })?;
                join_heads(&context)
            })?;
        }
        self.head(&x)
    }
}

/// Generation through a [`KvCache`] by compiled programs (see the module documentation),
/// for a batch of prompts; prompts of different lengths are padded on the left, and each
/// row's padding is masked out of its attention and its positions.
pub struct Generator<'a> {
    gpt: &'a Gpt,
    cache: KvCache,
    decode: StaticFunction,
    prefills: HashMap<usize, StaticFunction>,
}

fn tokens_type(batch: usize, steps: usize) -> Type {
    Type::new(DType::I64, Shape::fixed(&[batch, steps]))
}

/// The rows' last tokens in one window of `steps` slots, each row's `pads` (the window's
/// slots before its first token) and the flattened `[rows, steps]` tokens, padded with 0.
fn window(rows: &[Vec<i64>], steps: usize) -> (Vec<i64>, Vec<i64>) {
    let mut pads = Vec::with_capacity(rows.len());
    let mut tokens = Vec::with_capacity(rows.len() * steps);
    for row in rows {
        let kept = row.len().min(steps);
        pads.push((steps - kept) as i64);
        tokens.extend(std::iter::repeat_n(0, steps - kept));
        tokens.extend_from_slice(&row[row.len() - kept..]);
    }
    (pads, tokens)
}

impl<'a> Generator<'a> {
    /// A generator of `gpt` for `batch` sequences at a time: its cache, and the decode step
    /// traced once.
    pub fn new(gpt: &'a Gpt, batch: usize) -> EagerResult<Generator<'a>> {
        let cache = KvCache::new(gpt, batch)?;
        let inputs = [
            ("token", tokens_type(batch, 1)),
            ("pos", Type::scalar(DType::I64)),
            ("pads", Type::new(DType::I64, Shape::fixed(&[batch]))),
        ];
        let decode = to_static(&inputs, |t| {
            Ok(vec![gpt.decode(&cache, &t[0], &t[1], &t[2])?])
        })?;
        Ok(Generator {
            gpt,
            cache,
            decode,
            prefills: HashMap::new(),
        })
    }

    /// How many programs were compiled: the decode step's and one prefill per prompt length.
    pub fn compilations(&self) -> usize {
        self.decode.compilations()
            + self
                .prefills
                .values()
                .map(|f| f.compilations())
                .sum::<usize>()
    }

    /// Each row's last logits after prefilling `tokens` (`[batch, steps]`, flattened, each
    /// row padded by its `pads`): the program returns the last slot's alone, as the decode
    /// step does.
    fn prefill(&mut self, pads: &Tensor, tokens: Vec<i64>, steps: usize) -> EagerResult<Vec<f64>> {
        let batch = self.cache.batch;
        let tokens = tokens_tensor(&[batch, steps], tokens)?;
        self.prefill_function(steps)?.call(&[&tokens, pads])?[0].to_f64_vec()
    }

    /// The prefill program for prompts of `steps` tokens, traced on first use.
    fn prefill_function(&mut self, steps: usize) -> EagerResult<&mut StaticFunction> {
        let (gpt, batch) = (self.gpt, self.cache.batch);
        if !self.prefills.contains_key(&steps) {
            let cache = &self.cache;
            let inputs = [
                ("tokens", tokens_type(batch, steps)),
                ("pads", Type::new(DType::I64, Shape::fixed(&[batch]))),
            ];
            let last = AxisSlice::Range {
                start: steps - 1,
                end: steps,
                step: 1,
            };
            let f = to_static(&inputs, |t| {
                let logits = gpt.prefill(cache, &t[0], &t[1])?;
                Ok(vec![logits.slice(vec![
                    AxisSlice::Full,
                    last,
                    AxisSlice::Full,
                ])?])
            })?;
            self.prefills.insert(steps, f);
        }
        Ok(self.prefills.get_mut(&steps).expect("made"))
    }

    /// The two programs generation runs, as modules — `prefill` (tokens `[batch, steps]` and
    /// each row's pads; the last slot's logits, the cache written) and `decode` (one token a
    /// row, its position and the pads; its logits, the cache written at the position) — and
    /// the state they run against, the cache empty: to export (`kiln_onnx::export`, the cache
    /// an input and an output) or serve elsewhere.
    pub fn programs(&mut self, steps: usize) -> EagerResult<(Module, Module, StateStore)> {
        let prefill = self
            .prefill_function(steps)?
            .module_with_updates("prefill")?;
        let decode = self.decode.module_with_updates("decode")?;
        Ok((prefill, decode, self.decode.state()?))
    }

    /// Each prompt followed by up to `count` tokens drawn by `sampling` (one generator of
    /// draws, row after row); a row ends after a token of `stop`, which is kept. There must
    /// be `batch` prompts, of any lengths (at least 1 token each).
    pub fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        count: usize,
        sampling: &Sampling,
        stop: &[i64],
    ) -> EagerResult<Vec<Vec<i64>>> {
        let (batch, context, vocab) = (
            self.cache.batch,
            self.gpt.config.context,
            self.gpt.config.vocab,
        );
        if prompts.len() != batch || prompts.iter().any(Vec::is_empty) {
            return Err(EagerError::Usage(format!(
                "generate: {batch} prompts of at least 1 token for this generator, given {} of \
                 lengths {:?}",
                prompts.len(),
                prompts.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        let _no_grad = super::no_grad();
        let mut rng = SplitMix64::new(sampling.seed);
        // Every row takes a token each step (the program runs the batch together), so the
        // rows keep their padding; a row's text ends where its stop token came (`ends`).
        let mut rows: Vec<Vec<i64>> = prompts.to_vec();
        let mut ends: Vec<Option<usize>> = vec![None; batch];
        let longest = |rows: &[Vec<i64>]| rows.iter().map(Vec::len).max().unwrap_or(0);
        let steps = longest(&rows).min(context);
        let (pads, tokens) = window(&rows, steps);
        let mut pads = tokens_tensor(&[batch], pads)?;
        let mut logits = self.prefill(&pads, tokens, steps)?;
        for made in 0..count {
            let mut next = Vec::with_capacity(batch);
            for (r, row) in rows.iter_mut().enumerate() {
                let token = sampling.sample(&logits[r * vocab..][..vocab], &mut rng) as i64;
                row.push(token);
                if ends[r].is_none() && stop.contains(&token) {
                    ends[r] = Some(row.len());
                }
                next.push(token);
            }
            if ends.iter().all(Option::is_some) || made + 1 == count {
                break;
            }
            // The new tokens' slot is the one before the longest row's end.
            let pos = longest(&rows) - 1;
            logits = if pos < context {
                let token = tokens_tensor(&[batch, 1], next)?;
                let at = tokens_tensor(&[], vec![pos as i64])?;
                self.decode.call(&[&token, &at, &pads])?[0].to_f64_vec()?
            } else {
                let (shifted, tokens) = window(&rows, context);
                pads = tokens_tensor(&[batch], shifted)?;
                self.prefill(&pads, tokens, context)?
            };
        }
        for (row, end) in rows.iter_mut().zip(ends) {
            row.truncate(end.unwrap_or(row.len()));
        }
        Ok(rows)
    }
}
