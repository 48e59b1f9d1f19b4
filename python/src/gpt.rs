//! The GPT behind `kiln.nn.GPT` (issue 51): its sizes from the layer's options, and
//! generation — through the KV cache (a decode program compiled once per call, a prefill per
//! longest prompt's length) or by computing each prefix again.

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

/// Each prompt followed by up to `count` drawn tokens (a row ends after a token of `stop`).
/// Through the cache the prompts go as one batch (of any lengths: padded on the left); without
/// it each is generated alone, the whole window computed again for every token.
pub(crate) fn generate(
    gpt: &Gpt,
    prompts: &[Vec<i64>],
    count: usize,
    sampling: Sampling,
    stop: &[i64],
    cache: bool,
) -> PyResult<Vec<Vec<i64>>> {
    let sampling = kiln_ok(sampling.checked())?;
    if cache {
        let mut generator = py_eager(Generator::new(gpt, prompts.len()))?;
        return py_eager(generator.generate(prompts, count, &sampling, stop));
    }
    (prompts.iter())
        .map(|p| py_eager(gpt.generate(p, count, &sampling, stop)))
        .collect()
}
