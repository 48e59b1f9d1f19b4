//! Constant folding with the reference interpreter's kernels, so a folded value is exactly
//! what the op would have computed.
//!
//! - An op whose operands are all one-element constants ("splats"), and whose result is
//!   elementwise, folds to a splat — whatever the shape, symbolic dimensions included.
//! - An op whose operands are all constants of at most [`MAX_ELEMENTS`] elements folds to a
//!   dense constant of at most that size.
//! - `broadcast` of a splat is a splat.
//! - A folded constant of one repeated value is a splat.
//! - A constant counting `0, 1, 2, …` along an axis becomes that `iota`.
//! - An `iota` counts as a constant of its values for the ops that read it (it is not
//!   replaced itself), and a `broadcast` of one that keeps its axis is that `iota` of the
//!   larger shape, whatever its size.

use crate::pass::{Pass, PassError, Stats};
use kiln_backend::{Array, Interpreter};
use kiln_ir::{Function, Inst, Literal, Module, Op, OpClass, Region, Type, Value};
use std::collections::HashMap;

/// The largest constant folding produces.
pub const MAX_ELEMENTS: usize = 1024;

/// Constant folding, with the interpreter's own kernels.
pub struct ConstantFold;

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "fold"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        let mut folded = 0;
        let empty = Module::new();
        let interp = Interpreter::new(&empty);
        for func in &mut module.functions {
            let mut constants: HashMap<Value, (Literal, Type)> = HashMap::new();
            let body = func.body();
            folded += fold_region(func, body, &interp, &mut constants);
        }
        Ok(Stats::default().with("folded", folded))
    }
}

fn fold_region(
    func: &mut Function,
    region: Region,
    interp: &Interpreter<'_>,
    constants: &mut HashMap<Value, (Literal, Type)>,
) -> usize {
    let mut folded = 0;
    for inst in func.region(region).insts.clone() {
        for r in func.inst(inst).regions.clone() {
            folded += fold_region(func, r, interp, constants);
        }
        if let Some(iota) = broadcast_iota(func, inst) {
            func.inst_mut(inst).op = iota;
            func.inst_mut(inst).args.clear();
            folded += 1;
        }
        let data = func.inst(inst);
        if let Op::Const { value, ty } = &data.op {
            let (value, ty, result) = (value.clone(), ty.clone(), data.results[0]);
            if let Some(axis) = iota_of(&value, &ty) {
                let ty = ty.clone();
                func.inst_mut(inst).op = Op::Iota { axis, ty };
                folded += 1;
            }
            constants.insert(result, (value, ty));
            continue;
        }
        // An `iota` stays (it says what it holds), but the ops computing on it fold.
        if let Op::Iota { ty, .. } = &data.op {
            let small = ty.shape.num_elements().is_some_and(|n| n <= MAX_ELEMENTS);
            let values = (ty.shape.as_fixed())
                .filter(|_| small)
                .and_then(|shape| interp.eval_op(&data.op, &[], &[shape]).ok());
            if let Some(out) = values.as_ref().and_then(|v| v.first()) {
                constants.insert(data.results[0], (out.to_literal(), ty.clone()));
            }
            continue;
        }
        let foldable = matches!(
            data.op.class(),
            OpClass::Elementwise | OpClass::Layout | OpClass::Reduction
        ) && data.results.len() == 1;
        let operands: Option<Vec<&(Literal, Type)>> =
            data.args.iter().map(|a| constants.get(a)).collect();
        let (Some(operands), true) = (operands, foldable) else {
            continue;
        };
        let result_ty = func.value_type(data.results[0]).clone();
        let Some(literal) = evaluate(interp, &data.op, &operands, &result_ty) else {
            continue;
        };
        let result = data.results[0];
        // One repeated value is a splat, however it was computed.
        let literal = literal.splat().unwrap_or(literal);
        func.inst_mut(inst).op = match iota_of(&literal, &result_ty) {
            Some(axis) => Op::Iota {
                axis,
                ty: result_ty.clone(),
            },
            None => Op::Const {
                value: literal.clone(),
                ty: result_ty.clone(),
            },
        };
        func.inst_mut(inst).args.clear();
        constants.insert(result, (literal, result_ty));
        folded += 1;
    }
    folded
}

/// The `iota` a `broadcast` of an `iota` is, when the broadcast keeps the counted axis (it
/// only stretches and prepends others).
fn broadcast_iota(func: &Function, inst: Inst) -> Option<Op> {
    let data = func.inst(inst);
    let Op::Broadcast { shape } = &data.op else {
        return None;
    };
    let source = func.inst(func.producer(data.args[0])?);
    let Op::Iota { axis: from, ty } = &source.op else {
        return None;
    };
    let axis = from + shape.rank().checked_sub(ty.rank())?;
    (shape.dims().get(axis)? == &ty.shape.dims()[*from]).then(|| Op::Iota {
        axis,
        ty: Type::new(ty.dtype, shape.clone()),
    })
}

/// The axis of the `iota` a constant's values are (`0, 1, 2, …` along it): the one form of
/// such a constant, whichever way it was made.
fn iota_of(value: &Literal, ty: &Type) -> Option<usize> {
    value.iota_axis(&ty.shape.as_fixed()?)
}

/// The folded value of `op` on constant `operands`, if it is small enough (or a splat).
fn evaluate(
    interp: &Interpreter<'_>,
    op: &Op,
    operands: &[&(Literal, Type)],
    result: &Type,
) -> Option<Literal> {
    let all_splats = operands.iter().all(|(lit, _)| lit.len() == 1);
    let splat_result = match op {
        Op::Broadcast { .. } => all_splats,
        _ => all_splats && op.class() == OpClass::Elementwise,
    };
    if splat_result {
        // Evaluate on one element of each operand; the result is a splat of its type.
        let args: Vec<Array> = operands
            .iter()
            .map(|(lit, _)| Array::from_literal(lit, &[]))
            .collect::<Option<_>>()?;
        if matches!(op, Op::Broadcast { .. }) {
            return Some(args[0].to_literal());
        }
        let refs: Vec<&Array> = args.iter().collect();
        let out = interp.eval_op(op, &refs, &[Vec::new()]).ok()?;
        return Some(out.first()?.to_literal());
    }
    let result_shape = result.shape.as_fixed()?;
    // `num_elements` is `None` past `usize`: too large to fold as well.
    (result.shape.num_elements()? <= MAX_ELEMENTS).then_some(())?;
    let args: Vec<Array> = operands
        .iter()
        .map(|(lit, ty)| {
            let shape = ty.shape.as_fixed()?;
            (ty.shape.num_elements()? <= MAX_ELEMENTS).then_some(())?;
            Array::from_literal(lit, &shape)
        })
        .collect::<Option<_>>()?;
    let refs: Vec<&Array> = args.iter().collect();
    let out = interp.eval_op(op, &refs, &[result_shape]).ok()?;
    Some(out.first()?.to_literal())
}
