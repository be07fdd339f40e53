//! Pointwise functions that kernel epilogues and elementwise chains apply.

use crate::ir::{OpError, OpResult};
use std::fmt;

/// A unary pointwise function. The activations (`is_activation`) can run in a conv/gemm
/// epilogue; the others (`erf`, `sqrt`, …) only inside elementwise chains.
///
/// Each has a one-token spelling used as an e-graph leaf and in reports: `relu`, `clip:0:6`,
/// `leaky:0.01`, `gelu`, … Parameters are printed with Rust's shortest round-trip float format,
/// so `parse(to_string(a)) == a` exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Relu,
    Clip {
        lo: f32,
        hi: f32,
    },
    Sigmoid,
    /// x·sigmoid(x).
    Silu,
    /// 0.5·x·(1 + erf(x/√2)).
    GeluErf,
    /// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
    GeluTanh,
    /// x·clamp(x/6 + 0.5, 0, 1).
    HardSwish,
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    Tanh,
    LeakyRelu {
        alpha: f32,
    },
    Elu {
        alpha: f32,
    },
    Erf,
    Sqrt,
    Exp,
    Log,
    Neg,
    Abs,
    Reciprocal,
}

impl Act {
    /// Whether this is an activation function a conv/gemm epilogue applies.
    pub fn is_activation(self) -> bool {
        !matches!(self, Act::Erf | Act::Sqrt | Act::Exp | Act::Log | Act::Neg | Act::Abs | Act::Reciprocal)
    }

    /// Parses the leaf spelling (`relu`, `clip:0:6`, `leaky:0.01`, …).
    pub fn parse(token: &str) -> OpResult<Act> {
        let mut parts = token.split(':');
        let head = parts.next().unwrap_or("");
        let params: Vec<&str> = parts.collect();
        let num = |i: usize| -> OpResult<f32> {
            params
                .get(i)
                .and_then(|p| p.parse::<f32>().ok())
                .ok_or_else(|| OpError(format!("activation '{token}': parameter {i} is missing or not a number")))
        };
        let arity = |n: usize| -> OpResult<()> {
            if params.len() == n {
                Ok(())
            } else {
                Err(OpError(format!("activation '{token}' takes {n} parameter(s), found {}", params.len())))
            }
        };
        let a = match head {
            "relu" => Act::Relu,
            "clip" => {
                arity(2)?;
                Act::Clip { lo: num(0)?, hi: num(1)? }
            }
            "sigmoid" => Act::Sigmoid,
            "silu" => Act::Silu,
            "gelu" => Act::GeluErf,
            "gelu_tanh" => Act::GeluTanh,
            "hardswish" => Act::HardSwish,
            "hardsigmoid" => {
                arity(2)?;
                Act::HardSigmoid { alpha: num(0)?, beta: num(1)? }
            }
            "tanh" => Act::Tanh,
            "leaky" => {
                arity(1)?;
                Act::LeakyRelu { alpha: num(0)? }
            }
            "elu" => {
                arity(1)?;
                Act::Elu { alpha: num(0)? }
            }
            "erf" => Act::Erf,
            "sqrt" => Act::Sqrt,
            "exp" => Act::Exp,
            "log" => Act::Log,
            "neg" => Act::Neg,
            "abs" => Act::Abs,
            "reciprocal" => Act::Reciprocal,
            _ => return Err(OpError(format!("unknown pointwise function '{token}'"))),
        };
        if !matches!(a, Act::Clip { .. } | Act::HardSigmoid { .. } | Act::LeakyRelu { .. } | Act::Elu { .. }) {
            arity(0)?;
        }
        Ok(a)
    }

    /// Applies the function to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Act::Relu => x.max(0.0),
            Act::Clip { lo, hi } => x.max(lo).min(hi),
            Act::Sigmoid => sigmoid(x),
            Act::Silu => x * sigmoid(x),
            Act::GeluErf => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
            Act::GeluTanh => {
                let c = (2.0f32 / std::f32::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            Act::HardSwish => x * x.mul_add(1.0 / 6.0, 0.5).clamp(0.0, 1.0),
            Act::HardSigmoid { alpha, beta } => (alpha * x + beta).clamp(0.0, 1.0),
            Act::Tanh => x.tanh(),
            Act::LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha * x
                } else {
                    x
                }
            }
            Act::Elu { alpha } => {
                if x < 0.0 {
                    alpha * (x.exp() - 1.0)
                } else {
                    x
                }
            }
            Act::Erf => erf(x),
            Act::Sqrt => x.sqrt(),
            Act::Exp => x.exp(),
            Act::Log => x.ln(),
            Act::Neg => -x,
            Act::Abs => x.abs(),
            Act::Reciprocal => 1.0 / x,
        }
    }

    /// Floating-point operations per element, for the cost model.
    pub fn flops(self) -> f64 {
        match self {
            Act::Relu | Act::Neg | Act::Abs | Act::Clip { .. } | Act::LeakyRelu { .. } => 1.0,
            Act::HardSwish | Act::HardSigmoid { .. } | Act::Reciprocal => 3.0,
            _ => 10.0,
        }
    }
}

impl fmt::Display for Act {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Act::Relu => f.write_str("relu"),
            Act::Clip { lo, hi } => write!(f, "clip:{lo}:{hi}"),
            Act::Sigmoid => f.write_str("sigmoid"),
            Act::Silu => f.write_str("silu"),
            Act::GeluErf => f.write_str("gelu"),
            Act::GeluTanh => f.write_str("gelu_tanh"),
            Act::HardSwish => f.write_str("hardswish"),
            Act::HardSigmoid { alpha, beta } => write!(f, "hardsigmoid:{alpha}:{beta}"),
            Act::Tanh => f.write_str("tanh"),
            Act::LeakyRelu { alpha } => write!(f, "leaky:{alpha}"),
            Act::Elu { alpha } => write!(f, "elu:{alpha}"),
            Act::Erf => f.write_str("erf"),
            Act::Sqrt => f.write_str("sqrt"),
            Act::Exp => f.write_str("exp"),
            Act::Log => f.write_str("log"),
            Act::Neg => f.write_str("neg"),
            Act::Abs => f.write_str("abs"),
            Act::Reciprocal => f.write_str("reciprocal"),
        }
    }
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// erf(x) in f64 (Numerical Recipes' Chebyshev fit of erfc, relative error < 1.2e-7), which is
/// within f32 rounding of the exact value.
pub fn erf(x: f32) -> f32 {
    let z = (x as f64).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223
        + t * (1.00002368
            + t * (0.37409196
                + t * (0.09678418
                    + t * (-0.18628806
                        + t * (0.27886807
                            + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let erfc = t * poly.exp();
    let r = 1.0 - erfc;
    (if x >= 0.0 { r } else { -r }) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip() {
        for a in [
            Act::Relu,
            Act::Clip { lo: 0.0, hi: 6.0 },
            Act::LeakyRelu { alpha: 0.01 },
            Act::GeluErf,
            Act::HardSigmoid { alpha: 0.2, beta: 0.5 },
        ] {
            assert_eq!(Act::parse(&a.to_string()).unwrap(), a);
        }
        assert!(Act::parse("clip:0").is_err());
        assert!(Act::parse("relu:1").is_err());
        assert!(Act::parse("swish").is_err());
    }

    #[test]
    fn values_match_numpy() {
        // scipy.special.erf(0.5) = 0.5204998778130465
        assert!((erf(0.5) - 0.520_499_9).abs() < 1e-6);
        assert!((erf(-2.0) + 0.995_322_3).abs() < 1e-6);
        // torch.nn.functional.gelu(torch.tensor(1.0)) = 0.8413447
        assert!((Act::GeluErf.apply(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((Act::GeluTanh.apply(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(Act::HardSwish.apply(1.0), 1.0f32.mul_add(1.0 / 6.0, 0.5));
        assert_eq!(Act::Clip { lo: 0.0, hi: 6.0 }.apply(7.5), 6.0);
    }
}
