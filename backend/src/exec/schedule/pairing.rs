//! Steps paired with the steps that share their work — a max pooling gradient with the
//! pooling that records its argmax, a convolution with the kernel it runs as its epilogue —
//! and where each communication is waited for.

use super::{Output, Step, StepKind};
use crate::jit;
use kiln_ir::{ConvKind, Function, PoolKind};
use std::collections::HashSet;

/// Pairs each max pooling gradient with the first earlier max pooling of the same input and
/// geometry, which records the argmax the gradient would search for again; returns how many
/// argmaxes are kept. (Gradients of one pooling share its argmax.)
pub(super) fn pair_pooling_argmax(steps: &mut [Step]) -> usize {
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
        if !crate::exec::pool::argmax_fits(&attrs) {
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
pub(super) fn pair_epilogues(func: &Function, steps: &mut [Step]) {
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

/// Where each communication step's results are waited for: at the first step that reads
/// one, which becomes fallible (a wait can fail), or at once when no step does.
pub(super) fn place_waits(steps: &mut [Step]) {
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
