//! `--explain` for the e-graph: for each value whose extracted form differs from its input
//! form, the chain of named rules that connects them (egg's explanation, walked) and both forms'
//! costs under the extraction's cost model. Only the outermost rewritten values of a region
//! are explained; their chains show the rewrites of what they read.

use super::extract::{Extraction, node_cost};
use super::lang::{Graph, Node, NodeOp};
use egg::{Id, RecExpr};
use kiln_ir::print::ValueNames;
use kiln_ir::{Function, Inst, Value};
use std::collections::{HashMap, HashSet};

/// One region's e-graph run, as needed to explain it.
pub(super) struct Region<'a> {
    pub func: &'a Function,
    pub originals: &'a [(Value, Inst)],
    pub class_of: &'a HashMap<Value, Id>,
    pub leaf_values: &'a [Value],
    pub extraction: &'a Extraction,
    /// The function's values as printed.
    pub names: ValueNames,
}

impl Region<'_> {
    /// A paragraph per outermost rewritten value.
    pub(super) fn explain(&self, egraph: &mut Graph) -> Vec<String> {
        let mut changed: Vec<(Value, Inst, RecExpr<Node>, RecExpr<Node>)> = Vec::new();
        for &(v, inst) in self.originals {
            let before = egraph.id_to_expr(self.class_of[&v]);
            let Some(after) = extracted(egraph, self.extraction, egraph.find(self.class_of[&v]))
            else {
                continue;
            };
            if !same_term(&before, &after) {
                changed.push((v, inst, before, after));
            }
        }
        let names = self.term_names(egraph);
        let rewritten: HashSet<Value> = changed.iter().map(|c| c.0).collect();
        let read_by_rewritten: HashSet<Value> = (changed.iter())
            .flat_map(|&(_, inst, ..)| self.func.inst(inst).args.iter().copied())
            .filter(|a| rewritten.contains(a))
            .collect();
        let mut out = Vec::new();
        let mut shown: HashSet<(String, String)> = HashSet::new();
        for (v, inst, before, after) in changed {
            if read_by_rewritten.contains(&v) {
                continue;
            }
            if tree_size(&before).max(tree_size(&after)) > PRINTABLE {
                out.push(format!(
                    "{} ({}): rewritten; its terms are too large to print ({:.0} and {:.0} nodes \
                     as trees)\n",
                    self.name(v),
                    self.func.inst(inst).loc,
                    tree_size(&before),
                    tree_size(&after)
                ));
                continue;
            }
            let explanation = egraph.explain_equivalence(&before, &after);
            // A subterm used in several places is rewritten at each: say it once.
            let mut steps: Vec<(String, String)> = Vec::new();
            let mut rewrites = Vec::new();
            rewrites_of(
                &explanation.explanation_trees,
                &mut rewrites,
                &mut HashSet::new(),
            );
            for (rule, term) in rewrites {
                let step = (rule, self.with_names(&abbreviate(&term, &names)));
                if !steps.contains(&step) {
                    steps.push(step);
                }
            }
            let mut text = self.paragraph(egraph, v, inst, &steps, &shown);
            let before_count = shown.len();
            shown.extend(steps);
            if shown.len() == before_count && !text.is_empty() {
                text += "    (every step explained above)\n";
            }
            out.push(text);
        }
        out
    }

    /// `%v (line …): cost a → b; rules: …`, the instruction as written, then each step: the
    /// rule and the term it produced.
    fn paragraph(
        &self,
        egraph: &Graph,
        v: Value,
        inst: Inst,
        steps: &[(String, String)],
        shown: &HashSet<(String, String)>,
    ) -> String {
        let loc = self.func.inst(inst).loc;
        let before = input_cost(egraph, self.class_of[&v], &mut HashMap::new());
        let after = (self.extraction.cost(egraph.find(self.class_of[&v]))).unwrap_or(f64::NAN);
        let mut rules: Vec<&str> = Vec::new();
        for (rule, _) in steps {
            if !rules.contains(&rule.as_str()) {
                rules.push(rule);
            }
        }
        let mut text = format!(
            "{} ({}): cost {before:.1} → {after:.1} (bytes moved, estimated); rules: {}\n    \
             as written: {}\n",
            self.name(v),
            if loc.is_known() {
                loc.to_string()
            } else {
                "built by a pass".to_owned()
            },
            if rules.is_empty() {
                "none (equal to another value)".to_owned()
            } else {
                rules.join(", ")
            },
            kiln_ir::print::inst_line(self.func, inst)
        );
        // Steps another value's explanation already showed are left out.
        for (k, (rule, term)) in steps.iter().enumerate() {
            if !shown.contains(&(rule.clone(), term.clone())) {
                text += &format!("    {}. {rule} ⇒ {}\n", k + 1, shorten(term));
            }
        }
        text
    }

    /// Each original value's input term, printed, with its name — for terms that print
    /// differently from every other value's (two `load`s print alike).
    fn term_names(&self, egraph: &Graph) -> Vec<(String, String)> {
        let mut count: HashMap<String, usize> = HashMap::new();
        let terms: Vec<(String, String)> = (self.originals.iter())
            .map(|&(v, _)| (egraph.id_to_expr(self.class_of[&v]), self.name(v)))
            .filter(|(term, _)| tree_size(term) <= PRINTABLE)
            .map(|(term, name)| (term.to_string(), name))
            .collect();
        for (term, _) in &terms {
            *count.entry(term.clone()).or_default() += 1;
        }
        let mut named: Vec<(String, String)> = (terms.into_iter())
            .filter(|(term, _)| count[term] == 1 && term.starts_with('('))
            .collect();
        // Longest first, so that a term is named before the terms inside it.
        named.sort_by_key(|(term, _)| std::cmp::Reverse(term.len()));
        named
    }

    fn name(&self, v: Value) -> String {
        self.names.get(v)
    }

    /// `step` with each `leafN` written as the value it stands for.
    fn with_names(&self, step: &str) -> String {
        let mut out = String::new();
        let mut rest = step;
        while let Some(at) = rest.find("leaf") {
            out += &rest[..at];
            let digits: String = rest[at + 4..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            match digits
                .parse::<usize>()
                .ok()
                .and_then(|i| self.leaf_values.get(i))
            {
                Some(&v) => out += &self.name(v),
                None => out += "leaf",
            }
            rest = &rest[at + 4 + digits.len()..];
        }
        out + rest
    }
}

/// `term` with the input terms of values written as their names (`%scores` for
/// `(matmul …)`), where that makes it shorter.
fn abbreviate(term: &str, names: &[(String, String)]) -> String {
    let mut out = term.to_owned();
    for (term, name) in names {
        if out.len() > term.len() {
            out = out.replace(term.as_str(), name);
        }
    }
    out
}

/// Each rewrite of a proof: its rule and the term it produced, outer rewrites before inner
/// ones. The proof's tree is walked, each shared subproof once: egg's
/// flat explanation copies the whole term at every step (74 % of `--explain`'s time on the
/// tour's training step).
fn rewrites_of(
    proof: &egg::TreeExplanation<Node>,
    out: &mut Vec<(String, String)>,
    seen: &mut HashSet<*const egg::TreeTerm<Node>>,
) {
    for term in proof {
        if !seen.insert(std::rc::Rc::as_ptr(term)) {
            continue;
        }
        if let Some(rule) = term.forward_rule.or(term.backward_rule) {
            let produced = term.get_initial_flat_term().remove_rewrites().get_string();
            out.push((rule.to_string(), produced));
        }
        for child in &term.child_proofs {
            rewrites_of(child, out, seen);
        }
    }
}

/// At most 160 characters of `term`.
fn shorten(term: &str) -> String {
    match term.char_indices().nth(160) {
        Some((i, _)) => format!("{} …", &term[..i]),
        None => term.to_owned(),
    }
}

/// Whether two terms are the same tree (their nodes' ops and children alike).
fn same_term(a: &RecExpr<Node>, b: &RecExpr<Node>) -> bool {
    fn same(
        a: &RecExpr<Node>,
        i: Id,
        b: &RecExpr<Node>,
        j: Id,
        equal: &mut HashSet<(Id, Id)>,
    ) -> bool {
        if equal.contains(&(i, j)) {
            return true;
        }
        let (x, y) = (&a[i], &b[j]);
        let same = x.op == y.op
            && x.children.len() == y.children.len()
            && (x.children.iter().zip(&y.children)).all(|(&c, &d)| same(a, c, b, d, equal));
        if same {
            equal.insert((i, j));
        }
        same
    }
    match (a.as_ref().len(), b.as_ref().len()) {
        (0, _) | (_, 0) => false,
        (m, n) => same(a, Id::from(m - 1), b, Id::from(n - 1), &mut HashSet::new()),
    }
}

/// The most nodes a term may have, written out as a tree, to be printed: sharing makes the
/// tree of a long backward pass exponentially larger than its graph.
const PRINTABLE: f64 = 4000.0;

/// The nodes of `expr` written out as a tree (shared subterms counted at every use).
fn tree_size(expr: &RecExpr<Node>) -> f64 {
    let mut sizes: Vec<f64> = Vec::with_capacity(expr.as_ref().len());
    for node in expr.as_ref() {
        let children: f64 = node.children.iter().map(|&c| sizes[usize::from(c)]).sum();
        sizes.push(1.0 + children);
    }
    sizes.last().copied().unwrap_or(0.0)
}

/// The extracted program of `class` as a term.
fn extracted(egraph: &Graph, extraction: &Extraction, class: Id) -> Option<RecExpr<Node>> {
    fn add(
        egraph: &Graph,
        x: &Extraction,
        class: Id,
        expr: &mut RecExpr<Node>,
        memo: &mut HashMap<Id, Id>,
    ) -> Option<Id> {
        if let Some(&id) = memo.get(&class) {
            return Some(id);
        }
        let node = x.best(class)?;
        let children = (node.children.iter())
            .map(|&c| add(egraph, x, egraph.find(c), expr, memo))
            .collect::<Option<Vec<Id>>>()?;
        let id = expr.add(Node {
            op: node.op.clone(),
            children,
        });
        memo.insert(class, id);
        Some(id)
    }
    let mut expr = RecExpr::default();
    add(egraph, extraction, class, &mut expr, &mut HashMap::new())?;
    Some(expr)
}

/// The cost of the input's own term under `id` (as added, before any rewrite), counted as the
/// extraction counts: each use of a shared term pays for it again.
fn input_cost(egraph: &Graph, id: Id, memo: &mut HashMap<Id, f64>) -> f64 {
    if let Some(&cost) = memo.get(&id) {
        return cost;
    }
    let node = egraph.id_to_node(id);
    let own = match node.op {
        NodeOp::Leaf(_) => 0.0,
        NodeOp::Ir(_) => node_cost(egraph, node).unwrap_or(f64::NAN),
    };
    let cost = own
        + (node.children.iter())
            .map(|&c| input_cost(egraph, c, memo))
            .sum::<f64>();
    memo.insert(id, cost);
    cost
}
