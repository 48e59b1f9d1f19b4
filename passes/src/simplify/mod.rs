//! E-graph simplification with egg.
//!
//! Each region's straight-line code becomes an e-graph: pure ops are e-nodes, everything else
//! (arguments, loads' consumers aside, the results of loops and custom ops) is a leaf. The
//! rules of [`rules`] run until saturation or a limit (nodes, iterations, time); then the
//! cheapest program under a memory-traffic cost model is extracted ([`extract`]) and the
//! region is rebuilt from it. Hash-consing merges equal subexpressions on the way, so the
//! pass also performs CSE. When a limit stops saturation, the best program found so far is
//! used, and the statistics say which limit it was.

mod explain;
pub mod extract;
pub mod lang;
pub mod rules;

use crate::pass::{Pass, PassError, Stats};
use egg::{Id, Rewrite, Runner, SimpleScheduler, StopReason};
use extract::Extraction;
use kiln_ir::{Function, Inst, Loc, Module, Region, Value};
use lang::{Node, NodeOp, Typing};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

/// The e-graph simplification pass.
pub struct Simplify {
    /// The rewrite rules it runs.
    pub rules: Vec<Rewrite<Node, Typing>>,
    /// Stop when the e-graph has this many nodes per instruction of the input (plus 10,000).
    pub nodes_per_inst: usize,
    /// Stop after this many iterations.
    pub iter_limit: usize,
    /// Stop after this long.
    pub time_limit: Duration,
    /// On cost ties, keep the input's own form (true, the default) or prefer rewritten forms
    /// (tests use this to evaluate every rule's right-hand side).
    pub keep_input_on_ties: bool,
    /// Record, for each rewritten value, the chain of rules from its input form to the one
    /// extracted (egg's explanations, which cost time and memory: only when asked).
    pub explain: bool,
    /// A region with more instructions is left as it is: building, saturating and extracting
    /// its e-graph grows faster than its size (BENCHMARKS.md, thresholds).
    pub max_region_insts: usize,
    explanations: Vec<String>,
}

/// The default [`Simplify::max_region_insts`]: the largest region simplified in about three
/// seconds (BENCHMARKS.md, "Thresholds in the code").
pub const MAX_REGION_INSTS: usize = 100_000;

impl Default for Simplify {
    fn default() -> Simplify {
        Simplify::with_rules(rules::all())
    }
}

impl Simplify {
    /// The pass with `rules` and the default limits.
    pub fn with_rules(rules: Vec<Rewrite<Node, Typing>>) -> Simplify {
        Simplify {
            rules,
            nodes_per_inst: 8,
            iter_limit: 12,
            time_limit: Duration::from_secs(2),
            keep_input_on_ties: true,
            explain: false,
            max_region_insts: MAX_REGION_INSTS,
            explanations: Vec::new(),
        }
    }

    /// Only the rules whose names are listed (for testing one rule at a time).
    pub fn only(names: &[&str]) -> Simplify {
        let rules = rules::all()
            .into_iter()
            .filter(|r| names.contains(&r.name.as_str()))
            .collect();
        Simplify::with_rules(rules)
    }
}

/// What one e-graph run did.
#[derive(Default)]
struct Totals {
    nodes: usize,
    classes: usize,
    iterations: usize,
    stop: Option<String>,
    applied: BTreeMap<String, usize>,
    too_large: usize,
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn take_explanations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.explanations)
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut totals = Totals::default();
        self.explanations.clear();
        for func in &mut module.functions {
            let mut replace = HashMap::new();
            let regions = regions_of(func);
            for region in regions {
                self.simplify_region(func, region, &mut replace, &mut totals);
            }
            func.replace_uses_map(&replace);
        }
        let applied: Vec<String> = totals
            .applied
            .iter()
            .map(|(k, v)| format!("{k}×{v}"))
            .collect();
        let stats = Stats::default()
            .with("e-graph nodes", totals.nodes)
            .with("classes", totals.classes)
            .with("iterations", totals.iterations)
            .with(
                "stopped by",
                totals.stop.unwrap_or_else(|| "nothing to do".into()),
            )
            .with(
                "rules applied",
                if applied.is_empty() {
                    "none".to_owned()
                } else {
                    applied.join(" ")
                },
            );
        Ok(if totals.too_large > 0 {
            stats.with("regions too large, left as they are", totals.too_large)
        } else {
            stats
        })
    }
}

/// Every region of `func`, outermost first.
fn regions_of(func: &Function) -> Vec<Region> {
    let mut out = vec![func.body()];
    for inst in func.walk_insts() {
        out.extend(func.inst(inst).regions.iter().copied());
    }
    out
}

/// The most instructions of a region `--explain` explains.
const MAX_EXPLAINED: usize = 2000;

/// Whether the e-graph may rewrite `inst`: a pure op with one result and no regions.
fn rewritable(func: &Function, inst: Inst) -> bool {
    let data = func.inst(inst);
    data.regions.is_empty() && !data.op.has_side_effects() && data.results.len() == 1
}

impl Simplify {
    /// Simplifies one region: its straight-line code into an e-graph, saturated, the cheapest
    /// program extracted and emitted in place; `replace` maps old values to their new ones.
    fn simplify_region(
        &mut self,
        func: &mut Function,
        region: Region,
        replace: &mut HashMap<Value, Value>,
        totals: &mut Totals,
    ) {
        let insts = func.region(region).insts.clone();
        if !insts.iter().any(|&i| rewritable(func, i)) {
            return;
        }
        if insts.len() > self.max_region_insts {
            totals.too_large += 1;
            if self.explain {
                self.explanations.push(format!(
                    "a region of {} instructions is left as it is (at most {} are simplified)\n",
                    insts.len(),
                    self.max_region_insts
                ));
            }
            return;
        }
        // egg's explanations, and walking their terms, grow with a term's depth and a region's
        // size squared: a region past the limit is simplified unexplained, and says so.
        let explain = self.explain && insts.len() <= MAX_EXPLAINED;
        if self.explain && !explain {
            self.explanations.push(format!(
                "a region of {} instructions is simplified without explanations (at most \
                 {MAX_EXPLAINED} are explained)\n",
                insts.len()
            ));
        }
        let RegionGraph {
            graph,
            class_of,
            leaf_values,
            originals,
        } = RegionGraph::build(func, region, &insts, explain);
        let mut runner = self.saturate(graph, insts.len(), totals);
        let extraction = self.extract(func, &runner.egraph, &originals, &class_of);
        if explain {
            let explain = explain::Region {
                func,
                originals: &originals,
                class_of: &class_of,
                leaf_values: &leaf_values,
                extraction: &extraction,
                names: kiln_ir::print::ValueNames::new(func),
            };
            self.explanations
                .extend(explain.explain(&mut runner.egraph));
        }
        let egraph = &runner.egraph;
        let needed = needed_classes(func, region, &insts, egraph, &class_of, &extraction);
        let mut rebuild = Rebuild::new(func, region, &insts, egraph, &extraction, &leaf_values);
        rebuild.remember_names(func, &originals, &class_of);
        rebuild.region(func, region, &insts, &class_of, &needed, replace);
        for &(v, _) in &originals {
            let class = egraph.find(class_of[&v]);
            if let Some(&new) = rebuild.emitted.get(&class)
                && new != v
            {
                replace.insert(v, new);
            }
        }
        let used_names = rebuild.take_names();
        func.region_mut(region).insts = rebuild.insts;
        restore_names(func, used_names);
    }

    /// Runs the rules over `graph` within the limits, adding what happened to `totals`.
    fn saturate(
        &self,
        graph: lang::Graph,
        insts: usize,
        totals: &mut Totals,
    ) -> Runner<Node, Typing> {
        let runner = Runner::default()
            .with_egraph(graph)
            .with_node_limit(10_000 + self.nodes_per_inst * insts)
            .with_iter_limit(self.iter_limit)
            .with_time_limit(self.time_limit)
            .with_scheduler(SimpleScheduler)
            .run(&self.rules);
        totals.record(&runner);
        runner
    }

    /// The cheapest node of every class; on ties, the input's own node or a rewritten one as
    /// [`Simplify::keep_input_on_ties`] says.
    fn extract(
        &self,
        func: &Function,
        egraph: &lang::Graph,
        originals: &[(Value, Inst)],
        class_of: &HashMap<Value, Id>,
    ) -> Extraction {
        let canonical = |n: &Node| Node {
            op: n.op.clone(),
            children: n.children.iter().map(|&c| egraph.find(c)).collect(),
        };
        let input_nodes: HashSet<Node> = originals
            .iter()
            .map(|&(_, inst)| {
                let data = func.inst(inst);
                let children = data.args.iter().map(|a| class_of[a]).collect();
                canonical(&Node::ir(data.op.clone(), children))
            })
            .collect();
        let keep = self.keep_input_on_ties;
        Extraction::new(egraph, |n| input_nodes.contains(&canonical(n)) == keep)
    }
}

impl Totals {
    /// Adds one run's sizes, stop reason (the worst across regions) and rule applications.
    fn record(&mut self, runner: &Runner<Node, Typing>) {
        self.nodes += runner.egraph.total_number_of_nodes();
        self.classes += runner.egraph.number_of_classes();
        self.iterations += runner.iterations.len();
        let stop = match &runner.stop_reason {
            Some(StopReason::Saturated) => "saturated".to_owned(),
            Some(StopReason::IterationLimit(n)) => format!("iteration limit ({n})"),
            Some(StopReason::NodeLimit(n)) => format!("node limit ({n})"),
            Some(StopReason::TimeLimit(t)) => format!("time limit ({t:.2} s)"),
            Some(StopReason::Other(s)) => s.clone(),
            None => "not run".to_owned(),
        };
        if self.stop.as_deref().is_none_or(|s| s == "saturated") {
            self.stop = Some(stop);
        }
        for iteration in &runner.iterations {
            for (rule, n) in &iteration.applied {
                *self.applied.entry(rule.to_string()).or_default() += n;
            }
        }
    }
}

/// A region's straight-line code as an e-graph: pure instructions are e-nodes, every other
/// value (arguments, results of loops and custom ops, captured values) a leaf.
struct RegionGraph {
    graph: lang::Graph,
    class_of: HashMap<Value, Id>,
    /// The value of each leaf, by leaf index.
    leaf_values: Vec<Value>,
    /// The rewritable instructions with their results, in order.
    originals: Vec<(Value, Inst)>,
}

impl RegionGraph {
    fn build(func: &Function, region: Region, insts: &[Inst], explain: bool) -> RegionGraph {
        let graph = lang::Graph::new(Typing::default());
        let mut g = RegionGraph {
            graph: if explain {
                graph.with_explanations_enabled()
            } else {
                graph
            },
            class_of: HashMap::new(),
            leaf_values: Vec::new(),
            originals: Vec::new(),
        };
        for &inst in insts {
            let data = func.inst(inst);
            let children: Vec<Id> = data.args.iter().map(|&a| g.leaf(func, a)).collect();
            if rewritable(func, inst) {
                let id = g.graph.add(Node::ir(data.op.clone(), children));
                g.class_of.insert(data.results[0], id);
                g.originals.push((data.results[0], inst));
            } else {
                // Values the region-owning instruction captures are needed here too.
                for &r in &data.regions {
                    for v in func.free_values(r) {
                        g.leaf(func, v);
                    }
                }
            }
        }
        for &v in &func.region(region).results {
            g.leaf(func, v);
        }
        g
    }

    /// The class of `v`: its node if it has one already, else a new leaf.
    fn leaf(&mut self, func: &Function, v: Value) -> Id {
        if let Some(&id) = self.class_of.get(&v) {
            return id;
        }
        let index = self.graph.analysis.leaves.len() as u32;
        self.graph.analysis.leaves.push(func.value_type(v).clone());
        self.leaf_values.push(v);
        let id = self.graph.add(Node {
            op: NodeOp::Leaf(index),
            children: Vec::new(),
        });
        self.class_of.insert(v, id);
        id
    }
}

/// The classes the region's remaining instructions and results need, through the extraction.
fn needed_classes(
    func: &Function,
    region: Region,
    insts: &[Inst],
    egraph: &lang::Graph,
    class_of: &HashMap<Value, Id>,
    extraction: &Extraction,
) -> HashSet<Id> {
    let mut stack: Vec<Id> = Vec::new();
    for &inst in insts.iter().filter(|&&i| !rewritable(func, i)) {
        let data = func.inst(inst);
        stack.extend(data.args.iter().map(|a| egraph.find(class_of[a])));
        for &r in &data.regions {
            stack.extend(func.free_values(r).iter().map(|v| egraph.find(class_of[v])));
        }
    }
    let results = &func.region(region).results;
    stack.extend(results.iter().map(|v| egraph.find(class_of[v])));
    let mut needed: HashSet<Id> = HashSet::new();
    while let Some(class) = stack.pop() {
        if needed.insert(class)
            && let Some(node) = extraction.best(class)
        {
            stack.extend(node.children.iter().map(|&c| egraph.find(c)));
        }
    }
    needed
}

/// Gives emitted values the names their originals had, where no other value has taken them.
fn restore_names(func: &mut Function, used_names: Vec<(Value, String)>) {
    let taken: HashSet<String> = func
        .walk_insts()
        .iter()
        .flat_map(|&i| func.inst(i).results.clone())
        .chain(func.args().iter().copied())
        .filter_map(|v| func.value_name(v).map(str::to_owned))
        .collect();
    for (v, name) in used_names {
        if !taken.contains(&name) {
            func.set_value_name(v, Some(name));
        }
    }
}

/// Emits extracted classes as instructions, each once, children first.
struct Rebuild<'a> {
    egraph: &'a lang::Graph,
    extraction: &'a Extraction,
    emitted: HashMap<Id, Value>,
    insts: Vec<Inst>,
    /// A name from the original program for each class that had one.
    names: HashMap<Id, String>,
    locs: HashMap<Id, Loc>,
    /// Values that may be used at the current point.
    available: HashSet<Value>,
    leaf_values: &'a [Value],
}

impl<'a> Rebuild<'a> {
    /// A rebuild of `region`, where the function's and the region's arguments and every value
    /// defined outside the region are available.
    fn new(
        func: &Function,
        region: Region,
        insts: &[Inst],
        egraph: &'a lang::Graph,
        extraction: &'a Extraction,
        leaf_values: &'a [Value],
    ) -> Rebuild<'a> {
        let mut available: HashSet<Value> = func.args().iter().copied().collect();
        available.extend(func.region(region).args.iter().copied());
        let defined_here: HashSet<Value> = insts
            .iter()
            .flat_map(|&i| func.inst(i).results.clone())
            .collect();
        available.extend(leaf_values.iter().filter(|v| !defined_here.contains(v)));
        Rebuild {
            egraph,
            extraction,
            emitted: HashMap::new(),
            insts: Vec::new(),
            names: HashMap::new(),
            locs: HashMap::new(),
            available,
            leaf_values,
        }
    }

    /// Records each class's first original name and location, for what is emitted for it.
    fn remember_names(
        &mut self,
        func: &Function,
        originals: &[(Value, Inst)],
        class_of: &HashMap<Value, Id>,
    ) {
        for &(v, inst) in originals {
            let class = self.egraph.find(class_of[&v]);
            if let Some(name) = func.value_name(v) {
                self.names.entry(class).or_insert_with(|| name.to_owned());
            }
            self.locs.entry(class).or_insert(func.inst(inst).loc);
        }
    }

    /// Rebuilds the region in order: instructions the e-graph does not own stay; before each,
    /// the classes it needs are emitted from the extraction; each rewritable instruction's
    /// class is emitted where the instruction stood, if still needed.
    fn region(
        &mut self,
        func: &mut Function,
        region: Region,
        insts: &[Inst],
        class_of: &HashMap<Value, Id>,
        needed: &HashSet<Id>,
        replace: &mut HashMap<Value, Value>,
    ) {
        for &inst in insts {
            if rewritable(func, inst) {
                let class = self.egraph.find(class_of[&func.inst(inst).results[0]]);
                if needed.contains(&class) {
                    self.emit(func, class);
                }
                continue;
            }
            let data = func.inst(inst).clone();
            let mut uses: Vec<Value> = data.args.clone();
            for &r in &data.regions {
                uses.extend(func.free_values(r));
            }
            for v in uses {
                self.emit_for(func, v, class_of, replace);
            }
            self.insts.push(inst);
            self.available.extend(data.results.iter().copied());
        }
        for v in func.region(region).results.clone() {
            self.emit_for(func, v, class_of, replace);
        }
    }

    /// Emits the class of `v` and records its replacement.
    fn emit_for(
        &mut self,
        func: &mut Function,
        v: Value,
        class_of: &HashMap<Value, Id>,
        replace: &mut HashMap<Value, Value>,
    ) {
        let class = self.egraph.find(class_of[&v]);
        if let Some(new) = self.emit(func, class)
            && new != v
        {
            replace.insert(v, new);
        }
    }

    /// Emits `class` (children first, without recursion: chains can be long) and returns its
    /// value; `None` if some class on the way has no usable node here.
    fn emit(&mut self, func: &mut Function, class: Id) -> Option<Value> {
        let mut stack: Vec<(Id, bool)> = vec![(class, false)];
        while let Some((id, children_done)) = stack.pop() {
            if self.emitted.contains_key(&id) {
                continue;
            }
            let node = self.choose(id)?.clone();
            let value = match &node.op {
                NodeOp::Leaf(i) => self.leaf_values[*i as usize],
                NodeOp::Ir(op) => {
                    if !children_done {
                        stack.push((id, true));
                        for &c in node.children.iter().rev() {
                            stack.push((self.egraph.find(c), false));
                        }
                        continue;
                    }
                    let args: Vec<Value> = node
                        .children
                        .iter()
                        .map(|&c| self.emitted.get(&self.egraph.find(c)).copied())
                        .collect::<Option<_>>()?;
                    let ty = self.egraph[id].data.ty.clone()?;
                    let loc = self.locs.get(&id).copied().unwrap_or(Loc::Unknown);
                    let inst = func.create_inst(op.clone(), args, vec![ty], Vec::new(), loc);
                    self.insts.push(inst);
                    let v = func.inst(inst).results[0];
                    self.available.insert(v);
                    v
                }
            };
            self.emitted.insert(id, value);
        }
        self.emitted.get(&class).copied()
    }

    /// The extracted node of `class`, unless it is a leaf not yet available here; then the
    /// cheapest op node of the class.
    fn choose(&self, class: Id) -> Option<&Node> {
        let best = self.extraction.best(class)?;
        if let NodeOp::Leaf(i) = best.op
            && !self.available.contains(&self.leaf_values[i as usize])
        {
            return self.egraph[class]
                .nodes
                .iter()
                .filter(|n| matches!(n.op, NodeOp::Ir(_)))
                .filter_map(|n| {
                    let cost = n.children.iter().try_fold(0.0, |acc, &c| {
                        self.extraction.cost(self.egraph.find(c)).map(|x| acc + x)
                    })?;
                    Some((cost, n))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, n)| n);
        }
        Some(best)
    }

    /// The original names for the values emitted for named classes.
    fn take_names(&mut self) -> Vec<(Value, String)> {
        let mut out: Vec<(Value, String)> = self
            .names
            .drain()
            .filter_map(|(class, name)| self.emitted.get(&class).map(|&v| (v, name)))
            .collect();
        out.sort_by_key(|(v, _)| *v);
        out
    }
}
