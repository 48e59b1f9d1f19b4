//! The book's generated parts (`docs/`): the op reference, made from the op table, and the
//! mdBook preprocessor that puts it where a chapter says `{{#kiln-ops}}`.

use kiln_backend::exec::INTERPRETER_KERNELS;
use kiln_ir::{Op, OpClass};

/// The marker a chapter writes where the op reference goes.
pub const OPS_MARKER: &str = "{{#kiln-ops}}";

/// Every op of the op table as Markdown tables, one per class, classes and ops in table
/// order.
pub fn ops_reference() -> String {
    let mut ops: Vec<Op> = Vec::new();
    for op in Op::representatives() {
        if !ops.iter().any(|o| o.name() == op.name()) {
            ops.push(op);
        }
    }
    let mut classes: Vec<OpClass> = Vec::new();
    for op in &ops {
        if !classes.contains(&op.class()) {
            classes.push(op.class());
        }
    }
    let mut out = format!("{} ops.\n", ops.len());
    for class in classes {
        let mine: Vec<&Op> = ops.iter().filter(|op| op.class() == class).collect();
        out.push_str(&format!("\n## {}\n\n", class_title(class)));
        out.push_str("| op | operands | attributes | cost per element | compiled run |\n");
        out.push_str("|---|---|---|---|---|\n");
        for op in mine {
            let attrs: Vec<String> = (op.attributes().iter())
                .map(|(name, value)| format!("`{name}={value}`"))
                .collect();
            out.push_str(&format!(
                "| `{}` | {} | {} | {:?} | {} |\n",
                op.name(),
                operands(op),
                if attrs.is_empty() {
                    "—".into()
                } else {
                    attrs.join(" ")
                },
                op.cost(),
                execution(op),
            ));
        }
    }
    out
}

fn class_title(class: OpClass) -> &'static str {
    match class {
        OpClass::Elementwise => "Elementwise",
        OpClass::Layout => "Layout: moving elements",
        OpClass::Reduction => "Reductions and windows",
        OpClass::Contraction => "Contractions",
        OpClass::Indexing => "Indexing",
        OpClass::Source => "Sources: constants, ranges, random numbers, state",
        OpClass::Effect => "Effects",
        OpClass::Control => "Control flow",
        OpClass::Call => "Custom ops",
        OpClass::Communication => "Communication between ranks",
    }
}

/// The operand dtypes of an elementwise op (from its table row), and its shorthand method.
fn operands(op: &Op) -> String {
    let (class, method) = match op {
        Op::Unary(u) => (u.operand_class(), u.method()),
        Op::Binary(b) => (b.operand_class(), b.method()),
        Op::Compare(c) => (c.operand_class(), c.method()),
        _ => return "see [the text IR](text-ir.md)".into(),
    };
    format!("{} (`.{method}()`)", class.describe())
}

/// How a compiled run executes the op.
fn execution(op: &Op) -> &'static str {
    match op.class() {
        OpClass::Communication => "the communicator",
        OpClass::Call => "the custom op's code",
        OpClass::Control => "native loop or branch; regions compiled",
        _ if INTERPRETER_KERNELS.contains(&op.name()) => "the interpreter's kernel",
        OpClass::Elementwise | OpClass::Reduction => "fused JIT kernel",
        OpClass::Contraction => "gemm, or a JIT kernel",
        _ => "native",
    }
}

/// mdBook's preprocessor protocol: `input` is `[context, book]` as JSON; the answer is the
/// book with every chapter's [`OPS_MARKER`] replaced by [`ops_reference`].
pub fn preprocess(input: &str) -> Result<String, String> {
    let parsed: serde_json::Value =
        serde_json::from_str(input).map_err(|e| format!("not mdBook's input: {e}"))?;
    let mut book = parsed.get(1).cloned().ok_or("mdBook's input has no book")?;
    let reference = ops_reference();
    replace_in_chapters(&mut book, &reference);
    serde_json::to_string(&book).map_err(|e| e.to_string())
}

/// Replaces the marker in every `content` string below `value` (chapters nest as
/// `sections` / `items` → `Chapter` → `sub_items`).
fn replace_in_chapters(value: &mut serde_json::Value, reference: &str) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                match v {
                    serde_json::Value::String(s) if key == "content" && s.contains(OPS_MARKER) => {
                        *s = s.replace(OPS_MARKER, reference);
                    }
                    _ => replace_in_chapters(v, reference),
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                replace_in_chapters(v, reference);
            }
        }
        _ => {}
    }
}
