//! Layouts chosen across the graph: convolutions, max pooling and the elementwise ops between
//! them run channels last (`[N, H, W, C]`), with transposes only where the region meets ops
//! that need NCHW.
//!
//! A convolution over NCHW activations lays its input out channels last and its output back
//! inside the executor (two passes over memory for the forward op, two or three for each
//! gradient); a chain of layers pays that at every layer. This pass finds each **region** of
//! rank-4 activations connected through convolutions (one group), max pooling and its
//! gradient, elementwise ops (a bias, an activation, a ReLU's mask), splat constants,
//! broadcasts, reductions (a bias gradient) and channel concatenations, and when that is
//! cheaper it rewrites the whole region channels last. Cheaper means: the region holds a
//! convolution gradient (a training step; forward passes alone measured no faster), and
//! the elements its convolutions would lay out channels last and back over NCHW activations
//! (none for pointwise ones) outnumber those its edges' transposes move. The ops take
//! `channels_last=true`, the values' types their axes permuted, the reductions and
//! concatenations their axes renumbered. Values entering the region from other ops (the
//! image, a reshaped gradient) get one transpose in; values leaving it (to a reshape, a
//! matmul, a result) one transpose out — or a reshape, when only axes of size 1 move (a bias
//! `[1, C, 1, 1]`). Regions read inside `while` or `cond` bodies are left as they are.
//!
//! The choice is shown by `kiln opt` (`--print-after-all`, or `--passes channels_last`) and
//! explained with `--explain`: each region converted, its size, what it saves and the edges
//! it pays for, or why it stays NCHW.

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::{
    ConvKind, Function, Inst, Loc, Module, NCHW_TO_NHWC, NHWC_TO_NCHW, Op, PoolKind, Shape, Type,
    Value,
};
use std::collections::{HashMap, HashSet};

/// The channels-last layout pass.
#[derive(Default)]
pub struct ChannelsLast {
    explain: bool,
    explanations: Vec<String>,
}

impl Pass for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels_last"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        self.explanations.clear();
        let mut total = Converted::default();
        for func in &mut module.functions {
            for region in regions(func) {
                if region.gradients == 0 {
                    if self.explain {
                        self.explanations.push(format!(
                            "@{}: {} convolution(s) stay NCHW: no gradient among them (forward \
                             passes alone measured no faster channels last: BENCHMARKS.md)",
                            func.name(),
                            region.convolutions,
                        ));
                    }
                    continue;
                }
                let (saved, paid) = (saved_moves(func, &region), edge_moves(func, &region));
                if saved <= paid {
                    if self.explain {
                        self.explanations.push(format!(
                            "@{}: {} convolution(s) stay NCHW: channels last would save {saved} \
                             element moves in them and pay {paid} at the region's edges",
                            func.name(),
                            region.convolutions,
                        ));
                    }
                    continue;
                }
                let done = convert(func, &region);
                if self.explain {
                    self.explanations.push(format!(
                        "@{}: {} convolution(s), {} pooling(s) and {} other op(s) run channels \
                         last; {} transpose(s) or reshape(s) in, {} out (saving {saved} element \
                         moves in the convolutions, paying {paid} at the edges)",
                        func.name(),
                        done.convolutions,
                        done.poolings,
                        done.others,
                        done.edges_in,
                        done.edges_out
                    ));
                }
                total.add(&done);
            }
        }
        Ok(Stats::default()
            .with("regions", total.regions)
            .with("convolutions", total.convolutions)
            .with("edges", total.edges_in + total.edges_out))
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn take_explanations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.explanations)
    }
}

/// What converting regions did.
#[derive(Default)]
struct Converted {
    regions: usize,
    convolutions: usize,
    poolings: usize,
    others: usize,
    edges_in: usize,
    edges_out: usize,
}

impl Converted {
    fn add(&mut self, o: &Converted) {
        self.regions += o.regions;
        self.convolutions += o.convolutions;
        self.poolings += o.poolings;
        self.others += o.others;
        self.edges_in += o.edges_in;
        self.edges_out += o.edges_out;
    }
}

/// How an instruction of the body takes part in a region.
#[derive(Clone, Copy, PartialEq)]
enum Role {
    /// A convolution or max pooling: `carried[i]` marks the operands that are activations,
    /// and the result is one unless it is a filter gradient.
    Window { carried: [bool; 2], result: bool },
    /// Elementwise, a splat, a broadcast, a reduction keeping its axes, a concatenation: every
    /// rank-4 operand and the result are activations.
    Along,
    /// A reduction that drops its axes and keeps the others in order: reads an activation,
    /// gives a value outside any region.
    Reads,
    /// Anything else: its operands are NCHW.
    Outside,
}

/// The role of `inst` for a value laid out channels last.
fn role(func: &Function, inst: Inst) -> Role {
    let data = func.inst(inst);
    let rank4 = |v: Value| func.value_type(v).rank() == 4;
    let results_rank4 = data.results.len() == 1 && rank4(data.results[0]);
    let float = data
        .results
        .first()
        .is_some_and(|&r| func.value_type(r).dtype.is_float());
    match &data.op {
        Op::Conv2d { kind, attrs } if float && !attrs.channels_last && attrs.groups == 1 => {
            match kind {
                ConvKind::Forward | ConvKind::InputGrad { .. } => Role::Window {
                    carried: [true, false],
                    result: true,
                },
                ConvKind::FilterGrad { .. } => Role::Window {
                    carried: [true, true],
                    result: false,
                },
            }
        }
        Op::Pool2d { kind, attrs } if float && !attrs.channels_last => match kind {
            PoolKind::Max => Role::Window {
                carried: [true, false],
                result: true,
            },
            PoolKind::MaxGrad => Role::Window {
                carried: [true, true],
                result: true,
            },
            _ => Role::Outside,
        },
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Cast { .. }
            if results_rank4 && data.args.iter().all(|&a| rank4(a)) =>
        {
            Role::Along
        }
        Op::Const { value, .. } if results_rank4 && value.len() == 1 => Role::Along,
        // From an operand of rank 4 (a bias `[1, C, 1, 1]`) or a scalar.
        Op::Broadcast { .. }
            if results_rank4
                && data
                    .args
                    .iter()
                    .all(|&a| [0, 4].contains(&func.value_type(a).rank())) =>
        {
            Role::Along
        }
        Op::Concat { .. } if results_rank4 => Role::Along,
        Op::Reduce {
            axes, keep_dims, ..
        } if rank4(data.args[0]) => match keep_dims {
            true => Role::Along,
            false if kept_in_order(axes) => Role::Reads,
            false => Role::Outside,
        },
        _ => Role::Outside,
    }
}

/// Whether the NCHW axes a reduction keeps (those not in `axes`) stay in the same order
/// channels last.
fn kept_in_order(axes: &[usize]) -> bool {
    let kept: Vec<usize> = (0..4)
        .filter(|a| !axes.contains(a))
        .map(|a| NHWC_TO_NCHW[a])
        .collect();
    kept.windows(2).all(|w| w[0] < w[1])
}

/// A region: the instructions rewritten and the values whose type turns channels last.
struct Region {
    insts: HashSet<Inst>,
    values: HashSet<Value>,
    convolutions: usize,
    /// Of which gradients (input or filter).
    gradients: usize,
}

/// The body's regions worth converting: connected through the ops of [`role`], holding a
/// convolution, and not read inside a nested region.
fn regions(func: &Function) -> Vec<Region> {
    let body = func.region(func.body());
    let mut parent: HashMap<Value, Value> = HashMap::new();
    // Iterative, with path halving: a chain of 100,000 linked activations is one set.
    fn find(parent: &mut HashMap<Value, Value>, v: Value) -> Value {
        let mut v = v;
        loop {
            let p = *parent.entry(v).or_insert(v);
            if p == v {
                return v;
            }
            let grand = *parent.entry(p).or_insert(p);
            parent.insert(v, grand);
            v = grand;
        }
    }
    let union = |parent: &mut HashMap<Value, Value>, a: Value, b: Value| {
        let (a, b) = (find(parent, a), find(parent, b));
        if a != b {
            parent.insert(a, b);
        }
    };
    // The activations each instruction links (operands first, its result last).
    let linked = |inst: Inst| -> Vec<Value> {
        let data = func.inst(inst);
        let mut values: Vec<Value> = match role(func, inst) {
            Role::Window { carried, result } => {
                let mut v: Vec<Value> = (data.args.iter().zip(carried))
                    .filter_map(|(&a, c)| c.then_some(a))
                    .collect();
                if result {
                    v.push(data.results[0]);
                }
                v
            }
            Role::Along => {
                let mut v: Vec<Value> = (data.args.iter().copied())
                    .filter(|&a| func.value_type(a).rank() == 4)
                    .collect();
                v.push(data.results[0]);
                v
            }
            Role::Reads => vec![data.args[0]],
            Role::Outside => Vec::new(),
        };
        values.dedup();
        values
    };
    let links: Vec<(Inst, Vec<Value>)> = body.insts.iter().map(|&i| (i, linked(i))).collect();
    for (_, values) in &links {
        for pair in values.windows(2) {
            union(&mut parent, pair[0], pair[1]);
        }
    }
    let nested: HashSet<Value> = (body.insts.iter())
        .flat_map(|&i| func.inst(i).regions.clone())
        .flat_map(|r| func.free_values(r))
        .collect();
    let mut by_root: HashMap<Value, Region> = HashMap::new();
    let mut spoiled: HashSet<Value> = HashSet::new();
    for (inst, values) in links {
        let Some(&first) = values.first() else {
            continue;
        };
        let root = find(&mut parent, first);
        let region = by_root.entry(root).or_insert_with(|| Region {
            insts: HashSet::new(),
            values: HashSet::new(),
            convolutions: 0,
            gradients: 0,
        });
        region.insts.insert(inst);
        if let Op::Conv2d { kind, .. } = func.inst(inst).op {
            region.convolutions += 1;
            region.gradients += usize::from(kind != ConvKind::Forward);
        }
        if values.iter().any(|v| nested.contains(v)) {
            spoiled.insert(root);
        }
        // The region's own values: results of its instructions that are activations.
        let data = func.inst(inst);
        if let Some(&r) = data.results.first()
            && values.contains(&r)
        {
            region.values.insert(r);
        }
    }
    let mut out: Vec<(Value, Region)> = by_root
        .into_iter()
        .filter(|(root, r)| r.convolutions > 0 && !spoiled.contains(root))
        .collect();
    out.sort_by_key(|(root, _)| *root);
    out.into_iter().map(|(_, r)| r).collect()
}

/// `ty` (rank 4) with its axes permuted by `perm`.
fn permuted(ty: &Type, perm: [usize; 4]) -> Type {
    let dims = ty.shape.dims();
    ty.with_shape(Shape(perm.iter().map(|&a| dims[a].clone()).collect()))
}

/// The op that lays `ty` (rank 4) out by `perm`: a reshape when the axes longer than 1 keep
/// their order (a bias `[1, C, 1, 1]`, an image of one channel), else a transpose.
fn relayout(ty: &Type, perm: [usize; 4]) -> Op {
    let dims = ty.shape.dims();
    let moved: Vec<usize> = perm.into_iter().filter(|&a| !dims[a].is_one()).collect();
    match moved.windows(2).all(|w| w[0] < w[1]) {
        true => Op::Reshape {
            shape: permuted(ty, perm).shape,
        },
        false => Op::Transpose {
            perm: perm.to_vec(),
        },
    }
}

/// The elements laying out an NCHW activation of type `ty` channels last (or back) moves:
/// none when only axes of size 1 move (one channel, a bias). Counted per unit of the
/// symbolic sizes (a batch `N`, which every activation of a region shares, counts once).
fn moves(ty: &Type) -> u64 {
    match relayout(ty, NCHW_TO_NHWC) {
        Op::Transpose { .. } => (ty.shape.dims().iter())
            .map(|d| d.as_fixed().map_or(1, |n| n as u64))
            .fold(1, u64::saturating_mul),
        _ => 0,
    }
}

/// The element moves the region's convolutions make over NCHW activations and not channels
/// last ([`lays_out_nchw`]).
fn saved_moves(func: &Function, region: &Region) -> u64 {
    let body = func.region(func.body());
    (body.insts.iter().filter(|i| region.insts.contains(i)))
        .filter_map(|&inst| match role(func, inst) {
            Role::Window { carried, result } if lays_out_nchw(func, inst) => {
                let data = func.inst(inst);
                let operands = (data.args.iter().zip(carried))
                    .filter(|(_, c)| *c)
                    .map(|(&a, _)| moves(func.value_type(a)));
                let output = result.then(|| moves(func.value_type(data.results[0])));
                Some(operands.chain(output).fold(0, u64::saturating_add))
            }
            _ => None,
        })
        .fold(0, u64::saturating_add)
}

/// Whether the executor lays the NCHW activations `inst` reads out channels last, and its
/// output back: a convolution, unless it is pointwise (1×1 windows, unit strides, no
/// padding: a product over the NCHW planes as they are).
fn lays_out_nchw(func: &Function, inst: Inst) -> bool {
    let data = func.inst(inst);
    let Op::Conv2d { kind, attrs } = &data.op else {
        return false;
    };
    let weights = match kind {
        ConvKind::FilterGrad { .. } => data.results[0],
        _ => data.args[1],
    };
    // A symbolic window size is no 1.
    let dims = func.value_type(weights).shape.dims();
    let window = [2, 3].map(|axis| dims[axis].as_fixed().unwrap_or(0));
    !attrs.is_pointwise(window)
}

/// The element moves of the transposes converting `region` adds at its edges (reshapes move
/// nothing; the values are NCHW still, and moving only axes of size 1 one way moves only
/// them the other way too).
fn edge_moves(func: &Function, region: &Region) -> u64 {
    let body = func.region(func.body());
    let mut crossing: HashSet<(Value, bool)> = HashSet::new();
    for &inst in &body.insts {
        let args = &func.inst(inst).args;
        crossing.extend(
            crossings(func, region, inst)
                .into_iter()
                .map(|(i, into)| (args[i], into)),
        );
    }
    crossing.extend(
        (body.results.iter())
            .filter(|r| region.values.contains(r))
            .map(|&r| (r, false)),
    );
    (crossing.into_iter())
        .map(|(v, _)| moves(func.value_type(v)))
        .fold(0, u64::saturating_add)
}

/// The operands of `inst` that cross `region`'s edge: `(index, true)` for a value from
/// outside that an op inside reads (laid out channels last on the way in), `(index, false)`
/// for a region value that an op outside reads (laid back out NCHW).
fn crossings(func: &Function, region: &Region, inst: Inst) -> Vec<(usize, bool)> {
    let args = &func.inst(inst).args;
    let inside = region.insts.contains(&inst);
    let carried: Vec<bool> = match (inside, role(func, inst)) {
        (true, Role::Window { carried, .. }) => carried.to_vec(),
        (true, Role::Along | Role::Reads) => args
            .iter()
            .map(|&a| func.value_type(a).rank() == 4)
            .collect(),
        _ => vec![false; args.len()],
    };
    (args.iter().zip(carried).enumerate())
        .filter_map(
            |(i, (a, carried))| match (carried, region.values.contains(a)) {
                (true, false) => Some((i, true)),
                (false, true) => Some((i, false)),
                _ => None,
            },
        )
        .collect()
}

/// Rewrites `region` of `func`'s body channels last, with the edges it needs.
fn convert(func: &mut Function, region: &Region) -> Converted {
    let body = func.body();
    let mut done = Converted {
        regions: 1,
        ..Converted::default()
    };
    for &v in &region.values {
        let ty = permuted(func.value_type(v), NCHW_TO_NHWC);
        func.set_value_type(v, ty);
    }
    // Each outside value's channels-last copy, and each region value's NCHW copy.
    let (mut into, mut out_of): (HashMap<Value, Value>, HashMap<Value, Value>) = Default::default();
    let mut insts = Vec::new();
    // The edge laying `v` out by `perm`, placed before `at` (where it is first needed).
    let edge = |func: &mut Function, insts: &mut Vec<Inst>, v: Value, perm, at: Loc| {
        let ty = func.value_type(v).clone();
        let op = relayout(&ty, perm);
        let inst = func.create_inst(op, vec![v], vec![permuted(&ty, perm)], vec![], at);
        insts.push(inst);
        func.inst(inst).results[0]
    };
    for inst in func.region(body).insts.clone() {
        let loc = func.inst(inst).loc;
        for (i, into_region) in crossings(func, region, inst) {
            let a = func.inst(inst).args[i];
            let replacement = match into_region {
                true => *into.entry(a).or_insert_with(|| {
                    done.edges_in += 1;
                    edge(func, &mut insts, a, NCHW_TO_NHWC, loc)
                }),
                false => *out_of.entry(a).or_insert_with(|| {
                    done.edges_out += 1;
                    edge(func, &mut insts, a, NHWC_TO_NCHW, loc)
                }),
            };
            func.inst_mut(inst).args[i] = replacement;
        }
        if region.insts.contains(&inst) {
            relabel(func, inst, &mut done);
        }
        insts.push(inst);
    }
    let mut results = func.region(body).results.clone();
    for r in &mut results {
        if region.values.contains(r) {
            *r = *out_of.entry(*r).or_insert_with(|| {
                done.edges_out += 1;
                edge(func, &mut insts, *r, NHWC_TO_NCHW, func.loc())
            });
        }
    }
    func.region_mut(body).insts = insts;
    func.set_region_results(body, results);
    done
}

/// The op of `inst` (in a region) as it reads and writes channels-last activations.
fn relabel(func: &mut Function, inst: Inst, done: &mut Converted) {
    let position = |a: usize| NHWC_TO_NCHW[a];
    match &mut func.inst_mut(inst).op {
        Op::Conv2d { attrs, .. } => {
            attrs.channels_last = true;
            done.convolutions += 1;
        }
        Op::Pool2d { attrs, .. } => {
            attrs.channels_last = true;
            done.poolings += 1;
        }
        Op::Const { ty, .. } => {
            *ty = permuted(ty, NCHW_TO_NHWC);
            done.others += 1;
        }
        Op::Broadcast { shape } => {
            let dims = shape.dims().to_vec();
            *shape = Shape(NCHW_TO_NHWC.iter().map(|&a| dims[a].clone()).collect());
            done.others += 1;
        }
        Op::Reduce { axes, .. } => {
            for a in axes.iter_mut() {
                *a = position(*a);
            }
            axes.sort_unstable();
            done.others += 1;
        }
        Op::Concat { axis } => {
            *axis = position(*axis);
            done.others += 1;
        }
        _ => done.others += 1,
    }
}
