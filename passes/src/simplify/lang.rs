//! The e-graph's language: the IR's own ops, plus leaves for values the e-graph does not own.
//!
//! An e-node is an [`Op`] (with its attributes) applied to child e-classes, so every op of the
//! IR is an operator of the language without being declared twice. Each e-class carries its
//! type (inferred with the IR's rules) and, when it holds one, the value of a splat constant.

use egg::{Analysis, DidMerge, EGraph, FromOp, Id, Language};
use kiln_ir::infer::infer;
use kiln_ir::{BinaryOp, CompareOp, Literal, Op, Type, UnaryOp};
use std::fmt;

/// What an e-node is: an IR op, or a leaf (a value the e-graph does not own).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NodeOp {
    /// An IR op.
    Ir(Op),
    /// A value from outside the rewritten code (an argument, a loop's result, …), by index
    /// into [`Typing::leaves`].
    Leaf(u32),
}

/// An e-node: an op and its child classes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node {
    /// The op.
    pub op: NodeOp,
    /// The operands' classes.
    pub children: Vec<Id>,
}

impl Node {
    /// The e-node of IR op `op` over `children`.
    pub fn ir(op: Op, children: Vec<Id>) -> Node {
        Node {
            op: NodeOp::Ir(op),
            children,
        }
    }

    /// The IR op, unless the node is a leaf.
    pub fn ir_op(&self) -> Option<&Op> {
        match &self.op {
            NodeOp::Ir(op) => Some(op),
            NodeOp::Leaf(_) => None,
        }
    }
}

impl Language for Node {
    type Discriminant = &'static str;

    fn discriminant(&self) -> &'static str {
        match &self.op {
            NodeOp::Ir(op) => op.name(),
            NodeOp::Leaf(_) => "leaf",
        }
    }

    fn matches(&self, other: &Node) -> bool {
        self.op == other.op && self.children.len() == other.children.len()
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.op {
            NodeOp::Ir(op) => f.write_str(op.name()),
            NodeOp::Leaf(i) => write!(f, "leaf{i}"),
        }
    }
}

/// Patterns name only ops without attributes: `(add ?x (neg ?y))`.
impl FromOp for Node {
    type Error = String;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Node, String> {
        let op = if let Some(u) = UnaryOp::from_name(op) {
            Op::Unary(u)
        } else if let Some(b) = BinaryOp::from_name(op) {
            Op::Binary(b)
        } else if let Some(c) = CompareOp::from_name(op) {
            Op::Compare(c)
        } else if op == "select" {
            Op::Select
        } else {
            return Err(format!(
                "`{op}` has attributes or is unknown; write the rule in Rust"
            ));
        };
        Ok(Node::ir(op, children))
    }
}

/// What the e-graph knows about a class.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassData {
    /// The class's type; `None` only for an ill-typed node, which is never extracted.
    pub ty: Option<Type>,
    /// The value of every element, when the class holds a splat constant (or a broadcast of
    /// one).
    pub splat: Option<f64>,
}

/// The analysis: types of leaves, and the type and splat value of every class.
#[derive(Default)]
pub struct Typing {
    /// The type of each leaf, by index.
    pub leaves: Vec<Type>,
}

/// An e-graph of IR ops with their types.
pub type Graph = EGraph<Node, Typing>;

/// The type of `op` on children classes, with the IR's inference rules.
pub fn node_type(egraph: &Graph, node: &Node) -> Option<Type> {
    match &node.op {
        NodeOp::Leaf(i) => egraph.analysis.leaves.get(*i as usize).cloned(),
        NodeOp::Ir(op) => {
            let types: Option<Vec<&Type>> = node
                .children
                .iter()
                .map(|&c| egraph[c].data.ty.as_ref())
                .collect();
            let mut out = infer(op, &types?, &[]).ok()?;
            (out.len() == 1).then(|| out.remove(0))
        }
    }
}

impl Analysis<Node> for Typing {
    type Data = ClassData;

    fn make(egraph: &mut Graph, node: &Node, _id: Id) -> ClassData {
        let splat = match &node.op {
            NodeOp::Ir(Op::Const { value, .. }) if value.len() == 1 => Some(value.get_f64(0)),
            NodeOp::Ir(Op::Broadcast { .. }) => egraph[node.children[0]].data.splat,
            _ => None,
        };
        ClassData {
            ty: node_type(egraph, node),
            splat,
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        let mut changed_a = false;
        if a.ty.is_none() && b.ty.is_some() {
            a.ty = b.ty.clone();
            changed_a = true;
        }
        if a.splat.is_none() && b.splat.is_some() {
            a.splat = b.splat;
            changed_a = true;
        }
        let b_differs = a.ty != b.ty || a.splat != b.splat;
        DidMerge(changed_a, b_differs)
    }
}

/// A splat constant of `ty` with every element `value`.
pub fn splat(ty: &Type, value: f64) -> Op {
    Op::Const {
        value: Literal::scalar(ty.dtype, value),
        ty: ty.clone(),
    }
}
