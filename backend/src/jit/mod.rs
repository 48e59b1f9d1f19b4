//! Native kernels with Cranelift.
//!
//! Each kernel function (a `fused` region, as a function of its own) is planned into stages
//! ([`plan`]) and each stage is compiled to one native function ([`codegen`]) with the ABI
//!
//! ```text
//! extern "C" fn(buffers: *const *mut u8, sizes: *const i64, begin: i64, end: i64) -> i32
//! ```
//!
//! `buffers` holds the inputs, outputs and scratch buffers (contiguous, row-major); `sizes`
//! the values of the kernel's symbolic dimensions, so one compiled kernel serves every batch
//! size; `begin..end` the rows (or first-axis indices) to compute, so the executor can split a
//! stage across threads; the result is 0, or a [`Status`] code.
//!
//! The JIT follows one disciplined sequence (declare, build, define, clear, finalise, get the
//! pointer) in one module, reusing its contexts; kernels are cached by their canonical text,
//! so no kernel is compiled twice in a process. `KILN_DEBUG=1` reports each kernel compiled,
//! `2` also prints its Cranelift IR, `3` its machine code.

pub(crate) mod bodies;
pub(crate) mod codegen;
pub(crate) mod plan;
mod shape;
mod symbols;
pub mod tile_program;

use crate::Array;

use cranelift_codegen::Context;
use cranelift_codegen::ir::{AbiParam, UserFuncName, types};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use kiln_ir::{Function, SymbolBindings, Value};
use plan::KernelPlan;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Why a region could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum JitError {
    /// The region uses something kernels do not compile.
    #[error("the kernel compiler does not support {0}")]
    Unsupported(String),
    /// Cranelift failed (a bug in Kiln).
    #[error("Cranelift rejected a kernel: {0}")]
    Codegen(String),
}

/// What a kernel reports instead of trapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// An integer division by zero.
    IntegerDivisionByZero = 1,
    /// A max, min or arg reduction over an empty axis.
    EmptyReduction = 2,
}

impl Status {
    /// The status a kernel returned, if `code` is not success.
    pub fn from_code(code: i32) -> Option<Status> {
        match code {
            1 => Some(Status::IntegerDivisionByZero),
            2 => Some(Status::EmptyReduction),
            _ => None,
        }
    }

    /// What went wrong, in words.
    pub fn message(self) -> &'static str {
        match self {
            Status::IntegerDivisionByZero => "integer division by zero",
            Status::EmptyReduction => "a max or min reduction over an empty axis has no value",
        }
    }
}

/// How a kernel call failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel stopped with a status.
    #[error("{}", .0.message())]
    Status(Status),
    /// The arrays do not fit the kernel's types.
    #[error("{0}")]
    Shape(String),
}

/// A compiled stage's entry point.
pub type StageFn = unsafe extern "C" fn(*const *mut u8, *const i64, i64, i64) -> i32;

/// A compiled kernel: its plan and the native code of each stage.
pub struct Kernel {
    /// The kernel function as given: the types of the arrays it takes and returns.
    pub func: Function,
    /// The plan the kernel was generated from (for the function as [`shape`] reshapes it).
    pub plan: KernelPlan,
    /// The generated code of each stage.
    pub stages: Vec<StageCode>,
    /// Each stage's estimated work per element, to decide when to use more threads.
    pub cost: Vec<i64>,
    /// Machine-code bytes of all stages.
    pub code_size: usize,
}

/// A stage's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Cranelift's code alone (f32x4 lanes).
    Cranelift,
    /// Cranelift's code running its vectorised groups as tile programs (the runner, at the
    /// ISA's width).
    Programs,
}

/// A stage with both codes runs its tile programs on rows of at least this many elements,
/// and Cranelift's code alone on shorter ones, where a runner call per tile costs more than
/// the full width saves (`cargo bench --bench workloads -- paths`, a softmax over 2²⁰
/// elements; figures in BENCHMARKS.md). Elementwise kernels are one long row, so they always
/// take the programs. The rule depends only on the shapes, so a program always runs the same
/// code.
pub const PROGRAMS_MIN_ROW: i64 = 128;

/// One stage's generated code: Cranelift's alone, and, when a vectorised group of the stage
/// is a tile program, a second code that runs it. Calls take the second on rows of at least
/// [`PROGRAMS_MIN_ROW`] elements.
pub struct StageCode {
    /// Cranelift's code alone.
    pub cranelift: StageFn,
    /// The code running tile programs ([`crate::jit::tile_program`]).
    pub programs: Option<StageFn>,
    /// What the programs compute: their transcendental functions by name, then "tile program".
    pub program_ops: Vec<&'static str>,
}

impl StageCode {
    /// The path a call over rows of `row_len` elements takes.
    pub fn path_for(&self, row_len: i64) -> Path {
        match self.programs {
            Some(_) if row_len >= PROGRAMS_MIN_ROW => Path::Programs,
            _ => Path::Cranelift,
        }
    }
}

/// Buffer pointers shared by the threads of one stage, each writing its own rows.
struct SharedBuffers<'a>(&'a [*mut u8]);

// SAFETY: the threads of a stage write disjoint rows (a parallel stage's rows are
// independent) and only read what no thread of the stage writes.
unsafe impl Sync for SharedBuffers<'_> {}

/// A stage splits across threads when it has at least this much work (elements, weighted by
/// the cost of their ops): below it, waking a second thread costs more than it saves. (2¹⁹,
/// down from 2²²: the CNN's and the MLP's half-megabyte activations now split, and their
/// training steps measured 3–10 % faster in alternating runs.)
const PARALLEL_WORK: i64 = 1 << 19;

/// How a stage's work may be divided across threads ([`Kernel::split`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Runs of rows, a thread each.
    Rows,
    /// Runs of columns (of [`COLUMN_RUN`]s), a thread each, every one walking every row.
    Columns,
    /// On one thread.
    Whole,
}

/// An accumulate stage by columns splits into runs of a multiple of this many columns: a
/// multiple of its code's vector step, so that every column falls in the same vector or scalar
/// part of the loop, with the same bits, however the columns are split (and a cache line of
/// f32s, so that where a row's length is a multiple of 16 no two threads share a line).
pub(crate) const COLUMN_RUN: usize = 16;

/// The cost per element from which an accumulate stage by columns splits across threads (two
/// threads, Zen 4): a sum computing `exp(x)·g` as it went (cost 19) halved (`[2048, 1024]`
/// 2.72–2.90 → 1.56–1.92 ms, `[2048, 256]` 0.67–0.70 → 0.36–0.47), while W11's layer-norm
/// gradient sums over `[2048, 256]` (costs 3, 5 and 7) took twice as long split (e.g. 0.23–0.24
/// → 0.40–0.58 ms), a sum of a buffer as it is (cost 2) gained nothing, and one over the buffer
/// the kernel's previous stage wrote lost (0.97–1.05 → 1.08–1.11 ms).
const COLUMN_SPLIT_COST: i64 = 16;

impl Kernel {
    /// How stage `index` may be divided across threads (when it has work enough): by rows; by
    /// columns, an accumulate stage by columns whose operand costs a transcendental function
    /// an element to compute ([`COLUMN_SPLIT_COST`]); or not at all.
    pub fn split(&self, index: usize) -> Split {
        let stage = &self.plan.stages[index];
        match (stage.accumulate, stage.by_columns) {
            (false, _) => Split::Rows,
            (true, true) if self.cost[index] >= COLUMN_SPLIT_COST => Split::Columns,
            _ => Split::Whole,
        }
    }

    /// Runs the kernel on host arrays, allocating its outputs.
    pub fn call(&self, inputs: &[&Array]) -> Result<Vec<Array>, KernelError> {
        self.call_on(inputs, None)
    }

    /// Runs the kernel as [`Kernel::call`] does, every stage on `path` where it has that
    /// code: for comparing the paths.
    pub fn call_with(&self, inputs: &[&Array], path: Path) -> Result<Vec<Array>, KernelError> {
        self.call_on(inputs, Some(path))
    }

    fn call_on(&self, inputs: &[&Array], path: Option<Path>) -> Result<Vec<Array>, KernelError> {
        let func = &self.func;
        if inputs.len() != func.args().len() {
            return Err(KernelError::Shape(format!(
                "the kernel takes {} inputs, {} given",
                func.args().len(),
                inputs.len()
            )));
        }
        let mut bindings = SymbolBindings::new();
        for (&arg, input) in func.args().iter().zip(inputs) {
            let ty = func.value_type(arg);
            if input.dtype() != ty.dtype {
                return Err(KernelError::Shape(format!(
                    "input of type {} where {ty} is expected",
                    input.ty()
                )));
            }
            ty.shape
                .bind(input.shape(), &mut bindings)
                .map_err(|e| KernelError::Shape(e.to_string()))?;
        }
        let sizes = self.sizes(&bindings)?;
        let standard: Vec<Array> = inputs
            .iter()
            .map(|a| (*a).clone().into_standard_layout())
            .collect();
        // Outputs take the given function's shapes; scratch exists only in the plan's.
        let allocate = |func: &Function, v: Value| -> Result<Array, KernelError> {
            let ty = func.value_type(v);
            let shape = ty
                .shape
                .resolve(&bindings)
                .map_err(|s| KernelError::Shape(format!("unbound size {s}")))?;
            Ok(Array::zeros(ty.dtype, &shape))
        };
        let mut outputs = self
            .plan
            .outputs
            .iter()
            .map(|&v| allocate(func, v))
            .collect::<Result<Vec<_>, _>>()?;
        let mut scratch = (0..self.plan.scratch.len())
            .map(|i| {
                let ty = self.plan.scratch_type(i);
                let shape = (ty.shape.resolve(&bindings))
                    .map_err(|s| KernelError::Shape(format!("unbound size {s}")))?;
                Ok(Array::zeros(ty.dtype, &shape))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut buffers: Vec<*mut u8> = standard.iter().map(|a| a.data_ptr().cast_mut()).collect();
        buffers.extend(outputs.iter_mut().map(Array::data_mut_ptr));
        buffers.extend(scratch.iter_mut().map(Array::data_mut_ptr));
        // SAFETY: every buffer is a contiguous array of its value's type under `sizes`, and
        // outputs and scratch are fresh, so nothing overlaps.
        unsafe { self.execute_on(&buffers, &sizes, true, path) }.map_err(KernelError::Status)?;
        Ok(outputs)
    }

    /// The sizes array for symbol bindings.
    pub fn sizes(&self, bindings: &SymbolBindings) -> Result<Vec<i64>, KernelError> {
        (self.plan.symbols.iter())
            .map(|s| {
                bindings.get(s).map(|&n| n as i64).ok_or_else(|| {
                    KernelError::Shape(format!("size {s} is not bound by the inputs"))
                })
            })
            .collect()
    }

    /// Runs every stage, splitting large parallel stages across the team's threads when
    /// `threads` allows.
    ///
    /// # Safety
    /// As for [`Kernel::run_stage`].
    pub unsafe fn execute(
        &self,
        buffers: &[*mut u8],
        sizes: &[i64],
        threads: bool,
    ) -> Result<(), Status> {
        // SAFETY: forwarded from the caller.
        unsafe { self.execute_on(buffers, sizes, threads, None) }
    }

    /// [`Kernel::execute`] with every stage on `path` (where it has that code), or on the
    /// path its row length chooses ([`StageCode::path_for`]).
    ///
    /// # Safety
    /// As for [`Kernel::run_stage`].
    pub unsafe fn execute_on(
        &self,
        buffers: &[*mut u8],
        sizes: &[i64],
        threads: bool,
        path: Option<Path>,
    ) -> Result<(), Status> {
        for (index, stage) in self.plan.stages.iter().enumerate() {
            let rows = stage.rows(&self.plan, sizes);
            let row_len = stage.row_len(&self.plan, sizes);
            let work = rows
                .saturating_mul(row_len)
                .saturating_mul(self.cost[index]);
            let compiled = &self.stages[index];
            let path = path.unwrap_or_else(|| compiled.path_for(row_len));
            let f = match (path, compiled.programs) {
                (Path::Programs, Some(f)) => f,
                _ => compiled.cranelift,
            };
            // The range the stage's code takes (rows, or an accumulate stage's columns), and
            // what its pieces are a multiple of.
            let (len, multiple) = match stage.by_columns {
                true => (row_len, COLUMN_RUN),
                false => (rows, 1),
            };
            let parts = if threads && self.split(index) != Split::Whole && work >= PARALLEL_WORK {
                crate::team::width()
            } else {
                1
            };
            let (chunks, range) = crate::team::pieces(len.max(0) as usize, parts, multiple);
            let code = if chunks <= 1 {
                // SAFETY: forwarded from the caller.
                unsafe { Self::run_stage(f, buffers, sizes, 0, len) }
            } else {
                let shared = SharedBuffers(buffers);
                let first_failure = std::sync::atomic::AtomicI32::new(0);
                crate::team::for_each(chunks, |c| {
                    let shared = &shared;
                    let piece = range(c);
                    let (begin, end) = (piece.start as i64, piece.end as i64);
                    // SAFETY: forwarded from the caller; the chunks' rows (or columns) are
                    // disjoint.
                    let code = unsafe { Self::run_stage(f, shared.0, sizes, begin, end) };
                    if code != 0 {
                        let _ = first_failure.compare_exchange(
                            0,
                            code,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                    }
                });
                first_failure.into_inner()
            };
            if let Some(status) = Status::from_code(code) {
                return Err(status);
            }
        }
        Ok(())
    }

    /// Runs the rows `rows` of a kernel of one rows stage on this thread, on the path its row
    /// length chooses: for a caller that runs the kernel in pieces (a convolution's epilogue,
    /// each run of samples as it is written).
    ///
    /// # Safety
    /// As for [`Kernel::run_stage`].
    pub unsafe fn execute_rows(
        &self,
        buffers: &[*mut u8],
        sizes: &[i64],
        rows: std::ops::Range<i64>,
    ) -> Result<(), Status> {
        debug_assert!(self.plan.stages.len() == 1 && self.split(0) == Split::Rows);
        let row_len = self.plan.stages[0].row_len(&self.plan, sizes);
        let compiled = &self.stages[0];
        let f = match (compiled.path_for(row_len), compiled.programs) {
            (Path::Programs, Some(f)) => f,
            _ => compiled.cranelift,
        };
        // SAFETY: forwarded from the caller.
        let code = unsafe { Self::run_stage(f, buffers, sizes, rows.start, rows.end) };
        Status::from_code(code).map_or(Ok(()), Err)
    }

    /// Runs a stage's code `f` over rows `begin..end`.
    ///
    /// # Safety
    /// `buffers` must point to `plan.buffer_count()` pointers, each to a contiguous buffer of
    /// the size its value's type gives under `sizes` (one entry per symbol of the plan), and
    /// no output or scratch buffer may overlap a buffer a stage reads, except where the
    /// executor established that the stage reads each element before writing it.
    unsafe fn run_stage(
        f: StageFn,
        buffers: &[*mut u8],
        sizes: &[i64],
        begin: i64,
        end: i64,
    ) -> i32 {
        // SAFETY: the one call into generated code. The function was compiled for exactly this
        // ABI, and the caller guarantees the buffers and sizes as documented above.
        unsafe { f(buffers.as_ptr(), sizes.as_ptr(), begin, end) }
    }
}

struct Jit {
    module: JITModule,
    ctx: Context,
    builder: FunctionBuilderContext,
    next_name: u32,
}

// SAFETY: `JITModule` is not `Send` only because it keeps raw code pointers and a `RefCell`
// of symbols; it is only ever used under the `Mutex` below, by one thread at a time.
unsafe impl Send for Jit {}

fn jit() -> &'static Mutex<Jit> {
    static JIT: OnceLock<Mutex<Jit>> = OnceLock::new();
    JIT.get_or_init(|| {
        let mut flags = settings::builder();
        let set = |f: &mut settings::Builder, k: &str, v: &str| {
            f.set(k, v).expect("a known Cranelift setting")
        };
        set(&mut flags, "use_colocated_libcalls", "false");
        set(&mut flags, "is_pic", "false");
        set(&mut flags, "opt_level", "speed");
        let verify = if cfg!(debug_assertions) {
            "true"
        } else {
            "false"
        };
        set(&mut flags, "enable_verifier", verify);
        let isa = cranelift_native::builder()
            .expect("the host is a target Cranelift supports")
            .finish(settings::Flags::new(flags))
            .expect("the host ISA builds");
        let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
        symbols::register_symbols(&mut builder);
        let module = JITModule::new(builder);
        let ctx = module.make_context();
        let builder = FunctionBuilderContext::new();
        Mutex::new(Jit {
            module,
            ctx,
            builder,
            next_name: 0,
        })
    })
}

fn cache() -> &'static Mutex<HashMap<String, Arc<Kernel>>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Kernel>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

static COMPILATIONS: AtomicUsize = AtomicUsize::new(0);

/// How many kernels this process has compiled (cache misses).
pub fn compilations() -> usize {
    COMPILATIONS.load(Ordering::Relaxed)
}

/// Empties the kernel cache, so that the next request for each kernel compiles it again: for
/// measuring compile latency in a warm process. Kernels already handed out keep working (their
/// code stays mapped for the life of the process).
pub fn forget_cached_kernels() {
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
}

/// The compiled kernel for `func` (a function of fusible ops), from the cache when the same
/// kernel text was compiled before.
pub fn kernel(func: &Function) -> Result<Arc<Kernel>, JitError> {
    let key = func.to_string();
    let cached = || {
        cache()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned()
    };
    if let Some(k) = cached() {
        return Ok(k);
    }
    let plan = KernelPlan::new(shape::for_plan(func))?;
    let mut jit = jit().lock().unwrap_or_else(PoisonError::into_inner);
    // Another thread may have compiled it while this one waited for the JIT.
    if let Some(k) = cached() {
        return Ok(k);
    }
    let (stages, code_size) = jit.compile(&plan, func)?;
    drop(jit);
    if crate::settings::debug_level() >= 1 {
        let programs: Vec<String> = (stages.iter().enumerate())
            .filter(|(_, s)| s.programs.is_some())
            .map(|(i, s)| format!("stage {i}: {}", s.program_ops.join(", ")))
            .collect();
        let programs = if programs.is_empty() {
            String::new()
        } else {
            format!(
                "; tile programs ({}) for {}",
                crate::jit::tile_program::isa().name(),
                programs.join("; ")
            )
        };
        eprintln!(
            "kiln: compiled a kernel of {} stages, {code_size} bytes{programs}",
            plan.stages.len()
        );
    }
    COMPILATIONS.fetch_add(1, Ordering::Relaxed);
    let cost = (0..plan.stages.len())
        .map(|s| plan.cost_per_element(s))
        .collect();
    let kernel = Arc::new(Kernel {
        func: func.clone(),
        plan,
        stages,
        cost,
        code_size,
    });
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, kernel.clone());
    Ok(kernel)
}

impl Jit {
    /// Compiles every stage of `plan` — with tile programs first; if the stage has none, that
    /// code is Cranelift's alone, else Cranelift's alone is compiled too — then finalises and
    /// takes the pointers. Returns the stages' code and its total size.
    fn compile(
        &mut self,
        plan: &KernelPlan,
        func: &Function,
    ) -> Result<(Vec<StageCode>, usize), JitError> {
        let programs = crate::jit::tile_program::isa() != crate::jit::tile_program::Isa::Off;
        let mut ids = Vec::new();
        let mut code_size = 0;
        for index in 0..plan.stages.len() {
            let (first, ops) = self.compile_stage(plan, func, index, programs, &mut code_size)?;
            let (cranelift, tiled) = if ops.is_empty() {
                (first, None)
            } else {
                let (plain, _) = self.compile_stage(plan, func, index, false, &mut code_size)?;
                (plain, Some(first))
            };
            ids.push((cranelift, tiled, ops));
        }
        self.module
            .finalize_definitions()
            .map_err(|e| JitError::Codegen(e.to_string()))?;
        let pointer = |id| {
            let code = self.module.get_finalized_function(id);
            // SAFETY: `code` was compiled above with exactly `StageFn`'s signature.
            unsafe { std::mem::transmute::<*const u8, StageFn>(code) }
        };
        let stages = (ids.into_iter())
            .map(|(cranelift, tiled, program_ops)| StageCode {
                cranelift: pointer(cranelift),
                programs: tiled.map(pointer),
                program_ops,
            })
            .collect();
        Ok((stages, code_size))
    }

    /// Declares, builds and defines one code of stage `index`: declare, build, define, clear.
    fn compile_stage(
        &mut self,
        plan: &KernelPlan,
        func: &Function,
        index: usize,
        programs: bool,
        code_size: &mut usize,
    ) -> Result<(FuncId, Vec<&'static str>), JitError> {
        // A failed or interrupted compilation may have left the context dirty.
        self.module.clear_context(&mut self.ctx);
        let mut sig = self.module.make_signature();
        let ptr = self.module.target_config().pointer_type();
        sig.params.extend([
            AbiParam::new(ptr),
            AbiParam::new(ptr),
            AbiParam::new(types::I64),
            AbiParam::new(types::I64),
        ]);
        sig.returns.push(AbiParam::new(types::I32));
        let name = format!("kernel{}", self.next_name);
        self.next_name += 1;
        let id = (self.module.declare_function(&name, Linkage::Local, &sig))
            .map_err(|e| JitError::Codegen(e.to_string()))?;
        self.ctx.func.signature = sig;
        self.ctx.func.name = UserFuncName::user(0, id.as_u32());
        let ops = codegen::build_stage(
            &mut self.module,
            &mut self.ctx.func,
            &mut self.builder,
            plan,
            index,
            programs,
        )?;
        let which = if ops.is_empty() {
            String::new()
        } else {
            format!(" ({})", ops.join(", "))
        };
        if crate::settings::debug_level() >= 2 {
            eprintln!(
                "// kernel stage {index}{which} of:\n{func}{}",
                self.ctx.func.display()
            );
        }
        self.ctx.set_disasm(crate::settings::debug_level() >= 3);
        let defined = self.module.define_function(id, &mut self.ctx);
        *code_size += self
            .ctx
            .compiled_code()
            .map_or(0, |c| c.code_buffer().len());
        if let Some(listing) = self.ctx.compiled_code().and_then(|c| c.vcode.as_ref()) {
            eprintln!("// machine code of kernel stage {index}{which}:\n{listing}");
        }
        self.module.clear_context(&mut self.ctx);
        defined.map_err(|e| JitError::Codegen(format!("{e:?}")))?;
        Ok((id, ops))
    }
}
