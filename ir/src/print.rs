//! The text form, printed. One op per line, every result typed:
//!
//! ```text
//! module {
//!   state @fc1.w : f32[784,512] = normal(mean=0.0, std=0.02, seed=1)
//!
//!   func @predict(%x: f32[N,784]) -> f32[N,512] {
//!     %w = load @fc1.w : f32[784,512]
//!     %h = matmul %x, %w : f32[N,512]
//!     %y = relu %h : f32[N,512]
//!     return %y
//!   }
//! }
//! ```
//!
//! Named values print as `%name`; the others as `%0`, `%1`, … in order of definition. The
//! parser reads exactly this form back (`parse(print(m)) == m`).

use crate::entities::{Inst, Region, Value};
use crate::function::Function;
use crate::module::{Initializer, Module, StateDecl};
use crate::op::{Attr, Op};
use std::collections::HashMap;
use std::fmt::{self, Write};

/// Notes to print under lines of the text form (the verifier's errors).
#[derive(Default)]
pub struct Annotations {
    /// Keyed by function name and instruction.
    pub insts: HashMap<(String, Inst), Vec<String>>,
    /// Keyed by function name: printed under the `func` line.
    pub functions: HashMap<String, Vec<String>>,
    /// Printed under the module's first line.
    pub module: Vec<String>,
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print_module(self, &Annotations::default()))
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        FunctionPrinter::new(self, &Annotations::default(), &mut out).function(0)?;
        f.write_str(&out)
    }
}

/// Prints a module with `notes` under the lines they refer to.
pub fn print_module(module: &Module, notes: &Annotations) -> String {
    let mut out = String::new();
    print_module_to(module, notes, &mut out).expect("writing to a String cannot fail");
    out
}

fn print_module_to(module: &Module, notes: &Annotations, out: &mut String) -> fmt::Result {
    out.push_str("module {\n");
    for note in &notes.module {
        writeln!(out, "  // error: {note}")?;
    }
    for state in &module.states {
        writeln!(out, "  {}", StateLine(state))?;
    }
    for (i, func) in module.functions.iter().enumerate() {
        if i > 0 || !module.states.is_empty() {
            out.push('\n');
        }
        FunctionPrinter::new(func, notes, out).function(1)?;
    }
    out.push_str("}\n");
    Ok(())
}

/// A state declaration line: `state @w : f32[2,2] = constant(value=0.0)`.
pub struct StateLine<'a>(pub &'a StateDecl);

impl fmt::Display for StateLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        write!(f, "state {} : {} = {}(", Sym(&s.name), s.ty, s.init.name())?;
        match (&s.init, s.ty.shape.as_fixed()) {
            (Initializer::Values(values), Some(dims)) if values.len() > 1 => {
                let mut text = String::new();
                values.fmt_nested(&dims, &mut text)?;
                f.write_str(&text)?;
            }
            (Initializer::Values(values), _) => {
                let mut text = String::new();
                values.fmt_element(0, &mut text)?;
                f.write_str(&text)?;
            }
            (init, _) => write_attr_list(f, &init.attributes())?,
        }
        f.write_str(")")
    }
}

/// `@name`, quoted when the name has characters outside `[A-Za-z0-9_.-/]`.
pub struct Sym<'a>(pub &'a str);

impl fmt::Display for Sym<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.is_empty() && self.0.chars().all(is_symbol_char) {
            write!(f, "@{}", self.0)
        } else {
            write!(f, "@{:?}", self.0)
        }
    }
}

/// Characters allowed in an unquoted `@symbol`.
pub fn is_symbol_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

fn write_attr_list(f: &mut dyn Write, attrs: &[(&str, Attr)]) -> fmt::Result {
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{k}={v}")?;
    }
    Ok(())
}

/// The printed name of every value of one function.
#[derive(Clone)]
pub struct ValueNames {
    names: HashMap<Value, String>,
}

impl ValueNames {
    /// Names `func`'s values: its own name if it has one, else the next free number.
    pub fn new(func: &Function) -> ValueNames {
        let mut names = ValueNames {
            names: HashMap::new(),
        };
        let mut next = 0usize;
        names.region(func, func.body(), &mut next);
        names
    }

    fn define(&mut self, func: &Function, v: Value, next: &mut usize) {
        let name = match func.value_name(v) {
            Some(n) => n.to_owned(),
            None => {
                *next += 1;
                (*next - 1).to_string()
            }
        };
        self.names.insert(v, name);
    }

    fn region(&mut self, func: &Function, region: Region, next: &mut usize) {
        for &v in &func.region(region).args {
            self.define(func, v, next);
        }
        for &inst in &func.region(region).insts {
            let data = func.inst(inst);
            for &r in &data.regions {
                self.region(func, r, next);
            }
            for &v in &data.results {
                self.define(func, v, next);
            }
        }
    }

    /// `%name`; values from outside the function print as their arena id (`%v7?`), which the
    /// verifier reports.
    pub fn get(&self, v: Value) -> String {
        match self.names.get(&v) {
            Some(n) => format!("%{n}"),
            None => format!("%{v}?"),
        }
    }
}

struct FunctionPrinter<'a> {
    func: &'a Function,
    names: std::borrow::Cow<'a, ValueNames>,
    notes: &'a Annotations,
    out: &'a mut String,
}

impl<'a> FunctionPrinter<'a> {
    fn new(func: &'a Function, notes: &'a Annotations, out: &'a mut String) -> Self {
        FunctionPrinter {
            names: std::borrow::Cow::Owned(ValueNames::new(func)),
            func,
            notes,
            out,
        }
    }

    fn indent(&mut self, depth: usize) {
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn note_lines(&mut self, notes: Option<&Vec<String>>, depth: usize) -> fmt::Result {
        for note in notes.into_iter().flatten() {
            self.indent(depth);
            writeln!(self.out, "// error: {note}")?;
        }
        Ok(())
    }

    fn function(&mut self, depth: usize) -> fmt::Result {
        let func = self.func;
        self.indent(depth);
        write!(self.out, "func {}(", Sym(func.name()))?;
        self.typed_values(func.args())?;
        self.out.push(')');
        match func.result_types() {
            [] => {}
            [t] => write!(self.out, " -> {t}")?,
            types => {
                self.out.push_str(" -> (");
                for (i, t) in types.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    write!(self.out, "{t}")?;
                }
                self.out.push(')');
            }
        }
        self.out.push_str(" {\n");
        self.note_lines(self.notes.functions.get(func.name()), depth + 1)?;
        self.region_body(func.body(), depth + 1, "return")?;
        self.indent(depth);
        self.out.push_str("}\n");
        Ok(())
    }

    fn typed_values(&mut self, values: &[Value]) -> fmt::Result {
        for (i, &v) in values.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            write!(
                self.out,
                "{}: {}",
                self.names.get(v),
                self.func.value_type(v)
            )?;
        }
        Ok(())
    }

    fn value_list(&mut self, values: &[Value]) {
        for (i, &v) in values.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            self.out.push_str(&self.names.get(v));
        }
    }

    fn region_body(&mut self, region: Region, depth: usize, terminator: &str) -> fmt::Result {
        for &inst in &self.func.region(region).insts {
            self.inst(inst, depth)?;
        }
        self.indent(depth);
        self.out.push_str(terminator);
        let results = self.func.region(region).results.clone();
        if !results.is_empty() {
            self.out.push(' ');
            self.value_list(&results);
        }
        self.out.push('\n');
        Ok(())
    }

    fn inst(&mut self, inst: Inst, depth: usize) -> fmt::Result {
        let data = self.func.inst(inst);
        self.indent(depth);
        if !data.results.is_empty() {
            self.value_list(&data.results);
            self.out.push_str(" = ");
        }
        self.out.push_str(data.op.name());
        if let Op::Const { value, ty } = &data.op {
            self.out.push(' ');
            match ty.shape.as_fixed() {
                Some(dims) => value.fmt_nested(&dims, self.out)?,
                None => value.fmt_element(0, self.out)?,
            }
        }
        let mut separator = " ";
        if let Some(sym) = data.op.symbol() {
            write!(self.out, " {}", Sym(sym))?;
            separator = ", ";
        }
        if !data.args.is_empty() {
            self.out.push_str(separator);
            self.value_list(&data.args);
        }
        let attrs = data.op.attributes();
        if !attrs.is_empty() {
            self.out.push_str(" {");
            write_attr_list(self.out, &attrs)?;
            self.out.push('}');
        }
        if !data.results.is_empty() {
            self.out.push_str(" : ");
            for (i, &v) in data.results.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                write!(self.out, "{}", self.func.value_type(v))?;
            }
        }
        if let Some(node) = data.loc.source_node() {
            write!(self.out, " loc({:?}, {:?})", &*node.name, &*node.op)?;
        }
        let labels = data.op.region_labels();
        let regions = data.regions.clone();
        for (i, &region) in regions.iter().enumerate() {
            let label = labels.get(i).copied().unwrap_or("region");
            write!(self.out, " {label}")?;
            let args = self.func.region(region).args.clone();
            if !args.is_empty() || self.func.inst(inst).op.regions_take_args() {
                self.out.push('(');
                self.typed_values(&args)?;
                self.out.push(')');
            }
            self.out.push_str(" {\n");
            self.region_body(region, depth + 1, "yield")?;
            self.indent(depth);
            self.out.push('}');
        }
        self.out.push('\n');
        let key = (self.func.name().to_owned(), inst);
        self.note_lines(self.notes.insts.get(&key), depth)
    }
}

/// One instruction as a single line (regions elided), for error messages. It names every
/// value of `func` first: for many lines of one function, [`InstLines`].
pub fn inst_line(func: &Function, inst: Inst) -> String {
    line_with(func, std::borrow::Cow::Owned(ValueNames::new(func)), inst)
}

/// Instructions of one function as single lines, its values named once.
pub struct InstLines<'f> {
    func: &'f Function,
    names: ValueNames,
}

impl<'f> InstLines<'f> {
    /// The lines of `func`'s instructions.
    pub fn new(func: &'f Function) -> InstLines<'f> {
        InstLines {
            func,
            names: ValueNames::new(func),
        }
    }

    /// Instruction `inst` as [`inst_line`] prints it.
    pub fn line(&self, inst: Inst) -> String {
        line_with(self.func, std::borrow::Cow::Borrowed(&self.names), inst)
    }
}

fn line_with(func: &Function, names: std::borrow::Cow<'_, ValueNames>, inst: Inst) -> String {
    let mut out = String::new();
    let notes = Annotations::default();
    let mut printer = FunctionPrinter {
        func,
        names,
        notes: &notes,
        out: &mut out,
    };
    printer
        .inst(inst, 0)
        .expect("writing to a String cannot fail");
    out.lines()
        .next()
        .unwrap_or_default()
        .trim_end_matches(" {")
        .to_owned()
}
