//! Reference kernels of the optimiser's kernel-level ops (`crate::ir::ops::kernel`).

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod gemm;
pub mod misc;
pub mod squeeze_excite;
