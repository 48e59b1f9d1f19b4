//! Graphviz drawings of a function's dataflow.
//!
//! The dataflow graph is built as a petgraph `Graph` (one node per argument, instruction and
//! return; one edge per use) and written as DOT with each region as a cluster, so `cond` and
//! `while` bodies are drawn as boxes inside the function.

use kiln_ir::print::ValueNames;
use kiln_ir::{Function, Region, Value};
use petgraph::graph::{Graph, NodeIndex};
use petgraph::visit::EdgeRef;
use std::collections::HashMap;
use std::fmt::Write;

struct Node {
    label: String,
    /// `box` for instructions, `ellipse` for arguments, `doublecircle`-ish for returns.
    shape: &'static str,
    region: Region,
}

/// The dataflow of `func` as a DOT digraph.
pub fn function_to_dot(func: &Function) -> String {
    let names = ValueNames::new(func);
    let mut graph: Graph<Node, String> = Graph::new();
    let mut defs: HashMap<Value, NodeIndex> = HashMap::new();
    let mut children: HashMap<Region, Vec<Region>> = HashMap::new();
    add_region(
        func,
        func.body(),
        &names,
        &mut graph,
        &mut defs,
        &mut children,
    );

    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", quote(&format!("@{}", func.name())));
    out.push_str("  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=9, color=\"#555555\"];\n");
    write_region(func, func.body(), &graph, &children, 1, &mut out);
    for edge in graph.edge_references() {
        let _ = writeln!(
            out,
            "  n{} -> n{} [label={}];",
            edge.source().index(),
            edge.target().index(),
            quote(edge.weight())
        );
    }
    out.push_str("}\n");
    out
}

fn add_region(
    func: &Function,
    region: Region,
    names: &ValueNames,
    graph: &mut Graph<Node, String>,
    defs: &mut HashMap<Value, NodeIndex>,
    children: &mut HashMap<Region, Vec<Region>>,
) -> NodeIndex {
    for &arg in &func.region(region).args {
        let label = format!("{}: {}", names.get(arg), func.value_type(arg));
        let node = graph.add_node(Node {
            label,
            shape: "ellipse",
            region,
        });
        defs.insert(arg, node);
    }
    for &inst in &func.region(region).insts {
        let data = func.inst(inst);
        let mut label = data.op.name().to_owned();
        if let Some(sym) = data.op.symbol() {
            let _ = write!(label, " @{sym}");
        }
        for &r in &data.results {
            let _ = write!(label, "\n{}: {}", names.get(r), func.value_type(r));
        }
        let node = graph.add_node(Node {
            label,
            shape: "box",
            region,
        });
        for &arg in &data.args {
            if let Some(&from) = defs.get(&arg) {
                graph.add_edge(from, node, names.get(arg));
            }
        }
        for &r in &data.regions {
            children.entry(region).or_default().push(r);
            let exit = add_region(func, r, names, graph, defs, children);
            graph.add_edge(exit, node, String::new());
        }
        for &r in &data.results {
            defs.insert(r, node);
        }
    }
    let terminator = if region == func.body() {
        "return"
    } else {
        "yield"
    };
    let exit = graph.add_node(Node {
        label: terminator.to_owned(),
        shape: "plaintext",
        region,
    });
    for &v in &func.region(region).results {
        if let Some(&from) = defs.get(&v) {
            graph.add_edge(from, exit, names.get(v));
        }
    }
    exit
}

fn write_region(
    func: &Function,
    region: Region,
    graph: &Graph<Node, String>,
    children: &HashMap<Region, Vec<Region>>,
    depth: usize,
    out: &mut String,
) {
    let indent = "  ".repeat(depth);
    for index in graph.node_indices() {
        let node = &graph[index];
        if node.region == region {
            let _ = writeln!(
                out,
                "{indent}n{} [shape={}, label={}];",
                index.index(),
                node.shape,
                quote(&node.label)
            );
        }
    }
    for &child in children.get(&region).into_iter().flatten() {
        let parent = func.region(child).parent.map(|p| func.inst(p));
        let label = parent.map_or("region".to_owned(), |p| {
            let i = p.regions.iter().position(|&r| r == child).unwrap_or(0);
            let which = p.op.region_labels().get(i).copied().unwrap_or("region");
            format!("{} {which}", p.op.name())
        });
        let _ = writeln!(out, "{indent}subgraph cluster_{} {{", child.as_u32());
        let _ = writeln!(
            out,
            "{indent}  label={}; style=rounded; color=\"#888888\";",
            quote(&label)
        );
        write_region(func, child, graph, children, depth + 1, out);
        let _ = writeln!(out, "{indent}}}");
    }
}

/// A DOT string literal.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}
