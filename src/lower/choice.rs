//! How a target chooses library instances, whatever the target: the profile-cache signature of
//! a problem, the fields the target's profiler template needs, and `Choices` — the profiled
//! times a target chooses by, the instances sharing prefers, and the problems a recording target
//! lists for `onnx2ait profile`. CUDA (CUTLASS) and ROCm (Composable Kernel) differ only in their
//! candidates and their heuristic.

use super::problem::{ConvProblem, GemmProblem};
use super::target::{LibraryInstance, Measurements, Point, ProfileProblem};
use crate::ir::ops::kernel::Act;
use crate::ir::Dim;
use serde_json::{json, Map, Value as Json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// The context fields an instance's epilogue needs, and the part of the signature they set.
#[derive(Clone, Debug)]
pub(crate) struct Epilogue {
    pub fields: Map<String, Json>,
    pub tag: String,
}

/// An activation's name in signatures and instance tags (`id` for none).
pub(crate) fn act_name(a: Option<Act>) -> String {
    match a {
        None => "id".into(),
        Some(a) => format!("{a:?}").replace(' ', ""),
    }
}

/// The C++ float expression applying an optional activation to `x`.
pub(crate) fn act_expr(act: Option<Act>, x: &str) -> String {
    match act {
        Some(a) => super::ops::act::act_call(a, x),
        None => x.to_string(),
    }
}

/// The value of a dim with every symbol set to `batch` (at least 1).
pub(crate) fn at(d: &Dim, batch: i64) -> i64 {
    let env: BTreeMap<String, i64> = d.symbols().map(|s| (s.to_string(), batch)).collect();
    d.eval(&env).as_known().unwrap_or(batch).max(1)
}

pub(crate) fn conv_epilogue(p: &ConvProblem) -> Epilogue {
    let mut f = Map::new();
    f.insert("has_bias".into(), json!(p.bias));
    f.insert("has_residual".into(), json!(p.residual));
    f.insert("pre_act".into(), json!(act_expr(p.pre_act, "v")));
    f.insert("act".into(), json!(act_expr(p.act, "v")));
    f.insert("epilogue".into(), json!(act_expr(p.act, &act_expr(p.pre_act, "v"))));
    let tag =
        format!("bias{} res{} pre:{} act:{}", p.bias as u8, p.residual as u8, act_name(p.pre_act), act_name(p.act));
    Epilogue { fields: f, tag }
}

/// `conv2d n8 h56 w56 c64 ... bias1 res0 pre:id act:Relu`: the key of a convolution's times.
pub(crate) fn conv_signature(p: &ConvProblem, n: i64, epi: &Epilogue) -> String {
    let group = if p.group == 1 { String::new() } else { format!(" g{}", p.group) };
    format!(
        "conv2d n{n} h{} w{} c{} k{} r{} s{} p{} q{} pad{},{} str{},{} dil{},{}{group} {}",
        p.h,
        p.w,
        p.c,
        p.k,
        p.r,
        p.s,
        p.p,
        p.q,
        p.pads[0],
        p.pads[1],
        p.strides[0],
        p.strides[1],
        p.dilations[0],
        p.dilations[1],
        epi.tag
    )
}

/// A convolution's fields for the profiler template (`profile/profiler.cu`).
pub(crate) fn conv_profile_fields(p: &ConvProblem, n: i64, epi: &Epilogue) -> Map<String, Json> {
    let mut f = epi.fields.clone();
    f.insert("n".into(), json!(n));
    for (key, v) in p.geometry_fields() {
        f.insert(key.into(), json!(v));
    }
    f.insert("groups".into(), json!(p.group));
    f
}

pub(crate) fn gemm_epilogue(p: &GemmProblem) -> Epilogue {
    let mut f = Map::new();
    f.insert("has_bias".into(), json!(p.bias.is_some()));
    f.insert("has_residual".into(), json!(p.residual));
    f.insert("act".into(), json!(act_expr(p.act, "v")));
    f.insert("layout_a".into(), json!(if p.trans_a { "ColumnMajor" } else { "RowMajor" }));
    f.insert("layout_b".into(), json!(if p.trans_b { "ColumnMajor" } else { "RowMajor" }));
    let tag = format!(
        "ta{} tb{} bias{} res{} act:{}",
        p.trans_a as u8,
        p.trans_b as u8,
        p.bias.is_some() as u8,
        p.residual as u8,
        act_name(p.act)
    );
    Epilogue { fields: f, tag }
}

/// `[batch count, m, n, k]` of a matrix product at a choice point: the batch symbol at
/// `point.batch`, the other run-time dims at the point's bounds.
pub(crate) fn gemm_dims(p: &GemmProblem, point: &Point) -> [i64; 4] {
    p.judged_at(&point.dims).map(|d| at(&d, point.batch))
}

/// `gemm b1 m4096 n3072 k768 ...`: the key of a matrix product's times.
pub(crate) fn gemm_signature(p: &GemmProblem, point: &Point, epi: &Epilogue) -> String {
    let [bc, m, n, k] = gemm_dims(p, point);
    format!(
        "gemm b{bc} m{m} n{n} k{k} abatch{} bbatch{} alpha{} beta{} {}",
        p.a_batched as u8, p.b_batched as u8, p.alpha, p.beta, epi.tag
    )
}

/// A matrix product's fields for the profiler template (`profile/profiler.cu`).
pub(crate) fn gemm_profile_fields(p: &GemmProblem, point: &Point, epi: &Epilogue) -> Map<String, Json> {
    let [bc, m, n, k] = gemm_dims(p, point);
    let mut f = epi.fields.clone();
    let a_rows_stride = if p.trans_a { m } else { k };
    let b_rows_stride = if p.trans_b { k } else { n };
    let bsa = if p.a_batched { m * k } else { 0 };
    let bsb = if p.b_batched { k * n } else { 0 };
    for (key, v) in [
        ("m", m),
        ("n", n),
        ("k", k),
        ("batch_count", bc),
        ("lda", a_rows_stride),
        ("ldb", b_rows_stride),
        ("ldd", n),
        ("ld_bias", 0),
        ("ld_res", n),
        ("batch_stride_a", bsa),
        ("batch_stride_b", bsb),
        ("batch_stride_d", m * n),
        ("batch_stride_bias", 0),
        ("batch_stride_res", m * n),
        ("a_elems", if p.a_batched { bc * m * k } else { m * k }),
        ("b_elems", if p.b_batched { bc * k * n } else { k * n }),
        ("bias_elems", n),
        ("res_elems", bc * m * n),
        ("d_elems", bc * m * n),
    ] {
        f.insert(key.into(), json!(v));
    }
    f.insert("alpha".into(), json!(super::ops::act::float_lit(p.alpha)));
    f.insert("beta".into(), json!(super::ops::act::float_lit(p.beta)));
    f.insert("trans_a".into(), json!(p.trans_a));
    f.insert("trans_b".into(), json!(p.trans_b));
    f
}

/// Convolution `p` at batch `n` (choice point `point`) as the profiler needs it.
pub(crate) fn conv_profile_problem(
    p: &ConvProblem,
    n: i64,
    point: &Point,
    epi: &Epilogue,
    candidates: &[LibraryInstance],
    heuristic: &LibraryInstance,
) -> ProfileProblem {
    ProfileProblem {
        signature: conv_signature(p, n, epi),
        kind: "conv",
        fields: conv_profile_fields(p, n, epi),
        candidates: candidates.to_vec(),
        // Each output sums R·S·C/group products.
        flops: 2.0 * (n * p.p * p.q) as f64 * p.k as f64 * (p.r * p.s * p.c / p.group) as f64,
        heuristic: heuristic.config.clone(),
        point: point.clone(),
        uses: 0,
    }
}

/// Matrix product `p` at choice point `point` as the profiler needs it.
pub(crate) fn gemm_profile_problem(
    p: &GemmProblem,
    point: &Point,
    epi: &Epilogue,
    candidates: &[LibraryInstance],
    heuristic: &LibraryInstance,
) -> ProfileProblem {
    let [bc, m, n, k] = gemm_dims(p, point);
    ProfileProblem {
        signature: gemm_signature(p, point, epi),
        kind: "gemm",
        fields: gemm_profile_fields(p, point, epi),
        candidates: candidates.to_vec(),
        flops: 2.0 * bc as f64 * m as f64 * n as f64 * k as f64,
        heuristic: heuristic.config.clone(),
        point: point.clone(),
        uses: 0,
    }
}

/// What a target chooses by besides its heuristic, and what it records for the profiler.
#[derive(Clone, Debug, Default)]
pub(crate) struct Choices {
    /// Profiled times (`--profile-cache`).
    measured: Option<Measurements>,
    /// Instances a measured choice prefers, and how much slower than the fastest they may be
    /// (see `sharing.rs`).
    shared: Option<(BTreeSet<String>, f64)>,
    /// Every library problem the lowering asked about (for `onnx2ait profile`); shared by clones.
    recorded: Option<Arc<Mutex<BTreeMap<String, ProfileProblem>>>>,
}

impl Choices {
    pub fn with_measurements(mut self, m: Measurements) -> Choices {
        self.measured = Some(m);
        self
    }

    pub fn with_shared_instances(mut self, instances: BTreeSet<String>, tolerance: f64) -> Choices {
        self.shared = Some((instances, tolerance.max(0.0)));
        self
    }

    pub fn recording(mut self) -> Choices {
        self.recorded = Some(Arc::new(Mutex::new(BTreeMap::new())));
        self
    }

    /// The same times, no sharing, a new record.
    pub fn probe(&self) -> Choices {
        Choices { measured: self.measured.clone(), shared: None, recorded: None }.recording()
    }

    pub fn measurements(&self) -> Option<&Measurements> {
        self.measured.as_ref()
    }

    /// The recorded problems, by signature.
    pub fn recorded(&self) -> Vec<ProfileProblem> {
        match &self.recorded {
            Some(m) => m.lock().map(|m| m.values().cloned().collect()).unwrap_or_default(),
            None => Vec::new(),
        }
    }

    pub fn record(&self, p: ProfileProblem) {
        if let Some(m) = &self.recorded {
            if let Ok(mut m) = m.lock() {
                m.entry(p.signature.clone()).or_insert(p).uses += 1;
            }
        }
    }

    /// The fastest measured candidate for `signature`, if the profile has one. With shared
    /// instances, the fastest of those within the tolerance, when there is one.
    pub fn measured_choice(&self, signature: &str, candidates: &[LibraryInstance]) -> Option<LibraryInstance> {
        let times = self.measured.as_ref()?.get(signature)?;
        let timed = || candidates.iter().filter_map(|c| times.get(&c.config).map(|ms| (*ms, c)));
        let (best, c) = timed().min_by(|a, b| a.0.total_cmp(&b.0))?;
        if let Some((shared, tolerance)) = &self.shared {
            let limit = best * (1.0 + tolerance);
            let preferred =
                timed().filter(|(t, c)| *t <= limit && shared.contains(&c.name)).min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, s)) = preferred {
                return Some(s.clone());
            }
        }
        Some(c.clone())
    }

    /// The smallest profiled time (ms) among `candidates` for `signature`; times of instances
    /// that are not candidates (an older build's configurations) are ignored, as when choosing.
    pub fn fastest_measured_ms(&self, signature: &str, candidates: &[LibraryInstance]) -> Option<f64> {
        let times = self.measured.as_ref()?.get(signature)?;
        candidates.iter().filter_map(|c| times.get(&c.config).copied()).min_by(f64::total_cmp)
    }

    /// Records `problem` and returns the instance for it: the measured choice among its
    /// candidates, or `heuristic` (flag: whether measured).
    pub fn choose(&self, problem: ProfileProblem, heuristic: LibraryInstance) -> (LibraryInstance, bool) {
        let chosen = self.measured_choice(&problem.signature, &problem.candidates);
        self.record(problem);
        match chosen {
            Some(c) => (c, true),
            None => (heuristic, false),
        }
    }
}
