//! The conversions, one function per ONNX op (or family), found through one table: [`OPS`].

mod attention;
mod elementwise;
mod more;
mod nn;
mod reduce;
mod resize;
mod rnn;
mod shape;

use crate::context::{Converted, Ctx};
use elementwise as ew;
use kiln_ir::{ArgOp, BinaryOp as B, CompareOp as Cmp, ReduceOp, UnaryOp as U};
use nn::SoftmaxKind;
use reduce::Reduction;

/// A conversion: the node's inputs (through the context) to its outputs.
pub(crate) type Convert = fn(&mut Ctx) -> Converted;

/// Every ONNX op Kiln imports (default domain), and its conversion.
pub(crate) const OPS: &[(&str, Convert)] = &[
    ("Abs", |c| ew::unary(c, U::Abs)),
    ("Acosh", |c| more::trig(c, "Acosh")),
    ("Add", |c| ew::binary(c, B::Add)),
    ("And", |c| ew::binary(c, B::And)),
    ("ArgMax", |c| reduce::arg(c, ArgOp::ArgMax)),
    ("ArgMin", |c| reduce::arg(c, ArgOp::ArgMin)),
    ("Asinh", |c| more::trig(c, "Asinh")),
    ("Atanh", |c| more::trig(c, "Atanh")),
    ("Attention", attention::attention),
    ("AveragePool", |c| nn::pool(c, false)),
    ("BatchNormalization", nn::batch_norm),
    ("Cast", ew::cast),
    ("CastLike", ew::cast_like),
    ("Ceil", |c| ew::unary(c, U::Ceil)),
    ("Celu", ew::celu),
    ("Clip", ew::clip),
    ("Concat", shape::concat),
    ("Constant", shape::constant),
    ("ConstantOfShape", shape::constant_of_shape),
    ("Conv", nn::conv),
    ("ConvTranspose", nn::conv_transpose),
    ("Cos", |c| ew::unary(c, U::Cos)),
    ("Cosh", |c| more::trig(c, "Cosh")),
    ("CumSum", more::cumsum),
    ("DepthToSpace", |c| shape::depth_space(c, true)),
    ("Div", |c| ew::binary(c, B::Div)),
    ("Dropout", ew::dropout),
    ("Elu", ew::elu),
    ("Equal", |c| ew::compare(c, Cmp::Eq)),
    ("Erf", |c| ew::unary(c, U::Erf)),
    ("Exp", |c| ew::unary(c, U::Exp)),
    ("Expand", shape::expand),
    ("EyeLike", more::eye_like),
    ("Flatten", shape::flatten),
    ("Floor", |c| ew::unary(c, U::Floor)),
    ("Gather", shape::gather),
    ("GatherElements", more::gather_elements),
    ("Gelu", ew::gelu),
    ("Gemm", nn::gemm),
    ("GlobalAveragePool", |c| nn::global_pool(c, ReduceOp::Mean)),
    ("GlobalMaxPool", |c| nn::global_pool(c, ReduceOp::Max)),
    ("Greater", |c| ew::compare(c, Cmp::Gt)),
    ("GreaterOrEqual", |c| ew::compare(c, Cmp::Ge)),
    ("GRU", |c| rnn::recurrent(c, rnn::Cell::Gru)),
    ("Hardmax", |c| nn::softmax(c, SoftmaxKind::Hardmax)),
    ("HardSigmoid", ew::hard_sigmoid),
    ("HardSwish", ew::hard_swish),
    ("Identity", ew::identity),
    ("InstanceNormalization", nn::instance_norm),
    ("IsInf", more::is_inf),
    ("IsNaN", more::is_nan),
    ("LayerNormalization", nn::layer_norm),
    ("LeakyRelu", ew::leaky_relu),
    ("Less", |c| ew::compare(c, Cmp::Lt)),
    ("LessOrEqual", |c| ew::compare(c, Cmp::Le)),
    ("Log", |c| ew::unary(c, U::Log)),
    ("LogSoftmax", |c| nn::softmax(c, SoftmaxKind::LogSoftmax)),
    ("LpNormalization", more::lp_norm),
    ("LpPool", nn::lp_pool),
    ("LRN", nn::lrn),
    ("LSTM", |c| rnn::recurrent(c, rnn::Cell::Lstm)),
    ("MatMul", nn::matmul),
    ("Max", |c| ew::variadic(c, B::Max)),
    ("MaxPool", |c| nn::pool(c, true)),
    ("Mean", ew::mean),
    ("Min", |c| ew::variadic(c, B::Min)),
    ("Mish", ew::mish),
    ("Mod", more::modulo),
    ("Mul", |c| ew::binary(c, B::Mul)),
    ("Neg", |c| ew::unary(c, U::Neg)),
    ("NegativeLogLikelihoodLoss", more::nll_loss),
    ("Not", |c| ew::unary(c, U::Not)),
    ("OneHot", more::one_hot),
    ("Or", |c| ew::binary(c, B::Or)),
    ("Pad", shape::pad),
    ("Pow", ew::pow),
    ("PRelu", ew::prelu),
    ("Range", shape::range),
    ("Reciprocal", |c| ew::unary(c, U::Recip)),
    ("ReduceL1", |c| reduce::reduce(c, Reduction::L1)),
    ("ReduceL2", |c| reduce::reduce(c, Reduction::L2)),
    ("ReduceLogSum", |c| reduce::reduce(c, Reduction::LogSum)),
    ("ReduceLogSumExp", |c| {
        reduce::reduce(c, Reduction::LogSumExp)
    }),
    ("ReduceMax", |c| {
        reduce::reduce(c, Reduction::Plain(ReduceOp::Max))
    }),
    ("ReduceMean", |c| {
        reduce::reduce(c, Reduction::Plain(ReduceOp::Mean))
    }),
    ("ReduceMin", |c| {
        reduce::reduce(c, Reduction::Plain(ReduceOp::Min))
    }),
    ("ReduceProd", |c| reduce::reduce(c, Reduction::Prod)),
    ("ReduceSum", |c| {
        reduce::reduce(c, Reduction::Plain(ReduceOp::Sum))
    }),
    ("ReduceSumSquare", |c| {
        reduce::reduce(c, Reduction::SumSquare)
    }),
    ("Relu", |c| ew::unary(c, U::Relu)),
    ("Reshape", shape::reshape),
    ("Resize", resize::resize),
    ("RMSNormalization", more::rms_norm),
    ("RNN", |c| rnn::recurrent(c, rnn::Cell::Rnn)),
    ("Round", |c| ew::unary(c, U::Round)),
    ("Selu", ew::selu),
    ("Shape", shape::shape),
    ("Shrink", more::shrink),
    ("Sigmoid", |c| ew::unary(c, U::Sigmoid)),
    ("Sign", |c| ew::unary(c, U::Sign)),
    ("Sin", |c| ew::unary(c, U::Sin)),
    ("Sinh", |c| more::trig(c, "Sinh")),
    ("Size", shape::size),
    ("Slice", shape::slice),
    ("Softmax", |c| nn::softmax(c, SoftmaxKind::Softmax)),
    ("SoftmaxCrossEntropyLoss", more::softmax_cross_entropy),
    ("Softplus", |c| ew::unary(c, U::Softplus)),
    ("Softsign", ew::softsign),
    ("SpaceToDepth", |c| shape::depth_space(c, false)),
    ("Split", shape::split),
    ("Sqrt", |c| ew::unary(c, U::Sqrt)),
    ("Squeeze", shape::squeeze),
    ("Sub", |c| ew::binary(c, B::Sub)),
    ("Sum", |c| ew::variadic(c, B::Add)),
    ("Swish", more::swish),
    ("Tan", |c| more::trig(c, "Tan")),
    ("Tanh", |c| ew::unary(c, U::Tanh)),
    ("ThresholdedRelu", ew::thresholded_relu),
    ("Tile", shape::tile),
    ("Transpose", shape::transpose),
    ("Trilu", more::trilu),
    ("Unsqueeze", shape::unsqueeze),
    ("Upsample", resize::upsample),
    ("Where", ew::where_),
    ("Xor", |c| ew::binary(c, B::Xor)),
];

/// The conversion of `op_type`, if Kiln has one.
pub(crate) fn converter(op_type: &str) -> Option<Convert> {
    OPS.iter()
        .find(|(name, _)| *name == op_type)
        .map(|&(_, f)| f)
}

/// The names of the ops Kiln imports, in alphabetical order.
pub fn supported() -> impl Iterator<Item = &'static str> {
    OPS.iter().map(|&(name, _)| name)
}
