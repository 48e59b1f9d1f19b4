//! Broadcast simplification: elementwise work moves before a broadcast, onto the smaller
//! tensor, and linear reductions commute with negation. These are the shapes autodiff leaves
//! behind (`mul(broadcast(g), broadcast(c))`, `reduce_sum(neg(x))`, division by a broadcast
//! count).

use super::{RuleFn, Term, fn_rule, ops_in, ty};
use crate::simplify::lang::{Graph, Node, Typing, splat};
use egg::{Id, Rewrite};
use kiln_ir::{BinaryOp, Op, ReduceOp, UnaryOp};

/// The rules that move broadcasts.
pub fn rules() -> Vec<Rewrite<Node, Typing>> {
    let table: [(&str, RuleFn); 6] = [
        ("unary-of-broadcast", unary_of_broadcast), // f(broadcast(x)) = broadcast(f(x)), f elementwise
        ("binary-of-broadcasts", binary_of_broadcasts), // g(broadcast(a), broadcast(b)) = broadcast(g(a, b)), a, b one type
        ("binary-broadcast-splat", binary_broadcast_splat), // g(broadcast(a), c) = broadcast(g(a, c)), c a splat
        ("broadcast-splat", broadcast_splat),               // broadcast(splat c) = splat c
        ("reduce-neg", reduce_neg), // sum(−x) = −sum(x), mean(−x) = −mean(x)
        ("div-broadcast", div_broadcast), // x / broadcast(c) = x · broadcast(1/c)   (rounding)
    ];
    table
        .into_iter()
        .map(|(name, f)| fn_rule(name, f))
        .collect()
}

/// The source of a broadcast in class `id`, with the broadcast's op.
fn broadcast_in(g: &Graph, id: Id) -> Option<(&Op, Id)> {
    ops_in(g, id).find_map(|(op, children)| match op {
        Op::Broadcast { .. } => Some((op, children[0])),
        _ => None,
    })
}

fn elementwise_unary(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Cast { .. })
}

fn unary_of_broadcast(g: &Graph, n: &Node) -> Option<Term> {
    let op = n.ir_op().filter(|op| elementwise_unary(op))?;
    let (broadcast, source) = broadcast_in(g, n.children[0])?;
    let inner = Term::Op(op.clone(), vec![Term::Class(source)]);
    Some(Term::Op(broadcast.clone(), vec![inner]))
}

fn binary_of_broadcasts(g: &Graph, n: &Node) -> Option<Term> {
    let op = n
        .ir_op()
        .filter(|op| matches!(op, Op::Binary(_) | Op::Compare(_)))?;
    let (broadcast, a) = broadcast_in(g, n.children[0])?;
    let (_, b) = broadcast_in(g, n.children[1])?;
    if ty(g, a)? != ty(g, b)? {
        return None;
    }
    let inner = Term::Op(op.clone(), vec![Term::Class(a), Term::Class(b)]);
    Some(Term::Op(broadcast.clone(), vec![inner]))
}

fn binary_broadcast_splat(g: &Graph, n: &Node) -> Option<Term> {
    let op = n
        .ir_op()
        .filter(|op| matches!(op, Op::Binary(_) | Op::Compare(_)))?;
    let (left, right) = (n.children[0], n.children[1]);
    let (broadcast, source, value, source_first) = match (
        broadcast_in(g, left),
        g[right].data.splat,
        broadcast_in(g, right),
        g[left].data.splat,
    ) {
        (Some((bc, a)), Some(c), _, _) => (bc, a, c, true),
        (_, _, Some((bc, b)), Some(c)) => (bc, b, c, false),
        _ => return None,
    };
    let small = Term::Op(splat(ty(g, source)?, value), Vec::new());
    let children = if source_first {
        vec![Term::Class(source), small]
    } else {
        vec![small, Term::Class(source)]
    };
    Some(Term::Op(
        broadcast.clone(),
        vec![Term::Op(op.clone(), children)],
    ))
}

fn broadcast_splat(g: &Graph, n: &Node) -> Option<Term> {
    let Some(Op::Broadcast { shape }) = n.ir_op() else {
        return None;
    };
    let value = g[n.children[0]].data.splat?;
    let source = ty(g, n.children[0])?;
    Some(Term::Op(
        splat(&source.with_shape(shape.clone()), value),
        Vec::new(),
    ))
}

fn reduce_neg(g: &Graph, n: &Node) -> Option<Term> {
    let op @ Op::Reduce {
        op: ReduceOp::Sum | ReduceOp::Mean,
        ..
    } = n.ir_op()?
    else {
        return None;
    };
    ops_in(g, n.children[0]).find_map(|(inner, children)| match inner {
        Op::Unary(UnaryOp::Neg) => Some(Term::Op(
            Op::Unary(UnaryOp::Neg),
            vec![Term::Op(op.clone(), vec![Term::Class(children[0])])],
        )),
        _ => None,
    })
}

fn div_broadcast(g: &Graph, n: &Node) -> Option<Term> {
    let Some(Op::Binary(BinaryOp::Div)) = n.ir_op() else {
        return None;
    };
    if !ty(g, n.children[0])?.dtype.is_float() {
        return None;
    }
    let (broadcast, c) = broadcast_in(g, n.children[1])?;
    let recip = Term::Op(Op::Unary(UnaryOp::Recip), vec![Term::Class(c)]);
    let spread = Term::Op(broadcast.clone(), vec![recip]);
    Some(Term::Op(
        Op::Binary(BinaryOp::Mul),
        vec![Term::Class(n.children[0]), spread],
    ))
}
