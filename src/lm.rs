//! A trained language model on disk, as `examples/gpt.rs train --out DIR` writes it and
//! `kiln generate DIR` reads it: `config.json` (the GPT's sizes), `tokenizer.json` (the
//! tokenizer, characters or BPE) and `model.safetensors` (the parameters, by name).

use crate::train::TrainError;
use kiln_backend::Array;
use kiln_ir::Type;
use kiln_runtime::data::text::Tokenizer;
use kiln_runtime::eager::nn::Layer;
use kiln_runtime::eager::{self, Gpt, GptConfig};
use kiln_runtime::{Sampling, checkpoint};
use std::collections::BTreeMap;
use std::path::Path;

/// The files of a model directory.
const CONFIG: &str = "config.json";
const TOKENIZER: &str = "tokenizer.json";
const WEIGHTS: &str = "model.safetensors";

/// A GPT with its tokenizer, in this thread's eager scope.
pub struct LanguageModel {
    /// The model.
    pub gpt: Gpt,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
}

/// Each parameter of `gpt` by name with its type, as a checkpoint must hold them.
pub fn declared_types(gpt: &Gpt) -> BTreeMap<String, Type> {
    (gpt.parameters().iter())
        .map(|p| (p.name().to_owned(), p.decl().ty.clone()))
        .collect()
}

fn usage(message: String) -> TrainError {
    TrainError::Invalid(message)
}

fn config_json(c: &GptConfig) -> serde_json::Value {
    serde_json::json!({
        "vocab": c.vocab, "context": c.context, "width": c.width,
        "heads": c.heads, "layers": c.layers,
    })
}

fn config_from_json(text: &str, path: &Path) -> Result<GptConfig, TrainError> {
    let bad = |why: String| usage(format!("{}: {why}", path.display()));
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let size = |key: &str| {
        (value.get(key).and_then(serde_json::Value::as_u64))
            .map(|v| v as usize)
            .ok_or_else(|| bad(format!("no size `{key}` (a whole number)")))
    };
    Ok(GptConfig {
        vocab: size("vocab")?,
        context: size("context")?,
        width: size("width")?,
        heads: size("heads")?,
        layers: size("layers")?,
    })
}

impl LanguageModel {
    /// Writes `gpt`'s sizes and parameters and `tokenizer` into `dir` (made if missing).
    pub fn save(gpt: &Gpt, tokenizer: &Tokenizer, dir: &Path) -> Result<(), TrainError> {
        let io = |e: std::io::Error| usage(format!("writing {}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let config = serde_json::to_string_pretty(&config_json(&gpt.config)).expect("json");
        std::fs::write(dir.join(CONFIG), config + "\n").map_err(io)?;
        tokenizer.save(&dir.join(TOKENIZER))?;
        let values = (gpt.parameters().iter())
            .map(|p| Ok((p.name().to_owned(), p.tensor()?.to_array()?)))
            .collect::<Result<Vec<(String, Array)>, eager::EagerError>>()?;
        checkpoint::save(
            values.iter().map(|(n, a)| (n.as_str(), a)),
            &dir.join(WEIGHTS),
        )?;
        Ok(())
    }

    /// The model `dir` holds, its parameters declared in this thread's eager scope (which is
    /// reset first). Every file is checked: sizes, the tokenizer's vocabulary against the
    /// model's, each parameter's type.
    pub fn load(dir: &Path) -> Result<LanguageModel, TrainError> {
        let path = dir.join(CONFIG);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            usage(format!(
                "{}: {e} (a model directory holds {CONFIG}, {TOKENIZER} and {WEIGHTS})",
                path.display()
            ))
        })?;
        let config = config_from_json(&text, &path)?;
        let tokenizer = Tokenizer::load(&dir.join(TOKENIZER))?;
        if tokenizer.vocab_size() != config.vocab {
            return Err(usage(format!(
                "{}: the tokenizer has {} ids, the model {}",
                dir.display(),
                tokenizer.vocab_size(),
                config.vocab
            )));
        }
        eager::reset();
        let gpt = Gpt::new("gpt", config)?;
        let declared = declared_types(&gpt);
        for (name, value) in checkpoint::load(&dir.join(WEIGHTS), &declared)? {
            eager::set_state(&name, value)?;
        }
        Ok(LanguageModel { gpt, tokenizer })
    }

    /// `prompt` and `count` tokens drawn after it by `sampling`, decoded, through the KV
    /// cache; stops early after the end-of-text token when the tokenizer has one.
    pub fn generate(
        &self,
        prompt: &str,
        count: usize,
        sampling: &Sampling,
    ) -> Result<String, TrainError> {
        self.generate_with(prompt, count, sampling, true)
    }

    /// [`LanguageModel::generate`], through the cache or (`cached` false) computing the whole
    /// window again for each token — the same tokens, slower.
    pub fn generate_with(
        &self,
        prompt: &str,
        count: usize,
        sampling: &Sampling,
        cached: bool,
    ) -> Result<String, TrainError> {
        let ids = self.tokenizer.encode(prompt)?;
        if ids.is_empty() {
            return Err(usage("generate: the prompt has no tokens".into()));
        }
        let prompt: Vec<i64> = ids.iter().map(|&t| i64::from(t)).collect();
        let stop: Vec<i64> = self
            .tokenizer
            .end_of_text()
            .map(i64::from)
            .into_iter()
            .collect();
        let out = match cached {
            true => {
                let mut generator = eager::Generator::new(&self.gpt, 1)?;
                let mut rows = generator.generate(&[prompt], count, sampling, &stop)?;
                rows.pop().expect("one row")
            }
            false => self.gpt.generate(&prompt, count, sampling, &stop)?,
        };
        let ids: Vec<u32> = out.iter().map(|&t| t as u32).collect();
        Ok(self.tokenizer.decode(&ids)?)
    }
}
