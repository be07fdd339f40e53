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
use std::collections::{BTreeMap, BTreeSet};

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
    /// `cuda`, `rocm`: the name of its template set (`codegen::template_dirs`) and of
    /// `build.json`'s target.
    fn name(&self) -> &'static str;
    /// The GPU architecture the code is generated for (`sm_90a`, `gfx942`).
    fn arch_name(&self) -> String;
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
    /// Whether this target has the kernel family `template` (a template stem under
    /// `templates/<target>/kernels/`); Err says why not, and the lowering reports it against the
    /// node. Default: every family.
    fn own_kernel(&self, _template: &str) -> Result<(), String> {
        Ok(())
    }
}

/// Profiled times: problem signature → instance config → median milliseconds, for candidates
/// that ran and matched the reference (the profile cache's view for one GPU and toolchain).
pub type Measurements = BTreeMap<String, BTreeMap<String, f64>>;

/// A library problem at one concrete batch, as the profiler needs it.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileProblem {
    /// `conv2d n8 h56 ...` or `gemm m.. n.. k..`: the key of its times in the profile cache.
    pub signature: String,
    /// `conv` or `gemm`.
    pub kind: &'static str,
    /// The problem's fields for the target's profiler template (sizes, strides, epilogue
    /// expressions).
    pub fields: Map<String, Json>,
    /// Every instance that may compute it.
    pub candidates: Vec<LibraryInstance>,
    /// Multiply-adds × 2 (for TFLOP/s figures).
    pub flops: f64,
    /// The config the heuristic picks (what profiling is compared with).
    pub heuristic: String,
    /// The batch range (its upper bound) this problem is chosen for.
    #[serde(skip)]
    pub batch: i64,
    /// How many times the lowering asked for it (nodes with this problem, at this batch range).
    #[serde(skip)]
    pub uses: usize,
}

/// A target whose library instances are chosen by profiled times: what instance sharing
/// (`lower::sharing`) and the measured cost model (`profile::cost`) ask of it.
pub trait ProfiledTarget: Target {
    /// The profiled times given to it, if any.
    fn measurements(&self) -> Option<&Measurements>;
    fn has_measurements(&self) -> bool {
        self.measurements().is_some()
    }
    /// The profile-cache signature of convolution `p` at `batch`, or None when no library
    /// instance computes it. Asking records the problem on a recording target.
    fn conv_signature_at(&self, p: &ConvProblem, batch: i64) -> Option<String>;
    /// The fastest profiled time (milliseconds) of convolution `p` at `batch` over the
    /// candidates this target chooses from; None without one.
    fn conv_time(&self, p: &ConvProblem, batch: i64) -> Option<f64>;
    /// [`ProfiledTarget::conv_signature_at`] for a matrix product.
    fn gemm_signature_at(&self, p: &GemmProblem, batch: i64) -> Option<String>;
    /// [`ProfiledTarget::conv_time`] for a matrix product.
    fn gemm_time(&self, p: &GemmProblem, batch: i64) -> Option<f64>;
    /// A recording copy (same times, no sharing): lowering a graph with it lists the library
    /// problems this target would choose for.
    fn probe(&self) -> Self
    where
        Self: Sized;
    /// The problems a recording target was asked for.
    fn recorded(&self) -> Vec<ProfileProblem>;
    /// The target letting a measured choice take one of `instances` when it is at most
    /// `1 + tolerance` times slower than the fastest candidate.
    fn with_shared_instances(self, instances: BTreeSet<String>, tolerance: f64) -> Self
    where
        Self: Sized;
}
