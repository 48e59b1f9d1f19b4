//! Kiln's environment variables, each read once, here and nowhere else in the library.
//!
//! | variable | values | what it does |
//! |---|---|---|
//! | `KILN_DEBUG` | `1`, `2`, `3` | `1` reports each kernel compiled (stages, code size) and each op left to the interpreter; `2` adds its Cranelift IR; `3` its machine code and each buffer the executor allocates |
//! | `KILN_PROFILE` | `1`, `all` | per step of each compiled program: time and calls, printed when the program is dropped (`1`: the 25 slowest steps; `all`: every step) |
//! | `KILN_VECTOR_MATH` | `avx512`, `avx2`, `off` | caps the tile programs' instruction-set level (default: the best the CPU has) |
//! | `KILN_SUBNORMALS` | `flush`, `keep` | what compiled runs do with subnormal floats (default `flush`: [`crate::subnormals`]) |
//! | `KILN_COMM_TIMEOUT` | seconds | how long a rank waits for the others in one communication (default 1800) |
//! | `KILN_DATA` | a folder | where downloaded datasets are looked for (default `~/.cache/kiln`; `scripts/fetch_shakespeare.sh` writes there) |
//!
//! The launchers' own variables (`OMPI_COMM_WORLD_*`, `PMIX_RANK`, `RAYON_NUM_THREADS`) are
//! read where a rank learns its place ([`crate::comm`]): they are not Kiln's settings.
//! Test harnesses read theirs (`KILN_EXPECT_ISA`, `KILN_ONNX_NODE_*`) in the tests.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The `KILN_DEBUG` level (0 when unset or not a number).
pub fn debug_level() -> u32 {
    static LEVEL: OnceLock<u32> = OnceLock::new();
    *LEVEL.get_or_init(|| read("KILN_DEBUG").and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// How many of a compiled program's slowest steps `KILN_PROFILE` prints (0: no profile).
pub fn profile_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| match read("KILN_PROFILE").as_deref() {
        Some("1") => 25,
        Some("all") => usize::MAX,
        _ => 0,
    })
}

/// The instruction-set cap `KILN_VECTOR_MATH` names: `"off"`, `"avx2"`, or `None` (no cap).
pub fn vector_math_cap() -> Option<&'static str> {
    static CAP: OnceLock<Option<&'static str>> = OnceLock::new();
    *CAP.get_or_init(|| match read("KILN_VECTOR_MATH").as_deref() {
        Some("off") => Some("off"),
        Some("avx2") => Some("avx2"),
        _ => None,
    })
}

/// Whether `KILN_SUBNORMALS=keep` asks compiled runs to keep IEEE subnormals.
pub fn keep_subnormals() -> bool {
    static KEEP: OnceLock<bool> = OnceLock::new();
    *KEEP.get_or_init(|| read("KILN_SUBNORMALS").is_some_and(|v| v.trim() == "keep"))
}

/// `KILN_COMM_TIMEOUT` in seconds, when it is a positive finite number.
pub fn comm_timeout() -> Option<Duration> {
    read("KILN_COMM_TIMEOUT")
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
}

/// The folder of downloaded datasets: `KILN_DATA`, else `$HOME/.cache/kiln`, else `None`.
pub fn data_dir() -> Option<PathBuf> {
    match read("KILN_DATA") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => read("HOME").map(|home| Path::new(&home).join(".cache/kiln")),
    }
}

fn read(name: &str) -> Option<String> {
    std::env::var(name).ok()
}
