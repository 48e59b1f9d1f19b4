//! Memory planning: when each value dies, and the buffer slots values share, by a linear
//! scan over the steps.

use super::{Output, Schedule, ShapeRecipe, Step, StepKind};
use kiln_ir::{DType, Function, Op, Shape, Value};
use std::collections::{HashMap, HashSet};

impl Schedule {
    /// Liveness and slots, by a linear scan over the steps: each step's outputs get a slot (or
    /// an input's or a state's buffer, updated in place), its kernel's scratch a slot for the
    /// step, and what dies at it gives its slot back.
    pub(super) fn plan_memory(
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
        // Over state only where no later step can fail (a failed run must leave state as it
        // was) — but `update_slice`, which keeps the slice it overwrites to put it back.
        let over_state = ((i >= self.infallible_from
            && matches!(
                step.kind,
                StepKind::Kernel { .. } | StepKind::MatMul { onto: Some(_), .. }
            ))
            || updates_slice)
            .then(|| {
                (0..step.inputs.len()).find_map(|j| {
                    let state = live.loaded_from.get(&step.inputs[j])?;
                    let only = live.loads[state] == 1
                        && live.stored.get(state).is_some_and(|s| *s == [out]);
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
