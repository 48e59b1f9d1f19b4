//! What an executable is made of, for tools that show it (`kiln report`): its compiled kernels
//! and their plans, its memory plan, and a profile of its steps.

use super::Executable;
use super::schedule::{Output, StepKind};
use crate::jit::Split;
use kiln_ir::PoolKind;
use kiln_ir::print::{InstLines, ValueNames};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// One compiled kernel of a schedule.
#[derive(Clone, Debug)]
pub struct KernelInfo {
    /// The instruction it runs (the `fused` line, regions elided).
    pub inst: String,
    /// For each stage (a pass over the data): its domain and the values it writes; whether it
    /// accumulates (on one thread, or split by columns) or splits rows across threads; and
    /// what its tile programs compute, if it has them.
    pub stages: Vec<String>,
    /// Machine-code bytes of all stages.
    pub code_size: usize,
}

/// Where one step's output lives.
#[derive(Clone, Debug)]
pub struct Placement {
    /// The instruction.
    pub inst: String,
    /// Each output: its name and `slot 3`, `in place of %x (slot 3)`, `state @w` or
    /// `its own buffer`.
    pub outputs: Vec<(String, String)>,
    /// What the step keeps for a later step or reads from an earlier one (a max pooling's
    /// argmax), or the kernel it runs as its epilogue (a convolution's).
    pub kept: Option<String>,
}

/// The time a step took over the profiled runs.
#[derive(Clone, Debug)]
pub struct StepTime {
    /// The instruction.
    pub inst: String,
    /// Its time over all runs.
    pub total: Duration,
    /// How many times it ran.
    pub calls: u64,
}

/// What a step of kind `kind` keeps for a later step, reads from an earlier one, or runs as its
/// epilogue.
fn kept(kind: &StepKind) -> Option<String> {
    Some(match kind {
        StepKind::Pool2d {
            kind: PoolKind::Max,
            argmax: Some(i),
            ..
        } => format!("records its argmax (#{i}) for its gradient"),
        StepKind::Pool2d {
            argmax: Some(i), ..
        } => format!("reads the argmax #{i} max pooling recorded"),
        StepKind::Conv2d { epilogue: true, .. } => {
            "runs the next kernel on each run of samples it writes (its epilogue), when that \
             kernel's rows split by samples"
                .to_owned()
        }
        _ => return None,
    })
}

impl Executable {
    /// Records each step's time from now on ([`Executable::profile`]), without printing it
    /// when dropped as `KILN_PROFILE=1` does.
    pub fn with_profile(mut self) -> Executable {
        if self.profile.is_none() {
            self.profile = Some(Mutex::new(vec![
                Default::default();
                self.schedule.steps.len()
            ]));
            self.print_profile = 0;
        }
        self
    }

    /// The compiled kernels, in schedule order (those of control-flow regions after).
    pub fn kernels(&self) -> Vec<KernelInfo> {
        let mut out: Vec<KernelInfo> = Vec::new();
        let lines = InstLines::new(&self.func);
        for step in &self.schedule.steps {
            let StepKind::Kernel { kernel, .. } = &step.kind else {
                continue;
            };
            let names = ValueNames::new(&kernel.plan.func);
            let stages = (kernel.plan.stages.iter().zip(&kernel.stages).enumerate())
                .map(|(index, (stage, code))| {
                    let values: Vec<String> = stage.values.iter().map(|&v| names.get(v)).collect();
                    let how = match kernel.split(index) {
                        Split::Rows => "rows split across threads",
                        Split::Columns => "accumulates, columns split across threads",
                        Split::Whole => "accumulates on one thread",
                    };
                    let code = match code.programs {
                        Some(_) => format!(
                            "; Cranelift code in f32x4 lanes, and on rows of ≥ {} elements \
                             tile programs at {} width ({})",
                            crate::jit::PROGRAMS_MIN_ROW,
                            crate::jit::tile_program::isa().name(),
                            code.program_ops.join(", ")
                        ),
                        None => "; Cranelift code in f32x4 lanes".to_owned(),
                    };
                    format!(
                        "over {}: writes {}; {how}{code}",
                        stage.domain,
                        values.join(", ")
                    )
                })
                .collect();
            out.push(KernelInfo {
                inst: lines.line(step.inst),
                stages,
                code_size: kernel.code_size,
            });
        }
        out.extend(self.regions().flat_map(Executable::kernels));
        out
    }

    /// Where each step's outputs live: the memory plan.
    pub fn memory_plan(&self) -> Vec<Placement> {
        let names = ValueNames::new(&self.func);
        let lines = InstLines::new(&self.func);
        (self.schedule.steps.iter())
            .map(|step| Placement {
                inst: lines.line(step.inst),
                outputs: (step.outputs.iter().zip(&step.out))
                    .map(|(&v, out)| {
                        let place = match out {
                            Output::Slot(s) => format!("slot {s}"),
                            Output::InPlace { input, slot } => {
                                format!(
                                    "in place of {} (slot {slot})",
                                    names.get(step.inputs[*input])
                                )
                            }
                            Output::State { state, .. } => format!("state @{state}, in place"),
                            Output::External => "its own buffer".to_owned(),
                        };
                        (names.get(v), place)
                    })
                    .collect(),
                kept: kept(&step.kind),
            })
            .collect()
    }

    /// Forgets the times recorded so far (a warm-up's).
    pub fn clear_profile(&self) {
        if let Some(profile) = &self.profile {
            let mut profile = profile.lock().unwrap_or_else(PoisonError::into_inner);
            profile.fill(Default::default());
        }
    }

    /// Each step's time over the runs since [`Executable::with_profile`] (or
    /// [`Executable::clear_profile`]), slowest first.
    pub fn profile(&self) -> Vec<StepTime> {
        let Some(profile) = &self.profile else {
            return Vec::new();
        };
        let profile = profile.lock().unwrap_or_else(PoisonError::into_inner);
        let lines = InstLines::new(&self.func);
        let mut rows: Vec<StepTime> = (profile.iter().zip(&self.schedule.steps))
            .map(|(&(total, calls), step)| StepTime {
                inst: lines.line(step.inst),
                total,
                calls,
            })
            .collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.total));
        rows
    }
}
