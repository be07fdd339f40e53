//! Stable-toolchain fuzzing of the importer: mutates real model files (bit flips, truncations,
//! byte splices, and structural edits of the decoded protobuf) and asserts that importing —
//! and running the reference executor on what imports — never panics.
//!
//! The budget is `ONNX2AIT_FUZZ_SECS` seconds (default 20, so CI stays quick); a long run is
//! `ONNX2AIT_FUZZ_SECS=600 cargo test --release --test fuzz_import -- --nocapture`.
//! The coverage-guided libFuzzer target over the same entry point is in tests/fuzz/.

use onnx2ait::onnx::proto::{ModelProto, TensorProto};
use onnx2ait::onnx::ModelFile;
use prost::Message;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// xorshift64*: deterministic, so a failure reproduces from the printed seed and iteration.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn seed_models() -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models");
    let mut seeds: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
                .filter(|p| std::fs::metadata(p).map(|m| m.len() < 2 << 20).unwrap_or(false))
                .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
                .collect()
        })
        .unwrap_or_default();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seed models in {} (run scripts/gen-models.sh)", dir.display());
    seeds
}

fn mutate_bytes(rng: &mut Rng, bytes: &mut Vec<u8>) {
    match rng.below(5) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
        }
        1 => {
            let keep = rng.below(bytes.len());
            bytes.truncate(keep);
        }
        2 => {
            let i = rng.below(bytes.len());
            bytes[i] = [0u8, 0xff, 0x7f, 0x80, 0x01][rng.below(5)];
        }
        3 => {
            // Splice: copy a chunk of the file over another place (shuffles protobuf fields).
            let n = bytes.len();
            let (a, b) = (rng.below(n), rng.below(n));
            let len = rng.below(64).min(n - a).min(n - b);
            let chunk = bytes[a..a + len].to_vec();
            bytes[b..b + len].copy_from_slice(&chunk);
        }
        _ => {
            let i = rng.below(bytes.len());
            let extra: Vec<u8> = (0..1 + rng.below(16)).map(|_| rng.next() as u8).collect();
            bytes.splice(i..i, extra);
        }
    }
}

const OPS: &[&str] = &["Relu", "Conv", "Reshape", "Gemm", "Add", "Concat", "Slice", "Gather", "Transpose", "Nope", ""];

/// Structural edits that keep the protobuf valid but break the model's meaning.
fn mutate_proto(rng: &mut Rng, m: &mut ModelProto) {
    let Some(g) = m.graph.as_mut() else { return };
    match rng.below(9) {
        0 if !g.node.is_empty() => {
            let (a, b) = (rng.below(g.node.len()), rng.below(g.node.len()));
            let tmp = g.node[a].input.clone();
            g.node[a].input = g.node[b].input.clone();
            g.node[b].input = tmp;
        }
        1 if !g.node.is_empty() => {
            let n = rng.below(g.node.len());
            g.node[n].op_type = Some(OPS[rng.below(OPS.len())].to_string());
        }
        2 if !g.node.is_empty() => {
            let n = rng.below(g.node.len());
            if let Some(a) = g.node[n].attribute.first_mut() {
                match rng.below(4) {
                    0 => a.r#type = Some(rng.below(16) as i32),
                    1 => a.ints = vec![-1, 0, i64::MAX, i64::MIN][..rng.below(5)].to_vec(),
                    2 => a.i = Some([-1, 0, 3, i64::MAX, i64::MIN][rng.below(5)]),
                    _ => a.name = Some("bogus".into()),
                }
            }
        }
        3 if !g.initializer.is_empty() => {
            let i = rng.below(g.initializer.len());
            let t: &mut TensorProto = &mut g.initializer[i];
            match rng.below(4) {
                0 => t.data_type = Some(rng.below(25) as i32),
                1 => {
                    if let Some(d) = t.dims.first_mut() {
                        *d = [0, -1, 1 << 40, 3][rng.below(4)];
                    }
                }
                2 => t.dims.push(2),
                _ => {
                    t.data_location = Some(1);
                    t.external_data.clear();
                }
            }
        }
        4 if !g.initializer.is_empty() => {
            let i = rng.below(g.initializer.len());
            g.initializer.remove(i);
        }
        5 if !g.node.is_empty() => {
            let n = rng.below(g.node.len());
            g.node.remove(n);
        }
        6 if !g.input.is_empty() => {
            let i = rng.below(g.input.len());
            g.input[i].r#type = None;
        }
        7 if !g.node.is_empty() => {
            // Feed a node its own output: a cycle.
            let n = rng.below(g.node.len());
            if let (Some(o), Some(slot)) = (g.node[n].output.first().cloned(), g.node[n].input.first_mut()) {
                *slot = o;
            }
        }
        _ => {
            m.opset_import.iter_mut().for_each(|o| o.version = Some([1, 6, 13, 22, 99][rng.below(5)]));
        }
    }
}

/// Imports (and runs when it imports, with small inputs) a candidate; panics propagate.
fn exercise(bytes: &[u8], path: &Path) {
    let Ok(mf) = ModelFile::from_bytes(bytes, path) else { return };
    let _ = mf.unsupported_ops();
    let Ok(graph) = mf.to_graph() else { return };
    // Execute only graphs whose inputs are small and fully static, so a mutated dim cannot make
    // the run allocate gigabytes.
    let huge = graph.values.iter().any(|v| {
        v.ty.as_ref()
            .and_then(|t| t.known_shape())
            .is_none_or(|s| s.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_none_or(|n| n > 1 << 20))
    });
    if huge {
        return;
    }
    let mut inputs = std::collections::BTreeMap::new();
    for &id in &graph.inputs {
        let ty = graph.ty(id);
        match ty.known_shape() {
            Some(s) if s.iter().product::<usize>() <= 1 << 16 => {
                inputs.insert(graph.values[id].name.clone(), onnx2ait::ir::Tensor::full(ty.dtype, &s, 0.5));
            }
            _ => return,
        }
    }
    let _ = onnx2ait::reference::run(&graph, &inputs);
}

#[test]
fn mutated_models_never_panic() {
    let budget =
        Duration::from_secs(std::env::var("ONNX2AIT_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(20));
    let seeds = seed_models();
    let seed = 0x5EED_0000_u64 ^ std::env::var("ONNX2AIT_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut rng = Rng(seed);
    let start = Instant::now();
    let mut tried = 0u64;
    // Silence the default hook's backtrace spam; a panic is still caught and reported below.
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failure = None;
    while start.elapsed() < budget {
        let (path, original) = &seeds[rng.below(seeds.len())];
        let candidate = if rng.below(2) == 0 {
            let mut b = original.clone();
            for _ in 0..1 + rng.below(3) {
                if b.is_empty() {
                    break;
                }
                mutate_bytes(&mut rng, &mut b);
            }
            b
        } else {
            let mut m = ModelProto::decode(original.as_slice()).expect("seed models decode");
            for _ in 0..1 + rng.below(3) {
                mutate_proto(&mut rng, &mut m);
            }
            m.encode_to_vec()
        };
        tried += 1;
        let p = path.clone();
        let c = candidate.clone();
        if std::panic::catch_unwind(move || exercise(&c, &p)).is_err() {
            let out = std::env::temp_dir().join(format!("onnx2ait-fuzz-crash-{tried}.onnx"));
            std::fs::write(&out, &candidate).ok();
            failure =
                Some(format!("panic on mutation #{tried} of {} (input saved to {})", path.display(), out.display()));
            break;
        }
    }
    std::panic::set_hook(prev);
    println!("fuzz_import: {tried} inputs in {:.1} s from {} seeds", start.elapsed().as_secs_f64(), seeds.len());
    if let Some(f) = failure {
        panic!("{f}");
    }
}
