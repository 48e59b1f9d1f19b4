//! `order_epilogues`: the instruction order that lets a convolution carry its epilogue.
//!
//! The executor runs the kernel right after a convolution on each run of samples as the
//! convolution writes them, while they are in cache, when that kernel reads the convolution's
//! output (a bias and an activation, a batch norm's scale and shift). Only the instruction
//! right after can be paired, and the front ends put the bias's reshape, its load or a
//! constant between the two. This pass moves such reshapes, loads and constants to before the
//! convolution: they do not read its output, so they may run first, and the order the
//! executor pairs by is then the printed one. (It was done unseen in the executor's schedule
//! until issue 49.)
//!
//! A load may move because a function reads state as of its call; a reshape or a constant is
//! pure. Only a function's body is reordered: the executor pairs steps there.

use crate::pass::{Pass, PassError, Stats};
use kiln_ir::print::inst_line;
use kiln_ir::{Function, Module, Op};

/// The `order_epilogues` pass (see the module documentation).
#[derive(Default)]
pub struct OrderEpilogues {
    explain: bool,
    explanations: Vec<String>,
}

impl Pass for OrderEpilogues {
    fn name(&self) -> &'static str {
        "order_epilogues"
    }

    fn run(&mut self, module: &mut Module) -> Result<Stats, PassError> {
        self.explanations.clear();
        let mut moved = 0;
        for func in &mut module.functions {
            moved += self.order(func);
        }
        Ok(Stats::default().with("instructions moved before convolutions", moved))
    }

    fn set_explain(&mut self, on: bool) {
        self.explain = on;
    }

    fn take_explanations(&mut self) -> Vec<String> {
        std::mem::take(&mut self.explanations)
    }
}

impl OrderEpilogues {
    /// Moves, in `func`'s body, the run of reshapes, loads and constants right after each
    /// convolution to before it; returns how many moved.
    fn order(&mut self, func: &mut Function) -> usize {
        let body = func.body();
        let mut insts = func.region(body).insts.clone();
        let mut moved = 0;
        for i in 0..insts.len() {
            if !matches!(func.inst(insts[i]).op, Op::Conv2d { .. }) {
                continue;
            }
            let y = func.inst(insts[i]).results[0];
            let movable = (insts[i + 1..].iter())
                .take_while(|&&inst| {
                    let data = func.inst(inst);
                    !data.args.contains(&y)
                        && matches!(
                            data.op,
                            Op::Reshape { .. } | Op::Load { .. } | Op::Const { .. }
                        )
                })
                .count();
            if movable == 0 {
                continue;
            }
            if self.explain {
                let lines: Vec<String> = (insts[i + 1..=i + movable].iter())
                    .map(|&inst| format!("`{}`", inst_line(func, inst).trim()))
                    .collect();
                self.explanations.push(format!(
                    "@{}: {} moved before `{}`, so that the kernel after it can run as its \
                     epilogue",
                    func.name(),
                    lines.join(", "),
                    inst_line(func, insts[i]).trim()
                ));
            }
            insts[i..=i + movable].rotate_left(1);
            moved += movable;
        }
        func.region_mut(body).insts = insts;
        moved
    }
}
