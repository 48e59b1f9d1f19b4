//! Rendering a message against the source text: one clear line, then the line with a caret.
//!
//! ```text
//! error: line 3, column 10: expected a type such as `f32[N,784]`, found `]`
//!    3 |   %h = add %x, %y : ]
//!      |                     ^
//! ```

/// The source line `line` (1-based) with a caret under column `col` (1-based, in characters).
pub fn snippet(source: &str, line: u32, col: u32) -> String {
    let Some(text) = source.lines().nth(line.saturating_sub(1) as usize) else {
        return String::new();
    };
    let gutter = format!("{line:>4}");
    let pad: String = text
        .chars()
        .take(col.saturating_sub(1) as usize)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    format!(
        "{gutter} | {text}\n{blank} | {pad}^",
        blank = " ".repeat(gutter.len())
    )
}

/// `error: <location>: <message>` and, when the location is in `source`, the snippet.
pub fn render(source: &str, line: u32, col: u32, message: &str) -> String {
    let snip = snippet(source, line, col);
    if snip.is_empty() {
        format!("error: line {line}, column {col}: {message}")
    } else {
        format!("error: line {line}, column {col}: {message}\n{snip}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn caret_sits_under_the_column() {
        let src = "module {\n  func @f() {\n    bogus\n";
        assert_eq!(
            super::render(src, 3, 5, "unknown op `bogus`"),
            "error: line 3, column 5: unknown op `bogus`\n   3 |     bogus\n     |     ^"
        );
    }
}

/// Why a source text is not a valid module.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The text did not parse.
    #[error("{0}")]
    Parse(#[from] crate::parse::ParseError),
    /// The module parsed but does not verify.
    #[error("{0}")]
    Verify(#[from] crate::verify::VerifyErrors),
}

impl SourceError {
    /// Every error with its source line and a caret.
    pub fn render(&self, source: &str) -> String {
        match self {
            SourceError::Parse(e) => e.render(source),
            SourceError::Verify(e) => e.render_source(source),
        }
    }
}

/// Parses and verifies a module: what `kiln check` does.
pub fn parse_and_verify(source: &str) -> Result<crate::module::Module, SourceError> {
    let module = crate::parse::parse_module(source)?;
    crate::verify::verify_module(&module)?;
    Ok(module)
}
