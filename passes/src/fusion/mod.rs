//! Fusion: maximal groups of elementwise, broadcast and reduction ops become `fused` regions,
//! each of which runs as one kernel with one pass over memory.
//!
//! Grouping is greedy, consumers first: a producer joins its consumer's group when every use of
//! its result is in that group, or when its other uses all come after the group (the group
//! then yields the value too: a multi-output kernel). Either way no path leaves a group and
//! comes back, so the groups stay acyclic. A reduction may lead into elementwise ops after it
//! (softmax's `e / sum(e)` is one group). Broadcasts, splat constants and iotas are index
//! arithmetic: they are never shared between groups but copied into each group that uses them.
//! A value computed from constants and iotas alone that a consumer broadcasts (a causal mask
//! `[T, T]` added to scores `[N, H, T, T]`) stays out of that consumer's kernel, in a kernel of
//! its own: inside it would be recomputed for every copy. Before grouping for good, a kernel
//! that reads a value another kernel computed elementwise may compute it again
//! ([`recompute`]).

mod recompute;

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::print::ValueNames;
use kiln_ir::{Function, Inst, Module, Op, Region, Value};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The longest chain of ops one kernel computes: a longer chain (a 100,000-op `relu` chain
/// imported from ONNX) is cut into kernels of at most this depth, so that the code generator,
/// which walks a kernel's expressions by recursion, stays within any thread's stack — and a
/// kernel's compile time within bounds.
pub const MAX_KERNEL_DEPTH: usize = 128;

/// Fusion of elementwise, broadcast and reduction ops into `fused` kernel regions.
#[derive(Default)]
pub struct Fuse {
    /// Record why each value was or was not fused (`kiln opt --explain`).
    pub explain: bool,
    explanations: Vec<String>,
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn take_explanations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.explanations)
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let (mut groups, mut fused_insts, mut recomputed) = (0, 0, 0);
        self.explanations.clear();
        for func in &mut module.functions {
            let mut replace = HashMap::new();
            let mut pending = vec![func.body()];
            while let Some(region) = pending.pop() {
                let mut notes = self.explain.then_some(&mut self.explanations);
                let (count, grouped) =
                    recompute::recompute_across_kernels(func, region, notes.as_deref_mut());
                recomputed += count;
                let (g, n) = fuse_region(func, region, grouped, &mut replace, notes);
                groups += g;
                fused_insts += n;
                for &inst in &func.region(region).insts {
                    if func.inst(inst).op != Op::Fused {
                        pending.extend(func.inst(inst).regions.iter().copied());
                    }
                }
            }
            func.replace_uses_map(&replace);
        }
        Ok(Stats::default()
            .with("kernels", groups)
            .with("ops fused", fused_insts)
            .with("values recomputed", recomputed))
    }
}

/// Ops a fused kernel computes (exhaustive, so a new op is decided here).
pub(crate) fn fusible(op: &Op) -> bool {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Select
        | Op::Cast { .. }
        | Op::Reduce { .. } => true,
        Op::Const { .. } | Op::Broadcast { .. } | Op::Iota { .. } => duplicable(op),
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Pad { .. }
        | Op::Concat { .. }
        | Op::ArgReduce { .. }
        | Op::MatMul { .. }
        | Op::MatMulAcc { .. }
        | Op::Conv2d { .. }
        | Op::Pool2d { .. }
        | Op::Gather { .. }
        | Op::UpdateSlice { .. }
        | Op::ScatterAdd { .. }
        | Op::OneHot { .. }
        | Op::Random { .. }
        | Op::Load { .. }
        | Op::Store { .. }
        | kiln_ir::opaque_op!() => false,
    }
}

/// Ops that are index arithmetic: copied into every group that uses them.
pub(crate) fn duplicable(op: &Op) -> bool {
    match op {
        Op::Broadcast { .. } | Op::Iota { .. } => true,
        Op::Const { value, .. } => value.len() == 1,
        _ => false,
    }
}

/// Union-find over instruction positions, with each group's last position.
struct Groups {
    parent: Vec<usize>,
    last: Vec<usize>,
}

impl Groups {
    fn find(&mut self, i: usize) -> usize {
        let mut i = i;
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a] = b;
            self.last[b] = self.last[b].max(self.last[a]);
        }
    }
}

/// Groups (unless `grouped` gives the groups, when no reason is asked for) and emits the
/// fused kernels of one region; returns (kernels, instructions fused).
fn fuse_region(
    func: &mut Function,
    region: Region,
    grouped: Option<Vec<Vec<usize>>>,
    replace: &mut HashMap<Value, Value>,
    notes: Option<&mut Vec<String>>,
) -> (usize, usize) {
    let uses = RegionUses::new(func, region);
    let mut why = notes.is_some().then(|| Why::new(func));
    let groups = match (grouped, why.as_mut()) {
        (Some(groups), None) => groups,
        (_, why) => uses.groups(why),
    };
    let plans: Vec<(Vec<usize>, Vec<Value>)> = groups
        .into_iter()
        .map(|members| {
            let outputs = uses.outputs(&members);
            (members, outputs)
        })
        .collect();
    let insts = uses.insts;
    let producer: HashMap<Value, usize> = insts
        .iter()
        .enumerate()
        .flat_map(|(i, &inst)| func.inst(inst).results.iter().map(move |&r| (r, i)))
        .collect();
    let mut kernels: Vec<(usize, Inst, Vec<usize>)> = Vec::new();
    let mut fused_count = 0;
    for (members, outputs) in plans {
        let kernel = emit_group(func, &insts, &members, &outputs, &producer, replace);
        fused_count += members.len();
        kernels.push((members[0], kernel, members));
    }
    if let (Some(notes), Some(why)) = (notes, why) {
        notes.extend(why.finish());
    }
    let kept = reorder(func, &insts, &kernels, replace);
    func.region_mut(region).insts =
        drop_unused_duplicates(func, kept, &func.region(region).results.clone());
    (kernels.len(), fused_count)
}

/// A region's instructions by position, and the positions that use each value (`n`, one past
/// the last instruction, stands for the region's results).
struct RegionUses<'f> {
    func: &'f Function,
    insts: Vec<Inst>,
    users: HashMap<Value, Vec<usize>>,
    /// By position: whether the instruction's result depends on no input of the function.
    input_free: Vec<bool>,
}

impl<'f> RegionUses<'f> {
    fn new(func: &'f Function, region: Region) -> RegionUses<'f> {
        let insts = func.region(region).insts.clone();
        let mut users: HashMap<Value, Vec<usize>> = HashMap::new();
        for (i, &inst) in insts.iter().enumerate() {
            for &a in &func.inst(inst).args {
                users.entry(a).or_default().push(i);
            }
            for &r in &func.inst(inst).regions {
                for v in func.free_values(r) {
                    users.entry(v).or_default().push(i);
                }
            }
        }
        for &v in &func.region(region).results {
            users.entry(v).or_default().push(insts.len());
        }
        let mut free_values = HashSet::new();
        let input_free: Vec<bool> = (insts.iter())
            .map(|&inst| {
                let data = func.inst(inst);
                let free = fusible(&data.op)
                    && data.regions.is_empty()
                    && data.args.iter().all(|a| free_values.contains(a));
                if free {
                    free_values.extend(data.results.iter().copied());
                }
                free
            })
            .collect();
        RegionUses {
            func,
            insts,
            users,
            input_free,
        }
    }

    /// Whether position `i` computes something a kernel would do (not a duplicable op, which
    /// groups copy, nor the region's results).
    fn computes(&self, i: usize) -> bool {
        i < self.insts.len() && {
            let op = &self.func.inst(self.insts[i]).op;
            fusible(op) && !duplicable(op)
        }
    }

    /// Whether consumer `c` broadcasts producer `p`'s result (of more than one element) to
    /// more elements: a kernel of `c` would compute `p` again for every copy.
    fn expands(&self, p: usize, c: usize) -> bool {
        let elements = |i: usize| {
            let data = self.func.inst(self.insts[i]);
            self.func.value_type(data.results[0]).shape.num_elements()
        };
        match (elements(p), elements(c)) {
            (Some(p), Some(c)) => 1 < p && p < c,
            (Some(p), None) => 1 < p,
            (None, _) => false,
        }
    }

    /// The users of `v` that compute with it, looking through duplicable ops.
    fn effective_users(&self, v: Value) -> Vec<usize> {
        let mut out = Vec::new();
        let mut stack = vec![v];
        while let Some(v) = stack.pop() {
            for &u in self.users.get(&v).map(Vec::as_slice).unwrap_or_default() {
                let inst = self.insts.get(u).map(|&i| self.func.inst(i));
                match inst {
                    Some(data) if duplicable(&data.op) => stack.extend(data.results.iter()),
                    _ => out.push(u),
                }
            }
        }
        out
    }

    /// The groups to fuse, each its members' positions, ordered by first member. Producers go
    /// last to first: an op joins the group of its earliest consumer when every other use of
    /// it comes after that group ends; the group then also yields it.
    /// With `why`, each decision is recorded.
    fn groups(&self, mut why: Option<&mut Why>) -> Vec<Vec<usize>> {
        let n = self.insts.len();
        let mut groups = Groups {
            parent: (0..n).collect(),
            last: (0..n).collect(),
        };
        // By position: the longest chain from the op up to its kernel's outputs.
        let mut depth = vec![1usize; n];
        for p in (0..n).rev().filter(|&p| self.computes(p)) {
            let results = &self.func.inst(self.insts[p]).results;
            let uses: Vec<usize> = results
                .iter()
                .flat_map(|&r| self.effective_users(r))
                .collect();
            let Some(&first) = uses.iter().filter(|&&u| self.computes(u)).min() else {
                if let Some(why) = why.as_deref_mut() {
                    let readers = uses.iter().map(|&u| self.at(u)).collect();
                    why.note(
                        self.func,
                        p,
                        self.insts[p],
                        Decision::NoFusedReader(readers),
                    );
                }
                continue;
            };
            if self.input_free[p] && !self.input_free[first] && self.expands(p, first) {
                if let Some(why) = why.as_deref_mut() {
                    why.note(
                        self.func,
                        p,
                        self.insts[p],
                        Decision::Expanded(self.at(first)),
                    );
                }
                continue;
            }
            let group = groups.find(first);
            let last = groups.last[group];
            let blocking = (uses.iter())
                .find(|&&u| !((self.computes(u) && groups.find(u) == group) || u > last));
            let chain = 1
                + (uses.iter())
                    .filter(|&&u| self.computes(u) && groups.find(u) == group)
                    .map(|&u| depth[u])
                    .max()
                    .unwrap_or(0);
            let too_deep = chain > MAX_KERNEL_DEPTH;
            if let Some(why) = why.as_deref_mut() {
                let decision = match blocking {
                    None if too_deep => Decision::TooDeep(self.at(first)),
                    None => Decision::Joined(self.at(first)),
                    Some(&u) => Decision::ReadInside(self.at(first), self.at(u)),
                };
                why.note(self.func, p, self.insts[p], decision);
            }
            if blocking.is_none() && !too_deep {
                groups.union(p, group);
                depth[p] = chain;
            }
        }
        let mut by_group: HashMap<usize, Vec<usize>> = HashMap::new();
        for i in (0..n).filter(|&i| self.computes(i)) {
            by_group.entry(groups.find(i)).or_default().push(i);
        }
        let mut ordered: Vec<Vec<usize>> = by_group.into_values().collect();
        ordered.sort_by_key(|members| members[0]);
        ordered
    }

    /// The instruction at position `u`, or `None` for the region's results.
    fn at(&self, u: usize) -> Option<Inst> {
        self.insts.get(u).copied()
    }

    /// The results of a group that leave its kernel: those something outside computes with.
    fn outputs(&self, members: &[usize]) -> Vec<Value> {
        members
            .iter()
            .flat_map(|&i| self.func.inst(self.insts[i]).results.clone())
            .filter(|&v| self.effective_users(v).iter().any(|u| !members.contains(u)))
            .collect()
    }
}

/// The region's new order: the instructions left unfused and the kernels, sorted
/// topologically near their old places.
fn reorder(
    func: &Function,
    insts: &[Inst],
    kernels: &[(usize, Inst, Vec<usize>)],
    replace: &HashMap<Value, Value>,
) -> Vec<Inst> {
    let fused: HashSet<usize> = kernels
        .iter()
        .flat_map(|(_, _, m)| m.iter().copied())
        .collect();
    let mut items: Vec<(usize, Inst)> = insts
        .iter()
        .enumerate()
        .filter(|(i, _)| !fused.contains(i))
        .map(|(i, &inst)| (i, inst))
        .collect();
    items.extend(kernels.iter().map(|&(first, kernel, _)| (first, kernel)));
    topological(func, items, replace)
}

/// A group's kernel as [`emit_group`] makes it: the positions of its body (its members and,
/// recursively, the duplicable producers they read — broadcasts of operands, splats, iotas —
/// which are copied in) and the values it reads from outside, in order of first use.
pub(super) fn kernel_body(
    func: &Function,
    insts: &[Inst],
    members: &[usize],
    producer: &HashMap<Value, usize>,
) -> (Vec<usize>, Vec<Value>) {
    let mut body: BTreeSet<usize> = members.iter().copied().collect();
    let mut stack: Vec<usize> = members.to_vec();
    while let Some(i) = stack.pop() {
        for &a in &func.inst(insts[i]).args {
            if let Some(&p) = producer.get(&a)
                && duplicable(&func.inst(insts[p]).op)
                && body.insert(p)
            {
                stack.push(p);
            }
        }
    }
    let inside: HashSet<Value> = (body.iter())
        .flat_map(|&i| func.inst(insts[i]).results.clone())
        .collect();
    let mut operands: Vec<Value> = Vec::new();
    for &i in &body {
        for &a in &func.inst(insts[i]).args {
            if !inside.contains(&a) && !operands.contains(&a) {
                operands.push(a);
            }
        }
    }
    (body.into_iter().collect(), operands)
}

/// Builds the `fused` instruction of a group and records its outputs in `replace`.
fn emit_group(
    func: &mut Function,
    insts: &[Inst],
    members: &[usize],
    outputs: &[Value],
    producer: &HashMap<Value, usize>,
    replace: &mut HashMap<Value, Value>,
) -> Inst {
    let member_set: BTreeSet<usize> = members.iter().copied().collect();
    let (body, operands) = kernel_body(func, insts, members, producer);
    let region = func.create_region();
    let mut remap: HashMap<Value, Value> = HashMap::new();
    for &v in &operands {
        let arg = func.append_region_arg(region, func.value_type(v).clone(), None);
        remap.insert(v, arg);
    }
    for &i in &body {
        let data = func.inst(insts[i]).clone();
        let args = data.args.iter().map(|a| remap[a]).collect();
        let types = data
            .results
            .iter()
            .map(|&r| func.value_type(r).clone())
            .collect();
        let clone = func.create_inst(data.op, args, types, Vec::new(), data.loc);
        func.append_inst(region, clone);
        for (&old, &new) in data.results.iter().zip(&func.inst(clone).results.clone()) {
            remap.insert(old, new);
            if member_set.contains(&i) && !outputs.contains(&old) {
                let name = func.value_name(old).map(str::to_owned);
                func.set_value_name(new, name);
            }
        }
    }
    func.set_region_results(region, outputs.iter().map(|v| remap[v]).collect());
    let types = outputs
        .iter()
        .map(|&v| func.value_type(v).clone())
        .collect();
    let loc = func
        .inst(insts[*members.last().expect("a group has members")])
        .loc;
    let kernel = func.create_inst(Op::Fused, operands, types, vec![region], loc);
    for (&old, &new) in outputs.iter().zip(&func.inst(kernel).results.clone()) {
        let name = func.value_name(old).map(str::to_owned);
        func.set_value_name(new, name);
        replace.insert(old, new);
    }
    kernel
}

/// Orders `items` so every instruction follows what it uses, staying as close as possible to
/// the given positions (Kahn's algorithm, smallest position first).
fn topological(
    func: &Function,
    items: Vec<(usize, Inst)>,
    replace: &HashMap<Value, Value>,
) -> Vec<Inst> {
    let resolve = |mut v: Value| {
        while let Some(&n) = replace.get(&v) {
            v = n;
        }
        v
    };
    let defines: HashMap<Value, usize> = items
        .iter()
        .enumerate()
        .flat_map(|(k, &(_, inst))| func.inst(inst).results.iter().map(move |&r| (r, k)))
        .collect();
    let mut needs: Vec<HashSet<usize>> = vec![HashSet::new(); items.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    for (k, &(_, inst)) in items.iter().enumerate() {
        let data = func.inst(inst);
        let mut used: Vec<Value> = data.args.clone();
        for &r in &data.regions {
            used.extend(func.free_values(r));
        }
        for v in used {
            if let Some(&d) = defines.get(&resolve(v))
                && d != k
                && needs[k].insert(d)
            {
                dependents[d].push(k);
            }
        }
    }
    let mut ready: BTreeSet<(usize, usize)> = (0..items.len())
        .filter(|&k| needs[k].is_empty())
        .map(|k| (items[k].0, k))
        .collect();
    let mut out = Vec::with_capacity(items.len());
    while let Some(&first) = ready.iter().next() {
        ready.remove(&first);
        let k = first.1;
        out.push(items[k].1);
        for &d in &dependents[k] {
            needs[d].remove(&k);
            if needs[d].is_empty() {
                ready.insert((items[d].0, d));
            }
        }
    }
    out
}

/// Drops duplicable instructions (copied into kernels) that nothing outside uses any more.
fn drop_unused_duplicates(func: &Function, insts: Vec<Inst>, results: &[Value]) -> Vec<Inst> {
    let mut used: HashSet<Value> = results.iter().copied().collect();
    let mut keep = vec![true; insts.len()];
    for (k, &inst) in insts.iter().enumerate().rev() {
        let data = func.inst(inst);
        let unused = data.results.iter().all(|r| !used.contains(r));
        if duplicable(&data.op) && unused {
            keep[k] = false;
            continue;
        }
        used.extend(data.args.iter().copied());
        for &r in &data.regions {
            used.extend(func.free_values(r));
        }
    }
    insts
        .into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(i, _)| i)
        .collect()
}

/// Why a value was or was not fused with its readers (`kiln opt --explain`).
enum Decision {
    /// It joined the kernel of its first fused reader.
    Joined(Option<Inst>),
    /// Nothing that reads it is fused (its readers, `None` the region's results).
    NoFusedReader(Vec<Option<Inst>>),
    /// It is computed from constants alone and this reader broadcasts it to more elements:
    /// the reader's kernel would compute it again for every copy.
    Expanded(Option<Inst>),
    /// Its first fused reader's kernel spans another reader outside that kernel, which needs
    /// it before the kernel ends.
    ReadInside(Option<Inst>, Option<Inst>),
    /// Joining its first fused reader's kernel would make a chain longer than
    /// [`MAX_KERNEL_DEPTH`] ops.
    TooDeep(Option<Inst>),
}

/// The decisions of one region, in the order of its instructions.
struct Why {
    names: ValueNames,
    notes: Vec<(usize, String)>,
}

impl Why {
    fn new(func: &Function) -> Why {
        Why {
            names: ValueNames::new(func),
            notes: Vec::new(),
        }
    }

    /// `%h (tanh)`, or `the results`.
    fn name(&self, func: &Function, inst: Option<Inst>) -> String {
        match inst {
            Some(i) => {
                let data = func.inst(i);
                let value = data.results.first().map(|&v| self.names.get(v));
                format!("{} ({})", value.unwrap_or_default(), data.op.name())
            }
            None => "the region's results".to_owned(),
        }
    }

    fn note(&mut self, func: &Function, p: usize, inst: Inst, decision: Decision) {
        let me = self.name(func, Some(inst));
        let text = match decision {
            Decision::Joined(c) => format!("{me} fused into the kernel of {}", self.name(func, c)),
            Decision::NoFusedReader(readers) => {
                let readers: Vec<String> = readers.iter().map(|&r| self.name(func, r)).collect();
                format!(
                    "{me} ends a kernel: nothing that reads it is fused (read by {})",
                    readers.join(", ")
                )
            }
            Decision::Expanded(c) => format!(
                "{me} kept out of the kernel of {c}: it is computed from constants alone and \
                 {c} broadcasts it to more elements (that kernel would compute it again for \
                 every copy)",
                c = self.name(func, c)
            ),
            Decision::TooDeep(c) => format!(
                "{me} starts a kernel of its own: in the kernel of {} it would make a chain of \
                 more than {MAX_KERNEL_DEPTH} ops",
                self.name(func, c)
            ),
            Decision::ReadInside(c, u) => format!(
                "{me} not fused into the kernel of {}: {} reads it too, before that kernel \
                 ends and outside it",
                self.name(func, c),
                self.name(func, u)
            ),
        };
        self.notes.push((p, text));
    }

    /// The decisions in the order of the instructions.
    fn finish(mut self) -> Vec<String> {
        self.notes.sort_by_key(|(p, _)| *p);
        self.notes.into_iter().map(|(_, text)| text).collect()
    }
}
