//! Timing of the CPU reference executor on ResNet-50 (batch 1, 224x224, f32).
//!
//! Requirement: <= 2 s per run in a release build on the 2-core development machine. Run with
//! `cargo test --release --test reference_bench -- --ignored --nocapture`.
//!
//! Uses `onnx_models/generated/resnet50.onnx` when it exists and imports; otherwise it builds the
//! same network (ResNet-50 v1.5 conv stack: stem, 16 bottlenecks, global pool, classifier)
//! directly from IR ops, so the timing does not depend on the importer
//! (`ONNX2AIT_BENCH_SYNTHETIC=1` forces the synthetic network).

use onnx2ait::ir::infer::infer_graph;
use onnx2ait::ir::ops::registry;
use onnx2ait::ir::{Attr, Attributes, DType, Dim, Graph, Node, NodeCtx, Tensor, ValueId, ValueType};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Deterministic pseudo-random values in [-scale, scale).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: &[usize], scale: f32) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32s(shape, (0..n).map(|_| self.next() * scale).collect())
    }
}

struct Builder {
    g: Graph,
    rng: Lcg,
    count: usize,
}

impl Builder {
    fn konst(&mut self, t: Tensor) -> ValueId {
        let name = format!("c{}", self.g.values.len());
        let id =
            self.g.add_value(name, Some(ValueType::new(t.dtype(), t.shape().iter().map(|&d| Dim::from(d)).collect())));
        self.g.values[id].konst = Some(Arc::new(t));
        id
    }

    /// Adds a node through the op registry; `None` when the op type is not registered.
    fn node(&mut self, op: &str, inputs: &[ValueId], attrs: &[(&str, Attr)]) -> Option<ValueId> {
        let spec = registry().lookup("", op)?;
        let attrs: Attributes = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        let present = vec![true; inputs.len()];
        let ctx = NodeCtx {
            name: op,
            op_type: op,
            domain: "",
            opset: 17,
            attrs: &attrs,
            inputs_present: &present,
            num_outputs: 1,
        };
        let parsed = (spec.parse)(&ctx).expect("bench node parses");
        self.count += 1;
        let out = self.g.add_value(format!("v{}", self.count), None);
        self.g.nodes.push(Node {
            name: format!("n{}", self.count),
            op_type: op.into(),
            domain: String::new(),
            op: parsed,
            inputs: inputs.iter().map(|&i| Some(i)).collect(),
            outputs: vec![out],
        });
        Some(out)
    }

    fn relu(&mut self, x: ValueId) -> ValueId {
        self.node("Relu", &[x], &[]).unwrap_or(x)
    }

    /// Conv (no bias) + BatchNormalization, like an exported torchvision model.
    fn conv_bn(&mut self, x: ValueId, cin: usize, cout: usize, k: usize, stride: usize) -> ValueId {
        let scale = (2.0 / (cin * k * k) as f32).sqrt();
        let w = self.rng.tensor(&[cout, cin, k, k], scale);
        let w = self.konst(w);
        let p = (k / 2) as i64;
        let attrs = [("strides", Attr::Ints(vec![stride as i64; 2])), ("pads", Attr::Ints(vec![p; 4]))];
        let y = self.node("Conv", &[x, w], &attrs).expect("Conv is registered");
        let gamma = Tensor::full(DType::F32, &[cout], 1.0);
        let beta = self.rng.tensor(&[cout], 0.1);
        let mean = self.rng.tensor(&[cout], 0.1);
        let var = Tensor::full(DType::F32, &[cout], 1.0);
        let ids: Vec<ValueId> = [gamma, beta, mean, var].into_iter().map(|t| self.konst(t)).collect();
        self.node("BatchNormalization", &[y, ids[0], ids[1], ids[2], ids[3]], &[])
            .expect("BatchNormalization is registered")
    }
}

/// ResNet-50 v1.5 built from IR ops (ops of other families are used when registered).
fn synthetic_resnet50() -> Graph {
    let mut b = Builder { g: Graph::default(), rng: Lcg(42), count: 0 };
    b.g.info.source = "synthetic-resnet50".into();
    let x = b.g.add_value(
        "input".into(),
        Some(ValueType::new(DType::F32, vec![Dim::known(1), Dim::known(3), Dim::known(224), Dim::known(224)])),
    );
    b.g.inputs.push(x);
    let mut h = b.conv_bn(x, 3, 64, 7, 2);
    h = b.relu(h);
    let pool = [
        ("kernel_shape", Attr::Ints(vec![3, 3])),
        ("strides", Attr::Ints(vec![2, 2])),
        ("pads", Attr::Ints(vec![1; 4])),
    ];
    h = b.node("MaxPool", &[h], &pool).expect("MaxPool is registered");
    let mut cin = 64;
    for (stage, &(width, blocks)) in [(64, 3), (128, 4), (256, 6), (512, 3)].iter().enumerate() {
        for blk in 0..blocks {
            let stride = if blk == 0 && stage > 0 { 2 } else { 1 };
            let cout = width * 4;
            let mut y = b.conv_bn(h, cin, width, 1, 1);
            y = b.relu(y);
            y = b.conv_bn(y, width, width, 3, stride);
            y = b.relu(y);
            y = b.conv_bn(y, width, cout, 1, 1);
            let shortcut = if blk == 0 { b.conv_bn(h, cin, cout, 1, stride) } else { h };
            y = b.node("Add", &[y, shortcut], &[]).unwrap_or(y);
            h = b.relu(y);
            cin = cout;
        }
    }
    h = b.node("GlobalAveragePool", &[h], &[]).expect("GlobalAveragePool is registered");
    if let Some(flat) = b.node("Flatten", &[h], &[]) {
        let w = b.rng.tensor(&[1000, 2048], 0.03);
        let w = b.konst(w);
        let bias = b.rng.tensor(&[1000], 0.01);
        let bias = b.konst(bias);
        h = b.node("Gemm", &[flat, w, bias], &[("transB", Attr::Int(1))]).expect("Gemm is registered");
    }
    b.g.outputs.push(h);
    infer_graph(&mut b.g).expect("synthetic ResNet-50 infers");
    b.g
}

/// The bundled model, or the synthetic network when it is missing, does not import, or
/// `ONNX2AIT_BENCH_SYNTHETIC=1` asks for it.
fn load_or_build() -> Graph {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/generated/resnet50.onnx");
    if std::env::var("ONNX2AIT_BENCH_SYNTHETIC").is_ok_and(|v| v == "1") {
        println!("ONNX2AIT_BENCH_SYNTHETIC=1: using the synthetic ResNet-50");
    } else if path.exists() {
        match onnx2ait::onnx::load_model(&path) {
            Ok(g) => {
                println!("model: {}", path.display());
                return g;
            }
            Err(e) => println!("cannot import {} ({e}); using the synthetic ResNet-50", path.display()),
        }
    } else {
        println!("{} not found; using the synthetic ResNet-50", path.display());
    }
    synthetic_resnet50()
}

#[test]
#[ignore = "timing: run in release with --ignored --nocapture"]
fn reference_resnet50_batch1() {
    let g = load_or_build();
    let mut rng = Lcg(7);
    let inputs: BTreeMap<String, Tensor> = g
        .inputs
        .iter()
        .map(|&id| {
            let ty = g.ty(id);
            // Symbolic dims (the batch) are bound to 1.
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_known().unwrap_or(1) as usize).collect();
            (g.values[id].name.clone(), rng.tensor(&shape, 1.0).cast(ty.dtype))
        })
        .collect();
    let nodes = g.nodes.len();
    let t0 = Instant::now();
    let out = onnx2ait::reference::run(&g, &inputs).expect("ResNet-50 runs");
    let first = t0.elapsed().as_secs_f64() * 1e3;
    assert!(out.iter().all(|(_, t)| t.to_f64_vec().iter().all(|v| v.is_finite())), "outputs must be finite");
    let runs = 5;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        onnx2ait::reference::run(&g, &inputs).expect("ResNet-50 runs");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let mean = times.iter().sum::<f64>() / runs as f64;
    println!(
        "reference ResNet-50 batch 1 ({nodes} nodes): first {first:.1} ms, min {:.1} ms, median {:.1} ms, mean {mean:.1} ms per run",
        times[0],
        times[runs / 2]
    );
    if !cfg!(debug_assertions) {
        assert!(times[runs / 2] <= 2000.0, "ResNet-50 must run in <= 2 s per run, median {:.1} ms", times[runs / 2]);
    }
}
