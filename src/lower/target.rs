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
//! for the run-time dims: [`Instance::dispatch`] lists one instance per range of the batch and of
//! the other run-time dims the problem's sizes depend on ([`choice_grid`], [`dispatch_over`]).

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

/// Which library instance runs a node for batches up to `max_batch` and the other run-time dims
/// up to their bounds in `dims`. A node's entries are tried in order and the first whose bounds
/// all hold runs (the last entry: any values).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Dispatch {
    pub max_batch: i64,
    /// Upper bounds of run-time dims other than the batch, by symbol; a dim that is absent is not
    /// tested (any value of its range).
    pub dims: BTreeMap<String, i64>,
    pub instance: LibraryInstance,
    /// Whether the choice comes from a profiled time (else from the documented heuristic).
    pub measured: bool,
}

/// Upper bounds of the ranges a run-time dim running `min..=max` is split into for choosing
/// library instances: 1, 8 and 64 where they fall in `min..max`, then `max`. The first range
/// runs from `min`, each other from the previous bound (exclusive), each to its own bound (no
/// bound lies below `min`: it would serve no value), and instances are chosen at its bound: the largest
/// problem of the range, whose tiling matters most. The batch (`1..=--max-batch`) and every other
/// run-time dim (`--dim seq=1..512`: 1, 8, 64, 512) are split alike.
pub fn range_buckets(min: i64, max: i64) -> Vec<i64> {
    let max = max.max(1);
    let mut b: Vec<i64> = [1, 8, 64].into_iter().filter(|&v| v >= min && v < max).collect();
    b.push(max);
    b
}

/// At most this many points (the product of the bucket counts of the dims a problem depends on)
/// per library problem: each is a problem to profile and an entry to test at run time. Batch and
/// one more dim at four buckets each fit; more dims lose their smallest buckets first.
pub const MAX_CHOICE_POINTS: usize = 16;

/// Where a library instance is chosen: the batch and the other run-time dims a problem depends on,
/// each at the upper bound of one of its ranges ([`range_buckets`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Point {
    pub batch: i64,
    /// Run-time dims other than the batch, by symbol (empty: the problem depends on none).
    pub dims: BTreeMap<String, i64>,
}

impl Point {
    /// A point of the batch alone.
    pub fn batch(batch: i64) -> Point {
        Point { batch, dims: BTreeMap::new() }
    }
}

impl std::fmt::Display for Point {
    /// `batch 8`, `batch 8, seq 64`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "batch {}", self.batch)?;
        for (s, v) in &self.dims {
            write!(f, ", {s} {v}")?;
        }
        Ok(())
    }
}

/// The points at which to choose an instance for a problem: `batches` (a target's batch buckets,
/// or only the largest when the problem does not depend on the batch) crossed with the buckets of
/// each other dim in `others` (symbol, ascending bounds; a dim with one bucket is left out: its
/// one choice needs no test). When the cross product exceeds [`MAX_CHOICE_POINTS`], the dim with
/// the most buckets (the later one on a tie, so the batch keeps its resolution longest) loses its
/// smallest bucket, whose range joins the next, until it fits. Batch-major, then the other dims
/// in symbol order: the order [`dispatch_over`] expects.
pub fn choice_grid(batches: &[i64], others: &[(String, Vec<i64>)]) -> Vec<Point> {
    let mut levels: Vec<Vec<i64>> = vec![batches.to_vec()];
    let mut names: Vec<&str> = Vec::new();
    for (s, b) in others.iter().filter(|(_, b)| b.len() > 1) {
        names.push(s);
        levels.push(b.clone());
    }
    while levels.iter().map(Vec::len).product::<usize>() > MAX_CHOICE_POINTS {
        // `max_by_key` keeps the last of equal maxima: the later dim.
        let widest = (0..levels.len()).max_by_key(|&i| levels[i].len()).unwrap_or(0);
        if levels[widest].len() <= 1 {
            break;
        }
        levels[widest].remove(0);
    }
    let mut points = vec![Point::default()];
    for (level, buckets) in levels.iter().enumerate() {
        let mut next = Vec::with_capacity(points.len() * buckets.len());
        for p in &points {
            for &v in buckets {
                let mut q = p.clone();
                match level {
                    0 => q.batch = v,
                    _ => {
                        q.dims.insert(names[level - 1].to_string(), v);
                    }
                }
                next.push(q);
            }
        }
        points = next;
    }
    points
}

/// One dispatch entry per point of `points` (as [`choice_grid`] orders them), equal choices of
/// neighbouring ranges merged: the node tries the entries in order and runs the first whose
/// bounds hold. Along the last dim adjacent equal choices merge into the later range; along an
/// outer dim, a range whose entries equal those of the next range is dropped (the next one's
/// entries then match its values too). A bound that is its dim's largest is not tested. None
/// when `choose` has no instance for a point.
pub fn dispatch_over(
    points: &[Point],
    mut choose: impl FnMut(&Point) -> Option<(LibraryInstance, bool)>,
) -> Option<Vec<Dispatch>> {
    // Each point as its bounds per level (batch first, then the other dims in symbol order).
    let symbols: Vec<String> = points.first().map(|p| p.dims.keys().cloned().collect()).unwrap_or_default();
    let mut chosen: Vec<(Vec<i64>, LibraryInstance, bool)> = Vec::with_capacity(points.len());
    for p in points {
        let (instance, measured) = choose(p)?;
        let mut bounds = vec![p.batch];
        bounds.extend(symbols.iter().map(|s| p.dims.get(s).copied().unwrap_or(i64::MAX)));
        chosen.push((bounds, instance, measured));
    }
    let entries = merge_level(&chosen, 0);
    // The largest bound of each non-batch level needs no test.
    let largest: Vec<i64> =
        (0..symbols.len()).map(|i| chosen.iter().map(|c| c.0[i + 1]).max().unwrap_or(i64::MAX)).collect();
    Some(
        entries
            .into_iter()
            .map(|(bounds, instance, measured)| Dispatch {
                max_batch: bounds[0],
                dims: symbols
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| bounds[i + 1] < largest[*i])
                    .map(|(i, s)| (s.clone(), bounds[i + 1]))
                    .collect(),
                instance,
                measured,
            })
            .collect(),
    )
}

/// [`dispatch_over`]'s merge of `rows` (all with equal bounds before `level`, ordered by their
/// bounds from `level` on).
fn merge_level(rows: &[(Vec<i64>, LibraryInstance, bool)], level: usize) -> Vec<(Vec<i64>, LibraryInstance, bool)> {
    let last_level = rows.first().is_none_or(|r| level + 1 >= r.0.len());
    let mut out: Vec<(Vec<i64>, LibraryInstance, bool)> = Vec::new();
    if last_level {
        for (bounds, instance, measured) in rows {
            match out.last_mut() {
                Some(prev) if prev.1 == *instance => {
                    prev.0[level] = bounds[level];
                    prev.2 &= *measured;
                }
                _ => out.push((bounds.clone(), instance.clone(), *measured)),
            }
        }
        return out;
    }
    let mut prev: Vec<(Vec<i64>, LibraryInstance, bool)> = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let v = rows[start].0[level];
        let end = start + rows[start..].iter().take_while(|r| r.0[level] == v).count();
        let mut group = merge_level(&rows[start..end], level + 1);
        let same = prev.len() == group.len()
            && prev.iter().zip(&group).all(|(a, b)| a.1 == b.1 && a.0[level + 1..] == b.0[level + 1..]);
        if same {
            // The previous range's values take this range's entries.
            for (g, p) in group.iter_mut().zip(&prev) {
                g.2 &= p.2;
            }
        } else {
            out.extend(prev);
        }
        prev = group;
        start = end;
    }
    out.extend(prev);
    out
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
    /// Library instances by range of the run-time dims, in the order the node tests them; empty
    /// for a kernel of our own.
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

/// A library problem at one concrete point of the run-time dims, as the profiler needs it.
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
    /// The ranges (their upper bounds: the batch's, and those of the other run-time dims the
    /// problem depends on) this problem is chosen for.
    #[serde(skip)]
    pub point: Point,
    /// How many times the lowering asked for it (nodes with this problem, at this point).
    #[serde(skip)]
    pub uses: usize,
}

/// A target whose library instances are chosen by profiled times: what instance sharing
/// (`lower::sharing`) and the measured cost model (`profile::cost`) ask of it.
pub trait ProfiledTarget: Target {
    /// The target choosing by profiled times `m` where they cover a problem.
    fn with_measurements(self, m: Measurements) -> Self
    where
        Self: Sized;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str) -> LibraryInstance {
        LibraryInstance { name: name.into(), template: "t".into(), config: format!("t {name}"), context: Map::new() }
    }

    fn seq(buckets: &[i64]) -> Vec<(String, Vec<i64>)> {
        vec![("seq".to_string(), buckets.to_vec())]
    }

    #[test]
    fn ranges_split_at_1_8_64_and_the_largest_value() {
        assert_eq!(range_buckets(1, 64), [1, 8, 64]);
        assert_eq!(range_buckets(1, 512), [1, 8, 64, 512]);
        assert_eq!(range_buckets(1, 1), [1]);
        // Bounds below the range's smallest value have no values to serve.
        assert_eq!(range_buckets(16, 512), [64, 512]);
        assert_eq!(range_buckets(100, 200), [200]);
    }

    #[test]
    fn the_grid_crosses_the_dims_and_stays_bounded() {
        let g = choice_grid(&[1, 8], &seq(&[8, 64]));
        let pairs: Vec<(i64, i64)> = g.iter().map(|p| (p.batch, p.dims["seq"])).collect();
        assert_eq!(pairs, [(1, 8), (1, 64), (8, 8), (8, 64)]);
        // A dim with one range needs no choice.
        assert!(choice_grid(&[1, 8], &seq(&[64])).iter().all(|p| p.dims.is_empty()));
        // Batch and seq at four ranges each fit; a third dim takes buckets off the widest dims
        // (the later one first), smallest first, and never the largest.
        assert_eq!(choice_grid(&[1, 8, 64, 256], &seq(&[1, 8, 64, 512])).len(), 16);
        let mut others = seq(&[1, 8, 64, 512]);
        others.push(("width".to_string(), vec![1, 8, 64, 128]));
        let g = choice_grid(&[1, 8, 64, 256], &others);
        assert_eq!(g.len(), 12);
        let values = |f: &dyn Fn(&Point) -> i64| -> BTreeSet<i64> { g.iter().map(f).collect() };
        assert_eq!(values(&|p| p.batch), [8, 64, 256].into());
        assert_eq!(values(&|p| p.dims["seq"]), [64, 512].into());
        assert_eq!(values(&|p| p.dims["width"]), [64, 128].into());
        assert_eq!(Point { batch: 8, dims: [("seq".to_string(), 64)].into() }.to_string(), "batch 8, seq 64");
    }

    /// The instance the entries give values (b, s), trying them in order as the node does.
    fn run(d: &[Dispatch], b: i64, s: i64) -> String {
        let hit = d.iter().enumerate().find(|(i, e)| {
            *i + 1 == d.len() || (b <= e.max_batch && e.dims.get("seq").is_none_or(|&bound| s <= bound))
        });
        hit.map(|(_, e)| e.instance.name.clone()).unwrap_or_default()
    }

    #[test]
    fn dispatch_runs_each_range_on_its_choice_with_equal_neighbours_merged() {
        let (batches, seqs) = ([1, 8, 64], [1, 8, 64, 512]);
        let points = choice_grid(&batches, &seq(&seqs));
        // A tile by rows = batch · seq, as a heuristic picks by size.
        let choose = |p: &Point| -> &'static str {
            match p.batch * p.dims["seq"] {
                r if r <= 64 => "small",
                r if r <= 4096 => "medium",
                _ => "large",
            }
        };
        let d = dispatch_over(&points, |p| Some((inst(choose(p)), true))).unwrap();
        assert!(d.len() < points.len(), "{d:?}");
        let bucket = |v: i64, bounds: &[i64]| *bounds.iter().find(|&&x| v <= x).unwrap();
        for b in 1..=64 {
            for s in 1..=512 {
                let at = Point { batch: bucket(b, &batches), dims: [("seq".to_string(), bucket(s, &seqs))].into() };
                assert_eq!(run(&d, b, s), choose(&at), "batch {b}, seq {s}: {d:?}");
            }
        }
        // Bounds at the largest value are not tested; the batch always is.
        assert!(d.iter().all(|e| e.dims.get("seq") != Some(&512)), "{d:?}");
        // A choice that does not change along seq needs no seq test.
        let flat = dispatch_over(&points, |p| Some((inst(if p.batch < 64 { "a" } else { "b" }), p.batch > 1))).unwrap();
        let rows: Vec<(i64, bool, bool)> = flat.iter().map(|e| (e.max_batch, e.dims.is_empty(), e.measured)).collect();
        assert_eq!(rows, [(8, true, false), (64, true, true)]);
        // A point without an instance fails the whole dispatch (the ROCm target then falls back).
        assert!(dispatch_over(&points, |p| (p.batch < 64).then(|| (inst("a"), false))).is_none());
    }
}
