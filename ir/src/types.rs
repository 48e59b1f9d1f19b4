//! Element types, dimensions, shapes and tensor types.
//!
//! A dimension is either fixed (`784`) or symbolic (`N`). A symbol stands for one size across a
//! whole function: every use of `N` in a function is the same number at run time, bound from the
//! arguments when the function is called. That is what lets one compiled function serve every
//! batch size.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// Boolean (one byte per element in memory).
    Bool,
}

impl DType {
    /// Every dtype.
    pub const ALL: [DType; 5] = [DType::F32, DType::F64, DType::I32, DType::I64, DType::Bool];

    /// The dtype's name in the text form (`f32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// The dtype named `name`.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Whether the dtype is f32 or f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    /// Whether the dtype is i32 or i64.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Floats and integers: everything arithmetic applies to.
    pub fn is_numeric(self) -> bool {
        self != DType::Bool
    }

    /// The bytes one element takes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::Bool => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name of a symbolic dimension, such as `N`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(Arc<str>);

impl Symbol {
    /// The symbol `name`.
    pub fn new(name: &str) -> Symbol {
        Symbol(Arc::from(name))
    }

    /// The symbol's name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One dimension of a shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dim {
    /// A size known when the program is built.
    Fixed(usize),
    /// A size bound when the function runs (a batch size, say).
    Sym(Symbol),
}

impl Dim {
    /// The symbolic dimension `name`.
    pub fn sym(name: &str) -> Dim {
        Dim::Sym(Symbol::new(name))
    }

    /// The size, if it is fixed.
    pub fn as_fixed(&self) -> Option<usize> {
        match *self {
            Dim::Fixed(n) => Some(n),
            Dim::Sym(_) => None,
        }
    }

    /// Whether the dimension is fixed at 1.
    pub fn is_one(&self) -> bool {
        *self == Dim::Fixed(1)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Dim {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(name: &str) -> Dim {
        Dim::sym(name)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// Sizes bound to symbols while a function runs.
pub type SymbolBindings = BTreeMap<Symbol, usize>;

/// The dimensions of a tensor, outermost first. A scalar has rank 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// The shape of a scalar (rank 0).
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }

    /// A shape of fixed sizes.
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[Dim] {
        &self.0
    }

    /// Whether every dimension is fixed.
    pub fn is_static(&self) -> bool {
        self.0.iter().all(|d| matches!(d, Dim::Fixed(_)))
    }

    /// The fixed sizes, if no dimension is symbolic.
    pub fn as_fixed(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::as_fixed).collect()
    }

    /// The number of elements, if no dimension is symbolic.
    pub fn num_elements(&self) -> Option<usize> {
        self.0
            .iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(d.as_fixed()?))
    }

    /// The symbols the shape uses, in order (with repeats).
    pub fn symbols(&self) -> impl Iterator<Item = &Symbol> {
        self.0.iter().filter_map(|d| match d {
            Dim::Sym(s) => Some(s),
            Dim::Fixed(_) => None,
        })
    }

    /// Concrete sizes under `bindings`; `Err` names the first unbound symbol.
    pub fn resolve(&self, bindings: &SymbolBindings) -> Result<Vec<usize>, Symbol> {
        self.0
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => Ok(*n),
                Dim::Sym(s) => bindings.get(s).copied().ok_or_else(|| s.clone()),
            })
            .collect()
    }

    /// Binds this shape's symbols to the sizes of a concrete array, checking fixed sizes and
    /// symbols already bound. `Err` names the first dimension that does not fit.
    pub fn bind(&self, concrete: &[usize], bindings: &mut SymbolBindings) -> Result<(), BindError> {
        if concrete.len() != self.rank() {
            return Err(BindError::Rank {
                found: concrete.len(),
                expected: self.rank(),
            });
        }
        for (axis, (dim, &size)) in self.0.iter().zip(concrete).enumerate() {
            match dim {
                Dim::Fixed(n) if *n != size => {
                    return Err(BindError::Size {
                        axis,
                        found: size,
                        expected: *n,
                    });
                }
                Dim::Fixed(_) => {}
                Dim::Sym(s) => match bindings.get(s) {
                    Some(&bound) if bound != size => {
                        return Err(BindError::Symbol {
                            axis,
                            found: size,
                            symbol: s.clone(),
                            bound,
                        });
                    }
                    Some(_) => {}
                    None => {
                        bindings.insert(s.clone(), size);
                    }
                },
            }
        }
        Ok(())
    }

    /// NumPy broadcasting of two shapes: align on the right; equal dimensions stay, a fixed 1
    /// stretches to the other. `None` when they do not broadcast.
    pub fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        let rank = a.rank().max(b.rank());
        let pad = |s: &Shape, i: usize| -> Dim {
            let offset = rank - s.rank();
            if i < offset {
                Dim::Fixed(1)
            } else {
                s.0[i - offset].clone()
            }
        };
        (0..rank)
            .map(|i| {
                let (x, y) = (pad(a, i), pad(b, i));
                if x == y || y.is_one() {
                    Some(x)
                } else if x.is_one() {
                    Some(y)
                } else {
                    None
                }
            })
            .collect::<Option<Vec<_>>>()
            .map(Shape)
    }

    /// Whether `self` broadcasts to exactly `target` under NumPy rules.
    pub fn broadcasts_to(&self, target: &Shape) -> bool {
        if self.rank() > target.rank() {
            return false;
        }
        let offset = target.rank() - self.rank();
        self.0
            .iter()
            .zip(&target.0[offset..])
            .all(|(d, t)| d == t || d.is_one())
    }
}

impl From<Vec<Dim>> for Shape {
    fn from(dims: Vec<Dim>) -> Shape {
        Shape(dims)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The type of a value: element type and shape, printed `f32[N,784]`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Type {
    /// The element type.
    pub dtype: DType,
    /// The dimensions.
    pub shape: Shape,
}

impl Type {
    /// A type of `dtype` and `shape`.
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Type {
        Type {
            dtype,
            shape: shape.into(),
        }
    }

    /// The scalar type of `dtype`.
    pub fn scalar(dtype: DType) -> Type {
        Type::new(dtype, Shape::scalar())
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }

    /// The same shape with another dtype.
    pub fn with_dtype(&self, dtype: DType) -> Type {
        Type::new(dtype, self.shape.clone())
    }

    /// The same dtype with another shape.
    pub fn with_shape(&self, shape: Shape) -> Type {
        Type::new(self.dtype, shape)
    }

    /// The bytes a value of this type occupies, counting fixed dimensions only (a symbolic
    /// one counts as 1), saturating rather than overflowing.
    pub fn fixed_bytes(&self) -> u128 {
        self.shape
            .dims()
            .iter()
            .filter_map(Dim::as_fixed)
            .fold(self.dtype.size_bytes() as u128, |acc, n| {
                acc.saturating_mul(n as u128)
            })
    }

    /// An error if no value of this type can exist in memory: its fixed dimensions alone need
    /// more than `isize::MAX` bytes (the most one allocation can hold), so element counts and
    /// byte sizes computed from it would overflow.
    ///
    /// A zero-sized dimension does not make the others free: an array's shape must still
    /// describe addressable memory (`f32[0,2^62,2^62]` has no element but is refused), since
    /// strides and row counts are computed from the nonzero sizes.
    pub fn check_addressable(&self) -> Result<(), TooLarge> {
        let fixed = self.shape.dims().iter().filter_map(Dim::as_fixed);
        let extent =
            (fixed.clone().filter(|&n| n != 0)).fold(1u128, |acc, n| acc.saturating_mul(n as u128));
        if extent.saturating_mul(self.dtype.size_bytes() as u128) <= isize::MAX as u128 {
            return Ok(());
        }
        let elements = fixed.fold(1u128, |acc, n| acc.saturating_mul(n as u128));
        Err(TooLarge {
            ty: self.clone(),
            elements,
            extent,
        })
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Why an array's shape does not fit a shape with symbols.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindError {
    /// The ranks differ.
    #[error("rank {found} where rank {expected} was expected")]
    Rank {
        /// The array's rank.
        found: usize,
        /// The shape's rank.
        expected: usize,
    },
    /// A fixed dimension differs.
    #[error("dimension {axis} is {found}, expected {expected}")]
    Size {
        /// The axis.
        axis: usize,
        /// The array's size there.
        found: usize,
        /// The shape's size there.
        expected: usize,
    },
    /// A symbol is already bound to another size.
    #[error("dimension {axis} is {found}, but {symbol} is already bound to {bound}")]
    Symbol {
        /// The axis.
        axis: usize,
        /// The array's size there.
        found: usize,
        /// The symbol of that dimension.
        symbol: Symbol,
        /// The size it is bound to.
        bound: usize,
    },
}

/// A type no memory can hold: its fixed dimensions need more than `isize::MAX` bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "type {ty} has {}, more than memory can address ({} bytes at most)",
    count(*elements, *extent),
    isize::MAX
)]
pub struct TooLarge {
    /// The type.
    pub ty: Type,
    /// Its element count (saturating at `u128::MAX`).
    pub elements: u128,
    /// The product of its nonzero fixed sizes (the elements its strides span).
    pub extent: u128,
}

fn count(elements: u128, extent: u128) -> String {
    let n = |n: u128| {
        if n == u128::MAX {
            "more than 2^128".to_owned()
        } else {
            n.to_string()
        }
    };
    if elements == 0 {
        format!(
            "no elements, but its nonzero sizes span {} elements",
            n(extent)
        )
    } else {
        format!("{} elements", n(elements))
    }
}

/// Shorthand for building types in code and tests: `ty(DType::F32, ["N".into(), 784.into()])`.
pub fn ty<const R: usize>(dtype: DType, dims: [Dim; R]) -> Type {
    Type::new(dtype, Shape(dims.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(dims: &[&str]) -> Shape {
        Shape(
            dims.iter()
                .map(|d| d.parse().map(Dim::Fixed).unwrap_or_else(|_| Dim::sym(d)))
                .collect(),
        )
    }

    #[test]
    fn broadcast_follows_numpy() {
        let cases = [
            (&["N", "3"][..], &["3"][..], Some(&["N", "3"][..])),
            (&["1", "3"], &["4", "1"], Some(&["4", "3"])),
            (&[], &["2", "2"], Some(&["2", "2"])),
            (&["N", "1"], &["1", "M"], Some(&["N", "M"])),
            (&["N"], &["3"], None),
            (&["2", "3"], &["3", "2"], None),
        ];
        for (a, b, want) in cases {
            let got = Shape::broadcast(&shape(a), &shape(b));
            assert_eq!(got, want.map(shape), "{a:?} with {b:?}");
            assert_eq!(Shape::broadcast(&shape(b), &shape(a)), want.map(shape));
        }
    }

    #[test]
    fn bind_checks_fixed_dims_and_consistency() {
        let mut b = SymbolBindings::new();
        shape(&["N", "3"]).bind(&[5, 3], &mut b).unwrap();
        assert_eq!(b[&Symbol::new("N")], 5);
        assert!(
            shape(&["N"])
                .bind(&[4], &mut b)
                .unwrap_err()
                .to_string()
                .contains("already bound to 5")
        );
        assert!(
            shape(&["2"])
                .bind(&[3], &mut b)
                .unwrap_err()
                .to_string()
                .contains("expected 2")
        );
        assert!(
            shape(&["2"])
                .bind(&[2, 1], &mut b)
                .unwrap_err()
                .to_string()
                .contains("rank 2")
        );
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }
}
