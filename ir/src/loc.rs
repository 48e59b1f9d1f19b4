//! Where an instruction came from: a line of IR text, or the Rust source line that built it.

use std::fmt;

/// Where an instruction comes from: a line of the caller's Rust, or a position in IR text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Loc {
    /// Not known (built by a pass, say).
    #[default]
    Unknown,
    /// A position in IR text.
    Text {
        /// The line, from 1.
        line: u32,
        /// The column, from 1.
        col: u32,
    },
    /// The caller of a builder method (captured with `#[track_caller]`).
    Rust(&'static std::panic::Location<'static>),
}

impl Loc {
    /// The location of the caller (through `#[track_caller]` functions).
    #[track_caller]
    pub fn caller() -> Loc {
        Loc::Rust(std::panic::Location::caller())
    }

    /// Whether the location is known.
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
