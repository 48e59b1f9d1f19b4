//! Extraction: the cheapest node of every class under a cost model of memory traffic.
//!
//! A bottom-up worklist: a class's cost is the cheapest of its nodes' costs, each the node's own
//! cost plus its children's; when a class gets cheaper, its parents are revisited. (egg's
//! built-in extractor recomputes everything each round, which was 40–100× slower on large
//! graphs here.)
//!
//! The cost model counts the bytes an op moves, weighted by what fusion makes of it: an
//! elementwise op inside a fused kernel costs its output once; a broadcast, a reshape or a
//! splat constant is index arithmetic and costs almost nothing; transcendental functions
//! and division cost twice; a transpose moves every element; a matmul's cost grows with
//! its multiply-adds. So forms that compute on small tensors and fuse well win.

use super::lang::{Graph, Node, NodeOp, node_type};
use egg::Id;
use kiln_ir::{Cost, Op, Type};
use std::collections::{HashMap, VecDeque};

/// The size assumed for a symbolic dimension when estimating costs.
const SYMBOLIC_SIZE: f64 = 256.0;

/// The least an op costs. Strictly positive costs keep every chosen node acyclic: a node that
/// reaches its own class always costs more than what the class already has.
const MIN_COST: f64 = 1e-3;

/// The bytes a value of `ty` takes, with each symbolic dimension at [`SYMBOLIC_SIZE`].
pub(crate) fn bytes(ty: &Type) -> f64 {
    let elements: f64 = ty
        .shape
        .dims()
        .iter()
        .map(|d| d.as_fixed().map_or(SYMBOLIC_SIZE, |n| n as f64))
        .product();
    elements * ty.dtype.size_bytes() as f64
}

/// The cost of `node` itself (children excluded); `None` if it is ill-typed.
pub fn node_cost(egraph: &Graph, node: &Node) -> Option<f64> {
    let op = match &node.op {
        NodeOp::Leaf(_) => return Some(0.0),
        NodeOp::Ir(op) => op,
    };
    let out = node_type(egraph, node)?;
    let out_bytes = bytes(&out);
    let child_bytes = |i: usize| egraph[node.children[i]].data.ty.as_ref().map_or(0.0, bytes);
    let cost = match op {
        Op::Const { value, .. } if value.len() == 1 => 0.0,
        Op::Const { .. } => out_bytes,
        Op::Broadcast { .. } | Op::Reshape { .. } | Op::Iota { .. } => 0.05 * out_bytes,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. } => {
            match op.cost() {
                Cost::Cheap => out_bytes,
                _ => 2.0 * out_bytes,
            }
        }
        Op::Transpose { .. } | Op::Slice { .. } | Op::Pad { .. } | Op::Concat { .. } => out_bytes,
        Op::Reduce { .. } | Op::ArgReduce { .. } => child_bytes(0) + out_bytes,
        Op::MatMul { .. } | Op::MatMulAcc { .. } => {
            let k = egraph[node.children[0]]
                .data
                .ty
                .as_ref()
                .and_then(|t| t.shape.dims().last().and_then(|d| d.as_fixed()))
                .unwrap_or(SYMBOLIC_SIZE as usize) as f64;
            let onto = (node.children.len() == 3).then(|| child_bytes(2));
            child_bytes(0) + child_bytes(1) + onto.unwrap_or(0.0) + out_bytes * (1.0 + k / 8.0)
        }
        // No rule rewrites the window ops: any fair positive cost serves.
        Op::Conv2d { .. } => child_bytes(0) + child_bytes(1) + 4.0 * out_bytes,
        Op::Pool2d { .. } => child_bytes(0) + out_bytes,
        Op::Gather { .. } | Op::ScatterAdd { .. } | Op::OneHot { .. } => 2.0 * out_bytes,
        // In place, only the slice moves.
        Op::UpdateSlice { .. } => 2.0 * child_bytes(1),
        Op::Random { .. } => out_bytes,
        Op::Load { .. } => 0.0,
        Op::Store { .. } | kiln_ir::opaque_op!() => return None,
    };
    Some(cost.max(MIN_COST))
}

/// The cheapest node of each class and its total cost.
pub struct Extraction {
    best: HashMap<Id, (f64, Node)>,
}

impl Extraction {
    /// Extracts from `egraph`; among nodes of equal cost, those `original` accepts (the
    /// input's own nodes) win, so code that rewriting cannot improve stays as written.
    pub fn new(egraph: &Graph, original: impl Fn(&Node) -> bool) -> Extraction {
        let mut best: HashMap<Id, (f64, Node)> = HashMap::new();
        let mut queue: VecDeque<Id> = egraph.classes().map(|c| c.id).collect();
        let mut queued: std::collections::HashSet<Id> = queue.iter().copied().collect();
        while let Some(id) = queue.pop_front() {
            queued.remove(&id);
            let class = &egraph[id];
            let mut improved = false;
            for node in &class.nodes {
                let Some(cost) = Self::total(egraph, &best, node) else {
                    continue;
                };
                let better = match best.get(&class.id) {
                    None => true,
                    Some((c, current)) => {
                        let tie = (cost - c).abs() <= 1e-9 * c.abs().max(1.0);
                        (cost < *c && !tie) || (tie && original(node) && !original(current))
                    }
                };
                if better && node_type(egraph, node) == class.data.ty {
                    best.insert(class.id, (cost, node.clone()));
                    improved = true;
                }
            }
            if improved {
                for parent in class.parents() {
                    let parent = egraph.find(parent);
                    if queued.insert(parent) {
                        queue.push_back(parent);
                    }
                }
            }
        }
        Extraction { best }
    }

    fn total(egraph: &Graph, best: &HashMap<Id, (f64, Node)>, node: &Node) -> Option<f64> {
        let own = node_cost(egraph, node)?;
        node.children.iter().try_fold(own, |acc, &c| {
            best.get(&egraph.find(c)).map(|(cost, _)| acc + cost)
        })
    }

    /// The cheapest node of class `id` (canonical), if the class has a well-typed one.
    pub fn best(&self, id: Id) -> Option<&Node> {
        self.best.get(&id).map(|(_, n)| n)
    }

    /// The total cost of the cheapest program for `id`.
    pub fn cost(&self, id: Id) -> Option<f64> {
        self.best.get(&id).map(|(c, _)| *c)
    }
}
