//! Constant data carried by `const` ops.
//!
//! A literal is either one element (a splat: every element of the result has that value, which
//! also works for symbolic shapes) or exactly as many elements as its static shape holds, in
//! row-major order. Floats compare by bits, so `-0.0 != 0.0`, and every NaN equals every NaN:
//! that makes equality exact and still true after a print/parse round trip.

use crate::types::DType;
use std::fmt;
use std::hash::{Hash, Hasher};

/// A constant's elements: one (a splat) or all of them, row-major.
#[derive(Clone, Debug)]
pub enum Literal {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// bool elements.
    Bool(Vec<bool>),
}

impl Literal {
    /// One element of `dtype` holding `value` converted the way `cast` converts (saturating for
    /// integers, non-zero is `true`).
    pub fn scalar(dtype: DType, value: f64) -> Literal {
        match dtype {
            DType::F32 => Literal::F32(vec![value as f32]),
            DType::F64 => Literal::F64(vec![value]),
            DType::I32 => Literal::I32(vec![value as i32]),
            DType::I64 => Literal::I64(vec![value as i64]),
            DType::Bool => Literal::Bool(vec![value != 0.0]),
        }
    }

    /// The elements' dtype.
    pub fn dtype(&self) -> DType {
        match self {
            Literal::F32(_) => DType::F32,
            Literal::F64(_) => DType::F64,
            Literal::I32(_) => DType::I32,
            Literal::I64(_) => DType::I64,
            Literal::Bool(_) => DType::Bool,
        }
    }

    /// How many elements are written out.
    pub fn len(&self) -> usize {
        match self {
            Literal::F32(v) => v.len(),
            Literal::F64(v) => v.len(),
            Literal::I32(v) => v.len(),
            Literal::I64(v) => v.len(),
            Literal::Bool(v) => v.len(),
        }
    }

    /// Whether no element is written out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as f64 (exact for every dtype but the largest i64 values).
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Literal::F32(v) => v[i] as f64,
            Literal::F64(v) => v[i],
            Literal::I32(v) => v[i] as f64,
            Literal::I64(v) => v[i] as f64,
            Literal::Bool(v) => v[i] as u8 as f64,
        }
    }

    /// The one element of a literal of more than one element that are all the same bits:
    /// the splat it is.
    pub fn splat(&self) -> Option<Literal> {
        fn same<T: Copy, B: PartialEq>(v: &[T], bits: impl Fn(T) -> B) -> bool {
            v.len() > 1 && v.iter().all(|&x| bits(x) == bits(v[0]))
        }
        let one = match self {
            Literal::F32(v) if same(v, f32::to_bits) => Literal::F32(vec![v[0]]),
            Literal::F64(v) if same(v, f64::to_bits) => Literal::F64(vec![v[0]]),
            Literal::I32(v) if same(v, |x| x) => Literal::I32(vec![v[0]]),
            Literal::I64(v) if same(v, |x| x) => Literal::I64(vec![v[0]]),
            Literal::Bool(v) if same(v, |x| x) => Literal::Bool(vec![v[0]]),
            _ => return None,
        };
        Some(one)
    }

    /// The axis along which an integer literal of `shape` (more than one element, written out)
    /// counts `0, 1, 2, …`, the same along every other axis: what `iota {axis}` holds.
    pub fn iota_axis(&self, shape: &[usize]) -> Option<usize> {
        let integer = matches!(self, Literal::I32(_) | Literal::I64(_));
        let count: usize = shape.iter().product();
        if !integer || self.len() < 2 || self.len() != count {
            return None;
        }
        (0..shape.len()).filter(|&a| shape[a] > 1).find(|&axis| {
            let inner: usize = shape[axis + 1..].iter().product();
            (0..count).all(|i| self.get_f64(i) == ((i / inner) % shape[axis]) as f64)
        })
    }

    /// Writes element `i` in the text form's syntax.
    pub fn fmt_element(&self, i: usize, f: &mut dyn fmt::Write) -> fmt::Result {
        match self {
            Literal::F32(v) => fmt_float(v[i] as f64, format_args!("{:?}", v[i]), f),
            Literal::F64(v) => fmt_float(v[i], format_args!("{:?}", v[i]), f),
            Literal::I32(v) => write!(f, "{}", v[i]),
            Literal::I64(v) => write!(f, "{}", v[i]),
            Literal::Bool(v) => write!(f, "{}", v[i]),
        }
    }

    /// Writes the literal with nested brackets following `dims` (row-major); a splat prints as
    /// its single element.
    pub fn fmt_nested(&self, dims: &[usize], f: &mut dyn fmt::Write) -> fmt::Result {
        let one_element = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) == Some(1);
        if self.len() == 1 && !one_element || dims.is_empty() {
            return self.fmt_element(0, f);
        }
        let mut next = 0;
        self.fmt_level(dims, &mut next, f)
    }

    fn fmt_level(&self, dims: &[usize], next: &mut usize, f: &mut dyn fmt::Write) -> fmt::Result {
        f.write_char('[')?;
        for i in 0..dims[0] {
            if i > 0 {
                f.write_str(", ")?;
            }
            if dims.len() == 1 {
                self.fmt_element(*next, f)?;
                *next += 1;
            } else {
                self.fmt_level(&dims[1..], next, f)?;
            }
        }
        f.write_char(']')
    }

    fn float_bits(&self) -> Option<Vec<u64>> {
        let canon = |x: f64| {
            if x.is_nan() {
                f64::NAN.to_bits()
            } else {
                x.to_bits()
            }
        };
        match self {
            Literal::F32(v) => Some(v.iter().map(|&x| canon(x as f64)).collect()),
            Literal::F64(v) => Some(v.iter().map(|&x| canon(x)).collect()),
            _ => None,
        }
    }
}

fn fmt_float(value: f64, debug: fmt::Arguments<'_>, f: &mut dyn fmt::Write) -> fmt::Result {
    if value.is_nan() {
        f.write_str("nan")
    } else if value.is_infinite() {
        f.write_str(if value > 0.0 { "inf" } else { "-inf" })
    } else {
        // `{:?}` is the shortest text that parses back to the same float.
        f.write_fmt(debug)
    }
}

impl PartialEq for Literal {
    fn eq(&self, other: &Literal) -> bool {
        match (self, other) {
            (Literal::I32(a), Literal::I32(b)) => a == b,
            (Literal::I64(a), Literal::I64(b)) => a == b,
            (Literal::Bool(a), Literal::Bool(b)) => a == b,
            (Literal::F32(_), Literal::F32(_)) | (Literal::F64(_), Literal::F64(_)) => {
                self.float_bits() == other.float_bits()
            }
            _ => false,
        }
    }
}

impl Eq for Literal {}

/// A total order consistent with `==`: by dtype, then elementwise (floats by their canonical
/// bits), so literals can key ordered maps and e-graph nodes.
impl Ord for Literal {
    fn cmp(&self, other: &Literal) -> std::cmp::Ordering {
        let by_dtype = self.dtype().cmp(&other.dtype());
        if by_dtype.is_ne() {
            return by_dtype;
        }
        match (self, other) {
            (Literal::I32(a), Literal::I32(b)) => a.cmp(b),
            (Literal::I64(a), Literal::I64(b)) => a.cmp(b),
            (Literal::Bool(a), Literal::Bool(b)) => a.cmp(b),
            _ => self.float_bits().cmp(&other.float_bits()),
        }
    }
}

impl PartialOrd for Literal {
    fn partial_cmp(&self, other: &Literal) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Hash for Literal {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.dtype().hash(state);
        match self {
            Literal::I32(v) => v.hash(state),
            Literal::I64(v) => v.hash(state),
            Literal::Bool(v) => v.hash(state),
            Literal::F32(_) | Literal::F64(_) => self.float_bits().hash(state),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(lit: &Literal, dims: &[usize]) -> String {
        let mut s = String::new();
        lit.fmt_nested(dims, &mut s).unwrap();
        s
    }

    #[test]
    fn prints_nested_and_splat() {
        let m = Literal::I32(vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(nested(&m, &[2, 3]), "[[1, 2, 3], [4, 5, 6]]");
        assert_eq!(nested(&Literal::F32(vec![0.5]), &[4, 4]), "0.5");
        assert_eq!(nested(&Literal::F32(vec![0.5]), &[]), "0.5");
        assert_eq!(nested(&Literal::F32(vec![0.5]), &[1]), "[0.5]");
        let specials = Literal::F64(vec![
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e-300,
        ]);
        assert_eq!(nested(&specials, &[5]), "[nan, inf, -inf, -0.0, 1e-300]");
    }

    #[test]
    fn equality_is_bitwise_with_one_nan() {
        assert_eq!(Literal::F32(vec![f32::NAN]), Literal::F32(vec![-f32::NAN]));
        assert_ne!(Literal::F32(vec![0.0]), Literal::F32(vec![-0.0]));
        assert_ne!(Literal::F32(vec![1.0]), Literal::F64(vec![1.0]));
    }
}
