//! `onnx2ait bench OUT [--batch 1,8,64,256] [--dim NAME=V …] [--warmup 20] [--iters 100]
//! [--kernels [--kernel-top N]] [--json]`: time the compiled model of OUT on the GPU at each
//! batch (a build's other run-time dims at their `--dim` value, else at their largest).
//!
//! How it measures (`o2a_bench` in the generated model.cu): the inputs are filled once on the
//! device with random non-zero values; one run is waited for (lazy initialisation, errors);
//! then `--warmup` untimed runs, then `--iters` runs back to back on one stream with a GPU event
//! recorded between each two, and the median of the per-run event times is reported. Once with
//! the run captured into a graph (a CUDA graph) (one graph launch per run: what a serving loop should do)
//! and once with plain kernel launches (which adds the CPU's launch overhead wherever the GPU
//! is faster than the launches). Host-device copies are not timed.
//!
//! `--kernels` (`o2a_kernel_times`) then times each kernel: `--iters` more runs with plain
//! launches and a GPU event before each kernel and after the last, each run waited for; a
//! kernel's time is the median of its event-to-event times. It includes any wait of the GPU for
//! the next launch, so at small batches, where launching is slower than the kernels, the times
//! show launch overhead; their sum is then close to the plain-launch median, above the graph
//! replay.
//!
//! Each kernel's work (build.json's `kernels[].work`, counted as `Program::kernel_work`
//! documents: flops with a multiply-add as 2, bytes the minimum traffic) is evaluated at the
//! batch's run-time dims and divided by its time: achieved TFLOP/s and GB/s, and with
//! `--peak-tflops` / `--peak-gbps` their share of those reference ceilings.

use super::validate::parse_batch;
use super::Failure;
use clap::Args;
use onnx2ait::runtime::{Library, Model, WorkAt};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// The build folder (`onnx2ait MODEL -o OUT`), holding libmodel.so and weights.bin.
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Batch sizes, comma-separated (default: 1 and the largest batch the model was built for).
    #[arg(long, value_name = "B,B,…", value_delimiter = ',', value_parser = parse_batch)]
    pub batch: Vec<i64>,
    /// Value of a run-time dim other than the batch (repeatable): --dim seq=128. Default: its
    /// largest value.
    #[arg(long = "dim", value_name = "NAME=V", value_parser = super::validate::parse_dim)]
    pub dims: Vec<(String, i64)>,
    /// Untimed runs before timing, per batch and mode.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,
    /// Timed runs per batch and mode (the median is reported).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
    /// Also time each kernel (plain launches, a GPU event before each kernel) and print, per
    /// batch, the kernels slowest first with their share of the time.
    #[arg(long)]
    pub kernels: bool,
    /// With --kernels: how many of the slowest kernels to print per batch (0: all; JSON always
    /// has all).
    #[arg(long, value_name = "N", default_value_t = 25, requires = "kernels")]
    pub kernel_top: usize,
    /// With --kernels: a reference compute ceiling in TFLOP/s (e.g. a measured fp16 GEMM's);
    /// adds each kernel's achieved TFLOP/s as a % of it. Without it no % is printed.
    #[arg(long, value_name = "TFLOPS", requires = "kernels", value_parser = parse_peak)]
    pub peak_tflops: Option<f64>,
    /// With --kernels: a reference memory ceiling in GB/s (e.g. a measured device copy's); adds
    /// each kernel's achieved GB/s as a % of it. Without it no % is printed.
    #[arg(long, value_name = "GBPS", requires = "kernels", value_parser = parse_peak)]
    pub peak_gbps: Option<f64>,
    /// Print the results as JSON: [{"batch", "dims", "graph_median_ms", "median_ms"}, …] ("dims":
    /// every run-time dim's value by name); with --kernels,
    /// each batch also has "kernels": [{"name", "node", "ms", "flops", "bytes", "tflops",
    /// "gbps"}, …] in run order (work per launch at the batch's dims, null where unknown or, for
    /// flops, not counted).
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Row {
    batch: i64,
    /// Every run-time dim's value (the batch included), by name.
    dims: std::collections::BTreeMap<String, i64>,
    /// Median ms per run, replaying a captured graph.
    graph_median_ms: f64,
    /// Median ms per run, launching every kernel.
    median_ms: f64,
    /// With --kernels: each kernel's median ms, in run order.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels: Option<Vec<KernelTime>>,
}

#[derive(Serialize)]
struct KernelTime {
    /// "k012_conv2d_library".
    name: String,
    /// The graph node(s) the kernel computes.
    node: String,
    ms: f64,
    /// Floating-point operations of one launch at this batch's dims (multiply-add = 2); `None`
    /// where the build states no work or counts no arithmetic for the kernel.
    flops: Option<i64>,
    /// Minimum bytes one launch reads and writes; `None` where the build states no work.
    bytes: Option<i64>,
    /// Achieved TFLOP/s: `flops` over `ms`.
    tflops: Option<f64>,
    /// Achieved GB/s (10⁹ bytes/s): `bytes` over `ms`.
    gbps: Option<f64>,
}

impl KernelTime {
    /// A kernel's time with the work it did in it (`flops` 0 counts as none).
    fn new(name: String, node: String, ms: f64, work: Option<WorkAt>) -> KernelTime {
        let flops = work.map(|w| w.flops).filter(|&f| f > 0);
        let bytes = work.map(|w| w.bytes);
        KernelTime { name, node, ms, flops, bytes, tflops: per_s(flops, ms, 1e12), gbps: per_s(bytes, ms, 1e9) }
    }
}

/// `amount` per second in units of `unit` over `ms` (none for no amount or no time).
fn per_s(amount: Option<i64>, ms: f64, unit: f64) -> Option<f64> {
    amount.filter(|_| ms > 0.0).map(|a| a as f64 / (ms * 1e-3) / unit)
}

/// The reference ceilings the achieved throughputs are shown against (`--peak-tflops`,
/// `--peak-gbps`).
#[derive(Clone, Copy, Debug, Default)]
struct Peaks {
    tflops: Option<f64>,
    gbps: Option<f64>,
}

fn parse_peak(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a ceiling (a positive number)")),
    }
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
    // All dims are checked before the GPU is touched.
    let named = super::checks::check_dims_given(&a.dims)?;
    if let Some(b) = lib.batch_symbol().filter(|s| named.contains_key(*s)) {
        return Err(Failure::new(1, format!("--dim {b}=…: '{b}' is the batch; give it with --batch")));
    }
    let points: Vec<(i64, Vec<i64>)> =
        batches.iter().map(|&b| Ok((b, lib.dims_at(b, &named)?))).collect::<Result<_, Failure>>()?;
    let mut model = Model::create(lib)?;
    let mut rows = Vec::with_capacity(points.len());
    for (b, dims) in points {
        let graph = model.bench(&dims, a.warmup, a.iters, true)?;
        let plain = model.bench(&dims, a.warmup, a.iters, false)?;
        let kernels = if a.kernels {
            let ms = model.kernel_times(&dims, a.warmup, a.iters)?;
            let lib = model.library();
            Some(
                lib.kernels()
                    .iter()
                    .zip(ms)
                    .enumerate()
                    .map(|(i, (k, ms))| {
                        KernelTime::new(k.name.clone(), k.node.clone(), f64::from(ms), lib.kernel_work_at(i, &dims))
                    })
                    .collect(),
            )
        } else {
            None
        };
        let by_name = model.library().run_dims().iter().map(|d| d.symbol.clone()).zip(dims).collect();
        rows.push(Row {
            batch: b,
            dims: by_name,
            graph_median_ms: f64::from(graph),
            median_ms: f64::from(plain),
            kernels,
        });
    }
    if a.json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| Failure::new(1, e.to_string()))?;
        super::emit(&format!("{text}\n"));
        return Ok(0);
    }
    let lib = model.library();
    // The run-time dims other than the batch, the same in every row.
    let others: Vec<String> = rows
        .first()
        .map(|r| {
            r.dims
                .iter()
                .filter(|(k, _)| Some(k.as_str()) != lib.batch_symbol())
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        })
        .unwrap_or_default();
    let others = if others.is_empty() { String::new() } else { format!(", at {}", others.join(", ")) };
    let mut text = format!(
        "model '{}' from {} on {}: median of {} runs after {} warm-up runs{others}\n\n",
        lib.model_name(),
        lib.path().display(),
        model.device_name(),
        a.iters,
        a.warmup
    );
    text.push_str(&table(&rows));
    for r in &rows {
        if let Some(k) = &r.kernels {
            text.push('\n');
            let peaks = Peaks { tflops: a.peak_tflops, gbps: a.peak_gbps };
            text.push_str(&kernel_table(r.batch, k, r.median_ms, a.kernel_top, peaks));
        }
    }
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

/// The node column's width limit: fused kernels list every node they compute.
const NODE_WIDTH: usize = 60;

/// One batch's kernels, slowest first: rank, ms, % of the kernels' sum, cumulative %, work
/// (GFLOP, MB) and achieved throughput (TFLOP/s, GB/s; with `peaks`, each as a % of its
/// ceiling), kernel, node; at most `top` rows (0: all), then what the other rows add up to,
/// and the kernels' sums (time, work, throughput over the summed time) next to `plain_ms`, the
/// plain-launch median of the same batch. Work the build does not state shows `-`.
fn kernel_table(batch: i64, kernels: &[KernelTime], plain_ms: f64, top: usize, peaks: Peaks) -> String {
    let mut out = String::new();
    if kernels.is_empty() {
        let _ = writeln!(out, "batch {batch}: the model has no kernels");
        return out;
    }
    let _ = writeln!(
        out,
        "batch {batch}: {} kernels, slowest first (plain launches, a GPU event before each kernel; a kernel's \
         time includes any wait for its launch)",
        kernels.len()
    );
    let sum: f64 = kernels.iter().map(|k| k.ms).sum();
    let pct = |ms: f64| if sum > 0.0 { format!("{:.1}%", 100.0 * ms / sum) } else { "-".to_string() };
    let mut order: Vec<&KernelTime> = kernels.iter().collect();
    // Stable: equal times keep run order.
    order.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let shown = if top == 0 { order.len() } else { top.min(order.len()) };
    let mut header: Vec<&str> = vec!["rank", "ms", "%", "cum %", "GFLOP", "TFLOP/s"];
    if peaks.tflops.is_some() {
        header.push("%peak");
    }
    header.extend(["MB", "GB/s"]);
    if peaks.gbps.is_some() {
        header.push("%peak");
    }
    header.extend(["kernel", "node"]);
    let mut cum = 0.0;
    let cells: Vec<Vec<String>> = order[..shown]
        .iter()
        .enumerate()
        .map(|(i, k)| {
            cum += k.ms;
            let mut c = vec![(i + 1).to_string(), format!("{:.3}", k.ms), pct(k.ms), pct(cum)];
            c.extend(work_cells(k.flops, k.tflops, 1e9, peaks.tflops));
            c.extend(work_cells(k.bytes, k.gbps, 1e6, peaks.gbps));
            c.extend([k.name.clone(), short_node(&k.node, NODE_WIDTH)]);
            c
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for c in &cells {
        for (w, s) in widths.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    // Numbers right-aligned, names left-aligned; the last column unpadded.
    let names = header.len() - 2;
    let line = |c: &[String]| {
        let mut parts: Vec<String> = c[..names].iter().zip(&widths).map(|(s, &w)| format!("{s:>w$}")).collect();
        parts.push(format!("{:<w$}", c[names], w = widths[names]));
        parts.push(c[names + 1].clone());
        parts.join("  ").trim_end().to_string() + "\n"
    };
    out.push_str(&line(&header.iter().map(|h| h.to_string()).collect::<Vec<_>>()));
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    out.push('\n');
    for c in &cells {
        out.push_str(&line(c));
    }
    if shown < order.len() {
        let rest: f64 = order[shown..].iter().map(|k| k.ms).sum();
        let _ = writeln!(
            out,
            "… {} more kernels: {:.3} ms, {} (--kernel-top 0 lists all)",
            order.len() - shown,
            rest,
            pct(rest)
        );
    }
    let share = if plain_ms > 0.0 { format!(" ({:.1}% of it)", 100.0 * sum / plain_ms) } else { String::new() };
    let _ = writeln!(out, "sum of the kernel times {sum:.3} ms; plain-launch median {plain_ms:.3} ms{share}");
    let _ = writeln!(out, "{}", work_total(kernels, sum));
    out
}

/// The work columns of one kernel: the amount in `unit`s (GFLOP: 1e9, MB: 1e6), the achieved
/// rate and, with a ceiling, the rate as a % of it; `-` where the amount is unknown.
fn work_cells(amount: Option<i64>, rate: Option<f64>, unit: f64, peak: Option<f64>) -> Vec<String> {
    let mut c = vec![amount.map_or("-".into(), |a| significant(a as f64 / unit)), rate.map_or("-".into(), significant)];
    if let Some(p) = peak {
        c.push(rate.map_or("-".into(), |r| format!("{:.1}%", 100.0 * r / p)));
    }
    c
}

/// The kernels' summed work and its rate over their summed time `ms`, counting only the
/// kernels whose work is known (how many are not, when some are not).
fn work_total(kernels: &[KernelTime], ms: f64) -> String {
    let flops: i64 = kernels.iter().filter_map(|k| k.flops).fold(0, i64::saturating_add);
    let bytes: i64 = kernels.iter().filter_map(|k| k.bytes).fold(0, i64::saturating_add);
    let unknown = kernels.iter().filter(|k| k.bytes.is_none()).count();
    let rate = |a: i64, unit: f64| per_s(Some(a), ms, unit).map_or("-".into(), significant);
    let mut text = format!(
        "work of the kernels: {} GFLOP ({} TFLOP/s), {} MB ({} GB/s) over the sum of their times",
        significant(flops as f64 / 1e9),
        rate(flops, 1e12),
        significant(bytes as f64 / 1e6),
        rate(bytes, 1e9)
    );
    if unknown > 0 {
        // A build from before the work was recorded, or a build.json of another build.
        let _ = write!(text, "; {unknown} kernel(s) without recorded work");
    }
    text
}

/// A positive figure with about three significant digits, without exponents (table cells):
/// 1234 → "1234", 12.34 → "12.3", 0.01234 → "0.0123"; below 0.0001 "<0.0001".
fn significant(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.0001 {
        // Three significant digits: as many decimals as the leading zeros need.
        let decimals = (2 - a.log10().floor() as i32).clamp(3, 6) as usize;
        format!("{v:.decimals$}")
    } else {
        "<0.0001".into()
    }
}

/// `node` on one line within `max` characters: as many of its node names (comma-separated for
/// a fused kernel) as fit, then how many were left out; else the text cut at `max`.
fn short_node(node: &str, max: usize) -> String {
    let one_line: String = node.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if one_line.chars().count() <= max {
        return one_line;
    }
    let names: Vec<&str> = one_line.split(", ").collect();
    let mut best = None;
    for kept in 1..names.len() {
        let text = format!("{}, … +{}", names[..kept].join(", "), names.len() - kept);
        if text.chars().count() > max {
            break;
        }
        best = Some(text);
    }
    best.unwrap_or_else(|| {
        let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    })
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
        assert_eq!((a.kernels, a.kernel_top), (false, 25));
        let c = Cli::try_parse_from(["onnx2ait", "bench", "out", "--kernels", "--kernel-top", "5", "--json"]).unwrap();
        let Some(Command::Bench(a)) = c.command else { panic!("not bench: {c:?}") };
        assert_eq!((a.kernels, a.kernel_top, a.json), (true, 5, true));
        let c = Cli::try_parse_from(["onnx2ait", "bench", "out", "--kernels"]).unwrap();
        let Some(Command::Bench(a)) = c.command else { panic!("not bench: {c:?}") };
        assert_eq!((a.kernels, a.kernel_top), (true, 25));
        assert!(
            Cli::try_parse_from(["onnx2ait", "bench", "out", "--kernel-top", "5"]).is_err(),
            "--kernel-top needs --kernels"
        );
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--kernels", "--kernel-top", "-1"]).is_err());
        let c = Cli::try_parse_from([
            "onnx2ait",
            "bench",
            "out",
            "--kernels",
            "--peak-tflops",
            "700",
            "--peak-gbps",
            "3000",
        ])
        .unwrap();
        let Some(Command::Bench(a)) = c.command else { panic!("not bench: {c:?}") };
        assert_eq!((a.peak_tflops, a.peak_gbps), (Some(700.0), Some(3000.0)));
        assert!(
            Cli::try_parse_from(["onnx2ait", "bench", "out", "--peak-gbps", "3000"]).is_err(),
            "--peak-gbps needs --kernels"
        );
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--kernels", "--peak-tflops", "0"]).is_err());
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--batch", "0"]).is_err());
        assert!(Cli::try_parse_from(["onnx2ait", "bench", "out", "--iters", "0"]).is_err());
        let c = Cli::try_parse_from(["onnx2ait", "run", "out", "--input", "x=x.npy", "--batch", "2"]).unwrap();
        let Some(Command::Run(r)) = c.command else { panic!("not run: {c:?}") };
        assert_eq!((r.inputs, r.batch, r.output_dir), (vec![("x".to_string(), PathBuf::from("x.npy"))], Some(2), None));
    }

    #[test]
    fn table_and_json_shapes() {
        let rows = vec![
            Row { batch: 1, dims: Default::default(), graph_median_ms: 0.5, median_ms: 0.75, kernels: None },
            Row { batch: 64, dims: Default::default(), graph_median_ms: 4.0, median_ms: 4.25, kernels: None },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "batch  graph ms  launch ms  images/s");
        assert_eq!(lines[2], "    1     0.500      0.750    2000.0");
        assert_eq!(lines[3], "   64     4.000      4.250   16000.0");
        let j: serde_json::Value = serde_json::to_value(&rows).unwrap();
        assert_eq!(j[1], serde_json::json!({"batch": 64, "dims": {}, "graph_median_ms": 4.0, "median_ms": 4.25}));
    }

    fn kt(name: &str, node: &str, ms: f64, work: Option<(i64, i64)>) -> KernelTime {
        KernelTime::new(name.into(), node.into(), ms, work.map(|(flops, bytes)| WorkAt { flops, bytes }))
    }

    /// Four kernels in run order; 4 ms in all. The conv does 4 GFLOP over 8 MB in 2 ms
    /// (2 TFLOP/s, 4 GB/s); the transform and the pool only move bytes; the gemm's build
    /// states no work.
    fn four_kernels() -> Vec<KernelTime> {
        vec![
            kt("k000_nchw_to_nhwc", "graph inputs, conv_1", 0.25, Some((0, 500_000))),
            kt("k001_conv2d_library", "conv_1", 2.0, Some((4_000_000_000, 8_000_000))),
            kt("k002_pool", "pool", 0.25, Some((0, 250_000_000))),
            kt("k003_gemm_library", "fc", 1.5, None),
        ]
    }

    #[test]
    fn kernel_table_sorts_slowest_first_with_shares() {
        let none = Peaks::default();
        let t = kernel_table(64, &four_kernels(), 4.5, 25, none);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("batch 64: 4 kernels, slowest first"), "{t}");
        assert_eq!(
            lines[1], "rank     ms      %   cum %  GFLOP  TFLOP/s     MB  GB/s  kernel               node",
            "{t}"
        );
        assert_eq!(
            lines[3], "   1  2.000  50.0%   50.0%   4.00     2.00   8.00  4.00  k001_conv2d_library  conv_1",
            "{t}"
        );
        assert_eq!(lines[4], "   2  1.500  37.5%   87.5%      -        -      -     -  k003_gemm_library    fc", "{t}");
        // Equal times keep run order; kernels that only move bytes have no flops.
        assert_eq!(
            lines[5],
            "   3  0.250   6.2%   93.8%      -        -  0.500  2.00  k000_nchw_to_nhwc    graph inputs, conv_1",
            "{t}"
        );
        assert_eq!(
            lines[6], "   4  0.250   6.2%  100.0%      -        -    250  1000  k002_pool            pool",
            "{t}"
        );
        assert_eq!(lines[7], "sum of the kernel times 4.000 ms; plain-launch median 4.500 ms (88.9% of it)", "{t}");
        assert_eq!(
            lines[8],
            "work of the kernels: 4.00 GFLOP (1.00 TFLOP/s), 258 MB (64.6 GB/s) over the sum of their times; \
             1 kernel(s) without recorded work",
            "{t}"
        );
        assert_eq!(lines.len(), 9, "{t}");
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{t}");

        let t = kernel_table(1, &four_kernels(), 4.5, 2, none);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 8, "{t}");
        assert_eq!(lines[5], "… 2 more kernels: 0.500 ms, 12.5% (--kernel-top 0 lists all)", "{t}");
        assert_eq!(kernel_table(1, &four_kernels(), 4.5, 0, none).lines().count(), 9);
        assert_eq!(kernel_table(1, &[], 0.1, 25, none), "batch 1: the model has no kernels\n");
    }

    #[test]
    fn kernel_table_shows_shares_of_the_ceilings_given() {
        let both = Peaks { tflops: Some(400.0), gbps: Some(2000.0) };
        let t = kernel_table(64, &four_kernels(), 4.5, 25, both);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[1],
            "rank     ms      %   cum %  GFLOP  TFLOP/s  %peak     MB  GB/s  %peak  kernel               node",
            "{t}"
        );
        assert_eq!(
            lines[3],
            "   1  2.000  50.0%   50.0%   4.00     2.00   0.5%   8.00  4.00   0.2%  k001_conv2d_library  conv_1",
            "{t}"
        );
        assert_eq!(
            lines[6],
            "   4  0.250   6.2%  100.0%      -        -      -    250  1000  50.0%  k002_pool            pool",
            "{t}"
        );
        // One ceiling: only its column.
        let t = kernel_table(64, &four_kernels(), 4.5, 25, Peaks { tflops: None, gbps: Some(2000.0) });
        assert_eq!(t.lines().nth(1).unwrap().matches("%peak").count(), 1, "{t}");
        assert!(t.lines().nth(1).unwrap().contains("GB/s  %peak"), "{t}");
    }

    #[test]
    fn figures_keep_three_significant_digits() {
        let cases = [(1234.5, "1234"), (12.345, "12.3"), (1.2345, "1.23"), (0.12345, "0.123"), (0.0012345, "0.00123")];
        for (v, s) in cases {
            assert_eq!(significant(v), s, "{v}");
        }
        assert_eq!(
            (significant(0.0), significant(0.00001), significant(f64::NAN)),
            ("0".into(), "<0.0001".into(), "-".into())
        );
        assert_eq!(parse_peak("989.5"), Ok(989.5));
        for bad in ["0", "-1", "inf", "NaN", "x"] {
            assert!(parse_peak(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn json_rows_carry_kernels_in_run_order() {
        let rows = vec![Row {
            batch: 8,
            dims: Default::default(),
            graph_median_ms: 1.0,
            median_ms: 1.5,
            kernels: Some(four_kernels()),
        }];
        let j: serde_json::Value = serde_json::to_value(&rows).unwrap();
        assert_eq!(j[0]["kernels"].as_array().unwrap().len(), 4);
        assert_eq!(
            j[0]["kernels"][1],
            serde_json::json!({"name": "k001_conv2d_library", "node": "conv_1", "ms": 2.0,
                "flops": 4_000_000_000i64, "bytes": 8_000_000, "tflops": 2.0, "gbps": 4.0})
        );
        // Unknown work and uncounted flops are null.
        assert_eq!(
            j[0]["kernels"][0],
            serde_json::json!({"name": "k000_nchw_to_nhwc", "node": "graph inputs, conv_1", "ms": 0.25,
                "flops": null, "bytes": 500_000, "tflops": null, "gbps": 2.0})
        );
        assert!(j[0]["kernels"][3]["bytes"].is_null());
        assert_eq!(j[0]["median_ms"], 1.5);
    }

    #[test]
    fn long_node_lists_are_shortened() {
        assert_eq!(short_node("conv_1", 60), "conv_1");
        assert_eq!(short_node("a\nb", 60), "a b");
        let many: Vec<String> = (0..40).map(|i| format!("node_{i}")).collect();
        let s = short_node(&many.join(", "), 60);
        assert!(s.chars().count() <= 60, "{s}");
        assert_eq!(s, "node_0, node_1, node_2, node_3, node_4, node_5, … +34");
        let long = "x".repeat(100);
        let s = short_node(&format!("{long}, y"), 20);
        assert_eq!(s.chars().count(), 20, "{s}");
        assert!(s.ends_with('…'), "{s}");
    }
}
