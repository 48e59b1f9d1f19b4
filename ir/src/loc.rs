//! Where an instruction came from: a line of IR text, or the Rust source line that built it.

use std::fmt;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loc {
    #[default]
    Unknown,
    /// 1-based line and column in IR text.
    Text { line: u32, col: u32 },
    /// The caller of a builder method (captured with `#[track_caller]`).
    Rust(&'static std::panic::Location<'static>),
}

impl Loc {
    #[track_caller]
    pub fn caller() -> Loc {
        Loc::Rust(std::panic::Location::caller())
    }

    pub fn is_known(&self) -> bool {
        !matches!(self, Loc::Unknown)
    }
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Unknown => f.write_str("an unknown place"),
            Loc::Text { line, col } => write!(f, "line {line}, column {col}"),
            Loc::Rust(l) => write!(f, "{}:{}:{}", l.file(), l.line(), l.column()),
        }
    }
}
