//! The conversion context: what each ONNX value name stands for while a graph is converted, and
//! the view of it a node's converter gets ([`Ctx`]).

use crate::node::Node;
use crate::symbolic::SymShape;
use kiln_backend::Array;
use kiln_ir::{
    BuildError, DType, FunctionBuilder, Initializer, Literal, Shape, StateDecl, Type, Value,
};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Why a node could not be converted.
#[derive(Debug)]
pub enum Fail {
    /// Something about the node that Kiln does not implement (listed with the other
    /// unsupported nodes of the model).
    Unsupported(String),
    /// The node is wrong: shapes, types or attributes that ONNX does not allow.
    Invalid(String),
}

impl From<String> for Fail {
    fn from(message: String) -> Fail {
        Fail::Invalid(message)
    }
}

impl From<&str> for Fail {
    fn from(message: &str) -> Fail {
        Fail::Invalid(message.to_owned())
    }
}

impl From<BuildError> for Fail {
    fn from(e: BuildError) -> Fail {
        // The builder's location is the importer's own line: the node names the place.
        Fail::Invalid(e.error.to_string())
    }
}

/// A converter's result: the node's outputs, in order (optional trailing outputs may be left
/// out when they are not produced).
pub(crate) type Converted = Result<Vec<Value>, Fail>;

/// `Err(Fail::Unsupported(..))`.
pub(crate) fn unsupported<T>(message: impl Into<String>) -> Result<T, Fail> {
    Err(Fail::Unsupported(message.into()))
}

/// What an ONNX value name stands for.
#[derive(Clone)]
pub(crate) enum Slot {
    /// A value of the function being built.
    Value(Value),
    /// Known at import time (an initializer, a constant or a folded result): it becomes a
    /// constant or a parameter where it is first used as a value.
    Known {
        array: Rc<Array>,
        value: Option<Value>,
        initializer: bool,
    },
    /// A shape computed from symbolic dimensions (see [`crate::symbolic`]).
    Shape(SymShape),
    /// Produced by a node that could not be converted: its users are skipped, not reported.
    Missing,
}

/// The largest array the importer makes a constant, as large as the `fold` pass makes them, so
/// that a program has the same constants whether the importer or the pipeline computed them
/// (an exported program imports as itself): a larger known float array becomes a parameter,
/// a larger integer result of a node is computed at run time (`import::convert_node`).
pub(crate) const LARGEST_CONSTANT: usize = kiln_passes::MAX_FOLDED_ELEMENTS;

/// The values of the graph being converted, and the parameters made so far.
#[derive(Default)]
pub(crate) struct Env {
    pub(crate) slots: HashMap<String, Slot>,
    pub(crate) states: Vec<(StateDecl, Array)>,
    pub(crate) state_names: HashSet<String>,
    /// Converting into a scratch function to fold a node: known values become constants.
    pub(crate) folding: bool,
}

/// `base`, or `base_1`, `base_2`, … : the first not in `taken`, which then holds it.
pub(crate) fn unique_name(taken: &mut HashSet<String>, base: &str) -> String {
    let mut name = base.to_owned();
    let mut n = 1;
    while !taken.insert(name.clone()) {
        name = format!("{base}_{n}");
        n += 1;
    }
    name
}

impl Env {
    /// The Kiln value for a known array: a constant, or a parameter for an initializer or a
    /// large float array.
    fn materialize(
        &mut self,
        b: &mut FunctionBuilder,
        name: &str,
        array: &Array,
        initializer: bool,
    ) -> Result<Value, Fail> {
        let literal = array.to_literal();
        if !initializer && let Some(one) = literal.splat() {
            // A filled shape (`ConstantOfShape`, an `Expand` of a scalar): one element.
            return Ok(b.constant(one, array.ty())?);
        }
        if !initializer && let Some(axis) = literal.iota_axis(array.shape()) {
            // `0, 1, 2, …` along one axis (a `Range`, positions an op counts): Kiln's `iota`.
            return Ok(b.iota(array.ty(), axis)?);
        }
        let large = initializer || array.len() > LARGEST_CONSTANT;
        if self.folding || !large || !array.dtype().is_float() {
            return Ok(b.constant(literal, array.ty())?);
        }
        let decl = StateDecl {
            name: self.state_name(name),
            ty: array.ty(),
            init: Initializer::constant(0.0),
        };
        let value = b.load(&decl)?;
        self.states.push((decl, array.clone()));
        Ok(value)
    }

    /// `name` made a valid, unused state name.
    fn state_name(&mut self, name: &str) -> String {
        unique_name(&mut self.state_names, &kiln_ir::identifier(name, true, "p"))
    }

    /// The value `name` stands for, made a value of the function if it was only known.
    pub(crate) fn value(&mut self, b: &mut FunctionBuilder, name: &str) -> Result<Value, Fail> {
        match self.slots.get(name) {
            Some(Slot::Value(v)) | Some(Slot::Known { value: Some(v), .. }) => Ok(*v),
            Some(Slot::Known {
                array, initializer, ..
            }) => {
                let (array, initializer) = (array.clone(), *initializer);
                let v = self.materialize(b, name, &array, initializer)?;
                if let Some(Slot::Known { value, .. }) = self.slots.get_mut(name) {
                    *value = Some(v);
                }
                Ok(v)
            }
            Some(Slot::Shape(shape)) => Err(Fail::Unsupported(format!(
                "{name}, a shape with symbolic sizes ({:?}), used as data",
                shape.entries
            ))),
            Some(Slot::Missing) => Err(Fail::Invalid(format!("{name} was not produced"))),
            None => Err(Fail::Invalid(format!(
                "input {name:?} is not defined before this node"
            ))),
        }
    }

    /// The array `name` stands for, when known at import time.
    pub(crate) fn known(&self, name: &str) -> Option<&Rc<Array>> {
        match self.slots.get(name) {
            Some(Slot::Known { array, .. }) => Some(array),
            _ => None,
        }
    }
}

/// What a converter sees: the builder, the node and its inputs.
pub struct Ctx<'a> {
    /// The function being built.
    pub b: &'a mut FunctionBuilder,
    pub(crate) env: &'a mut Env,
    /// The node converted.
    pub node: &'a Node<'a>,
}

impl Ctx<'_> {
    fn input_name(&self, i: usize) -> Option<&str> {
        (self.node.proto.input.get(i))
            .map(String::as_str)
            .filter(|n| !n.is_empty())
    }

    /// Whether optional input `i` is given.
    pub fn has(&self, i: usize) -> bool {
        self.input_name(i).is_some()
    }

    /// The number of inputs given (for variadic ops).
    pub fn count(&self) -> usize {
        self.node.proto.input.len()
    }

    /// Required input `i`.
    pub fn input(&mut self, i: usize) -> Result<Value, Fail> {
        let name = self
            .input_name(i)
            .ok_or_else(|| format!("input {i} is required"))?;
        let name = name.to_owned();
        self.env.value(self.b, &name)
    }

    /// Optional input `i`.
    pub fn optional(&mut self, i: usize) -> Result<Option<Value>, Fail> {
        match self.has(i) {
            true => self.input(i).map(Some),
            false => Ok(None),
        }
    }

    /// Input `i`'s array, when known at import time.
    pub fn known(&self, i: usize) -> Option<Rc<Array>> {
        self.input_name(i).and_then(|n| self.env.known(n)).cloned()
    }

    /// Input `i` as integers known at import time (`None` when the input is not given); an
    /// input computed at run time is not supported here.
    pub fn known_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>, Fail> {
        if !self.has(i) {
            return Ok(None);
        }
        match self.known(i) {
            Some(a) if a.dtype().is_int() => {
                Ok(Some(a.to_f64_vec().iter().map(|&x| x as i64).collect()))
            }
            Some(a) => Err(Fail::Invalid(format!(
                "{what} should be integers, not {}",
                a.dtype().name()
            ))),
            None => unsupported(format!(
                "{what} computed at run time (Kiln needs it known when importing)"
            )),
        }
    }

    /// Input `i` as a shape known at import time, whose entries may be symbolic sizes (`None`
    /// when the input is not given).
    pub(crate) fn known_shape(&self, i: usize, what: &str) -> Result<Option<SymShape>, Fail> {
        let Some(name) = self.input_name(i) else {
            return Ok(None);
        };
        match crate::symbolic::entries(self.env, name) {
            Some(s) => Ok(Some(s)),
            None => unsupported(format!(
                "{what} computed at run time (Kiln needs it known when importing)"
            )),
        }
    }

    /// Input `i` as one float known at import time.
    pub fn known_scalar(&self, i: usize, what: &str) -> Result<Option<f64>, Fail> {
        if !self.has(i) {
            return Ok(None);
        }
        match self.known(i) {
            Some(a) if a.len() == 1 => Ok(Some(a.to_f64_vec()[0])),
            Some(a) => Err(Fail::Invalid(format!(
                "{what} should have one element, not {}",
                a.len()
            ))),
            None => unsupported(format!("{what} computed at run time")),
        }
    }

    /// The type of `v`.
    pub fn ty(&self, v: Value) -> Type {
        self.b.value_type(v).clone()
    }

    /// The rank of `v`.
    pub fn rank(&self, v: Value) -> usize {
        self.b.value_type(v).rank()
    }

    /// The dtype of `v`.
    pub fn dtype(&self, v: Value) -> DType {
        self.b.value_type(v).dtype
    }

    /// The static shape of `v`; unsupported when it has symbolic dimensions.
    pub fn shape(&self, v: Value, what: &str) -> Result<Vec<usize>, Fail> {
        match self.b.value_type(v).shape.as_fixed() {
            Some(dims) => Ok(dims),
            None => unsupported(format!(
                "{what} of symbolic shape {} (this op needs static shapes)",
                self.b.value_type(v).shape
            )),
        }
    }

    /// `idx` with negative entries moved up by `size` (ONNX's indices count from the end).
    pub fn wrap_negative(&mut self, idx: Value, size: usize) -> Result<Value, Fail> {
        let dtype = self.dtype(idx);
        let zero = self.scalar(dtype, 0.0)?;
        let n = self.scalar(dtype, size as f64)?;
        let negative = self.b.lt(idx, zero)?;
        let wrapped = self.b.add(idx, n)?;
        Ok(self.b.select(negative, wrapped, idx)?)
    }

    /// `idx` (integers), checked at run time to lie in `[0, size)`: a gather from `0..size`
    /// returns each index itself, and refuses one out of range — so a lowering that turns
    /// per-axis indices into one flat index keeps the op's own check, on both paths.
    pub fn in_range(&mut self, idx: Value, size: usize) -> Result<Value, Fail> {
        let dtype = self.dtype(idx);
        let positions = self.b.iota(Type::new(dtype, Shape::fixed(&[size])), 0)?;
        Ok(self.b.gather(positions, idx, 0)?)
    }

    /// `values` combined left to right by `op` (a sum, a product, a conjunction); `None` for
    /// none.
    pub fn combine(
        &mut self,
        op: kiln_ir::BinaryOp,
        values: impl IntoIterator<Item = Value>,
    ) -> Result<Option<Value>, Fail> {
        let mut acc = None;
        for v in values {
            acc = Some(match acc {
                Some(a) => self.b.binary(op, a, v)?,
                None => v,
            });
        }
        Ok(acc)
    }

    /// A scalar constant of `dtype`.
    pub fn scalar(&mut self, dtype: DType, value: f64) -> Result<Value, Fail> {
        Ok(self.b.scalar(dtype, value)?)
    }

    /// A constant holding `array`.
    pub fn constant(&mut self, array: &Array) -> Result<Value, Fail> {
        Ok(self.b.constant(array.to_literal(), array.ty())?)
    }

    /// An i64 vector constant.
    pub fn i64s(&mut self, values: &[i64]) -> Result<Value, Fail> {
        let ty = Type::new(DType::I64, kiln_ir::Shape::fixed(&[values.len()]));
        Ok(self.b.constant(Literal::I64(values.to_vec()), ty)?)
    }
}

/// Refuses a value of `dims` (counted as 8-byte elements) that cannot be addressed or needs
/// more than the memory limit — before tables or constants of that size are built.
pub(crate) fn check_elements(dims: &[usize]) -> Result<(), Fail> {
    let bytes = (dims.iter())
        .try_fold(8u128, |n, &d| n.checked_mul(d as u128))
        .ok_or_else(|| format!("a value of shape {dims:?} is too large to address"))?;
    let limit = kiln_backend::limits::memory_limit();
    match bytes > limit as u128 {
        true => Err(Fail::Invalid(format!(
            "a value of shape {dims:?} needs {bytes} bytes, more than the memory limit of {limit}"
        ))),
        false => Ok(()),
    }
}

/// `axis` (negative counts from the end) as an index into `rank` axes.
pub(crate) fn axis(axis: i64, rank: usize) -> Result<usize, Fail> {
    let r = rank as i64;
    match axis {
        a if (0..r).contains(&a) => Ok(a as usize),
        a if (-r..0).contains(&a) => Ok((a + r) as usize),
        a => Err(Fail::Invalid(format!(
            "axis {a} is out of range for rank {rank}"
        ))),
    }
}
