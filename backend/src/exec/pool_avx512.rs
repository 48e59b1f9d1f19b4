//! 2×2 max pooling over windows that tile the planes, and its gradient from the recorded
//! argmax, sixteen f32 windows at a time in AVX-512 registers. A block of 64 input elements
//! is a whole number of pairs of rows when the rows are 2 to 32 elements long (the digits
//! CNN's are 8 and 4); each window's four taps are picked out of the block's four registers
//! by permutes, so the loops carry no per-row or per-window bookkeeping. The scalar loops in
//! `pool.rs` took ~5 cycles a window; they still run the rows a block leaves, and every
//! other width, type and instruction-set level. The results are theirs bit for bit: the
//! largest tap as [`nan_max`](crate::interp::kernels::nan_max) gives it (the canonical NaN
//! when a tap is NaN) and the first tap that holds it.
//!
//! Channels-last tensors (`[N, H, W, C]`) need no permutes: a window's taps are runs of
//! contiguous channels, sixteen lanes of the same arithmetic.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether this CPU (at the level `KILN_VECTOR_MATH` allows) has AVX-512, which the
/// channels-last loops need (they take any channel count).
pub(super) fn suits_channels_last() -> bool {
    crate::jit::tile_program::isa() == crate::jit::tile_program::Isa::Avx512
}

/// Input elements a block takes.
const BLOCK: usize = 64;

/// Whether rows `w` long suit the blocks and this CPU (at the level `KILN_VECTOR_MATH`
/// allows) has AVX-512.
pub(super) fn suits(w: usize) -> bool {
    (2..=BLOCK / 2).contains(&w) && BLOCK.is_multiple_of(2 * w) && suits_channels_last()
}

/// For each of a block's sixteen windows (row-major over its pairs of rows), where its tap
/// `k` is in the block: `taps[k][i]`, for rows `w` long.
fn tap_positions(w: usize) -> [[i32; 16]; 4] {
    let first = |i: usize| (i / (w / 2)) * 2 * w + 2 * (i % (w / 2));
    [0, 1, w, w + 1].map(|tap| std::array::from_fn(|i| (first(i) + tap) as i32))
}

/// For each of a block's 64 input elements (four registers of sixteen), its window in the
/// block and its tap in the window, for rows `w` long.
fn element_windows(w: usize) -> ([[i32; 16]; 4], [[i32; 16]; 4]) {
    let (mut window, mut tap) = ([[0; 16]; 4], [[0; 16]; 4]);
    for p in 0..BLOCK {
        let (pair, within) = (p / (2 * w), p % (2 * w));
        let (row, column) = (within / w, within % w);
        window[p / 16][p % 16] = (pair * (w / 2) + column / 2) as i32;
        tap[p / 16][p % 16] = (2 * row + column % 2) as i32;
    }
    (window, tap)
}

/// Max pooling of `x` (rows `w` long, [`suits`]) by 2×2 windows into `out`, recording each
/// window's argmax in `taps` when it is given, a block at a time; returns how many windows
/// it wrote (the blocks'; the caller pools the rows left).
#[cfg(target_arch = "x86_64")]
pub(super) fn max_2x2(x: &[f32], w: usize, out: &mut [f32], taps: Option<&mut [u8]>) -> usize {
    let blocks = (x.len() / BLOCK).min(out.len() / 16);
    let blocks = taps.as_ref().map_or(blocks, |t| blocks.min(t.len() / 16));
    // SAFETY: `suits` checked that the CPU has AVX-512; `blocks` fit every slice.
    unsafe { max_2x2_blocks(blocks, x, &tap_positions(w), out, taps) };
    blocks * 16
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_2x2_blocks(
    blocks: usize,
    x: &[f32],
    positions: &[[i32; 16]; 4],
    out: &mut [f32],
    mut taps: Option<&mut [u8]>,
) {
    assert!(x.len() >= blocks * BLOCK && out.len() >= blocks * 16);
    assert!(taps.as_ref().is_none_or(|t| t.len() >= blocks * 16));
    // SAFETY: block `b` reads x[64b..64b + 64] and writes out[16b..16b + 16] and the same
    // elements of `taps`, within the lengths asserted.
    unsafe {
        let positions = positions.map(|p| _mm512_loadu_si512(p.as_ptr().cast()));
        // Positions 0..32 come from a block's first two registers, 32..64 from its last two.
        let second = positions.map(|p| _mm512_cmpge_epi32_mask(p, _mm512_set1_epi32(32)));
        for b in 0..blocks {
            let block = x.as_ptr().add(b * BLOCK);
            let z = [0, 16, 32, 48].map(|at| _mm512_loadu_ps(block.add(at)));
            let t: [__m512; 4] = std::array::from_fn(|k| {
                let low = _mm512_permutex2var_ps(z[0], positions[k], z[1]);
                let high = _mm512_permutex2var_ps(z[2], positions[k], z[3]);
                _mm512_mask_blend_ps(second[k], low, high)
            });
            let m = largest_of_4(t);
            _mm512_storeu_ps(out.as_mut_ptr().add(b * 16), m);
            let Some(taps) = taps.as_deref_mut() else {
                continue;
            };
            let to = taps.as_mut_ptr().add(b * 16);
            _mm_storeu_si128(to.cast(), _mm512_cvtepi32_epi8(first_holding(t, m)));
        }
    }
}

/// Each lane's largest of four taps, as [`nan_max`](crate::interp::kernels::nan_max) gives
/// it: the canonical NaN when a tap is NaN.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn largest_of_4(t: [__m512; 4]) -> __m512 {
    // nan_max(a, b) is `b > a ? b : a` (then NaN if either is): `maxps b, a`.
    let top = _mm512_max_ps(t[1], t[0]);
    let bottom = _mm512_max_ps(t[3], t[2]);
    let unordered = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(t[0], t[1])
        | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(t[2], t[3]);
    let nan = _mm512_set1_ps(f32::NAN);
    _mm512_mask_blend_ps(unordered, _mm512_max_ps(bottom, top), nan)
}

/// Each lane's first tap that holds its largest `m`: equal to it or NaN (with a NaN no tap
/// equals the largest, so the first NaN).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
fn first_holding(t: [__m512; 4], m: __m512) -> __m512i {
    let mut first = _mm512_set1_epi32(3);
    for k in (0..3).rev() {
        let holds = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(t[k], m)
            | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(t[k], t[k]);
        first = _mm512_mask_mov_epi32(first, holds, _mm512_set1_epi32(k as i32));
    }
    first
}

/// Where the four taps of 2×2 window `window` of a channels-last sample (rows `w` long of
/// `c` channels, windows tiling it) start.
#[cfg(target_arch = "x86_64")]
fn channels_last_taps(window: usize, [w, c]: [usize; 2]) -> [usize; 4] {
    let (y, x) = (window / (w / 2), window % (w / 2));
    let first = (2 * y * w + 2 * x) * c;
    [first, first + c, first + w * c, first + (w + 1) * c]
}

/// The lanes a run of sixteen channels from `ch` holds among `c`.
#[cfg(target_arch = "x86_64")]
fn lanes(ch: usize, c: usize) -> __mmask16 {
    match c - ch {
        16.. => u16::MAX,
        n => (1 << n) - 1,
    }
}

// Loads and stores of a run of channels: masked only for the last, short run.

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load(lanes: __mmask16, from: *const f32) -> __m512 {
    // SAFETY: the caller's: the lanes of `from` are readable.
    unsafe {
        match lanes {
            u16::MAX => _mm512_loadu_ps(from),
            _ => _mm512_maskz_loadu_ps(lanes, from),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store(lanes: __mmask16, to: *mut f32, v: __m512) {
    // SAFETY: the caller's: the lanes of `to` are writable.
    unsafe {
        match lanes {
            u16::MAX => _mm512_storeu_ps(to, v),
            _ => _mm512_mask_storeu_ps(to, lanes, v),
        }
    }
}

/// Sixteen taps (as `u32` lanes) stored as bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn store_taps(lanes: __mmask16, to: *mut u8, taps: __m512i) {
    // SAFETY: the caller's: the lanes of `to` are writable.
    unsafe {
        match lanes {
            u16::MAX => _mm_storeu_si128(to.cast(), _mm512_cvtepi32_epi8(taps)),
            _ => _mm512_mask_cvtepi32_storeu_epi8(to.cast(), lanes, taps),
        }
    }
}

/// Sixteen taps stored as bytes, loaded as `u32` lanes (zeros past `lanes`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_taps(lanes: __mmask16, from: *const u8) -> __m512i {
    let mut bytes = [0u8; 16];
    // SAFETY: the caller's: the lanes of `from` are readable.
    unsafe {
        match lanes {
            u16::MAX => _mm512_cvtepu8_epi32(_mm_loadu_si128(from.cast())),
            _ => {
                std::ptr::copy_nonoverlapping(
                    from,
                    bytes.as_mut_ptr(),
                    lanes.count_ones() as usize,
                );
                _mm512_cvtepu8_epi32(_mm_loadu_si128(bytes.as_ptr().cast()))
            }
        }
    }
}

/// Max pooling of a channels-last sample `x` (`[H, w, c]`) by 2×2 windows that tile it into
/// `out` (`[H / 2, w / 2, c]`), recording each window's argmax for each channel in `taps`
/// when given; sixteen channels at a time (a masked run for the last). Needs AVX-512
/// ([`suits_channels_last`]).
#[cfg(target_arch = "x86_64")]
pub(super) fn max_2x2_channels_last(
    x: &[f32],
    [w, c]: [usize; 2],
    out: &mut [f32],
    taps: Option<&mut [u8]>,
) {
    assert!(x.len() == 4 * out.len() && taps.as_ref().is_none_or(|t| t.len() == out.len()));
    assert!(c > 0 && w.is_multiple_of(2) && x.len().is_multiple_of(2 * w * c));
    assert!(suits_channels_last());
    // SAFETY: checked just above that the CPU has AVX-512.
    unsafe { max_2x2_channels_last_runs(x, [w, c], out, taps) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_2x2_channels_last_runs(
    x: &[f32],
    [w, c]: [usize; 2],
    out: &mut [f32],
    mut taps: Option<&mut [u8]>,
) {
    for window in 0..out.len() / c {
        let at = channels_last_taps(window, [w, c]);
        for ch in (0..c).step_by(16) {
            let lanes = lanes(ch, c);
            // SAFETY: the windows tile `x` (asserted by the caller), so each tap's run of
            // channels is in it; the window's run is in `out` and `taps`, which are a quarter
            // of its length. Masked lanes are neither read nor written.
            unsafe {
                let t = at.map(|a| load(lanes, x.as_ptr().add(a + ch)));
                let m = largest_of_4(t);
                store(lanes, out.as_mut_ptr().add(window * c + ch), m);
                if let Some(taps) = taps.as_deref_mut() {
                    let to = taps.as_mut_ptr().add(window * c + ch);
                    store_taps(lanes, to, first_holding(t, m));
                }
            }
        }
    }
}

/// The gradient of [`max_2x2_channels_last`] from its recorded `taps`: each window's
/// gradient `g` at its argmax and zeros at its other taps, into `out` (the sample's shape,
/// every element written).
#[cfg(target_arch = "x86_64")]
pub(super) fn max_2x2_channels_last_from(
    taps: &[u8],
    [w, c]: [usize; 2],
    g: &[f32],
    out: &mut [f32],
) {
    assert!(out.len() == 4 * g.len() && taps.len() == g.len());
    assert!(c > 0 && w.is_multiple_of(2) && out.len().is_multiple_of(2 * w * c));
    assert!(suits_channels_last());
    // SAFETY: checked just above that the CPU has AVX-512.
    unsafe { max_2x2_channels_last_from_runs(taps, [w, c], g, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_2x2_channels_last_from_runs(taps: &[u8], [w, c]: [usize; 2], g: &[f32], out: &mut [f32]) {
    for window in 0..g.len() / c {
        let at = channels_last_taps(window, [w, c]);
        for ch in (0..c).step_by(16) {
            let (lanes, from) = (lanes(ch, c), window * c + ch);
            // SAFETY: as in `max_2x2_channels_last_runs`, with `g` and `taps` the pooled side.
            unsafe {
                let g = load(lanes, g.as_ptr().add(from));
                let argmax = load_taps(lanes, taps.as_ptr().add(from));
                for (k, a) in at.into_iter().enumerate() {
                    let here = _mm512_cmpeq_epi32_mask(argmax, _mm512_set1_epi32(k as i32));
                    store(
                        lanes,
                        out.as_mut_ptr().add(a + ch),
                        _mm512_maskz_mov_ps(here, g),
                    );
                }
            }
        }
    }
}

/// The gradient of [`max_2x2`] from its recorded `taps`: each window's gradient `g` at its
/// argmax, zeros elsewhere, into `out` (rows `w` long, [`suits`]) a block at a time; returns
/// how many windows it wrote.
#[cfg(target_arch = "x86_64")]
pub(super) fn max_2x2_from(taps: &[u8], w: usize, g: &[f32], out: &mut [f32]) -> usize {
    let blocks = (out.len() / BLOCK).min(g.len() / 16).min(taps.len() / 16);
    // SAFETY: as in `max_2x2`.
    unsafe { max_2x2_from_blocks(blocks, taps, g, element_windows(w), out) };
    blocks * 16
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_2x2_from_blocks(
    blocks: usize,
    taps: &[u8],
    g: &[f32],
    (window, tap): ([[i32; 16]; 4], [[i32; 16]; 4]),
    out: &mut [f32],
) {
    assert!(taps.len() >= blocks * 16 && g.len() >= blocks * 16);
    assert!(out.len() >= blocks * BLOCK);
    // SAFETY: block `b` reads taps[16b..16b + 16] and g[16b..16b + 16] and writes
    // out[64b..64b + 64], within the lengths asserted.
    unsafe {
        let window = window.map(|w| _mm512_loadu_si512(w.as_ptr().cast()));
        let tap = tap.map(|t| _mm512_loadu_si512(t.as_ptr().cast()));
        for b in 0..blocks {
            let g = _mm512_loadu_ps(g.as_ptr().add(b * 16));
            let argmax = _mm_loadu_si128(taps.as_ptr().add(b * 16).cast());
            let argmax = _mm512_cvtepu8_epi32(argmax);
            for j in 0..4 {
                let here = _mm512_permutexvar_epi32(window[j], argmax);
                let here = _mm512_cmpeq_epi32_mask(here, tap[j]);
                let value = _mm512_maskz_mov_ps(here, _mm512_permutexvar_ps(window[j], g));
                _mm512_storeu_ps(out.as_mut_ptr().add(b * BLOCK + 16 * j), value);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn max_2x2(_: &[f32], _: usize, _: &mut [f32], _: Option<&mut [u8]>) -> usize {
    0
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn max_2x2_from(_: &[u8], _: usize, _: &[f32], _: &mut [f32]) -> usize {
    0
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn max_2x2_channels_last(_: &[f32], _: [usize; 2], _: &mut [f32], _: Option<&mut [u8]>) {
    unreachable!("channels-last 2×2 pooling in registers needs AVX-512 (suits_channels_last)")
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn max_2x2_channels_last_from(_: &[u8], _: [usize; 2], _: &[f32], _: &mut [f32]) {
    unreachable!("channels-last 2×2 pooling in registers needs AVX-512 (suits_channels_last)")
}
