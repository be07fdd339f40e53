//! Reference kernels of the activation op family.
//!
//! [`Activation`] is the one description of a pointwise activation used everywhere: the
//! reference executor applies it here, and the optimiser fuses the same values into conv/gemm
//! epilogues (so it is `Copy`, comparable and carries its parameters).

use super::arithmetic::{map_float, zip_broadcast, zip_float};
use crate::ir::ops::activation::Activation;
use crate::ir::{OpError, OpResult, Tensor};
use crate::{int_tensor, same_int_tensors};
use ndarray::ArrayD;
use num_traits::{Bounded, Float};

/// Converts a parameter to the compute type (exact: f32 fits in f32 and f64).
fn c<F: Float>(v: f32) -> F {
    F::from(v).unwrap_or_else(F::nan)
}

fn c64<F: Float>(v: f64) -> F {
    F::from(v).unwrap_or_else(F::nan)
}

impl Activation {
    /// The ONNX op type this activation implements.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Relu => "Relu",
            Activation::LeakyRelu { .. } => "LeakyRelu",
            Activation::Sigmoid => "Sigmoid",
            Activation::Tanh => "Tanh",
            Activation::Clip { .. } => "Clip",
            Activation::HardSigmoid { .. } => "HardSigmoid",
            Activation::HardSwish => "HardSwish",
            Activation::Gelu { .. } => "Gelu",
            Activation::Erf => "Erf",
            Activation::Softplus => "Softplus",
            Activation::Elu { .. } => "Elu",
            Activation::Selu { .. } => "Selu",
            Activation::Celu { .. } => "Celu",
            Activation::Softsign => "Softsign",
            Activation::ThresholdedRelu { .. } => "ThresholdedRelu",
            Activation::Mish => "Mish",
            Activation::Shrink { .. } => "Shrink",
        }
    }

    /// Whether the activation is defined on signed integers too (`Relu`, opset 14).
    pub fn accepts_signed_int(self) -> bool {
        matches!(self, Activation::Relu)
    }

    pub fn apply(self, x: f32) -> f32 {
        self.eval(x)
    }

    pub fn apply_f64(self, x: f64) -> f64 {
        self.eval(x)
    }

    /// Applies the activation in place (epilogues of fused kernels).
    pub fn apply_slice(self, xs: &mut [f32]) {
        for x in xs {
            *x = self.eval(*x);
        }
    }

    /// The activation in any float compute type.
    pub fn eval<F: Float>(self, x: F) -> F {
        let zero = F::zero();
        let one = F::one();
        let half = c::<F>(0.5);
        match self {
            // NaN propagates (x < 0 is false for NaN), as in ONNX Runtime.
            Activation::Relu => {
                if x < zero {
                    zero
                } else {
                    x
                }
            }
            Activation::LeakyRelu { alpha } => {
                if x < zero {
                    c::<F>(alpha) * x
                } else {
                    x
                }
            }
            Activation::Sigmoid => {
                // Two branches so exp never overflows.
                if x >= zero {
                    one / (one + (-x).exp())
                } else {
                    let e = x.exp();
                    e / (one + e)
                }
            }
            Activation::Tanh => x.tanh(),
            Activation::Clip { min, max } => {
                let y = if x < c::<F>(min) { c::<F>(min) } else { x };
                if y > c::<F>(max) {
                    c::<F>(max)
                } else {
                    y
                }
            }
            Activation::HardSigmoid { alpha, beta } => hard_sigmoid(x, c(alpha), c(beta)),
            Activation::HardSwish => x * hard_sigmoid(x, c64(1.0 / 6.0), half),
            Activation::Gelu { tanh_approx: false } => {
                half * x
                    * (one
                        + c64::<F>(erf((x * c64::<F>(std::f64::consts::FRAC_1_SQRT_2)).to_f64().unwrap_or(f64::NAN))))
            }
            Activation::Gelu { tanh_approx: true } => {
                let k = c64::<F>((2.0 / std::f64::consts::PI).sqrt());
                half * x * (one + (k * (x + c64::<F>(0.044715) * x * x * x)).tanh())
            }
            Activation::Erf => c64(erf(x.to_f64().unwrap_or(f64::NAN))),
            Activation::Softplus => {
                if x > zero {
                    x + (-x).exp().ln_1p()
                } else {
                    x.exp().ln_1p()
                }
            }
            Activation::Elu { alpha } => {
                if x < zero {
                    c::<F>(alpha) * x.exp_m1()
                } else {
                    x
                }
            }
            Activation::Selu { alpha, gamma } => {
                if x > zero {
                    c::<F>(gamma) * x
                } else {
                    c::<F>(gamma) * c::<F>(alpha) * x.exp_m1()
                }
            }
            Activation::Celu { alpha } => {
                let a = c::<F>(alpha);
                let neg = a * (x / a).exp_m1();
                if x > zero {
                    x
                } else if neg.is_nan() {
                    neg
                } else {
                    neg.min(zero)
                }
            }
            Activation::Softsign => x / (one + x.abs()),
            Activation::ThresholdedRelu { alpha } => {
                if x > c::<F>(alpha) || x.is_nan() {
                    x
                } else {
                    zero
                }
            }
            Activation::Mish => x * Activation::Softplus.eval(x).tanh(),
            Activation::Shrink { lambd, bias } => {
                if x < -c::<F>(lambd) {
                    x + c::<F>(bias)
                } else if x > c::<F>(lambd) {
                    x - c::<F>(bias)
                } else if x.is_nan() {
                    x
                } else {
                    zero
                }
            }
        }
    }

    /// Applies the activation to a tensor: floats in their own precision (f16/bf16 through
    /// f32), signed integers exactly for the kinds that accept them.
    pub fn apply_tensor(self, x: &Tensor) -> OpResult<Tensor> {
        if let Some(t) = map_float(x, |v| self.eval(v), |v| self.eval(v)) {
            return Ok(t);
        }
        if self.accepts_signed_int() && x.dtype().is_int() && x.dtype().is_signed() {
            if let Some(t) = int_tensor!(x, |a| a.mapv(|v| if v < Default::default() { Default::default() } else { v }))
            {
                return Ok(t);
            }
        }
        Err(OpError(format!("{}: element type {} is not supported", self.name(), x.dtype())))
    }
}

fn hard_sigmoid<F: Float>(x: F, alpha: F, beta: F) -> F {
    let y = alpha * x + beta;
    if y.is_nan() {
        y
    } else {
        y.max(F::zero()).min(F::one())
    }
}

/// The error function, accurate to ~1e-15 absolute (far beyond f32 needs).
///
/// `|x| < 2.5`: Maclaurin series (cancellation costs at most ~3 digits of f64 there).
/// `|x| ≥ 2.5`: Laplace's continued fraction for `erfc`, evaluated bottom-up.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    if ax < 2.5 {
        let x2 = x * x;
        let mut term = x; // (-1)^n x^(2n+1) / n!
        let mut sum = x;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -x2 / n;
            let contrib = term / (2.0 * n + 1.0);
            sum += contrib;
            if contrib.abs() <= 1e-17 * sum.abs() || n > 200.0 {
                break;
            }
        }
        return sum * std::f64::consts::FRAC_2_SQRT_PI;
    }
    if ax > 6.0 {
        // erfc(6) ≈ 2e-17: below f64 resolution of 1.
        return x.signum();
    }
    // erfc(x) = exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + …)))))
    let mut t = ax;
    for k in (1..=60).rev() {
        t = ax + (k as f64 / 2.0) / t;
    }
    let erfc = (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * t);
    (1.0 - erfc).copysign(x)
}

/// `Clip` for any ordered element type; NaN propagates and `lo > hi` gives `hi` (ONNX Runtime).
pub fn clip_array<T: Copy + PartialOrd>(a: &ArrayD<T>, lo: T, hi: T) -> ArrayD<T> {
    a.mapv(|x| {
        let y = if x < lo { lo } else { x };
        if y > hi {
            hi
        } else {
            y
        }
    })
}

/// `Clip` of a tensor by optional one-element bound tensors of the same type. An absent bound
/// is the type's lowest/highest value (the ONNX default; for floats `±f32::MAX`, not infinity,
/// so infinities are clamped exactly as ONNX Runtime does).
pub fn clip(x: &Tensor, min: Option<&Tensor>, max: Option<&Tensor>) -> OpResult<Tensor> {
    fn bound<T: crate::ir::Elem>(t: Option<&Tensor>, what: &str) -> OpResult<Option<T>> {
        let Some(t) = t else { return Ok(None) };
        let a = T::view(t)
            .ok_or_else(|| OpError(format!("'{what}' has element type {}, expected {}", t.dtype(), T::DTYPE)))?;
        crate::op_ensure!(a.len() == 1, "'{what}' must have exactly one element, got shape {:?}", a.shape());
        Ok(a.iter().next().copied())
    }
    macro_rules! go {
        ($a:expr, $t:ty) => {
            clip_array(
                $a,
                bound::<$t>(min, "min")?.unwrap_or_else(<$t as Bounded>::min_value),
                bound::<$t>(max, "max")?.unwrap_or_else(<$t as Bounded>::max_value),
            )
        };
    }
    Ok(match x {
        Tensor::F32(a) => Tensor::F32(go!(a, f32)),
        Tensor::F64(a) => Tensor::F64(go!(a, f64)),
        Tensor::F16(a) => Tensor::F16(go!(a, half::f16)),
        Tensor::BF16(a) => Tensor::BF16(go!(a, half::bf16)),
        Tensor::I8(a) => Tensor::I8(go!(a, i8)),
        Tensor::I16(a) => Tensor::I16(go!(a, i16)),
        Tensor::I32(a) => Tensor::I32(go!(a, i32)),
        Tensor::I64(a) => Tensor::I64(go!(a, i64)),
        Tensor::U8(a) => Tensor::U8(go!(a, u8)),
        Tensor::U16(a) => Tensor::U16(go!(a, u16)),
        Tensor::U32(a) => Tensor::U32(go!(a, u32)),
        Tensor::U64(a) => Tensor::U64(go!(a, u64)),
        Tensor::Bool(_) => crate::op_bail!("element type bool is not supported"),
    })
}

/// `PRelu`: `x < 0 ? slope·x : x`, with `slope` broadcast to `x`'s shape.
pub fn prelu(x: &Tensor, slope: &Tensor) -> OpResult<Tensor> {
    crate::op_ensure!(
        x.dtype() == slope.dtype(),
        "slope has element type {}, X has {}; they must match",
        slope.dtype(),
        x.dtype()
    );
    let out = match zip_float(x, slope, |v, s| if v < 0.0 { v * s } else { v }, |v, s| if v < 0.0 { v * s } else { v })?
    {
        Some(t) => t,
        None => same_int_tensors!(x, slope, |a, s| zip_broadcast(a, s, |v, k| {
            if v < Default::default() {
                v.wrapping_mul(k)
            } else {
                v
            }
        })?)
        .ok_or_else(|| OpError(format!("element type {} is not supported", x.dtype())))?,
    };
    crate::op_ensure!(
        out.shape() == x.shape(),
        "slope of shape {:?} does not broadcast to X of shape {:?}",
        slope.shape(),
        x.shape()
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs()) || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn erf_matches_reference_values() {
        // math.erf values.
        let cases = [
            (0.0, 0.0),
            (1e-4, 1.1283791633342294e-4),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.4999, 0.9995928300996666),
            (2.5, 0.999593047982555),
            (3.0, 0.9999779095030014),
            (4.0, 0.9999999845827421),
            (-1.5, -0.9661051464753108),
            (7.0, 1.0),
        ];
        for (x, want) in cases {
            assert!(close(erf(x), want, 1e-13), "erf({x}) = {} want {want}", erf(x));
        }
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn activations_match_onnxruntime() {
        let xs = [-2.5f32, -0.5, 0.5, 2.5, -7.0];
        // Values from ONNX Runtime 1.32 (float32).
        let cases: [(Activation, [f32; 5]); 5] = [
            (Activation::Gelu { tanh_approx: false }, [-0.0155241, -0.15426877, 0.34573123, 2.484476, -0.0]),
            (Activation::Gelu { tanh_approx: true }, [-0.0150843, -0.154286, 0.345714, 2.4849157, -0.0]),
            (Activation::Celu { alpha: 2.0 }, [-1.4269904, -0.44239843, 0.5, 2.5, -1.9396052]),
            (Activation::HardSwish, [-0.20833328, -0.20833333, 0.29166666, 2.2916667, -0.0]),
            (Activation::Clip { min: -1.0, max: 1.0 }, [-1.0, -0.5, 0.5, 1.0, -1.0]),
        ];
        for (act, want) in cases {
            for (x, w) in xs.iter().zip(want) {
                let got = act.apply(*x);
                assert!((got - w).abs() <= 1e-6 * (1.0 + w.abs()), "{act:?}({x}) = {got} want {w}");
            }
        }
        assert!(Activation::Relu.apply(f32::NAN).is_nan());
        assert!(Activation::Clip { min: -1.0, max: 1.0 }.apply(f32::NAN).is_nan());
        assert_eq!(Activation::Clip { min: 1.0, max: -1.0 }.apply(0.0), -1.0);
        let sp = Activation::Softplus;
        assert_eq!(sp.apply(100.0), 100.0);
        assert!((sp.apply(-1.0) - 0.313_261_7).abs() < 1e-7);
        assert!((Activation::Sigmoid.apply(-100.0)).abs() < 1e-40);
        assert_eq!(Activation::Sigmoid.apply(100.0), 1.0);
        let selu = Activation::Selu { alpha: 1.6732632, gamma: 1.050701 };
        assert!((selu.apply(-1.0) - (-1.1113307)).abs() < 1e-6);
        assert_eq!(Activation::ThresholdedRelu { alpha: 1.0 }.apply(1.0), 0.0);
        assert_eq!(Activation::Softsign.apply(3.0), 0.75);
        assert!((Activation::Mish.apply(1.0) - 0.86509836).abs() < 1e-6);
        let shrink = Activation::Shrink { lambd: 1.5, bias: 0.5 };
        assert_eq!([shrink.apply(-2.0), shrink.apply(1.0), shrink.apply(2.0)], [-1.5, 0.0, 1.5]);
        assert_eq!(Activation::Elu { alpha: 1.0 }.name(), "Elu");
    }

    #[test]
    fn tensors_of_each_kind() {
        let i = Tensor::I32(ndarray::arr1(&[-3, 4]).into_dyn());
        assert_eq!(Activation::Relu.apply_tensor(&i).unwrap().to_i64_vec(), vec![0, 4]);
        assert!(Activation::Sigmoid.apply_tensor(&i).is_err());
        let h = Tensor::from_f32s(&[2], vec![-1.0, 2.0]).cast(crate::ir::DType::BF16);
        let r = Activation::Relu.apply_tensor(&h).unwrap();
        assert_eq!(r.dtype(), crate::ir::DType::BF16);
        assert_eq!(r.to_f64_vec(), vec![0.0, 2.0]);
        let x = Tensor::I32(ndarray::arr1(&[-3, 4, 9]).into_dyn());
        let lo = Tensor::I32(ndarray::arr0(0).into_dyn());
        assert_eq!(clip(&x, Some(&lo), None).unwrap().to_i64_vec(), vec![0, 4, 9]);
        let inf = Tensor::from_f32s(&[2], vec![f32::INFINITY, f32::NEG_INFINITY]);
        assert_eq!(clip(&inf, None, None).unwrap().to_f64_vec(), vec![f32::MAX as f64, f32::MIN as f64]);
        assert!(clip(&x, Some(&Tensor::from_f32s(&[], vec![0.0])), None).is_err());
        let p = prelu(&i, &Tensor::I32(ndarray::arr1(&[2]).into_dyn())).unwrap();
        assert_eq!(p.to_i64_vec(), vec![-6, 4]);
        let x = Tensor::from_f32s(&[2, 2], vec![-1.0, -1.0, 1.0, -2.0]);
        let p = prelu(&x, &Tensor::from_f32s(&[2], vec![0.1, 0.2])).unwrap();
        assert_eq!(p.to_f64_vec().iter().map(|v| *v as f32).collect::<Vec<_>>(), vec![-0.1, -0.2, 1.0, -0.4]);
        assert!(prelu(&Tensor::from_f32s(&[2], vec![1.0, 2.0]), &Tensor::from_f32s(&[2, 2], vec![0.0; 4])).is_err());
    }
}
