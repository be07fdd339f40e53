//! `onnx2ait bench OUT [--batch 1,8,64,256] [--warmup 20] [--iters 100] [--json]`: time the
//! compiled model of OUT on the GPU at each batch.
//!
//! How it measures (`o2a_bench` in the generated model.cu): the inputs are filled once on the
//! device with random non-zero values; one run is waited for (lazy initialisation, errors);
//! then `--warmup` untimed runs, then `--iters` runs back to back on one stream with a GPU event
//! recorded between each two, and the median of the per-run event times is reported. Once with
//! the run captured into a graph (a CUDA graph) (one graph launch per run: what a serving loop should do)
//! and once with plain kernel launches (which adds the CPU's launch overhead wherever the GPU
//! is faster than the launches). Host-device copies are not timed.

use super::validate::parse_batch;
use super::Failure;
use clap::Args;
use onnx2ait::runtime::{Library, Model};
use serde::Serialize;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The build folder (`onnx2ait MODEL -o OUT`), holding libmodel.so and weights.bin.
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Batch sizes, comma-separated (default: 1 and the largest batch the model was built for).
    #[arg(long, value_name = "B,B,…", value_delimiter = ',', value_parser = parse_batch)]
    pub batch: Vec<i64>,
    /// Untimed runs before timing, per batch and mode.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,
    /// Timed runs per batch and mode (the median is reported).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
    /// Print the results as JSON: [{"batch", "graph_median_ms", "median_ms"}, …].
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Row {
    batch: i64,
    /// Median ms per run, replaying a captured graph.
    graph_median_ms: f64,
    /// Median ms per run, launching every kernel.
    median_ms: f64,
}

pub fn run(a: &BenchArgs) -> Result<u8, Failure> {
    let lib = Library::open(&a.out)?;
    let batches = if a.batch.is_empty() {
        let mut v = vec![1, lib.max_batch()];
        v.dedup();
        v
    } else {
        a.batch.clone()
    };
    // All batches are checked before the GPU is touched.
    for &b in &batches {
        lib.check_batch(b)?;
    }
    let mut model = Model::create(lib)?;
    let mut rows = Vec::with_capacity(batches.len());
    for &b in &batches {
        let graph = model.bench(b, a.warmup, a.iters, true)?;
        let plain = model.bench(b, a.warmup, a.iters, false)?;
        rows.push(Row { batch: b, graph_median_ms: f64::from(graph), median_ms: f64::from(plain) });
    }
    if a.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| Failure::new(1, e.to_string()))?;
        super::emit(&format!("{text}\n"));
        return Ok(0);
    }
    let lib = model.library();
    let mut text = format!(
        "model '{}' from {} on {}: median of {} runs after {} warm-up runs\n\n",
        lib.model_name(),
        lib.path().display(),
        model.device_name(),
        a.iters,
        a.warmup
    );
    text.push_str(&table(&rows));
    super::emit(&text);
    Ok(0)
}

/// Right-aligned columns: batch, ms replaying a graph, ms with plain launches, images/s (graph).
fn table(rows: &[Row]) -> String {
    let header = ["batch", "graph ms", "launch ms", "images/s"];
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            let per_s = if r.graph_median_ms > 0.0 { r.batch as f64 * 1000.0 / r.graph_median_ms } else { f64::NAN };
            [
                r.batch.to_string(),
                format!("{:.3}", r.graph_median_ms),
                format!("{:.3}", r.median_ms),
                format!("{per_s:.1}"),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for c in &cells {
        for (w, s) in widths.iter_mut().zip(c) {
            *w = (*w).max(s.len());
        }
    }
    let line = |c: &[String]| {
        let parts: Vec<String> = c.iter().zip(widths).map(|(s, w)| format!("{s:>w$}")).collect();
        parts.join("  ") + "\n"
    };
    let mut out = line(&header.map(String::from));
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for c in &cells {
        out.push_str(&line(c));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parse() {
        use super::super::{Cli, Command};
        use clap::Parser;
        let c =
            Cli::try_parse_from(["onnx2ait", "bench", "out", "--batch", "1,8,64", "--iters", "7", "--json"]).unwrap();
        let Some(Command::Bench(a)) = c.command else { panic!("not bench: {c:?}") };
        assert_eq!((a.batch, a.warmup, a.iters, a.json), (vec![1, 8, 64], 20, 7, true));
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--batch", "0"]).is_err());
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--iters", "0"]).is_err());
        let c = Cli::try_parse_from(["onnx2ait", "run", "out", "--input", "x=x.npy", "--batch", "2"]).unwrap();
        let Some(Command::Run(r)) = c.command else { panic!("not run: {c:?}") };
        assert_eq!((r.inputs, r.batch, r.output_dir), (vec![("x".to_string(), PathBuf::from("x.npy"))], Some(2), None));
    }

    #[test]
    fn table_and_json_shapes() {
        let rows = vec![
            Row { batch: 1, graph_median_ms: 0.5, median_ms: 0.75 },
            Row { batch: 64, graph_median_ms: 4.0, median_ms: 4.25 },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "batch  graph ms  launch ms  images/s");
        assert_eq!(lines[2], "    1     0.500      0.750    2000.0");
        assert_eq!(lines[3], "   64     4.000      4.250   16000.0");
        let j: serde_json::Value = serde_json::to_value(&rows).unwrap();
        assert_eq!(j[1], serde_json::json!({"batch": 64, "graph_median_ms": 4.0, "median_ms": 4.25}));
    }
}
