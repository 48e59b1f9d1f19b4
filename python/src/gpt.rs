//! The GPT behind `kiln.nn.GPT` (issue 51): its sizes from the layer's options, and
//! generation — through the KV cache (a decode program compiled once per call, a prefill per
//! prompt length) or by computing each prefix again.

use crate::eager::py_eager;
use crate::errors::kiln_ok;
use crate::options::Options;
use kiln::runtime::Sampling;
use kiln::runtime::eager::{Generator, Gpt, GptConfig};
use pyo3::prelude::*;

/// The GPT named `name` of the sizes in `o`: `vocab_size`, `context`, `width`, `heads`,
/// `layers`.
pub(crate) fn gpt(name: &str, o: &Options) -> PyResult<Gpt> {
    let config = GptConfig {
        vocab: o.size("vocab_size")?,
        context: o.size("context")?,
        width: o.size("width")?,
        heads: o.size("heads")?,
        layers: o.size("layers")?,
    };
    py_eager(Gpt::new(name, config))
}

/// How `generate` draws each token.
pub(crate) struct Draw {
    pub(crate) greedy: bool,
    pub(crate) temperature: f64,
    pub(crate) top_k: Option<usize>,
    pub(crate) top_p: Option<f64>,
    pub(crate) seed: u64,
}

impl Draw {
    fn sampling(&self) -> PyResult<Sampling> {
        if self.greedy {
            return Ok(Sampling::greedy());
        }
        let mut s = kiln_ok(Sampling::temperature(self.temperature, self.seed))?;
        if let Some(k) = self.top_k {
            s = kiln_ok(s.with_top_k(k))?;
        }
        if let Some(p) = self.top_p {
            s = kiln_ok(s.with_top_p(p))?;
        }
        Ok(s)
    }
}

/// Each prompt followed by up to `count` drawn tokens (a row ends after a token of `stop`).
/// Through the cache the prompts go as one batch and must have one length; without it each is
/// generated alone, the whole window computed again for every token.
pub(crate) fn generate(
    gpt: &Gpt,
    prompts: &[Vec<i64>],
    count: usize,
    draw: &Draw,
    stop: &[i64],
    cache: bool,
) -> PyResult<Vec<Vec<i64>>> {
    let sampling = draw.sampling()?;
    if cache {
        let mut generator = py_eager(Generator::new(gpt, prompts.len()))?;
        return py_eager(generator.generate(prompts, count, &sampling, stop));
    }
    (prompts.iter())
        .map(|p| py_eager(gpt.generate(p, count, &sampling, stop)))
        .collect()
}
