//! Cranelift code for one stage of a [`KernelPlan`].
//!
//! A stage function loops over rows `begin..end` of its domain (an accumulate stage by columns:
//! over every row, for positions `begin..end` of the last axis); inside a row it runs *inner
//! loops* along the last axis, each computing a group of the stage's values:
//!
//! ```text
//! entry:  buffer pointers, sizes, strides, constants          (Level::Entry)
//! row r:  row indices, row base addresses, row-invariant ops  (Level::Row)
//!         inner loop, f32x4 × UNROLL: loads, ops, stores, vector accumulators
//!         inner loop, scalar tail
//!         reductions finished: registers for the rest of the row
//! ```
//!
//! Every expression is emitted at the outermost level where its inputs are known
//! ([`Gen::hoist`]), and memoised per scope, so a broadcast operand is loaded once per row and
//! a constant once per call. f32 groups are vectorised when every op in them has a vector form;
//! everything else (f64, integers, bool in memory, ops whose table row says `Scalar`) runs scalar.

use super::JitError;
use super::plan::{self, KernelPlan, Mapping, RowRole};
use crate::jit::bodies::Lanes;
use clif::Clif;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, Block, ConstantData, FuncRef, InstBuilder, MemFlagsData, StackSlotData,
    StackSlotKind, Type as ClType, Value as CValue, types,
};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::JITModule;
use cranelift_module::{Linkage, Module};
use kiln_ir::{BinaryOp, CompareOp, DType, Dim, Literal, Op, ReduceOp, UnaryOp, Value, VectorForm};
use reductions::VectorAccs;
use std::collections::{HashMap, HashSet};

mod addresses;
mod clif;
mod elementwise;
mod levels;
mod programs;
mod reductions;
mod stage;
mod values;

/// f32 lanes per vector (Cranelift's vectors are 128-bit on x86_64).
const LANES: i64 = 4;
/// Vector iterations per inner-loop trip.
const UNROLL: i64 = 2;
/// Vector iterations per trip of a loop that reduces: its element `i` goes to partial
/// `i mod 16`, so four independent chains hide the adds' latency.
const REDUCE_UNROLL: i64 = 4;

// An accumulate stage's columns split in runs of `COLUMN_RUN` keep their bits only if every
// run is whole vector steps.
const _: () = assert!(super::COLUMN_RUN as i64 % (LANES * UNROLL) == 0);
const _: () = assert!(super::COLUMN_RUN as i64 % (LANES * REDUCE_UNROLL) == 0);

/// Where an expression can be computed: once per call, once per row, or per element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Entry,
    Row,
    Inner,
}

/// A buffer's stride along one domain axis, in elements.
#[derive(Clone, Copy)]
enum Stride {
    Zero,
    Const(i64),
    Dyn(CValue),
}

#[derive(Clone, PartialEq, Eq, Hash)]
enum Memo {
    /// A value read under a mapping, scalar or vector.
    Value(Value, Mapping, bool),
    /// The address of a buffer's element at the current row and inner position 0.
    Base(usize, Mapping),
}

/// What an inner loop does with a value of its group.
#[derive(Clone, Copy)]
enum Work {
    /// Computes a value of the domain's shape and stores it to its destinations.
    Store(Value),
    /// Reduces the row into a register (then stored to the reduction's destinations).
    Reduce(Value),
    /// Reduces the row into a register, then combines it into the reduction's buffer.
    ReduceInto(Value),
    /// Combines each element into the reduction's buffer.
    Combine(Value),
}

impl Work {
    fn value(self) -> Value {
        match self {
            Work::Store(v) | Work::Reduce(v) | Work::ReduceInto(v) | Work::Combine(v) => v,
        }
    }
}

/// Builds stage `stage` of `plan` into `func`, whose signature is the kernel ABI; with
/// `programs`, vectorised groups whose ops a tile program has run as programs. Returns what
/// its programs compute (their transcendental functions, then "tile program"; none: the code
/// is Cranelift's alone).
pub(crate) fn build_stage(
    module: &mut JITModule,
    func: &mut cranelift_codegen::ir::Function,
    builder_ctx: &mut FunctionBuilderContext,
    plan: &KernelPlan,
    stage: usize,
    programs: bool,
) -> Result<Vec<&'static str>, JitError> {
    let config = module.target_config();
    let mut b = FunctionBuilder::new(func, builder_ctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    b.seal_block(entry);
    let params = b.block_params(entry).to_vec();
    let (buffer_array, size_array, begin, end) = (params[0], params[1], params[2], params[3]);
    let ptr = config.pointer_type();
    let ptr_bytes = ptr.bytes() as i32;
    let buffers = (0..plan.buffer_count())
        .map(|slot| {
            b.ins()
                .load(ptr, flags(), buffer_array, slot as i32 * ptr_bytes)
        })
        .collect();
    let sizes = (0..plan.symbols.len())
        .map(|i| b.ins().load(types::I64, flags(), size_array, i as i32 * 8))
        .collect();
    let status = b.declare_var(types::I32);
    let zero = b.ins().iconst(types::I32, 0);
    b.def_var(status, zero);
    let domain = &plan.stages[stage].domain;
    let dims = if domain.rank() == 0 {
        vec![Dim::Fixed(1)]
    } else {
        domain.0.clone()
    };
    let mut g = Gen {
        b,
        module,
        plan,
        stage,
        dims,
        buffers,
        sizes,
        extents: Vec::new(),
        strides: HashMap::new(),
        status,
        row_index: Vec::new(),
        inner: None,
        columns: None,
        scopes: vec![HashMap::new()],
        levels: HashMap::new(),
        imports: HashMap::new(),
        stash_in: Vec::new(),
        stash_out: Vec::new(),
        programs,
        in_programs: Vec::new(),
    };
    g.extents = g.dims.clone().iter().map(|d| g.extent(d)).collect();
    g.run(begin, end);
    g.b.finalize(config);
    let mut called = g.in_programs;
    called.sort_unstable();
    called.dedup();
    Ok(called)
}

fn flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

fn clif_type(dtype: DType) -> ClType {
    match dtype {
        DType::F32 => types::F32,
        DType::F64 => types::F64,
        DType::I32 => types::I32,
        DType::I64 => types::I64,
        DType::Bool => types::I8,
    }
}

struct Gen<'a, 'f> {
    b: FunctionBuilder<'f>,
    module: &'a mut JITModule,
    plan: &'a KernelPlan,
    stage: usize,
    /// The domain (a scalar domain is `[1]`).
    dims: Vec<Dim>,
    buffers: Vec<CValue>,
    sizes: Vec<CValue>,
    extents: Vec<CValue>,
    strides: HashMap<(usize, Mapping), Vec<Stride>>,
    status: Variable,
    /// The current row's index along each row axis.
    row_index: Vec<CValue>,
    /// The current position along the last axis.
    inner: Option<CValue>,
    /// An accumulate stage by columns: the range of the last axis this call walks.
    columns: Option<(CValue, CValue)>,
    scopes: Vec<HashMap<Memo, CValue>>,
    levels: HashMap<(Value, Mapping), Level>,
    imports: HashMap<String, FuncRef>,
    /// Stashes the current inner loop writes, and those it reads back.
    stash_in: Vec<Stash>,
    stash_out: Vec<Stash>,
    /// Whether vectorised groups may run as tile programs.
    programs: bool,
    /// What the programs so far compute.
    in_programs: Vec<&'static str>,
}

/// A part of a rows stage's work along one row.
enum Segment {
    /// Values sharing one inner loop.
    Group(Vec<Work>),
    /// A value of the row shape, computed once per row.
    Row(Value),
}

/// An expression one inner loop stores in an output's row for the next loop to load.
#[derive(Clone)]
struct Stash {
    value: Value,
    map: Mapping,
    slot: usize,
    slot_map: Mapping,
    /// The segment that computes and stores it, and the one that loads it.
    by: usize,
    for_group: usize,
}

/// A counted loop under construction: the builder is inside its body.
struct Loop {
    var: Variable,
    header: Block,
    exit: Block,
    index: CValue,
}

impl Gen<'_, '_> {
    fn run(&mut self, begin: CValue, end: CValue) {
        self.precompute_strides();
        self.check_empty_reductions();
        if self.plan.stages[self.stage].accumulate {
            self.accumulate(begin, end);
        } else {
            self.rows(begin, end);
        }
        let status = self.b.use_var(self.status);
        self.b.ins().return_(&[status]);
    }

    fn inner_axis(&self) -> u8 {
        (self.dims.len() - 1) as u8
    }

    fn dtype(&self, v: Value) -> DType {
        self.plan.ty(v).dtype
    }

    fn extent(&mut self, d: &Dim) -> CValue {
        match d {
            Dim::Fixed(n) => self.b.ins().iconst(types::I64, *n as i64),
            Dim::Sym(s) => self.sizes[self.plan.symbol_index(s)],
        }
    }
}
