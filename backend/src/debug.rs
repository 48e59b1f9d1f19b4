//! `KILN_DEBUG`, read once: `1` reports each kernel compiled (stages, code size), `2` also
//! prints its Cranelift IR, `3` its machine code and each buffer the executor allocates.

use std::sync::OnceLock;

/// The `KILN_DEBUG` level (0 when unset): 1 lists kernels, 2 adds Cranelift IR, 3 machine code.
pub fn level() -> u32 {
    static LEVEL: OnceLock<u32> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        std::env::var("KILN_DEBUG")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}
