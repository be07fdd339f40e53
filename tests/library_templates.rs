//! Every library instance template (templates/cuda/library/) renders and compiles with the pinned
//! nvcc + CUTLASS for a representative set of variants (epilogues, layouts, tiles). Compile-only:
//! CI has no GPU; the H200 check (scripts/gpu-check.sh) runs them through the profiler and the
//! model validations.
//!
//! Without nvcc the tests are skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

#[path = "library_templates/common.rs"]
mod common;
#[path = "library_templates/conv_gemm_sm90.rs"]
mod conv_gemm_sm90;
#[path = "library_templates/conv_group_sm80.rs"]
mod conv_group_sm80;
#[path = "library_templates/conv_sm80.rs"]
mod conv_sm80;
#[path = "library_templates/conv_sm90.rs"]
mod conv_sm90;
#[path = "library_templates/conv_splitk_sm80.rs"]
mod conv_splitk_sm80;
#[path = "library_templates/gemm_skinny.rs"]
mod gemm_skinny;
#[path = "library_templates/gemm_sm80.rs"]
mod gemm_sm80;
#[path = "library_templates/gemm_sm90.rs"]
mod gemm_sm90;
