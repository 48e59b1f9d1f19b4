//! Shape arithmetic over symbolic dimensions. A model exported with a dynamic batch computes
//! its reshapes from `Shape(x)`, whose entries are then symbols (`batch`) as well as numbers;
//! such values are tracked here, entry by entry, through the ops shape arithmetic uses
//! (`Gather`, `Unsqueeze`, `Squeeze`, `Concat`, `Slice`, `Cast`, `Identity`, and `Mul`, `Div`,
//! `Add`, `Sub` where the result stays a number or a symbol) and given to `Reshape`, `Expand`
//! and `ConstantOfShape` as shapes. Using one as data is refused by name.

use crate::context::{Env, Fail, Slot, axis, unsupported};
use crate::node::Node;
use kiln_ir::{Dim, FunctionBuilder, Symbol};

/// One entry of a shape value: a number or a symbolic size.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Entry {
    /// A number (a size, or -1 / 0 for `Reshape`).
    Int(i64),
    /// A symbolic size.
    Sym(Symbol),
}

impl Entry {
    /// The entry for a dimension.
    pub(crate) fn of(d: &Dim) -> Entry {
        match d {
            Dim::Fixed(n) => Entry::Int(*n as i64),
            Dim::Sym(s) => Entry::Sym(s.clone()),
        }
    }
}

/// A 0-D or 1-D integer tensor with symbolic entries.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SymShape {
    pub(crate) entries: Vec<Entry>,
    pub(crate) scalar: bool,
}

/// Whether the node computes on symbolic shapes: its input is a symbolic shape value, or it is
/// `Shape` of a value with symbolic dimensions.
pub(crate) fn applies(node: &Node, env: &Env, b: &FunctionBuilder) -> bool {
    let inputs = &node.proto.input;
    const ARITHMETIC: [&str; 11] = [
        "Identity",
        "Cast",
        "Gather",
        "Unsqueeze",
        "Squeeze",
        "Concat",
        "Slice",
        "Mul",
        "Div",
        "Add",
        "Sub",
    ];
    let on_shapes = inputs
        .iter()
        .any(|i| matches!(env.slots.get(i), Some(Slot::Shape(_))));
    if on_shapes && ARITHMETIC.contains(&node.op_type()) {
        return true; // the consumers (Reshape, Expand, ConstantOfShape) read shapes themselves
    }
    let input = inputs.first().and_then(|i| env.slots.get(i));
    node.op_type() == "Shape"
        && matches!(input, Some(Slot::Value(v)) if !b.value_type(*v).shape.is_static())
}

/// The entries of input `name`: a symbolic shape, or known integers.
pub(crate) fn entries(env: &Env, name: &str) -> Option<SymShape> {
    match env.slots.get(name)? {
        Slot::Shape(s) => Some(s.clone()),
        Slot::Known { array, .. } if array.dtype().is_int() && array.shape().len() <= 1 => {
            Some(SymShape {
                entries: array
                    .to_f64_vec()
                    .iter()
                    .map(|&x| Entry::Int(x as i64))
                    .collect(),
                scalar: array.shape().is_empty(),
            })
        }
        _ => None,
    }
}

/// Evaluates the node on symbolic shapes.
pub(crate) fn eval(node: &Node, env: &Env, b: &FunctionBuilder) -> Result<Vec<SymShape>, Fail> {
    let input = |i: usize| -> Result<SymShape, Fail> {
        let name = node
            .proto
            .input
            .get(i)
            .ok_or_else(|| format!("input {i} is required"))?;
        entries(env, name).ok_or_else(|| {
            Fail::Unsupported(format!(
                "{} mixing a symbolic shape with computed data",
                node.op_type()
            ))
        })
    };
    let one = |entries: Vec<Entry>| {
        Ok(vec![SymShape {
            entries,
            scalar: false,
        }])
    };
    match node.op_type() {
        "Shape" => {
            let Some(Slot::Value(v)) = node.proto.input.first().and_then(|i| env.slots.get(i))
            else {
                return Err("Shape of an undefined value".into());
            };
            let dims = b.value_type(*v).shape.dims().to_vec();
            let rank = dims.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + rank } else { v }).clamp(0, rank) as usize;
            let (start, end) = (clamp(node.int("start", 0)?), clamp(node.int("end", rank)?));
            one(dims[start..end.max(start)].iter().map(Entry::of).collect())
        }
        "Identity" => Ok(vec![input(0)?]),
        "Cast" => match node.int("to", 0)? {
            6 | 7 => Ok(vec![input(0)?]), // to i32 or i64: the sizes stay sizes
            _ => unsupported("a symbolic shape cast to a non-integer type"),
        },
        "Gather" => {
            let data = input(0)?;
            if data.scalar || axis(node.int("axis", 0)?, 1)? != 0 {
                return Err("Gather on a shape along an axis it lacks".into());
            }
            let idx = input(1)?;
            let n = data.entries.len() as i64;
            let entries = (idx.entries.iter())
                .map(|e| match e {
                    Entry::Int(i) if (-n..n).contains(i) => {
                        Ok(data.entries[i.rem_euclid(n) as usize].clone())
                    }
                    _ => Err(Fail::Invalid(format!(
                        "index {e:?} is out of range for a shape of {n}"
                    ))),
                })
                .collect::<Result<_, _>>()?;
            Ok(vec![SymShape {
                entries,
                scalar: idx.scalar,
            }])
        }
        "Unsqueeze" => match input(0)? {
            s if s.scalar => {
                check_only_axis(node, env, true)?;
                Ok(vec![SymShape { scalar: false, ..s }])
            }
            _ => unsupported("Unsqueeze of a 1-D symbolic shape (a 2-D shape value)"),
        },
        "Squeeze" => {
            let s = input(0)?;
            match s.entries.len() {
                1 => {
                    check_only_axis(node, env, false)?;
                    Ok(vec![SymShape { scalar: true, ..s }])
                }
                _ => unsupported("Squeeze of a symbolic shape of more than one entry"),
            }
        }
        "Concat" => {
            let axis = node.int("axis", 0)?;
            if axis != 0 && axis != -1 {
                return Err(format!("axis {axis} is out of range for 1-D shape values").into());
            }
            let mut all = Vec::new();
            for i in 0..node.proto.input.len() {
                let part = input(i)?;
                if part.scalar {
                    return Err("Concat of a scalar (its inputs need rank 1 or more)".into());
                }
                all.extend(part.entries);
            }
            one(all)
        }
        "Slice" => slice(node, input(0)?, env),
        "Mul" | "Div" | "Add" | "Sub" => arithmetic(node.op_type(), input(0)?, input(1)?),
        other => unsupported(format!("{other} of a symbolic shape")),
    }
}

/// The axes of an Unsqueeze or Squeeze between a scalar and a 1-D shape value (by attribute,
/// or by its second input): each must be that value's one axis, 0 or −1, or the lowering would
/// put the entries on an axis it does not make. `one` asks for at most one (Unsqueeze: two
/// would make a 2-D shape value, which is valid but not supported).
fn check_only_axis(node: &Node, env: &Env, one: bool) -> Result<(), Fail> {
    let given = node.proto.input.get(1).filter(|n| !n.is_empty());
    let axes: Vec<Entry> = match given {
        Some(name) => (entries(env, name).ok_or("the axes must be known at import")?).entries,
        None => (node.ints("axes").unwrap_or_default().iter())
            .map(|&i| Entry::Int(i))
            .collect(),
    };
    if one && axes.len() > 1 {
        return unsupported("Unsqueeze of a symbolic size to a shape value of rank 2 or more");
    }
    match axes.iter().all(|e| matches!(e, Entry::Int(0 | -1))) {
        true => Ok(()),
        false => Err(format!(
            "the axes {axes:?} should name the one axis of a 1-D shape value (0 or -1)"
        )
        .into()),
    }
}

fn slice(node: &Node, s: SymShape, env: &Env) -> Result<Vec<SymShape>, Fail> {
    let ints = |i: usize| -> Option<Vec<i64>> {
        let name = node.proto.input.get(i).filter(|n| !n.is_empty())?;
        let e = entries(env, name)?;
        e.entries
            .iter()
            .map(|x| {
                if let Entry::Int(v) = x {
                    Some(*v)
                } else {
                    None
                }
            })
            .collect()
    };
    let (Some(starts), Some(ends)) = (ints(1), ints(2)) else {
        return unsupported("Slice of a symbolic shape with bounds not known");
    };
    let given = |i: usize| node.proto.input.get(i).is_some_and(|n| !n.is_empty());
    let steps = match given(4) {
        true => ints(4)
            .ok_or_else(|| Fail::Unsupported("Slice of a shape with unknown steps".into()))?,
        false => vec![1],
    };
    let axes_ok = !given(3) || matches!(ints(3).as_deref(), Some([0] | [-1]));
    if starts.len() != 1 || ends.len() != 1 || steps != [1] || !axes_ok {
        return unsupported("Slice of a symbolic shape other than one range by 1");
    }
    let n = s.entries.len() as i64;
    let bound = |v: i64| (if v < 0 { v.saturating_add(n) } else { v }).clamp(0, n) as usize;
    let (start, end) = (bound(starts[0]), bound(ends[0]));
    Ok(vec![SymShape {
        entries: s.entries[start..end.max(start)].to_vec(),
        scalar: false,
    }])
}

fn checked(v: Option<i64>) -> Result<i64, Fail> {
    v.ok_or_else(|| Fail::Invalid("shape arithmetic overflows i64".into()))
}

/// Elementwise arithmetic that keeps each entry a number or a symbol (`s·1`, `s/1`, `s+0`).
fn arithmetic(op: &str, a: SymShape, b: SymShape) -> Result<Vec<SymShape>, Fail> {
    let n = a.entries.len().max(b.entries.len());
    let at = |s: &SymShape, i: usize| s.entries[if s.entries.len() == 1 { 0 } else { i }].clone();
    if (a.entries.len() != n && a.entries.len() != 1)
        || (b.entries.len() != n && b.entries.len() != 1)
    {
        return Err("shapes of different lengths combined".into());
    }
    let mut entries = Vec::with_capacity(n);
    for i in 0..n {
        entries.push(match (op, at(&a, i), at(&b, i)) {
            ("Mul", Entry::Int(x), Entry::Int(y)) => Entry::Int(checked(x.checked_mul(y))?),
            ("Div", Entry::Int(x), Entry::Int(y)) if y != 0 => {
                Entry::Int(checked(x.checked_div(y))?)
            }
            ("Add", Entry::Int(x), Entry::Int(y)) => Entry::Int(checked(x.checked_add(y))?),
            ("Sub", Entry::Int(x), Entry::Int(y)) => Entry::Int(checked(x.checked_sub(y))?),
            ("Mul", Entry::Sym(s), Entry::Int(1)) | ("Mul", Entry::Int(1), Entry::Sym(s)) => {
                Entry::Sym(s)
            }
            ("Div", Entry::Sym(s), Entry::Int(1)) => Entry::Sym(s),
            ("Add" | "Sub", Entry::Sym(s), Entry::Int(0)) => Entry::Sym(s),
            ("Add", Entry::Int(0), Entry::Sym(s)) => Entry::Sym(s),
            (op, x, y) => return unsupported(format!("{op} of symbolic sizes {x:?} and {y:?}")),
        });
    }
    Ok(vec![SymShape {
        entries,
        scalar: a.scalar && b.scalar,
    }])
}
