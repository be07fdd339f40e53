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

    /// Device code exactly as generated sources get it: the lines of the rendered `pointwise`
    /// partial from `// begin {name}` to `// end {name}`.
    fn pointwise_block(name: &str) -> String {
        let text = crate::codegen::Templates::for_target("cuda")
            .expect("cuda templates")
            .render("pointwise", &serde_json::json!({}))
            .expect("pointwise renders");
        let begin = text.find(&format!("// begin {name}")).unwrap_or_else(|| panic!("no `// begin {name}` line"));
        let end = text.find(&format!("// end {name}")).unwrap_or_else(|| panic!("no `// end {name}` line"));
        text[begin..end].to_string()
    }

    /// The GELU (erf form) device code.
    fn gelu_erf_block() -> String {
        pointwise_block("o2a_gelu_erf")
    }

    /// What every host harness starts with ([`run_host_harness`]): the headers, the device
    /// qualifiers as plain C++, the block under test (`{{BLOCK}}`), and the helpers: bit
    /// patterns, `step` (k floats up or down), `ftz` (subnormals to 0, as `.ftz` instructions), a
    /// running maximum with its argument, `fail` (a FAIL line, the first 20) and `bound` (a
    /// maximum against its limit).
    const HOST_HARNESS_PRELUDE: &str = r#"
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#define __device__
#define __forceinline__ inline
{{BLOCK}}
static float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
static uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
static float step(float v, int k) {
  for (int i = 0; i < std::abs(k); ++i) v = std::nextafterf(v, k < 0 ? 0.0f : INFINITY);
  return v;
}
static float ftz(float v) { return std::fabs(v) < FLT_MIN ? 0.0f : v; }
struct Max {
  double v = 0; float at = 0;
  void add(double e, float x) { if (!(e <= v)) { v = e; at = x; } }
};
static long failures = 0, count = 0;
static void fail(const char* what, float x, double got) {
  if (++failures <= 20) printf("FAIL %s at x = %.9g (%a): %.9g\n", what, x, x, got);
}
static void bound(const char* name, const Max& m, double limit) {
  printf("%-34s %.3e at x = %.9g (bound %.1e)\n", name, m.v, m.at, limit);
  if (!(m.v <= limit)) { ++failures; printf("FAIL %s\n", name); }
}
"#;

    /// Host check of `o2a_gelu_erf` (after [`HOST_HARNESS_PRELUDE`] with [`gelu_erf_block`]).
    /// The device functions compile as plain C++ (fmaf, fminf, copysignf are exact IEEE
    /// operations on both sides, and nothing in the block is contractible), so every operation is
    /// the GPU's except `ex2.approx.ftz.f32`: per the PTX ISA (ex2) its result is at most 2 ulp
    /// from the correctly rounded 2^a, with subnormal results flushed to 0. The check therefore
    /// takes the exponent L = o2a_gelu_erf_log2(|x|) as computed, rounds 2^L (f64) to fp32,
    /// and evaluates the rest for the floats 2 steps below and above (0 where that is subnormal);
    /// the output is monotonic in e, so the two ends bound whatever the hardware returns.
    ///
    /// Inputs: every `stride`-th fp32 bit pattern of both signs over the whole finite range
    /// (stride 64: every 64th float of [-10, 10], 67 M inputs), all floats within 4096 ulp of
    /// ±1.15 (where the ranges below meet), ±6 (the fit's end) and ±8, and the special values.
    /// Reference: erfc in f64.
    /// Checks (exit 1 and a FAIL line when one fails):
    /// - erf part ≤ 3.5e-7: 2·|x·Φ̂ − x·Φ(x)|/|x|, where x·Φ̂ is the final fma's exact value
    ///   (before the output rounding), for normal x; erff's own error is about 1-2 ulp (≤ 1.2e-7),
    ///   and ex2.approx's 2 ulp near Φ = 1/2 are 2.4e-7 of this one's 2.8e-7;
    /// - relative GELU error (output rounding included) by range, regression bounds 1.2–2× what
    ///   this version measures (3.2e-7, 5.4e-7, 2.3e-4, 2.3e-2, 1.4e-10): x > 0: 4e-7;
    ///   (-1.15, 0): 1e-6; (-4, -1.15]: 5e-4; (-6, -4]: 0.05 (the erff form: 1, 1 + erff(x/√2)
    ///   rounds to 0); x ≤ -6: |GELU| ≤ 1e-8;
    /// - x ≥ 8 gives x; subnormal x gives fp32(x/2), as the erff form; NaN → NaN, +inf → +inf,
    ///   -inf → NaN (the erff form's -inf·0), ±0 → 0;
    /// - o2a_gelu_erf is its pieces, bit for bit (with the host's exp2f as ex2).
    const GELU_ERF_HARNESS: &str = r#"
static Max erf_part, rel_pos, rel_neg_small, rel_neg_tail, rel_neg_far, abs_beyond6, old_erf_part, old_form[4];
static void check(float x) {
  ++count;
  const float got = o2a_gelu_erf(x);
  if (std::isnan(x)) { if (!std::isnan(got)) fail("NaN input", x, got); return; }
  if (std::isinf(x)) {
    if (x > 0 ? got != x : !std::isnan(got)) fail("infinite input", x, got);
    return;
  }
  const double xd = x, phi = 0.5 * std::erfc(-xd * 0.70710678118654752440), exact = xd * phi;
  double pre[2];
  float out[2];
  {
    const float rn = (float)std::exp2((double)o2a_gelu_erf_log2(std::fabs(x)));
    float e[2] = {step(rn, -2), step(rn, 2)};
    for (int i = 0; i < 2; ++i) {
      e[i] = ftz(e[i]);
      out[i] = o2a_gelu_erf_tail(x, e[i]);
      pre[i] = (double)std::fmin(x, 8.0f) * -(double)std::copysign(e[i], x) + (double)std::fmax(x, 0.0f);
    }
  }
  // The composed function is the pieces (with the host's exp2f as its ex2).
  const float pieces = o2a_gelu_erf_tail(x, exp2f(o2a_gelu_erf_log2(std::fabs(x))));
  if (bits(got) != bits(pieces)) fail("o2a_gelu_erf differs from its pieces", x, got);
  if (x == 0.0f) { if (got != 0.0f) fail("zero input", x, got); return; }
  if (std::fabs(x) < FLT_MIN) {
    if (got != 0.5f * x) fail("subnormal input", x, got);
    return;
  }
  const double erf_err = 2.0 * std::fmax(std::fabs(pre[0] / xd - phi), std::fabs(pre[1] / xd - phi));
  erf_part.add(erf_err, x);
  if (!(erf_err <= 3.5e-7)) fail("erf part above 3.5e-7", x, erf_err);
  const double abs_err = std::fmax(std::fabs(out[0] - exact), std::fabs(out[1] - exact));
  const double rel = abs_err / std::fabs(exact);
  if (x >= 8.0f && got != x) fail("x >= 8 not returned", x, got);
  if (x > 0) rel_pos.add(rel, x);
  else if (x > -1.15f) rel_neg_small.add(rel, x);
  else if (x > -4.0f) rel_neg_tail.add(rel, x);
  else if (x > -6.0f) rel_neg_far.add(rel, x);
  else abs_beyond6.add(abs_err, x);
  // The erff form with the host's erff standing in for CUDA's (information only).
  const float z = x * 0.70710678118654752f;
  old_erf_part.add(std::fabs((double)erff(z) - std::erf((double)z)), x);
  const double old_rel = std::fabs(0.5f * x * (1.0f + erff(z)) - exact) / std::fabs(exact);
  if (x > -6.0f) old_form[x > 0 ? 0 : x > -1.15f ? 1 : x > -4.0f ? 2 : 3].add(old_rel, x);
}
int main(int argc, char** argv) {
  const uint32_t stride = argc > 1 ? (uint32_t)std::atoi(argv[1]) : 64;
  for (uint64_t u = 0; u < bits(INFINITY); u += stride) {
    check(from_bits((uint32_t)u));
    check(-from_bits((uint32_t)u));
  }
  for (float c : {1.15f, 6.0f, 8.0f})
    for (uint32_t u = bits(c) - 4096; u <= bits(c) + 4096; ++u) {
      check(from_bits(u));
      check(-from_bits(u));
    }
  for (float x : {0.0f, -0.0f, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, -FLT_TRUE_MIN, INFINITY, -INFINITY,
                  NAN, -NAN, from_bits(0x7fc12345u), from_bits(0xffa00001u)})
    check(x);
  printf("%ld inputs (stride %u)\n", count, stride);
  bound("erf part, absolute", erf_part, 3.5e-7);
  bound("GELU relative, x > 0", rel_pos, 4e-7);
  bound("GELU relative, -1.15 < x < 0", rel_neg_small, 1e-6);
  bound("GELU relative, -4 < x <= -1.15", rel_neg_tail, 5e-4);
  bound("GELU relative, -6 < x <= -4", rel_neg_far, 0.05);
  bound("GELU absolute, x <= -6", abs_beyond6, 1e-8);
  printf("the erff form with the host's erff (information): erf part %.3e; GELU relative %.3e, %.3e, %.3e, %.3e\n",
         old_erf_part.v, old_form[0].v, old_form[1].v, old_form[2].v, old_form[3].v);
  printf(failures ? "FAIL\n" : "PASS\n");
  return failures ? 1 : 0;
}
"#;

    /// Compiles the harness around `block` with the host's g++ and runs it over every
    /// `stride`-th float: (passed, output).
    fn run_gelu_erf_harness(block: &str, stride: u32, tag: &str) -> (bool, String) {
        run_host_harness(GELU_ERF_HARNESS, block, stride, &format!("gelu-erf-{tag}"))
    }

    /// The sigmoid and SiLU device code, after the GELU block (which defines `o2a_ex2_approx`).
    fn sigmoid_block() -> String {
        format!("{}\n{}", gelu_erf_block(), pointwise_block("o2a_sigmoid"))
    }

    /// Host check of `o2a_sigmoid` and `o2a_silu` (after [`HOST_HARNESS_PRELUDE`] with
    /// [`sigmoid_block`]). As for GELU, every operation is the GPU's except the two
    /// approximations, taken at their documented worst (PTX ISA): `ex2.approx.ftz.f32` within 2
    /// ulp of the rounded 2^a, `rcp.approx.ftz.f32` within 1 ulp of the rounded 1/a, subnormal
    /// results flushed to 0. The exponent a = x·(-log2 e) is the block's (`o2a_sigmoid_exponent`);
    /// 2^a is rounded (f64 → f32) and taken 2 steps below and above, each through 1 + e and
    /// 1/(1 + e) rounded and taken 1 step below and above: the result is monotonic in both, so
    /// the ends bound what the hardware returns.
    ///
    /// Inputs: every `stride`-th fp32 pattern of both signs (stride 64: every 64th float), and
    /// the special values. Reference: 1/(1 + exp(-x)) in f64. Checks (exit 1 and FAIL lines),
    /// bounds about 1.2–2.4× what this version measures (1.23e-6, 4.1e-6):
    /// - sigmoid relative error ≤ 1.5e-6 for x ≥ -16 (sigmoid ≥ 1.1e-7), ≤ 1e-5 on (-87, -16);
    ///   from -87 down (sigmoid < 1.7e-38) the absolute error ≤ FLT_MIN (ftz);
    /// - SiLU the same relative bounds (nonzero x up to 1e38), absolute ≤ 1e-35 from -87 down;
    /// - NaN → NaN, +inf → 1, -inf → 0, x ≥ 88 → 1 exactly (SiLU: x); SiLU(+inf) = +inf,
    ///   SiLU(-inf) NaN (-inf·0, as x·sigmoid(x) always gave);
    /// - o2a_sigmoid is its pieces with the host's exp2f and division, bit for bit.
    const SIGMOID_HARNESS: &str = r#"
static Max sig_rel, sig_rel_far, sig_abs_beyond, silu_rel, silu_rel_far, silu_abs_beyond;
static void check(float x) {
  ++count;
  const float got = o2a_sigmoid(x), got_silu = o2a_silu(x);
  const float pieces = 1.0f / (1.0f + exp2f(o2a_sigmoid_exponent(x)));
  if (!(bits(got) == bits(pieces) || (std::isnan(got) && std::isnan(pieces))))
    fail("o2a_sigmoid differs from its pieces", x, got);
  if (std::isnan(x)) {
    if (!std::isnan(got) || !std::isnan(got_silu)) fail("NaN input", x, got);
    return;
  }
  if (std::isinf(x)) {
    if (got != (x > 0 ? 1.0f : 0.0f)) fail("infinite input", x, got);
    if (x > 0 ? got_silu != x : !std::isnan(got_silu)) fail("SiLU, infinite input", x, got_silu);
    return;
  }
  // The GPU's result lies in [lo, hi]: ex2 at ±2 ulp, rcp at ±1 ulp, both flushing subnormals.
  const float a = o2a_sigmoid_exponent(x);
  const float rn = (float)std::exp2((double)a);
  float lo = INFINITY, hi = -INFINITY;
  for (int ke : {-2, 2}) {
    const float d = 1.0f + ftz(step(rn, ke));
    const float r = (float)(1.0 / (double)d);
    for (int kr : {-1, 1}) {
      const float v = ftz(step(r, kr));
      lo = std::fmin(lo, v);
      hi = std::fmax(hi, v);
    }
  }
  const double exact = 1.0 / (1.0 + std::exp(-(double)x));
  const double err = std::fmax(std::fabs(lo - exact), std::fabs(hi - exact));
  if (x >= 88.0f && got != 1.0f) fail("x >= 88 not 1", x, got);
  if (x >= -16.0f) sig_rel.add(err / exact, x);
  else if (x > -87.0f) sig_rel_far.add(err / exact, x);
  else sig_abs_beyond.add(err, x);
  if (x >= 88.0f && got_silu != x) fail("SiLU, x >= 88 not x", x, got_silu);
  // Beyond 1e38 x·(1 + 1 ulp) overflows in the bound model: there sigmoid is exactly 1 (above).
  if (x == 0.0f || x > 1e38f) return;
  const double silu = (double)x * exact;
  double silu_err = 0;
  for (float s : {lo, hi}) silu_err = std::fmax(silu_err, std::fabs((double)(x * s) - silu));
  if (x >= -16.0f) silu_rel.add(silu_err / std::fabs(silu), x);
  else if (x > -87.0f) silu_rel_far.add(silu_err / std::fabs(silu), x);
  else silu_abs_beyond.add(silu_err, x);
}
int main(int argc, char** argv) {
  const uint32_t stride = argc > 1 ? (uint32_t)std::atoi(argv[1]) : 64;
  for (uint64_t u = 0; u < bits(INFINITY); u += stride) {
    check(from_bits((uint32_t)u));
    check(-from_bits((uint32_t)u));
  }
  for (float x : {0.0f, -0.0f, FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX, 88.0f, -87.0f, -88.7f, -89.0f, INFINITY,
                  -INFINITY, NAN, -NAN})
    check(x);
  printf("%ld inputs (stride %u)\n", count, stride);
  bound("sigmoid relative, x >= -16", sig_rel, 1.5e-6);
  bound("sigmoid relative, -87 < x < -16", sig_rel_far, 1e-5);
  bound("sigmoid absolute, x <= -87", sig_abs_beyond, FLT_MIN);
  bound("SiLU relative, x >= -16", silu_rel, 1.5e-6);
  bound("SiLU relative, -87 < x < -16", silu_rel_far, 1e-5);
  bound("SiLU absolute, x <= -87", silu_abs_beyond, 1e-35);
  printf(failures ? "FAIL\n" : "PASS\n");
  return failures ? 1 : 0;
}
"#;

    /// Compiles [`HOST_HARNESS_PRELUDE`] around `block`, then `harness`, with the host's g++ and
    /// runs it with `arg`: (passed, output).
    fn run_host_harness(harness: &str, block: &str, arg: u32, tag: &str) -> (bool, String) {
        let dir = std::env::temp_dir().join(format!("o2a-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("check.cpp");
        std::fs::write(&src, HOST_HARNESS_PRELUDE.replace("{{BLOCK}}", block) + harness).unwrap();
        let exe = dir.join("check");
        // No contraction: the host must round every operation the way the block spells it.
        let build = std::process::Command::new("g++")
            .args(["-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-o"])
            .arg(&exe)
            .arg(&src)
            .output()
            .expect("g++ runs (the accuracy checks compile the device code for the host)");
        assert!(build.status.success(), "g++ failed:\n{}", String::from_utf8_lossy(&build.stderr));
        let run = std::process::Command::new(&exe).arg(arg.to_string()).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (run.status.success(), String::from_utf8_lossy(&run.stdout).into_owned())
    }

    #[test]
    fn sigmoid_accuracy() {
        let block = sigmoid_block();
        let (passed, out) = run_host_harness(SIGMOID_HARNESS, &block, 64, "sigmoid");
        eprintln!("{out}");
        assert!(passed, "o2a_sigmoid misses its accuracy bounds:\n{out}");
        assert!(out.contains("sigmoid relative, x >= -16"), "{out}");
        // The check can fail: log2 e off by 3e-6 (relative) fails it.
        let perturbed = block.replace("return x * -1.4426950408889634f;", "return x * -1.4427f;");
        assert_ne!(perturbed, block);
        let (passed, out) = run_host_harness(SIGMOID_HARNESS, &perturbed, 256, "sigmoid-perturbed");
        assert!(!passed, "a perturbed log2 e still passes:\n{out}");
    }

    /// `block` with the last coefficient (the constant term) of the polynomial function `func`
    /// scaled by 1 + 4e-6.
    fn perturb_constant_term(block: &str, func: &str) -> String {
        let start = block.find(&format!("float {func}(")).expect("the function is in the block");
        let body_end = start + block[start..].find("\n}").expect("the function ends");
        let ret = start + block[start..body_end].rfind(", ").expect("a final fmaf") + 2;
        let lit_end = ret + block[ret..].find("f)").expect("a float literal");
        let value: f32 = block[ret..lit_end].parse().expect("the constant term is a decimal literal");
        format!("{}{:?}{}", &block[..ret], value * (1.0 + 4e-6), &block[lit_end..])
    }

    #[test]
    fn gelu_erf_accuracy() {
        let block = gelu_erf_block();
        let (passed, out) = run_gelu_erf_harness(&block, 64, "as-is");
        eprintln!("{out}");
        assert!(passed, "o2a_gelu_erf misses its accuracy bounds:\n{out}");
        assert!(out.contains("erf part, absolute"), "{out}");
        // The check can fail: either polynomial's constant term off in the 6th digit fails it.
        for func in ["o2a_gelu_erf_log2"] {
            let perturbed = perturb_constant_term(&block, func);
            assert_ne!(perturbed, block);
            let (passed, out) = run_gelu_erf_harness(&perturbed, 4096, func);
            assert!(!passed, "{func} with a perturbed constant term still passes:\n{out}");
        }
    }
}
