//! Choosing the next token from a language model's logits: greedy, or drawn at a temperature
//! from the `top_k` most likely tokens and the smallest set of them whose probability reaches
//! `top_p` (Holtzman et al. 2020), as Hugging Face's `generate` applies them — temperature,
//! then top-k, then top-p. Draws come from a seeded [`SplitMix64`], so a seed gives one text.

use crate::error::{RuntimeError, RuntimeResult};
use kiln_backend::random::SplitMix64;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; 0 picks the most likely token (greedy decoding).
    pub temperature: f64,
    /// Only the `top_k` most likely tokens may be drawn (all when `None`).
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose probabilities first sum to `top_p` or more may be
    /// drawn (all when `None`).
    pub top_p: Option<f64>,
    /// The seed of the draws.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding: the most likely token each time (the first of equal ones).
    pub fn greedy() -> Sampling {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            seed: 0,
        }
    }

    /// Draws at `temperature` from every token, seeded by `seed`.
    pub fn temperature(temperature: f64, seed: u64) -> RuntimeResult<Sampling> {
        Sampling {
            temperature,
            ..Sampling::greedy()
        }
        .with_seed(seed)
        .checked()
    }

    /// Only the `k` most likely tokens.
    pub fn with_top_k(self, k: usize) -> RuntimeResult<Sampling> {
        Sampling {
            top_k: Some(k),
            ..self
        }
        .checked()
    }

    /// Only the most likely tokens whose probabilities reach `p` together.
    pub fn with_top_p(self, p: f64) -> RuntimeResult<Sampling> {
        Sampling {
            top_p: Some(p),
            ..self
        }
        .checked()
    }

    /// Another seed.
    pub fn with_seed(self, seed: u64) -> Sampling {
        Sampling { seed, ..self }
    }

    /// The settings, or an error naming the one out of range.
    pub fn checked(self) -> RuntimeResult<Sampling> {
        let bad = if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            Some(format!(
                "temperature {} (finite, 0 or more)",
                self.temperature
            ))
        } else if self.top_k == Some(0) {
            Some("top_k 0 (1 or more)".to_string())
        } else {
            (self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)))
                .map(|p| format!("top_p {p} (in (0, 1])"))
        };
        match bad {
            Some(what) => Err(RuntimeError::Usage(format!("sampling: {what}"))),
            None => Ok(self),
        }
    }

    /// The index of the chosen token of `logits` (NaN logits are never chosen, unless all
    /// are), drawing from `rng` unless greedy.
    pub fn sample(&self, logits: &[f64], rng: &mut SplitMix64) -> usize {
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        // The first of the most likely, without sorting the vocabulary (greedy's whole work).
        let Some(best) =
            (order.iter().copied()).reduce(|b, i| if logits[i] > logits[b] { i } else { b })
        else {
            return 0;
        };
        if self.temperature == 0.0 || logits[best] == f64::INFINITY {
            return best;
        }
        // Most likely first; equal logits by index.
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        order.truncate(self.top_k.unwrap_or(order.len()).max(1));
        let top = logits[order[0]];
        let weights: Vec<f64> = (order.iter())
            .map(|&i| ((logits[i] - top) / self.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut kept = weights.len();
        if let Some(p) = self.top_p {
            let mut sum = 0.0;
            kept = 1 + weights
                .iter()
                .position(|w| {
                    sum += w / total;
                    sum >= p
                })
                .unwrap_or(weights.len() - 1);
        }
        let mass: f64 = weights[..kept].iter().sum();
        let mut draw = unit(rng) * mass;
        for (&i, w) in order.iter().zip(&weights[..kept]) {
            if draw < *w {
                return i;
            }
            draw -= w;
        }
        order[kept - 1]
    }
}

/// A uniform draw in [0, 1) from 53 bits.
fn unit(rng: &mut SplitMix64) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}
