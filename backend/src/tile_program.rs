//! Tile programs: a fused group's per-element f32 work as a short list of whole-tile
//! instructions, run at the ISA's full width — the one vector implementation of every f32 op
//! in compiled kernels.
//!
//! Cranelift emits nothing wider than 128 bits on x86-64, so a kernel's vectorised group
//! hands its row to [`run`] tile by tile: each instruction reads and writes whole tiles (a few
//! KiB, in L1), the way numexpr evaluates an expression block by block, so every step runs on
//! 512-bit (or 256-bit, or 128-bit) vectors and costs one dispatch per tile, not per element.
//! Each op's vector body is written once here, as a scalar closure over one element that LLVM
//! vectorises inside the ISA's entry ([`unary`], [`binary`]); the transcendental functions are
//! [`crate::vecmath`]'s scalar bodies, inlined the same way.
//!
//! - bools are tiles of `0.0` and `1.0` (a compare writes them, a select reads them);
//! - a sum keeps 16 partial sums (element `i` of the row into partial `i mod 16`, in order),
//!   set to the identity by the row's first tile and folded in a fixed order, into the first,
//!   by its last;
//! - a max or min may combine in any order: it is exact, and its NaN is made canonical when
//!   the row's reduction finishes.
//!
//! A call's *frame* is an array of words: a header ([`word`]: the program, the scalars, the
//! partial accumulators, the tile's first position along the row, how many rows, …), then
//! per row one pointer per register: a buffer at the row's first element, or (row 0 only) a
//! tile of scratch. A call computes one tile of a long row, or a block of whole short rows
//! (up to [`BLOCK_ROWS`], as many as fill a tile): each instruction over every row of the
//! block in turn, row `i`'s scratch at `i·len` in the register's tile.
//!
//! Only a program's first instructions read memory beyond L1 and its last ones write it, so
//! a call prefetches the next tile of every buffer: the loads arrive while this tile computes,
//! as they would in a loop that interleaved both.

use crate::vecmath::{Isa, scalar};
use kiln_ir::{BinaryOp, CompareOp, ReduceOp, UnaryOp};

/// Partial accumulators per reduction: four 512-bit registers' worth of independent chains,
/// which hide the adds' latency.
pub(crate) const PARTIALS: usize = 16;

/// Elements per tile: 2 KiB of f32, so a program's scratch tiles and its inputs sit in L1.
pub(crate) const TILE: usize = 512;

const _: () = assert!(
    TILE.is_multiple_of(PARTIALS),
    "every tile but a row's last is whole trips"
);

/// The words of a frame's header, by index; the registers follow it.
pub(crate) mod word {
    /// The program's address, and its length in words.
    pub(crate) const PROGRAM: usize = 0;
    pub(crate) const COUNT: usize = 1;
    /// The scalars' address (row `i`'s scalar `k` at `i·SCALARS_PER_ROW + k`).
    pub(crate) const SCALARS: usize = 2;
    /// The partial accumulators' address (row `i`'s reduction `k` at `i·REDUCTIONS + k`,
    /// [`super::PARTIALS`] f32s each).
    pub(crate) const PARTIALS: usize = 3;
    /// The mask of the buffer registers streamed from row to row (prefetched).
    pub(crate) const STREAMED: usize = 4;
    /// The tile's first position along the row.
    pub(crate) const START: usize = 5;
    /// How many rows the call computes.
    pub(crate) const ROWS: usize = 6;
    /// The mask of the registers that are buffers (the rest are scratch).
    pub(crate) const BUFFERS: usize = 7;
    /// Registers, scalars and reductions per row.
    pub(crate) const REGISTERS: usize = 8;
    pub(crate) const SCALARS_PER_ROW: usize = 9;
    pub(crate) const REDUCTIONS: usize = 10;
    /// The row's length: the call whose tile ends it folds each reduction's partials.
    pub(crate) const ROW_LENGTH: usize = 11;
}

/// Words of a frame before the registers.
pub(crate) const FRAME_HEADER: usize = 12;

/// Rows one call computes at most, when a row is shorter than a tile.
pub(crate) const BLOCK_ROWS: usize = 32;

/// Registers a program may have (the masks' bits).
pub(crate) const MAX_REGISTERS: usize = 64;

/// Where an instruction reads: a register (a tile), or a scalar broadcast over the tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Operand {
    Tile(u16),
    Scalar(u16),
}

/// One instruction over the tile's `len` elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Instr {
    /// `dst = a`.
    Copy {
        dst: u16,
        a: Operand,
    },
    Unary {
        op: UnaryOp,
        dst: u16,
        a: Operand,
    },
    Binary {
        op: BinaryOp,
        dst: u16,
        a: Operand,
        b: Operand,
    },
    /// `dst = then(first(a, b), c)`, or `then(c, first(a, b))` with `swap`, times scalar
    /// `scale` if it has one: two or three binary ops in one pass over the tile, each result
    /// rounded as on its own.
    Fused {
        first: BinaryOp,
        then: BinaryOp,
        swap: bool,
        dst: u16,
        a: Operand,
        b: Operand,
        c: Operand,
        scale: Option<u16>,
    },
    /// Combines `a` into reduction `acc`'s partial accumulators.
    Reduce {
        op: ReduceOp,
        acc: u16,
        a: Operand,
    },
    /// `dst = 1.0` where `a op b` holds, else `0.0`.
    Compare {
        op: CompareOp,
        dst: u16,
        a: Operand,
        b: Operand,
    },
    /// `dst = a` where `c` is nonzero, else `b`.
    Select {
        dst: u16,
        c: Operand,
        a: Operand,
        b: Operand,
    },
    /// `dst` = each element's position along the row, as f32.
    Iota {
        dst: u16,
    },
}

impl Instr {
    /// The register the instruction writes, if it writes one.
    pub(crate) fn destination(&self) -> Option<u16> {
        match *self {
            Instr::Copy { dst, .. }
            | Instr::Unary { dst, .. }
            | Instr::Binary { dst, .. }
            | Instr::Fused { dst, .. }
            | Instr::Compare { dst, .. }
            | Instr::Select { dst, .. }
            | Instr::Iota { dst } => Some(dst),
            Instr::Reduce { .. } => None,
        }
    }
}

/// Whether a [`Instr::Fused`] pair may have these ops.
pub(crate) fn fusable(first: BinaryOp, then: BinaryOp) -> bool {
    let cheap = |op| matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul);
    cheap(first) && cheap(then)
}

const SCALAR_BIT: u16 = 0x8000;
const COPY: u64 = 0;
const UNARY: u64 = 1;
const BINARY: u64 = 2;
const REDUCE: u64 = 3;
const FUSED: u64 = 4;
const COMPARE: u64 = 5;
const SELECT: u64 = 6;
const IOTA: u64 = 7;

impl Operand {
    fn encode(self) -> u64 {
        match self {
            Operand::Tile(r) => u64::from(r),
            Operand::Scalar(s) => u64::from(s | SCALAR_BIT),
        }
    }

    fn decode(word: u64) -> Operand {
        let x = word as u16;
        if x & SCALAR_BIT != 0 {
            Operand::Scalar(x & !SCALAR_BIT)
        } else {
            Operand::Tile(x)
        }
    }
}

impl Instr {
    /// The instruction with register `from` read and written as `to`.
    pub(crate) fn rename(&mut self, from: u16, to: u16) {
        let reg = |x: &mut u16| {
            if *x == from {
                *x = to;
            }
        };
        let operand = |o: &mut Operand| {
            if let Operand::Tile(x) = o {
                reg(x);
            }
        };
        match self {
            Instr::Copy { dst, a } | Instr::Unary { dst, a, .. } => {
                reg(dst);
                operand(a);
            }
            Instr::Binary { dst, a, b, .. } | Instr::Compare { dst, a, b, .. } => {
                reg(dst);
                operand(a);
                operand(b);
            }
            Instr::Iota { dst } => reg(dst),
            Instr::Fused { dst, a, b, c, .. } | Instr::Select { dst, c, a, b } => {
                reg(dst);
                operand(a);
                operand(b);
                operand(c);
            }
            Instr::Reduce { a, .. } => operand(a),
        }
    }

    /// Appends the instruction's words: kind (4 bits), op (8: its index in the op table's
    /// `ALL`, which is its discriminant), destination (16), then operands of 16 bits each; a
    /// fused pair adds a word with its second op, `swap`, `c`, and its scale (bit 48 set when
    /// it has one, its scalar in bits 32–47); a select adds a word with `c`.
    pub(crate) fn encode(self, out: &mut Vec<u64>) {
        let none = Operand::Tile(0);
        let (kind, op, dst, a, b) = match self {
            Instr::Copy { dst, a } => (COPY, 0, dst, a, none),
            Instr::Unary { op, dst, a } => (UNARY, op as u64, dst, a, none),
            Instr::Binary { op, dst, a, b } => (BINARY, op as u64, dst, a, b),
            Instr::Fused {
                first, dst, a, b, ..
            } => (FUSED, first as u64, dst, a, b),
            Instr::Reduce { op, acc, a } => (REDUCE, op as u64, acc, a, none),
            Instr::Compare { op, dst, a, b } => (COMPARE, op as u64, dst, a, b),
            Instr::Select { dst, a, b, .. } => (SELECT, 0, dst, a, b),
            Instr::Iota { dst } => (IOTA, 0, dst, none, none),
        };
        out.push(kind | op << 4 | u64::from(dst) << 12 | a.encode() << 28 | b.encode() << 44);
        match self {
            Instr::Fused {
                then,
                swap,
                c,
                scale,
                ..
            } => {
                let scale = scale.map_or(0, |s| 1 << 48 | u64::from(s) << 32);
                out.push(then as u64 | u64::from(swap) << 8 | c.encode() << 16 | scale);
            }
            Instr::Select { c, .. } => out.push(c.encode()),
            _ => {}
        }
    }

    /// The instruction at the start of `words`, and how many words it takes.
    pub(crate) fn decode(words: &[u64]) -> (Instr, usize) {
        let word = words[0];
        let op = (word >> 4 & 0xff) as usize;
        let dst = (word >> 12) as u16;
        let a = Operand::decode(word >> 28);
        let b = Operand::decode(word >> 44);
        let instr = match word & 0xf {
            COPY => Instr::Copy { dst, a },
            UNARY => Instr::Unary {
                op: UnaryOp::ALL[op],
                dst,
                a,
            },
            BINARY => Instr::Binary {
                op: BinaryOp::ALL[op],
                dst,
                a,
                b,
            },
            FUSED => {
                let more = words[1];
                let instr = Instr::Fused {
                    first: BinaryOp::ALL[op],
                    then: BinaryOp::ALL[(more & 0xff) as usize],
                    swap: more >> 8 & 1 == 1,
                    dst,
                    a,
                    b,
                    c: Operand::decode(more >> 16),
                    scale: (more >> 48 & 1 == 1).then_some((more >> 32) as u16),
                };
                return (instr, 2);
            }
            COMPARE => Instr::Compare {
                op: CompareOp::ALL[op],
                dst,
                a,
                b,
            },
            SELECT => {
                let c = Operand::decode(words[1]);
                return (Instr::Select { dst, c, a, b }, 2);
            }
            IOTA => Instr::Iota { dst },
            _ => Instr::Reduce {
                op: ReduceOp::ALL[op],
                acc: dst,
                a,
            },
        };
        (instr, 1)
    }
}

/// The symbol kernels call the runner by.
pub(crate) const SYMBOL: &str = "kiln_tile_program";

/// `fn(frame: *mut u64, len: i64)`.
pub(crate) type Runner = unsafe extern "C" fn(frame: *mut u64, len: i64);

/// The runner compiled for `isa`, if this CPU has that level.
pub(crate) fn runner(isa: Isa) -> Option<Runner> {
    isa.supported().then(|| entry::table(isa))
}

/// Applies `op` to `data` by a one-instruction program at level `isa`, as a kernel would;
/// false if the CPU lacks the level or the op has no vector body.
pub(crate) fn apply_unary(op: UnaryOp, isa: Isa, data: &mut [f32]) -> bool {
    let Some(run) = runner(isa).filter(|_| has_vector_body(op)) else {
        return false;
    };
    let mut words = Vec::new();
    Instr::Unary {
        op,
        dst: 0,
        a: Operand::Tile(0),
    }
    .encode(&mut words);
    for tile in data.chunks_mut(TILE) {
        let mut frame = [0u64; FRAME_HEADER + 1];
        frame[word::PROGRAM] = words.as_ptr() as u64;
        frame[word::COUNT] = words.len() as u64;
        frame[word::ROWS] = 1;
        frame[word::BUFFERS] = 1;
        frame[word::REGISTERS] = 1;
        frame[word::ROW_LENGTH] = tile.len() as u64;
        frame[FRAME_HEADER] = tile.as_mut_ptr() as u64;
        // SAFETY: the frame names one register of `tile.len()` f32s and no scalars,
        // accumulators or streamed buffers; the CPU has `isa`.
        unsafe { run(frame.as_mut_ptr(), tile.len() as i64) };
    }
    true
}

/// A tile operand as the loops read it.
#[derive(Clone, Copy)]
enum Src {
    Tile(*const f32),
    Scalar(f32),
}

/// `d[i] = f(i)` for `i < n`, in chunks of 64, 16 and 4 elements, then one at a time. Each
/// chunk's results are computed before any is stored, so `d` may be one of the tiles `f`
/// reads; a chunk of a fixed size is a few whole vectors, so a row of 16 costs one 512-bit
/// step, not a loop that only vectorises from 64 elements.
#[inline(always)]
unsafe fn fill(d: *mut f32, n: usize, f: impl Fn(usize) -> f32) {
    let mut i = 0;
    // SAFETY (each chunk): `d` holds `n` elements.
    while i + 64 <= n {
        unsafe { chunk::<64>(d, i, &f) };
        i += 64;
    }
    while i + 16 <= n {
        unsafe { chunk::<16>(d, i, &f) };
        i += 16;
    }
    while i + 4 <= n {
        unsafe { chunk::<4>(d, i, &f) };
        i += 4;
    }
    while i < n {
        // SAFETY: `i < n`.
        unsafe { *d.add(i) = f(i) };
        i += 1;
    }
}

/// `d[at..at + K] = f(at..at + K)`.
#[inline(always)]
unsafe fn chunk<const K: usize>(d: *mut f32, at: usize, f: &impl Fn(usize) -> f32) {
    let mut out = [0.0f32; K];
    for (k, o) in out.iter_mut().enumerate() {
        *o = f(at + k);
    }
    // SAFETY: the caller's `d` holds `at + K` elements.
    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), d.add(at), K) };
}

/// Brings the next tile of the streamed buffers into cache while this one computes: a share
/// of the lines before each instruction, since a burst of them would wait for free line-fill
/// buffers. A prefetch never faults, so past a buffer's end it is harmless.
struct Prefetch {
    /// The next tile's first element, per streamed buffer (the first [`Prefetch::MAX`]).
    next: [*const f32; Prefetch::MAX],
    buffers: usize,
    /// Lines per buffer, and how many are asked for per word of the program.
    lines: usize,
    per_word: usize,
    done: usize,
}

impl Prefetch {
    const LINE: usize = 16;
    /// Buffers prefetched: few programs stream more, and a small array stays in registers.
    const MAX: usize = 8;

    /// Prefetches for the registers of `mask`, whose tiles `tile` gives.
    #[inline(always)]
    fn new(mask: u64, tile: impl Fn(u16) -> *mut f32, n: usize, words: usize) -> Prefetch {
        let mut next = [std::ptr::null(); Self::MAX];
        let mut buffers = 0;
        let mut bits = mask;
        while bits != 0 && buffers < Self::MAX {
            let r = bits.trailing_zeros() as u16;
            bits &= bits - 1;
            next[buffers] = tile(r).wrapping_add(n).cast_const();
            buffers += 1;
        }
        let lines = n.div_ceil(Self::LINE);
        Prefetch {
            next,
            buffers,
            lines,
            per_word: lines.div_ceil(words.max(1)),
            done: 0,
        }
    }

    /// Asks for the share of an instruction of `words` words, so that the last instruction
    /// has asked for every line.
    #[inline(always)]
    fn step(&mut self, words: usize) {
        let end = (self.done + self.per_word * words).min(self.lines);
        for b in &self.next[..self.buffers] {
            for line in self.done..end {
                let at = b.wrapping_add(line * Self::LINE);
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch reads nothing and faults on no address.
                unsafe {
                    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
                    _mm_prefetch::<_MM_HINT_T0>(at as *const i8)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let _ = at;
            }
        }
        self.done = end;
    }
}

/// `d = a`.
#[inline(always)]
unsafe fn copy(d: *mut f32, a: Src, n: usize) {
    // SAFETY: both hold `n` elements (the same ones, when an output shares an input's buffer).
    unsafe {
        match a {
            Src::Tile(p) => std::ptr::copy(p, d, n),
            Src::Scalar(s) => fill(d, n, |_| s),
        }
    }
}

/// `d = f(a)` elementwise, with the operand's kind resolved outside the loop.
#[inline(always)]
unsafe fn map1(d: *mut f32, a: Src, n: usize, f: impl Fn(f32) -> f32) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match a {
            // In place (a program's result written over its operand's tile).
            Src::Tile(p) if std::ptr::eq(p, d) => fill(d, n, |i| f(*d.add(i))),
            Src::Tile(p) => fill(d, n, |i| f(*p.add(i))),
            Src::Scalar(s) => fill(d, n, |_| f(s)),
        }
    }
}

/// `d = f(a, b)` elementwise.
#[inline(always)]
unsafe fn map2(d: *mut f32, a: Src, b: Src, n: usize, f: impl Fn(f32, f32) -> f32) {
    let same = |p: *const f32| std::ptr::eq(p, d);
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match (a, b) {
            (Src::Tile(p), Src::Tile(q)) if same(p) && same(q) => {
                fill(d, n, |i| f(*d.add(i), *d.add(i)))
            }
            (Src::Tile(p), Src::Tile(q)) if same(p) => fill(d, n, |i| f(*d.add(i), *q.add(i))),
            (Src::Tile(p), Src::Tile(q)) if same(q) => fill(d, n, |i| f(*p.add(i), *d.add(i))),
            (Src::Tile(p), Src::Tile(q)) => fill(d, n, |i| f(*p.add(i), *q.add(i))),
            (Src::Tile(p), Src::Scalar(y)) if same(p) => fill(d, n, |i| f(*d.add(i), y)),
            (Src::Tile(p), Src::Scalar(y)) => fill(d, n, |i| f(*p.add(i), y)),
            (Src::Scalar(x), Src::Tile(q)) if same(q) => fill(d, n, |i| f(x, *d.add(i))),
            (Src::Scalar(x), Src::Tile(q)) => fill(d, n, |i| f(x, *q.add(i))),
            (Src::Scalar(x), Src::Scalar(y)) => fill(d, n, |_| f(x, y)),
        }
    }
}

/// x86's `maxps x, y`: `y` unless `x > y` (so `y` on NaN and on equal zeros).
#[inline(always)]
fn maxps(x: f32, y: f32) -> f32 {
    if x > y { x } else { y }
}

#[inline(always)]
fn minps(x: f32, y: f32) -> f32 {
    if x < y { x } else { y }
}

/// The bits below a NaN's quiet bit, where `is_nan` (as an all-ones mask shifted right by 10).
#[inline(always)]
fn nan_fraction(is_nan: bool) -> u32 {
    if is_nan { u32::MAX >> 10 } else { 0 }
}

/// The larger, `+0` over `-0`, NaN if either is (with the NaN's payload cleared): branch-free
/// on `maxps`, so it vectorises.
#[inline(always)]
fn fmax(x: f32, y: f32) -> f32 {
    let (m1, m2) = (maxps(x, y), maxps(y, x));
    let xor = m1.to_bits() ^ m2.to_bits();
    let blended = f32::from_bits(m1.to_bits() | xor);
    let positive = blended - f32::from_bits(xor);
    f32::from_bits(positive.to_bits() & !nan_fraction(blended.is_nan()))
}

/// The smaller, `-0` under `+0`, NaN if either is.
#[inline(always)]
fn fmin(x: f32, y: f32) -> f32 {
    let (m1, m2) = (minps(x, y), minps(y, x));
    let or = m1.to_bits() | m2.to_bits();
    let is_nan = f32::from_bits(or).is_nan() || m2.is_nan();
    let or = or | if is_nan { u32::MAX } else { 0 };
    f32::from_bits(or & !nan_fraction(is_nan))
}

/// `x` where `x > 0` or NaN, else `+0`.
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x <= 0.0 { 0.0 } else { x }
}

/// `±1` by `x`'s sign bit where `x` is nonzero, else `x`.
#[inline(always)]
fn sign(x: f32) -> f32 {
    let one = f32::from_bits(x.to_bits() & 0x8000_0000 | 1.0f32.to_bits());
    if x == 0.0 || x.is_nan() { x } else { one }
}

/// A bool as a tile holds it.
#[inline(always)]
fn truth(b: bool) -> f32 {
    if b { 1.0 } else { 0.0 }
}

/// Runs the frame's program over `len` elements of each register, for each row of the call.
///
/// # Safety
/// `frame` is a frame as the module documents it: each register holds `len` elements from
/// the tile's start in every row (scratch: `rows·len`), the accumulators [`PARTIALS`] f32s
/// per reduction and row; `len` is a multiple of [`PARTIALS`] unless this is a row's last
/// tile; the CPU has the entry's level.
#[inline(always)]
unsafe fn run(frame: *const u64, len: i64) {
    // SAFETY: the header's words, as the function's contract states.
    let h = |k: usize| unsafe { *frame.add(k) };
    let (program, count) = (h(word::PROGRAM) as *const u64, h(word::COUNT) as usize);
    let (scalars, accs) = (
        h(word::SCALARS) as *const f32,
        h(word::PARTIALS) as *mut f32,
    );
    let (start, rows, buffers) = (
        h(word::START) as usize,
        h(word::ROWS) as usize,
        h(word::BUFFERS),
    );
    let per_row = (
        h(word::REGISTERS) as usize,
        h(word::SCALARS_PER_ROW) as usize,
    );
    let reductions = h(word::REDUCTIONS) as usize;
    let ends_row = start + len as usize == h(word::ROW_LENGTH) as usize;
    let registers = frame.wrapping_add(FRAME_HEADER) as *const *mut f32;
    let n = len as usize;
    // Row `i`'s tile of register `r`: a buffer's row from the tile's start, or scratch row `i`.
    let tile_at = |i: usize, r: u16| -> *mut f32 {
        let r = r as usize;
        // SAFETY: the frame has a pointer per register and row (scratch: for row 0).
        unsafe {
            match buffers >> r & 1 {
                1 => (*registers.add(i * per_row.0 + r)).add(start),
                _ => (*registers.add(r)).add(i * n),
            }
        }
    };
    // One row: the next tile of its streamed buffers. Several: rows the next call computes.
    let streamed = if rows == 1 { h(word::STREAMED) } else { 0 };
    let mut prefetch = Prefetch::new(streamed, |r| tile_at(0, r), n, count);
    // SAFETY: the program has `count` words.
    let program = unsafe { std::slice::from_raw_parts(program, count) };
    let mut k = 0;
    while k < count {
        let (instr, words) = Instr::decode(&program[k..]);
        k += words;
        prefetch.step(words);
        for i in 0..rows {
            let tile = |r: u16| tile_at(i, r);
            // SAFETY: row `i`'s scalars and accumulators are the frame's.
            let src = |o: Operand| match o {
                Operand::Tile(r) => Src::Tile(tile(r)),
                Operand::Scalar(s) => unsafe {
                    Src::Scalar(*scalars.add(i * per_row.1 + s as usize))
                },
            };
            let accs = accs.wrapping_add(i * reductions * PARTIALS);
            // SAFETY: the registers hold `n` elements and the accumulators `PARTIALS` per
            // reduction, as the contract states.
            unsafe { execute(instr, tile, src, accs, start, n) };
            if let (Instr::Reduce { op, acc, .. }, true) = (instr, ends_row) {
                // SAFETY: the row's accumulators, as above.
                let partials = unsafe { &mut *(accs.add(acc as usize * PARTIALS) as *mut _) };
                fold(op, partials);
            }
        }
    }
}

/// One instruction over one row's `n` elements.
///
/// # Safety
/// As [`run`]'s, for the row's tiles `tile`, operands `src` and accumulators `accs`.
#[inline(always)]
unsafe fn execute(
    instr: Instr,
    tile: impl Fn(u16) -> *mut f32,
    src: impl Fn(Operand) -> Src,
    accs: *mut f32,
    start: usize,
    n: usize,
) {
    // SAFETY: as the function's contract states.
    unsafe {
        match instr {
            Instr::Copy { dst, a } => copy(tile(dst), src(a), n),
            Instr::Fused {
                first,
                then,
                swap,
                dst,
                a,
                b,
                c,
                scale,
            } => {
                let abc = [src(a), src(b), src(c)];
                let scale = scale.map(|s| match src(Operand::Scalar(s)) {
                    Src::Scalar(x) => x,
                    Src::Tile(_) => unreachable!("a scale is a scalar"),
                });
                fused([first, then], swap, scale, tile(dst), abc, n)
            }
            Instr::Unary { op, dst, a } => unary(op, tile(dst), src(a), n),
            Instr::Binary { op, dst, a, b } => binary(op, tile(dst), src(a), src(b), n),
            Instr::Compare { op, dst, a, b } => compare(op, tile(dst), src(a), src(b), n),
            Instr::Select { dst, c, a, b } => {
                map3(tile(dst), [src(c), src(a), src(b)], n, |c, a, b| {
                    if c != 0.0 { a } else { b }
                })
            }
            Instr::Iota { dst } => fill(tile(dst), n, |i| (start + i) as f32),
            Instr::Reduce { op, acc, a } => {
                let partials = accs.add(acc as usize * PARTIALS);
                if start == 0 {
                    let identity = match op {
                        ReduceOp::Sum | ReduceOp::Mean => 0.0,
                        ReduceOp::Max => f32::NEG_INFINITY,
                        ReduceOp::Min => f32::INFINITY,
                    };
                    std::slice::from_raw_parts_mut(partials, PARTIALS).fill(identity);
                }
                reduce(op, partials, src(a), n)
            }
        }
    }
}

#[inline(always)]
unsafe fn binary(op: BinaryOp, d: *mut f32, a: Src, b: Src, n: usize) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match op {
            BinaryOp::Add => map2(d, a, b, n, |x, y| x + y),
            BinaryOp::Sub => map2(d, a, b, n, |x, y| x - y),
            BinaryOp::Mul => map2(d, a, b, n, |x, y| x * y),
            BinaryOp::Div => map2(d, a, b, n, |x, y| x / y),
            BinaryOp::Max => map2(d, a, b, n, fmax),
            BinaryOp::Min => map2(d, a, b, n, fmin),
            // Bools are 0.0 and 1.0: `and` is their product, `or` their maximum.
            BinaryOp::And => map2(d, a, b, n, |x, y| x * y),
            BinaryOp::Or => map2(d, a, b, n, fmax),
            BinaryOp::Xor => map2(d, a, b, n, |x, y| truth(x != y)),
            // A scalar helper (the op table's `Scalar` vector form), so never in a program.
            BinaryOp::Pow => unreachable!("`pow` is not in tile programs"),
        }
    }
}

#[inline(always)]
unsafe fn compare(op: CompareOp, d: *mut f32, a: Src, b: Src, n: usize) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match op {
            CompareOp::Eq => map2(d, a, b, n, |x, y| truth(x == y)),
            CompareOp::Ne => map2(d, a, b, n, |x, y| truth(x != y)),
            CompareOp::Lt => map2(d, a, b, n, |x, y| truth(x < y)),
            CompareOp::Le => map2(d, a, b, n, |x, y| truth(x <= y)),
            CompareOp::Gt => map2(d, a, b, n, |x, y| truth(x > y)),
            CompareOp::Ge => map2(d, a, b, n, |x, y| truth(x >= y)),
        }
    }
}

/// Gives `$f` the closure of the binary op `$op` (one of [`fusable`]'s) in `$body`.
macro_rules! with_cheap_op {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x: f32, y: f32| x + y;
                $body
            }
            BinaryOp::Sub => {
                let $f = |x: f32, y: f32| x - y;
                $body
            }
            BinaryOp::Mul => {
                let $f = |x: f32, y: f32| x * y;
                $body
            }
            other => unreachable!("`{}` is not fused in tile programs", other.name()),
        }
    };
}

#[inline(always)]
unsafe fn fused(
    ops: [BinaryOp; 2],
    swap: bool,
    scale: Option<f32>,
    d: *mut f32,
    abc: [Src; 3],
    n: usize,
) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        with_cheap_op!(ops[0], |f| with_cheap_op!(
            ops[1],
            |g| match (swap, scale) {
                (false, None) => map3(d, abc, n, |x, y, z| g(f(x, y), z)),
                (true, None) => map3(d, abc, n, |x, y, z| g(z, f(x, y))),
                (false, Some(s)) => map3(d, abc, n, |x, y, z| g(f(x, y), z) * s),
                (true, Some(s)) => map3(d, abc, n, |x, y, z| g(z, f(x, y)) * s),
            }
        ))
    }
}

/// `d = f(a, b, c)` elementwise.
#[inline(always)]
unsafe fn map3(d: *mut f32, abc: [Src; 3], n: usize, f: impl Fn(f32, f32, f32) -> f32) {
    use Src::{Scalar as S, Tile as T};
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match abc {
            [T(p), T(q), T(r)] => fill(d, n, |i| f(*p.add(i), *q.add(i), *r.add(i))),
            [T(p), T(q), S(z)] => fill(d, n, |i| f(*p.add(i), *q.add(i), z)),
            [T(p), S(y), T(r)] => fill(d, n, |i| f(*p.add(i), y, *r.add(i))),
            [T(p), S(y), S(z)] => fill(d, n, |i| f(*p.add(i), y, z)),
            [S(x), T(q), T(r)] => fill(d, n, |i| f(x, *q.add(i), *r.add(i))),
            [S(x), T(q), S(z)] => fill(d, n, |i| f(x, *q.add(i), z)),
            [S(x), S(y), T(r)] => fill(d, n, |i| f(x, y, *r.add(i))),
            [S(x), S(y), S(z)] => fill(d, n, |_| f(x, y, z)),
        }
    }
}

/// Declares, from one list, which unary ops have a vector body and what it is: [`unary`] runs
/// it, and [`has_vector_body`] is what the op table's vector form must agree with (a test
/// checks). Every op is listed, so a new one does not compile until it is decided here.
macro_rules! unary_bodies {
    ($($op:ident => $body:expr,)* ; no body: $($none:ident),*) => {
        /// Whether `op` has a vector body in tile programs.
        pub(crate) fn has_vector_body(op: UnaryOp) -> bool {
            match op {
                $(UnaryOp::$op)|* => true,
                $(UnaryOp::$none)|* => false,
            }
        }

        /// `d = op(a)`; the transcendental functions are `vecmath`'s scalar bodies.
        #[inline(always)]
        unsafe fn unary(op: UnaryOp, d: *mut f32, a: Src, n: usize) {
            // SAFETY: `d` and `a` hold `n` elements.
            unsafe {
                match op {
                    $(UnaryOp::$op => map1(d, a, n, $body),)*
                    $(UnaryOp::$none)|* => {
                        unreachable!("`{}` has no vector body", op.name())
                    }
                }
            }
        }
    };
}

unary_bodies! {
    Neg => |x: f32| -x,
    Abs => f32::abs,
    Sqrt => f32::sqrt,
    Floor => f32::floor,
    Ceil => f32::ceil,
    Round => f32::round_ties_even,
    Recip => |x: f32| 1.0 / x,
    Rsqrt => |x: f32| 1.0 / x.sqrt(),
    Relu => relu,
    Sign => sign,
    // Bools are 0.0 and 1.0.
    Not => |x: f32| 1.0 - x,
    Exp => scalar::exp,
    Log => scalar::log,
    Tanh => scalar::tanh,
    Sigmoid => scalar::sigmoid,
    Softplus => scalar::softplus,
    Erf => scalar::erf,
    ; no body: Sin, Cos
}

/// Combines `n` elements of `a` into the [`PARTIALS`] partial accumulators at `p`: element
/// `i` into partial `i mod 16` (tiles before a row's last are whole trips, so this is the
/// element's position in the row modulo 16).
#[inline(always)]
unsafe fn reduce(op: ReduceOp, p: *mut f32, a: Src, n: usize) {
    // SAFETY: `p` holds `PARTIALS` f32s and `a` `n` elements, and neither overlaps the other.
    let (partials, a) = unsafe {
        let partials = &mut *(p as *mut [f32; PARTIALS]);
        let a = match a {
            Src::Tile(x) => Ok(std::slice::from_raw_parts(x, n)),
            Src::Scalar(s) => Err(s),
        };
        (partials, a)
    };
    let x = match a {
        Ok(x) => x,
        Err(s) => {
            // A row-level value reduced along the row: rare, and in order is simplest.
            for i in 0..n {
                let j = i % PARTIALS;
                partials[j] = combine(op, partials[j], s);
            }
            return;
        }
    };
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            let mut s = *partials;
            let mut rows = x.chunks_exact(PARTIALS);
            for row in &mut rows {
                for (s, x) in s.iter_mut().zip(row) {
                    *s += *x;
                }
            }
            for (s, x) in s.iter_mut().zip(rows.remainder()) {
                *s += *x;
            }
            *partials = s;
        }
        ReduceOp::Max => any_order(partials, x, fmax),
        ReduceOp::Min => any_order(partials, x, fmin),
    }
}

/// A row's total from its partials, in a fixed order — partial `j` with `j + 4`, `j + 8` and
/// `j + 12` in turn, then the four results pairwise — into the first.
fn fold(op: ReduceOp, partials: &mut [f32; PARTIALS]) {
    let lane =
        |j: usize| (1..PARTIALS / 4).fold(partials[j], |x, u| combine(op, x, partials[4 * u + j]));
    let low = combine(op, lane(0), lane(1));
    let high = combine(op, lane(2), lane(3));
    partials[0] = combine(op, low, high);
}

fn combine(op: ReduceOp, acc: f32, x: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => acc + x,
        ReduceOp::Max => fmax(acc, x),
        ReduceOp::Min => fmin(acc, x),
    }
}

/// An order-free reduction (max, min): 64 independent lanes (four 512-bit registers), then
/// folded into the partials. Every access has a constant index, so the lanes stay in
/// registers.
#[inline(always)]
fn any_order(partials: &mut [f32; PARTIALS], x: &[f32], f: impl Fn(f32, f32) -> f32) {
    const LANES: usize = 64;
    let mut m = [partials[0]; LANES];
    let mut rows = x.chunks_exact(LANES);
    for row in &mut rows {
        for (m, x) in m.iter_mut().zip(row) {
            *m = f(*m, *x);
        }
    }
    // A row's last tile (or a short row) may end in a part of 64: its 16s, then the rest.
    let mut parts = rows.remainder().chunks_exact(PARTIALS);
    for part in &mut parts {
        for (m, x) in m.iter_mut().zip(part) {
            *m = f(*m, *x);
        }
    }
    for (m, x) in m.iter_mut().zip(parts.remainder()) {
        *m = f(*m, *x);
    }
    // Halves folded into halves: three steps at full width, not eight in a chain.
    let mut width = LANES;
    while width > PARTIALS {
        width /= 2;
        let (low, high) = m.split_at_mut(width);
        for (m, x) in low.iter_mut().zip(&high[..width]) {
            *m = f(*m, *x);
        }
    }
    for (p, m) in partials.iter_mut().zip(&m) {
        *p = f(*p, *m);
    }
}

/// The runner once per ISA level: the same code, compiled for each level's target features.
mod entry {
    use super::{Isa, Runner, run};

    /// # Safety
    /// As [`run`]'s, with AVX-512F/DQ/VL, AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
    unsafe extern "C" fn avx512(frame: *mut u64, len: i64) {
        // SAFETY: as the function's contract states.
        unsafe { run(frame, len) }
    }

    /// # Safety
    /// As [`run`]'s, with AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe extern "C" fn avx2(frame: *mut u64, len: i64) {
        // SAFETY: as the function's contract states.
        unsafe { run(frame, len) }
    }

    /// The target's baseline: SSE2's 128 bits on x86-64.
    ///
    /// # Safety
    /// As [`run`]'s.
    unsafe extern "C" fn base(frame: *mut u64, len: i64) {
        // SAFETY: as the function's contract states.
        unsafe { run(frame, len) }
    }

    /// The runner of a level this CPU has.
    pub(super) fn table(isa: Isa) -> Runner {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2,
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => base,
            Isa::Base => base,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::VectorForm;

    #[test]
    fn instructions_round_trip_through_their_words() {
        let all = [
            Instr::Copy {
                dst: 3,
                a: Operand::Scalar(2),
            },
            Instr::Unary {
                op: UnaryOp::Tanh,
                dst: 7,
                a: Operand::Tile(1),
            },
            Instr::Binary {
                op: BinaryOp::Min,
                dst: 0x7fff,
                a: Operand::Tile(0x7ffe),
                b: Operand::Scalar(0x7fff),
            },
            Instr::Reduce {
                op: ReduceOp::Mean,
                acc: 4,
                a: Operand::Tile(9),
            },
            Instr::Fused {
                first: BinaryOp::Mul,
                then: BinaryOp::Sub,
                swap: true,
                dst: 5,
                a: Operand::Tile(1),
                b: Operand::Scalar(3),
                c: Operand::Tile(0x7fff),
                scale: None,
            },
            Instr::Fused {
                first: BinaryOp::Add,
                then: BinaryOp::Mul,
                swap: false,
                dst: 0x7fff,
                a: Operand::Scalar(0x7fff),
                b: Operand::Tile(2),
                c: Operand::Scalar(0),
                scale: Some(0x7fff),
            },
            Instr::Compare {
                op: CompareOp::Ge,
                dst: 2,
                a: Operand::Tile(3),
                b: Operand::Scalar(4),
            },
            Instr::Select {
                dst: 6,
                c: Operand::Tile(0x7fff),
                a: Operand::Scalar(1),
                b: Operand::Tile(2),
            },
            Instr::Iota { dst: 0x7ffe },
        ];
        let mut words = Vec::new();
        for i in all {
            i.encode(&mut words);
        }
        let mut k = 0;
        for i in all {
            let (decoded, used) = Instr::decode(&words[k..]);
            assert_eq!(decoded, i);
            k += used;
        }
        assert_eq!(k, words.len());
        // Every op of the tables, by the discriminant the encoding uses as its index.
        let a = Operand::Tile(1);
        let every = (UnaryOp::ALL
            .iter()
            .map(|&op| Instr::Unary { op, dst: 2, a }))
        .chain((BinaryOp::ALL.iter()).map(|&op| Instr::Binary {
            op,
            dst: 2,
            a,
            b: a,
        }))
        .chain((CompareOp::ALL.iter()).map(|&op| Instr::Compare {
            op,
            dst: 2,
            a,
            b: a,
        }))
        .chain((ReduceOp::ALL.iter()).map(|&op| Instr::Reduce { op, acc: 0, a }));
        for i in every {
            let mut words = Vec::new();
            i.encode(&mut words);
            assert_eq!(Instr::decode(&words), (i, 1));
        }
    }

    /// Runs `instr` over tiles 0 and 1 (`x` and `y`), its result in tile 2, at every level.
    fn run_one(instr: Instr, x: &[f32], y: &[f32]) -> Vec<Vec<f32>> {
        let mut words = Vec::new();
        instr.encode(&mut words);
        let (mut x, mut y) = (x.to_vec(), y.to_vec());
        let mut out = Vec::new();
        for isa in Isa::ALL {
            let Some(run) = runner(isa) else { continue };
            let mut d = vec![0.0f32; x.len()];
            let mut frame = [0u64; FRAME_HEADER + 3];
            frame[word::PROGRAM] = words.as_ptr() as u64;
            frame[word::COUNT] = words.len() as u64;
            frame[word::ROWS] = 1;
            frame[word::BUFFERS] = 0b111;
            frame[word::REGISTERS] = 3;
            frame[word::ROW_LENGTH] = x.len() as u64;
            frame[FRAME_HEADER] = x.as_mut_ptr() as u64;
            frame[FRAME_HEADER + 1] = y.as_mut_ptr() as u64;
            frame[FRAME_HEADER + 2] = d.as_mut_ptr() as u64;
            // SAFETY: three registers of `x.len()` elements; no scalars or accumulators.
            unsafe { run(frame.as_mut_ptr(), x.len() as i64) };
            out.push(d);
        }
        out
    }

    /// The op table's vector form says which ops tile programs compute: every op it gives
    /// to them has a body that runs and computes the op (the interpreter's values, within
    /// the approximations' error), at every level the CPU has, with the same bits at each.
    #[test]
    fn the_table_and_the_vector_bodies_agree() {
        use crate::interp::kernels::unary_float_fn;
        let xs: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) / 4.0).collect();
        let ys: Vec<f32> = xs.iter().map(|x| 1.5 - x).collect();
        let (a, b) = (Operand::Tile(0), Operand::Tile(1));
        let same_bits = |outs: &[Vec<f32>]| {
            let bits = |o: &Vec<f32>| o.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            outs.windows(2).all(|w| bits(&w[0]) == bits(&w[1]))
        };
        for &op in UnaryOp::ALL {
            assert_eq!(
                has_vector_body(op),
                op.vector_form() == VectorForm::Tile,
                "`{}`: the table and the bodies differ",
                op.name()
            );
            if !has_vector_body(op) || op == UnaryOp::Not {
                continue;
            }
            let outs = run_one(Instr::Unary { op, dst: 2, a }, &xs, &ys);
            assert!(same_bits(&outs), "`{}` differs between levels", op.name());
            let f = unary_float_fn::<f32>(op).expect("a float function");
            for (x, got) in xs.iter().zip(&outs[0]) {
                let want = f(*x);
                let close = *got == want || (got - want).abs() <= 1e-6 * want.abs().max(1.0);
                assert!(
                    close || (got.is_nan() && want.is_nan()),
                    "{}({x})",
                    op.name()
                );
            }
        }
        for &op in BinaryOp::ALL {
            if op.vector_form() != VectorForm::Tile
                || op.operand_class() != kiln_ir::DTypeClass::Numeric
            {
                continue;
            }
            let outs = run_one(Instr::Binary { op, dst: 2, a, b }, &xs, &ys);
            assert!(same_bits(&outs), "`{}` differs between levels", op.name());
        }
    }

    #[test]
    fn bools_are_zeros_and_ones() {
        let p = [1.0, 0.0, 1.0, 0.0];
        let q = [1.0, 1.0, 0.0, 0.0];
        let (a, b) = (Operand::Tile(0), Operand::Tile(1));
        let binary = |op| run_one(Instr::Binary { op, dst: 2, a, b }, &p, &q)[0].clone();
        assert_eq!(binary(BinaryOp::And), [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(binary(BinaryOp::Or), [1.0, 1.0, 1.0, 0.0]);
        assert_eq!(binary(BinaryOp::Xor), [0.0, 1.0, 1.0, 0.0]);
        let not = run_one(
            Instr::Unary {
                op: UnaryOp::Not,
                dst: 2,
                a,
            },
            &p,
            &q,
        );
        assert_eq!(not[0], [0.0, 1.0, 0.0, 1.0]);
        let xs = [1.0, f32::NAN, -2.0, 3.0];
        let ys = [1.0, 1.0, 5.0, -3.0];
        let compare = |op| run_one(Instr::Compare { op, dst: 2, a, b }, &xs, &ys)[0].clone();
        assert_eq!(compare(CompareOp::Eq), [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(compare(CompareOp::Ne), [0.0, 1.0, 1.0, 1.0]);
        assert_eq!(compare(CompareOp::Lt), [0.0, 0.0, 1.0, 0.0]);
        assert_eq!(compare(CompareOp::Ge), [1.0, 0.0, 0.0, 1.0]);
        // Where `p`, `q`; elsewhere `p` (itself zero there).
        let select = Instr::Select {
            dst: 2,
            c: Operand::Tile(0),
            a: Operand::Tile(1),
            b: Operand::Tile(0),
        };
        assert_eq!(run_one(select, &p, &q)[0], [1.0, 0.0, 0.0, 0.0]);
    }

    /// A block of three rows of five: each row its own buffer rows, scalar and partials, the
    /// scratch rows one after another in the register's tile, each row's sum folded.
    #[test]
    fn a_call_computes_a_block_of_short_rows() {
        let (rows, n) = (3usize, 5usize);
        let x: Vec<f32> = (0..rows * n).map(|i| i as f32).collect();
        let mut y = vec![0.0f32; rows * n];
        let scalars = [10.0f32, 20.0, 30.0];
        let mut partials = [7.0f32; 3 * PARTIALS];
        let mut scratch = vec![0.0f32; TILE];
        // t = x + s (scratch); y = t · t; the sum of t.
        let (t, x_reg, y_reg) = (0u16, 1u16, 2u16);
        let program = [
            Instr::Binary {
                op: BinaryOp::Add,
                dst: t,
                a: Operand::Tile(x_reg),
                b: Operand::Scalar(0),
            },
            Instr::Binary {
                op: BinaryOp::Mul,
                dst: y_reg,
                a: Operand::Tile(t),
                b: Operand::Tile(t),
            },
            Instr::Reduce {
                op: ReduceOp::Sum,
                acc: 0,
                a: Operand::Tile(t),
            },
        ];
        let mut words = Vec::new();
        program.iter().for_each(|i| i.encode(&mut words));
        let mut frame = vec![0u64; FRAME_HEADER + rows * 3];
        frame[word::PROGRAM] = words.as_ptr() as u64;
        frame[word::COUNT] = words.len() as u64;
        frame[word::SCALARS] = scalars.as_ptr() as u64;
        frame[word::PARTIALS] = partials.as_mut_ptr() as u64;
        frame[word::ROWS] = rows as u64;
        frame[word::BUFFERS] = 0b110;
        frame[word::REGISTERS] = 3;
        frame[word::SCALARS_PER_ROW] = 1;
        frame[word::REDUCTIONS] = 1;
        frame[word::ROW_LENGTH] = n as u64;
        frame[FRAME_HEADER + t as usize] = scratch.as_mut_ptr() as u64;
        for i in 0..rows {
            let at = FRAME_HEADER + 3 * i;
            frame[at + x_reg as usize] = x[i * n..].as_ptr() as u64;
            frame[at + y_reg as usize] = y[i * n..].as_mut_ptr() as u64;
        }
        for isa in Isa::ALL {
            let Some(run) = runner(isa) else { continue };
            // SAFETY: the frame's registers hold `n` elements per row (scratch `rows·n`).
            unsafe { run(frame.as_mut_ptr(), n as i64) };
            for i in 0..rows {
                let t: Vec<f32> = (0..n).map(|j| x[i * n + j] + scalars[i]).collect();
                let squares: Vec<f32> = t.iter().map(|t| t * t).collect();
                assert_eq!(y[i * n..(i + 1) * n], squares[..], "{isa:?}, row {i}");
                assert_eq!(
                    partials[i * PARTIALS],
                    t.iter().sum::<f32>(),
                    "{isa:?}, row {i}"
                );
            }
        }
    }

    #[test]
    fn reductions_take_a_rows_last_partial_tile() {
        // 37 elements: two whole trips of 16 and five more, each into partial `i mod 16`.
        let xs: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let mut partials = [0.0f32; PARTIALS];
        // SAFETY: 16 partials and 37 elements.
        unsafe {
            reduce(
                ReduceOp::Sum,
                partials.as_mut_ptr(),
                Src::Tile(xs.as_ptr()),
                37,
            )
        };
        let want: Vec<f32> = (0..16)
            .map(|j| (j..37).step_by(16).map(|i| i as f32).sum())
            .collect();
        assert_eq!(partials.to_vec(), want);
        let mut partials = [f32::NEG_INFINITY; PARTIALS];
        // SAFETY: as above.
        unsafe {
            reduce(
                ReduceOp::Max,
                partials.as_mut_ptr(),
                Src::Tile(xs.as_ptr()),
                37,
            )
        };
        let max = partials.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(max, 36.0);
    }

    #[test]
    fn max_and_min_order_zeros_and_propagate_nans() {
        assert_eq!(fmax(-0.0, 0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(fmax(0.0, -0.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(fmin(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(fmin(0.0, -0.0).to_bits(), (-0.0f32).to_bits());
        assert!(fmax(f32::NAN, 1.0).is_nan() && fmax(1.0, f32::NAN).is_nan());
        assert!(fmin(f32::NAN, 1.0).is_nan() && fmin(1.0, f32::NAN).is_nan());
        assert_eq!(fmax(2.0, -3.0), 2.0);
        assert_eq!(fmin(2.0, -3.0), -3.0);
        assert_eq!(relu(-0.0).to_bits(), 0.0f32.to_bits());
        assert!(relu(f32::NAN).is_nan());
        assert_eq!(sign(-2.5), -1.0);
        assert_eq!(sign(-0.0).to_bits(), (-0.0f32).to_bits());
    }
}
