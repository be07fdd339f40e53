//! Measured costs for the optimiser's extraction: the e-graph's cost model priced with the
//! profile cache's kernel times where it has them (issue 6, "measured costs in extraction").
//!
//! [`MeasuredCost`] wraps the [`AnalyticalCost`] roofline. For every convolution and matrix
//! product node the extractor prices, it builds the library problem the lowering would build
//! ([`ConvProblem`], [`GemmProblem`]) and asks the [`ProfiledTarget`] for the fastest profiled time of
//! that problem's signature (the same signature and candidate set the target chooses an instance
//! from). With a time, the node costs that time, plus, for an NCHW convolution, the layout
//! transforms the lowering runs around the NHWC kernel (priced analytically, as the analytical
//! model prices them). Without one (not profiled, no library instance, or a problem the lowering
//! does not send to the library), the node costs exactly what the analytical model says. Every
//! other node is analytical.
//!
//! Pricing batch. The extractor picks one graph for every run-time batch, so costs are taken at
//! one batch: the symbolic batch (and every other symbol not bound with [`MeasuredCost::with_dims`],
//! as in [`crate::lower::cuda::CudaTarget`] and the analytical model) is set to it, for measured and estimated
//! costs alike. The profile measures each problem at the target's batch ranges (1, 8, 64 and
//! `--max-batch`), so the pricing batch should be one of those; `compile` prices at its largest
//! (`--max-batch`), where the kernels are big and their choice matters most.
//!
//! How the problems are built follows `lower::ops::conv` and `lower::ops::gemm` rule for rule
//! (see [`conv_problem`] and [`gemm_problem`]): device fp16 operands, rank-4 convolutions with
//! compile-time spatial sizes, a thin stem as the lowering's own rule (`lower::ops::conv::
//! library_form`) runs it: the 1x1 product of an explicit im2col, or the channels padded to the
//! target's multiple (the im2col / `pad_channels` kernel in front is not priced, here as in the
//! analytical model), NCHW as the NHWC kernel between transforms that are skipped over a size-1
//! extent, numpy-batched matrix products with a batched A times a shared B folded into one tall
//! product, and the per-column-bias / exact-residual limits of the library epilogues.
//!
//! Everything priced is recorded (interior mutability, ordered maps: deterministic), so reports
//! can say which costs were measured: [`MeasuredCost::priced`] lists every distinct problem the
//! extractor met (every alternative in the e-graph), [`MeasuredCost::kernel_costs`] prices the
//! kernels of an optimised graph for `onnx2ait explain`.

use crate::egraph::explain::kernel_detail;
use crate::egraph::language::ONode;
use crate::egraph::{optimize_with_cost, AnalyticalCost, CostModel, ExplainReport, OptimizeOptions};
use crate::error::Result;
use crate::ir::ops::kernel::{Conv2d, Gemm, Layout};
use crate::ir::{DType, Dim, Fact, Graph, Op, ValueType};
use crate::lower::ops::conv::{conv_problem_of, library_form, LibraryForm};
use crate::lower::ops::gemm::{ProductGeometry, ProductShapes};
use crate::lower::target::ProfiledTarget;
use crate::lower::{device_dtype, ConvProblem, GemmProblem, LowerError, Target};
use egg::Id;
use serde::Serialize;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;

/// Optimises `g` with measured kernel times where `target` has them (see the module doc), pricing
/// at `batch` with the compile-time `dims` (`--dim`) bound. Returns what
/// [`crate::egraph::optimize`] returns.
///
/// Given a recording target (`CudaTarget::recording`), this also records every convolution and
/// matrix product problem of every alternative the e-graph offered, at each batch range: the
/// problems to profile for measured times to be able to change the extracted graph.
pub fn optimize_measured(
    g: &Graph,
    opts: &OptimizeOptions,
    target: &dyn ProfiledTarget,
    batch: i64,
    dims: &BTreeMap<String, i64>,
) -> Result<(Graph, ExplainReport)> {
    optimize_with_cost(g, opts, &MeasuredCost::new(target, batch).with_dims(dims.clone()))
}

/// The e-graph cost model with profiled kernel times (see the module doc).
pub struct MeasuredCost<'a> {
    analytical: AnalyticalCost,
    target: &'a dyn ProfiledTarget,
    batch: i64,
    dims: BTreeMap<String, i64>,
    /// Problem key → what pricing it found (also the memo of the target's answers).
    priced: RefCell<BTreeMap<String, PricedProblem>>,
}

/// A convolution or matrix product the cost model priced, and what it found for it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PricedProblem {
    /// `conv` or `gemm`.
    pub kind: &'static str,
    /// The profile-cache signature, when a library instance computes the problem.
    pub signature: Option<String>,
    /// The fastest profiled time, milliseconds.
    pub measured_ms: Option<f64>,
    /// Why there is no time (absent when measured).
    pub note: Option<String>,
}

/// One node's price: seconds, and the library problem when it is a convolution or matrix product.
struct Price {
    seconds: f64,
    problem: Option<PricedProblem>,
}

/// A tensor the lowering of an NCHW convolution transposes: an input, or the output.
enum Moved<'f> {
    Input(&'f Fact),
    Output,
}

impl<'a> MeasuredCost<'a> {
    /// Prices at `batch` (at least 1) with the default analytical rates.
    pub fn new(target: &'a dyn ProfiledTarget, batch: i64) -> MeasuredCost<'a> {
        let batch = batch.max(1);
        MeasuredCost {
            analytical: AnalyticalCost { symbol_value: batch, ..AnalyticalCost::default() },
            target,
            batch,
            dims: BTreeMap::new(),
            priced: RefCell::new(BTreeMap::new()),
        }
    }

    /// Symbols fixed at compile time (`--dim seq=128`), substituted into every shape before
    /// pricing, as the lowering substitutes them.
    pub fn with_dims(mut self, dims: BTreeMap<String, i64>) -> MeasuredCost<'a> {
        self.dims = dims;
        self
    }

    /// The pricing batch.
    pub fn batch(&self) -> i64 {
        self.batch
    }

    /// The analytical model used for everything without a measured time.
    pub fn analytical(&self) -> &AnalyticalCost {
        &self.analytical
    }

    /// Every distinct convolution / matrix product priced so far, in key order: during an
    /// extraction, every such alternative the e-graph offered.
    pub fn priced(&self) -> Vec<PricedProblem> {
        self.priced.borrow().values().cloned().collect()
    }

    /// Prices each convolution and matrix product kernel of an optimised graph.
    pub fn kernel_costs(&self, g: &Graph) -> CostReport {
        let mut kernels = Vec::new();
        for n in &g.nodes {
            let node = if n.op.downcast_ref::<Conv2d>().is_some() {
                kconv_node()
            } else if n.op.downcast_ref::<Gemm>().is_some() {
                gemm_node()
            } else {
                continue;
            };
            let fact = |v: usize| -> Option<Fact> {
                let val = g.value(v);
                let ty = val.ty.clone()?;
                Some(Fact { ty, konst: val.konst.clone(), sym: val.sym.clone() })
            };
            let inputs: Vec<Option<Fact>> = n.inputs.iter().map(|i| i.and_then(fact)).collect();
            let Some(out) = n.outputs.first().and_then(|&o| fact(o)) else { continue };
            let refs: Vec<Option<&Fact>> = inputs.iter().map(Option::as_ref).collect();
            let price = self.price(&node, Some(n.op.as_ref()), &refs, &out);
            let problem = price.problem.as_ref();
            kernels.push(KernelCost {
                node: n.name.clone(),
                kernel: kernel_detail(n),
                us: price.seconds * 1e6,
                measured: problem.is_some_and(|p| p.measured_ms.is_some()),
                signature: problem.and_then(|p| p.signature.clone()),
                note: problem.and_then(|p| p.note.clone()),
            });
        }
        let priced = self.priced();
        CostReport {
            batch: self.batch,
            source: String::new(),
            measured: kernels.iter().filter(|k| k.measured).count(),
            total: kernels.len(),
            kernels,
            problems_priced: priced.len(),
            problems_measured: priced.iter().filter(|p| p.measured_ms.is_some()).count(),
        }
    }

    fn bind(&self, f: &Fact) -> Fact {
        let shape = f.shape().iter().map(|d| d.eval(&self.dims)).collect();
        Fact { ty: ValueType::new(f.dtype(), shape), konst: f.konst.clone(), sym: f.sym.clone() }
    }

    fn price(&self, node: &ONode, op: Option<&dyn Op>, inputs: &[Option<&Fact>], out: &Fact) -> Price {
        if !self.dims.is_empty() {
            let bound: Vec<Option<Fact>> = inputs.iter().map(|f| f.map(|f| self.bind(f))).collect();
            let refs: Vec<Option<&Fact>> = bound.iter().map(Option::as_ref).collect();
            return self.price_bound(node, op, &refs, &self.bind(out));
        }
        self.price_bound(node, op, inputs, out)
    }

    fn price_bound(&self, node: &ONode, op: Option<&dyn Op>, inputs: &[Option<&Fact>], out: &Fact) -> Price {
        let estimate = || self.analytical.cost(node, op, inputs, out);
        let conv = op.and_then(|o| o.downcast_ref::<Conv2d>());
        let gemm = op.and_then(|o| o.downcast_ref::<Gemm>());
        let (problem, extra_s) = match (node, conv, gemm) {
            (ONode::Conv(_) | ONode::KConv(_), Some(c), _) => match conv_problem(c, inputs, out, self.target) {
                Ok(p) => {
                    let key = format!("conv {:?}", p);
                    let priced = self.memo(key, || {
                        let signature = self.target.conv_signature_at(&p, self.batch);
                        let ms = signature.as_ref().and_then(|_| self.target.conv_time(&p, self.batch));
                        ("conv", signature, ms, "direct kernel: no library instance")
                    });
                    (priced, self.nchw_transforms_s(c, &p, inputs, out))
                }
                Err(why) => (self.unpriceable("conv", why), 0.0),
            },
            (ONode::Gemm(_), _, Some(g)) => match gemm_problem(g, inputs, out) {
                Ok(p) => {
                    let key = format!("gemm {:?}", p);
                    let priced = self.memo(key, || {
                        let signature = self.target.gemm_signature_at(&p, self.batch);
                        let ms = signature.as_ref().and_then(|_| self.target.gemm_time(&p, self.batch));
                        ("gemm", signature, ms, "generic kernel: no library instance")
                    });
                    (priced, 0.0)
                }
                Err(why) => (self.unpriceable("gemm", why), 0.0),
            },
            _ => return Price { seconds: estimate(), problem: None },
        };
        let seconds = match problem.measured_ms {
            Some(ms) => ms * 1e-3 + extra_s,
            None => estimate(),
        };
        Price { seconds, problem: Some(problem) }
    }

    /// The record of a library problem, asking the target on first sight.
    fn memo(
        &self,
        key: String,
        ask: impl FnOnce() -> (&'static str, Option<String>, Option<f64>, &'static str),
    ) -> PricedProblem {
        if let Some(p) = self.priced.borrow().get(&key) {
            return p.clone();
        }
        let (kind, signature, measured_ms, no_library) = ask();
        let note = match (&signature, measured_ms) {
            (_, Some(_)) => None,
            (Some(_), None) => Some("not profiled".to_string()),
            (None, None) => Some(no_library.to_string()),
        };
        let p = PricedProblem { kind, signature, measured_ms, note };
        self.priced.borrow_mut().insert(key, p.clone());
        p
    }

    /// The record of a node the lowering would not send to a library instance.
    fn unpriceable(&self, kind: &'static str, why: String) -> PricedProblem {
        let p = PricedProblem { kind, signature: None, measured_ms: None, note: Some(why.clone()) };
        self.priced.borrow_mut().entry(format!("{kind} ! {why}")).or_insert_with(|| p.clone());
        p
    }

    /// The layout transforms the lowering runs around the NHWC kernel of an NCHW convolution,
    /// priced by the analytical model: x to NHWC (unless C or H·W is 1), run-time weights to KRSC
    /// (unless C/g or R·S is 1), and, when the output moves (K and P·Q above 1), a residual to
    /// NHWC and the output back.
    fn nchw_transforms_s(&self, conv: &Conv2d, p: &ConvProblem, inputs: &[Option<&Fact>], out: &Fact) -> f64 {
        if conv.layout != Layout::Nchw {
            return 0.0;
        }
        let input = |i: usize| inputs.get(i).copied().flatten();
        // The graph's channel counts (`p.c` may be a padded stem's): x `[N,C,H,W]`, w `[K,C/g,R,S]`.
        let channels = |f: Option<&Fact>| f.and_then(|f| f.shape().get(1)).and_then(Dim::as_known).unwrap_or(1);
        let (c, cg) = (channels(input(0)), channels(input(1)));
        let out_moves = p.k > 1 && p.p * p.q > 1;
        let mut moved: Vec<Moved> = Vec::new();
        if let Some(x) = input(0).filter(|_| c > 1 && p.h * p.w > 1) {
            moved.push(Moved::Input(x));
        }
        if let Some(w) = input(1).filter(|w| w.konst.is_none() && cg > 1 && p.r * p.s > 1) {
            moved.push(Moved::Input(w));
        }
        if out_moves {
            if let Some(r) = input(3) {
                moved.push(Moved::Input(r));
            }
            moved.push(Moved::Output);
        }
        let transpose = ONode::Transpose([Id::from(0usize), Id::from(0usize)]);
        moved
            .into_iter()
            .map(|m| {
                let f = match m {
                    Moved::Input(f) => f,
                    Moved::Output => out,
                };
                self.analytical.cost(&transpose, None, &[], f)
            })
            .sum()
    }
}

impl CostModel for MeasuredCost<'_> {
    fn cost(&self, node: &ONode, op: Option<&dyn Op>, inputs: &[Option<&Fact>], out: &Fact) -> f64 {
        self.price(node, op, inputs, out).seconds
    }
}

/// Stand-ins for pricing kernel nodes of an IR graph: the cost model reads only the variant.
fn kconv_node() -> ONode {
    ONode::KConv([Id::from(0usize); 6])
}

fn gemm_node() -> ONode {
    ONode::Gemm([Id::from(0usize); 6])
}

/// Whether a graph dtype is fp16 on the device (the library kernels compute on fp16).
fn device_f16(dt: DType) -> bool {
    matches!(device_dtype(dt), Ok(DType::F16))
}

/// The convolution problem `lower::ops::conv` gives the target for a kernel-level `Conv2d`: the
/// node's geometry, in the form the lowering's own rule ([`library_form`]) chooses for a thin
/// stem. Err: why the lowering would not give the target one (the node then fails to lower or
/// runs elsewhere).
pub fn conv_problem(
    op: &Conv2d,
    inputs: &[Option<&Fact>],
    out: &Fact,
    target: &dyn Target,
) -> std::result::Result<ConvProblem, String> {
    let input = |i: usize| inputs.get(i).copied().flatten();
    let (Some(x), Some(wf)) = (input(0), input(1)) else {
        return Err("input or weights missing".into());
    };
    for (f, what) in [(x, "input"), (wf, "weights"), (out, "output")] {
        if !device_f16(f.dtype()) {
            return Err(format!("the {what} is {} (the kernels compute on fp16)", f.dtype()));
        }
    }
    for (f, what) in [(Some(out), "output"), (input(2), "bias"), (input(3), "residual")] {
        if let Some(f) = f.filter(|f| !device_f16(f.dtype())) {
            return Err(format!("the {what} is {} (the kernels compute on fp16)", f.dtype()));
        }
    }
    let problem = conv_problem_of(op, x.shape(), wf.shape(), out.shape(), input(2).is_some(), input(3).is_some())
        .map_err(|e| match e {
            LowerError::Unsupported(m) | LowerError::Invalid(m) => m,
        })?;
    // A thin stem with constant weights runs as the lowering runs it: an im2col and its 1x1
    // product, or padded to the library's channel count (the im2col / pad kernel in front is not
    // priced, here as in the analytical model).
    match library_form(target, &problem, wf.konst.is_some()).map_err(|e| match e {
        LowerError::Unsupported(m) | LowerError::Invalid(m) => m,
    })? {
        LibraryForm::Stem(_) => {
            Err("a thin stem runs on the target's own tensor-core kernel (priced analytically)".into())
        }
        LibraryForm::GroupMma(_) => Err(
            "a grouped convolution of narrow groups runs on the target's own tensor-core kernel (priced analytically)"
                .into(),
        ),
        LibraryForm::Im2col { problem: product, .. } => Ok(product),
        LibraryForm::Padded(padded) => Ok(padded),
        LibraryForm::AsIs => Ok(problem),
    }
}

/// The matrix product problem `lower::ops::gemm` gives the target for a kernel-level `Gemm`
/// (built by the lowering's own `lower::ops::gemm::ProductGeometry`). Err: why the lowering would not give the
/// target one (an operand broadcast over some batch dims only, a broadcasting residual: the
/// generic kernel; or a node that does not lower).
pub fn gemm_problem(op: &Gemm, inputs: &[Option<&Fact>], out: &Fact) -> std::result::Result<GemmProblem, String> {
    let input = |i: usize| inputs.get(i).copied().flatten();
    let (Some(a), Some(b)) = (input(0), input(1)) else {
        return Err("operand missing".into());
    };
    if !a.dtype().is_float() {
        return Err(format!("operands are {} (the kernels compute on floating-point tensors)", a.dtype()));
    }
    for (f, what) in [(Some(a), "A"), (Some(b), "B"), (input(2), "bias"), (input(3), "residual"), (Some(out), "output")]
    {
        if let Some(f) = f.filter(|f| !device_f16(f.dtype())) {
            return Err(format!("{what} is {} (the kernels compute on fp16)", f.dtype()));
        }
    }
    if !(op.alpha.is_finite() && op.beta.is_finite()) {
        return Err("alpha and beta must be finite".into());
    }
    let shapes = ProductShapes {
        a: a.shape(),
        b: b.shape(),
        bias: input(2).map(Fact::shape),
        residual: input(3).map(Fact::shape),
        out: out.shape(),
    };
    let geo = ProductGeometry::of(op, &shapes).map_err(|e| match e {
        LowerError::Unsupported(m) | LowerError::Invalid(m) => m,
    })?;
    if let Some(why) = geo.generic_only() {
        return Err(format!("{why} (generic kernel)"));
    }
    Ok(geo.problem(op, b.konst.is_some()))
}

/// The cost of one kernel of an optimised graph.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct KernelCost {
    /// The kernel node's name.
    pub node: String,
    /// What it computes (`conv[nhwc]+bias+relu`).
    pub kernel: String,
    /// Microseconds at the pricing batch.
    pub us: f64,
    pub measured: bool,
    /// Its library problem's profile-cache signature, when it has one.
    pub signature: Option<String>,
    /// Why the cost is estimated (absent when measured).
    pub note: Option<String>,
}

/// The convolution and matrix product costs of an optimised graph (`onnx2ait explain
/// --profile-cache`). JSON: `{batch, source, kernels: [{node, kernel, us, measured, signature,
/// note}], measured, total, problems_priced, problems_measured}`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CostReport {
    /// The pricing batch.
    pub batch: i64,
    /// Where the times come from (the profile cache's device key and file), set by the caller.
    pub source: String,
    pub kernels: Vec<KernelCost>,
    /// Kernels with a measured cost, of `total`.
    pub measured: usize,
    pub total: usize,
    /// Distinct conv/gemm problems priced during extraction (every alternative), and how many
    /// of them had a measured time.
    pub problems_priced: usize,
    pub problems_measured: usize,
}

impl fmt::Display for CostReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "kernel costs at batch {} ({}):", self.batch, self.source)?;
        let width = self.kernels.iter().map(|k| k.node.chars().count()).max().unwrap_or(0);
        let kwidth = self.kernels.iter().map(|k| k.kernel.chars().count()).max().unwrap_or(0);
        for k in &self.kernels {
            let source = if k.measured { "measured" } else { "estimated" };
            let why = match (&k.note, &k.signature) {
                (Some(note), Some(sig)) => format!("({note}: {sig})"),
                (Some(note), None) => format!("({note})"),
                (None, _) => String::new(),
            };
            let line = format!("  {:>10.2} µs  {source:<9}  {:<width$}  {:<kwidth$}  {why}", k.us, k.node, k.kernel);
            writeln!(f, "{}", line.trim_end())?;
        }
        writeln!(f, "{} of {} conv/gemm costs measured", self.measured, self.total)?;
        writeln!(
            f,
            "extraction: {} of {} distinct conv/gemm problems in the e-graph had measured times",
            self.problems_measured, self.problems_priced
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egraph::optimize;
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::kernel::Act;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{Attr, Tensor};
    use crate::lower::cuda::{Arch, CudaTarget};
    use crate::lower::target::Measurements;
    use crate::lower::BiasKind;
    use crate::validate::inputs::random_tensor;
    use rand::SeedableRng;

    fn seeded(shape: &[usize], seed: u64) -> Tensor {
        random_tensor(DType::F32, shape, &mut rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// `x [x_shape]` → Conv (3x3, pad 1, bias) → Relu.
    fn conv_relu(x_shape: &str, w_shape: &[usize]) -> Graph {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, x_shape);
        let w = b.konst("w", seeded(w_shape, 1));
        let bias = b.konst("b", seeded(&[w_shape[0]], 2));
        let y = b.node("Conv", vec![("pads", Attr::Ints(vec![1, 1, 1, 1]))], &[x, w, bias], 1)[0];
        let y = b.node("Relu", vec![], &[y], 1)[0];
        b.g.outputs.push(y);
        infer_graph(&mut b.g).expect("the test graph infers");
        b.g
    }

    fn conv_fact_args(x: &str, w: &[usize], out: &str) -> (Fact, Fact, Fact, Fact) {
        let xf = crate::ir::ops::testutil::fact(DType::F16, x);
        let wf = Fact::constant(std::sync::Arc::new(seeded(w, 1)));
        let bf = Fact::constant(std::sync::Arc::new(seeded(&[w[0]], 2)));
        let of = crate::ir::ops::testutil::fact(DType::F16, out);
        (xf, wf, bf, of)
    }

    fn nhwc_conv(act: Option<Act>) -> Conv2d {
        Conv2d {
            layout: Layout::Nhwc,
            geom: crate::ir::ops::kernel::ConvGeom { strides: [1, 1], pads: [1; 4], dilations: [1, 1], group: 1 },
            act,
            pre_act: None,
        }
    }

    /// Every signature a recording target sees when pricing `g`'s optimisation at `batch`.
    fn signatures(g: &Graph, batch: i64) -> Vec<String> {
        let probe = CudaTarget::new(Arch::Sm90a).recording();
        let cost = MeasuredCost::new(&probe, batch);
        optimize_with_cost(g, &OptimizeOptions::standard().expect("rules"), &cost).expect("optimises");
        cost.priced().into_iter().filter_map(|p| p.signature).collect()
    }

    #[test]
    fn measured_time_replaces_the_estimate() {
        let op = nhwc_conv(Some(Act::Relu));
        let (x, w, b, out) = conv_fact_args("N,28,28,64", &[64, 3, 3, 64], "N,28,28,64");
        let inputs = [Some(&x), Some(&w), Some(&b), None];
        let node = kconv_node();
        // The signature comes from the target itself.
        let probe = CudaTarget::new(Arch::Sm90a);
        let p = conv_problem(&op, &inputs, &out, &probe).expect("a library problem");
        let sig = probe.conv_signature_at(&p, 8).expect("a library instance computes it");
        assert!(sig.starts_with("conv2d n8 h28 w28 c64 k64 "), "{sig}");
        let mut m = Measurements::new();
        let times = m.entry(sig.clone()).or_default();
        times.insert("conv2d_sm80 128x64x32 w64x32x32 s4 kOptimized".into(), 0.25);
        times.insert("conv2d_sm90 128x128x64 c1x1".into(), 0.0125);
        times.insert("an instance of an older build".into(), 0.001);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m);
        let cost = MeasuredCost::new(&target, 8);
        let s = cost.cost(&node, Some(&op), &inputs, &out);
        assert!((s - 12.5e-6).abs() < 1e-15, "{s}");
        let priced = cost.priced();
        assert_eq!(priced.len(), 1);
        assert_eq!(priced[0].signature.as_deref(), Some(sig.as_str()));
        assert_eq!(priced[0].measured_ms, Some(0.0125));
        assert_eq!(priced[0].note, None);
        // At another batch there is no time: the analytical estimate at that batch.
        let cost1 = MeasuredCost::new(&target, 1);
        let analytical1 = AnalyticalCost { symbol_value: 1, ..AnalyticalCost::default() };
        assert_eq!(cost1.cost(&node, Some(&op), &inputs, &out), analytical1.cost(&node, Some(&op), &inputs, &out));
        assert_eq!(cost1.priced()[0].note.as_deref(), Some("not profiled"));
        // Without measurements: exactly the analytical model at the pricing batch.
        let bare = CudaTarget::new(Arch::Sm90a);
        let cost = MeasuredCost::new(&bare, 8);
        let analytical = AnalyticalCost { symbol_value: 8, ..AnalyticalCost::default() };
        assert_eq!(cost.cost(&node, Some(&op), &inputs, &out), analytical.cost(&node, Some(&op), &inputs, &out));
        assert!(cost.priced()[0].measured_ms.is_none());
    }

    #[test]
    fn nchw_adds_the_analytical_transforms_and_the_stem_is_unfolded() {
        let probe = CudaTarget::new(Arch::Sm90a);
        // ResNet's stem (C = 3, 7x7/2 to 64) runs on the stem kernel: no library problem, priced
        // analytically.
        let resnet = Conv2d {
            layout: Layout::Nchw,
            geom: crate::ir::ops::kernel::ConvGeom { strides: [2, 2], pads: [3; 4], dilations: [1, 1], group: 1 },
            act: None,
            pre_act: None,
        };
        let (x, w, _, out) = conv_fact_args("2,3,224,224", &[64, 3, 7, 7], "2,64,112,112");
        let why = conv_problem(&resnet, &[Some(&x), Some(&w), None, None], &out, &probe).expect_err("the stem kernel");
        assert!(why.contains("own tensor-core kernel"), "{why}");
        // An NCHW 11x11/4 stem (too large for the stem kernel's shared memory): the problem is
        // the 1x1 product of its im2col patch matrix (11·11·3 = 363 columns, padded to 368), as
        // the lowering builds it.
        let op = Conv2d {
            layout: Layout::Nchw,
            geom: crate::ir::ops::kernel::ConvGeom { strides: [4, 4], pads: [2; 4], dilations: [1, 1], group: 1 },
            act: None,
            pre_act: None,
        };
        let (x, w, _, out) = conv_fact_args("2,3,224,224", &[64, 3, 11, 11], "2,64,55,55");
        let inputs = [Some(&x), Some(&w), None, None];
        let p = conv_problem(&op, &inputs, &out, &probe).expect("a library problem");
        assert_eq!((p.h, p.c, p.k, p.r, p.p, p.strides, p.pads), (55, 368, 64, 1, 55, [1, 1], [0; 4]));
        let sig = probe.conv_signature_at(&p, 1).expect("library");
        assert!(sig.starts_with("conv2d n2 h55 w55 c368 k64 r1 s1 p55 q55 pad0,0 str1,1 "), "{sig}");
        // Run-time weights are not padded: C = 3 goes to the direct kernel, no signature.
        let runtime_w = crate::ir::ops::testutil::fact(DType::F16, "64,3,7,7");
        let unpadded = conv_problem(&op, &[Some(&x), Some(&runtime_w), None, None], &out, &probe).expect("problem");
        assert_eq!(unpadded.c, 3);
        assert_eq!(probe.conv_signature_at(&unpadded, 1), None);

        let mut m = Measurements::new();
        m.entry(sig).or_default().insert("conv2d_sm80 64x64x32 w32x32x32 s5 kOptimized".into(), 0.1);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m);
        let cost = MeasuredCost::new(&target, 1);
        let a = cost.analytical().clone();
        let t = ONode::Transpose([Id::from(0usize); 2]);
        let want = 0.1e-3 + a.cost(&t, None, &[], &x) + a.cost(&t, None, &[], &out);
        let got = cost.cost(&ONode::Conv([Id::from(0usize); 4]), Some(&op), &inputs, &out);
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");

        // One input channel, 1x1 (no im2col: padded to 4 channels for the kernel): the input
        // needs no transform, the output does.
        let op = Conv2d { geom: crate::ir::ops::kernel::ConvGeom { strides: [1, 1], pads: [0; 4], ..op.geom }, ..op };
        let (x, w, _, out) = conv_fact_args("2,1,16,16", &[8, 1, 1, 1], "2,8,16,16");
        let inputs = [Some(&x), Some(&w), None, None];
        let p = conv_problem(&op, &inputs, &out, &probe).expect("a library problem");
        assert_eq!((p.c, p.r), (4, 1));
        let mut m = Measurements::new();
        let sig = probe.conv_signature_at(&p, 1).expect("library");
        m.entry(sig).or_default().insert("conv2d_sm80 64x64x32 w32x32x32 s5 kFixedChannels a4".into(), 0.1);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m);
        let cost = MeasuredCost::new(&target, 1);
        let want = 0.1e-3 + a.cost(&t, None, &[], &out);
        let got = cost.cost(&ONode::Conv([Id::from(0usize); 4]), Some(&op), &inputs, &out);
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");
    }

    #[test]
    fn gemm_problems_follow_the_lowering() {
        use crate::ir::ops::testutil::fact;
        // [N,S,K] x [K,N'] + per-column bias: folded into one [N·S, K] product.
        let g = Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: Some(Act::Relu) };
        let (a, b, bias, out) = (
            fact(DType::F32, "N,128,768"),
            fact(DType::F32, "768,3072"),
            fact(DType::F32, "3072"),
            fact(DType::F32, "N,128,3072"),
        );
        let p = gemm_problem(&g, &[Some(&a), Some(&b), Some(&bias), None], &out).expect("library problem");
        assert_eq!(p.batch_count, Dim::known(1));
        assert_eq!(p.m, Dim::sym("N").mul(&Dim::known(128)));
        assert_eq!((p.n.clone(), p.k.clone()), (Dim::known(3072), Dim::known(768)));
        assert!(!p.a_batched && !p.b_batched && p.bias == Some(BiasKind::PerColumn));
        let target = CudaTarget::new(Arch::Sm90a);
        let sig = target.gemm_signature_at(&p, 8).expect("library");
        assert!(sig.starts_with("gemm b1 m1024 n3072 k768 "), "{sig}");
        // A per-row bias: general broadcast, not folded, and the target runs the generic kernel.
        let row_bias = fact(DType::F32, "128,1");
        let p = gemm_problem(&g, &[Some(&a), Some(&b), Some(&row_bias), None], &out).expect("problem");
        assert_eq!(p.bias, Some(BiasKind::General));
        assert_eq!(p.batch_count, Dim::sym("N"));
        assert_eq!(target.gemm_signature_at(&p, 8), None);
        // Batched A x batched B (attention scores).
        let (q, kt, s) =
            (fact(DType::F32, "N,12,128,64"), fact(DType::F32, "N,12,64,128"), fact(DType::F32, "N,12,128,128"));
        let p = gemm_problem(&Gemm::matmul(), &[Some(&q), Some(&kt), None, None], &s).expect("problem");
        assert!(p.a_batched && p.b_batched);
        assert_eq!(p.batch_count, Dim::sym("N").mul(&Dim::known(12)));
        // Partial broadcast: not a library problem.
        let (a, b, o) = (fact(DType::F32, "2,1,8,16"), fact(DType::F32, "1,3,16,8"), fact(DType::F32, "2,3,8,8"));
        assert!(gemm_problem(&Gemm::matmul(), &[Some(&a), Some(&b), None, None], &o).is_err());
        // Integers never reach the library.
        let (a, b, o) = (fact(DType::I64, "8,16"), fact(DType::I64, "16,8"), fact(DType::I64, "8,8"));
        assert!(gemm_problem(&Gemm::matmul(), &[Some(&a), Some(&b), None, None], &o).is_err());
    }

    #[test]
    fn measured_time_flips_the_fusion_choice() {
        let g = conv_relu("1,64,28,28", &[64, 64, 3, 3]);
        let opts = OptimizeOptions::standard().expect("rules");
        let sigs = signatures(&g, 1);
        // The e-graph offers the conv with relu fused and without (relu as its own kernel).
        let fused = sigs.iter().find(|s| s.contains("bias1 res0 pre:id act:Relu")).expect("fused form").clone();
        let plain = sigs.iter().find(|s| s.contains("bias1 res0 pre:id act:id")).expect("unfused form").clone();
        let cfg = "conv2d_sm80 64x64x32 w32x32x32 s5 kOptimized";
        // A recording target collects both forms for the profiler.
        let probe = CudaTarget::new(Arch::Sm90a).recording();
        optimize_measured(&g, &opts, &probe, 1, &BTreeMap::new()).expect("optimises");
        let recorded: Vec<String> = probe.recorded().into_iter().map(|p| p.signature).collect();
        assert!(recorded.contains(&fused) && recorded.contains(&plain), "{recorded:?}");

        // By default (and with a fast fused kernel) the relu is fused.
        let (analytical, _) = optimize(&g, &opts).expect("optimises");
        let acts = |g: &Graph| -> Vec<Option<Act>> {
            g.nodes.iter().filter_map(|n| n.op.downcast_ref::<Conv2d>()).map(|c| c.act).collect()
        };
        assert_eq!(acts(&analytical), [Some(Act::Relu)]);

        let mut m = Measurements::new();
        m.entry(fused.clone()).or_default().insert(cfg.into(), 0.001);
        m.entry(plain.clone()).or_default().insert(cfg.into(), 0.002);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m.clone());
        let (fast_fused, report) = optimize_measured(&g, &opts, &target, 1, &BTreeMap::new()).expect("optimises");
        assert_eq!(acts(&fast_fused), [Some(Act::Relu)]);
        let cost = MeasuredCost::new(&target, 1);
        let (opt, _) = optimize_with_cost(&g, &opts, &cost).expect("optimises");
        let costs = cost.kernel_costs(&opt);
        assert_eq!((costs.measured, costs.total), (1, 1));
        // 1 µs measured, plus the layout transforms when the conv stayed NCHW.
        assert!(costs.kernels[0].measured && costs.kernels[0].us >= 1.0 - 1e-9, "{costs}");
        assert!(costs.problems_priced >= 2 && costs.problems_measured == 2, "{costs}");
        let text = costs.to_string();
        assert!(text.contains("measured") && text.contains("1 of 1 conv/gemm costs measured"), "{text}");
        assert!(report.cost_after > 0.0);

        // The fused kernel measured very slow: the conv runs plain and the relu on its own.
        m.get_mut(&fused).expect("fused").insert(cfg.into(), 50.0);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m);
        let cost = MeasuredCost::new(&target, 1);
        let (slow_fused, _) = optimize_with_cost(&g, &opts, &cost).expect("optimises");
        assert_eq!(acts(&slow_fused), [None]);
        assert!(slow_fused.nodes.len() >= 2, "the relu runs as its own kernel");
        let costs = cost.kernel_costs(&slow_fused);
        assert_eq!(costs.kernels[0].signature.as_deref(), Some(plain.as_str()));
        assert!(costs.kernels[0].measured);
        // The result still computes what the model computes.
        let x = seeded(&[1, 64, 28, 28], 5);
        let inputs: BTreeMap<String, Tensor> = [("x".to_string(), x)].into_iter().collect();
        let want = crate::reference::run(&g, &inputs).expect("runs");
        let got = crate::reference::run(&slow_fused, &inputs).expect("runs");
        let (w, o) = (want[0].1.to_f64_vec(), got[0].1.to_f64_vec());
        assert!(w.iter().zip(&o).all(|(a, b)| (a - b).abs() <= 1e-4 * (1.0 + a.abs())));
    }

    #[test]
    fn dims_are_bound_before_pricing() {
        use crate::ir::ops::testutil::fact;
        let g = Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: None };
        let (a, b, out) = (fact(DType::F16, "N,seq,64"), fact(DType::F16, "256,64"), fact(DType::F16, "N,seq,256"));
        let target = CudaTarget::new(Arch::Sm90a);
        let bound = MeasuredCost::new(&target, 4).with_dims([("seq".to_string(), 128)].into_iter().collect());
        bound.cost(&gemm_node(), Some(&g), &[Some(&a), Some(&b), None, None], &out);
        let sig = bound.priced()[0].signature.clone().expect("library");
        assert!(sig.starts_with("gemm b1 m512 n256 k64 "), "{sig}");
        // With a time for that signature, the gemm costs it.
        let mut m = Measurements::new();
        m.entry(sig).or_default().insert("gemm_sm80 64x64x32 w32x32x32 s5".into(), 0.02);
        let target = CudaTarget::new(Arch::Sm90a).with_measurements(m);
        let cost = MeasuredCost::new(&target, 4).with_dims([("seq".to_string(), 128)].into_iter().collect());
        let s = cost.cost(&gemm_node(), Some(&g), &[Some(&a), Some(&b), None, None], &out);
        assert!((s - 20e-6).abs() < 1e-15, "{s}");
        // Unbound, seq takes the pricing batch as well: another problem, not profiled.
        let unbound = MeasuredCost::new(&target, 4);
        unbound.cost(&gemm_node(), Some(&g), &[Some(&a), Some(&b), None, None], &out);
        let p = &unbound.priced()[0];
        assert!(p.signature.as_deref().is_some_and(|s| s.starts_with("gemm b1 m16 n256 k64 ")), "{p:?}");
        assert_eq!(p.note.as_deref(), Some("not profiled"));
    }
}
