//! Choosing, per stage, between its two codes by measured cost.
//!
//! A stage whose vectorised rows have transcendental functions is compiled twice: in
//! Cranelift's f32x4 code alone, and calling vector routines on tiles. Which is faster
//! depends on the rows (a routine call per tile pays off on long rows, not on rows of ten),
//! so the first calls with enough work alternate between the two and time each; after
//! [`SAMPLES`] of each, the faster (by its best time) is kept for the life of the process.
//! Both give the same bits, so the choice changes speed only. `KILN_DEBUG=1` prints it.

use crate::debug;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// A stage's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Cranelift's code alone (f32x4 lanes).
    Cranelift,
    /// Cranelift's code calling vector routines on tiles of a row.
    Routines,
}

/// Calls timed on each path before choosing.
const SAMPLES: usize = 5;

/// Below this many elements a call is not timed (a timer read would weigh on it), and runs
/// the Cranelift code until the choice is made.
const MIN_TIMED_ELEMENTS: i64 = 1 << 14;

const UNDECIDED: u8 = 0;

/// The choice between a stage's two codes, and the timings that make it.
#[derive(Default)]
pub(crate) struct Choice {
    decided: AtomicU8,
    /// Timings so far: Cranelift's, then the routines'.
    samples: Mutex<[Vec<Duration>; 2]>,
}

impl Path {
    fn code(self) -> u8 {
        match self {
            Path::Cranelift => 1,
            Path::Routines => 2,
        }
    }

    fn from_code(code: u8) -> Option<Path> {
        match code {
            1 => Some(Path::Cranelift),
            2 => Some(Path::Routines),
            _ => None,
        }
    }

    fn index(self) -> usize {
        self.code() as usize - 1
    }
}

impl Choice {
    /// The path a call over `elements` takes, and whether to time it.
    pub(crate) fn pick(&self, elements: i64) -> (Path, bool) {
        if let Some(path) = Path::from_code(self.decided.load(Ordering::Relaxed)) {
            return (path, false);
        }
        if elements < MIN_TIMED_ELEMENTS {
            return (Path::Cranelift, false);
        }
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let path = if samples[1].len() <= samples[0].len() {
            Path::Routines
        } else {
            Path::Cranelift
        };
        (path, true)
    }

    /// Records a timed call; once both paths have their samples, decides (and reports the
    /// decision under `KILN_DEBUG=1`, naming the stage as `what`).
    pub(crate) fn record(&self, path: Path, took: Duration, what: impl FnOnce() -> String) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if self.decided.load(Ordering::Relaxed) != UNDECIDED {
            return;
        }
        samples[path.index()].push(took);
        if samples.iter().any(|s| s.len() < SAMPLES) {
            return;
        }
        let best = |s: &[Duration]| s.iter().min().copied().unwrap_or_default();
        let (cranelift, routines) = (best(&samples[0]), best(&samples[1]));
        let chosen = if routines < cranelift {
            Path::Routines
        } else {
            Path::Cranelift
        };
        self.decided.store(chosen.code(), Ordering::Relaxed);
        if debug::level() >= 1 {
            eprintln!(
                "kiln: {}: vector routines ({}) {:.1} µs, Cranelift f32x4 {:.1} µs per call (best of {SAMPLES}) → {}",
                what(),
                crate::vecmath::isa().name(),
                routines.as_secs_f64() * 1e6,
                cranelift.as_secs_f64() * 1e6,
                match chosen {
                    Path::Routines => "vector routines",
                    Path::Cranelift => "Cranelift",
                }
            );
        }
    }

    /// The path chosen, if the choice is made.
    pub(crate) fn decided(&self) -> Option<Path> {
        Path::from_code(self.decided.load(Ordering::Relaxed))
    }
}
