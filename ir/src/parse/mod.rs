//! Parsing the text form back into a [`Module`].
//!
//! The parser checks syntax and names: every value is defined once, before it is used, and
//! used only where it is visible. Types are taken as written; the verifier checks them. Errors
//! carry the line, the column, the offending token and what was expected. Nesting is bounded
//! (regions and literals), so no input can exhaust the stack.

mod lexer;

use crate::entities::{Region, Value};
use crate::function::Function;
use crate::literal::Literal;
use crate::loc::Loc;
use crate::module::{Initializer, Module, StateDecl};
use crate::op::{Attr, AxisSlice, Op, OpParts};
use crate::types::{DType, Dim, Shape, Symbol, Type};
use lexer::{Token, TokenKind, tokenize};
use std::collections::HashMap;
use std::fmt;

/// The deepest nesting of regions ([`crate::MAX_REGION_DEPTH`]) or literal brackets the parser
/// accepts.
const MAX_DEPTH: usize = crate::function::MAX_REGION_DEPTH;

/// A parse error at a line and column of the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// The line, from 1.
    pub line: u32,
    /// The column, from 1.
    pub col: u32,
    /// The offending token as written (`end of input` at the end).
    pub token: String,
    /// What went wrong, e.g. "expected `:` and a type, found `]`".
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.col, self.message
        )
    }
}

impl std::error::Error for ParseError {}

impl ParseError {
    /// The message with the source line and a caret under the offending token.
    pub fn render(&self, source: &str) -> String {
        crate::diagnostic::render(source, self.line, self.col, &self.message)
    }
}

/// Parses a whole module.
pub fn parse_module(source: &str) -> Result<Module, ParseError> {
    let tokens = tokenize(source).map_err(|e| ParseError {
        line: e.line,
        col: e.col,
        message: format!("{}: `{}`", e.message, e.text),
        token: e.text,
    })?;
    let mut parser = Parser { tokens, pos: 0 };
    let module = parser.module()?;
    parser.expect_kind(
        TokenKind::Eof,
        "the end of the input after the module's `}`",
    )?;
    Ok(module)
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

/// A literal as written, before its type is known.
enum RawLiteral {
    Scalar(Token),
    List(Token, Vec<RawLiteral>),
}

/// Per-function name resolution: every name once; visible while its region is open.
struct Scope {
    values: HashMap<String, (Value, Region, u32)>,
    open: Vec<Region>,
}

impl Parser {
    // ----- token plumbing -----

    fn peek(&self) -> &Token {
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn peek_kind(&self) -> &TokenKind {
        &self.peek().kind
    }

    fn advance(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.tokens.len() - 1 {
            self.pos += 1;
        }
        t
    }

    fn error_at(&self, token: &Token, message: String) -> ParseError {
        ParseError {
            line: token.line,
            col: token.col,
            token: token.text.clone(),
            message,
        }
    }

    fn expected(&self, what: &str) -> ParseError {
        let t = self.peek();
        self.error_at(t, format!("expected {what}, found `{}`", t.text))
    }

    fn eat(&mut self, kind: &TokenKind) -> bool {
        if self.peek_kind() == kind {
            self.advance();
            true
        } else {
            false
        }
    }

    fn expect_kind(&mut self, kind: TokenKind, what: &str) -> Result<Token, ParseError> {
        if *self.peek_kind() == kind {
            Ok(self.advance())
        } else {
            Err(self.expected(what))
        }
    }

    fn is_keyword(&self, word: &str) -> bool {
        matches!(self.peek_kind(), TokenKind::Ident(w) if w == word)
    }

    fn expect_keyword(&mut self, word: &str) -> Result<Token, ParseError> {
        if self.is_keyword(word) {
            Ok(self.advance())
        } else {
            Err(self.expected(&format!("`{word}`")))
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, Token), ParseError> {
        match self.peek_kind().clone() {
            TokenKind::Ident(name) => Ok((name, self.advance())),
            _ => Err(self.expected(what)),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        match self.peek_kind().clone() {
            TokenKind::Str(text) => {
                self.advance();
                Ok(text)
            }
            _ => Err(self.expected(what)),
        }
    }

    /// `loc("name", "Op")` after an instruction's types: the imported node it came from.
    fn source_node(&mut self) -> Result<Option<Loc>, ParseError> {
        if !self.is_keyword("loc") {
            return Ok(None);
        }
        self.advance();
        self.expect_kind(TokenKind::LParen, "`(` after `loc`")?;
        let name = self.string("the node's name in quotes")?;
        self.expect_kind(TokenKind::Comma, "`,` after the node's name")?;
        let op = self.string("the node's op type in quotes")?;
        self.expect_kind(TokenKind::RParen, "`)` to close `loc(`")?;
        Ok(Some(Loc::node(&name, &op)))
    }

    fn symbol(&mut self, what: &str) -> Result<(String, Token), ParseError> {
        match self.peek_kind().clone() {
            TokenKind::Symbol(name) => Ok((name, self.advance())),
            _ => Err(self.expected(what)),
        }
    }

    // ----- module level -----

    fn module(&mut self) -> Result<Module, ParseError> {
        self.expect_keyword("module")?;
        self.expect_kind(TokenKind::LBrace, "`{` to open the module")?;
        let mut module = Module::new();
        loop {
            if self.eat(&TokenKind::RBrace) {
                return Ok(module);
            }
            if self.is_keyword("state") {
                let start = self.peek().clone();
                let decl = self.state()?;
                if module.state(&decl.name).is_some() {
                    return Err(
                        self.error_at(&start, format!("state @{} is declared twice", decl.name))
                    );
                }
                module.states.push(decl);
            } else if self.is_keyword("func") {
                let start = self.peek().clone();
                let func = self.function()?;
                if module.function(func.name()).is_some() {
                    return Err(self.error_at(
                        &start,
                        format!("function @{} is defined twice", func.name()),
                    ));
                }
                module.functions.push(func);
            } else {
                return Err(self.expected("`state`, `func` or `}`"));
            }
        }
    }

    fn state(&mut self) -> Result<StateDecl, ParseError> {
        self.expect_keyword("state")?;
        let (name, _) = self.symbol("a state name such as `@fc1.w`")?;
        self.expect_kind(TokenKind::Colon, "`:` and the state's type")?;
        let ty = self.ty()?;
        self.expect_kind(TokenKind::Equals, "`=` and an initializer")?;
        let (init_name, init_token) = self.ident(
            "an initializer: `constant(...)`, `uniform(...)`, `normal(...)` or `values(...)`",
        )?;
        self.expect_kind(TokenKind::LParen, "`(` and the initializer's arguments")?;
        if !ty.shape.is_static() {
            return Err(self.error_at(
                &init_token,
                format!("state @{name} needs a static shape, found {ty}"),
            ));
        }
        let init = if init_name == "values" {
            let raw = self.raw_literal(0)?;
            self.expect_kind(TokenKind::RParen, "`)` after the values")?;
            Initializer::Values(self.literal(&raw, &ty)?)
        } else {
            let attrs = self.attr_list(TokenKind::RParen)?;
            Initializer::from_parts(&init_name, &attrs)
                .map_err(|m| self.error_at(&init_token, m))?
        };
        Ok(StateDecl { name, ty, init })
    }

    fn function(&mut self) -> Result<Function, ParseError> {
        let keyword = self.expect_keyword("func")?;
        let (name, _) = self.symbol("a function name such as `@main`")?;
        let mut func = Function::new(name);
        func.set_loc(Loc::Text {
            line: keyword.line,
            col: keyword.col,
        });
        let body = func.body();
        let mut scope = Scope {
            values: HashMap::new(),
            open: vec![body],
        };
        self.expect_kind(TokenKind::LParen, "`(` and the function's arguments")?;
        self.region_args(&mut func, body, &mut scope)?;
        if self.eat(&TokenKind::Arrow) {
            let types = if self.eat(&TokenKind::LParen) {
                self.type_list(TokenKind::RParen)?
            } else {
                vec![self.ty()?]
            };
            func.set_result_types(types);
        }
        self.expect_kind(TokenKind::LBrace, "`{` to open the function body")?;
        self.region_body(&mut func, body, &mut scope, "return", 0)?;
        self.expect_kind(TokenKind::RBrace, "`}` to close the function")?;
        Ok(func)
    }

    /// `%a: f32[2], %b: i64[]` up to and including `)`.
    fn region_args(
        &mut self,
        func: &mut Function,
        region: Region,
        scope: &mut Scope,
    ) -> Result<(), ParseError> {
        if self.eat(&TokenKind::RParen) {
            return Ok(());
        }
        loop {
            let (name, token) = match self.peek_kind().clone() {
                TokenKind::Value(n) => (n, self.advance()),
                _ => return Err(self.expected("an argument such as `%x: f32[N,784]`")),
            };
            self.expect_kind(TokenKind::Colon, "`:` and the argument's type")?;
            let ty = self.ty()?;
            let v = func.append_region_arg(region, ty, value_name(&name));
            self.define(scope, &name, v, region, &token)?;
            if self.eat(&TokenKind::RParen) {
                return Ok(());
            }
            self.expect_kind(TokenKind::Comma, "`,` or `)`")?;
        }
    }

    fn define(
        &self,
        scope: &mut Scope,
        name: &str,
        v: Value,
        region: Region,
        token: &Token,
    ) -> Result<(), ParseError> {
        if let Some((_, _, line)) = scope.values.get(name) {
            return Err(self.error_at(
                token,
                format!("value %{name} is already defined (line {line}); names are unique within a function"),
            ));
        }
        scope
            .values
            .insert(name.to_owned(), (v, region, token.line));
        Ok(())
    }

    fn use_value(&mut self, scope: &Scope) -> Result<Value, ParseError> {
        let token = self.peek().clone();
        let TokenKind::Value(name) = &token.kind else {
            return Err(self.expected("a value such as `%x`"));
        };
        match scope.values.get(name) {
            Some((v, region, _)) if scope.open.contains(region) => {
                self.advance();
                Ok(*v)
            }
            Some((_, _, line)) => Err(self.error_at(
                &token,
                format!("value %{name} (defined on line {line}) is not visible here: its region has ended"),
            )),
            None => Err(self.error_at(&token, format!("value %{name} is not defined before this use"))),
        }
    }

    fn value_list(&mut self, scope: &Scope) -> Result<Vec<Value>, ParseError> {
        let mut values = Vec::new();
        if !matches!(self.peek_kind(), TokenKind::Value(_)) {
            return Ok(values);
        }
        loop {
            values.push(self.use_value(scope)?);
            if !self.eat(&TokenKind::Comma) {
                return Ok(values);
            }
        }
    }

    // ----- regions and instructions -----

    /// Instructions up to and including the terminator (`return` or `yield`).
    fn region_body(
        &mut self,
        func: &mut Function,
        region: Region,
        scope: &mut Scope,
        terminator: &str,
        depth: usize,
    ) -> Result<(), ParseError> {
        loop {
            if self.is_keyword(terminator) {
                self.advance();
                let results = self.value_list(scope)?;
                func.set_region_results(region, results);
                return Ok(());
            }
            let other = if terminator == "return" {
                "yield"
            } else {
                "return"
            };
            if self.is_keyword(other) || *self.peek_kind() == TokenKind::RBrace {
                return Err(self.expected(&format!("an instruction or `{terminator}`")));
            }
            self.instruction(func, region, scope, depth)?;
        }
    }

    fn instruction(
        &mut self,
        func: &mut Function,
        region: Region,
        scope: &mut Scope,
        depth: usize,
    ) -> Result<(), ParseError> {
        let mut result_names = Vec::new();
        while let TokenKind::Value(name) = self.peek_kind().clone() {
            result_names.push((name, self.advance()));
            if !self.eat(&TokenKind::Comma) {
                self.expect_kind(TokenKind::Equals, "`=` after the result names")?;
                break;
            }
        }
        let (op_name, op_token) = self.ident("an op name such as `add` or `matmul`")?;
        let loc = Loc::Text {
            line: op_token.line,
            col: op_token.col,
        };
        let literal = if op_name == "const" {
            Some(self.raw_literal(0)?)
        } else {
            None
        };
        let mut symbol = None;
        if let TokenKind::Symbol(s) = self.peek_kind().clone() {
            self.advance();
            symbol = Some(s);
            if matches!(self.peek_kind(), TokenKind::Comma) {
                self.advance();
                if !matches!(self.peek_kind(), TokenKind::Value(_)) {
                    return Err(self.expected("an operand such as `%x` after `,`"));
                }
            }
        }
        let args = self.value_list(scope)?;
        let attrs = if self.eat(&TokenKind::LBrace) {
            self.attr_list(TokenKind::RBrace)?
        } else {
            Vec::new()
        };
        let result_types = if self.eat(&TokenKind::Colon) {
            self.type_list_until_region()?
        } else {
            Vec::new()
        };
        let loc = match self.source_node()? {
            Some(node) => node.at_text(op_token.line, op_token.col),
            None => loc,
        };
        if result_types.len() != result_names.len() {
            return Err(self.error_at(
                &op_token,
                format!(
                    "`{op_name}` names {} result{} but states {} result type{}",
                    result_names.len(),
                    if result_names.len() == 1 { "" } else { "s" },
                    result_types.len(),
                    if result_types.len() == 1 { "" } else { "s" },
                ),
            ));
        }
        let op = match literal {
            Some(raw) => {
                let [ty] = &result_types[..] else {
                    return Err(self.error_at(&op_token, "`const` has exactly one result".into()));
                };
                if symbol.is_some() || !args.is_empty() || !attrs.is_empty() {
                    return Err(self.error_at(
                        &op_token,
                        "`const` takes only a literal and a type: `const 1.0 : f32[]`".into(),
                    ));
                }
                Op::Const {
                    value: self.literal(&raw, ty)?,
                    ty: ty.clone(),
                }
            }
            None => Op::from_parts(&OpParts {
                name: &op_name,
                symbol: symbol.as_deref(),
                attrs: &attrs,
                result_types: &result_types,
            })
            .map_err(|m| self.error_at(&op_token, m))?,
        };
        let mut regions = Vec::new();
        for &label in op.region_labels() {
            if depth >= MAX_DEPTH {
                return Err(self.error_at(
                    &op_token,
                    format!("regions are nested more than {MAX_DEPTH} deep"),
                ));
            }
            regions.push(self.region(func, scope, label, depth + 1)?);
        }
        let inst = func.create_inst(op, args, result_types, regions, loc);
        func.append_inst(region, inst);
        let results = func.inst(inst).results.clone();
        for ((name, token), v) in result_names.iter().zip(results) {
            func.set_value_name(v, value_name(name));
            self.define(scope, name, v, region, token)?;
        }
        Ok(())
    }

    /// `label(%a: t, ...) { body yield ... }`
    fn region(
        &mut self,
        func: &mut Function,
        scope: &mut Scope,
        label: &str,
        depth: usize,
    ) -> Result<Region, ParseError> {
        self.expect_keyword(label)?;
        let region = func.create_region();
        scope.open.push(region);
        if self.eat(&TokenKind::LParen) {
            self.region_args(func, region, scope)?;
        }
        self.expect_kind(
            TokenKind::LBrace,
            &format!("`{{` to open the `{label}` region"),
        )?;
        self.region_body(func, region, scope, "yield", depth)?;
        self.expect_kind(
            TokenKind::RBrace,
            &format!("`}}` to close the `{label}` region"),
        )?;
        scope.open.pop();
        Ok(region)
    }

    // ----- types -----

    fn ty(&mut self) -> Result<Type, ParseError> {
        let token = self.peek().clone();
        let TokenKind::Ident(name) = &token.kind else {
            return Err(self.expected("a type such as `f32[N,784]`"));
        };
        let Some(dtype) = DType::from_name(name) else {
            return Err(self.error_at(
                &token,
                format!("expected a dtype (f32, f64, i32, i64, bool), found `{name}`"),
            ));
        };
        self.advance();
        let mut dims = Vec::new();
        if self.eat(&TokenKind::LBracket) && !self.eat(&TokenKind::RBracket) {
            loop {
                let token = self.advance();
                match &token.kind {
                    TokenKind::Number(n) => match n.parse::<usize>() {
                        Ok(size) => dims.push(Dim::Fixed(size)),
                        Err(_) => {
                            return Err(self.error_at(
                                &token,
                                format!("expected a dimension size (a non-negative integer) or a symbol, found `{n}`"),
                            ));
                        }
                    },
                    TokenKind::Ident(s) => dims.push(Dim::Sym(Symbol::new(s))),
                    _ => {
                        return Err(self.error_at(
                            &token,
                            format!(
                                "expected a dimension (a size or a symbol such as `N`), found `{}`",
                                token.text
                            ),
                        ));
                    }
                }
                if self.eat(&TokenKind::RBracket) {
                    break;
                }
                self.expect_kind(TokenKind::Comma, "`,` or `]` in the shape")?;
            }
        }
        Ok(Type::new(dtype, Shape(dims)))
    }

    /// Types separated by commas, ending at `end` (consumed).
    fn type_list(&mut self, end: TokenKind) -> Result<Vec<Type>, ParseError> {
        let mut types = Vec::new();
        if self.eat(&end) {
            return Ok(types);
        }
        loop {
            types.push(self.ty()?);
            if self.eat(&end) {
                return Ok(types);
            }
            self.expect_kind(TokenKind::Comma, "`,` between types")?;
        }
    }

    /// The result types after `:`, one or more, separated by commas.
    fn type_list_until_region(&mut self) -> Result<Vec<Type>, ParseError> {
        let mut types = vec![self.ty()?];
        while self.eat(&TokenKind::Comma) {
            types.push(self.ty()?);
        }
        Ok(types)
    }

    // ----- attributes -----

    /// `key=value, ...` up to and including `end`.
    fn attr_list(&mut self, end: TokenKind) -> Result<Vec<(String, Attr)>, ParseError> {
        let mut attrs: Vec<(String, Attr)> = Vec::new();
        if self.eat(&end) {
            return Ok(attrs);
        }
        loop {
            let (key, key_token) = self.ident("an attribute name")?;
            if attrs.iter().any(|(k, _)| *k == key) {
                return Err(self.error_at(&key_token, format!("attribute `{key}` is given twice")));
            }
            self.expect_kind(TokenKind::Equals, "`=` and the attribute's value")?;
            let value = self.attr_value()?;
            attrs.push((key, value));
            if self.eat(&end) {
                return Ok(attrs);
            }
            self.expect_kind(TokenKind::Comma, "`,` between attributes")?;
        }
    }

    fn attr_value(&mut self) -> Result<Attr, ParseError> {
        let token = self.peek().clone();
        match &token.kind {
            TokenKind::Ident(w) if w == "true" || w == "false" => {
                self.advance();
                Ok(Attr::Bool(w == "true"))
            }
            TokenKind::Number(_) | TokenKind::Ident(_) => self.number_attr(),
            TokenKind::LBracket => {
                self.advance();
                self.list_attr()
            }
            _ => Err(self.expected("an attribute value: a number, `true`, `false` or a list")),
        }
    }

    fn number_attr(&mut self) -> Result<Attr, ParseError> {
        let token = self.advance();
        let text = &token.text;
        if let Ok(i) = text.parse::<i128>() {
            return Ok(Attr::Int(i));
        }
        parse_f64(text)
            .map(Attr::Float)
            .ok_or_else(|| self.error_at(&token, format!("expected a number, found `{text}`")))
    }

    /// After `[`: integers `[0, 2]`, slice ranges `[0:2, :, 1:9:2]` or pairs `[(1, 1), (0, 2)]`.
    fn list_attr(&mut self) -> Result<Attr, ParseError> {
        let mut ints: Vec<i128> = Vec::new();
        let mut slices = Vec::new();
        if self.eat(&TokenKind::RBracket) {
            return Ok(Attr::Ints(Vec::new()));
        }
        if matches!(self.peek_kind(), TokenKind::LParen) {
            return self.pairs_attr();
        }
        loop {
            let start_token = self.peek().clone();
            let first = if matches!(self.peek_kind(), TokenKind::Number(_)) {
                Some(self.small_int()?)
            } else {
                None
            };
            if self.eat(&TokenKind::Colon) {
                let slice = match first {
                    None => AxisSlice::Full,
                    Some(start) => {
                        let end = self.small_int()?;
                        let step = if self.eat(&TokenKind::Colon) {
                            self.small_int()?
                        } else {
                            1
                        };
                        let as_usize = |v: i128| usize::try_from(v).ok();
                        match (as_usize(start), as_usize(end), as_usize(step)) {
                            (Some(start), Some(end), Some(step)) => {
                                AxisSlice::Range { start, end, step }
                            }
                            _ => {
                                return Err(self.error_at(
                                    &start_token,
                                    "slice bounds and steps are non-negative integers".into(),
                                ));
                            }
                        }
                    }
                };
                slices.push(slice);
            } else {
                match first {
                    Some(v) => ints.push(v),
                    None => return Err(self.expected("an integer, a range such as `0:2`, or `:`")),
                }
            }
            if !ints.is_empty() && !slices.is_empty() {
                return Err(self.error_at(&start_token, "a list mixes integers and ranges".into()));
            }
            if self.eat(&TokenKind::RBracket) {
                break;
            }
            self.expect_kind(TokenKind::Comma, "`,` or `]` in the list")?;
        }
        if slices.is_empty() {
            let ints = ints
                .into_iter()
                .map(i64::try_from)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| self.expected("integers that fit in 64 bits"))?;
            Ok(Attr::Ints(ints))
        } else {
            Ok(Attr::Slices(slices))
        }
    }

    /// After `[`, at `(`: `(a, b), (c, d)]`.
    fn pairs_attr(&mut self) -> Result<Attr, ParseError> {
        let mut pairs = Vec::new();
        loop {
            self.expect_kind(TokenKind::LParen, "`(` and a pair such as `(1, 1)`")?;
            let a = self.pair_int()?;
            self.expect_kind(TokenKind::Comma, "`,` between the pair's values")?;
            let b = self.pair_int()?;
            self.expect_kind(TokenKind::RParen, "`)` after the pair")?;
            pairs.push((a, b));
            if self.eat(&TokenKind::RBracket) {
                return Ok(Attr::Pairs(pairs));
            }
            self.expect_kind(TokenKind::Comma, "`,` or `]` in the list of pairs")?;
        }
    }

    fn pair_int(&mut self) -> Result<i64, ParseError> {
        let v = self.small_int()?;
        i64::try_from(v).map_err(|_| self.expected("integers that fit in 64 bits"))
    }

    fn small_int(&mut self) -> Result<i128, ParseError> {
        let token = self.peek().clone();
        match &token.kind {
            TokenKind::Number(n) => match n.parse::<i128>() {
                Ok(v) => {
                    self.advance();
                    Ok(v)
                }
                Err(_) => Err(self.error_at(&token, format!("expected an integer, found `{n}`"))),
            },
            _ => Err(self.expected("an integer")),
        }
    }

    // ----- literals -----

    fn raw_literal(&mut self, depth: usize) -> Result<RawLiteral, ParseError> {
        let token = self.peek().clone();
        match &token.kind {
            TokenKind::Number(_) => Ok(RawLiteral::Scalar(self.advance())),
            TokenKind::Ident(w) if matches!(w.as_str(), "true" | "false" | "nan" | "inf") => {
                Ok(RawLiteral::Scalar(self.advance()))
            }
            TokenKind::LBracket => {
                if depth >= MAX_DEPTH {
                    return Err(self.error_at(&token, "the literal is nested too deeply".into()));
                }
                self.advance();
                let mut items = Vec::new();
                if !self.eat(&TokenKind::RBracket) {
                    loop {
                        items.push(self.raw_literal(depth + 1)?);
                        if self.eat(&TokenKind::RBracket) {
                            break;
                        }
                        self.expect_kind(TokenKind::Comma, "`,` or `]` in the literal")?;
                    }
                }
                Ok(RawLiteral::List(token, items))
            }
            _ => {
                Err(self.expected("a literal: a number, `true`, `false`, `nan`, `inf` or `[...]`"))
            }
        }
    }

    /// Checks a literal's nesting against `ty` and converts its elements to `ty.dtype`.
    fn literal(&self, raw: &RawLiteral, ty: &Type) -> Result<Literal, ParseError> {
        let mut scalars = Vec::new();
        match raw {
            RawLiteral::Scalar(t) => scalars.push(t),
            RawLiteral::List(token, _) => {
                let Some(dims) = ty.shape.as_fixed() else {
                    return Err(self.error_at(
                        token,
                        format!("a literal list needs a static shape, found {ty}; a single element fills any shape"),
                    ));
                };
                self.flatten(raw, &dims, &mut scalars)?;
            }
        }
        let dtype = ty.dtype;
        let bad = |t: &Token| {
            let what = match dtype {
                DType::Bool => "`true` or `false`".to_owned(),
                DType::F32 | DType::F64 => "a number".to_owned(),
                DType::I32 | DType::I64 => format!("an integer that fits in {dtype}"),
            };
            self.error_at(
                t,
                format!(
                    "expected {what} for this {dtype} constant, found `{}`",
                    t.text
                ),
            )
        };
        fn all<T>(
            scalars: &[&Token],
            parse: impl Fn(&str) -> Option<T>,
            bad: impl Fn(&Token) -> ParseError,
        ) -> Result<Vec<T>, ParseError> {
            scalars
                .iter()
                .map(|t| parse(&t.text).ok_or_else(|| bad(t)))
                .collect()
        }
        Ok(match dtype {
            DType::I32 => Literal::I32(all(&scalars, |s| s.parse().ok(), bad)?),
            DType::I64 => Literal::I64(all(&scalars, |s| s.parse().ok(), bad)?),
            DType::F32 => Literal::F32(all(&scalars, parse_f32, bad)?),
            DType::F64 => Literal::F64(all(&scalars, parse_f64, bad)?),
            DType::Bool => Literal::Bool(all(
                &scalars,
                |s| match s {
                    "true" => Some(true),
                    "false" => Some(false),
                    _ => None,
                },
                bad,
            )?),
        })
    }

    fn flatten<'a>(
        &self,
        raw: &'a RawLiteral,
        dims: &[usize],
        out: &mut Vec<&'a Token>,
    ) -> Result<(), ParseError> {
        match (raw, dims) {
            (RawLiteral::Scalar(t), []) => {
                out.push(t);
                Ok(())
            }
            (RawLiteral::Scalar(t), _) => Err(self.error_at(
                t,
                format!(
                    "expected a list of {} elements here, found a single element",
                    dims[0]
                ),
            )),
            (RawLiteral::List(t, _), []) => {
                Err(self.error_at(t, "expected a single element here, found a list".into()))
            }
            (RawLiteral::List(t, items), [n, rest @ ..]) => {
                if items.len() != *n {
                    return Err(self.error_at(
                        t,
                        format!(
                            "expected a list of {n} elements here, found {}",
                            items.len()
                        ),
                    ));
                }
                items
                    .iter()
                    .try_for_each(|item| self.flatten(item, rest, out))
            }
        }
    }
}

/// `%12` is an unnamed value; `%x` a named one.
fn value_name(text: &str) -> Option<String> {
    if text.chars().all(|c| c.is_ascii_digit()) {
        None
    } else {
        Some(text.to_owned())
    }
}

fn parse_f64(text: &str) -> Option<f64> {
    match text {
        "nan" | "-nan" => Some(f64::NAN),
        "inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        // Only numbers as the lexer writes them: no `infinity`, no `1e5.3`.
        _ if text.starts_with(|c: char| c.is_ascii_digit() || c == '-') => text.parse().ok(),
        _ => None,
    }
}

/// Parses as f32 directly (not through f64, which could round twice).
fn parse_f32(text: &str) -> Option<f32> {
    match text {
        "nan" | "-nan" => Some(f32::NAN),
        "inf" => Some(f32::INFINITY),
        "-inf" => Some(f32::NEG_INFINITY),
        _ if text.starts_with(|c: char| c.is_ascii_digit() || c == '-') => text.parse().ok(),
        _ => None,
    }
}
