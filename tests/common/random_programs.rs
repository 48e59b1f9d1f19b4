//! A seeded generator of random well-typed modules, built through the `FunctionBuilder` so that
//! every op is typed as it is added. It covers every op of the IR, every dtype, fixed and
//! symbolic dimensions, size-0 and size-1 dimensions, nested regions, state, odd names and
//! awkward constants (NaN, infinities, -0.0, extreme integers and seeds) — in forms that can
//! go wrong: predicates computed from data (either branch runs), loop bodies that change what
//! they carry, products of two different values, gathers and scatters with repeated indices,
//! convolutions (strides, padding, dilation, groups) and pooling (overlapping, strided,
//! asymmetrically padded windows), `update_slice`, and products read and written through
//! reshapes and transposes that add axes of size 1 (a batch of one, one head, one token).

use kiln::backend::random::Stream;
use kiln::ir::{
    ArgOp, AxisSlice, BinaryOp, BuildResult, CompareOp, Conv2dAttrs, DType, Dim, F64Attr,
    FunctionBuilder, Initializer, Literal, Module, Op, Pool2dAttrs, ReduceOp, Shape, StateDecl,
    Type, UnaryOp, Value,
};

pub(crate) struct Gen {
    stream: Stream,
    next: u64,
}

impl Gen {
    pub(crate) fn new(seed: u64) -> Gen {
        Gen {
            stream: Stream::new(seed, 0),
            next: 0,
        }
    }

    fn bits(&mut self) -> u64 {
        self.next += 1;
        self.stream.bits(self.next)
    }

    /// A number in `0..n` (n > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.bits() % n.max(1) as u64) as usize
    }

    pub(crate) fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub(crate) fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    fn dtype(&mut self) -> DType {
        self.pick(&DType::ALL)
    }

    fn dim(&mut self, symbolic: bool) -> Dim {
        if symbolic && self.chance(30) {
            self.pick(&[Dim::sym("N"), Dim::sym("M")])
        } else {
            Dim::Fixed(self.pick(&[0, 1, 1, 2, 3, 4]))
        }
    }

    fn shape(&mut self, symbolic: bool) -> Shape {
        let rank = self.pick(&[0, 1, 1, 2, 2, 3]);
        Shape((0..rank).map(|_| self.dim(symbolic)).collect())
    }

    fn float(&mut self) -> f64 {
        match self.below(12) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4 => 1e-300,
            5 => f64::MAX,
            _ => (self.bits() as i64 as f64) / 1e15,
        }
    }

    fn literal(&mut self, dtype: DType, n: usize) -> Literal {
        match dtype {
            DType::F32 => Literal::F32((0..n).map(|_| self.float() as f32).collect()),
            DType::F64 => Literal::F64((0..n).map(|_| self.float()).collect()),
            DType::I32 => Literal::I32(
                (0..n)
                    .map(|_| self.pick(&[i32::MIN, -7, 0, 1, 42, i32::MAX]))
                    .collect(),
            ),
            DType::I64 => Literal::I64(
                (0..n)
                    .map(|_| self.pick(&[i64::MIN, -3, 0, 5, i64::MAX]))
                    .collect(),
            ),
            DType::Bool => Literal::Bool((0..n).map(|_| self.chance(50)).collect()),
        }
    }

    fn name(&mut self) -> String {
        self.pick(&[
            "x",
            "h",
            "fc1.w",
            "9lives",
            "with space",
            "_",
            "x",
            "loss",
            "grad/x",
        ])
        .to_owned()
    }
}

/// A random module of up to `size` ops per function.
pub(crate) fn random_module(seed: u64, size: usize) -> Module {
    let mut g = Gen::new(seed);
    let mut module = Module::new();
    for i in 0..g.below(4) {
        let dtype = g.dtype();
        let shape = g.shape(false);
        let init = match g.below(3) {
            0 => Initializer::constant(g.float()),
            1 => Initializer::uniform(-1.0, 1.0, g.bits()),
            _ => Initializer::normal(0.0, 0.5, g.bits()),
        };
        let name = if g.chance(20) {
            format!("odd name {i}\"")
        } else {
            format!("layer{i}.w")
        };
        let _ = module.declare_state(StateDecl {
            name,
            ty: Type::new(dtype, shape),
            init,
        });
    }
    for f in 0..1 + g.below(2) {
        let func = random_function(&mut g, &module, &format!("f{f}"), size);
        module.add_function(func);
    }
    module
}

fn random_function(g: &mut Gen, module: &Module, name: &str, size: usize) -> kiln::ir::Function {
    let mut b = FunctionBuilder::new(name);
    let mut pool: Vec<Value> = Vec::new();
    for _ in 0..1 + g.below(3) {
        let ty = Type::new(g.dtype(), g.shape(true));
        let arg_name = g.name();
        pool.push(b.arg(&arg_name, ty));
    }
    let mut stored = Vec::new();
    for _ in 0..size {
        if let Ok(Some(v)) = random_op(g, &mut b, module, &pool, &mut stored, 0) {
            if g.chance(30) {
                let n = g.name();
                b.set_name(v, &n);
            }
            // Only small values feed later ops, so no chain of ops can blow up the sizes.
            if is_small(b.value_type(v)) {
                pool.push(v);
            }
        }
    }
    let results: Vec<Value> = (0..g.below(3)).map(|_| g.pick(&pool)).collect();
    b.finish(&results)
        .expect("pool values are visible at the top level")
}

/// At most rank 4 and 256 elements, counting a symbolic dimension as 3.
fn is_small(ty: &Type) -> bool {
    let elements: usize = ty
        .shape
        .dims()
        .iter()
        .map(|d| d.as_fixed().unwrap_or(3))
        .product();
    ty.rank() <= 4 && elements <= 256
}

/// Adds one random op over values of `pool`; `Ok(None)` when the op has no result.
/// Type errors are expected (the operands were picked blindly) and simply skipped.
fn random_op(
    g: &mut Gen,
    b: &mut FunctionBuilder,
    module: &Module,
    pool: &[Value],
    stored: &mut Vec<String>,
    depth: usize,
) -> BuildResult<Option<Value>> {
    let x = g.pick(pool);
    let y = g.pick(pool);
    let tx = b.value_type(x).clone();
    let v = match g.below(28) {
        0 | 1 => b.unary(g.pick(UnaryOp::ALL), x)?,
        2 | 3 => b.binary(g.pick(BinaryOp::ALL), x, y)?,
        4 => b.compare(g.pick(CompareOp::ALL), x, y)?,
        5 => {
            // A real choice: elements of x where x < y, else y's.
            let c = b.compare(CompareOp::Lt, x, y)?;
            b.select(c, x, y)?
        }
        6 => b.cast(x, g.dtype())?,
        7 => match tx.shape.as_fixed() {
            Some(dims) => {
                let n: usize = dims.iter().product();
                b.reshape(x, Shape::fixed(&[n]))?
            }
            None => b.reshape(x, Shape(tx.shape.0.iter().rev().cloned().collect()))?,
        },
        8 => {
            let mut perm: Vec<usize> = (0..tx.rank()).collect();
            perm.reverse();
            b.transpose(x, perm)?
        }
        9 => {
            let axes = tx
                .shape
                .dims()
                .iter()
                .map(|d| match d.as_fixed() {
                    Some(n) if n > 0 && g.chance(70) => {
                        let start = g.below(n);
                        AxisSlice::Range {
                            start,
                            end: start + g.below(n - start + 1),
                            step: 1 + g.below(2),
                        }
                    }
                    _ => AxisSlice::Full,
                })
                .collect();
            b.slice(x, axes)?
        }
        10 => b.concat(&[x, x], g.below(tx.rank().max(1)))?,
        11 => {
            let axes: Vec<usize> = (0..tx.rank()).filter(|_| g.chance(50)).collect();
            b.reduce(g.pick(ReduceOp::ALL), x, axes, g.chance(50))?
        }
        12 => b.arg_reduce(
            g.pick(ArgOp::ALL),
            x,
            g.below(tx.rank().max(1)),
            g.chance(50),
        )?,
        // A general product of two values when their shapes allow, else x·xᵀ; sometimes
        // accumulated onto itself (`matmul_acc`, the `fold_updates` pass's form).
        13 => {
            let (ta, tb) = (g.chance(30), g.chance(30));
            let (p, operands, flags) = match b.matmul_t(x, y, ta, tb) {
                Ok(v) => (v, [x, y], [ta, tb]),
                Err(_) => (b.matmul_t(x, x, false, true)?, [x, x], [false, true]),
            };
            if g.chance(25) && b.value_type(p).dtype.is_float() {
                let op = Op::MatMulAcc {
                    transpose_a: flags[0],
                    transpose_b: flags[1],
                    scale: F64Attr(g.pick(&[-0.5, 0.25, 2.0])),
                };
                b.insert(op, &[operands[0], operands[1], p])?[0]
            } else {
                p
            }
        }
        14 => {
            // Indices in range, repeats likely, along any axis.
            let axis = g.below(tx.rank().max(1));
            let n = tx
                .shape
                .dims()
                .get(axis)
                .and_then(Dim::as_fixed)
                .unwrap_or(0);
            let count = 1 + g.below(4);
            let picks: Vec<i64> = (0..count).map(|_| g.below(n.max(1)) as i64).collect();
            let idx_ty = Type::new(DType::I64, Shape::fixed(&[count]));
            let idx = b.constant(Literal::I64(picks), idx_ty)?;
            b.gather(x, idx, axis)?
        }
        15 => {
            let labels_ty = Type::new(g.pick(&[DType::I32, DType::I64]), g.shape(false));
            let labels = b.iota(labels_ty.clone(), g.below(labels_ty.rank().max(1)))?;
            b.one_hot(labels, 1 + g.below(4), g.dtype())?
        }
        16 => {
            let dtype = g.dtype();
            let shape = if g.chance(50) {
                tx.shape.clone()
            } else {
                g.shape(false)
            };
            let n = if g.chance(40) {
                1
            } else {
                shape.num_elements().unwrap_or(1)
            };
            let lit = g.literal(dtype, n);
            b.constant(lit, Type::new(dtype, shape))?
        }
        17 => {
            let ty = Type::new(g.pick(&[DType::F32, DType::F64]), tx.shape.clone());
            let seed = g.bits();
            if g.chance(50) {
                b.random_uniform(ty, -1.0, 2.0, seed)?
            } else {
                b.random_normal(ty, 0.5, 3.0, seed)?
            }
        }
        18 => b.iota(
            Type::new(
                g.pick(&[DType::I32, DType::I64, DType::F32]),
                tx.shape.clone(),
            ),
            g.below(tx.rank().max(1)),
        )?,
        19 if !module.states.is_empty() => {
            let decl = g.pick(&module.states);
            let loaded = b.load(&decl)?;
            if depth == 0 && !stored.contains(&decl.name) && g.chance(50) {
                let next = b.unary(UnaryOp::Abs, loaded).unwrap_or(loaded);
                if b.store(&decl, next).is_ok() {
                    stored.push(decl.name.clone());
                }
            }
            loaded
        }
        20 if depth < 2 => {
            // A predicate computed from the data, so either branch may run.
            let all: Vec<usize> = (0..tx.rank()).collect();
            let p = match b.reduce(ReduceOp::Sum, x, all, false) {
                Ok(total) => {
                    let zero = b.scalar(b.value_type(total).dtype, 0.0)?;
                    b.compare(CompareOp::Gt, total, zero)?
                }
                Err(_) => b.scalar(DType::Bool, 1.0)?,
            };
            let then_pool = pool.to_vec();
            let mut inner = Vec::new();
            let results = b.cond::<kiln::ir::BuildError>(
                p,
                |b| {
                    let v =
                        random_op(g, b, module, &then_pool, &mut inner, depth + 1)?.unwrap_or(x);
                    Ok(vec![v])
                },
                |_| Ok(vec![x]),
            );
            match results {
                Ok(r) => r[0],
                // The branches yielded different types: build a well-typed cond instead.
                Err(_) => b.cond(
                    p,
                    |_| Ok(vec![x]),
                    |b| Ok(vec![b.unary(UnaryOp::Abs, x).unwrap_or(x)]),
                )?[0],
            }
        }
        21 if depth < 2 => {
            let zero = b.scalar(DType::I32, 0.0)?;
            let limit = b.scalar(DType::I32, g.below(4) as f64)?;
            let out = b.while_loop(
                &[zero, x],
                |b, c| b.compare(CompareOp::Lt, c[0], limit),
                |b, c| {
                    let one = b.scalar(DType::I32, 1.0)?;
                    let i = b.add(c[0], one)?;
                    // A body that changes what it carries.
                    let op = g.pick(&[UnaryOp::Tanh, UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sin]);
                    let next = b.unary(op, c[1]).unwrap_or(c[1]);
                    Ok(vec![i, next])
                },
            )?;
            out[1]
        }
        22 => {
            let out = b.call("custom.op", &[x, y], vec![tx.clone()])?;
            out[0]
        }
        23 if g.chance(50) => {
            let low = (0..tx.rank()).map(|_| g.below(2)).collect();
            let high = (0..tx.rank()).map(|_| g.below(2)).collect();
            let interior = (0..tx.rank()).map(|_| g.below(2)).collect();
            b.pad(x, low, high, interior)?
        }
        23 => {
            // Repeated indices accumulate.
            let n = tx.shape.dims().first().and_then(Dim::as_fixed).unwrap_or(0);
            let picks: Vec<i32> = (0..n).map(|_| g.below(n.max(1)) as i32).collect();
            let idx_ty = Type::new(DType::I32, Shape::fixed(&[n]));
            let idx = b.constant(Literal::I32(picks), idx_ty)?;
            let mut shape = tx.shape.clone();
            if let Some(first) = shape.0.first_mut() {
                *first = Dim::Fixed(n + g.below(2));
            }
            b.scatter_add(x, idx, 0, shape)?
        }
        24 => view_product(g, b, x)?,
        25 => {
            // A convolution of a small NCHW draw: strides, padding, dilation and groups.
            let dtype = g.pick(&[DType::F32, DType::F64]);
            let groups = 1 + g.below(2);
            let (c, o) = (groups * (1 + g.below(2)), groups * (1 + g.below(2)));
            let [h, w] = [2 + g.below(4), 2 + g.below(4)];
            let x_ty = Type::new(dtype, Shape::fixed(&[1 + g.below(2), c, h, w]));
            let input = b.random_normal(x_ty, 0.0, 1.0, g.bits())?;
            let k = [1 + g.below(3), 1 + g.below(3)];
            let w_ty = Type::new(dtype, Shape::fixed(&[o, c / groups, k[0], k[1]]));
            let weights = b.random_normal(w_ty, 0.0, 1.0, g.bits())?;
            let attrs = Conv2dAttrs {
                strides: [1 + g.below(2), 1 + g.below(2)],
                padding: [(g.below(2), g.below(2)), (g.below(2), g.below(2))],
                dilation: [1 + g.below(2), 1 + g.below(2)],
                groups,
                channels_last: false,
            };
            b.conv2d(input, weights, attrs)?
        }
        26 => {
            // Max or average pooling: overlapping windows, strides apart from the window,
            // asymmetric padding.
            let dtype = g.pick(&[DType::F32, DType::F64]);
            let shape = [
                1 + g.below(2),
                1 + g.below(2),
                3 + g.below(4),
                3 + g.below(4),
            ];
            let input =
                b.random_uniform(Type::new(dtype, Shape::fixed(&shape)), -1.0, 1.0, g.bits())?;
            let window = [1 + g.below(3), 1 + g.below(3)];
            let attrs = Pool2dAttrs {
                window,
                strides: [1 + g.below(3), 1 + g.below(3)],
                padding: [
                    (g.below(window[0]), g.below(window[0])),
                    (g.below(window[1]), g.below(window[1])),
                ],
                channels_last: false,
            };
            match g.chance(50) {
                true => b.max_pool2d(input, attrs)?,
                false => b.avg_pool2d(input, attrs)?,
            }
        }
        27 => {
            // A slice of x along its first axis replaced by another value of that shape.
            let n = tx.shape.dims().first().and_then(Dim::as_fixed).unwrap_or(0);
            let slice = Type::new(
                tx.dtype,
                Shape(tx.shape.0.iter().skip(1).cloned().collect()),
            );
            let value = match tx.dtype.is_float() {
                true => b.random_normal(slice, 0.0, 1.0, g.bits())?,
                false => b.iota(slice, 0)?,
            };
            let at = b.scalar(DType::I64, g.below(n.max(1)) as f64)?;
            b.update_slice(x, value, at, 0)?
        }
        _ => b.broadcast_to(
            x,
            &Shape(
                std::iter::once(Dim::Fixed(2))
                    .chain(tx.shape.0.iter().cloned())
                    .collect(),
            ),
        )?,
    };
    Ok(Some(v))
}

/// A product reading `x` through views on purpose: `x` reshaped with axes of size 1 put in
/// (`[p, k]` as `[1, p, k]`, `[p, 1, k]`, `[1, p, 1, k]`, …), permuted, multiplied by a drawn
/// right operand, and the result sometimes transposed back (keeping its last axis last, so
/// the product may write through it). Size-1 axes may have any stride in a view: the
/// executor's view, reshape and transpose rewrites must not read them.
fn view_product(g: &mut Gen, b: &mut FunctionBuilder, x: Value) -> BuildResult<Value> {
    let tx = b.value_type(x).clone();
    let x = match tx.dtype {
        DType::F32 | DType::F64 => x,
        _ => b.cast(x, DType::F32)?,
    };
    let dtype = b.value_type(x).dtype;
    let Some(dims) = tx
        .shape
        .as_fixed()
        .filter(|d| d.iter().product::<usize>() > 0)
    else {
        return b.matmul_t(x, x, false, true);
    };
    let n: usize = dims.iter().product();
    let k = dims.last().copied().unwrap_or(1);
    let mut view = vec![n / k, k];
    for _ in 0..1 + g.below(2) {
        let at = g.below(view.len() + 1);
        view.insert(at, 1);
    }
    let x = b.reshape(x, Shape::fixed(&view))?;
    let mut perm: Vec<usize> = (0..view.len()).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, g.below(i + 1));
    }
    let x = b.transpose(x, perm)?;
    let rank = b.value_type(x).rank();
    let contracted = b.value_type(x).shape.dims()[rank - 1]
        .as_fixed()
        .unwrap_or(1);
    let w_ty = Type::new(dtype, Shape::fixed(&[contracted, 1 + g.below(3)]));
    let w = b.random_normal(w_ty, 0.0, 1.0, g.bits())?;
    let y = b.matmul(x, w)?;
    if g.chance(50) {
        let mut back: Vec<usize> = (0..rank).collect();
        back[..rank - 1].reverse();
        return b.transpose(y, back);
    }
    Ok(y)
}
