//! Host tensors: constants in the IR and values in the reference executor.

use super::dtype::DType;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

/// A dense host tensor of one of the supported element types.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<f16>),
    BF16(ArrayD<bf16>),
    I8(ArrayD<i8>),
    I16(ArrayD<i16>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    U8(ArrayD<u8>),
    U16(ArrayD<u16>),
    U32(ArrayD<u32>),
    U64(ArrayD<u64>),
    Bool(ArrayD<bool>),
}

/// Runs `$body` with `$a` bound to the inner array, whatever its element type.
#[macro_export]
macro_rules! with_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::ir::Tensor::F32($a) => $body,
            $crate::ir::Tensor::F64($a) => $body,
            $crate::ir::Tensor::F16($a) => $body,
            $crate::ir::Tensor::BF16($a) => $body,
            $crate::ir::Tensor::I8($a) => $body,
            $crate::ir::Tensor::I16($a) => $body,
            $crate::ir::Tensor::I32($a) => $body,
            $crate::ir::Tensor::I64($a) => $body,
            $crate::ir::Tensor::U8($a) => $body,
            $crate::ir::Tensor::U16($a) => $body,
            $crate::ir::Tensor::U32($a) => $body,
            $crate::ir::Tensor::U64($a) => $body,
            $crate::ir::Tensor::Bool($a) => $body,
        }
    };
}

/// Runs `$body` with the type alias `$T` bound to the Rust element type of `$dt`.
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::ir::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::ir::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::ir::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::ir::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::ir::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::ir::DType::I16 => {
                type $T = i16;
                $body
            }
            $crate::ir::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::ir::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::ir::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::ir::DType::U16 => {
                type $T = u16;
                $body
            }
            $crate::ir::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::ir::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::ir::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

/// Like `with_tensor!`, but the body builds a new tensor of the same element type:
/// `map_tensor!(t, a => a.t().to_owned())`.
#[macro_export]
macro_rules! map_tensor {
    ($t:expr, $a:ident => $body:expr) => {
        match $t {
            $crate::ir::Tensor::F32($a) => $crate::ir::Tensor::F32($body),
            $crate::ir::Tensor::F64($a) => $crate::ir::Tensor::F64($body),
            $crate::ir::Tensor::F16($a) => $crate::ir::Tensor::F16($body),
            $crate::ir::Tensor::BF16($a) => $crate::ir::Tensor::BF16($body),
            $crate::ir::Tensor::I8($a) => $crate::ir::Tensor::I8($body),
            $crate::ir::Tensor::I16($a) => $crate::ir::Tensor::I16($body),
            $crate::ir::Tensor::I32($a) => $crate::ir::Tensor::I32($body),
            $crate::ir::Tensor::I64($a) => $crate::ir::Tensor::I64($body),
            $crate::ir::Tensor::U8($a) => $crate::ir::Tensor::U8($body),
            $crate::ir::Tensor::U16($a) => $crate::ir::Tensor::U16($body),
            $crate::ir::Tensor::U32($a) => $crate::ir::Tensor::U32($body),
            $crate::ir::Tensor::U64($a) => $crate::ir::Tensor::U64($body),
            $crate::ir::Tensor::Bool($a) => $crate::ir::Tensor::Bool($body),
        }
    };
}

/// Element types a `Tensor` can hold, with the conversions `Cast` needs.
pub trait Elem: Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_i64(self) -> i64;
    fn from_i64(v: i64) -> Self;
    fn wrap(a: ArrayD<Self>) -> Tensor;
    fn view(t: &Tensor) -> Option<&ArrayD<Self>>;
}

macro_rules! impl_elem_num {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            fn to_i64(self) -> i64 {
                self as i64
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$variant(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
impl_elem_num!(f32, F32);
impl_elem_num!(f64, F64);
impl_elem_num!(i8, I8);
impl_elem_num!(i16, I16);
impl_elem_num!(i32, I32);
impl_elem_num!(i64, I64);
impl_elem_num!(u8, U8);
impl_elem_num!(u16, U16);
impl_elem_num!(u32, U32);
impl_elem_num!(u64, U64);

macro_rules! impl_elem_half {
    ($t:ty, $variant:ident) => {
        impl Elem for $t {
            const DTYPE: DType = DType::$variant;
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
            fn to_i64(self) -> i64 {
                self.to_f64() as i64
            }
            fn from_i64(v: i64) -> Self {
                <$t>::from_f64(v as f64)
            }
            fn wrap(a: ArrayD<Self>) -> Tensor {
                Tensor::$variant(a)
            }
            fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
                match t {
                    Tensor::$variant(a) => Some(a),
                    _ => None,
                }
            }
        }
    };
}
impl_elem_half!(f16, F16);
impl_elem_half!(bf16, BF16);

impl Elem for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_i64(self) -> i64 {
        self as i64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn wrap(a: ArrayD<Self>) -> Tensor {
        Tensor::Bool(a)
    }
    fn view(t: &Tensor) -> Option<&ArrayD<Self>> {
        match t {
            Tensor::Bool(a) => Some(a),
            _ => None,
        }
    }
}

fn cast_array<S: Elem, T: Elem>(a: &ArrayD<S>) -> ArrayD<T> {
    // Integer to integer goes through i64 so large values keep their precision; anything
    // touching a float goes through f64 (exact for every source type except huge u64/i64).
    if S::DTYPE.is_float() || T::DTYPE.is_float() {
        a.mapv(|v| T::from_f64(v.to_f64()))
    } else {
        a.mapv(|v| T::from_i64(v.to_i64()))
    }
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::F16(_) => DType::F16,
            Tensor::BF16(_) => DType::BF16,
            Tensor::I8(_) => DType::I8,
            Tensor::I16(_) => DType::I16,
            Tensor::I32(_) => DType::I32,
            Tensor::I64(_) => DType::I64,
            Tensor::U8(_) => DType::U8,
            Tensor::U16(_) => DType::U16,
            Tensor::U32(_) => DType::U32,
            Tensor::U64(_) => DType::U64,
            Tensor::Bool(_) => DType::Bool,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_tensor!(self, a => a.shape())
    }

    pub fn len(&self) -> usize {
        with_tensor!(self, a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn rank(&self) -> usize {
        self.shape().len()
    }

    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// A tensor of zeros (false for bool).
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        with_dtype!(dtype, T => T::wrap(ArrayD::from_elem(IxDyn(shape), T::default())))
    }

    /// A tensor filled with `value` converted to `dtype`.
    pub fn full(dtype: DType, shape: &[usize], value: f64) -> Tensor {
        Tensor::F64(ArrayD::from_elem(IxDyn(shape), value)).cast(dtype)
    }

    /// Converts to another element type with ONNX `Cast` semantics (truncation toward zero
    /// for float to int, nonzero to true for bool).
    pub fn cast(&self, to: DType) -> Tensor {
        if self.dtype() == to {
            return self.clone();
        }
        fn go<S: Elem>(a: &ArrayD<S>, to: DType) -> Tensor {
            with_dtype!(to, T => T::wrap(cast_array::<S, T>(a)))
        }
        with_tensor!(self, a => go(a, to))
    }

    /// The values as f32 (the reference executor's compute type); a copy unless already f32.
    pub fn to_f32(&self) -> ArrayD<f32> {
        match self {
            Tensor::F32(a) => a.clone(),
            other => match other.cast(DType::F32) {
                Tensor::F32(a) => a,
                _ => unreachable!("cast to F32 yields F32"),
            },
        }
    }

    /// The values as f64 (for comparisons and reports).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_tensor!(self, a => a.iter().map(|v| v.to_f64()).collect())
    }

    /// The values as i64 (shape tensors, indices, axes). Floats are truncated.
    pub fn to_i64_vec(&self) -> Vec<i64> {
        with_tensor!(self, a => a.iter().map(|v| v.to_i64()).collect())
    }

    pub fn as_f32(&self) -> Option<&ArrayD<f32>> {
        f32::view(self)
    }

    pub fn as_i64(&self) -> Option<&ArrayD<i64>> {
        i64::view(self)
    }

    pub fn as_bool(&self) -> Option<&ArrayD<bool>> {
        bool::view(self)
    }

    /// The single value of a one-element tensor, as f64.
    pub fn scalar_f64(&self) -> Option<f64> {
        (self.len() == 1).then(|| self.to_f64_vec()[0])
    }

    pub fn from_i64s(shape: &[usize], values: Vec<i64>) -> Tensor {
        Tensor::I64(ArrayD::from_shape_vec(IxDyn(shape), values).expect("shape matches value count"))
    }

    pub fn from_f32s(shape: &[usize], values: Vec<f32>) -> Tensor {
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), values).expect("shape matches value count"))
    }

    /// Reshapes without changing element order (the product of `shape` must equal `len`).
    pub fn reshaped(&self, shape: &[usize]) -> Option<Tensor> {
        fn go<T: Elem>(a: &ArrayD<T>, shape: &[usize]) -> Option<Tensor> {
            let v: Vec<T> = a.iter().copied().collect();
            ArrayD::from_shape_vec(IxDyn(shape), v).ok().map(T::wrap)
        }
        with_tensor!(self, a => go(a, shape))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cast_semantics() {
        let t = Tensor::from_f32s(&[3], vec![-1.7, 0.0, 2.9]);
        assert_eq!(t.cast(DType::I64).to_i64_vec(), vec![-1, 0, 2]);
        assert_eq!(t.cast(DType::Bool).to_i64_vec(), vec![1, 0, 1]);
        assert_eq!(t.cast(DType::F16).cast(DType::F32).to_f64_vec()[2] as f32, f16::from_f32(2.9).to_f32());
        let big = Tensor::from_i64s(&[1], vec![i64::MAX - 1]);
        assert_eq!(big.cast(DType::I64).to_i64_vec(), vec![i64::MAX - 1]);
    }
}
