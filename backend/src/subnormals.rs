//! What compiled runs do with subnormal floats: by default they are flushed to zero.
//!
//! A float below the smallest normal (1.18e-38 in f32) is subnormal. Intel cores take a
//! microcode assist for each arithmetic instruction that reads or writes one, so a kernel
//! over subnormal data can run ten times slower than over normal data; training makes such
//! data on its own (Adam's first moments of weights whose gradient stays zero decay by β₁
//! every step, through the subnormal range). TensorFlow and XLA compute with the CPU's
//! flush-to-zero (FTZ: a subnormal result is written as zero) and denormals-are-zero (DAZ: a
//! subnormal operand is read as zero) modes for this reason; PyTorch offers them as
//! `torch.set_flush_denormal(True)`.
//!
//! Kiln sets both modes in the threads that compute a compiled run — the caller's for the
//! run's duration (restored after, so the caller's own code is unaffected), and each team
//! helper for each parallel region, copied from the region's caller ([`crate::team`]) — so
//! the same bits come out on any number of threads. [`Subnormals::Keep`] (or
//! `KILN_SUBNORMALS=keep`, [`crate::settings`]) keeps IEEE arithmetic. The interpreter never
//! changes the mode: it is the exact oracle, and compiled results are compared with it
//! treating a value the interpreter gives below the smallest normal as equal to zero.
//!
//! The modes are x86-64's (MXCSR bits 15 and 6, which SSE, AVX and AVX-512 code all obey);
//! on other architectures compiled runs keep IEEE subnormals.

use std::sync::atomic::{AtomicU8, Ordering};

/// What compiled runs do with subnormal floats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subnormals {
    /// Subnormal results are written as zero and subnormal operands read as zero (the
    /// default; x86-64 only).
    Flush,
    /// IEEE arithmetic: subnormals are computed as such (slow on Intel cores).
    Keep,
}

/// 0: not set, so the environment decides; else `1 + Subnormals as u8`.
static POLICY: AtomicU8 = AtomicU8::new(0);

/// The policy compiled runs use: set by [`set_subnormals`], else `KILN_SUBNORMALS`, else
/// [`Subnormals::Flush`].
pub fn subnormals() -> Subnormals {
    match POLICY.load(Ordering::Relaxed) {
        1 => Subnormals::Flush,
        2 => Subnormals::Keep,
        _ if crate::settings::keep_subnormals() => Subnormals::Keep,
        _ => Subnormals::Flush,
    }
}

/// Sets the policy for the runs that start after it, process-wide; `None` returns to the
/// environment's choice.
pub fn set_subnormals(policy: Option<Subnormals>) {
    let code = match policy {
        None => 0,
        Some(Subnormals::Flush) => 1,
        Some(Subnormals::Keep) => 2,
    };
    POLICY.store(code, Ordering::Relaxed);
}

/// Whether this machine can flush subnormals (x86-64 can; elsewhere [`Subnormals::Flush`]
/// computes as [`Subnormals::Keep`] does).
pub fn can_flush() -> bool {
    cfg!(target_arch = "x86_64")
}

/// A floating-point mode on this thread while it lives, the thread's previous mode restored
/// on drop (a panic included).
pub(crate) struct ModeScope {
    previous: Option<Mode>,
}

impl ModeScope {
    /// A compiled run's mode: flushing when the policy says so, else the thread's own.
    pub(crate) fn for_run() -> ModeScope {
        let previous = (subnormals() == Subnormals::Flush).then(|| {
            crate::team::start();
            let previous = Mode::current();
            previous.with_flush(true).set();
            previous
        });
        ModeScope { previous }
    }

    /// `mode`, another thread's (a region's caller).
    pub(crate) fn adopt(mode: Mode) -> ModeScope {
        let previous = Mode::current();
        mode.set();
        ModeScope {
            previous: Some(previous),
        }
    }
}

impl Drop for ModeScope {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            previous.set();
        }
    }
}

/// A thread's floating-point control state (MXCSR's control bits on x86-64, without the
/// sticky exception flags): what a team helper copies from the caller of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mode(u32);

#[cfg(target_arch = "x86_64")]
impl Mode {
    /// MXCSR's flush-to-zero and denormals-are-zero bits.
    const FLUSH: u32 = (1 << 15) | (1 << 6);
    /// MXCSR's sticky exception flags (invalid, denormal, divide, overflow, underflow,
    /// precision), which computing sets: not part of a mode.
    const FLAGS: u32 = 0x3f;

    fn csr() -> u32 {
        let mut csr = 0u32;
        // SAFETY: `stmxcsr` stores the 32-bit MXCSR to the given address, a live u32.
        unsafe {
            core::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags));
        }
        csr
    }

    pub(crate) fn current() -> Mode {
        Mode(Mode::csr() & !Self::FLAGS)
    }

    pub(crate) fn set(self) {
        let csr = Mode::csr();
        if csr & !Self::FLAGS == self.0 {
            return;
        }
        let csr = self.0 | (csr & Self::FLAGS);
        // SAFETY: `ldmxcsr` loads MXCSR from a live u32 holding a value `stmxcsr` gave, with
        // at most the FTZ and DAZ bits changed; every bit pattern of those two is valid, and
        // only rounding of subnormals changes (code compiled by Rust and Cranelift computes
        // the same values but for them).
        unsafe {
            core::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags, readonly));
        }
    }

    fn with_flush(self, flush: bool) -> Mode {
        Mode(if flush {
            self.0 | Self::FLUSH
        } else {
            self.0 & !Self::FLUSH
        })
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl Mode {
    pub(crate) fn current() -> Mode {
        Mode(0)
    }

    pub(crate) fn set(self) {}

    fn with_flush(self, _flush: bool) -> Mode {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A subnormal computed from normal operands, through memory so that nothing folds it.
    fn tiny_product() -> f32 {
        let a = std::hint::black_box(1e-20f32);
        std::hint::black_box(a * a)
    }

    #[test]
    fn a_run_mode_flushes_and_restores_the_thread_mode() {
        let before = Mode::current();
        assert!(tiny_product() > 0.0, "IEEE arithmetic outside a run");
        {
            let _mode = ModeScope::for_run();
            let flushes = subnormals() == Subnormals::Flush && can_flush();
            assert_eq!(tiny_product() == 0.0, flushes);
            {
                let _nested = ModeScope::for_run();
                assert_eq!(tiny_product() == 0.0, flushes);
            }
            assert_eq!(
                tiny_product() == 0.0,
                flushes,
                "a nested run restores the outer mode"
            );
        }
        assert_eq!(Mode::current(), before);
        assert!(tiny_product() > 0.0);
    }
}
