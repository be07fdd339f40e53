//! The seam between target-neutral lowering and one GPU target.
//!
//! Most kernel families are our own templates, and a target provides one template per family
//! under `templates/<target>/`. Convolutions and matrix products are different: each target picks
//! library instances (CUTLASS on CUDA, Composable Kernel on ROCm) with their own tile
//! configurations and alignment rules, so the family lowering describes the problem and asks the
//! target for an instance.
//!
//! A library instance is one compiled kernel configuration with the problem size as run-time
//! arguments (`templates/<target>/library/`), shared by every node that uses it. The node's own
//! kernel (`conv2d_library`, `gemm_library`) fills the arguments and calls the instance chosen
//! for the run-time batch: [`Instance::dispatch`] lists one instance per batch range.

use super::problem::{ConvProblem, GemmProblem};
use serde::Serialize;
use serde_json::{Map, Value as Json};

/// A library kernel configuration, rendered once per program whatever the number of nodes using it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LibraryInstance {
    /// The function name and file stem, derived from the template and the full context, so equal
    /// names mean equal sources.
    pub name: String,
    /// Template under `templates/<target>/library/` (`conv2d_sm90`).
    pub template: String,
    /// The configuration independent of the epilogue (`conv2d_sm90 128x128x64 c1x1`): the key of
    /// profiled times, which are stored per problem signature (that includes the epilogue).
    pub config: String,
    /// The template's fields (tile shapes, epilogue expressions).
    pub context: Map<String, Json>,
}

/// Which library instance runs a node for batches up to `max_batch` (the last entry: any batch).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dispatch {
    pub max_batch: i64,
    pub instance: LibraryInstance,
    /// Whether the choice comes from a profiled time (else from the documented heuristic).
    pub measured: bool,
}

/// A concrete kernel choice: the template that renders the node's kernel and its fields.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Template stem under `templates/<target>/kernels/`.
    pub template: String,
    /// Fields added to the problem's own template fields (tile shapes, stages, epilogue types).
    pub context: Map<String, Json>,
    /// Scratch bytes the launcher needs at the largest batch.
    pub workspace_bytes: u64,
    /// Library instances by batch range, ascending; empty for a kernel of our own.
    pub dispatch: Vec<Dispatch>,
}

impl Instance {
    /// A kernel of our own (no library instance).
    pub fn own(template: &str, context: Map<String, Json>) -> Instance {
        Instance { template: template.into(), context, workspace_bytes: 0, dispatch: Vec::new() }
    }
}

pub trait Target: Sync {
    /// `cuda`, `hip`.
    fn name(&self) -> &'static str;
    /// Threads that execute in lockstep and reduce with shuffles: 32 on NVIDIA GPUs, 64 on
    /// AMD's CDNA (MI200/MI300). Launch sizes of the row-wise kernels (softmax, norms,
    /// reductions) are multiples of it.
    fn warp_size(&self) -> i64;
    /// The instance that computes a convolution, or a generic kernel when no library instance
    /// supports the problem (never an instance that would fail at run time).
    fn conv2d(&self, p: &ConvProblem) -> Instance;
    fn gemm(&self, p: &GemmProblem) -> Instance;
    /// Input channels a library conv wants at least, and the multiple it wants them in (8 for
    /// 16-byte fp16 accesses).
    fn conv_channel_multiple(&self) -> usize;
    /// The channel count a library conv wants for an input of `c` channels: the lowering pads a
    /// thin stem (C = 3) up to it with zero channels. Default: the next multiple of
    /// [`Target::conv_channel_multiple`].
    fn conv_padded_channels(&self, c: usize) -> usize {
        let m = self.conv_channel_multiple().max(1);
        c.div_ceil(m) * m
    }
    /// Whether convolution `p` (constant weights, group 1) runs as an explicit im2col: a kernel
    /// writes the patch matrix `[N·P·Q, Kp]` (columns in KRSC order r, s, c, zero beyond R·S·C)
    /// and a 1x1 library convolution over `Kp` channels multiplies it by the weights reshaped to
    /// `[K, Kp]`. Returns `Kp`, or None to compute `p` as it is. Default: never.
    fn conv_im2col_columns(&self, _p: &ConvProblem) -> Option<i64> {
        None
    }
}
