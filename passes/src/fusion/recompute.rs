//! Recomputation across kernels: a kernel that reads a value another kernel computed
//! elementwise may compute it again from what it was computed from, when that moves fewer
//! bytes. A training step's backward kernels then recompute a GELU's `x + b` and `erf(x/√2)`
//! or a layer norm's `x − mean` from the forward pass's inputs, instead of the forward kernels
//! writing each of them out and the backward ones reading them back (the choice PyTorch's
//! compiler makes for the values a training step saves).
//!
//! A value is recomputed in all the kernels outside its own that read it, or in none. Its
//! chain is the elementwise instructions of its shape it is computed from, up to the values a
//! reader already reads, values of other shapes (a row's maximum, a bias) and results of
//! other ops (a product). The choice weighs bytes per run: the write its kernel no longer
//! makes (when nothing else needs the value in memory) and each reader's read of it, against
//! the chain's values each reader must now read and those another kernel must now write. A
//! kernel that makes several passes over its rows (one that reads a reduction of its own, as
//! a softmax's gradient does) computes the chain in each pass, so it recomputes cheap ops
//! only.

use super::{RegionUses, duplicable, kernel_body};
use crate::simplify::extract::bytes;
use kiln_ir::print::ValueNames;
use kiln_ir::{Cost, Function, Inst, Op, Region, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The most instructions one value's chain may recompute in one kernel.
const MAX_CHAIN: usize = 16;

/// What the region's first grouping gives the choice: each position's group, what each group
/// reads from outside itself and what it yields.
struct Kernels {
    group_of: Vec<Option<usize>>,
    reads: Vec<HashSet<Value>>,
    yields: Vec<HashSet<Value>>,
    /// Whether the group reads a reduction of its own: a kernel of several passes over its
    /// rows, each of which computes the chain again, so only cheap ops (no division, no
    /// transcendental) are recomputed there.
    passes: Vec<bool>,
}

impl Kernels {
    fn new(uses: &RegionUses, groups: &[Vec<usize>], producer: &HashMap<Value, usize>) -> Self {
        let mut group_of = vec![None; uses.insts.len()];
        for (g, members) in groups.iter().enumerate() {
            for &m in members {
                group_of[m] = Some(g);
            }
        }
        let reads = (groups.iter())
            .map(|members| {
                let (_, operands) = kernel_body(uses.func, &uses.insts, members, producer);
                operands.into_iter().collect()
            })
            .collect();
        let yields = (groups.iter())
            .map(|members| uses.outputs(members).into_iter().collect())
            .collect();
        let passes = (groups.iter())
            .map(|members| {
                (members.iter()).any(|&m| {
                    let data = uses.func.inst(uses.insts[m]);
                    matches!(data.op, Op::Reduce { .. })
                        && (uses.effective_users(data.results[0]).iter())
                            .any(|u| members.contains(u))
                })
            })
            .collect();
        Kernels {
            group_of,
            reads,
            yields,
            passes,
        }
    }
}

/// One value's chain for one reading kernel: the positions to compute again (duplicable ones
/// included, so a broadcast of a recomputed value is recomputed with it) and the values the
/// chain starts from.
struct Chain {
    positions: BTreeSet<usize>,
    leaves: BTreeSet<Value>,
}

/// Plans and applies recomputation in one region (before it is grouped for good); returns how
/// many values are recomputed (with `notes`, why) and, when none is, the region's grouping,
/// which still holds.
pub(super) fn recompute_across_kernels(
    func: &mut Function,
    region: Region,
    notes: Option<&mut Vec<String>>,
) -> (usize, Option<Vec<Vec<usize>>>) {
    let uses = RegionUses::new(func, region);
    let groups = uses.groups(None);
    let producer: HashMap<Value, usize> = (uses.insts.iter().enumerate())
        .flat_map(|(i, &inst)| func.inst(inst).results.iter().map(move |&r| (r, i)))
        .collect();
    let mut kernels = Kernels::new(&uses, &groups, &producer);
    // Per reading group: the positions it computes again.
    let mut planned: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let mut explained = Vec::new();
    let names = notes.is_some().then(|| ValueNames::new(func));
    for p in 0..uses.insts.len() {
        let Some(own) = kernels.group_of[p].filter(|_| elementwise(&uses, p)) else {
            continue;
        };
        let v = func.inst(uses.insts[p]).results[0];
        let outside: Vec<usize> = (uses.effective_users(v).into_iter())
            .filter(|&u| group(&kernels, u) != Some(own))
            .collect();
        let reading: BTreeSet<usize> = outside.iter().filter_map(|&u| group(&kernels, u)).collect();
        // A kernel that broadcasts `v` to more elements would compute it for every copy.
        let expanded = |u: usize| group(&kernels, u).is_some() && uses.expands(p, u);
        if reading.is_empty() || outside.iter().any(|&u| expanded(u)) {
            continue;
        }
        let chains: Option<Vec<(usize, Chain)>> = (reading.iter())
            .map(|&g| Some((g, chain(&uses, &producer, &kernels, planned.get(&g), g, v)?)))
            .collect();
        let Some(chains) = chains else { continue };
        // Readers outside kernels (a product, the region's results) need it in memory.
        let memory_free = outside.iter().all(|&u| group(&kernels, u).is_some());
        let (gain, newly_yielded) = gain(func, &kernels, &producer, v, memory_free, &chains);
        if gain <= 0.0 {
            continue;
        }
        for (g, chain) in chains {
            let computed: Vec<Value> = (chain.positions.iter())
                .flat_map(|&q| func.inst(uses.insts[q]).results.clone())
                .collect();
            let reads = &mut kernels.reads[g];
            reads.retain(|r| !computed.contains(r));
            reads.extend(chain.leaves.iter().copied());
            planned.entry(g).or_default().extend(chain.positions);
        }
        for leaf in newly_yielded {
            let h = kernels.group_of[producer[&leaf]].expect("a leaf in a kernel");
            kernels.yields[h].insert(leaf);
        }
        if memory_free {
            kernels.yields[own].remove(&v);
        }
        let n = reading.len();
        explained.push(names.as_ref().map(|names| {
            format!(
                "{} ({}) recomputed by the {n} kernel{} reading it: {gain:.0} bytes fewer \
                 moved a run",
                names.get(v),
                func.inst(uses.insts[p]).op.name(),
                if n == 1 { "" } else { "s" }
            )
        }));
    }
    if let Some(notes) = notes {
        notes.extend(explained.iter().flatten().cloned());
    }
    if planned.is_empty() {
        return (0, Some(groups));
    }
    let insts = uses.insts.clone();
    apply(func, region, &insts, &groups, &producer, &planned);
    // What every reader now recomputes is read by nothing: no kernel computes it.
    crate::dce::dce_region(func, region);
    (explained.len(), None)
}

/// The group of position `u` (`None` outside kernels, and for the region's results).
fn group(kernels: &Kernels, u: usize) -> Option<usize> {
    kernels.group_of.get(u).copied().flatten()
}

/// The bytes a run saves by recomputing `v` by `chains` (one per reading group), and the
/// chains' leaves their kernels must now yield.
fn gain(
    func: &Function,
    kernels: &Kernels,
    producer: &HashMap<Value, usize>,
    v: Value,
    memory_free: bool,
    chains: &[(usize, Chain)],
) -> (f64, BTreeSet<Value>) {
    let size = bytes(func.value_type(v));
    let mut gain = if memory_free { size } else { 0.0 };
    let mut newly_yielded = BTreeSet::new();
    for (g, chain) in chains {
        gain += size;
        for &leaf in &chain.leaves {
            if !kernels.reads[*g].contains(&leaf) {
                gain -= bytes(func.value_type(leaf));
            }
            if let Some(h) = producer.get(&leaf).and_then(|&q| kernels.group_of[q])
                && !kernels.yields[h].contains(&leaf)
            {
                newly_yielded.insert(leaf);
            }
        }
    }
    gain -= (newly_yielded.iter())
        .map(|&l| bytes(func.value_type(l)))
        .sum::<f64>();
    (gain, newly_yielded)
}

/// Whether position `p` computes an elementwise function a kernel could compute again.
fn elementwise(uses: &RegionUses, p: usize) -> bool {
    let data = uses.func.inst(uses.insts[p]);
    data.results.len() == 1
        && !uses.input_free[p]
        && matches!(
            data.op,
            Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. }
        )
}

/// The chain that recomputes `v` in group `g`, or `None` when `v` cannot be recomputed there
/// or its chain is too long.
fn chain(
    uses: &RegionUses,
    producer: &HashMap<Value, usize>,
    kernels: &Kernels,
    planned: Option<&BTreeSet<usize>>,
    g: usize,
    v: Value,
) -> Option<Chain> {
    let shape = &uses.func.value_type(v).shape;
    let mut out = Chain {
        positions: BTreeSet::new(),
        leaves: BTreeSet::new(),
    };
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) {
            continue;
        }
        let Some(&q) = producer.get(&x) else {
            out.leaves.insert(x);
            continue;
        };
        if planned.is_some_and(|planned| planned.contains(&q)) {
            continue;
        }
        let data = uses.func.inst(uses.insts[q]);
        let available = x != v && kernels.reads[g].contains(&x);
        let recompute = !available
            && (duplicable(&data.op)
                || (elementwise(uses, q)
                    && (!kernels.passes[g] || data.op.cost() == Cost::Cheap)
                    && kernels.group_of[q] != Some(g)
                    && uses.func.value_type(x).shape == *shape));
        if !recompute {
            if x == v {
                return None;
            }
            out.leaves.insert(x);
            continue;
        }
        out.positions.insert(q);
        if out.positions.len() > MAX_CHAIN {
            return None;
        }
        stack.extend(data.args.iter().copied());
    }
    Some(out)
}

/// Clones each group's planned positions into the region, each just before the first of the
/// group's members that reads it, and points the group's members at the clones.
fn apply(
    func: &mut Function,
    region: Region,
    insts: &[Inst],
    groups: &[Vec<usize>],
    producer: &HashMap<Value, usize>,
    planned: &BTreeMap<usize, BTreeSet<usize>>,
) {
    let mut before: HashMap<usize, Vec<Inst>> = HashMap::new();
    for (&g, positions) in planned {
        let mut clone_of: HashMap<Value, Value> = HashMap::new();
        let mut clones: HashMap<Value, Inst> = HashMap::new();
        for &q in positions {
            let data = func.inst(insts[q]).clone();
            let args: Vec<Value> = (data.args.iter())
                .map(|a| clone_of.get(a).copied().unwrap_or(*a))
                .collect();
            let types = vec![func.value_type(data.results[0]).clone()];
            let clone = func.create_inst(data.op, args, types, Vec::new(), data.loc);
            let c = func.inst(clone).results[0];
            clone_of.insert(data.results[0], c);
            clones.insert(c, clone);
        }
        // Members read the clones; a duplicable op between them (a broadcast) is cloned too,
        // so that other kernels keep reading the original.
        let mut placed: HashSet<Inst> = HashSet::new();
        for &m in &groups[g] {
            let args = func.inst(insts[m]).args.clone();
            let new_args: Vec<Value> = (args.iter())
                .map(|&a| through_duplicates(func, insts, producer, &mut clone_of, &mut clones, a))
                .collect();
            for &a in &new_args {
                place(func, &clones, &mut placed, before.entry(m).or_default(), a);
            }
            func.inst_mut(insts[m]).args = new_args;
        }
    }
    let mut order = Vec::with_capacity(insts.len());
    for (i, &inst) in insts.iter().enumerate() {
        order.extend(before.remove(&i).unwrap_or_default());
        order.push(inst);
    }
    func.region_mut(region).insts = order;
}

/// Appends the clone computing `v` to `out` after the clones it reads, unless placed already.
fn place(
    func: &Function,
    clones: &HashMap<Value, Inst>,
    placed: &mut HashSet<Inst>,
    out: &mut Vec<Inst>,
    v: Value,
) {
    let Some(&clone) = clones.get(&v) else { return };
    if !placed.insert(clone) {
        return;
    }
    for &a in &func.inst(clone).args {
        place(func, clones, placed, out, a);
    }
    out.push(clone);
}

/// `a`, or its clone when it is recomputed or a duplicable op over a recomputed value.
fn through_duplicates(
    func: &mut Function,
    insts: &[Inst],
    producer: &HashMap<Value, usize>,
    clone_of: &mut HashMap<Value, Value>,
    clones: &mut HashMap<Value, Inst>,
    a: Value,
) -> Value {
    if let Some(&c) = clone_of.get(&a) {
        return c;
    }
    let Some(&q) = producer.get(&a) else { return a };
    let data = func.inst(insts[q]).clone();
    if !duplicable(&data.op) {
        return a;
    }
    let args: Vec<Value> = (data.args.iter())
        .map(|&x| through_duplicates(func, insts, producer, clone_of, clones, x))
        .collect();
    if args == data.args {
        return a;
    }
    let types = vec![func.value_type(a).clone()];
    let clone = func.create_inst(data.op, args, types, Vec::new(), data.loc);
    let c = func.inst(clone).results[0];
    clone_of.insert(a, c);
    clones.insert(c, clone);
    c
}
