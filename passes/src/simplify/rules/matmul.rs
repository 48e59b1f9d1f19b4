//! Matmul rules: transposes of the last two axes fold into the matmul's flags, and a
//! transposed product is a product of transposes (`(AB)ᵀ = BᵀAᵀ`).

use super::{RuleFn, Term, fn_rule, ops_in};
use crate::simplify::lang::{Graph, Node, Typing};
use egg::{Id, Rewrite};
use kiln_ir::Op;

/// The matmul rules.
pub fn rules() -> Vec<Rewrite<Node, Typing>> {
    let table: [(&str, RuleFn); 3] = [
        ("matmul-transposed-a", matmul_transposed_a), // matmul(tᵀ(a), b, ta, tb) = matmul(a, b, !ta, tb)
        ("matmul-transposed-b", matmul_transposed_b), // matmul(a, tᵀ(b), ta, tb) = matmul(a, b, ta, !tb)
        ("transpose-of-matmul", transpose_of_matmul), // tᵀ(matmul(a, b, ta, tb)) = matmul(b, a, !tb, !ta)
    ];
    table
        .into_iter()
        .map(|(name, f)| fn_rule(name, f))
        .collect()
}

/// Whether `perm` swaps the last two axes and keeps the rest.
fn swaps_last_two(perm: &[usize]) -> bool {
    let n = perm.len();
    n >= 2
        && perm[n - 2] == n - 1
        && perm[n - 1] == n - 2
        && perm[..n - 2].iter().enumerate().all(|(i, &p)| i == p)
}

/// The source of a last-two-axes transpose in class `id`.
fn swapped_in(g: &Graph, id: Id) -> Option<Id> {
    ops_in(g, id).find_map(|(op, children)| match op {
        Op::Transpose { perm } if swaps_last_two(perm) => Some(children[0]),
        _ => None,
    })
}

fn matmul_transposed_a(g: &Graph, n: &Node) -> Option<Term> {
    fold_transpose_into_matmul(g, n, 0)
}

fn matmul_transposed_b(g: &Graph, n: &Node) -> Option<Term> {
    fold_transpose_into_matmul(g, n, 1)
}

/// `matmul` with operand `operand` a last-two-axes transpose: the transpose's source, with
/// that operand's flag flipped.
fn fold_transpose_into_matmul(g: &Graph, n: &Node, operand: usize) -> Option<Term> {
    let Some(&Op::MatMul {
        transpose_a,
        transpose_b,
    }) = n.ir_op()
    else {
        return None;
    };
    let mut children = [Term::Class(n.children[0]), Term::Class(n.children[1])];
    children[operand] = Term::Class(swapped_in(g, n.children[operand])?);
    let op = Op::MatMul {
        transpose_a: transpose_a ^ (operand == 0),
        transpose_b: transpose_b ^ (operand == 1),
    };
    Some(Term::Op(op, children.into()))
}

fn transpose_of_matmul(g: &Graph, n: &Node) -> Option<Term> {
    let Some(Op::Transpose { perm }) = n.ir_op() else {
        return None;
    };
    if !swaps_last_two(perm) {
        return None;
    }
    ops_in(g, n.children[0]).find_map(|(op, children)| match *op {
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let flipped = Op::MatMul {
                transpose_a: !transpose_b,
                transpose_b: !transpose_a,
            };
            Some(Term::Op(
                flipped,
                vec![Term::Class(children[1]), Term::Class(children[0])],
            ))
        }
        _ => None,
    })
}
