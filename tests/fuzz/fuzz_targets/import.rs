//! Any byte string given to the importer yields a graph or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    if let Ok(mf) = onnx2ait::onnx::ModelFile::from_bytes(data, Path::new("fuzz-input.onnx")) {
        let _ = mf.unsupported_ops();
        let _ = mf.to_graph();
    }
});
