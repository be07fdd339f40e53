//! The seam between target-neutral lowering and one GPU target.
//!
//! Most kernel families are our own templates, and a target provides one template per family
//! under `templates/<target>/`. Convolutions and matrix products are different: each target picks
//! library instances (CUTLASS on CUDA, Composable Kernel on ROCm) with their own tile
//! configurations and alignment rules, so the family lowering describes the problem and asks the
//! target for an instance.

use super::problem::{ConvProblem, GemmProblem};
use serde_json::{Map, Value as Json};

/// A concrete kernel choice: the template that renders it and the target-specific fields.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Template stem under `templates/<target>/`.
    pub template: String,
    /// Fields added to the problem's own template fields (tile shapes, stages, epilogue types).
    pub context: Map<String, Json>,
    /// Scratch bytes the launcher needs at the largest batch.
    pub workspace_bytes: u64,
}

pub trait Target: Sync {
    /// `cuda`, `hip`.
    fn name(&self) -> &'static str;
    /// The instance that computes a convolution, or a generic kernel when no library instance
    /// supports the problem (never an instance that would fail at run time).
    fn conv2d(&self, p: &ConvProblem) -> Instance;
    fn gemm(&self, p: &GemmProblem) -> Instance;
    /// Input channels a library conv wants at least, and the multiple it wants them in (8 for
    /// 16-byte fp16 accesses): the lowering pads a thin stem (C = 3) up to this.
    fn conv_channel_multiple(&self) -> usize;
}
