//! Optimisation-time benchmark (issue 4): `cargo test --release --test optimiser_bench -- --ignored --nocapture`
//! (or `scripts/bench-optimiser.sh`). Prints the time `egraph::optimize` takes on the generated
//! ResNet-50 and 12-layer BERT-base graphs (onnx_models/generated/, made by scripts/gen-models.sh)
//! and the kernel counts; the targets are ResNet-50 ≤ 1 s and BERT-12 ≤ 3 s in release.

use onnx2ait::egraph::{optimize, OptimizeOptions};
use std::path::Path;
use std::time::Instant;

fn bench(path: &str) {
    if !Path::new(path).exists() {
        println!("{path}: not generated (scripts/gen-models.sh), skipped");
        return;
    }
    let g = onnx2ait::onnx::load_model(Path::new(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let mut best = f64::INFINITY;
    let mut report = None;
    for _ in 0..3 {
        let t = Instant::now();
        let (_, r) = optimize(&g, &opts).unwrap_or_else(|e| panic!("{path}: {e}"));
        best = best.min(t.elapsed().as_secs_f64());
        report = Some(r);
    }
    let r = report.expect("ran at least once");
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|p| format!("{} {:.0} ms ({} it, {}, {} nodes)", p.name, p.time_ms, p.iterations, p.stop_reason, p.nodes))
        .collect();
    println!("{path}: optimisation {:.3} s (best of 3)", best);
    println!("  phases: {}", phases.join("; "));
    println!("  kernels: {:?}", r.kernels_after);
}

#[test]
#[ignore = "benchmark: run in release with --ignored"]
fn optimisation_time() {
    bench("onnx_models/generated/resnet50.onnx");
    bench("onnx_models/generated/bert12.onnx");
    bench(".venv/lib/python3.11/site-packages/onnx/backend/test/data/light/light_resnet50.onnx");
}
