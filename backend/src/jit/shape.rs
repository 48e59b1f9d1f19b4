//! Shaping a kernel function for its plan, without changing what it computes or the layout
//! of its buffers.
//!
//! **Collapsing axes**: adjacent axes that every value of the kernel treats alike
//! (both stretched over the domain, or both of size 1) are one axis for the kernel, since its
//! buffers are row-major. `x + b` over `[N,64,4,4]` with `b: [1,64,1,1]` becomes a walk over
//! `[N,64,16]`: rows of 16 elements instead of 4, so the vector loop does the work rather than
//! the row bookkeeping. (tinygrad's shape tracker merges dimensions for the same reason.)
//!
//! Only fixed sizes merge (a symbolic size times a fixed one has no `Dim`), and only kernels
//! whose values all have the domain's rank or are scalars: a kernel that reshapes, drops
//! reduced axes or numbers an axis (iota) keeps its axes.
//!
//! **Splitting reductions**: a reduction over the last axis and others (a bias gradient,
//! `[N,C,H·W]` summed over `N` and `H·W`) becomes a reduction of the last axis — computed row
//! by row, along contiguous memory, in a rows stage — and a reduction of the rest over the
//! much smaller result, so the one-thread accumulate stage walks `N·C` values, not `N·C·H·W`.

use kiln_ir::{Dim, Function, Loc, Op, Shape, Type, Value};

/// `func` shaped for its plan: axes collapsed, then reductions split.
pub(crate) fn for_plan(func: &Function) -> Function {
    split_reductions(collapse_axes(func))
}

/// `func` with its mergeable axes merged; the same function when none are. The arguments and
/// results keep their order and element counts, so the kernel's buffers are unchanged.
fn collapse_axes(func: &Function) -> Function {
    let mut func = func.clone();
    let Some(mut domain) = domain(&func) else {
        return func;
    };
    let mut axis = domain.len().saturating_sub(1);
    while axis > 0 {
        let pair = axis - 1;
        if mergeable(&func, &domain, pair) {
            merge(&mut func, pair);
            domain[pair] = domain[pair].zip(domain[pair + 1]).map(|(a, b)| a * b);
            domain.remove(pair + 1);
        }
        axis -= 1;
    }
    func
}

/// Every value of the body: the arguments, then each instruction's results.
fn values(func: &Function) -> Vec<Value> {
    let body = func.region(func.body());
    let mut out = func.args().to_vec();
    out.extend(
        body.insts
            .iter()
            .flat_map(|&i| func.inst(i).results.clone()),
    );
    out
}

/// The size of each domain axis (`None`: symbolic), when every value has the domain's rank or
/// none and no instruction stops the axes from merging.
fn domain(func: &Function) -> Option<Vec<Option<usize>>> {
    let body = func.region(func.body());
    let blocks = body.insts.iter().any(|&i| match &func.inst(i).op {
        Op::Iota { .. } | Op::Reshape { .. } => true,
        Op::Reduce { keep_dims, .. } => !keep_dims,
        _ => false,
    });
    let shapes: Vec<&Shape> = (values(func).into_iter())
        .map(|v| &func.value_type(v).shape)
        .collect();
    let rank = shapes.iter().map(|s| s.rank()).max()?;
    if blocks || rank < 2 || shapes.iter().any(|s| s.rank() != 0 && s.rank() != rank) {
        return None;
    }
    let extent = |a: usize| -> Option<Option<usize>> {
        let mut full = (shapes.iter())
            .filter(|s| s.rank() == rank && !s.0[a].is_one())
            .map(|s| &s.0[a]);
        let first = full.next();
        match first {
            None => Some(Some(1)),
            Some(d) if full.all(|e| e == d) => Some(d.as_fixed()),
            Some(_) => None,
        }
    };
    (0..rank).map(extent).collect()
}

/// Whether axes `pair` and `pair + 1` merge: both fixed, and every value either spans both or
/// neither (an axis of size 1 in the domain merges with anything).
fn mergeable(func: &Function, domain: &[Option<usize>], pair: usize) -> bool {
    let (Some(a), Some(b)) = (domain[pair], domain[pair + 1]) else {
        return false;
    };
    if a == 1 || b == 1 {
        return true;
    }
    values(func).into_iter().all(|v| {
        let shape = &func.value_type(v).shape;
        shape.rank() == 0 || shape.0[pair].is_one() == shape.0[pair + 1].is_one()
    })
}

/// Merges axes `pair` and `pair + 1` of every value and of the attributes that name axes or
/// shapes.
fn merge(func: &mut Function, pair: usize) {
    let merged = |shape: &Shape| -> Shape {
        if shape.rank() == 0 {
            return shape.clone();
        }
        let mut dims = shape.0.clone();
        let size = |d: &Dim| d.as_fixed().expect("merged axes are fixed");
        dims[pair] = Dim::Fixed(size(&dims[pair]) * size(&dims[pair + 1]));
        dims.remove(pair + 1);
        Shape(dims)
    };
    let retype = |ty: &Type| Type::new(ty.dtype, merged(&ty.shape));
    let insts = func.region(func.body()).insts.clone();
    for inst in insts {
        let input_shape = (func.inst(inst).args.first())
            .map(|&a| func.value_type(a).shape.clone())
            .unwrap_or_default();
        match &mut func.inst_mut(inst).op {
            Op::Broadcast { shape } => *shape = merged(shape),
            Op::Const { ty, .. } => *ty = retype(ty),
            Op::Reduce { axes, .. } => {
                // A reduction over an axis of size 1 changes nothing, so the merged axis is
                // reduced when a reduced one of the pair had more than one element.
                let reduces = |a: usize| axes.contains(&a) && !input_shape.0[a].is_one();
                let keep = reduces(pair) || reduces(pair + 1);
                let mut renumbered: Vec<usize> = (axes.iter())
                    .filter(|&&a| a != pair && a != pair + 1)
                    .map(|&a| if a > pair + 1 { a - 1 } else { a })
                    .collect();
                if keep {
                    renumbered.push(pair);
                }
                renumbered.sort_unstable();
                *axes = renumbered;
            }
            _ => {}
        }
    }
    for v in values(func) {
        let ty = retype(func.value_type(v));
        func.set_value_type(v, ty);
    }
    let results = func.result_types().iter().map(retype).collect();
    func.set_result_types(results);
}

/// Splits each reduction (keeping its axes) over the last axis and others into a reduction of
/// the last axis and one of the others. Sums, means, maxima and minima all compose so (a mean
/// of equal-sized means is the mean).
fn split_reductions(mut func: Function) -> Function {
    let body = func.body();
    let insts = func.region(body).insts.clone();
    let mut order = Vec::with_capacity(insts.len());
    for inst in insts {
        let data = func.inst(inst);
        let input = data.args.first().copied();
        let split = match (&data.op, input) {
            (
                Op::Reduce {
                    axes,
                    keep_dims,
                    op,
                },
                Some(input),
            ) => {
                let shape = &func.value_type(input).shape;
                let last = shape.rank().checked_sub(1);
                let spans = |a: usize| !shape.0[a].is_one();
                match last {
                    Some(last)
                        if *keep_dims
                            && axes.contains(&last)
                            && spans(last)
                            && axes.iter().any(|&a| a != last && spans(a)) =>
                    {
                        Some((*op, axes.clone(), last, input))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some((op, axes, last, input)) = split {
            let ty = func.value_type(input);
            let mut rows = ty.shape.0.clone();
            rows[last] = Dim::Fixed(1);
            let row_type = Type::new(ty.dtype, Shape(rows));
            let row_op = Op::Reduce {
                op,
                axes: vec![last],
                keep_dims: true,
            };
            let row = func.create_inst(row_op, vec![input], vec![row_type], vec![], Loc::Unknown);
            let row_value = func.inst(row).results[0];
            let data = func.inst_mut(inst);
            data.args[0] = row_value;
            data.op = Op::Reduce {
                op,
                axes: axes.into_iter().filter(|&a| a != last).collect(),
                keep_dims: true,
            };
            order.push(row);
        }
        order.push(inst);
    }
    func.region_mut(body).insts = order;
    func
}
