//! The rewrite rules, by topic, one named rule per line with its algebra in a comment.
//!
//! Rules over ops without attributes are egg patterns; rules that read or compute attributes
//! (permutations, shapes, matmul flags) are Rust functions from an e-node to the term it
//! equals ([`fn_rule`]). Every term a function rule produces is type-checked against the class
//! it joins, so a rule can never make an ill-typed program.
//!
//! Associativity is left out on purpose: with commutativity it makes saturation explode.

pub mod algebra;
pub mod broadcast;
pub mod layout;
pub mod matmul;

use super::lang::{Graph, Node, Typing, node_type};
use egg::{Applier, Id, PatternAst, Rewrite, SearchMatches, Searcher, Subst, Symbol, Var};
use kiln_ir::{Op, Type};

/// Rules that hold in real arithmetic but may change floating-point rounding (never by more
/// than a few ulps on finite values that do not overflow). The others give identical bits.
pub const ROUNDING: &[&str] = &[
    "mul-recip",
    "div-sqrt",
    "recip-exp",
    "factor-add",
    "factor-sub",
    "div-div",
    "div-broadcast",
    "matmul-transposed-a",
    "matmul-transposed-b",
    "transpose-of-matmul",
];

/// The rules whose rewrites give identical bits.
pub fn exact() -> Vec<Rewrite<Node, Typing>> {
    all()
        .into_iter()
        .filter(|r| !ROUNDING.contains(&r.name.as_str()))
        .collect()
}

/// Every rule.
pub fn all() -> Vec<Rewrite<Node, Typing>> {
    let mut rules = algebra::rules();
    rules.extend(layout::rules());
    rules.extend(broadcast::rules());
    rules.extend(matmul::rules());
    rules
}

/// A term to add to the e-graph: an existing class, or an op over terms.
pub enum Term {
    /// An existing class.
    Class(Id),
    /// An op over terms.
    Op(Op, Vec<Term>),
}

/// A rule written in Rust: for an e-node, the term it equals (if it matches).
pub type RuleFn = fn(&Graph, &Node) -> Option<Term>;

/// A named rewrite from a [`RuleFn`].
pub fn fn_rule(name: &str, f: RuleFn) -> Rewrite<Node, Typing> {
    Rewrite::new(name, FnSearcher(f), FnApplier(f)).expect("a function rule binds no variables")
}

struct FnSearcher(RuleFn);

impl Searcher<Node, Typing> for FnSearcher {
    fn search_eclass_with_limit(
        &self,
        egraph: &Graph,
        eclass: Id,
        limit: usize,
    ) -> Option<SearchMatches<'_, Node>> {
        let matched = limit > 0
            && egraph[eclass]
                .nodes
                .iter()
                .any(|n| (self.0)(egraph, n).is_some());
        matched.then(|| SearchMatches {
            eclass,
            substs: vec![Subst::default()],
            ast: None,
        })
    }

    fn vars(&self) -> Vec<Var> {
        Vec::new()
    }
}

struct FnApplier(RuleFn);

impl Applier<Node, Typing> for FnApplier {
    fn apply_one(
        &self,
        egraph: &mut Graph,
        eclass: Id,
        _subst: &Subst,
        _ast: Option<&PatternAst<Node>>,
        rule: Symbol,
    ) -> Vec<Id> {
        let want = egraph[eclass].data.ty.clone();
        let nodes = egraph[eclass].nodes.clone();
        let mut changed = Vec::new();
        for node in nodes {
            let Some(term) = (self.0)(egraph, &node) else {
                continue;
            };
            if want.is_none() || term_type(egraph, &term) != want {
                continue;
            }
            // The matched node as its own term, so that an explanation (`--explain`) names
            // this rule as the step from it to the new term.
            let from = egraph.add_uncanonical(node);
            let id = add_term(egraph, term);
            if egraph.union_trusted(from, id, rule) {
                changed.push(eclass);
            }
        }
        changed
    }
}

/// The type a term would have, without adding it.
fn term_type(egraph: &Graph, term: &Term) -> Option<Type> {
    match term {
        Term::Class(id) => egraph[*id].data.ty.clone(),
        Term::Op(op, children) => {
            let types: Vec<Type> = children
                .iter()
                .map(|c| term_type(egraph, c))
                .collect::<Option<_>>()?;
            let refs: Vec<&Type> = types.iter().collect();
            let mut out = kiln_ir::infer::infer(op, &refs, &[]).ok()?;
            (out.len() == 1).then(|| out.remove(0))
        }
    }
}

fn add_term(egraph: &mut Graph, term: Term) -> Id {
    match term {
        Term::Class(id) => id,
        Term::Op(op, children) => {
            let ids = children.into_iter().map(|c| add_term(egraph, c)).collect();
            egraph.add(Node::ir(op, ids))
        }
    }
}

// ----- helpers for rules -----

/// The IR ops of the nodes in class `id`, with their children.
pub fn ops_in(egraph: &Graph, id: Id) -> impl Iterator<Item = (&Op, &[Id])> {
    egraph[id]
        .nodes
        .iter()
        .filter_map(|n| n.ir_op().map(|op| (op, &n.children[..])))
}

/// The type of class `id`, if it is well typed.
pub fn ty(egraph: &Graph, id: Id) -> Option<&Type> {
    egraph[id].data.ty.as_ref()
}

/// A condition for pattern rules: the class bound to `var` is a splat of `value`.
pub fn is_splat(var: &str, value: f64) -> impl Fn(&mut Graph, Id, &Subst) -> bool {
    let var: Var = var.parse().expect("a pattern variable");
    move |egraph, _, subst| egraph[subst[var]].data.splat == Some(value)
}

/// The type of node `n` (for rules that must know it).
pub fn type_of(egraph: &Graph, n: &Node) -> Option<Type> {
    node_type(egraph, n)
}
