//! Learning-rate schedules computed inside the training program, from the optimizer's step
//! counter: the rate is IR like the update it scales, so it prints, compiles, and resumes from
//! a checkpoint to the same bits (the counter is optimizer state) — no host-side scheduler to
//! keep in step. [`Schedule::at`] is the same formula in f64 on the host, the oracle of the
//! program's values and what a progress display shows.

use crate::error::{RuntimeError, RuntimeResult};
use crate::program::Program;
use kiln_ir::{CompareOp, DType, Value};

/// nanoGPT's `get_lr` as a learning rate of the step: a linear warm-up to `peak` over
/// `warmup` steps (`peak·(s+1)/(warmup+1)` at step `s` from 0), then half a cosine from `peak`
/// down to `floor` at step `decay_end`, and `floor` after it. Made by
/// [`Schedule::warmup_cosine`], which checks it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    peak: f64,
    floor: f64,
    warmup: usize,
    decay_end: usize,
}

impl Schedule {
    /// nanoGPT's schedule, checked: rates finite and not negative, the decay ending after the
    /// warm-up.
    pub fn warmup_cosine(
        peak: f64,
        floor: f64,
        warmup: usize,
        decay_end: usize,
    ) -> RuntimeResult<Schedule> {
        let rates_ok = peak.is_finite() && floor.is_finite() && peak >= 0.0 && floor >= 0.0;
        if !rates_ok || decay_end <= warmup {
            return Err(RuntimeError::Usage(format!(
                "warmup_cosine: rates {peak} and {floor} must be finite and not negative, and \
                 the decay's end (step {decay_end}) must come after the warm-up ({warmup} steps)"
            )));
        }
        Ok(Schedule {
            peak,
            floor,
            warmup,
            decay_end,
        })
    }

    /// The rate of step `step` (from 0: the first update is step 0).
    pub fn at(self, step: usize) -> f64 {
        let Schedule {
            peak,
            floor,
            warmup,
            decay_end,
        } = self;
        if step < warmup {
            return peak * (step + 1) as f64 / (warmup + 1) as f64;
        }
        let along = ((step - warmup) as f64 / (decay_end - warmup) as f64).min(1.0);
        floor + 0.5 * (1.0 + (std::f64::consts::PI * along).cos()) * (peak - floor)
    }

    /// The rate as a value of `p` of `dtype`, from `t`, the count of updates including this
    /// one (the optimizer's counter after its increment, any float dtype): computed in f64,
    /// then rounded once to `dtype`.
    pub(crate) fn value(self, p: &mut Program, t: Value, dtype: DType) -> RuntimeResult<Value> {
        let Schedule {
            peak,
            floor,
            warmup,
            decay_end,
        } = self;
        let f = DType::F64;
        let t = p.cast(t, f)?;
        let one = p.scalar(f, 1.0)?;
        let step = p.sub(t, one)?;
        let warm_rate = p.scalar(f, peak / (warmup + 1) as f64)?;
        let warm = p.mul(t, warm_rate)?;
        let start = p.scalar(f, warmup as f64)?;
        let since = p.sub(step, start)?;
        let per_step = p.scalar(f, 1.0 / (decay_end - warmup) as f64)?;
        let along = p.mul(since, per_step)?;
        let along = p.binary(kiln_ir::BinaryOp::Min, along, one)?;
        let pi = p.scalar(f, std::f64::consts::PI)?;
        let angle = p.mul(along, pi)?;
        let cos = p.cos(angle)?;
        let lifted = p.add(cos, one)?;
        let half_range = p.scalar(f, 0.5 * (peak - floor))?;
        let above = p.mul(lifted, half_range)?;
        let floor = p.scalar(f, floor)?;
        let decayed = p.add(above, floor)?;
        let warming = p.compare(CompareOp::Lt, step, start)?;
        let rate = p.select(warming, warm, decayed)?;
        Ok(p.cast(rate, dtype)?)
    }
}
