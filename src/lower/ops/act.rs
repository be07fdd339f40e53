//! Pointwise functions as device code: the C++ expression applying an [`Act`] to a float
//! expression. Every kernel template that applies an activation (conv/gemm epilogues, fused
//! elementwise chains, norms) gets its expression from [`act_call`]; the functions it names are
//! `__device__ __forceinline__ float` definitions in `templates/<target>/partials/pointwise.hbs`,
//! which `common.cuh` includes. The device functions follow `Act::apply` (the CPU reference)
//! exactly in their edge cases: `relu`/`clip` map NaN like `f32::max`/`f32::min` (the non-NaN
//! operand wins), `hardswish`/`hardsigmoid` keep NaN like `f32::clamp`.

use crate::ir::ops::kernel::Act;

/// A C++ `float` literal that reproduces `v` exactly: Rust's shortest round-trip spelling plus
/// `f`; infinities and NaN become bit-pattern intrinsics (device code only). Negative values are
/// parenthesised so the literal can follow any operator (`x - (-0.5f)`).
pub fn float_lit(v: f32) -> String {
    if v.is_nan() {
        return "__int_as_float(0x7fffffff)".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "__int_as_float(0x7f800000)".to_string()
        } else {
            "__int_as_float(0xff800000)".to_string()
        };
    }
    // `{:?}` always has a '.' or an exponent ("6.0", "1e-5"), both valid before the suffix.
    let s = format!("{v:?}f");
    if v.is_sign_negative() {
        format!("({s})")
    } else {
        s
    }
}

/// The C++ float expression applying `act` to the float expression `x` (`o2a_relu(v)`,
/// `o2a_clip(v, 0.0f, 6.0f)`). `x` is evaluated once (it is a function argument).
pub fn act_call(act: Act, x: &str) -> String {
    match act {
        Act::Relu => format!("o2a_relu({x})"),
        Act::Clip { lo, hi } => format!("o2a_clip({x}, {}, {})", float_lit(lo), float_lit(hi)),
        Act::Sigmoid => format!("o2a_sigmoid({x})"),
        Act::Silu => format!("o2a_silu({x})"),
        Act::GeluErf => format!("o2a_gelu_erf({x})"),
        Act::GeluTanh => format!("o2a_gelu_tanh({x})"),
        Act::HardSwish => format!("o2a_hardswish({x})"),
        Act::HardSigmoid { alpha, beta } => {
            format!("o2a_hardsigmoid({x}, {}, {})", float_lit(alpha), float_lit(beta))
        }
        Act::Tanh => format!("o2a_tanh({x})"),
        Act::LeakyRelu { alpha } => format!("o2a_leaky_relu({x}, {})", float_lit(alpha)),
        Act::Elu { alpha } => format!("o2a_elu({x}, {})", float_lit(alpha)),
        Act::Erf => format!("o2a_erf({x})"),
        Act::Sqrt => format!("o2a_sqrt({x})"),
        Act::Exp => format!("o2a_exp({x})"),
        Act::Log => format!("o2a_log({x})"),
        Act::Neg => format!("o2a_neg({x})"),
        Act::Abs => format!("o2a_abs({x})"),
        Act::Reciprocal => format!("o2a_reciprocal({x})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_round_trip() {
        assert_eq!(float_lit(6.0), "6.0f");
        assert_eq!(float_lit(0.01), "0.01f");
        assert_eq!(float_lit(-0.5), "(-0.5f)");
        assert_eq!(float_lit(1e-5), "1e-5f");
        assert_eq!(float_lit(f32::INFINITY), "__int_as_float(0x7f800000)");
        assert_eq!(float_lit(f32::NEG_INFINITY), "__int_as_float(0xff800000)");
        for v in [0.1f32, 1.0 / 3.0, f32::MAX, f32::MIN_POSITIVE, 1e-45, 0.2, 0.044715] {
            let s = float_lit(v);
            let parsed: f32 = s.trim_end_matches('f').parse().unwrap();
            assert_eq!(parsed.to_bits(), v.to_bits(), "{s}");
        }
    }

    #[test]
    fn calls() {
        assert_eq!(act_call(Act::Relu, "v"), "o2a_relu(v)");
        assert_eq!(act_call(Act::Clip { lo: 0.0, hi: 6.0 }, "v"), "o2a_clip(v, 0.0f, 6.0f)");
        assert_eq!(act_call(Act::LeakyRelu { alpha: 0.01 }, "a + b"), "o2a_leaky_relu(a + b, 0.01f)");
    }
}
