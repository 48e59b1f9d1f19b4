//! Host arrays: an ndarray of one of Kiln's dtypes.
//!
//! Arrays the interpreter produces are always in standard (row-major, contiguous) layout.

use kiln_ir::{DType, Literal, Shape, Type};
use ndarray::{ArrayD, IxDyn};
use std::fmt;
use std::sync::Arc;

/// The alignment of a large array's first element: a cache line, so that no 512-bit load or
/// store of a row that starts it straddles two lines. The allocator's own is 16 bytes, and a
/// large block it maps sits 16 bytes past a page boundary: every 512-bit access of such a
/// buffer touched two lines, which cost a fused kernel's passes a quarter of their time.
pub const ALIGN: usize = 64;

/// Arrays from this size (bytes) up are [`ALIGN`]ed; below it the padding is not worth it.
pub const ALIGNED_FROM: usize = 4096;

/// Zeros of `shape`, the first element [`ALIGN`]ed (from [`ALIGNED_FROM`] bytes): a
/// slightly longer zeroed vector (still `calloc`'s untouched pages), viewed from its first
/// aligned element.
fn aligned_zeros<T: Clone + num_traits::Zero>(shape: &[usize]) -> ArrayD<T> {
    let len: usize = shape.iter().product();
    let size = std::mem::size_of::<T>();
    if len.saturating_mul(size) < ALIGNED_FROM {
        return ArrayD::zeros(IxDyn(shape));
    }
    let padded = vec![T::zero(); len + ALIGN / size];
    let skip = padded.as_ptr().align_offset(ALIGN);
    ndarray::Array1::from_vec(padded)
        .slice_move(ndarray::s![skip..skip + len])
        .into_shape_with_order(IxDyn(shape))
        .expect("a contiguous slice of the shape's length")
}

/// An n-dimensional array of one of Kiln's dtypes, row-major (or any ndarray layout).
///
/// A large array Kiln allocates ([`Array::zeros`]) is a view that starts a few elements into
/// its vector, on a cache line: `into_raw_vec_and_offset` gives that offset.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// f32 elements.
    F32(ArrayD<f32>),
    /// f64 elements.
    F64(ArrayD<f64>),
    /// i32 elements.
    I32(ArrayD<i32>),
    /// i64 elements.
    I64(ArrayD<i64>),
    /// bool elements.
    Bool(ArrayD<bool>),
}

/// Runs `$body` with `$a` bound to the inner ndarray, whatever its dtype.
#[macro_export]
macro_rules! with_array {
    ($array:expr, $a:ident => $body:expr) => {
        match $array {
            $crate::Array::F32($a) => $body,
            $crate::Array::F64($a) => $body,
            $crate::Array::I32($a) => $body,
            $crate::Array::I64($a) => $body,
            $crate::Array::Bool($a) => $body,
        }
    };
}

/// Like [`with_array!`], wrapping the result back into the same variant.
#[macro_export]
macro_rules! map_array {
    ($array:expr, $a:ident => $body:expr) => {
        match $array {
            $crate::Array::F32($a) => $crate::Array::F32($body),
            $crate::Array::F64($a) => $crate::Array::F64($body),
            $crate::Array::I32($a) => $crate::Array::I32($body),
            $crate::Array::I64($a) => $crate::Array::I64($body),
            $crate::Array::Bool($a) => $crate::Array::Bool($body),
        }
    };
}

impl Array {
    /// Checks the array against an argument's type `expected`, binding its symbolic sizes in
    /// `bindings` (so that the arguments of one call agree on them); `Err` says why it does
    /// not fit, in words. The one argument check of the interpreter, the executor and the
    /// session, which each name the argument in their own error.
    pub fn check_fits(
        &self,
        expected: &Type,
        bindings: &mut kiln_ir::SymbolBindings,
    ) -> Result<(), String> {
        if self.dtype() != expected.dtype {
            return Err(format!(
                "the dtype is {}, not {}",
                self.dtype(),
                expected.dtype
            ));
        }
        expected
            .shape
            .bind(self.shape(), bindings)
            .map_err(|e| e.to_string())
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Array::F32(_) => DType::F32,
            Array::F64(_) => DType::F64,
            Array::I32(_) => DType::I32,
            Array::I64(_) => DType::I64,
            Array::Bool(_) => DType::Bool,
        }
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        with_array!(self, a => a.len())
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The static type of this array.
    pub fn ty(&self) -> Type {
        Type::new(self.dtype(), Shape::fixed(self.shape()))
    }

    /// An array of `shape` filled with zeros (`false` for bool). Its first element is
    /// [`ALIGN`]-byte aligned when the array is at least [`ALIGNED_FROM`] bytes.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Array {
        match dtype {
            DType::F32 => Array::F32(aligned_zeros(shape)),
            DType::F64 => Array::F64(aligned_zeros(shape)),
            DType::I32 => Array::I32(aligned_zeros(shape)),
            DType::I64 => Array::I64(aligned_zeros(shape)),
            DType::Bool => Array::Bool(ArrayD::from_elem(IxDyn(shape), false)),
        }
    }

    /// The elements of `literal` in `shape`; a one-element literal fills the shape.
    /// `None` when the element count does not fit the shape.
    pub fn from_literal(literal: &Literal, shape: &[usize]) -> Option<Array> {
        fn build<T: Clone>(values: &[T], shape: &[usize]) -> Option<ArrayD<T>> {
            match values {
                [v] => Some(ArrayD::from_elem(IxDyn(shape), v.clone())),
                _ => ArrayD::from_shape_vec(IxDyn(shape), values.to_vec()).ok(),
            }
        }
        Some(match literal {
            Literal::F32(v) => Array::F32(build(v, shape)?),
            Literal::F64(v) => Array::F64(build(v, shape)?),
            Literal::I32(v) => Array::I32(build(v, shape)?),
            Literal::I64(v) => Array::I64(build(v, shape)?),
            Literal::Bool(v) => Array::Bool(build(v, shape)?),
        })
    }

    /// The elements as a literal, row-major.
    pub fn to_literal(&self) -> Literal {
        match self {
            Array::F32(a) => Literal::F32(a.iter().copied().collect()),
            Array::F64(a) => Literal::F64(a.iter().copied().collect()),
            Array::I32(a) => Literal::I32(a.iter().copied().collect()),
            Array::I64(a) => Literal::I64(a.iter().copied().collect()),
            Array::Bool(a) => Literal::Bool(a.iter().copied().collect()),
        }
    }

    /// Every element as f64, row-major (exact but for the largest i64 values).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            Array::F32(a) => a.iter().map(|&x| x as f64).collect(),
            Array::F64(a) => a.iter().copied().collect(),
            Array::I32(a) => a.iter().map(|&x| x as f64).collect(),
            Array::I64(a) => a.iter().map(|&x| x as f64).collect(),
            Array::Bool(a) => a.iter().map(|&x| x as u8 as f64).collect(),
        }
    }

    /// The value of a one-element bool array.
    pub fn as_bool_scalar(&self) -> Option<bool> {
        match self {
            Array::Bool(a) if a.len() == 1 => a.iter().next().copied(),
            _ => None,
        }
    }

    /// Converts to `to` the way the `cast` op does: floats to integers saturate (NaN gives 0),
    /// non-zero (and NaN) is `true`, `true` is 1.
    pub fn cast(&self, to: DType) -> Array {
        macro_rules! convert {
            ($a:expr, $t:ty, $f:expr) => {
                $a.mapv(|x| -> $t { $f(x) })
            };
        }
        match self {
            Array::F32(a) => match to {
                DType::F32 => self.clone(),
                DType::F64 => Array::F64(convert!(a, f64, |x: f32| x as f64)),
                DType::I32 => Array::I32(convert!(a, i32, |x: f32| x as i32)),
                DType::I64 => Array::I64(convert!(a, i64, |x: f32| x as i64)),
                DType::Bool => Array::Bool(convert!(a, bool, |x: f32| x != 0.0)),
            },
            Array::F64(a) => match to {
                DType::F32 => Array::F32(convert!(a, f32, |x: f64| x as f32)),
                DType::F64 => self.clone(),
                DType::I32 => Array::I32(convert!(a, i32, |x: f64| x as i32)),
                DType::I64 => Array::I64(convert!(a, i64, |x: f64| x as i64)),
                DType::Bool => Array::Bool(convert!(a, bool, |x: f64| x != 0.0)),
            },
            Array::I32(a) => match to {
                DType::F32 => Array::F32(convert!(a, f32, |x: i32| x as f32)),
                DType::F64 => Array::F64(convert!(a, f64, |x: i32| x as f64)),
                DType::I32 => self.clone(),
                DType::I64 => Array::I64(convert!(a, i64, |x: i32| x as i64)),
                DType::Bool => Array::Bool(convert!(a, bool, |x: i32| x != 0)),
            },
            Array::I64(a) => match to {
                DType::F32 => Array::F32(convert!(a, f32, |x: i64| x as f32)),
                DType::F64 => Array::F64(convert!(a, f64, |x: i64| x as f64)),
                DType::I32 => Array::I32(convert!(a, i32, |x: i64| x as i32)),
                DType::I64 => self.clone(),
                DType::Bool => Array::Bool(convert!(a, bool, |x: i64| x != 0)),
            },
            Array::Bool(a) => match to {
                DType::F32 => Array::F32(convert!(a, f32, |x: bool| x as u8 as f32)),
                DType::F64 => Array::F64(convert!(a, f64, |x: bool| x as u8 as f64)),
                DType::I32 => Array::I32(convert!(a, i32, |x: bool| x as i32)),
                DType::I64 => Array::I64(convert!(a, i64, |x: bool| x as i64)),
                DType::Bool => self.clone(),
            },
        }
    }

    /// The address of the first element, for native kernels. The array must be in standard
    /// layout (every array Kiln makes is).
    pub fn data_ptr(&self) -> *const u8 {
        with_array!(self, a => {
            debug_assert!(a.is_standard_layout());
            a.as_ptr().cast::<u8>()
        })
    }

    /// The address of the first element, to write (the array must be contiguous).
    pub fn data_mut_ptr(&mut self) -> *mut u8 {
        with_array!(self, a => {
            debug_assert!(a.is_standard_layout());
            a.as_mut_ptr().cast::<u8>()
        })
    }

    /// Copies `from`'s elements over this array's, which has its dtype and shape.
    ///
    /// # Panics
    /// If the dtypes or shapes differ (a bug in the caller).
    pub fn assign(&mut self, from: &Array) {
        match (self, from) {
            (Array::F32(a), Array::F32(b)) => a.assign(b),
            (Array::F64(a), Array::F64(b)) => a.assign(b),
            (Array::I32(a), Array::I32(b)) => a.assign(b),
            (Array::I64(a), Array::I64(b)) => a.assign(b),
            (Array::Bool(a), Array::Bool(b)) => a.assign(b),
            (a, b) => panic!("cannot assign {} to {}", b.ty(), a.ty()),
        }
    }

    /// Gives a standard-layout array a new shape with as many elements, without copying.
    pub fn reshape_in_place(&mut self, shape: &[usize]) {
        if self.shape() == shape {
            return;
        }
        fn reshaped<T>(a: &mut ArrayD<T>, shape: &[usize]) {
            let owned = std::mem::replace(
                a,
                ArrayD::from_shape_vec(IxDyn(&[0]), Vec::new()).expect("empty"),
            );
            *a = owned
                .into_shape_with_order(IxDyn(shape))
                .expect("a standard-layout array of the same length");
        }
        with_array!(self, a => reshaped(a, shape))
    }

    /// Copies the elements of `other` (same dtype and length, both standard layout) into this
    /// array, keeping this array's shape.
    pub fn copy_elements_from(&mut self, other: &Array) {
        fn copy<T: Clone>(to: &mut ArrayD<T>, from: &ArrayD<T>) {
            let from = from.as_slice().expect("a standard-layout array");
            to.as_slice_mut()
                .expect("a standard-layout array")
                .clone_from_slice(from);
        }
        match (self, other) {
            (Array::F32(a), Array::F32(b)) => copy(a, b),
            (Array::F64(a), Array::F64(b)) => copy(a, b),
            (Array::I32(a), Array::I32(b)) => copy(a, b),
            (Array::I64(a), Array::I64(b)) => copy(a, b),
            (Array::Bool(a), Array::Bool(b)) => copy(a, b),
            _ => panic!("copy_elements_from: the dtypes differ"),
        }
    }

    /// Whether the elements lie row-major and contiguous (what native kernels read).
    pub fn is_standard_layout(&self) -> bool {
        with_array!(self, a => a.is_standard_layout())
    }

    /// `array` itself if it is laid out row-major, else a row-major copy (one copy, however
    /// shared the array is): what native kernels and stored state need.
    pub fn standard_shared(array: Arc<Array>) -> Arc<Array> {
        if array.is_standard_layout() {
            return array;
        }
        Arc::new(map_array!(&*array, a => a.as_standard_layout().into_owned()))
    }

    /// The same array in standard (row-major, contiguous) layout.
    pub fn into_standard_layout(self) -> Array {
        map_array!(self, a => if a.is_standard_layout() { a } else { a.as_standard_layout().into_owned() })
    }
}

/// The element types an [`Array`] holds, for typed access: `array.as_ndarray::<f32>()`.
pub trait Element: Sized + Clone {
    /// The array's elements, if it holds this element type.
    fn view(array: &Array) -> Option<&ArrayD<Self>>;
}

macro_rules! elements {
    ($($t:ty => $variant:ident),*) => {$(
        impl Element for $t {
            fn view(array: &Array) -> Option<&ArrayD<$t>> {
                match array {
                    Array::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
    )*};
}

elements!(f32 => F32, f64 => F64, i32 => I32, i64 => I64, bool => Bool);

impl Array {
    /// The ndarray inside, if it holds elements of type `T`.
    pub fn as_ndarray<T: Element>(&self) -> Option<&ArrayD<T>> {
        T::view(self)
    }
}

macro_rules! array_from {
    ($($t:ty => $variant:ident),*) => {
        $(
            impl From<ArrayD<$t>> for Array {
                fn from(a: ArrayD<$t>) -> Array {
                    Array::$variant(a)
                }
            }
        )*
    };
}

array_from!(f32 => F32, f64 => F64, i32 => I32, i64 => I64, bool => Bool);

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        with_array!(self, a => fmt::Display::fmt(a, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_zeros_start_on_a_cache_line_and_stay_there_when_reshaped() {
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64] {
            for shape in [vec![1024], vec![33, 517], vec![4096, 4096]] {
                let mut a = Array::zeros(dtype, &shape);
                assert_eq!(a.data_ptr() as usize % ALIGN, 0, "{dtype} {shape:?}");
                assert_eq!(a.shape(), shape.as_slice());
                assert!(a.to_f64_vec().iter().all(|&x| x == 0.0));
                let flat = [a.len()];
                a.reshape_in_place(&flat);
                assert_eq!(a.data_ptr() as usize % ALIGN, 0);
                // The view's elements are the array's, and writing them reaches them.
                a.copy_elements_from(&Array::from_literal(&ones(dtype), &flat).unwrap());
                assert!(a.to_f64_vec().iter().all(|&x| x == 1.0));
            }
        }
    }

    fn ones(dtype: DType) -> Literal {
        match dtype {
            DType::F32 => Literal::F32(vec![1.0]),
            DType::F64 => Literal::F64(vec![1.0]),
            DType::I32 => Literal::I32(vec![1]),
            DType::I64 => Literal::I64(vec![1]),
            DType::Bool => Literal::Bool(vec![true]),
        }
    }
}
