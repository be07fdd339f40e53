//! Target-neutral descriptions of the problems a target picks library instances for.

use super::target::{choice_grid, range_buckets, Point};
use crate::ir::ops::kernel::Act;
use crate::ir::Dim;
use std::collections::BTreeMap;

/// `act(pre_act(conv(x, w) + bias) + residual)` on NHWC fp16 activations and KRSC fp16 weights.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvProblem {
    /// Batch (constant or the batch symbol).
    pub n: Dim,
    pub h: i64,
    pub w: i64,
    /// Input channels (all groups).
    pub c: i64,
    /// Output channels (all groups).
    pub k: i64,
    pub r: i64,
    pub s: i64,
    pub p: i64,
    pub q: i64,
    /// Top, left, bottom, right.
    pub pads: [i64; 4],
    pub strides: [i64; 2],
    pub dilations: [i64; 2],
    pub group: i64,
    pub bias: bool,
    pub residual: bool,
    pub pre_act: Option<Act>,
    pub act: Option<Act>,
}

impl ConvProblem {
    /// Multiply-adds ×2 of the convolution: 2·N·P·Q·K·(C/group)·R·S (padding the lowering adds
    /// for a library kernel is not useful work and is not counted).
    pub fn flops(&self) -> Dim {
        // Through Dim: a product beyond i64 becomes its overflow symbol, never a wrapped value.
        [self.p, self.q, self.k, self.c / self.group.max(1), self.r, self.s]
            .iter()
            .fold(Dim::known(2).mul(&self.n), |acc, &x| acc.mul(&Dim::known(x)))
    }

    /// The sizes and window of the problem as template fields (everything but the batch and the
    /// group), named as the convolution templates and the library ABI (`O2aConvArgs`) name them.
    pub fn geometry_fields(&self) -> [(&'static str, i64); 14] {
        [
            ("h", self.h),
            ("w", self.w),
            ("c", self.c),
            ("k", self.k),
            ("r", self.r),
            ("s", self.s),
            ("p", self.p),
            ("q", self.q),
            ("pad_h", self.pads[0]),
            ("pad_w", self.pads[1]),
            ("stride_h", self.strides[0]),
            ("stride_w", self.strides[1]),
            ("dil_h", self.dilations[0]),
            ("dil_w", self.dilations[1]),
        ]
    }
}

/// How the bias of a matrix product broadcasts over the `[.., M, N]` output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasKind {
    /// One value per output column (`[N]`, `[1, N]`): the fused-epilogue case.
    PerColumn,
    /// Any other broadcast (per row, scalar, full): read with general strides.
    General,
}

/// `act(alpha · op(A) · op(B) + beta · bias + residual)` over a batch of matrices.
#[derive(Clone, Debug)]
pub struct GemmProblem {
    /// Number of matrices in the batch (product of the broadcast leading dims).
    pub batch_count: Dim,
    pub m: Dim,
    pub n: Dim,
    pub k: Dim,
    pub trans_a: bool,
    pub trans_b: bool,
    /// Whether A / B advance between batch entries (false: one matrix broadcast to all).
    pub a_batched: bool,
    pub b_batched: bool,
    /// B is a compile-time weight.
    pub b_constant: bool,
    pub alpha: f32,
    pub beta: f32,
    pub bias: Option<BiasKind>,
    pub residual: bool,
    pub act: Option<Act>,
    /// The run-time dims other than the batch and their ranges (`RunDims::other_ranges`): a
    /// target chooses an instance per range of those the sizes depend on (see
    /// [`GemmProblem::choice_points`]); alignment is still judged on the symbolic sizes, which
    /// hold for every value.
    pub dim_ranges: BTreeMap<String, (i64, i64)>,
}

impl GemmProblem {
    /// Multiply-adds ×2 of the product: 2·batch_count·M·N·K (the epilogue not counted).
    pub fn flops(&self) -> Dim {
        Dim::known(2).mul(&self.batch_count).mul(&self.m).mul(&self.n).mul(&self.k)
    }

    /// `[batch_count, m, n, k]` with the run-time dims other than the batch at their values in
    /// `dims` and the others of `dim_ranges` at their largest: what is left symbolic depends on
    /// the batch only. A target picks an instance by these sizes.
    pub fn judged_at(&self, dims: &BTreeMap<String, i64>) -> [Dim; 4] {
        let env: BTreeMap<String, i64> =
            self.dim_ranges.iter().map(|(s, &(_, max))| (s.clone(), dims.get(s).copied().unwrap_or(max))).collect();
        [&self.batch_count, &self.m, &self.n, &self.k].map(|d| d.eval(&env))
    }

    /// The points at which a target with batch buckets `batches` chooses an instance: the batch
    /// buckets when a size depends on the batch (else only the largest), crossed with the
    /// [`range_buckets`] of each other run-time dim a size depends on (seq of a `[batch·seq, 768]`
    /// projection, of `[seq, seq]` attention scores), see [`choice_grid`].
    pub fn choice_points(&self, batches: &[i64]) -> Vec<Point> {
        let batch_dependent = self.judged_at(&BTreeMap::new()).iter().any(|d| d.as_known().is_none());
        let batches = match batches.last() {
            Some(&largest) if !batch_dependent => vec![largest],
            _ => batches.to_vec(),
        };
        let sizes = [&self.batch_count, &self.m, &self.n, &self.k];
        let others: Vec<(String, Vec<i64>)> = self
            .dim_ranges
            .iter()
            .filter(|(s, _)| sizes.iter().any(|d| d.symbols().any(|x| x == s.as_str())))
            .map(|(s, &(min, max))| (s.clone(), range_buckets(min, max)))
            .collect();
        choice_grid(&batches, &others)
    }
}
