//! Products that read their operands through views (a transpose, a reshape, a slice of the
//! leading rows) and write through a transpose, instead of steps that copy.

use super::{ShapeRecipe, Step, StepKind};
use kiln_ir::{AxisSlice, Function, Op, Shape, Value, ValueDef};
use std::collections::{HashMap, HashSet};

/// Lets each product read an operand that is a transpose, a reshape, or a reshape then a
/// transpose from the buffer they start from (a buffer is row-major and contiguous, so a reshape
/// changes only the shape gemm is given and a transpose only its strides), and drops the
/// reshapes and transposes no step reads any more. (Deferred weight gradients multiply
/// `[T, B, K]` stacks seen as `[T·B, K]`; attention's heads are transposes of `[N, T, H, d]`:
/// what the copies cost W10 and W11 is in BENCHMARKS.md, "Reshapes before products cost
/// copies" and "W11: a transformer's training step".)
pub(super) fn read_products_through_views(
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
pub(super) fn write_products_through_transposes(func: &Function, steps: &mut Vec<Step>) {
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
/// by the weight gradient's product; BENCHMARKS.md, "W11: joined heads moved, not copied".)
pub(super) fn read_products_through_reshapes(
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
