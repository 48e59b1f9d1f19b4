//! Each Kiln op written as ONNX nodes: one arm per op, most of them one node.

use super::composites::Composite;
use super::graph::{
    Graph, attr_float, attr_graph, attr_int, attr_ints, attr_string, attr_tensor, value_info,
};
use super::{ExportError, Why};
use crate::tensor;
use kiln_ir::{
    ArgOp, AxisSlice, BinaryOp, CompareOp, Conv2dAttrs, ConvKind, DType, Dim, Inst, Literal, Op,
    Pool2dAttrs, PoolKind, ReduceOp, Region, Shape, Type, UnaryOp, Value,
};

/// Writes instruction `inst` as nodes; an op ONNX cannot express is refused with why.
fn emit(g: &mut Graph, inst: Inst) -> Result<(), Why> {
    if g.composites.absorbed.contains(&inst) {
        return Ok(()); // written by its composite's root
    }
    if g.composites.implicit.contains(&inst) {
        let data = g.func.inst(inst);
        let (x, y) = (data.args[0], data.results[0]);
        let name = g.name(x);
        g.alias(y, name);
        return Ok(());
    }
    if let Some(composite) = g.composites.roots.get(&inst).cloned() {
        let y = g.name(g.func.inst(inst).results[0]);
        return write_composite(g, &composite, &y);
    }
    let data = g.func.inst(inst).clone();
    let names: Vec<String> = data.args.iter().map(|&a| g.name(a)).collect();
    let x: Vec<&str> = names.iter().map(String::as_str).collect();
    // A load's and a fused region's results take other tensors' names.
    let y = match (&data.op, data.results.first()) {
        (Op::Load { .. } | Op::Fused, _) | (_, None) => String::new(),
        (_, Some(&r)) => g.name(r),
    };
    let node1 = |g: &mut Graph, op: &str, attrs| {
        g.node(op, &x, &[&y], attrs);
        Ok(())
    };
    match &data.op {
        Op::Const { value, ty } => constant(g, value, ty, &y),
        Op::Unary(op) => unary(g, *op, x[0], &y),
        Op::Binary(op) => node1(g, binary_name(*op), vec![]),
        Op::Compare(CompareOp::Ne) => {
            let eq = g.op("Equal", &x, "eq", vec![]);
            g.node("Not", &[&eq], &[&y], vec![]);
            Ok(())
        }
        Op::Compare(op) => node1(g, compare_name(*op), vec![]),
        Op::Select => node1(g, "Where", vec![]),
        Op::Cast { to } => node1(
            g,
            "Cast",
            vec![attr_int("to", tensor::elem_type(*to) as i64)],
        ),
        Op::Broadcast { shape } => {
            let s = g.shape_tensor(shape)?;
            g.node("Expand", &[x[0], &s], &[&y], vec![]);
            Ok(())
        }
        Op::Reshape { shape } => reshape(g, x[0], shape, &y),
        Op::Transpose { perm } => node1(g, "Transpose", vec![attr_ints("perm", &ints(perm))]),
        Op::Slice { axes } => slice(g, x[0], axes, &y),
        Op::Pad {
            low,
            high,
            interior,
        } => pad(g, x[0], low, high, interior, &y),
        Op::Concat { axis } => node1(g, "Concat", vec![attr_int("axis", *axis as i64)]),
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => reduce(g, *op, x[0], axes, *keep_dims, &y),
        Op::ArgReduce {
            op,
            axis,
            keep_dims,
        } => {
            let name = if *op == ArgOp::ArgMax {
                "ArgMax"
            } else {
                "ArgMin"
            };
            let attrs = vec![
                attr_int("axis", *axis as i64),
                attr_int("keepdims", *keep_dims as i64),
            ];
            node1(g, name, attrs)
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => matmul(
            g,
            [x[0], x[1]],
            &data.args,
            [*transpose_a, *transpose_b],
            &y,
        ),
        Op::MatMulAcc {
            transpose_a,
            transpose_b,
            scale,
        } => {
            if is_gemm(g, &data.args) && g.func.value_type(data.args[2]).rank() == 2 {
                let attrs = vec![
                    attr_float("alpha", scale.0 as f32),
                    attr_int("transA", *transpose_a as i64),
                    attr_int("transB", *transpose_b as i64),
                ];
                return node1(g, "Gemm", attrs);
            }
            let ab = g.fresh("product");
            let flags = [*transpose_a, *transpose_b];
            matmul(g, [x[0], x[1]], &data.args, flags, &ab)?;
            let dtype = g.func.value_type(data.args[2]).dtype;
            let scaled = match scale.0 {
                1.0 => ab,
                s => {
                    let s = scalar(g, dtype, s);
                    g.op("Mul", &[&ab, &s], "scaled", vec![])
                }
            };
            g.node("Add", &[x[2], &scaled], &[&y], vec![]);
            Ok(())
        }
        Op::Gather { axis } => {
            node1(g, "Gather", vec![attr_int("axis", *axis as i64)])?;
            g.document_last(crate::GATHER_IN_RANGE_DOC);
            Ok(())
        }
        Op::UpdateSlice { axis } => update_slice(g, [x[0], x[1], x[2]], data.args[2], *axis, &y),
        Op::ScatterAdd { axis, shape } => {
            let dtype = g.func.value_type(data.results[0]).dtype;
            scatter_add(g, [x[0], x[1]], &data.args, *axis, shape, dtype, &y)
        }
        Op::Conv2d { kind, attrs } => conv(g, [x[0], x[1]], &data.args, *kind, attrs, &y),
        Op::Pool2d { kind, attrs } => pool(g, x[0], *kind, attrs, &y),
        Op::OneHot { depth, dtype } => {
            let depth = g.ints(&[*depth as i64]);
            let values = Type::new(*dtype, Shape::fixed(&[2]));
            let off_on = literal(*dtype, [0.0, 1.0].into_iter());
            let values = g.constant("off_on", tensor::from_literal(&off_on, &values, None));
            g.node("OneHot", &[x[0], &depth, &values], &[&y], vec![]);
            Ok(())
        }
        Op::Iota { axis, ty } => iota(g, *axis, ty, &y),
        Op::Random { .. } => Err(
            "random samples: ONNX's random ops do not draw Kiln's numbers, \
             so the model would compute something else"
                .into(),
        ),
        Op::Load { state, ty } => {
            let name = g.load(state, ty)?;
            g.alias(data.results[0], name);
            Ok(())
        }
        Op::Store { state } => {
            // The verifier keeps stores at the function's top level.
            g.stored.insert(state.clone(), names[0].clone());
            Ok(())
        }
        Op::Cond => if_node(g, &data.regions, x[0], &data.results),
        Op::While => loop_node(g, &data.regions, &names, &data.results),
        Op::Fused => {
            let region = data.regions[0];
            for (&arg, name) in g.func.region(region).args.clone().iter().zip(names) {
                g.alias(arg, name);
            }
            let yielded = emit_region(g, region)?;
            for (&r, name) in data.results.iter().zip(yielded) {
                g.alias(r, name);
            }
            Ok(())
        }
        Op::Call { callee, .. } => Err(Why::Reason(format!(
            "custom op `{callee}` has no ONNX form"
        ))),
        kiln_ir::communication_op!() => {
            Err("communicates between ranks; an ONNX graph runs on one device".into())
        }
    }
}

/// A composite as ONNX's op of it (see [`super::composites`]).
fn write_composite(g: &mut Graph, composite: &Composite, y: &str) -> Result<(), Why> {
    match composite {
        Composite::Gemm { product, c } => {
            let data = g.func.inst(*product).clone();
            let Op::MatMul {
                transpose_a,
                transpose_b,
            } = data.op
            else {
                unreachable!("a Gemm composite's product is a matmul")
            };
            let (a, b, c) = (g.name(data.args[0]), g.name(data.args[1]), g.name(*c));
            let attrs = vec![
                attr_int("transA", transpose_a as i64),
                attr_int("transB", transpose_b as i64),
            ];
            g.node("Gemm", &[&a, &b, &c], &[y], attrs);
        }
        Composite::Conv { conv, bias } => {
            let data = g.func.inst(*conv).clone();
            let Op::Conv2d { attrs, .. } = &data.op else {
                unreachable!("a Conv composite's convolution is a conv2d")
            };
            let w = g.func.value_type(data.args[1]).shape.as_fixed();
            let kernel = w.map(|w| [w[2], w[3]]).ok_or("weights of symbolic shape")?;
            let (x, w, bias) = (g.name(data.args[0]), g.name(data.args[1]), g.name(*bias));
            g.node("Conv", &[&x, &w, &bias], &[y], window_attrs(attrs, kernel));
        }
        Composite::Attention {
            q,
            k,
            v,
            mask,
            scale,
        } => {
            let mut inputs = vec![g.name(*q), g.name(*k), g.name(*v)];
            inputs.extend(mask.map(|m| g.name(m)));
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            g.node(
                "Attention",
                &inputs,
                &[y],
                vec![attr_float("scale", *scale as f32)],
            );
        }
        Composite::LayerNorm {
            x,
            scale,
            bias,
            eps,
        } => {
            let (x, scale, bias) = (g.name(*x), g.name(*scale), g.name(*bias));
            let attrs = vec![attr_int("axis", -1), attr_float("epsilon", *eps as f32)];
            g.node("LayerNormalization", &[&x, &scale, &bias], &[y], attrs);
        }
        Composite::Recurrent(layer) => super::recurrent::write(g, layer, y),
    }
    Ok(())
}

/// Writes every instruction of `region`; returns the tensors it yields.
pub(super) fn emit_region(g: &mut Graph, region: Region) -> Result<Vec<String>, ExportError> {
    let func = g.func;
    for &inst in &func.region(region).insts {
        emit(g, inst).map_err(|why| super::refusal(func, inst, why))?;
    }
    Ok((func.region(region).results.iter())
        .map(|&v| g.name(v))
        .collect())
}

fn ints(values: &[usize]) -> Vec<i64> {
    values.iter().map(|&v| v as i64).collect()
}

fn scalar(g: &mut Graph, dtype: DType, value: f64) -> String {
    let literal = Literal::scalar(dtype, value);
    g.constant(
        "scalar",
        tensor::from_literal(&literal, &Type::scalar(dtype), None),
    )
}

fn constant(g: &mut Graph, value: &Literal, ty: &Type, y: &str) -> Result<(), Why> {
    let count = ty.shape.num_elements();
    if count == Some(value.len()) {
        let t = tensor::from_literal(value, ty, None);
        g.node("Constant", &[], &[y], vec![attr_tensor("value", t)]);
        return Ok(());
    }
    // A splat: one element filling a shape, which may be symbolic.
    let one = Type::new(ty.dtype, Shape::fixed(&[1]));
    let t = tensor::from_literal(value, &one, None);
    let shape = g.shape_tensor(&ty.shape)?;
    let attrs = vec![attr_tensor("value", t)];
    g.node("ConstantOfShape", &[&shape], &[y], attrs);
    Ok(())
}

fn unary(g: &mut Graph, op: UnaryOp, x: &str, y: &str) -> Result<(), Why> {
    let name = match op {
        UnaryOp::Neg => "Neg",
        UnaryOp::Abs => "Abs",
        UnaryOp::Sign => "Sign",
        UnaryOp::Relu => "Relu",
        UnaryOp::Exp => "Exp",
        UnaryOp::Log => "Log",
        UnaryOp::Sqrt => "Sqrt",
        UnaryOp::Rsqrt => {
            let root = g.op("Sqrt", &[x], "sqrt", vec![]);
            g.node("Reciprocal", &[&root], &[y], vec![]);
            return Ok(());
        }
        UnaryOp::Recip => "Reciprocal",
        UnaryOp::Tanh => "Tanh",
        UnaryOp::Sigmoid => "Sigmoid",
        UnaryOp::Softplus => "Softplus",
        UnaryOp::Erf => "Erf",
        UnaryOp::Sin => "Sin",
        UnaryOp::Cos => "Cos",
        UnaryOp::Floor => "Floor",
        UnaryOp::Ceil => "Ceil",
        UnaryOp::Round => "Round",
        UnaryOp::Not => "Not",
        UnaryOp::StopGradient => {
            g.node("Identity", &[x], &[y], vec![]);
            g.document_last(crate::STOP_GRADIENT_DOC);
            return Ok(());
        }
    };
    g.node(name, &[x], &[y], vec![]);
    Ok(())
}

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Max => "Max",
        BinaryOp::Min => "Min",
        BinaryOp::Pow => "Pow",
        BinaryOp::And => "And",
        BinaryOp::Or => "Or",
        BinaryOp::Xor => "Xor",
    }
}

fn compare_name(op: CompareOp) -> &'static str {
    match op {
        CompareOp::Eq | CompareOp::Ne => "Equal",
        CompareOp::Lt => "Less",
        CompareOp::Le => "LessOrEqual",
        CompareOp::Gt => "Greater",
        CompareOp::Ge => "GreaterOrEqual",
    }
}

fn reshape(g: &mut Graph, x: &str, shape: &Shape, y: &str) -> Result<(), Why> {
    let s = g.shape_tensor(shape)?;
    // ONNX reads a 0 in the shape as "copy the input's size" unless allowzero is set.
    let has_zero = shape.dims().contains(&Dim::Fixed(0));
    let attrs = match has_zero {
        true => vec![attr_int("allowzero", 1)],
        false => vec![],
    };
    g.node("Reshape", &[x, &s], &[y], attrs);
    Ok(())
}

fn slice(g: &mut Graph, x: &str, axes: &[AxisSlice], y: &str) -> Result<(), Why> {
    let (mut starts, mut ends, mut which, mut steps) = (vec![], vec![], vec![], vec![]);
    for (axis, s) in axes.iter().enumerate() {
        if let AxisSlice::Range { start, end, step } = *s {
            starts.push(start as i64);
            ends.push(end as i64);
            which.push(axis as i64);
            steps.push(step as i64);
        }
    }
    if which.is_empty() {
        g.node("Identity", &[x], &[y], vec![]);
        return Ok(());
    }
    let inputs = [&starts, &ends, &which, &steps].map(|v| g.ints(v));
    g.node(
        "Slice",
        &[x, &inputs[0], &inputs[1], &inputs[2], &inputs[3]],
        &[y],
        vec![],
    );
    Ok(())
}

fn pad(
    g: &mut Graph,
    x: &str,
    low: &[usize],
    high: &[usize],
    interior: &[usize],
    y: &str,
) -> Result<(), Why> {
    if interior.iter().any(|&i| i > 0) {
        return Err("interior padding (a strided slice's gradient) has no ONNX op".into());
    }
    let pads = g.ints(&ints(&[low, high].concat()));
    g.node("Pad", &[x, &pads], &[y], vec![]);
    Ok(())
}

fn reduce(
    g: &mut Graph,
    op: ReduceOp,
    x: &str,
    axes: &[usize],
    keep_dims: bool,
    y: &str,
) -> Result<(), Why> {
    if axes.is_empty() {
        // ONNX reads no axes as all of them.
        g.node("Identity", &[x], &[y], vec![]);
        return Ok(());
    }
    let name = match op {
        ReduceOp::Sum => "ReduceSum",
        ReduceOp::Mean => "ReduceMean",
        ReduceOp::Max => "ReduceMax",
        ReduceOp::Min => "ReduceMin",
    };
    let keep = attr_int("keepdims", keep_dims as i64);
    // ReduceSum takes its axes as an input since opset 13, the others since opset 18.
    if op == ReduceOp::Sum || g.opset >= 18 {
        let axes = g.ints(&ints(axes));
        g.node(name, &[x, &axes], &[y], vec![keep]);
    } else {
        g.node(name, &[x], &[y], vec![keep, attr_ints("axes", &ints(axes))]);
    }
    Ok(())
}

/// Whether a product of `args` is written as `Gemm`: float matrices (onnxruntime has no
/// integer `Gemm`).
pub(super) fn is_gemm(g: &Graph, args: &[Value]) -> bool {
    let ty = |i: usize| g.func.value_type(args[i]);
    ty(0).dtype.is_float() && ty(0).rank() == 2 && ty(1).rank() == 2
}

/// A product: `Gemm` for float matrices (its flags transpose in place), else `MatMul` after
/// transposing the last two axes where asked.
fn matmul(
    g: &mut Graph,
    x: [&str; 2],
    args: &[Value],
    transpose: [bool; 2],
    y: &str,
) -> Result<(), Why> {
    if is_gemm(g, args) {
        let attrs = vec![
            attr_int("transA", transpose[0] as i64),
            attr_int("transB", transpose[1] as i64),
        ];
        g.node("Gemm", &x, &[y], attrs);
        return Ok(());
    }
    let mut operands = [x[0].to_owned(), x[1].to_owned()];
    for i in 0..2 {
        if transpose[i] {
            let rank = g.func.value_type(args[i]).rank();
            let mut perm: Vec<i64> = (0..rank as i64).collect();
            perm.swap(rank - 2, rank - 1);
            operands[i] = g.op(
                "Transpose",
                &[&operands[i]],
                "t",
                vec![attr_ints("perm", &perm)],
            );
        }
    }
    g.node("MatMul", &[&operands[0], &operands[1]], &[y], vec![]);
    Ok(())
}

/// `array` with the slice at `index` along `axis` replaced: the parts before and after,
/// sliced at run time, joined around the new slice.
fn update_slice(
    g: &mut Graph,
    x: [&str; 3],
    index: Value,
    axis: usize,
    y: &str,
) -> Result<(), Why> {
    let one = g.ints(&[1]);
    let mut at = g.op("Reshape", &[x[2], &one], "index", vec![]);
    if g.func.value_type(index).dtype != DType::I64 {
        let to = attr_int("to", tensor::elem_type(DType::I64) as i64);
        at = g.op("Cast", &[&at], "index", vec![to]);
    }
    let (zero, axes, end) = (g.ints(&[0]), g.ints(&[axis as i64]), g.ints(&[i64::MAX]));
    let before = g.op("Slice", &[x[0], &zero, &at, &axes], "before", vec![]);
    let next = g.op("Add", &[&at, &one], "next", vec![]);
    let after = g.op("Slice", &[x[0], &next, &end, &axes], "after", vec![]);
    let middle = g.op("Unsqueeze", &[x[1], &axes], "slice", vec![]);
    let attrs = vec![attr_int("axis", axis as i64)];
    g.node("Concat", &[&before, &middle, &after], &[y], attrs);
    Ok(())
}

/// Zeros with `updates` added at `indices` along `axis`: `ScatterND` with `reduction=add`
/// on the axis moved first, then moved back.
fn scatter_add(
    g: &mut Graph,
    x: [&str; 2],
    args: &[Value],
    axis: usize,
    shape: &Shape,
    dtype: DType,
    y: &str,
) -> Result<(), Why> {
    let rank = shape.rank();
    let q = g.func.value_type(args[1]).rank();
    // The updates' index axes first: [idx.., pre.., post..].
    let perm = (axis..axis + q)
        .chain(0..axis)
        .chain(axis + q..rank - 1 + q);
    let perm: Vec<i64> = perm.map(|a| a as i64).collect();
    let updates = g.op(
        "Transpose",
        &[x[0]],
        "updates",
        vec![attr_ints("perm", &perm)],
    );
    let mut moved = vec![shape.dims()[axis].clone()];
    moved.extend(
        (shape.dims().iter().enumerate())
            .filter(|&(i, _)| i != axis)
            .map(|(_, d)| d.clone()),
    );
    let zeros_shape = g.shape_tensor(&Shape(moved))?;
    let zero = tensor::from_literal(
        &Literal::scalar(dtype, 0.0),
        &Type::new(dtype, Shape::fixed(&[1])),
        None,
    );
    let zeros = g.op(
        "ConstantOfShape",
        &[&zeros_shape],
        "zeros",
        vec![attr_tensor("value", zero)],
    );
    let last = g.ints(&[-1]);
    let mut indices = g.op("Unsqueeze", &[x[1], &last], "indices", vec![]);
    if g.func.value_type(args[1]).dtype != DType::I64 {
        let to = attr_int("to", tensor::elem_type(DType::I64) as i64);
        indices = g.op("Cast", &[&indices], "indices", vec![to]);
    }
    let add = vec![attr_string("reduction", "add")];
    let scattered = g.op("ScatterND", &[&zeros, &indices, &updates], "scattered", add);
    let back: Vec<i64> = (1..=axis)
        .chain([0])
        .chain(axis + 1..rank)
        .map(|a| a as i64)
        .collect();
    g.node(
        "Transpose",
        &[&scattered],
        &[y],
        vec![attr_ints("perm", &back)],
    );
    Ok(())
}

/// The attributes `Conv` and `ConvTranspose` share.
fn window_attrs(attrs: &Conv2dAttrs, kernel: [usize; 2]) -> Vec<crate::proto::AttributeProto> {
    let [(t, b), (l, r)] = attrs.padding;
    vec![
        attr_ints("kernel_shape", &ints(&kernel)),
        attr_ints("strides", &ints(&attrs.strides)),
        attr_ints("pads", &ints(&[t, l, b, r])),
        attr_ints("dilations", &ints(&attrs.dilation)),
        attr_int("group", attrs.groups as i64),
    ]
}

fn conv(
    g: &mut Graph,
    x: [&str; 2],
    args: &[Value],
    kind: ConvKind,
    attrs: &Conv2dAttrs,
    y: &str,
) -> Result<(), Why> {
    if attrs.channels_last {
        return Err(
            "a channels-last convolution (export the program before `channels_last`)".into(),
        );
    }
    let w = g.func.value_type(args[1]).shape.as_fixed();
    let kernel = match w {
        Some(w) => [w[2], w[3]],
        None => return Err("weights of symbolic shape".into()),
    };
    match kind {
        ConvKind::Forward => {
            g.node("Conv", &x, &[y], window_attrs(attrs, kernel));
            Ok(())
        }
        ConvKind::InputGrad { input } => {
            let grad = g.func.value_type(args[0]).shape.clone();
            let mut extra = vec![0i64; 2];
            for i in 0..2 {
                let n = grad.dims()[2 + i]
                    .as_fixed()
                    .ok_or("a gradient of symbolic size")?;
                let (lo, hi) = attrs.padding[i];
                let reach = (kernel[i] - 1) * attrs.dilation[i] + 1;
                let covered = (attrs.strides[i] * (n.max(1) - 1) + reach) as i64 - (lo + hi) as i64;
                extra[i] = input[i] as i64 - covered;
                if extra[i] < 0 {
                    return Err(Why::Reason(format!(
                        "an input size {input:?} ConvTranspose cannot give"
                    )));
                }
            }
            let mut all = window_attrs(attrs, kernel);
            all.push(attr_ints("output_padding", &extra));
            g.node("ConvTranspose", &x, &[y], all);
            Ok(())
        }
        ConvKind::FilterGrad { .. } => Err("a convolution's filter gradient has no ONNX op".into()),
    }
}

fn pool(g: &mut Graph, x: &str, kind: PoolKind, attrs: &Pool2dAttrs, y: &str) -> Result<(), Why> {
    if attrs.channels_last {
        return Err("a channels-last pooling (export the program before `channels_last`)".into());
    }
    let [(t, b), (l, r)] = attrs.padding;
    let mut all = vec![
        attr_ints("kernel_shape", &ints(&attrs.window)),
        attr_ints("strides", &ints(&attrs.strides)),
        attr_ints("pads", &ints(&[t, l, b, r])),
    ];
    let name = match kind {
        PoolKind::Max => "MaxPool",
        PoolKind::Avg => {
            all.push(attr_int("count_include_pad", 1));
            "AveragePool"
        }
        PoolKind::MaxGrad | PoolKind::AvgGrad { .. } => {
            return Err("a pooling gradient has no ONNX op".into());
        }
    };
    g.node(name, &[x], &[y], all);
    Ok(())
}

/// Each element's index along `axis`: a `Constant` when the shape is static and no larger
/// than `fold` writes constants (the importer reads it back as the same `iota`), else a
/// `Range` stretched over the shape (a constant would hold every element).
fn iota(g: &mut Graph, axis: usize, ty: &Type, y: &str) -> Result<(), Why> {
    let small = |n: &usize| *n <= kiln_passes::MAX_FOLDED_ELEMENTS;
    if let Some(dims) = ty.shape.as_fixed()
        && let Some(count) = ty.shape.num_elements().filter(small)
    {
        let inner: usize = dims[axis + 1..].iter().product();
        let values = (0..count).map(|i| ((i / inner.max(1)) % dims[axis].max(1)) as f64);
        let t = tensor::from_literal(&literal(ty.dtype, values), ty, None);
        g.node("Constant", &[], &[y], vec![attr_tensor("value", t)]);
        return Ok(());
    }
    let size = match &ty.shape.dims()[axis] {
        Dim::Fixed(n) => g.ints(&[*n as i64]),
        Dim::Sym(s) => g.symbol_size(s)?,
    };
    let zero_axes = g.ints(&[0]);
    let n = g.op("Squeeze", &[&size, &zero_axes], "n", vec![]);
    let (start, step) = (scalar(g, DType::I64, 0.0), scalar(g, DType::I64, 1.0));
    let mut range = g.op("Range", &[&start, &n, &step], "range", vec![]);
    if ty.dtype != DType::I64 {
        let to = attr_int("to", tensor::elem_type(ty.dtype) as i64);
        range = g.op("Cast", &[&range], "range", vec![to]);
    }
    let along: Vec<i64> = (0..ty.rank())
        .map(|i| if i == axis { -1 } else { 1 })
        .collect();
    let along = g.ints(&along);
    let column = g.op("Reshape", &[&range, &along], "range", vec![]);
    let shape = g.shape_tensor(&ty.shape)?;
    g.node("Expand", &[&column, &shape], &[y], vec![]);
    Ok(())
}

/// A subgraph of `region`'s instructions whose outputs are `region`'s results, each through
/// an `Identity` (a subgraph's outputs must be its own tensors).
fn subgraph(
    g: &mut Graph,
    name: &str,
    region: Region,
    inputs: Vec<crate::proto::ValueInfoProto>,
) -> Result<crate::proto::GraphProto, Why> {
    let outer = g.take_nodes();
    let yielded = emit_region(g, region);
    let outputs = yielded.map(|yielded| {
        let results = g.func.region(region).results.clone();
        let mut outputs = Vec::new();
        for (v, t) in results.iter().zip(yielded) {
            let out = g.op("Identity", &[&t], &format!("{name}_out"), vec![]);
            outputs.push(value_info(&out, g.func.value_type(*v)));
        }
        outputs
    });
    let nodes = std::mem::replace(&mut g.nodes, outer);
    Ok(super::graph::graph_proto(name, nodes, inputs, outputs?))
}

fn if_node(g: &mut Graph, regions: &[Region], pred: &str, results: &[Value]) -> Result<(), Why> {
    let then_branch = subgraph(g, "then", regions[0], vec![])?;
    let else_branch = subgraph(g, "else", regions[1], vec![])?;
    let outs: Vec<String> = results.iter().map(|&r| g.name(r)).collect();
    let outs: Vec<&str> = outs.iter().map(String::as_str).collect();
    let attrs = vec![
        attr_graph("then_branch", then_branch),
        attr_graph("else_branch", else_branch),
    ];
    g.node("If", &[pred], &outs, attrs);
    Ok(())
}

/// `while` as `Loop`: the condition computed once before the loop and again at the end of
/// each trip, on the values the body yields.
fn loop_node(
    g: &mut Graph,
    regions: &[Region],
    init: &[String],
    results: &[Value],
) -> Result<(), Why> {
    let (cond, body) = (regions[0], regions[1]);
    let cond_args = g.func.region(cond).args.clone();
    for (&a, name) in cond_args.iter().zip(init) {
        g.alias(a, name.clone());
    }
    let first = emit_region(g, cond)?.remove(0);
    let (trip, go) = (g.fresh("trip"), g.fresh("go"));
    let mut inputs = vec![
        value_info(&trip, &Type::scalar(DType::I64)),
        value_info(&go, &Type::scalar(DType::Bool)),
    ];
    for &a in &g.func.region(body).args.clone() {
        let name = g.name(a);
        inputs.push(value_info(&name, g.func.value_type(a)));
    }
    let outer = g.take_nodes();
    let step = loop_body(g, cond, body, &cond_args);
    let nodes = std::mem::replace(&mut g.nodes, outer);
    let outputs = step?;
    let body_graph = super::graph::graph_proto("body", nodes, inputs, outputs);
    let outs: Vec<String> = results.iter().map(|&r| g.name(r)).collect();
    let outs: Vec<&str> = outs.iter().map(String::as_str).collect();
    let mut ins = vec!["", first.as_str()];
    ins.extend(init.iter().map(String::as_str));
    g.node("Loop", &ins, &outs, vec![attr_graph("body", body_graph)]);
    Ok(())
}

/// The nodes of one trip: the body, then the condition on what it yields.
fn loop_body(
    g: &mut Graph,
    cond: Region,
    body: Region,
    cond_args: &[Value],
) -> Result<Vec<crate::proto::ValueInfoProto>, Why> {
    let next = emit_region(g, body)?;
    g.forget_region(cond);
    for (&a, name) in cond_args.iter().zip(&next) {
        g.alias(a, name.clone());
    }
    let again = emit_region(g, cond)?.remove(0);
    let go = g.op("Identity", &[&again], "go_out", vec![]);
    let mut outputs = vec![value_info(&go, &Type::scalar(DType::Bool))];
    for (&a, t) in cond_args.iter().zip(next) {
        let out = g.op("Identity", &[&t], "carried_out", vec![]);
        outputs.push(value_info(&out, g.func.value_type(a)));
    }
    Ok(outputs)
}

/// A literal of `dtype` holding `values`, converted as `cast` converts.
fn literal(dtype: DType, values: impl Iterator<Item = f64>) -> Literal {
    match dtype {
        DType::F32 => Literal::F32(values.map(|v| v as f32).collect()),
        DType::F64 => Literal::F64(values.collect()),
        DType::I32 => Literal::I32(values.map(|v| v as i32).collect()),
        DType::I64 => Literal::I64(values.map(|v| v as i64).collect()),
        DType::Bool => Literal::Bool(values.map(|v| v != 0.0).collect()),
    }
}
