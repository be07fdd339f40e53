//! Helpers shared by the test binaries that snapshot generated code (`tests/codegen.rs`,
//! `tests/exports.rs`); a folder module, so cargo does not build it as a test of its own.

use std::path::{Path, PathBuf};

/// Every generated file but the weights blob, in name order, as one text.
pub fn tree_text(out: &Path) -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out).expect("out dir").flatten().map(|e| e.path()).collect();
    files.sort();
    let mut s = String::new();
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "weights.bin" || f.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        s.push_str(&format!("=== {name} ===\n{text}\n"));
    }
    s
}
