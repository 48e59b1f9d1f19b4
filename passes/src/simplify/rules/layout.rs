//! Layout algebra: chains of transposes, reshapes, broadcasts and casts collapse, and layout
//! ops that change nothing disappear (the applier's type check keeps only the identities).

use super::{RuleFn, Term, fn_rule, ops_in};
use crate::simplify::lang::{Graph, Node, Typing};
use egg::Rewrite;
use kiln_ir::Op;

/// The layout rules (transposes, reshapes, slices).
pub fn rules() -> Vec<Rewrite<Node, Typing>> {
    let table: [(&str, RuleFn); 7] = [
        ("transpose-transpose", transpose_transpose), // transpose(transpose(x, p), q) = transpose(x, p∘q)
        ("transpose-identity", transpose_identity),   // transpose(x, 0..n) = x
        ("reshape-reshape", reshape_reshape),         // reshape(reshape(x)) = reshape(x)
        ("broadcast-broadcast", broadcast_broadcast), // broadcast(broadcast(x)) = broadcast(x)
        ("layout-identity", layout_identity),         // reshape/broadcast/cast of x to x's type = x
        ("slice-whole", slice_whole),                 // slice(x, every axis whole) = x
        ("reshape-of-broadcast-scalar", reshape_of_broadcast_scalar), // reshape(broadcast(s)) = broadcast(s), s a scalar
    ];
    table
        .into_iter()
        .map(|(name, f)| fn_rule(name, f))
        .collect()
}

fn transpose_transpose(g: &Graph, n: &Node) -> Option<Term> {
    let Some(Op::Transpose { perm: outer }) = n.ir_op() else {
        return None;
    };
    ops_in(g, n.children[0]).find_map(|(op, children)| match op {
        Op::Transpose { perm: inner } => {
            let perm = outer.iter().map(|&o| inner[o]).collect();
            Some(Term::Op(
                Op::Transpose { perm },
                vec![Term::Class(children[0])],
            ))
        }
        _ => None,
    })
}

fn transpose_identity(_: &Graph, n: &Node) -> Option<Term> {
    match n.ir_op() {
        Some(Op::Transpose { perm }) if perm.iter().enumerate().all(|(i, &p)| i == p) => {
            Some(Term::Class(n.children[0]))
        }
        _ => None,
    }
}

fn reshape_reshape(g: &Graph, n: &Node) -> Option<Term> {
    let Some(op @ Op::Reshape { .. }) = n.ir_op() else {
        return None;
    };
    ops_in(g, n.children[0]).find_map(|(inner, children)| match inner {
        Op::Reshape { .. } => Some(Term::Op(op.clone(), vec![Term::Class(children[0])])),
        _ => None,
    })
}

fn broadcast_broadcast(g: &Graph, n: &Node) -> Option<Term> {
    let Some(op @ Op::Broadcast { .. }) = n.ir_op() else {
        return None;
    };
    ops_in(g, n.children[0]).find_map(|(inner, children)| match inner {
        Op::Broadcast { .. } => Some(Term::Op(op.clone(), vec![Term::Class(children[0])])),
        _ => None,
    })
}

fn layout_identity(_: &Graph, n: &Node) -> Option<Term> {
    match n.ir_op() {
        Some(Op::Reshape { .. } | Op::Broadcast { .. } | Op::Cast { .. }) => {
            Some(Term::Class(n.children[0]))
        }
        _ => None,
    }
}

fn slice_whole(_: &Graph, n: &Node) -> Option<Term> {
    match n.ir_op() {
        Some(Op::Slice { axes }) if axes.iter().all(|a| *a == kiln_ir::AxisSlice::Full) => {
            Some(Term::Class(n.children[0]))
        }
        _ => None,
    }
}

/// A reshape of a broadcast scalar is a broadcast of that scalar to the new shape (how the
/// builder's `reshape(broadcast(1))` chains in gradients collapse).
fn reshape_of_broadcast_scalar(g: &Graph, n: &Node) -> Option<Term> {
    let Some(Op::Reshape { shape }) = n.ir_op() else {
        return None;
    };
    ops_in(g, n.children[0]).find_map(|(inner, children)| match inner {
        Op::Broadcast { .. } if super::ty(g, children[0]).is_some_and(|t| t.rank() == 0) => {
            Some(Term::Op(
                Op::Broadcast {
                    shape: shape.clone(),
                },
                vec![Term::Class(children[0])],
            ))
        }
        _ => None,
    })
}
