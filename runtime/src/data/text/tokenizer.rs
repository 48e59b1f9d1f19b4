//! Tokenizers: characters (nanoGPT's `shakespeare_char`), and byte-level BPE trained by the
//! `tokenizers` crate (GPT-2's pre-tokenizer; saved as Hugging Face's `tokenizer.json`, which
//! Python's `tokenizers` loads to the same ids).

use super::super::DataError;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

/// The token that ends a document in a BPE vocabulary (GPT-2's), id 0.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Text to token ids and back.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// One token per character of a fixed vocabulary.
    Chars(CharTokenizer),
    /// Byte-level BPE: any text encodes.
    Bpe(Box<tokenizers::Tokenizer>),
}

/// One token per character: the corpus's characters, sorted, are the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CharTokenizer {
    chars: Vec<char>,
    ids: HashMap<char, u32>,
}

impl CharTokenizer {
    /// The vocabulary of `text`'s distinct characters, in code-point order.
    pub fn from_text(text: &str) -> CharTokenizer {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharTokenizer::from_chars(chars)
    }

    fn from_chars(chars: Vec<char>) -> CharTokenizer {
        let ids = chars.iter().enumerate().map(|(i, &c)| (c, i as u32));
        CharTokenizer {
            ids: ids.collect(),
            chars,
        }
    }

    /// The vocabulary, in id order.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }
}

fn invalid(message: String) -> DataError {
    DataError::Invalid(message)
}

impl Tokenizer {
    /// A character tokenizer over `text`'s characters.
    pub fn chars(text: &str) -> Tokenizer {
        Tokenizer::Chars(CharTokenizer::from_text(text))
    }

    /// Byte-level BPE with `vocab_size` tokens (the 256 bytes, [`END_OF_TEXT`] and the merges)
    /// trained on `text`'s lines.
    pub fn train_bpe(text: &str, vocab_size: usize) -> Result<Tokenizer, DataError> {
        if vocab_size < 257 {
            return Err(invalid(format!(
                "a byte-level BPE vocabulary of {vocab_size} tokens: it needs at least 257 \
                 (the 256 bytes and {END_OF_TEXT})"
            )));
        }
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .show_progress(false)
            .vocab_size(vocab_size)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .special_tokens(vec![tokenizers::AddedToken::from(END_OF_TEXT, true)])
            .build()
            .into();
        // GPT-2's: no space added before the text, offsets trimmed, its regex splits.
        let byte_level = ByteLevel::new(false, true, true);
        let mut bpe = tokenizers::Tokenizer::new(BPE::default());
        bpe.with_pre_tokenizer(Some(byte_level))
            .with_post_processor(Some(byte_level))
            .with_decoder(Some(byte_level));
        (bpe.train(&mut trainer, text.split_inclusive('\n')))
            .map_err(|e| invalid(format!("training BPE: {e}")))?;
        Ok(Tokenizer::Bpe(Box::new(bpe)))
    }

    /// The number of ids.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Chars(c) => c.chars.len(),
            Tokenizer::Bpe(t) => t.get_vocab_size(true),
        }
    }

    /// The ids of `text`; a character outside a character vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Tokenizer::Chars(c) => (text.char_indices())
                .map(|(at, ch)| {
                    c.ids.get(&ch).copied().ok_or_else(|| {
                        invalid(format!(
                            "{ch:?} (U+{:04X}) at byte {at} is not in the vocabulary of {} \
                             characters",
                            ch as u32,
                            c.chars.len()
                        ))
                    })
                })
                .collect(),
            Tokenizer::Bpe(t) => Ok(t
                .encode(text, false)
                .map_err(|e| invalid(format!("BPE encoding: {e}")))?
                .get_ids()
                .to_vec()),
        }
    }

    /// The id of [`END_OF_TEXT`], which BPE vocabularies hold and character ones do not.
    pub fn end_of_text(&self) -> Option<u32> {
        match self {
            Tokenizer::Chars(_) => None,
            Tokenizer::Bpe(t) => t.token_to_id(END_OF_TEXT),
        }
    }

    /// The text of `ids`; an id outside the vocabulary is an error naming it.
    pub fn decode(&self, ids: &[u32]) -> Result<String, DataError> {
        let out_of_range = |id: u32| {
            invalid(format!(
                "token id {id} is outside the vocabulary of {} ids",
                self.vocab_size()
            ))
        };
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            return Err(out_of_range(id));
        }
        match self {
            Tokenizer::Chars(c) => Ok(ids.iter().map(|&id| c.chars[id as usize]).collect()),
            Tokenizer::Bpe(t) => t
                .decode(ids, false)
                .map_err(|e| invalid(format!("BPE decoding: {e}"))),
        }
    }

    /// The tokenizer as JSON: Hugging Face's `tokenizer.json` for BPE; for characters
    /// `{"kind": "chars", "vocabulary": "..."}`.
    pub fn to_json(&self) -> Result<String, DataError> {
        match self {
            Tokenizer::Chars(c) => Ok(serde_json::json!({
                "kind": "chars",
                "vocabulary": c.chars.iter().collect::<String>(),
            })
            .to_string()),
            Tokenizer::Bpe(t) => {
                (t.to_string(true)).map_err(|e| invalid(format!("writing the BPE tokenizer: {e}")))
            }
        }
    }

    /// A tokenizer from [`Tokenizer::to_json`]'s JSON (or any `tokenizer.json` of the
    /// `tokenizers` library).
    pub fn from_json(json: &str) -> Result<Tokenizer, DataError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| invalid(format!("tokenizer JSON: {e}")))?;
        if value.get("kind").and_then(|k| k.as_str()) == Some("chars") {
            let vocabulary = (value.get("vocabulary").and_then(|v| v.as_str()))
                .ok_or_else(|| invalid("a character tokenizer without its vocabulary".into()))?;
            let chars = CharTokenizer::from_chars(vocabulary.chars().collect());
            if chars.ids.len() != chars.chars.len() {
                return Err(invalid(
                    "a character vocabulary that repeats a character".into(),
                ));
            }
            return Ok(Tokenizer::Chars(chars));
        }
        let bpe: tokenizers::Tokenizer = json
            .parse()
            .map_err(|e| invalid(format!("tokenizer JSON: {e}")))?;
        Ok(Tokenizer::Bpe(Box::new(bpe)))
    }

    /// Writes [`Tokenizer::to_json`] to `path`.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        std::fs::write(path, self.to_json()?).map_err(|e| DataError::File {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }

    /// Reads a tokenizer [`Tokenizer::save`] wrote.
    pub fn load(path: &Path) -> Result<Tokenizer, DataError> {
        let file_error = |message: String| DataError::File {
            path: path.to_owned(),
            message,
        };
        let json = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        Tokenizer::from_json(&json).map_err(|e| file_error(e.to_string()))
    }
}
