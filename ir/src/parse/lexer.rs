//! Tokens of the text form, with their line and column.

use crate::print::is_symbol_char;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum TokenKind {
    /// Keywords, op names, dtypes, symbolic dimensions, `true`, `nan`, …
    Ident(String),
    /// `%x`, `%12`: the text after `%`.
    Value(String),
    /// `@fc1.w` or `@"any name"`: the name, unescaped.
    Symbol(String),
    /// A number as written: `-12`, `0.5`, `1e-7`, `-inf`.
    Number(String),
    /// `"any text"`: the text, unescaped (an imported node's name in `loc(...)`).
    Str(String),
    LBrace,
    RBrace,
    LParen,
    RParen,
    LBracket,
    RBracket,
    Comma,
    Colon,
    Equals,
    Arrow,
    Eof,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Token {
    pub kind: TokenKind,
    /// The token as written, for error messages.
    pub text: String,
    pub line: u32,
    pub col: u32,
}

/// A character the lexer cannot start a token with.
#[derive(Debug)]
pub(super) struct LexError {
    pub line: u32,
    pub col: u32,
    pub message: String,
    pub text: String,
}

pub(super) fn tokenize(src: &str) -> Result<Vec<Token>, LexError> {
    let mut lexer = Lexer {
        chars: src.chars().collect(),
        pos: 0,
        line: 1,
        col: 1,
    };
    let mut tokens = Vec::new();
    loop {
        let token = lexer.next()?;
        let done = token.kind == TokenKind::Eof;
        tokens.push(token);
        if done {
            return Ok(tokens);
        }
    }
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    line: u32,
    col: u32,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.pos + ahead).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek(0)?;
        self.pos += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, pred: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek(0).filter(|&c| pred(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn skip_trivia(&mut self) {
        loop {
            match (self.peek(0), self.peek(1)) {
                (Some(c), _) if c.is_whitespace() => {
                    self.bump();
                }
                (Some('/'), Some('/')) => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.bump();
                    }
                }
                _ => return,
            }
        }
    }

    fn next(&mut self) -> Result<Token, LexError> {
        self.skip_trivia();
        let (line, col) = (self.line, self.col);
        let token = |kind: TokenKind, text: String| Token {
            kind,
            text,
            line,
            col,
        };
        let error = |message: &str, text: String| LexError {
            line,
            col,
            message: message.to_owned(),
            text,
        };
        let Some(c) = self.peek(0) else {
            return Ok(token(TokenKind::Eof, "end of input".into()));
        };
        let punct = match c {
            '{' => Some(TokenKind::LBrace),
            '}' => Some(TokenKind::RBrace),
            '(' => Some(TokenKind::LParen),
            ')' => Some(TokenKind::RParen),
            '[' => Some(TokenKind::LBracket),
            ']' => Some(TokenKind::RBracket),
            ',' => Some(TokenKind::Comma),
            ':' => Some(TokenKind::Colon),
            '=' => Some(TokenKind::Equals),
            _ => None,
        };
        if let Some(kind) = punct {
            self.bump();
            return Ok(token(kind, c.to_string()));
        }
        if c == '-' && self.peek(1) == Some('>') {
            self.bump();
            self.bump();
            return Ok(token(TokenKind::Arrow, "->".into()));
        }
        if c.is_ascii_digit()
            || (c == '-'
                && self
                    .peek(1)
                    .is_some_and(|d| d.is_ascii_digit() || d == 'i' || d == 'n'))
        {
            let mut text = String::new();
            if c == '-' {
                text.push(c);
                self.bump();
            }
            if self.peek(0).is_some_and(is_ident_start) {
                // `-inf`, `-nan`
                text.push_str(&self.take_while(is_ident_char));
                return Ok(token(TokenKind::Number(text.clone()), text));
            }
            text.push_str(&self.take_while(|c| c.is_ascii_digit()));
            if self.peek(0) == Some('.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
                self.bump();
                text.push('.');
                text.push_str(&self.take_while(|c| c.is_ascii_digit()));
            }
            if matches!(self.peek(0), Some('e' | 'E')) {
                let sign = matches!(self.peek(1), Some('+' | '-'));
                let digit_at = if sign { 2 } else { 1 };
                if self.peek(digit_at).is_some_and(|c| c.is_ascii_digit()) {
                    text.push(self.bump().unwrap_or('e'));
                    if sign {
                        text.push(self.bump().unwrap_or('+'));
                    }
                    text.push_str(&self.take_while(|c| c.is_ascii_digit()));
                }
            }
            return Ok(token(TokenKind::Number(text.clone()), text));
        }
        if is_ident_start(c) {
            let text = self.take_while(is_ident_char);
            return Ok(token(TokenKind::Ident(text.clone()), text));
        }
        if c == '%' {
            self.bump();
            let name = self.take_while(is_value_char);
            if name.is_empty() {
                return Err(error("expected a value name after `%`", "%".into()));
            }
            return Ok(token(TokenKind::Value(name.clone()), format!("%{name}")));
        }
        if c == '@' {
            self.bump();
            if self.peek(0) == Some('"') {
                let name = self.quoted(line, col, "@")?;
                return Ok(token(TokenKind::Symbol(name.clone()), format!("@{name:?}")));
            }
            let name = self.take_while(is_symbol_char);
            if name.is_empty() {
                return Err(error("expected a name after `@`", "@".into()));
            }
            return Ok(token(TokenKind::Symbol(name.clone()), format!("@{name}")));
        }
        if c == '"' {
            let text = self.quoted(line, col, "")?;
            return Ok(token(TokenKind::Str(text.clone()), format!("{text:?}")));
        }
        self.bump();
        Err(error("unexpected character", c.to_string()))
    }

    /// The text between double quotes, unescaped; `prefix` is what came before the quote.
    fn quoted(&mut self, line: u32, col: u32, prefix: &str) -> Result<String, LexError> {
        let what = if prefix == "@" { "name" } else { "text" };
        let error = |message: &str, text: String| LexError {
            line,
            col,
            message: message.replace("{what}", what),
            text,
        };
        self.bump(); // opening quote
        let mut name = String::new();
        loop {
            match self.bump() {
                None | Some('\n') => {
                    return Err(error(
                        "unterminated quoted {what}",
                        format!("{prefix}\"{name}"),
                    ));
                }
                Some('"') => break,
                Some('\\') => {
                    let escaped = match self.bump() {
                        Some('n') => '\n',
                        Some('t') => '\t',
                        Some('r') => '\r',
                        Some('0') => '\0',
                        Some(c @ ('"' | '\\' | '\'')) => c,
                        Some('u') if self.peek(0) == Some('{') => {
                            self.bump();
                            let hex = self.take_while(|c| c.is_ascii_hexdigit());
                            let closed = self.bump() == Some('}');
                            let code = u32::from_str_radix(&hex, 16).ok().filter(|_| closed);
                            code.and_then(char::from_u32).ok_or_else(|| {
                                error("invalid \\u{...} escape", format!("\\u{{{hex}"))
                            })?
                        }
                        other => {
                            return Err(error(
                                "invalid escape in quoted {what}",
                                format!("\\{}", other.map(String::from).unwrap_or_default()),
                            ));
                        }
                    };
                    name.push(escaped);
                }
                Some(c) => name.push(c),
            }
        }
        Ok(name)
    }
}
