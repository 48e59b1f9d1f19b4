//! Tile programs: a fused group's per-element work as a short list of whole-tile
//! instructions, run at the ISA's full width by one call of the runner per tile.
//!
//! Cranelift emits nothing wider than 128 bits on x86-64. A kernel's code for long rows
//! hands each vectorised group to [`run`]: each instruction reads and writes whole tiles (a
//! few KiB, in L1), the way numexpr evaluates an expression block by block, so every step runs
//! on 512-bit (or 256-bit) vectors and costs one dispatch per tile, not per element. The
//! runner is compiled once per ISA level ([`Isa`]: AVX-512, AVX2), chosen at run time.
//!
//! An instruction computes each element by the op's one body (`crate::jit::bodies`), the same body
//! Cranelift emits into the kernel for short rows and row tails, so a tile program gives the
//! same bits as the kernel's own code (the tests check it):
//! - elementwise ops and transcendental functions are the bodies, compiled here as plain f32
//!   code that LLVM vectorises at the ISA's width;
//! - bools are masks (all bits set for true), as in Cranelift's vector code: comparisons
//!   write them, selects pick bit by bit, `not`/`and`/`or`/`xor` work on their bits, and a
//!   cast to f32 keeps the bits of `1.0`;
//! - a sum keeps Cranelift's 16 partial sums (element `i` of a tile into partial `i mod 16`,
//!   in order, from zero), each tile's added into 16 f64 totals — Cranelift's loop adds its
//!   partials into f64 totals after each block of a tile's length;
//! - a max or min may combine in any order: it is exact, and its NaN is made canonical when
//!   the row's reduction finishes (on both paths).
//!
//! A call's *frame* is an array of words: the program's address, its length, the scalars'
//! address, the partial accumulators' address, a mask of the buffer registers streamed from
//! row to row (the ones it prefetches), then one pointer per register (a tile of scratch, or
//! a buffer at the tile's first element).
//!
//! Only a program's first instructions read memory beyond L1 and its last ones write it, so
//! a call prefetches the next tile of every buffer: the loads arrive while this tile computes,
//! as they would in a loop that interleaved both.

use crate::jit::bodies::{binary_f32, unary_f32};
use kiln_ir::{BinaryOp, CompareOp, DTypeClass, ReduceOp, UnaryOp};
use std::sync::OnceLock;

/// Partial accumulators per reduction: Cranelift's 4 unrolled f32x4 accumulators of a loop
/// that reduces. Each takes 8 bytes of the frame's accumulators: a sum's are f64 totals, a
/// max's or min's f32s (the first half).
pub(crate) const PARTIALS: usize = 16;

/// Words of a frame before the registers.
pub(crate) const FRAME_HEADER: usize = 5;

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
    /// `dst = a op b` on f32 operands, as a mask: all bits set where it holds (bools are
    /// masks in tiles, as in Cranelift's vector code; `not`, `and`, `or` and `xor` work on
    /// their bits).
    Compare {
        op: CompareOp,
        dst: u16,
        a: Operand,
        b: Operand,
    },
    /// `dst = c ? a : b`, bit by bit under the mask `c`.
    Select {
        dst: u16,
        c: Operand,
        a: Operand,
        b: Operand,
    },
    /// A mask as f32 `1.0`/`0.0` (`to_f32`), or an f32 as the mask of where it is nonzero.
    Cast {
        to_f32: bool,
        dst: u16,
        a: Operand,
    },
}

impl Instr {
    /// The register the instruction writes, if it writes one.
    pub(crate) fn destination(&self) -> Option<u16> {
        let mut instr = *self;
        instr.destination_mut().copied()
    }

    fn destination_mut(&mut self) -> Option<&mut u16> {
        match self {
            Instr::Copy { dst, .. }
            | Instr::Unary { dst, .. }
            | Instr::Binary { dst, .. }
            | Instr::Fused { dst, .. }
            | Instr::Compare { dst, .. }
            | Instr::Select { dst, .. }
            | Instr::Cast { dst, .. } => Some(dst),
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
const CAST: u64 = 7;

impl Operand {
    fn encode(self) -> u64 {
        match self {
            Operand::Tile(r) => u64::from(r),
            Operand::Scalar(s) => u64::from(s | SCALAR_BIT),
        }
    }

    #[inline(always)]
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
    /// The instruction writing register `to` instead.
    pub(crate) fn with_destination(mut self, to: u16) -> Instr {
        if let Some(dst) = self.destination_mut() {
            *dst = to;
        }
        self
    }

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
            Instr::Copy { dst, a } | Instr::Unary { dst, a, .. } | Instr::Cast { dst, a, .. } => {
                reg(dst);
                operand(a);
            }
            Instr::Binary { dst, a, b, .. } | Instr::Compare { dst, a, b, .. } => {
                reg(dst);
                operand(a);
                operand(b);
            }
            Instr::Fused { dst, a, b, c, .. } | Instr::Select { dst, a, b, c } => {
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
    /// it has one, its scalar in bits 32–47); a select adds a word with its mask `c` in bits
    /// 16–31.
    pub(crate) fn encode(self, out: &mut Vec<u64>) {
        let (kind, op, dst, a, b) = match self {
            Instr::Copy { dst, a } => (COPY, 0, dst, a, None),
            Instr::Unary { op, dst, a } => (UNARY, op as u64, dst, a, None),
            Instr::Binary { op, dst, a, b } => (BINARY, op as u64, dst, a, Some(b)),
            Instr::Fused {
                first, dst, a, b, ..
            } => (FUSED, first as u64, dst, a, Some(b)),
            Instr::Reduce { op, acc, a } => (REDUCE, op as u64, acc, a, None),
            Instr::Compare { op, dst, a, b } => (COMPARE, op as u64, dst, a, Some(b)),
            Instr::Select { dst, a, b, .. } => (SELECT, 0, dst, a, Some(b)),
            Instr::Cast { to_f32, dst, a } => (CAST, u64::from(to_f32), dst, a, None),
        };
        let b = b.map_or(0, Operand::encode);
        out.push(kind | op << 4 | u64::from(dst) << 12 | a.encode() << 28 | b << 44);
        if let Instr::Fused {
            then,
            swap,
            c,
            scale,
            ..
        } = self
        {
            let scale = scale.map_or(0, |s| 1 << 48 | u64::from(s) << 32);
            out.push(then as u64 | u64::from(swap) << 8 | c.encode() << 16 | scale);
        }
        if let Instr::Select { c, .. } = self {
            out.push(c.encode() << 16);
        }
    }

    /// The instruction at the start of `words`, and how many words it takes.
    #[inline(always)]
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
            SELECT => {
                let c = Operand::decode(words[1] >> 16);
                return (Instr::Select { dst, c, a, b }, 2);
            }
            COMPARE => Instr::Compare {
                op: CompareOp::ALL[op],
                dst,
                a,
                b,
            },
            CAST => Instr::Cast {
                to_f32: op == 1,
                dst,
                a,
            },
            _ => Instr::Reduce {
                op: ReduceOp::ALL[op],
                acc: dst,
                a,
            },
        };
        (instr, 1)
    }
}

/// The instruction-set level the runner is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// No runner: kernels keep their Cranelift f32x4 code.
    Off,
    /// 256-bit vectors with fused multiply-add.
    Avx2,
    /// 512-bit vectors.
    Avx512,
}

impl Isa {
    /// The level's name, as `KILN_VECTOR_MATH` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Off => "off",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every level, lowest first.
    pub const ALL: [Isa; 3] = [Isa::Off, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the level's runner.
    pub fn supported(self) -> bool {
        match self {
            Isa::Off => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512dq")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }
}

/// The level in use: the best the CPU has, capped by `KILN_VECTOR_MATH` (read once).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let cap = match crate::settings::vector_math_cap() {
            Some("off") => Isa::Off,
            Some("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        (Isa::ALL.into_iter())
            .filter(|&i| i <= cap && i.supported())
            .max()
            .unwrap_or(Isa::Off)
    })
}

/// The symbol kernels call the runner by.
pub(crate) const SYMBOL: &str = "kiln_tile_program";

/// `fn(frame: *mut u64, len: i64)`.
pub(crate) type Runner = unsafe extern "C" fn(frame: *mut u64, len: i64);

/// The runner for `isa`, if it has one.
pub(crate) fn runner(isa: Isa) -> Option<Runner> {
    if !isa.supported() {
        return None;
    }
    entry::table(isa)
}

/// A tile operand as the loops read it.
#[derive(Clone, Copy)]
enum Src {
    Tile(*const f32),
    Scalar(f32),
}

/// `d[i] = f(i)` for `i < n`. A plain counted loop, which LLVM vectorises at the ISA's width
/// behind a check that `d` overlaps none of the pointers `f` reads: a result written over its
/// own operand (an output over its stash) reads `d` itself, which the
/// callers spell as such, so the check passes.
#[inline(always)]
unsafe fn fill(d: *mut f32, n: usize, f: impl Fn(usize) -> f32) {
    for i in 0..n {
        // SAFETY: `d` holds `n` elements.
        unsafe { *d.add(i) = f(i) };
    }
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

    #[inline(always)]
    fn new(mask: u64, registers: *const *mut f32, n: usize, words: usize) -> Prefetch {
        let mut next = [std::ptr::null(); Self::MAX];
        let mut buffers = 0;
        let mut bits = mask;
        while bits != 0 && buffers < Self::MAX {
            let r = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            // SAFETY: the mask names registers of the frame.
            next[buffers] = unsafe { *registers.add(r) }.wrapping_add(n);
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

/// Runs the frame's program over `len` elements of each register.
///
/// # Safety
/// `frame` is a frame as the module documents it, whose registers hold `len` elements each
/// and whose accumulators hold [`PARTIALS`] f64s per reduction; `len` is a multiple of 16
/// where the program reduces.
#[inline(always)]
unsafe fn run(frame: *const u64, len: i64) {
    // SAFETY: as the function's contract states.
    let (program, count, scalars, accs) = unsafe {
        (
            *frame as *const u64,
            *frame.add(1) as usize,
            *frame.add(2) as *const f32,
            *frame.add(3) as *mut f64,
        )
    };
    let registers = frame.wrapping_add(FRAME_HEADER) as *const *mut f32;
    let n = len as usize;
    // SAFETY: the frame has its header, and a register for each bit of the mask.
    let streamed = unsafe { *frame.add(4) };
    let mut prefetch = Prefetch::new(streamed, registers, n, count);
    // SAFETY: the program has `count` words.
    let program = unsafe { std::slice::from_raw_parts(program, count) };
    let mut k = 0;
    while k < count {
        let (instr, words) = Instr::decode(&program[k..]);
        k += words;
        prefetch.step(words);
        // SAFETY: the program's registers and scalars are the frame's; the registers hold `n`
        // elements and the accumulators `PARTIALS` per reduction, as the contract states.
        unsafe {
            let tile = |r: u16| *registers.add(r as usize);
            let src = |o: Operand| match o {
                Operand::Tile(r) => Src::Tile(tile(r)),
                Operand::Scalar(s) => Src::Scalar(*scalars.add(s as usize)),
            };
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
                    let scale = scale.map(|s| *scalars.add(s as usize));
                    fused([first, then], swap, scale, tile(dst), abc, n)
                }
                Instr::Unary {
                    op: UnaryOp::Not,
                    dst,
                    a,
                } => map1(tile(dst), src(a), n, |x| bits(!x.to_bits())),
                Instr::Unary { op, dst, a } => unary(op, tile(dst), src(a), n),
                Instr::Binary { op, dst, a, b } if op.operand_class() == DTypeClass::Bool => {
                    mask_logic(op, tile(dst), src(a), src(b), n)
                }
                Instr::Binary { op, dst, a, b } => binary(op, tile(dst), src(a), src(b), n),
                Instr::Compare { op, dst, a, b } => compare(op, tile(dst), src(a), src(b), n),
                Instr::Select { dst, c, a, b } => {
                    let cab = [src(c), src(a), src(b)];
                    map3(tile(dst), cab, n, |c, x, y| {
                        let c = c.to_bits();
                        bits(c & x.to_bits() | !c & y.to_bits())
                    })
                }
                Instr::Cast { to_f32, dst, a } => match to_f32 {
                    true => map1(tile(dst), src(a), n, |x| bits(x.to_bits() & ONE)),
                    false => map1(tile(dst), src(a), n, |x| mask(x != 0.0)),
                },
                Instr::Reduce { op, acc, a } => {
                    reduce(op, accs.add(acc as usize * PARTIALS), src(a), n)
                }
            }
        }
    }
}

/// The bits of `1.0`, what a mask cast to f32 keeps.
const ONE: u32 = 0x3f80_0000;

#[inline(always)]
fn bits(x: u32) -> f32 {
    f32::from_bits(x)
}

/// A bool as a mask: all bits set for true.
#[inline(always)]
fn mask(b: bool) -> f32 {
    bits(if b { u32::MAX } else { 0 })
}

/// `d = a op b` on f32 operands, as masks.
#[inline(always)]
unsafe fn compare(op: CompareOp, d: *mut f32, a: Src, b: Src, n: usize) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match op {
            CompareOp::Eq => map2(d, a, b, n, |x, y| mask(x == y)),
            CompareOp::Ne => map2(d, a, b, n, |x, y| mask(x != y)),
            CompareOp::Lt => map2(d, a, b, n, |x, y| mask(x < y)),
            CompareOp::Le => map2(d, a, b, n, |x, y| mask(x <= y)),
            CompareOp::Gt => map2(d, a, b, n, |x, y| mask(x > y)),
            CompareOp::Ge => map2(d, a, b, n, |x, y| mask(x >= y)),
        }
    }
}

/// `d = a op b` for the bool ops, bit by bit on masks.
#[inline(always)]
unsafe fn mask_logic(op: BinaryOp, d: *mut f32, a: Src, b: Src, n: usize) {
    // SAFETY: the tiles hold `n` elements.
    unsafe {
        match op {
            BinaryOp::And => map2(d, a, b, n, |x, y| bits(x.to_bits() & y.to_bits())),
            BinaryOp::Or => map2(d, a, b, n, |x, y| bits(x.to_bits() | y.to_bits())),
            BinaryOp::Xor => map2(d, a, b, n, |x, y| bits(x.to_bits() ^ y.to_bits())),
            _ => unreachable!("`{}` is not a bool op", op.name()),
        }
    }
}

/// `d = op(a, b)` by the op's body, one arm per op of the table so that each body is inlined
/// with its op known. (`pow` and the bool ops have no f32 body and are never in a program.)
macro_rules! binary_bodies {
    ($(#[$meta:meta])* $enum:ident { $($variant:ident = $text:literal, $($_rest:ident),*;)* }) => {
        #[inline(always)]
        unsafe fn binary(op: BinaryOp, d: *mut f32, a: Src, b: Src, n: usize) {
            match op {
                $(BinaryOp::$variant => {
                    // SAFETY: the tiles hold `n` elements.
                    unsafe { map2(d, a, b, n, |x, y| binary_f32(BinaryOp::$variant, x, y)) }
                })*
            }
        }
    };
}
kiln_ir::with_binary_ops!(binary_bodies);

/// Gives `$f` the closure of the binary op `$op` (one of [`fusable`]'s) in `$body`.
macro_rules! with_cheap_op {
    ($op:expr, |$f:ident| $body:expr) => {
        match $op {
            BinaryOp::Add => {
                let $f = |x, y| binary_f32(BinaryOp::Add, x, y);
                $body
            }
            BinaryOp::Sub => {
                let $f = |x, y| binary_f32(BinaryOp::Sub, x, y);
                $body
            }
            BinaryOp::Mul => {
                let $f = |x, y| binary_f32(BinaryOp::Mul, x, y);
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

/// `d = op(a)` by the op's body, one arm per op of the table (as [`binary`]). (`sin`, `cos`
/// and `not` have no f32 body and are never in a program.)
macro_rules! unary_bodies {
    ($(#[$meta:meta])* $enum:ident { $($variant:ident = $text:literal, $($_rest:ident),*;)* }) => {
        #[inline(always)]
        unsafe fn unary(op: UnaryOp, d: *mut f32, a: Src, n: usize) {
            match op {
                $(UnaryOp::$variant => {
                    // SAFETY: the tiles hold `n` elements.
                    unsafe { map1(d, a, n, |x| unary_f32(UnaryOp::$variant, x)) }
                })*
            }
        }
    };
}
kiln_ir::with_unary_ops!(unary_bodies);

/// Combines the tile's `n` elements of `a` into the [`PARTIALS`] accumulators at `p`: a sum's
/// 16 f32 partials of the tile into its f64 totals, a max's or min's into its f32 partials.
#[inline(always)]
unsafe fn reduce(op: ReduceOp, p: *mut f64, a: Src, n: usize) {
    debug_assert_eq!(n % PARTIALS, 0, "a reducing loop's tiles are whole trips");
    // SAFETY: `p` holds `PARTIALS` f64s and `a` `n` elements, and neither overlaps the other.
    let a = unsafe {
        match a {
            Src::Tile(x) => Ok(std::slice::from_raw_parts(x, n)),
            Src::Scalar(s) => Err(s),
        }
    };
    if let ReduceOp::Sum | ReduceOp::Mean = op {
        // In order from zero, element `i` into partial `i mod 16`: the bits of Cranelift's
        // loop over a block.
        let mut s = [0.0f32; PARTIALS];
        match a {
            Ok(x) => {
                for row in x.chunks_exact(PARTIALS) {
                    for (s, x) in s.iter_mut().zip(row) {
                        *s += *x;
                    }
                }
            }
            // A row-level value reduced along the row: rare, and in order is simplest.
            Err(x) => (0..n).for_each(|i| s[i % PARTIALS] += x),
        }
        // SAFETY: as above; the partials are f64 totals.
        let totals = unsafe { &mut *(p as *mut [f64; PARTIALS]) };
        for (total, s) in totals.iter_mut().zip(s) {
            *total += f64::from(s);
        }
        return;
    }
    // SAFETY: as above; a max's or min's partials are f32s, in the first half.
    let partials = unsafe { &mut *(p as *mut [f32; PARTIALS]) };
    match a {
        Ok(x) => match op {
            ReduceOp::Min => any_order(partials, x, |x, y| binary_f32(BinaryOp::Min, x, y)),
            _ => any_order(partials, x, |x, y| binary_f32(BinaryOp::Max, x, y)),
        },
        Err(s) => {
            for i in 0..n {
                let j = i % PARTIALS;
                partials[j] = combine(op, partials[j], s);
            }
        }
    }
}

fn combine(op: ReduceOp, acc: f32, x: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => acc + x,
        ReduceOp::Max => binary_f32(BinaryOp::Max, acc, x),
        ReduceOp::Min => binary_f32(BinaryOp::Min, acc, x),
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
    for part in rows.remainder().chunks_exact(PARTIALS) {
        for (m, x) in m.iter_mut().zip(part) {
            *m = f(*m, *x);
        }
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

#[cfg(target_arch = "x86_64")]
mod entry {
    use super::{Isa, Runner, run};

    /// # Safety
    /// As [`run`]'s, with AVX-512F/DQ/VL, AVX2 and FMA.
    #[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
    unsafe extern "C" fn avx512(frame: *mut u64, len: i64) {
        // SAFETY: as the function's contract states.
        unsafe { run(frame, len) }
    }

    /// # Safety
    /// As [`run`]'s, with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    unsafe extern "C" fn avx2(frame: *mut u64, len: i64) {
        // SAFETY: as the function's contract states.
        unsafe { run(frame, len) }
    }

    pub(super) fn table(isa: Isa) -> Option<Runner> {
        match isa {
            Isa::Avx512 => Some(avx512),
            Isa::Avx2 => Some(avx2),
            Isa::Off => None,
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod entry {
    use super::{Isa, Runner};

    pub(super) fn table(_: Isa) -> Option<Runner> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Instr::Select {
                dst: 0x7fff,
                c: Operand::Scalar(0x7fff),
                a: Operand::Tile(0x7ffe),
                b: Operand::Scalar(1),
            },
            Instr::Cast {
                to_f32: true,
                dst: 6,
                a: Operand::Tile(0x7fff),
            },
            Instr::Cast {
                to_f32: false,
                dst: 0,
                a: Operand::Scalar(4),
            },
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
        .chain((ReduceOp::ALL.iter()).map(|&op| Instr::Reduce { op, acc: 0, a }))
        .chain((CompareOp::ALL.iter()).map(|&op| Instr::Compare {
            op,
            dst: 3,
            a,
            b: Operand::Scalar(0x7fff),
        }));
        for i in every {
            let mut words = Vec::new();
            i.encode(&mut words);
            assert_eq!(Instr::decode(&words), (i, 1));
        }
    }
}
