//! Building functions in Rust code.
//!
//! Every op is typed as it is added, so a shape error surfaces where the op was built: the
//! error names the op, the operand types and the caller's source line (through
//! `#[track_caller]`). Elementwise ops broadcast NumPy-style by inserting explicit `broadcast`
//! ops, so the IR itself only ever sees operands of one shape.

use crate::entities::{Inst, Region, Value};
use crate::function::{Function, ValueDef};
use crate::infer::{RegionTypes, TypeError, infer};
use crate::literal::Literal;
use crate::loc::Loc;
use crate::module::StateDecl;
use crate::op::{
    AllReduceOp, ArgOp, AxisSlice, BinaryOp, CompareOp, Distribution, F64Attr, Op, ReduceOp,
    UnaryOp,
};
use crate::types::{DType, Shape, Type};
use crate::window::{Conv2dAttrs, ConvKind, Pool2dAttrs, PoolKind};
use std::collections::{HashMap, HashSet};

/// `name` made a valid name for the text form: characters other than ASCII letters, digits,
/// `_` (and `.` when `dots`, as value and state names allow) become `_`, and `prefix` goes in
/// front of a name that does not start with a letter or `_`.
pub fn identifier(name: &str, dots: bool, prefix: &str) -> String {
    let kept = |c: char| c.is_ascii_alphanumeric() || c == '_' || (dots && c == '.');
    let base: String = name
        .chars()
        .map(|c| if kept(c) { c } else { '_' })
        .collect();
    match base.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        true => base,
        false => format!("{prefix}{base}"),
    }
}

/// An op that could not be built, and where the attempt was made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error} (built at {loc})")]
pub struct BuildError {
    /// What is wrong: the op and the message.
    pub error: TypeError,
    /// The line of the caller that built the op (or the text position, when parsed).
    pub loc: Loc,
}

/// The result of a builder call.
pub type BuildResult<T> = Result<T, BuildError>;

/// Builds one function. Values defined inside a region are visible only until that region
/// closes; the builder rejects uses that would break SSA dominance.
#[derive(Clone)]
pub struct FunctionBuilder {
    func: Function,
    /// Regions being built, outermost (the function body) first.
    open: Vec<Region>,
    defined_in: HashMap<Value, Region>,
    names: HashSet<String>,
}

impl FunctionBuilder {
    /// A builder for a new function named `name`, with no arguments yet.
    pub fn new(name: impl Into<String>) -> FunctionBuilder {
        let func = Function::new(name);
        let body = func.body();
        FunctionBuilder {
            func,
            open: vec![body],
            defined_in: HashMap::new(),
            names: HashSet::new(),
        }
    }

    /// Continues building `func`: new ops are appended to its body, which can use the body's
    /// arguments and results; names stay unique across old and new values.
    pub fn resume(func: Function) -> FunctionBuilder {
        let body = func.body();
        let mut defined_in = HashMap::new();
        for &v in func.args() {
            defined_in.insert(v, body);
        }
        for &inst in &func.region(body).insts {
            for &v in &func.inst(inst).results {
                defined_in.insert(v, body);
            }
        }
        let names = func
            .all_values()
            .filter_map(|(_, data)| data.name.clone())
            .collect();
        FunctionBuilder {
            func,
            open: vec![body],
            defined_in,
            names,
        }
    }

    /// The function, keeping the results it already has.
    pub fn into_function(self) -> Function {
        self.func
    }

    /// The function as built so far.
    pub fn function(&self) -> &Function {
        &self.func
    }

    /// The type of `v`.
    pub fn value_type(&self, v: Value) -> &Type {
        self.func.value_type(v)
    }

    /// Adds a function argument (a feed).
    pub fn arg(&mut self, name: &str, ty: Type) -> Value {
        let body = self.func.body();
        let v = self.func.append_region_arg(body, ty, None);
        self.defined_in.insert(v, body);
        self.set_name(v, name);
        v
    }

    /// Names a value for the text form. Characters other than letters, digits, `_` and `.`
    /// become `_`, and a taken name gets a suffix, so names stay valid and unique.
    pub fn set_name(&mut self, v: Value, name: &str) -> Value {
        let base = identifier(name, true, "_");
        let mut unique = base.clone();
        let mut n = 1;
        while self.names.contains(&unique) {
            unique = format!("{base}_{n}");
            n += 1;
        }
        if let Some(old) = self.func.value_name(v) {
            self.names.remove(old);
        }
        self.names.insert(unique.clone());
        self.func.set_value_name(v, Some(unique));
        v
    }

    /// Finishes the function, returning `results`.
    #[track_caller]
    pub fn finish(mut self, results: &[Value]) -> BuildResult<Function> {
        let loc = Loc::caller();
        self.check_visible("return", results, loc)?;
        let body = self.func.body();
        let types = results
            .iter()
            .map(|&v| self.func.value_type(v).clone())
            .collect();
        self.func.set_region_results(body, results.to_vec());
        self.func.set_result_types(types);
        Ok(self.func)
    }

    /// Adds `op` applied to `args` in the innermost open region and returns its results.
    #[track_caller]
    pub fn insert(&mut self, op: Op, args: &[Value]) -> BuildResult<Vec<Value>> {
        self.insert_at(op, args, Vec::new(), Loc::caller())
    }

    /// Like [`FunctionBuilder::insert`] for an op with exactly one result.
    #[track_caller]
    pub fn insert1(&mut self, op: Op, args: &[Value]) -> BuildResult<Value> {
        let loc = Loc::caller();
        let name = op.name();
        let results = self.insert_at(op, args, Vec::new(), loc)?;
        match results[..] {
            [v] => Ok(v),
            _ => Err(self.error(name, format!("has {} results, not one", results.len()), loc)),
        }
    }

    fn insert_at(
        &mut self,
        op: Op,
        args: &[Value],
        regions: Vec<Region>,
        loc: Loc,
    ) -> BuildResult<Vec<Value>> {
        self.check_visible(op.name(), args, loc)?;
        let arg_types: Vec<&Type> = args.iter().map(|&v| self.func.value_type(v)).collect();
        let region_types: Vec<RegionTypes<'_>> = regions
            .iter()
            .map(|&r| {
                let data = self.func.region(r);
                RegionTypes {
                    args: data.args.iter().map(|&v| self.func.value_type(v)).collect(),
                    results: data
                        .results
                        .iter()
                        .map(|&v| self.func.value_type(v))
                        .collect(),
                }
            })
            .collect();
        let result_types =
            infer(&op, &arg_types, &region_types).map_err(|error| BuildError { error, loc })?;
        let inst = self
            .func
            .create_inst(op, args.to_vec(), result_types, regions, loc);
        let region = *self.open.last().expect("the body region is always open");
        self.func.append_inst(region, inst);
        let results = self.func.inst(inst).results.clone();
        for &v in &results {
            self.defined_in.insert(v, region);
        }
        Ok(results)
    }

    fn error(&self, op: &'static str, message: String, loc: Loc) -> BuildError {
        BuildError {
            error: TypeError { op, message },
            loc,
        }
    }

    fn check_visible(&self, op: &'static str, values: &[Value], loc: Loc) -> BuildResult<()> {
        for &v in values {
            let visible = self
                .defined_in
                .get(&v)
                .is_some_and(|r| self.open.contains(r));
            if !visible {
                return Err(self.error(
                    op,
                    format!(
                        "operand {v} is not visible here: it was defined in a region that is \
                         closed, or by another function"
                    ),
                    loc,
                ));
            }
        }
        Ok(())
    }

    // ----- elementwise -----

    /// `op(x)`, elementwise.
    #[track_caller]
    pub fn unary(&mut self, op: UnaryOp, x: Value) -> BuildResult<Value> {
        self.insert1(Op::Unary(op), &[x])
    }

    /// `op(a, b)` with NumPy broadcasting; the dtypes must already agree.
    #[track_caller]
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> BuildResult<Value> {
        let loc = Loc::caller();
        let args = self.broadcast_all(op.name(), &[a, b], loc)?;
        self.insert_at(Op::Binary(op), &args, Vec::new(), loc)
            .map(|r| r[0])
    }

    /// The comparison `op(a, b)`, elementwise with NumPy broadcasting; the result is bool.
    #[track_caller]
    pub fn compare(&mut self, op: CompareOp, a: Value, b: Value) -> BuildResult<Value> {
        let loc = Loc::caller();
        let args = self.broadcast_all(op.name(), &[a, b], loc)?;
        self.insert_at(Op::Compare(op), &args, Vec::new(), loc)
            .map(|r| r[0])
    }

    /// `cond ? on_true : on_false`, elementwise, all three broadcast together.
    #[track_caller]
    pub fn select(&mut self, cond: Value, on_true: Value, on_false: Value) -> BuildResult<Value> {
        let loc = Loc::caller();
        let args = self.broadcast_all("select", &[cond, on_true, on_false], loc)?;
        self.insert_at(Op::Select, &args, Vec::new(), loc)
            .map(|r| r[0])
    }

    /// Broadcasts `values` to their common NumPy shape, inserting `broadcast` ops where needed.
    fn broadcast_all(
        &mut self,
        op: &'static str,
        values: &[Value],
        loc: Loc,
    ) -> BuildResult<Vec<Value>> {
        self.check_visible(op, values, loc)?;
        let mut shape = Shape::scalar();
        for &v in values {
            let s = &self.func.value_type(v).shape;
            shape = Shape::broadcast(&shape, s).ok_or_else(|| {
                let types: Vec<String> = values
                    .iter()
                    .map(|&v| self.func.value_type(v).to_string())
                    .collect();
                self.error(
                    op,
                    format!("operand shapes do not broadcast: {}", types.join(", ")),
                    loc,
                )
            })?;
        }
        values
            .iter()
            .map(|&v| self.broadcast_to_at(v, &shape, loc))
            .collect()
    }

    /// A scalar constant of `dtype`.
    #[track_caller]
    pub fn scalar(&mut self, dtype: DType, value: f64) -> BuildResult<Value> {
        self.constant(Literal::scalar(dtype, value), Type::scalar(dtype))
    }

    /// A constant of type `ty`: one element (a splat) or all of them, row-major.
    #[track_caller]
    pub fn constant(&mut self, value: Literal, ty: Type) -> BuildResult<Value> {
        self.insert1(Op::Const { value, ty }, &[])
    }

    // ----- layout -----

    /// `x` converted to `to`; floats to integers saturate (NaN gives 0).
    #[track_caller]
    pub fn cast(&mut self, x: Value, to: DType) -> BuildResult<Value> {
        if self.func.value_type(x).dtype == to {
            return Ok(x);
        }
        self.insert1(Op::Cast { to }, &[x])
    }

    /// `x` broadcast to `shape`; `x` itself when it already has that shape.
    #[track_caller]
    pub fn broadcast_to(&mut self, x: Value, shape: &Shape) -> BuildResult<Value> {
        self.broadcast_to_at(x, shape, Loc::caller())
    }

    fn broadcast_to_at(&mut self, x: Value, shape: &Shape, loc: Loc) -> BuildResult<Value> {
        if self.func.value_type(x).shape == *shape {
            return Ok(x);
        }
        let op = Op::Broadcast {
            shape: shape.clone(),
        };
        self.insert_at(op, &[x], Vec::new(), loc).map(|r| r[0])
    }

    /// The same elements, row-major, in `shape` (the element counts must agree).
    #[track_caller]
    pub fn reshape(&mut self, x: Value, shape: Shape) -> BuildResult<Value> {
        if self.func.value_type(x).shape == shape {
            return Ok(x);
        }
        self.insert1(Op::Reshape { shape }, &[x])
    }

    /// The axes of `x` permuted: result axis `i` is axis `perm[i]` of `x`.
    #[track_caller]
    pub fn transpose(&mut self, x: Value, perm: Vec<usize>) -> BuildResult<Value> {
        self.insert1(Op::Transpose { perm }, &[x])
    }

    /// A range of each axis (`AxisSlice::Full` keeps an axis whole).
    #[track_caller]
    pub fn slice(&mut self, x: Value, axes: Vec<AxisSlice>) -> BuildResult<Value> {
        self.insert1(Op::Slice { axes }, &[x])
    }

    /// Zero padding before (`low`), after (`high`) and between (`interior`) elements.
    #[track_caller]
    pub fn pad(
        &mut self,
        x: Value,
        low: Vec<usize>,
        high: Vec<usize>,
        interior: Vec<usize>,
    ) -> BuildResult<Value> {
        let op = Op::Pad {
            low,
            high,
            interior,
        };
        self.insert1(op, &[x])
    }

    /// `xs` joined along `axis`; their other dimensions must agree.
    #[track_caller]
    pub fn concat(&mut self, xs: &[Value], axis: usize) -> BuildResult<Value> {
        self.insert1(Op::Concat { axis }, xs)
    }

    // ----- reductions, contractions, indexing -----

    /// `op` over `axes` of `x`; `keep_dims` keeps them as axes of size 1.
    #[track_caller]
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: Value,
        axes: Vec<usize>,
        keep_dims: bool,
    ) -> BuildResult<Value> {
        self.insert1(
            Op::Reduce {
                op,
                axes,
                keep_dims,
            },
            &[x],
        )
    }

    /// The index of the extreme element along `axis` (i64).
    #[track_caller]
    pub fn arg_reduce(
        &mut self,
        op: ArgOp,
        x: Value,
        axis: usize,
        keep_dims: bool,
    ) -> BuildResult<Value> {
        self.insert1(
            Op::ArgReduce {
                op,
                axis,
                keep_dims,
            },
            &[x],
        )
    }

    /// The matrix product `[..., M, K] @ [..., K, N]`, batch dimensions broadcast.
    #[track_caller]
    pub fn matmul(&mut self, a: Value, b: Value) -> BuildResult<Value> {
        self.matmul_t(a, b, false, false)
    }

    /// `a @ b` with either operand's last two axes transposed first.
    #[track_caller]
    pub fn matmul_t(
        &mut self,
        a: Value,
        b: Value,
        transpose_a: bool,
        transpose_b: bool,
    ) -> BuildResult<Value> {
        let op = Op::MatMul {
            transpose_a,
            transpose_b,
        };
        self.insert1(op, &[a, b])
    }

    /// `table` indexed by `indices` along `axis`.
    #[track_caller]
    pub fn gather(&mut self, table: Value, indices: Value, axis: usize) -> BuildResult<Value> {
        self.insert1(Op::Gather { axis }, &[table, indices])
    }

    /// `array` with its slice at the scalar `index` along `axis` replaced by `value`.
    #[track_caller]
    pub fn update_slice(
        &mut self,
        array: Value,
        value: Value,
        index: Value,
        axis: usize,
    ) -> BuildResult<Value> {
        self.insert1(Op::UpdateSlice { axis }, &[array, value, index])
    }

    /// Zeros of `shape` with `updates` added at `indices` along `axis`.
    #[track_caller]
    pub fn scatter_add(
        &mut self,
        updates: Value,
        indices: Value,
        axis: usize,
        shape: Shape,
    ) -> BuildResult<Value> {
        self.insert1(Op::ScatterAdd { axis, shape }, &[updates, indices])
    }

    /// A 2-D convolution (or one of its transposes, by `kind`) of NCHW `a` with `b` (see
    /// [`ConvKind`] for the operands of each).
    #[track_caller]
    pub fn conv(
        &mut self,
        kind: ConvKind,
        attrs: Conv2dAttrs,
        a: Value,
        b: Value,
    ) -> BuildResult<Value> {
        self.insert1(Op::Conv2d { kind, attrs }, &[a, b])
    }

    /// `conv2d(x, w)`: NCHW `x` `[N, C, H, W]` with OIHW weights `[O, C/groups, KH, KW]`.
    #[track_caller]
    pub fn conv2d(&mut self, x: Value, w: Value, attrs: Conv2dAttrs) -> BuildResult<Value> {
        self.conv(ConvKind::Forward, attrs, x, w)
    }

    /// A pooling op (or a pooling gradient, by `kind`) over NCHW `args` (see [`PoolKind`]).
    #[track_caller]
    pub fn pool(
        &mut self,
        kind: PoolKind,
        attrs: Pool2dAttrs,
        args: &[Value],
    ) -> BuildResult<Value> {
        self.insert1(Op::Pool2d { kind, attrs }, args)
    }

    /// The largest element of each window of NCHW `x`.
    #[track_caller]
    pub fn max_pool2d(&mut self, x: Value, attrs: Pool2dAttrs) -> BuildResult<Value> {
        self.pool(PoolKind::Max, attrs, &[x])
    }

    /// The mean of each window of NCHW `x` (padding counts as zeros).
    #[track_caller]
    pub fn avg_pool2d(&mut self, x: Value, attrs: Pool2dAttrs) -> BuildResult<Value> {
        self.pool(PoolKind::Avg, attrs, &[x])
    }

    /// Integer `labels` as one-hot vectors of `depth` along a new last axis.
    #[track_caller]
    pub fn one_hot(&mut self, labels: Value, depth: usize, dtype: DType) -> BuildResult<Value> {
        self.insert1(Op::OneHot { depth, dtype }, &[labels])
    }

    /// The index along `axis` of every element of `ty`.
    #[track_caller]
    pub fn iota(&mut self, ty: Type, axis: usize) -> BuildResult<Value> {
        self.insert1(Op::Iota { axis, ty }, &[])
    }

    /// Samples of U(`low`, `high`) of type `ty`, counter-based from `seed`.
    #[track_caller]
    pub fn random_uniform(
        &mut self,
        ty: Type,
        low: f64,
        high: f64,
        seed: u64,
    ) -> BuildResult<Value> {
        let dist = Distribution::Uniform {
            low: F64Attr(low),
            high: F64Attr(high),
        };
        self.insert1(Op::Random { dist, seed, ty }, &[])
    }

    /// Samples of N(`mean`, `std`²) of type `ty`, counter-based from `seed`.
    #[track_caller]
    pub fn random_normal(
        &mut self,
        ty: Type,
        mean: f64,
        std: f64,
        seed: u64,
    ) -> BuildResult<Value> {
        let dist = Distribution::Normal {
            mean: F64Attr(mean),
            std: F64Attr(std),
        };
        self.insert1(Op::Random { dist, seed, ty }, &[])
    }

    // ----- state -----

    /// Reads declared state.
    #[track_caller]
    pub fn load(&mut self, state: &StateDecl) -> BuildResult<Value> {
        let op = Op::Load {
            state: state.name.clone(),
            ty: state.ty.clone(),
        };
        self.insert1(op, &[])
    }

    /// Reads declared state at the top level of the function, even while a region is being
    /// built (the load lands before the instruction that will own the region, so it dominates
    /// it): a loop or branch that reads a parameter reads it once, at the top.
    #[track_caller]
    pub fn load_at_top(&mut self, state: &StateDecl) -> BuildResult<Value> {
        let op = Op::Load {
            state: state.name.clone(),
            ty: state.ty.clone(),
        };
        let loc = Loc::caller();
        let result_types = infer(&op, &[], &[]).map_err(|error| BuildError { error, loc })?;
        let inst = self
            .func
            .create_inst(op, Vec::new(), result_types, Vec::new(), loc);
        let body = self.func.body();
        self.func.append_inst(body, inst);
        let v = self.func.inst(inst).results[0];
        self.defined_in.insert(v, body);
        Ok(v)
    }

    /// Writes declared state when the function returns. The verifier checks the type.
    #[track_caller]
    pub fn store(&mut self, state: &StateDecl, value: Value) -> BuildResult<Inst> {
        let loc = Loc::caller();
        let op = Op::Store {
            state: state.name.clone(),
        };
        let value_ty = self.func.value_type(value);
        if *value_ty != state.ty {
            let message = format!(
                "@{} has type {}, the stored value {value_ty}",
                state.name, state.ty
            );
            return Err(self.error("store", message, loc));
        }
        self.insert_at(op, &[value], Vec::new(), loc)?;
        Ok(self.last_inst().expect("just appended"))
    }

    /// The instruction added last to the innermost open region.
    pub fn last_inst(&self) -> Option<Inst> {
        let region = *self.open.last().expect("the body region is always open");
        self.func.region(region).insts.last().copied()
    }

    // ----- control flow and calls -----

    /// `if pred { then_branch } else { else_branch }`; both branches yield values of the same
    /// types, which are the results.
    #[track_caller]
    pub fn cond<E: From<BuildError>>(
        &mut self,
        pred: Value,
        then_branch: impl FnOnce(&mut FunctionBuilder) -> Result<Vec<Value>, E>,
        else_branch: impl FnOnce(&mut FunctionBuilder) -> Result<Vec<Value>, E>,
    ) -> Result<Vec<Value>, E> {
        let loc = Loc::caller();
        let then_region = self.region(&[], |b, _| then_branch(b), loc)?;
        let else_region = self.region(&[], |b, _| else_branch(b), loc)?;
        Ok(self.insert_at(Op::Cond, &[pred], vec![then_region, else_region], loc)?)
    }

    /// `while cond(values) { values = body(values) }`, starting from `init`; returns the final
    /// values. Both closures receive the loop-carried values as fresh region arguments. The
    /// closures may fail with any error a [`BuildError`] converts into.
    #[track_caller]
    pub fn while_loop<E: From<BuildError>>(
        &mut self,
        init: &[Value],
        cond: impl FnOnce(&mut FunctionBuilder, &[Value]) -> Result<Value, E>,
        body: impl FnOnce(&mut FunctionBuilder, &[Value]) -> Result<Vec<Value>, E>,
    ) -> Result<Vec<Value>, E> {
        let loc = Loc::caller();
        self.check_visible("while", init, loc)?;
        let carried: Vec<Type> = init
            .iter()
            .map(|&v| self.func.value_type(v).clone())
            .collect();
        let cond_region = self.region(&carried, |b, args| cond(b, args).map(|c| vec![c]), loc)?;
        let body_region = self.region(&carried, body, loc)?;
        Ok(self.insert_at(Op::While, init, vec![cond_region, body_region], loc)?)
    }

    /// A `fused` group over `args`: `body` receives the region's arguments (standing for
    /// `args`) and returns the values the group yields.
    #[track_caller]
    pub fn fused(
        &mut self,
        args: &[Value],
        body: impl FnOnce(&mut FunctionBuilder, &[Value]) -> BuildResult<Vec<Value>>,
    ) -> BuildResult<Vec<Value>> {
        let loc = Loc::caller();
        self.check_visible("fused", args, loc)?;
        let types: Vec<Type> = args
            .iter()
            .map(|&v| self.func.value_type(v).clone())
            .collect();
        let region = self.region(&types, body, loc)?;
        self.insert_at(Op::Fused, args, vec![region], loc)
    }

    /// Calls a registered custom op whose results have the stated types.
    #[track_caller]
    pub fn call(
        &mut self,
        callee: &str,
        args: &[Value],
        result_types: Vec<Type>,
    ) -> BuildResult<Vec<Value>> {
        let op = Op::Call {
            callee: callee.to_owned(),
            results: result_types,
        };
        self.insert(op, args)
    }

    // ----- communication -----

    /// The sum or mean of `values` over the ranks, as one message (a gradient bucket).
    #[track_caller]
    pub fn all_reduce(&mut self, op: AllReduceOp, values: &[Value]) -> BuildResult<Vec<Value>> {
        self.insert(Op::AllReduce { op, bf16: false }, values)
    }

    /// [`FunctionBuilder::all_reduce`] whose f32 operands travel as bfloat16 when `bf16`
    /// (see [`Op::AllReduce`]).
    #[track_caller]
    pub fn all_reduce_on_wire(
        &mut self,
        op: AllReduceOp,
        values: &[Value],
        bf16: bool,
    ) -> BuildResult<Vec<Value>> {
        self.insert(Op::AllReduce { op, bf16 }, values)
    }

    /// The sum or mean of `values` over `ranks` ranks, each rank given its block of the
    /// first axis, as one message.
    #[track_caller]
    pub fn reduce_scatter(
        &mut self,
        op: AllReduceOp,
        values: &[Value],
        ranks: usize,
    ) -> BuildResult<Vec<Value>> {
        self.insert(Op::ReduceScatter { op, ranks }, values)
    }

    /// Every rank's `values` concatenated along the first axis in rank order, on every rank.
    #[track_caller]
    pub fn all_gather(&mut self, values: &[Value], ranks: usize) -> BuildResult<Vec<Value>> {
        self.insert(Op::AllGather { ranks }, values)
    }

    /// This rank's block of each of `values`' first axis, split into `ranks` blocks.
    #[track_caller]
    pub fn shard(&mut self, values: &[Value], ranks: usize) -> BuildResult<Vec<Value>> {
        self.insert(Op::Shard { ranks }, values)
    }

    /// Rank `root`'s `values`, on every rank.
    #[track_caller]
    pub fn collective_broadcast(
        &mut self,
        values: &[Value],
        root: usize,
    ) -> BuildResult<Vec<Value>> {
        self.insert(Op::CollectiveBroadcast { root }, values)
    }

    /// Sends `values` to rank `peer`; returns the instruction (it has no results, so a target
    /// keeps it alive the way it keeps a store).
    #[track_caller]
    pub fn send(&mut self, values: &[Value], peer: usize, tag: u64) -> BuildResult<Inst> {
        self.insert_at(Op::Send { peer, tag }, values, Vec::new(), Loc::caller())?;
        Ok(self.last_inst().expect("just appended"))
    }

    /// Receives values of `types` from rank `peer`'s send of `tag`.
    #[track_caller]
    pub fn recv(&mut self, types: Vec<Type>, peer: usize, tag: u64) -> BuildResult<Vec<Value>> {
        self.insert(
            Op::Recv {
                peer,
                tag,
                results: types,
            },
            &[],
        )
    }

    /// Replaces every use of `old` in the function (operands and yielded values) by `new`.
    pub fn replace_uses(&mut self, old: Value, new: Value) {
        self.func.replace_uses(old, new);
    }

    /// Moves `inst`, an instruction of the function body, to just after the last definition of
    /// its operands (and after `after`, when given), so that it starts as early as its
    /// operands allow: a gradient bucket's all-reduce right after the bucket's last gradient.
    /// Whether other side effects may be passed is the caller's to judge.
    pub fn hoist(&mut self, inst: Inst, after: Option<Inst>) {
        let body = self.func.body();
        let insts = &self.func.region(body).insts;
        let Some(from) = insts.iter().position(|&i| i == inst) else {
            return;
        };
        let args = &self.func.inst(inst).args;
        let to = insts[..from]
            .iter()
            .rposition(|&i| {
                Some(i) == after || self.func.inst(i).results.iter().any(|r| args.contains(r))
            })
            .map_or(0, |at| at + 1);
        let insts = &mut self.func.region_mut(body).insts;
        let moved = insts.remove(from);
        insts.insert(to, moved);
    }

    /// Builds a region with arguments of `arg_types`, filled by `fill`, which returns the values
    /// the region yields.
    fn region<E: From<BuildError>>(
        &mut self,
        arg_types: &[Type],
        fill: impl FnOnce(&mut FunctionBuilder, &[Value]) -> Result<Vec<Value>, E>,
        loc: Loc,
    ) -> Result<Region, E> {
        let (region, args) = self.begin_region(arg_types);
        match fill(self, &args) {
            Ok(yielded) => Ok(self.end_region_at(region, &yielded, loc).map(|()| region)?),
            Err(e) => {
                self.abandon_region(region);
                Err(e)
            }
        }
    }

    /// Opens a region with arguments of `arg_types`: new ops go into it until it ends. For
    /// callers that cannot pass a closure (tracing, where user code fills the region).
    pub fn begin_region(&mut self, arg_types: &[Type]) -> (Region, Vec<Value>) {
        let region = self.func.create_region();
        let args: Vec<Value> = arg_types
            .iter()
            .map(|t| {
                let v = self.func.append_region_arg(region, t.clone(), None);
                self.defined_in.insert(v, region);
                v
            })
            .collect();
        self.open.push(region);
        (region, args)
    }

    /// Closes `region` (the innermost open one), which yields `yields`.
    #[track_caller]
    pub fn end_region(&mut self, region: Region, yields: &[Value]) -> BuildResult<()> {
        self.end_region_at(region, yields, Loc::caller())
    }

    fn end_region_at(&mut self, region: Region, yields: &[Value], loc: Loc) -> BuildResult<()> {
        if self.open.last() != Some(&region) || self.open.len() < 2 {
            return Err(self.error(
                "yield",
                format!("{region} is not the innermost open region"),
                loc,
            ));
        }
        let visible = self.check_visible("yield", yields, loc);
        // The body is `open[0]`: a region's depth is its place below it.
        let depth = self.open.len() - 1;
        self.open.pop();
        visible?;
        if depth > crate::function::MAX_REGION_DEPTH {
            let limit = crate::function::MAX_REGION_DEPTH;
            return Err(self.error(
                "region",
                format!("regions are nested {depth} deep, more than {limit}"),
                loc,
            ));
        }
        self.func.set_region_results(region, yields.to_vec());
        Ok(())
    }

    /// Closes `region` after a failure while filling it; it is left unused.
    pub fn abandon_region(&mut self, region: Region) {
        if self.open.last() == Some(&region) && self.open.len() > 1 {
            self.open.pop();
        }
    }

    /// Re-emits instruction `inst` of `src` (with its regions, recursively) in the current
    /// region, mapping its operands through `remap` (a value not in it stands for itself) and
    /// recording its results there.
    pub fn clone_inst(
        &mut self,
        src: &Function,
        inst: Inst,
        remap: &mut HashMap<Value, Value>,
    ) -> BuildResult<()> {
        let b = self;
        let data = src.inst(inst);
        let map = |v: &Value, remap: &HashMap<Value, Value>| remap.get(v).copied().unwrap_or(*v);
        let args: Vec<Value> = data.args.iter().map(|v| map(v, remap)).collect();
        let results = match &data.op {
            Op::Cond => {
                let (then_r, else_r) = (data.regions[0], data.regions[1]);
                let clone_branch = |b: &mut FunctionBuilder, region: Region| {
                    let mut inner = remap.clone();
                    for &i in &src.region(region).insts {
                        b.clone_inst(src, i, &mut inner)?;
                    }
                    Ok(src
                        .region(region)
                        .results
                        .iter()
                        .map(|v| map(v, &inner))
                        .collect())
                };
                b.cond(
                    args[0],
                    |b| clone_branch(b, then_r),
                    |b| clone_branch(b, else_r),
                )?
            }
            Op::Fused => {
                let body_r = data.regions[0];
                let clone_body = |b: &mut FunctionBuilder, args: &[Value]| {
                    let mut inner = remap.clone();
                    for (&a, &v) in src.region(body_r).args.iter().zip(args) {
                        inner.insert(a, v);
                    }
                    for &i in &src.region(body_r).insts {
                        b.clone_inst(src, i, &mut inner)?;
                    }
                    Ok(src
                        .region(body_r)
                        .results
                        .iter()
                        .map(|v| map(v, &inner))
                        .collect())
                };
                b.fused(&args, clone_body)?
            }
            Op::While => {
                let (cond_r, body_r) = (data.regions[0], data.regions[1]);
                let clone_loop_region =
                    |b: &mut FunctionBuilder, region: Region, carried: &[Value]| {
                        let mut inner = remap.clone();
                        for (&a, &c) in src.region(region).args.iter().zip(carried) {
                            inner.insert(a, c);
                        }
                        for &i in &src.region(region).insts {
                            b.clone_inst(src, i, &mut inner)?;
                        }
                        Ok::<Vec<Value>, BuildError>(
                            src.region(region)
                                .results
                                .iter()
                                .map(|v| map(v, &inner))
                                .collect(),
                        )
                    };
                b.while_loop(
                    &args,
                    |b, c| Ok(clone_loop_region(b, cond_r, c)?[0]),
                    |b, c| clone_loop_region(b, body_r, c),
                )?
            }
            op => b.insert(op.clone(), &args)?,
        };
        for (&old, new) in data.results.iter().zip(results) {
            // The copy reports errors at the original's line, not at this function's.
            if let ValueDef::Result(copy, _) = b.func.value(new).def {
                b.func.inst_mut(copy).loc = data.loc;
            }
            remap.insert(old, new);
        }
        Ok(())
    }

    /// Adds `op` owning `regions` (built with `begin_region`/`end_region`).
    #[track_caller]
    pub fn insert_with_regions(
        &mut self,
        op: Op,
        args: &[Value],
        regions: Vec<Region>,
    ) -> BuildResult<Vec<Value>> {
        self.insert_at(op, args, regions, Loc::caller())
    }

    /// Sets the source location of the instructions of the innermost open region from index
    /// `from` on: wrappers use it to report their caller's line rather than their own.
    pub fn relocate_since(&mut self, from: usize, loc: Loc) {
        let region = *self.open.last().expect("the body region is always open");
        let insts: Vec<Inst> = self.func.region(region).insts
            [from.min(self.func.region(region).insts.len())..]
            .to_vec();
        for inst in insts {
            self.func.inst_mut(inst).loc = loc;
        }
    }

    /// The number of instructions in the innermost open region.
    pub fn current_len(&self) -> usize {
        let region = *self.open.last().expect("the body region is always open");
        self.func.region(region).insts.len()
    }
}

/// Shorthand methods generated from the elementwise tables of the op table: `b.exp(x)?`.
macro_rules! unary_shorthands {
    ($(#[$meta:meta])* $enum:ident {
        $($variant:ident = $text:literal, $method:ident, $($_rest:ident),*;)*
    }) => {
        impl FunctionBuilder {
            $(
                #[doc = concat!("`", $text, "`, elementwise.")]
                #[track_caller]
                pub fn $method(&mut self, x: Value) -> BuildResult<Value> {
                    self.unary($enum::$variant, x)
                }
            )*
        }
    };
}

/// Shorthand methods for the two-operand tables, which broadcast: `b.add(x, y)?`, `b.lt(x, y)?`.
macro_rules! pair_shorthands {
    ($kind:ident $(#[$meta:meta])* $enum:ident {
        $($variant:ident = $text:literal, $method:ident, $($_rest:ident),*;)*
    }) => {
        impl FunctionBuilder {
            $(
                #[doc = concat!("`", $text, "`, elementwise, with NumPy broadcasting.")]
                #[track_caller]
                pub fn $method(&mut self, a: Value, b: Value) -> BuildResult<Value> {
                    self.$kind($enum::$variant, a, b)
                }
            )*
        }
    };
}

macro_rules! binary_shorthands {
    ($($t:tt)*) => { pair_shorthands!(binary $($t)*); };
}
macro_rules! compare_shorthands {
    ($($t:tt)*) => { pair_shorthands!(compare $($t)*); };
}
crate::with_unary_ops!(unary_shorthands);
crate::with_binary_ops!(binary_shorthands);
crate::with_compare_ops!(compare_shorthands);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::function::MAX_REGION_DEPTH;
    use crate::types::ty;

    #[test]
    fn binary_ops_broadcast_explicitly() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg("x", ty(DType::F32, ["N".into(), 3.into()]));
        let bias = b.arg("b", ty(DType::F32, [3.into()]));
        let y = b.add(x, bias).unwrap();
        let f = b.finish(&[y]).unwrap();
        let ops: Vec<&str> = f
            .walk_insts()
            .iter()
            .map(|&i| f.inst(i).op.name())
            .collect();
        assert_eq!(ops, ["broadcast", "add"]);
        assert_eq!(f.result_types(), [ty(DType::F32, ["N".into(), 3.into()])]);
    }

    #[test]
    fn shape_errors_name_op_shapes_and_caller() {
        let mut b = FunctionBuilder::new("f");
        let x = b.arg("x", ty(DType::F32, ["N".into(), 784.into()]));
        let w = b.arg("w", ty(DType::F32, [512.into(), 10.into()]));
        let line = line!() + 1;
        let err = b.matmul(x, w).unwrap_err().to_string();
        assert!(
            err.starts_with("matmul: contraction dimensions differ: f32[N,784] @ f32[512,10]"),
            "{err}"
        );
        assert!(
            err.contains(&format!("(built at ir/src/builder.rs:{line}:")),
            "{err}"
        );
    }

    #[test]
    fn values_of_closed_regions_are_rejected() {
        let mut b = FunctionBuilder::new("f");
        let p = b.arg("p", Type::scalar(DType::Bool));
        let mut leaked = None;
        b.cond::<BuildError>(
            p,
            |b| {
                let c = b.scalar(DType::F32, 1.0)?;
                leaked = Some(c);
                Ok(vec![c])
            },
            |b| Ok(vec![b.scalar(DType::F32, 2.0)?]),
        )
        .unwrap();
        let err = b.exp(leaked.unwrap()).unwrap_err();
        assert!(err.to_string().contains("not visible here"), "{err}");
    }

    #[test]
    fn names_are_sanitised_and_unique() {
        let mut b = FunctionBuilder::new("f");
        let t = Type::scalar(DType::F32);
        let x = b.arg("x", t.clone());
        let x2 = b.arg("x", t.clone());
        let odd = b.arg("3 bad-name", t);
        let f = b.finish(&[x]).unwrap();
        assert_eq!(f.value_name(x), Some("x"));
        assert_eq!(f.value_name(x2), Some("x_1"));
        assert_eq!(f.value_name(odd), Some("_3_bad_name"));
    }

    /// `depth` regions nested, alternately `cond` branches and `while` bodies.
    fn nested(b: &mut FunctionBuilder, x: Value, p: Value, depth: usize) -> BuildResult<Value> {
        if depth == 0 {
            return Ok(x);
        }
        let out = match depth % 2 {
            0 => b.cond(
                p,
                |b| Ok(vec![nested(b, x, p, depth - 1)?]),
                |_| Ok(vec![x]),
            )?,
            _ => b.while_loop(
                &[x],
                |b, _| b.scalar(DType::Bool, 0.0),
                |b, c| Ok(vec![nested(b, c[0], p, depth - 1)?]),
            )?,
        };
        Ok(out[0])
    }

    #[test]
    fn regions_nest_as_deep_as_the_limit_and_no_deeper() {
        for (depth, ok) in [(MAX_REGION_DEPTH, true), (MAX_REGION_DEPTH + 1, false)] {
            let mut b = FunctionBuilder::new("f");
            let x = b.arg("x", ty(DType::F32, []));
            let p = b.arg("p", ty(DType::Bool, []));
            match nested(&mut b, x, p, depth) {
                Ok(_) => assert!(ok, "{depth} regions built"),
                Err(e) => {
                    assert!(!ok, "{depth}: {e}");
                    assert!(e.to_string().contains("more than 64"), "{e}");
                }
            }
        }
    }
}
