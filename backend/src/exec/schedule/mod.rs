//! Scheduling a function for the executor: one step per top-level instruction, the last use
//! of every value, and memory planning — buffer *slots* shared by values whose lifetimes do
//! not overlap, outputs written over a dying input's buffer, and parameters and optimizer
//! state updated in the buffer they were loaded from.
//!
//! By concern: this file makes the steps; [`memory`] plans liveness and slots; [`views`] lets
//! products read and write through views instead of copying; [`pairing`] pairs steps that
//! share work (a pooling's argmax, a convolution's epilogue) and places communication waits.

mod memory;
mod pairing;
mod views;

pub(crate) use pairing::MAX_EPILOGUE_BUFFERS;
use pairing::{pair_epilogues, pair_pooling_argmax, place_waits};
use views::{
    read_products_through_reshapes, read_products_through_views, write_products_through_transposes,
};

use crate::Array;
use crate::jit::{self, Kernel};
use kiln_ir::{
    BuildResult, Conv2dAttrs, ConvKind, DType, Dim, Function, FunctionBuilder, Inst, Literal, Op,
    Pool2dAttrs, PoolKind, Region, Shape, Symbol, Value,
};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// What a step does.
pub(crate) enum StepKind {
    /// A compiled kernel; `symbols[i]` is the schedule's index of the kernel's symbol `i`.
    Kernel {
        kernel: Arc<Kernel>,
        symbols: Vec<usize>,
    },
    /// A float matrix product through the gemm crate.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
        /// How each operand is read from the step's input: through a reshape, a transpose,
        /// or both, with no copy made.
        views: [OperandView; 2],
        /// `Some(perm)`: the step's output is the product transposed (the last axis kept
        /// last); the product writes each matrix into the output seen with its axes permuted
        /// by `perm`, the transpose's inverse.
        written_through: Option<Vec<usize>>,
        /// `Some(scale)`: the result is the third input plus `scale ·` the product (an SGD
        /// update folded into its gradient's product, gemm's `dst = dst + β·a·b`).
        onto: Option<f64>,
    },
    /// A float convolution (or a transpose) through im2col and gemm. `epilogue`: the next
    /// step is a kernel that alone reads the output, run on each run of samples as the
    /// convolution writes it (see [`pair_epilogues`]).
    Conv2d {
        kind: ConvKind,
        attrs: Conv2dAttrs,
        epilogue: bool,
    },
    /// Float pooling (or its gradient) by direct loops. `argmax` pairs a max pooling with a
    /// later gradient of the same input and geometry: the index of the kept argmax the first
    /// records and the second reads.
    Pool2d {
        kind: PoolKind,
        attrs: Pool2dAttrs,
        argmax: Option<usize>,
    },
    /// The same elements, another shape: moved when the input dies here, else copied.
    Reshape,
    /// A constant made once, by the first run (after its memory check: a program may declare
    /// a constant larger than memory), and shared by every run.
    Const {
        value: Literal,
        shape: Vec<usize>,
        made: OnceLock<Arc<Array>>,
    },
    Load {
        state: String,
    },
    /// Stores a value; `recycle` is the value's slot, which the state's previous buffer
    /// fills when the run commits.
    Store {
        state: String,
        recycle: Option<usize>,
    },
    /// `gather`, `scatter_add`, `one_hot`, `transpose`, `concat` or a random draw: a native
    /// loop writing into a planned buffer.
    Native,
    /// An op without regions or state, by the interpreter's kernel for it (no frame).
    InterpreterKernel,
    /// A collective or a message, started on the run's communicator; its results are waited
    /// for by the first step that reads one (`Step::awaits`), so it overlaps the steps between.
    Communicate,
    /// A `while` whose regions run compiled: `cond` and `body` take the carried values, then
    /// `free` (the outer values the regions read, which follow the step's arguments in its
    /// inputs).
    While {
        cond: Arc<super::Executable>,
        body: Arc<super::Executable>,
        free: Vec<Value>,
    },
    /// A `cond` whose branches (then, else) run compiled, each taking `free`.
    Cond {
        branches: [Arc<super::Executable>; 2],
        free: Vec<Value>,
    },
    /// Anything else (custom calls, control flow with state in its regions), by the
    /// reference interpreter.
    Interpret,
}

impl StepKind {
    /// Whether the step writes its outputs into buffers the memory plan gives it (a slot, an
    /// input's or a state's), rather than making them itself.
    fn writes_planned_buffers(&self) -> bool {
        matches!(
            self,
            StepKind::Kernel { .. }
                | StepKind::MatMul { .. }
                | StepKind::Conv2d { .. }
                | StepKind::Pool2d { .. }
                | StepKind::Reshape
                | StepKind::Native
        )
    }
}

/// Where a step's output buffer comes from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Output {
    /// A buffer slot of the arena.
    Slot(usize),
    /// The buffer of input `input`, whose last use this is (the slot it owns passes on).
    InPlace { input: usize, slot: usize },
    /// The buffer of the state loaded as input `input`, which the step's output is stored
    /// back to; `slot` when the buffer turns out to be shared.
    State {
        input: usize,
        state: String,
        slot: usize,
    },
    /// Made by the step itself: interpreter results, loads, constants.
    External,
}

pub(crate) struct Step {
    pub inst: Inst,
    pub kind: StepKind,
    /// Operands, and for interpreted steps the free values of their regions.
    pub inputs: Vec<Value>,
    pub outputs: Vec<Value>,
    pub out: Vec<Output>,
    /// Each output's shape.
    pub shapes: Vec<ShapeRecipe>,
    /// Slots of a kernel's scratch buffers, with their shapes.
    pub scratch: Vec<(usize, ShapeRecipe)>,
    /// Values whose last use this is, with the slot their buffer returns to.
    pub release: Vec<(Value, Option<usize>)>,
    pub fallible: bool,
    /// Communication steps whose results must arrive before this step runs (itself, for one
    /// whose results no step reads).
    pub awaits: Vec<usize>,
}

/// A product's operand as read from its step's input buffer (contiguous, row-major): seen with
/// `shape` (a reshape's, the same elements in the same order) or its own, then with its axes
/// permuted by `perm` (a transpose's: the product reads it through strides).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct OperandView {
    pub shape: Option<ShapeRecipe>,
    pub perm: Option<Vec<usize>>,
}

/// A shape in terms of the schedule's symbols.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ShapeRecipe(pub Vec<DimRecipe>);

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum DimRecipe {
    Fixed(usize),
    Symbol(usize),
}

impl ShapeRecipe {
    pub(crate) fn resolve_into(&self, sizes: &[i64], out: &mut Vec<usize>) {
        out.clear();
        out.extend(self.0.iter().map(|d| match *d {
            DimRecipe::Fixed(n) => n,
            DimRecipe::Symbol(s) => sizes[s] as usize,
        }));
    }
}

pub(crate) struct Schedule {
    pub steps: Vec<Step>,
    /// The dtype of each slot's buffer.
    pub slots: Vec<DType>,
    /// Symbolic sizes, bound from the arguments at each run.
    pub symbols: Vec<Symbol>,
    /// Steps from this index on cannot fail, so they may update state in place.
    pub infallible_from: usize,
    /// Kernels that fell back to the interpreter, and why (for `KILN_DEBUG`).
    pub fallbacks: Vec<String>,
    /// How many argmaxes max poolings keep for their gradients.
    pub kept_argmax: usize,
}

impl Schedule {
    pub(crate) fn new(func: &Function) -> Schedule {
        // The symbols of the values the function defines (a pruned slice keeps the whole
        // graph's arena, whose other values may name symbols no argument binds).
        let mut symbols: Vec<Symbol> = Vec::new();
        let insts = func.walk_insts();
        let defined = (func.args().iter())
            .chain(insts.iter().flat_map(|&i| &func.inst(i).results))
            .chain(
                (insts.iter().flat_map(|&i| &func.inst(i).regions))
                    .flat_map(|&r| &func.region(r).args),
            );
        for &v in defined {
            for s in func.value_type(v).shape.symbols() {
                if !symbols.contains(s) {
                    symbols.push(s.clone());
                }
            }
        }
        let recipe = |shape: &Shape| {
            ShapeRecipe(
                (shape.0.iter())
                    .map(|d| match d {
                        Dim::Fixed(n) => DimRecipe::Fixed(*n),
                        Dim::Sym(s) => DimRecipe::Symbol(
                            symbols
                                .iter()
                                .position(|x| x == s)
                                .expect("a listed symbol"),
                        ),
                    })
                    .collect(),
            )
        };
        let body = func.region(func.body());
        let mut fallbacks = Vec::new();
        let mut steps: Vec<Step> = body
            .insts
            .iter()
            .map(|&inst| {
                let data = func.inst(inst);
                let kind = step_kind(func, inst, &symbols, &mut fallbacks);
                let mut inputs = data.args.clone();
                if let StepKind::While { free, .. } | StepKind::Cond { free, .. } = &kind {
                    inputs.extend(free);
                }
                if matches!(kind, StepKind::Interpret) {
                    for &r in &data.regions {
                        for v in func.free_values(r) {
                            if !inputs.contains(&v) {
                                inputs.push(v);
                            }
                        }
                    }
                }
                let fallible = match &kind {
                    StepKind::Interpret
                    | StepKind::InterpreterKernel
                    | StepKind::Native
                    | StepKind::While { .. }
                    | StepKind::Cond { .. }
                    | StepKind::Communicate => true,
                    StepKind::Kernel { kernel, .. } => kernel.plan.can_fail(),
                    _ => false,
                };
                Step {
                    inst,
                    inputs,
                    outputs: data.results.clone(),
                    out: Vec::new(),
                    shapes: data
                        .results
                        .iter()
                        .map(|&r| recipe(&func.value_type(r).shape))
                        .collect(),
                    scratch: Vec::new(),
                    release: Vec::new(),
                    fallible,
                    awaits: Vec::new(),
                    kind,
                }
            })
            .collect();
        read_products_through_views(func, &mut steps, &recipe);
        write_products_through_transposes(func, &mut steps);
        read_products_through_reshapes(func, &mut steps, &recipe);
        place_waits(&mut steps);
        let infallible_from = steps.iter().rposition(|s| s.fallible).map_or(0, |i| i + 1);
        let kept_argmax = pair_pooling_argmax(&mut steps);
        let mut schedule = Schedule {
            steps: Vec::new(),
            slots: Vec::new(),
            symbols: symbols.clone(),
            infallible_from,
            fallbacks,
            kept_argmax,
        };
        schedule.plan_memory(func, &mut steps, &recipe);
        pair_epilogues(func, &mut steps);
        schedule.steps = steps;
        schedule
    }
}

/// How the executor runs instruction `inst`.
fn step_kind(
    func: &Function,
    inst: Inst,
    symbols: &[Symbol],
    fallbacks: &mut Vec<String>,
) -> StepKind {
    let data = func.inst(inst);
    let kernel_of = |f: Function, fallbacks: &mut Vec<String>| match jit::kernel(&f) {
        Ok(kernel) => {
            let symbols = (kernel.plan.symbols.iter())
                .map(|s| {
                    symbols
                        .iter()
                        .position(|x| x == s)
                        .expect("kernel symbols are the function's")
                })
                .collect();
            StepKind::Kernel { kernel, symbols }
        }
        Err(e) => {
            fallbacks.push(format!("{}: {e}", data.op.name()));
            StepKind::Interpret
        }
    };
    match &data.op {
        Op::Fused => {
            let kernel = region_function(func, data.regions[0], &[], "kernel")
                .expect("a verified kernel region rebuilds");
            kernel_of(kernel, fallbacks)
        }
        Op::Const { value, ty } if value.len() != 1 || ty.shape.is_static() => {
            match ty.shape.as_fixed() {
                Some(shape) if value.len() == 1 || Some(value.len()) == ty.shape.num_elements() => {
                    StepKind::Const {
                        value: value.clone(),
                        shape,
                        made: OnceLock::new(),
                    }
                }
                _ => StepKind::Interpret,
            }
        }
        Op::Reshape { .. } => StepKind::Reshape,
        op if data.results.len() == 1
            && jit::plan::supported(func, op, &data.args, data.results[0]) =>
        {
            kernel_of(single_op_function(func, inst), fallbacks)
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } if func.value_type(data.results[0]).dtype.is_float() => StepKind::MatMul {
            transpose_a: *transpose_a,
            transpose_b: *transpose_b,
            views: Default::default(),
            written_through: None,
            onto: None,
        },
        Op::MatMulAcc {
            transpose_a,
            transpose_b,
            scale,
        } if func.value_type(data.results[0]).dtype.is_float() => StepKind::MatMul {
            transpose_a: *transpose_a,
            transpose_b: *transpose_b,
            views: Default::default(),
            written_through: None,
            onto: Some(scale.0),
        },
        // Channels last, the executor's loops take one group and max pooling of windows of
        // fewer than 255 taps; the interpreter runs the rest.
        Op::Conv2d { attrs, .. } if attrs.channels_last && attrs.groups > 1 => {
            StepKind::InterpreterKernel
        }
        Op::Pool2d {
            kind: PoolKind::Avg | PoolKind::AvgGrad { .. },
            attrs,
        } if attrs.channels_last => StepKind::InterpreterKernel,
        // Channels-last max pooling keeps a window's tap in a byte.
        Op::Pool2d { attrs, .. } if attrs.channels_last && !super::pool::argmax_fits(attrs) => {
            StepKind::InterpreterKernel
        }
        Op::Conv2d { kind, attrs } if func.value_type(data.results[0]).dtype.is_float() => {
            StepKind::Conv2d {
                kind: *kind,
                attrs: *attrs,
                epilogue: false,
            }
        }
        Op::Pool2d { kind, attrs } if func.value_type(data.results[0]).dtype.is_float() => {
            StepKind::Pool2d {
                kind: *kind,
                attrs: *attrs,
                argmax: None,
            }
        }
        Op::OneHot { .. }
        | Op::Gather { .. }
        | Op::UpdateSlice { .. }
        | Op::ScatterAdd { .. }
        | Op::Transpose { .. }
        | Op::Concat { .. }
        | Op::Random { .. } => StepKind::Native,
        Op::Load { state, .. } => StepKind::Load {
            state: state.clone(),
        },
        Op::Store { state } => StepKind::Store {
            state: state.clone(),
            recycle: None,
        },
        Op::Cond | Op::While => super::control::compiled(func, inst).unwrap_or_else(|why| {
            fallbacks.push(format!("{}: {why}", data.op.name()));
            StepKind::Interpret
        }),
        Op::Call { .. } => StepKind::Interpret,
        kiln_ir::communication_op!() => StepKind::Communicate,
        _ => StepKind::InterpreterKernel,
    }
}

/// `region` of `func` as a function of its own named `name`: its arguments, then the outer
/// values `free` it reads, become the function's arguments (`x0…`, `free0…`), and what it
/// yields the results.
pub(crate) fn region_function(
    func: &Function,
    region: Region,
    free: &[Value],
    name: &str,
) -> BuildResult<Function> {
    let data = func.region(region);
    let mut b = FunctionBuilder::new(name);
    let mut remap = HashMap::new();
    for (i, &a) in data.args.iter().enumerate() {
        remap.insert(a, b.arg(&format!("x{i}"), func.value_type(a).clone()));
    }
    for (i, &v) in free.iter().enumerate() {
        remap.insert(v, b.arg(&format!("free{i}"), func.value_type(v).clone()));
    }
    for &i in &data.insts {
        b.clone_inst(func, i, &mut remap)?;
    }
    let results: Vec<Value> = (data.results.iter())
        .map(|v| remap.get(v).copied().unwrap_or(*v))
        .collect();
    b.finish(&results)
}

/// One elementwise (or broadcast, reduction, …) instruction as a kernel function.
fn single_op_function(func: &Function, inst: Inst) -> Function {
    let d = func.inst(inst);
    let mut b = FunctionBuilder::new("kernel");
    let args: Vec<Value> = (d.args.iter().enumerate())
        .map(|(i, &a)| b.arg(&format!("x{i}"), func.value_type(a).clone()))
        .collect();
    let results = b
        .insert(d.op.clone(), &args)
        .expect("a verified instruction rebuilds");
    b.finish(&results).expect("a verified instruction rebuilds")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_of(text: &str) -> Vec<String> {
        let module = kiln_ir::parse_and_verify(text).unwrap();
        let schedule = Schedule::new(&module.functions[0]);
        (schedule.steps.iter())
            .map(|s| match &s.kind {
                StepKind::MatMul { onto, .. } => {
                    format!("matmul onto {:?}", onto.map(|s| s as f32))
                }
                StepKind::Kernel { .. } => "kernel".to_owned(),
                StepKind::Load { .. } => "load".to_owned(),
                StepKind::Store { .. } => "store".to_owned(),
                _ => "other".to_owned(),
            })
            .collect()
    }

    /// A product accumulated onto `w` (the `fold_updates` pass's `matmul_acc`) is one gemm
    /// step writing onto `w`'s buffer.
    #[test]
    fn products_accumulated_onto_a_value_are_one_step() {
        let sgd = "module {
  state @w : f32[4,3] = constant(value=0.5)
  func @f(%x: f32[8,4], %g: f32[8,3]) -> f32[4,3] {
    %w = load @w : f32[4,3]
    %u = matmul_acc %x, %g, %w {transpose_a=true, scale=-0.1} : f32[4,3]
    store @w, %u
    return %u
  }
}";
        assert_eq!(steps_of(sgd), ["load", "matmul onto Some(-0.1)", "store"]);
    }

    /// Attention's heads joined (a product written through a transpose), reshaped for the
    /// next layer and for a weight gradient's product: the product reads the first reshape's
    /// result, and the reshape moves the heads' buffer. With a kernel reading the heads too,
    /// the reshape copies them.
    #[test]
    fn a_reshape_shared_with_products_moves_its_source() {
        const JOINED: &str = "module {
  func @f(%s: f32[2,3,5,5], %v: f32[2,3,5,4], %g: f32[10,7]) -> (f32[2,5,12], f32[12,7]) {
    %c = matmul %s, %v : f32[2,3,5,4]
    %back = transpose %c {perm=[0, 2, 1, 3]} : f32[2,5,3,4]
    %joined = reshape %back : f32[2,5,12]
    %rows = reshape %back : f32[10,12]
    %w = matmul %rows, %g {transpose_a=true} : f32[12,7]
    return %joined, %w
  }
}";
        let reshape_output = |text: &str| {
            let module = kiln_ir::parse_and_verify(text).unwrap();
            let schedule = Schedule::new(&module.functions[0]);
            let steps = &schedule.steps;
            let r = steps
                .iter()
                .position(|s| matches!(s.kind, StepKind::Reshape));
            let r = r.expect("one reshape runs");
            let product_reads = (steps.iter())
                .filter(|s| matches!(s.kind, StepKind::MatMul { .. }))
                .any(|s| s.inputs.contains(&steps[r].outputs[0]));
            (steps[r].out[0].clone(), product_reads)
        };
        let (moved, read) = reshape_output(JOINED);
        assert!(
            matches!(moved, Output::InPlace { input: 0, .. }),
            "{moved:?}"
        );
        assert!(read, "the weight gradient reads the reshape's result");
        let also_added = JOINED
            .replace("f32[12,7]) {", "f32[12,7], f32[2,5,3,4]) {")
            .replace(
                "    return %joined, %w",
                "    %e = exp %back : f32[2,5,3,4]\n    return %joined, %w, %e",
            );
        let (copied, read) = reshape_output(&also_added);
        assert!(matches!(copied, Output::Slot(_)), "{copied:?}");
        assert!(!read);
    }
}
