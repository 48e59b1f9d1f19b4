//! Product passes: decisions about how matrix products run that used to be made, unseen, by
//! the executor's schedule, made here as IR a user can read.
//!
//! - `fold_updates`: an update `w − c·g` (or `w + c·g`) whose gradient `g` is a product that
//!   nothing else reads becomes `matmul_acc a, b, w {scale=−c}`: the product accumulated onto
//!   `w` (gemm's `w ← w + α·a·b`), which a parameter's SGD update then does in `w`'s buffer.
//!   The gradient is never written and the update takes no pass of its own over `w`
//!   (BENCHMARKS.md, "SGD folded into products": W5's update passes).

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::print::inst_line;
use kiln_ir::{BinaryOp, F64Attr, Function, Inst, Module, Op, Value};
use std::collections::HashMap;

/// The `fold_updates` pass (see the module documentation).
#[derive(Default)]
pub struct FoldUpdates {
    explain: bool,
    explanations: Vec<String>,
}

impl Pass for FoldUpdates {
    fn name(&self) -> &'static str {
        "fold_updates"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        self.explanations.clear();
        let mut folded = 0;
        for func in &mut module.functions {
            let uses = use_counts(func);
            let body = func.region(func.body()).insts.clone();
            for inst in body {
                let Some(fold) = foldable_update(func, inst, &uses) else {
                    continue;
                };
                let before = self.explain.then(|| inst_line(func, inst));
                let data = func.inst_mut(inst);
                data.op = Op::MatMulAcc {
                    transpose_a: fold.transposes[0],
                    transpose_b: fold.transposes[1],
                    scale: F64Attr(fold.scale),
                };
                data.args = vec![fold.operands[0], fold.operands[1], fold.onto];
                folded += 1;
                if let Some(before) = before {
                    self.explanations.push(format!(
                        "@{}: `{}` becomes `{}`: its gradient is a product only it reads, \
                         accumulated onto the updated value instead of written",
                        func.name(),
                        before.trim(),
                        inst_line(func, inst).trim()
                    ));
                }
            }
        }
        Ok(Stats::default().with("updates folded", folded))
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn take_explanations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.explanations)
    }
}

/// An update `onto ± scale·(a @ b)` found at an instruction.
struct Fold {
    operands: [Value; 2],
    transposes: [bool; 2],
    onto: Value,
    scale: f64,
}

/// How many times each value is read: by instructions (in any region) and as a result.
fn use_counts(func: &Function) -> HashMap<Value, usize> {
    let mut uses: HashMap<Value, usize> = HashMap::new();
    for inst in func.walk_insts() {
        for &a in &func.inst(inst).args {
            *uses.entry(a).or_default() += 1;
        }
        for &r in &func.inst(inst).regions {
            for &v in &func.region(r).results {
                *uses.entry(v).or_default() += 1;
            }
        }
    }
    for &v in &func.region(func.body()).results {
        *uses.entry(v).or_default() += 1;
    }
    uses
}

/// `inst` as `w − c·g` or `w + c·g` with `c` a float constant and `g` a float product that
/// only this update reads (through the scaling), whose operands are not `w` (gemm cannot
/// read the buffer it accumulates onto).
fn foldable_update(func: &Function, inst: Inst, uses: &HashMap<Value, usize>) -> Option<Fold> {
    let data = func.inst(inst);
    let (onto, scaled, sign) = match (&data.op, &data.args[..]) {
        (Op::Binary(BinaryOp::Sub), &[w, s]) => (w, s, -1.0),
        (Op::Binary(BinaryOp::Add), &[w, s]) if made_by_mul(func, s) => (w, s, 1.0),
        (Op::Binary(BinaryOp::Add), &[s, w]) => (w, s, 1.0),
        _ => return None,
    };
    let mul = func.producer(scaled)?;
    let (product, c) = match (&func.inst(mul).op, &func.inst(mul).args[..]) {
        (Op::Binary(BinaryOp::Mul), &[g, k]) if scalar_constant(func, k).is_some() => (g, k),
        (Op::Binary(BinaryOp::Mul), &[k, g]) => (g, k),
        _ => return None,
    };
    // A rate of 0, ±inf or NaN is left alone: gemm scales each term of the sum, not the sum,
    // so 0·inf terms, and a product it skips when the scale is 0, would differ from `w − c·g`.
    let c = scalar_constant(func, c).filter(|c| c.is_finite() && *c != 0.0)?;
    let matmul = func.producer(product)?;
    let Op::MatMul {
        transpose_a,
        transpose_b,
    } = func.inst(matmul).op
    else {
        return None;
    };
    let operands = [func.inst(matmul).args[0], func.inst(matmul).args[1]];
    let once = |v: Value| uses.get(&v) == Some(&1);
    let same_type = func.value_type(onto) == func.value_type(product);
    let float = func.value_type(product).dtype.is_float();
    (once(product) && once(scaled) && same_type && float && !operands.contains(&onto)).then_some(
        Fold {
            operands,
            transposes: [transpose_a, transpose_b],
            onto,
            scale: sign * c,
        },
    )
}

fn made_by_mul(func: &Function, v: Value) -> bool {
    func.producer(v)
        .is_some_and(|i| matches!(func.inst(i).op, Op::Binary(BinaryOp::Mul)))
}

/// The value of a float constant with one element (a splat), or of a broadcast of one.
fn scalar_constant(func: &Function, v: Value) -> Option<f64> {
    let data = func.inst(func.producer(v)?);
    match &data.op {
        Op::Const { value, .. } if value.len() == 1 && value.dtype().is_float() => {
            Some(value.get_f64(0))
        }
        Op::Broadcast { .. } => scalar_constant(func, data.args[0]),
        _ => None,
    }
}
