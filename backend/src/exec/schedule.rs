//! Scheduling a function for the executor: one step per top-level instruction, the last use
//! of every value, and memory planning — buffer *slots* shared by values whose lifetimes do
//! not overlap, outputs written over a dying input's buffer, and parameters and optimizer
//! state updated in the buffer they were loaded from.

use crate::Array;
use crate::jit::{self, Kernel};
use kiln_ir::{
    AxisSlice, BuildResult, Conv2dAttrs, ConvKind, DType, Dim, Function, FunctionBuilder, Inst,
    Literal, Op, Pool2dAttrs, PoolKind, Region, Shape, Symbol, Value, ValueDef,
};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};

/// What a step does.
pub(crate) enum StepKind {
    /// A compiled kernel; `symbols[i]` is the schedule's index of the kernel's symbol `i`.
    Kernel {
        kernel: Arc<Kernel>,
        symbols: Vec<usize>,
    },
    /// A float matrix product through the gemm crate.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
        /// How each operand is read from the step's input: through a reshape, a transpose,
        /// or both, with no copy made.
        views: [OperandView; 2],
        /// `Some(perm)`: the step's output is the product transposed (the last axis kept
        /// last); the product writes each matrix into the output seen with its axes permuted
        /// by `perm`, the transpose's inverse.
        written_through: Option<Vec<usize>>,
        /// `Some(scale)`: the result is the third input plus `scale ·` the product (an SGD
        /// update folded into its gradient's product, gemm's `dst = dst + β·a·b`).
        onto: Option<f64>,
    },
    /// A float convolution (or a transpose) through im2col and gemm. `epilogue`: the next
    /// step is a kernel that alone reads the output, run on each run of samples as the
    /// convolution writes it (see [`pair_epilogues`]).
    Conv2d {
        kind: ConvKind,
        attrs: Conv2dAttrs,
        epilogue: bool,
    },
    /// Float pooling (or its gradient) by direct loops. `argmax` pairs a max pooling with a
    /// later gradient of the same input and geometry: the index of the kept argmax the first
    /// records and the second reads.
    Pool2d {
        kind: PoolKind,
        attrs: Pool2dAttrs,
        argmax: Option<usize>,
    },
    /// The same elements, another shape: moved when the input dies here, else copied.
    Reshape,
    /// A constant made once, by the first run (after its memory check: a program may declare
    /// a constant larger than memory), and shared by every run.
    Const {
        value: Literal,
        shape: Vec<usize>,
        made: OnceLock<Arc<Array>>,
    },
    Load {
        state: String,
    },
    /// Stores a value; `recycle` is the value's slot, which the state's previous buffer
    /// fills when the run commits.
    Store {
        state: String,
        recycle: Option<usize>,
    },
    /// `gather`, `scatter_add`, `one_hot`, `transpose`, `concat` or a random draw: a native
    /// loop writing into a planned buffer.
    Native,
    /// An op without regions or state, by the interpreter's kernel for it (no frame).
    InterpreterKernel,
    /// A collective or a message, started on the run's communicator; its results are waited
    /// for by the first step that reads one (`Step::awaits`), so it overlaps the steps between.
    Communicate,
    /// A `while` whose regions run compiled: `cond` and `body` take the carried values, then
    /// `free` (the outer values the regions read, which follow the step's arguments in its
    /// inputs).
    While {
        cond: Arc<super::Executable>,
        body: Arc<super::Executable>,
        free: Vec<Value>,
    },
    /// A `cond` whose branches (then, else) run compiled, each taking `free`.
    Cond {
        branches: [Arc<super::Executable>; 2],
        free: Vec<Value>,
    },
    /// Anything else (custom calls, control flow with state in its regions), by the
    /// reference interpreter.
    Interpret,
}

impl StepKind {
    /// Whether the step writes its outputs into buffers the memory plan gives it (a slot, an
    /// input's or a state's), rather than making them itself.
    fn writes_planned_buffers(&self) -> bool {
        matches!(
            self,
            StepKind::Kernel { .. }
                | StepKind::MatMul { .. }
                | StepKind::Conv2d { .. }
                | StepKind::Pool2d { .. }
                | StepKind::Reshape
                | StepKind::Native
        )
    }
}

/// Where a step's output buffer comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Output {
    /// A buffer slot of the arena.
    Slot(usize),
    /// The buffer of input `input`, whose last use this is (the slot it owns passes on).
    InPlace { input: usize, slot: usize },
    /// The buffer of the state loaded as input `input`, which the step's output is stored
    /// back to; `slot` when the buffer turns out to be shared.
    State {
        input: usize,
        state: String,
        slot: usize,
    },
    /// Made by the step itself: interpreter results, loads, constants.
    External,
}

pub(crate) struct Step {
    pub inst: Inst,
    pub kind: StepKind,
    /// Operands, and for interpreted steps the free values of their regions.
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
    pub out: Vec<Output>,
    /// Each output's shape.
    pub shapes: Vec<ShapeRecipe>,
    /// Slots of a kernel's scratch buffers, with their shapes.
    pub scratch: Vec<(usize, ShapeRecipe)>,
    /// Values whose last use this is, with the slot their buffer returns to.
    pub release: Vec<(Value, Option<usize>)>,
    pub fallible: bool,
    /// Communication steps whose results must arrive before this step runs (itself, for one
    /// whose results no step reads).
    pub awaits: Vec<usize>,
}

/// A product's operand as read from its step's input buffer (contiguous, row-major): seen with
/// `shape` (a reshape's, the same elements in the same order) or its own, then with its axes
/// permuted by `perm` (a transpose's: the product reads it through strides).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct OperandView {
    pub shape: Option<ShapeRecipe>,
    pub perm: Option<Vec<usize>>,
}

/// A shape in terms of the schedule's symbols.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ShapeRecipe(pub Vec<DimRecipe>);

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum DimRecipe {
    Fixed(usize),
    Symbol(usize),
}

impl ShapeRecipe {
    pub(crate) fn resolve_into(&self, sizes: &[i64], out: &mut Vec<usize>) {
        out.clear();
        out.extend(self.0.iter().map(|d| match *d {
            DimRecipe::Fixed(n) => n,
            DimRecipe::Symbol(s) => sizes[s] as usize,
        }));
    }
}

pub(crate) struct Schedule {
    pub steps: Vec<Step>,
    /// The dtype of each slot's buffer.
    pub slots: Vec<DType>,
    /// Symbolic sizes, bound from the arguments at each run.
    pub symbols: Vec<Symbol>,
    /// Steps from this index on cannot fail, so they may update state in place.
    pub infallible_from: usize,
    /// Kernels that fell back to the interpreter, and why (for `KILN_DEBUG`).
    pub fallbacks: Vec<String>,
    /// How many argmaxes max poolings keep for their gradients.
    pub kept_argmax: usize,
}

impl Schedule {
    pub(crate) fn new(func: &Function) -> Schedule {
        // The symbols of the values the function defines (a pruned slice keeps the whole
        // graph's arena, whose other values may name symbols no argument binds).
        let mut symbols: Vec<Symbol> = Vec::new();
        let insts = func.walk_insts();
        let defined = (func.args().iter())
            .chain(insts.iter().flat_map(|&i| &func.inst(i).results))
            .chain(
                (insts.iter().flat_map(|&i| &func.inst(i).regions))
                    .flat_map(|&r| &func.region(r).args),
            );
        for &v in defined {
            for s in func.value_type(v).shape.symbols() {
                if !symbols.contains(s) {
                    symbols.push(s.clone());
                }
            }
        }
        let recipe = |shape: &Shape| {
            ShapeRecipe(
                (shape.0.iter())
                    .map(|d| match d {
                        Dim::Fixed(n) => DimRecipe::Fixed(*n),
                        Dim::Sym(s) => DimRecipe::Symbol(
                            symbols
                                .iter()
                                .position(|x| x == s)
                                .expect("a listed symbol"),
                        ),
                    })
                    .collect(),
            )
        };
        let body = func.region(func.body());
        let mut fallbacks = Vec::new();
        let mut steps: Vec<Step> = body
            .insts
            .iter()
            .map(|&inst| {
                let data = func.inst(inst);
                let kind = step_kind(func, inst, &symbols, &mut fallbacks);
                let mut inputs = data.args.clone();
                if let StepKind::While { free, .. } | StepKind::Cond { free, .. } = &kind {
                    inputs.extend(free);
                }
                if matches!(kind, StepKind::Interpret) {
                    for &r in &data.regions {
                        for v in func.free_values(r) {
                            if !inputs.contains(&v) {
                                inputs.push(v);
                            }
                        }
                    }
                }
                let fallible = match &kind {
                    StepKind::Interpret
                    | StepKind::InterpreterKernel
                    | StepKind::Native
                    | StepKind::While { .. }
                    | StepKind::Cond { .. }
                    | StepKind::Communicate => true,
                    StepKind::Kernel { kernel, .. } => kernel.plan.can_fail(),
                    _ => false,
                };
                Step {
                    inst,
                    inputs,
                    outputs: data.results.clone(),
                    out: Vec::new(),
                    shapes: data
                        .results
                        .iter()
                        .map(|&r| recipe(&func.value_type(r).shape))
                        .collect(),
                    scratch: Vec::new(),
                    release: Vec::new(),
                    fallible,
                    awaits: Vec::new(),
                    kind,
                }
            })
            .collect();
        read_products_through_views(func, &mut steps, &recipe);
        write_products_through_transposes(func, &mut steps);
        read_products_through_reshapes(func, &mut steps, &recipe);
        place_waits(&mut steps);
        let infallible_from = steps.iter().rposition(|s| s.fallible).map_or(0, |i| i + 1);
        let kept_argmax = pair_pooling_argmax(&mut steps);
        let mut schedule = Schedule {
            steps: Vec::new(),
            slots: Vec::new(),
            symbols: symbols.clone(),
            infallible_from,
            fallbacks,
            kept_argmax,
        };
        schedule.plan_memory(func, &mut steps, &recipe);
        pair_epilogues(func, &mut steps);
        schedule.steps = steps;
        schedule
    }

    /// Liveness and slots, by a linear scan over the steps: each step's outputs get a slot (or
    /// an input's or a state's buffer, updated in place), its kernel's scratch a slot for the
    /// step, and what dies at it gives its slot back.
    fn plan_memory(
        &mut self,
        func: &Function,
        steps: &mut [Step],
        recipe: &dyn Fn(&Shape) -> ShapeRecipe,
    ) {
        let live = Liveness::new(func, steps);
        let mut slots = Slots::default();
        for (i, step) in steps.iter_mut().enumerate() {
            if let StepKind::Store { recycle, .. } = &mut step.kind {
                *recycle = slots.slot_of.get(&step.inputs[0]).copied();
            }
            self.plan_outputs(func, step, i, &live, &mut slots);
            plan_scratch(step, &mut slots, recipe);
            release_dying(func, step, i, &live, &mut slots);
        }
        self.slots = slots.dtypes;
    }

    /// Where each output of step `i` is written.
    fn plan_outputs(
        &self,
        func: &Function,
        step: &mut Step,
        i: usize,
        live: &Liveness,
        slots: &mut Slots,
    ) {
        let makes_buffers = step.kind.writes_planned_buffers();
        let mut taken_inputs: HashSet<usize> = HashSet::new();
        for k in 0..step.outputs.len() {
            let output = if makes_buffers {
                self.choose_output(func, step, i, k, live, slots, &mut taken_inputs)
            } else {
                Output::External
            };
            step.out.push(output);
        }
    }

    /// Output `k` of step `i`: over a state's buffer (a parameter or optimizer state updated
    /// where it lives, when nothing after this step can fail), over a dying input's buffer,
    /// or in a slot.
    #[allow(clippy::too_many_arguments)]
    fn choose_output(
        &self,
        func: &Function,
        step: &Step,
        i: usize,
        k: usize,
        live: &Liveness,
        slots: &mut Slots,
        taken_inputs: &mut HashSet<usize>,
    ) -> Output {
        let out = step.outputs[k];
        let ty = func.value_type(out);
        let updates_slice = matches!(func.inst(step.inst).op, Op::UpdateSlice { .. });
        // An input dying here whose buffer the output may take over.
        let possible = |j: usize| {
            let input = step.inputs[j];
            let free = k < 64
                && !taken_inputs.contains(&j)
                && live.dies_at(input, i)
                && !step.inputs[..j].contains(&input);
            free && match &step.kind {
                StepKind::Reshape => func.value_type(input).dtype == ty.dtype,
                StepKind::MatMul { onto: Some(_), .. } => j == 2,
                StepKind::Kernel { kernel, .. } => kernel.plan.can_update_in_place(j, k),
                StepKind::Native => j == 0 && updates_slice,
                _ => false,
            }
        };
        let over_state = (i >= self.infallible_from
            && matches!(
                step.kind,
                StepKind::Kernel { .. } | StepKind::MatMul { onto: Some(_), .. }
            ))
        .then(|| {
            (0..step.inputs.len()).find_map(|j| {
                let state = live.loaded_from.get(&step.inputs[j])?;
                let only =
                    live.loads[state] == 1 && live.stored.get(state).is_some_and(|s| *s == [out]);
                (only && possible(j)).then(|| (j, state.clone()))
            })
        })
        .flatten();
        // A value stored to state leaves the arena with its buffer, so it does not take a
        // slot's buffer over (the state's old buffer comes back instead).
        let is_stored = live.stored.values().any(|values| values.contains(&out));
        let over_input = (!is_stored)
            .then(|| {
                (0..step.inputs.len())
                    .find(|&j| possible(j) && slots.slot_of.contains_key(&step.inputs[j]))
            })
            .flatten();
        // `update_slice` may also take over an argument's buffer (a loop's carried stack),
        // which has no slot: a slot of its own serves when the buffer turns out to be shared.
        let over_argument = !is_stored
            && over_input.is_none()
            && updates_slice
            && possible(0)
            && func.args().contains(&step.inputs[0]);
        if let Some((j, state)) = over_state {
            taken_inputs.insert(j);
            Output::State {
                input: j,
                state,
                slot: slots.take(ty.dtype, &ty.shape, Some(out)),
            }
        } else if over_argument {
            taken_inputs.insert(0);
            Output::InPlace {
                input: 0,
                slot: slots.take(ty.dtype, &ty.shape, Some(out)),
            }
        } else if let Some(j) = over_input {
            let s = slots.slot_of[&step.inputs[j]];
            slots.owner[s] = Some(out);
            slots.slot_of.insert(out, s);
            taken_inputs.insert(j);
            Output::InPlace { input: j, slot: s }
        } else {
            Output::Slot(slots.take(ty.dtype, &ty.shape, Some(out)))
        }
    }
}

/// When each value is last used, and how each state is loaded and stored.
struct Liveness {
    results: HashSet<Value>,
    last_use: HashMap<Value, usize>,
    /// Which state each value was loaded from.
    loaded_from: HashMap<Value, String>,
    /// How many times each state is loaded.
    loads: HashMap<String, usize>,
    /// The values stored to each state.
    stored: HashMap<String, Vec<Value>>,
}

impl Liveness {
    fn new(func: &Function, steps: &[Step]) -> Liveness {
        let mut live = Liveness {
            results: func.results().iter().copied().collect(),
            last_use: HashMap::new(),
            loaded_from: HashMap::new(),
            loads: HashMap::new(),
            stored: HashMap::new(),
        };
        for (i, step) in steps.iter().enumerate() {
            for &v in &step.inputs {
                live.last_use.insert(v, i);
            }
            match &step.kind {
                StepKind::Load { state } => {
                    live.loaded_from.insert(step.outputs[0], state.clone());
                    *live.loads.entry(state.clone()).or_default() += 1;
                }
                StepKind::Store { state, .. } => {
                    live.stored
                        .entry(state.clone())
                        .or_default()
                        .push(step.inputs[0]);
                }
                _ => {}
            }
        }
        live
    }

    /// Whether `v` is last used by step `i` (results live on).
    fn dies_at(&self, v: Value, i: usize) -> bool {
        !self.results.contains(&v) && self.last_use.get(&v) == Some(&i)
    }
}

/// A kernel's scratch: slots taken for the step only.
fn plan_scratch(step: &mut Step, slots: &mut Slots, recipe: &dyn Fn(&Shape) -> ShapeRecipe) {
    let StepKind::Kernel { kernel, .. } = &step.kind else {
        return;
    };
    let types: Vec<kiln_ir::Type> = (0..kernel.plan.scratch.len())
        .map(|i| kernel.plan.scratch_type(i))
        .collect();
    let taken: Vec<usize> = (types.iter())
        .map(|ty| {
            let s = slots.take(ty.dtype, &ty.shape, None);
            step.scratch.push((s, recipe(&ty.shape)));
            s
        })
        .collect();
    for (ty, s) in types.iter().zip(taken) {
        slots.give_back(s, ty.dtype, &ty.shape);
    }
}

/// Releases what dies at step `i` (and results nobody uses), giving their slots back.
fn release_dying(func: &Function, step: &mut Step, i: usize, live: &Liveness, slots: &mut Slots) {
    let mut dying: Vec<Value> = (step.inputs.iter().copied())
        .filter(|&v| live.dies_at(v, i))
        .collect();
    dying.extend(
        step.outputs
            .iter()
            .copied()
            .filter(|v| !live.results.contains(v) && !live.last_use.contains_key(v)),
    );
    dying.sort();
    dying.dedup();
    for v in dying {
        let slot = slots
            .slot_of
            .get(&v)
            .copied()
            .filter(|&s| slots.owner[s] == Some(v));
        if let Some(s) = slot {
            slots.owner[s] = None;
            slots.give_back(s, func.value_type(v).dtype, &func.value_type(v).shape);
        }
        step.release.push((v, slot));
    }
}

/// Slots while planning: each one's dtype and owner, and the free ones by type.
#[derive(Default)]
struct Slots {
    dtypes: Vec<DType>,
    owner: Vec<Option<Value>>,
    slot_of: HashMap<Value, usize>,
    free: HashMap<(DType, Shape), Vec<usize>>,
}

impl Slots {
    /// A free slot for a buffer of this type, or a new one.
    fn take(&mut self, dtype: DType, shape: &Shape, owner: Option<Value>) -> usize {
        let reused = self
            .free
            .get_mut(&(dtype, shape.clone()))
            .and_then(Vec::pop);
        let s = reused.unwrap_or_else(|| {
            self.dtypes.push(dtype);
            self.owner.push(None);
            self.dtypes.len() - 1
        });
        self.owner[s] = owner;
        if let Some(v) = owner {
            self.slot_of.insert(v, s);
        }
        s
    }

    fn give_back(&mut self, slot: usize, dtype: DType, shape: &Shape) {
        self.free
            .entry((dtype, shape.clone()))
            .or_default()
            .push(slot);
    }
}

/// Pairs each max pooling gradient with the first earlier max pooling of the same input and
/// geometry, which records the argmax the gradient would search for again; returns how many
/// argmaxes are kept. (Gradients of one pooling share its argmax.)
fn pair_pooling_argmax(steps: &mut [Step]) -> usize {
    let mut kept = 0;
    for g in 0..steps.len() {
        let StepKind::Pool2d {
            kind: PoolKind::MaxGrad,
            attrs,
            argmax: None,
        } = steps[g].kind
        else {
            continue;
        };
        if !super::pool::argmax_fits(&attrs) {
            continue;
        }
        let x = steps[g].inputs[0];
        let records = |f: &Step| match f.kind {
            StepKind::Pool2d {
                kind: PoolKind::Max,
                attrs: a,
                ..
            } => a == attrs && f.inputs[0] == x,
            _ => false,
        };
        let Some(f) = steps[..g].iter().position(records) else {
            continue;
        };
        let StepKind::Pool2d { argmax, .. } = &mut steps[f].kind else {
            unreachable!("a pooling step")
        };
        let index = *argmax.get_or_insert_with(|| {
            kept += 1;
            kept - 1
        });
        if let StepKind::Pool2d { argmax, .. } = &mut steps[g].kind {
            *argmax = Some(index);
        }
    }
    kept
}

/// Pairs each convolution (or input gradient) with the kernel right after it that reads its
/// output — a bias and an activation, a batch norm's scale and shift, put there by the
/// `order_epilogues` pass — so that the kernel runs on
/// each run of samples as the convolution writes it, while they are in cache, rather than in
/// a pass of its own over the whole output (later readers, such as a backward kernel that
/// recomputes the activation, read the whole output after). The kernel must be one rows
/// stage (its rows independent) that cannot fail and waits for no communication (it runs a
/// step early), share no input with the convolution, and write no slot that the
/// convolution's step frees (its buffers are taken before that step ends). Whether its rows
/// split by samples depends on the sizes, so the executor checks that at run time.
fn pair_epilogues(func: &Function, steps: &mut [Step]) {
    let results = &func.region(func.body()).results;
    for i in 1..steps.len() {
        let (before, after) = steps.split_at_mut(i);
        let (conv, kernel) = (&mut before[i - 1], &after[0]);
        let StepKind::Conv2d { kind, epilogue, .. } = &mut conv.kind else {
            continue;
        };
        let StepKind::Kernel { kernel: k, .. } = &kernel.kind else {
            continue;
        };
        let y = conv.outputs[0];
        let freed: HashSet<usize> = conv.release.iter().filter_map(|r| r.1).collect();
        let taken = (kernel.out.iter())
            .map(|o| match o {
                Output::Slot(s)
                | Output::InPlace { slot: s, .. }
                | Output::State { slot: s, .. } => Some(*s),
                Output::External => None,
            })
            .chain(kernel.scratch.iter().map(|s| Some(s.0)));
        *epilogue = !matches!(kind, ConvKind::FilterGrad { .. })
            && matches!(conv.out[0], Output::Slot(_))
            && kernel.inputs.contains(&y)
            && !results.contains(&y)
            && (k.plan.stages.len() == 1 && k.split(0) == jit::Split::Rows)
            && !kernel.fallible
            && kernel.awaits.is_empty()
            && k.plan.buffer_count() <= MAX_EPILOGUE_BUFFERS
            && !kernel.inputs.iter().any(|v| conv.inputs.contains(v))
            && taken
                .into_iter()
                .all(|s| s.is_none_or(|s| !freed.contains(&s)));
    }
}

/// The most buffers an epilogue kernel may take (its pointers are an array on the stack).
pub(crate) const MAX_EPILOGUE_BUFFERS: usize = 16;

/// How the executor runs instruction `inst`.
fn step_kind(
    func: &Function,
    inst: Inst,
    symbols: &[Symbol],
    fallbacks: &mut Vec<String>,
) -> StepKind {
    let data = func.inst(inst);
    let kernel_of = |f: Function, fallbacks: &mut Vec<String>| match jit::kernel(&f) {
        Ok(kernel) => {
            let symbols = (kernel.plan.symbols.iter())
                .map(|s| {
                    symbols
                        .iter()
                        .position(|x| x == s)
                        .expect("kernel symbols are the function's")
                })
                .collect();
            StepKind::Kernel { kernel, symbols }
        }
        Err(e) => {
            fallbacks.push(format!("{}: {e}", data.op.name()));
            StepKind::Interpret
        }
    };
    match &data.op {
        Op::Fused => {
            let kernel = region_function(func, data.regions[0], &[], "kernel")
                .expect("a verified kernel region rebuilds");
            kernel_of(kernel, fallbacks)
        }
        Op::Const { value, ty } if value.len() != 1 || ty.shape.is_static() => {
            match ty.shape.as_fixed() {
                Some(shape) if value.len() == 1 || Some(value.len()) == ty.shape.num_elements() => {
                    StepKind::Const {
                        value: value.clone(),
                        shape,
                        made: OnceLock::new(),
                    }
                }
                _ => StepKind::Interpret,
            }
        }
        Op::Reshape { .. } => StepKind::Reshape,
        op if data.results.len() == 1
            && jit::plan::supported(func, op, &data.args, data.results[0]) =>
        {
            kernel_of(single_op_function(func, inst), fallbacks)
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } if func.value_type(data.results[0]).dtype.is_float() => StepKind::MatMul {
            transpose_a: *transpose_a,
            transpose_b: *transpose_b,
            views: Default::default(),
            written_through: None,
            onto: None,
        },
        Op::MatMulAcc {
            transpose_a,
            transpose_b,
            scale,
        } if func.value_type(data.results[0]).dtype.is_float() => StepKind::MatMul {
            transpose_a: *transpose_a,
            transpose_b: *transpose_b,
            views: Default::default(),
            written_through: None,
            onto: Some(scale.0),
        },
        // Channels last, the executor's loops take one group and max pooling of windows of
        // fewer than 255 taps; the interpreter runs the rest.
        Op::Conv2d { attrs, .. } if attrs.channels_last && attrs.groups > 1 => {
            StepKind::InterpreterKernel
        }
        Op::Pool2d {
            kind: PoolKind::Avg | PoolKind::AvgGrad { .. },
            attrs,
        } if attrs.channels_last => StepKind::InterpreterKernel,
        // Channels-last max pooling keeps a window's tap in a byte.
        Op::Pool2d { attrs, .. } if attrs.channels_last && !super::pool::argmax_fits(attrs) => {
            StepKind::InterpreterKernel
        }
        Op::Conv2d { kind, attrs } if func.value_type(data.results[0]).dtype.is_float() => {
            StepKind::Conv2d {
                kind: *kind,
                attrs: *attrs,
                epilogue: false,
            }
        }
        Op::Pool2d { kind, attrs } if func.value_type(data.results[0]).dtype.is_float() => {
            StepKind::Pool2d {
                kind: *kind,
                attrs: *attrs,
                argmax: None,
            }
        }
        Op::OneHot { .. }
        | Op::Gather { .. }
        | Op::UpdateSlice { .. }
        | Op::ScatterAdd { .. }
        | Op::Transpose { .. }
        | Op::Concat { .. }
        | Op::Random { .. } => StepKind::Native,
        Op::Load { state, .. } => StepKind::Load {
            state: state.clone(),
        },
        Op::Store { state } => StepKind::Store {
            state: state.clone(),
            recycle: None,
        },
        Op::Cond | Op::While => super::control::compiled(func, inst).unwrap_or_else(|why| {
            fallbacks.push(format!("{}: {why}", data.op.name()));
            StepKind::Interpret
        }),
        Op::Call { .. } => StepKind::Interpret,
        kiln_ir::communication_op!() => StepKind::Communicate,
        _ => StepKind::InterpreterKernel,
    }
}

/// Lets each product read an operand that is a transpose, a reshape, or a reshape then a
/// transpose from the buffer they start from (a buffer is row-major and contiguous, so a reshape
/// changes only the shape gemm is given and a transpose only its strides), and drops the
/// reshapes and transposes no step reads any more. (Deferred weight gradients multiply
/// `[T, B, K]` stacks seen as `[T·B, K]`: the copies took 0.3–0.4 ms each in W10's step.
/// Attention's heads are transposes of `[N, T, H, d]`: 16 copies, 6.9 ms of W11's step.)
fn read_products_through_views(
    func: &Function,
    steps: &mut Vec<Step>,
    recipe: &dyn Fn(&Shape) -> ShapeRecipe,
) {
    let bypassable = bypassable_views(func, steps);
    let made_by = |v: Value| match func.value(v).def {
        ValueDef::Result(def, _) if bypassable.contains(&v) => Some(func.inst(def)),
        _ => None,
    };
    let mut bypassed = HashSet::new();
    for step in steps.iter_mut() {
        let StepKind::MatMul { views, .. } = &mut step.kind else {
            continue;
        };
        for (j, view) in views.iter_mut().enumerate() {
            let mut operand = step.inputs[j];
            if let Some(data) = made_by(operand)
                && let Op::Transpose { perm } = &data.op
            {
                view.perm = Some(perm.clone());
                bypassed.insert(operand);
                operand = data.args[0];
            }
            if let Some(data) = made_by(operand)
                && let Op::Reshape { .. } = data.op
            {
                view.shape = Some(recipe(&func.value_type(operand).shape));
                bypassed.insert(operand);
                operand = data.args[0];
            }
            // A slice of the leading rows is the start of its source's buffer.
            if let Some(data) = made_by(operand)
                && let Op::Slice { .. } = data.op
            {
                (view.shape).get_or_insert_with(|| recipe(&func.value_type(operand).shape));
                bypassed.insert(operand);
                operand = data.args[0];
            }
            step.inputs[j] = operand;
        }
    }
    if bypassed.is_empty() {
        return;
    }
    // A transpose dropped can leave the reshape it read unread: until nothing changes.
    loop {
        let read: HashSet<Value> = (steps.iter().flat_map(|s| s.inputs.iter().copied()))
            .chain(func.region(func.body()).results.iter().copied())
            .collect();
        let before = steps.len();
        steps.retain(|s| {
            !s.outputs
                .iter()
                .any(|v| bypassed.contains(v) && !read.contains(v))
        });
        if steps.len() == before {
            return;
        }
    }
}

/// Whether a slice takes the first rows of its source's leading axis and every other axis
/// whole: the first elements of the source's buffer, in order.
fn is_prefix(axes: &[AxisSlice]) -> bool {
    let leading = matches!(
        axes.first(),
        Some(
            AxisSlice::Full
                | AxisSlice::Range {
                    start: 0,
                    step: 1,
                    ..
                }
        )
    );
    leading && axes[1..].iter().all(|a| matches!(a, AxisSlice::Full))
}

/// The reshapes and transposes a product may read through: those only products read, or
/// views of them that only products read. One that runs anyway for another reader is read as
/// it is (bypassed, a reshape whose source is still to be read would copy it).
fn bypassable_views(func: &Function, steps: &[Step]) -> HashSet<Value> {
    let is_view = |v: Value| match func.value(v).def {
        ValueDef::Result(def, _) => match &func.inst(def).op {
            Op::Reshape { .. } | Op::Transpose { .. } => true,
            Op::Slice { axes } => is_prefix(axes),
            _ => false,
        },
        _ => false,
    };
    let mut readers: HashMap<Value, Vec<Option<usize>>> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        for &v in &step.inputs {
            readers.entry(v).or_default().push(Some(i));
        }
    }
    for &v in &func.region(func.body()).results {
        readers.entry(v).or_default().push(None);
    }
    // Whether only products read each step's outputs, through views: readers come later, so
    // one pass from the last step back decides each from its readers' answers (no recursion
    // along a chain of views).
    let mut only_products: HashMap<Value, bool> = HashMap::new();
    for step in steps.iter().rev() {
        for &v in &step.outputs {
            let only = (readers.get(&v).into_iter().flatten()).all(|r| match *r {
                Some(i) => match steps[i].kind {
                    StepKind::MatMul { .. } => true,
                    _ => (steps[i].outputs.iter())
                        .all(|o| is_view(*o) && only_products.get(o) == Some(&true)),
                },
                None => false,
            });
            only_products.insert(v, only);
        }
    }
    (steps.iter().flat_map(|s| s.outputs.iter().copied()))
        .filter(|&v| is_view(v) && only_products[&v])
        .collect()
}

/// Lets each product whose only reader is a transpose keeping the last axis last write the
/// transposed result itself (each output matrix through strides), and drops the transpose:
/// attention joining its heads, `[N, H, T, d] → [N, T, H, d]`.
fn write_products_through_transposes(func: &Function, steps: &mut Vec<Step>) {
    let position: HashMap<Value, usize> = (steps.iter().enumerate())
        .flat_map(|(i, s)| s.outputs.iter().map(move |&v| (v, i)))
        .collect();
    let mut readers: HashMap<Value, usize> = HashMap::new();
    for &v in steps
        .iter()
        .flat_map(|s| &s.inputs)
        .chain(&func.region(func.body()).results)
    {
        *readers.entry(v).or_default() += 1;
    }
    let mut dropped = Vec::new();
    for t in 0..steps.len() {
        let Some(&y) = steps[t].outputs.first() else {
            continue;
        };
        let ValueDef::Result(def, _) = func.value(y).def else {
            continue;
        };
        let Op::Transpose { perm } = &func.inst(def).op else {
            continue;
        };
        let c = func.inst(def).args[0];
        let Some(&p) = position.get(&c) else {
            continue;
        };
        let product = matches!(
            steps[p].kind,
            StepKind::MatMul {
                onto: None,
                written_through: None,
                ..
            }
        );
        if !product || readers.get(&c) != Some(&1) || perm.last() != Some(&(perm.len() - 1)) {
            continue;
        }
        if let StepKind::MatMul {
            written_through, ..
        } = &mut steps[p].kind
        {
            let mut inverse = vec![0; perm.len()];
            for (i, &axis) in perm.iter().enumerate() {
                inverse[axis] = i;
            }
            *written_through = Some(inverse);
        }
        steps[p].outputs = steps[t].outputs.clone();
        steps[p].shapes = steps[t].shapes.clone();
        dropped.push(t);
    }
    for t in dropped.into_iter().rev() {
        steps.remove(t);
    }
}

/// Lets the products that read a value which a reshape also reads read the reshape's result
/// instead (the same elements in the same order), so that the reshape, the value's only
/// reader left, moves its buffer rather than copying it. (Attention's joined heads
/// `[N, T, H, d]` are reshaped to `[N, T, H·d]` for the next layer and read as `[N·T, H·d]`
/// by the weight gradient's product: six copies, ~2.8 ms of W11's step.)
fn read_products_through_reshapes(
    func: &Function,
    steps: &mut [Step],
    recipe: &dyn Fn(&Shape) -> ShapeRecipe,
) {
    let results: HashSet<Value> = func.region(func.body()).results.iter().copied().collect();
    for r in 0..steps.len() {
        if !matches!(steps[r].kind, StepKind::Reshape) {
            continue;
        }
        let (v, reshaped) = (steps[r].inputs[0], steps[r].outputs[0]);
        // Only a buffer the plan gives a slot can move; any other the reshape copies anyway,
        // and the products had better read it as it is (a plain matrix takes gemm's short path).
        let in_a_slot = (steps[..r].iter().rev().find(|s| s.outputs.contains(&v)))
            .is_some_and(|s| s.kind.writes_planned_buffers());
        // Every other reader of `v` must be a later product reading it as an operand.
        let readers: Vec<usize> = (0..steps.len())
            .filter(|&i| i != r && steps[i].inputs.contains(&v))
            .collect();
        let redirectable = |i: usize| {
            i > r
                && matches!(steps[i].kind, StepKind::MatMul { .. })
                && steps[i].inputs[2..].iter().all(|&x| x != v)
        };
        if !in_a_slot
            || readers.is_empty()
            || results.contains(&v)
            || !readers.iter().all(|&i| redirectable(i))
        {
            continue;
        }
        for i in readers {
            let StepKind::MatMul { views, .. } = &mut steps[i].kind else {
                unreachable!("a product");
            };
            for (input, view) in steps[i].inputs.iter_mut().zip(views.iter_mut()) {
                if *input == v {
                    *input = reshaped;
                    (view.shape).get_or_insert_with(|| recipe(&func.value_type(v).shape));
                }
            }
        }
    }
}

/// Where each communication step's results are waited for: at the first step that reads
/// one, which becomes fallible (a wait can fail), or at once when no step does.
fn place_waits(steps: &mut [Step]) {
    for i in 0..steps.len() {
        if !matches!(steps[i].kind, StepKind::Communicate) {
            continue;
        }
        let outputs = steps[i].outputs.clone();
        let first_use =
            (i + 1..steps.len()).find(|&j| steps[j].inputs.iter().any(|v| outputs.contains(v)));
        let at = first_use.unwrap_or(i);
        steps[at].awaits.push(i);
        steps[at].fallible = true;
    }
}

/// `region` of `func` as a function of its own named `name`: its arguments, then the outer
/// values `free` it reads, become the function's arguments (`x0…`, `free0…`), and what it
/// yields the results.
pub(crate) fn region_function(
    func: &Function,
    region: Region,
    free: &[Value],
    name: &str,
) -> BuildResult<Function> {
    let data = func.region(region);
    let mut b = FunctionBuilder::new(name);
    let mut remap = HashMap::new();
    for (i, &a) in data.args.iter().enumerate() {
        remap.insert(a, b.arg(&format!("x{i}"), func.value_type(a).clone()));
    }
    for (i, &v) in free.iter().enumerate() {
        remap.insert(v, b.arg(&format!("free{i}"), func.value_type(v).clone()));
    }
    for &i in &data.insts {
        b.clone_inst(func, i, &mut remap)?;
    }
    let results: Vec<Value> = (data.results.iter())
        .map(|v| remap.get(v).copied().unwrap_or(*v))
        .collect();
    b.finish(&results)
}

/// One elementwise (or broadcast, reduction, …) instruction as a kernel function.
fn single_op_function(func: &Function, inst: Inst) -> Function {
    let d = func.inst(inst);
    let mut b = FunctionBuilder::new("kernel");
    let args: Vec<Value> = (d.args.iter().enumerate())
        .map(|(i, &a)| b.arg(&format!("x{i}"), func.value_type(a).clone()))
        .collect();
    let results = b
        .insert(d.op.clone(), &args)
        .expect("a verified instruction rebuilds");
    b.finish(&results).expect("a verified instruction rebuilds")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_of(text: &str) -> Vec<String> {
        let module = kiln_ir::parse_and_verify(text).unwrap();
        let schedule = Schedule::new(&module.functions[0]);
        (schedule.steps.iter())
            .map(|s| match &s.kind {
                StepKind::MatMul { onto, .. } => {
                    format!("matmul onto {:?}", onto.map(|s| s as f32))
                }
                StepKind::Kernel { .. } => "kernel".to_owned(),
                StepKind::Load { .. } => "load".to_owned(),
                StepKind::Store { .. } => "store".to_owned(),
                _ => "other".to_owned(),
            })
            .collect()
    }

    /// A product accumulated onto `w` (the `fold_updates` pass's `matmul_acc`) is one gemm
    /// step writing onto `w`'s buffer.
    #[test]
    fn products_accumulated_onto_a_value_are_one_step() {
        let sgd = "module {
  state @w : f32[4,3] = constant(value=0.5)
  func @f(%x: f32[8,4], %g: f32[8,3]) -> f32[4,3] {
    %w = load @w : f32[4,3]
    %u = matmul_acc %x, %g, %w {transpose_a=true, scale=-0.1} : f32[4,3]
    store @w, %u
    return %u
  }
}";
        assert_eq!(steps_of(sgd), ["load", "matmul onto Some(-0.1)", "store"]);
    }

    /// Attention's heads joined (a product written through a transpose), reshaped for the
    /// next layer and for a weight gradient's product: the product reads the first reshape's
    /// result, and the reshape moves the heads' buffer. With a kernel reading the heads too,
    /// the reshape copies them.
    #[test]
    fn a_reshape_shared_with_products_moves_its_source() {
        const JOINED: &str = "module {
  func @f(%s: f32[2,3,5,5], %v: f32[2,3,5,4], %g: f32[10,7]) -> (f32[2,5,12], f32[12,7]) {
    %c = matmul %s, %v : f32[2,3,5,4]
    %back = transpose %c {perm=[0, 2, 1, 3]} : f32[2,5,3,4]
    %joined = reshape %back : f32[2,5,12]
    %rows = reshape %back : f32[10,12]
    %w = matmul %rows, %g {transpose_a=true} : f32[12,7]
    return %joined, %w
  }
}";
        let reshape_output = |text: &str| {
            let module = kiln_ir::parse_and_verify(text).unwrap();
            let schedule = Schedule::new(&module.functions[0]);
            let steps = &schedule.steps;
            let r = steps
                .iter()
                .position(|s| matches!(s.kind, StepKind::Reshape));
            let r = r.expect("one reshape runs");
            let product_reads = (steps.iter())
                .filter(|s| matches!(s.kind, StepKind::MatMul { .. }))
                .any(|s| s.inputs.contains(&steps[r].outputs[0]));
            (steps[r].out[0].clone(), product_reads)
        };
        let (moved, read) = reshape_output(JOINED);
        assert!(
            matches!(moved, Output::InPlace { input: 0, .. }),
            "{moved:?}"
        );
        assert!(read, "the weight gradient reads the reshape's result");
        let also_added = JOINED
            .replace("f32[12,7]) {", "f32[12,7], f32[2,5,3,4]) {")
            .replace(
                "    return %joined, %w",
                "    %e = exp %back : f32[2,5,3,4]\n    return %joined, %w, %e",
            );
        let (copied, read) = reshape_output(&also_added);
        assert!(matches!(copied, Output::Slot(_)), "{copied:?}");
        assert!(!read);
    }
}
