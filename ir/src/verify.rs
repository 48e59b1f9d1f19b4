//! The verifier: types, shapes, SSA dominance, region structure and state use.
//!
//! It collects every error rather than stopping at the first, ties each to the instruction it
//! concerns, and can reprint the module with each error under its line ([`VerifyErrors::render`])
//! or, for a module parsed from text, point into the source ([`VerifyErrors::render_source`]).

use crate::entities::{Inst, Region, Value};
use crate::function::{Function, ValueDef};
use crate::infer::{RegionTypes, infer};
use crate::loc::Loc;
use crate::module::{Initializer, Module};
use crate::op::Op;
use crate::print::{Annotations, inst_line, print_module};
use crate::types::{Symbol, Type};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// A verifier error: which function and instruction, where, and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The function, if the error is inside one.
    pub function: Option<String>,
    /// The instruction, if the error concerns one.
    pub inst: Option<Inst>,
    /// Where the instruction came from.
    pub loc: Loc,
    /// The instruction as one line of text, when there is one.
    pub context: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(func) = &self.function {
            write!(f, "in @{func}")?;
            if self.loc.is_known() {
                write!(f, " at {}", self.loc)?;
            }
            f.write_str(": ")?;
        }
        f.write_str(&self.message)?;
        if let Some(line) = &self.context {
            write!(f, "\n    in: {line}")?;
        }
        Ok(())
    }
}

/// Every error the verifier found, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyErrors(pub Vec<VerifyError>);

impl fmt::Display for VerifyErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for VerifyErrors {}

impl VerifyErrors {
    /// The module printed with each error as a comment under the line it concerns.
    pub fn render(&self, module: &Module) -> String {
        let mut notes = Annotations::default();
        for e in &self.0 {
            match (&e.function, e.inst) {
                (Some(func), Some(inst)) => notes
                    .insts
                    .entry((func.clone(), inst))
                    .or_default()
                    .push(e.message.clone()),
                (Some(func), None) => notes
                    .functions
                    .entry(func.clone())
                    .or_default()
                    .push(e.message.clone()),
                (None, _) => notes.module.push(e.message.clone()),
            }
        }
        print_module(module, &notes)
    }

    /// For a module parsed from `source`: each error with its source line and a caret.
    pub fn render_source(&self, source: &str) -> String {
        let rendered: Vec<String> = self
            .0
            .iter()
            .map(|e| {
                let prefix = e
                    .function
                    .as_ref()
                    .map(|f| format!("in @{f}: "))
                    .unwrap_or_default();
                let mut message = format!("{prefix}{}", e.message);
                if let Some(node) = e.loc.source_node() {
                    message += &format!(" (converted from {node})");
                }
                match e.loc.text_position() {
                    Some((line, col)) => crate::diagnostic::render(source, line, col, &message),
                    None => format!("error: {message}"),
                }
            })
            .collect();
        rendered.join("\n")
    }
}

/// Verifies every function of `module` and the module's own declarations.
pub fn verify_module(module: &Module) -> Result<(), VerifyErrors> {
    let mut errors = Vec::new();
    let module_error = |message: String| VerifyError {
        function: None,
        inst: None,
        loc: Loc::Unknown,
        context: None,
        message,
    };
    let mut states = HashSet::new();
    for s in &module.states {
        if !states.insert(&s.name) {
            errors.push(module_error(format!("state @{} is declared twice", s.name)));
        }
        if s.name.is_empty() {
            errors.push(module_error("a state has an empty name".into()));
        }
        if !s.ty.shape.is_static() {
            errors.push(module_error(format!(
                "state @{} needs a static shape, found {}",
                s.name, s.ty
            )));
        }
        if let Err(message) = s.ty.check_addressable() {
            errors.push(module_error(format!("state @{}: {message}", s.name)));
        }
        if let Initializer::Values(values) = &s.init
            && let Err(message) = Initializer::check_values(values, &s.ty)
        {
            errors.push(module_error(format!("state @{}: {message}", s.name)));
        }
    }
    let mut functions = HashSet::new();
    for f in &module.functions {
        if !functions.insert(f.name()) {
            errors.push(module_error(format!(
                "function @{} is defined twice",
                f.name()
            )));
        }
        errors.extend(verify_function(f, module));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(VerifyErrors(errors))
    }
}

/// Verifies one function against `module`'s state declarations.
pub fn verify_function(func: &Function, module: &Module) -> Vec<VerifyError> {
    let mut v = Verifier {
        func,
        module,
        errors: Vec::new(),
        placed: HashSet::new(),
        stored: HashMap::new(),
        symbols: func
            .arg_types()
            .flat_map(|t| t.shape.symbols().cloned())
            .collect(),
    };
    if func.name().is_empty() {
        v.error(None, "the function has an empty name".into());
    }
    for &arg in func.args() {
        if let Err(message) = func.value_type(arg).check_addressable() {
            let name = func
                .value_name(arg)
                .map_or(arg.to_string(), |n| format!("%{n}"));
            v.error(None, format!("argument {name}: {message}"));
        }
    }
    v.check_names();
    v.region(func.body(), &mut vec![HashSet::new()]);
    let yielded: Vec<&Type> = func.results().iter().map(|&r| func.value_type(r)).collect();
    let declared: Vec<&Type> = func.result_types().iter().collect();
    if yielded != declared {
        v.error(
            None,
            format!(
                "the function returns ({}) but its signature says ({})",
                list(&yielded),
                list(&declared)
            ),
        );
    }
    v.errors
}

fn list(types: &[&Type]) -> String {
    types
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

struct Verifier<'a> {
    func: &'a Function,
    module: &'a Module,
    errors: Vec<VerifyError>,
    placed: HashSet<Inst>,
    /// State stored so far, with the storing instruction.
    stored: HashMap<String, Inst>,
    /// Symbols bound by the function's arguments.
    symbols: HashSet<Symbol>,
}

/// Whether `name` is a valid value name in the text form.
pub fn is_valid_value_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

impl Verifier<'_> {
    fn error(&mut self, inst: Option<Inst>, message: String) {
        self.errors.push(VerifyError {
            function: Some(self.func.name().to_owned()),
            inst,
            loc: inst.map_or(self.func.loc(), |i| self.func.inst(i).loc),
            context: inst.map(|i| inst_line(self.func, i)),
            message,
        });
    }

    fn check_names(&mut self) {
        let mut seen = HashSet::new();
        let mut bad = Vec::new();
        let mut collect = |v: Value, func: &Function| {
            if let Some(name) = func.value_name(v) {
                if !is_valid_value_name(name) {
                    bad.push(format!("value name `%{name}` is not valid: names start with a letter or `_` and hold letters, digits, `_` and `.`"));
                } else if !seen.insert(name.to_owned()) {
                    bad.push(format!("value name `%{name}` is used twice"));
                }
            }
        };
        for inst in self.func.walk_insts() {
            for &r in &self.func.inst(inst).regions {
                for &a in &self.func.region(r).args {
                    collect(a, self.func);
                }
            }
            for &res in &self.func.inst(inst).results {
                collect(res, self.func);
            }
        }
        for &a in self.func.args() {
            collect(a, self.func);
        }
        for message in bad {
            self.error(None, message);
        }
    }

    /// Checks `region` with `scopes` holding the values visible from enclosing regions.
    fn region(&mut self, region: Region, scopes: &mut Vec<HashSet<Value>>) {
        let func = self.func;
        let data = func.region(region);
        let mut here = HashSet::new();
        for (i, &arg) in data.args.iter().enumerate() {
            if func.value(arg).def != ValueDef::Arg(region, i) {
                self.error(
                    None,
                    format!("region argument {arg} records a different definition"),
                );
            }
            self.check_symbols(None, func.value_type(arg));
            self.check_size(None, arg);
            here.insert(arg);
        }
        scopes.push(here);
        for &inst in &data.insts {
            self.inst(inst, region, scopes);
        }
        let unseen: Vec<Value> = data
            .results
            .iter()
            .copied()
            .filter(|v| !scopes.iter().any(|s| s.contains(v)))
            .collect();
        for v in unseen {
            let kind = if region == func.body() {
                "returns"
            } else {
                "yields"
            };
            self.error(
                data.parent,
                format!("a region {kind} {v}, which is not defined before the end of the region"),
            );
        }
        scopes.pop();
    }

    fn inst(&mut self, inst: Inst, region: Region, scopes: &mut Vec<HashSet<Value>>) {
        let func = self.func;
        let data = func.inst(inst);
        if !self.placed.insert(inst) {
            self.error(Some(inst), "the instruction is placed twice".into());
            return;
        }
        for &arg in &data.args {
            if !scopes.iter().any(|s| s.contains(&arg)) {
                self.error(
                    Some(inst),
                    format!("operand {arg} is not defined before this use in an enclosing region"),
                );
            }
        }
        for &r in &data.regions {
            if func.region(r).parent != Some(inst) {
                self.error(Some(inst), format!("{r} records a different parent"));
            }
            self.region(r, scopes);
        }
        for (i, &res) in data.results.iter().enumerate() {
            if func.value(res).def != ValueDef::Result(inst, i) {
                self.error(
                    Some(inst),
                    format!("result {res} records a different definition"),
                );
            }
            self.check_symbols(Some(inst), func.value_type(res));
            self.check_size(Some(inst), res);
        }
        self.check_types(inst);
        self.check_state(inst, region);
        scopes
            .last_mut()
            .expect("a region scope is open")
            .extend(data.results.iter().copied());
    }

    fn check_types(&mut self, inst: Inst) {
        let func = self.func;
        let data = func.inst(inst);
        let arg_types: Vec<&Type> = data.args.iter().map(|&a| func.value_type(a)).collect();
        let region_types: Vec<RegionTypes<'_>> = data
            .regions
            .iter()
            .map(|&r| RegionTypes {
                args: func
                    .region(r)
                    .args
                    .iter()
                    .map(|&a| func.value_type(a))
                    .collect(),
                results: func
                    .region(r)
                    .results
                    .iter()
                    .map(|&a| func.value_type(a))
                    .collect(),
            })
            .collect();
        match infer(&data.op, &arg_types, &region_types) {
            Err(e) => self.error(Some(inst), e.to_string()),
            Ok(expected) => {
                let stated: Vec<&Type> = data.results.iter().map(|&r| func.value_type(r)).collect();
                let expected: Vec<&Type> = expected.iter().collect();
                if stated != expected {
                    self.error(
                        Some(inst),
                        format!(
                            "{}: the result type is stated as ({}) but the op gives ({})",
                            data.op.name(),
                            list(&stated),
                            list(&expected)
                        ),
                    );
                }
            }
        }
    }

    fn check_state(&mut self, inst: Inst, region: Region) {
        let data = self.func.inst(inst);
        let (name, ty) = match &data.op {
            Op::Load { state, ty } => (state, ty),
            Op::Store { state } => match data.args.first() {
                Some(&v) => (state, self.func.value_type(v)),
                None => return,
            },
            _ => return,
        };
        let what = data.op.name();
        let Some(decl) = self.module.state(name) else {
            let known: Vec<String> = self
                .module
                .states
                .iter()
                .map(|s| format!("@{}", s.name))
                .collect();
            let known = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            self.error(
                Some(inst),
                format!("{what}: state @{name} is not declared (declared: {known})"),
            );
            return;
        };
        if decl.ty != *ty {
            self.error(
                Some(inst),
                format!("{what}: state @{name} has type {}, found {ty}", decl.ty),
            );
        }
        if let Op::Store { .. } = data.op {
            if region != self.func.body() {
                self.error(
                    Some(inst),
                    format!("store: @{name} is stored inside a region; stores belong at the top level of a function"),
                );
            }
            if self.stored.insert(name.clone(), inst).is_some() {
                self.error(
                    Some(inst),
                    format!("store: @{name} is stored twice in one function"),
                );
            }
        }
    }

    /// A value whose type no memory can hold would overflow every size computed from it.
    fn check_size(&mut self, inst: Option<Inst>, v: Value) {
        if let Err(message) = self.func.value_type(v).check_addressable() {
            let name = self
                .func
                .value_name(v)
                .map_or(v.to_string(), |n| format!("%{n}"));
            self.error(inst, format!("{name}: {message}"));
        }
    }

    fn check_symbols(&mut self, inst: Option<Inst>, ty: &Type) {
        let unbound: Vec<String> = ty
            .shape
            .symbols()
            .filter(|s| !self.symbols.contains(*s))
            .map(|s| s.to_string())
            .collect();
        if !unbound.is_empty() {
            self.error(
                inst,
                format!(
                    "type {ty} uses symbol{} {} that no function argument binds",
                    if unbound.len() == 1 { "" } else { "s" },
                    unbound.join(", ")
                ),
            );
        }
    }
}
