//! `onnx2ait ops [--json]`: every supported op, read from the registry (never a hand-kept list).

use super::{emit, Failure};
use clap::Args;
use onnx2ait::ir::ops::registry;
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Print JSON: a list of {domain, op_type, family, note?}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct OpRow {
    domain: &'static str,
    op_type: &'static str,
    family: &'static str,
    /// A restriction of the op (see `OpSpec::note`); absent when there is none.
    #[serde(skip_serializing_if = "str::is_empty")]
    note: &'static str,
}

pub fn run(a: &OpsArgs) -> Result<u8, Failure> {
    let rows: Vec<OpRow> = registry()
        .ops()
        .map(|(domain, op_type, family)| {
            let note = registry().lookup(domain, op_type).map_or("", |spec| spec.note);
            OpRow { domain, op_type, family, note }
        })
        .collect();
    if a.json {
        let s = serde_json::to_string_pretty(&rows).map_err(|e| Failure::new(1, format!("cannot serialise: {e}")))?;
        emit(&format!("{s}\n"));
        return Ok(0);
    }
    let mut by_family: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for r in &rows {
        by_family.entry(r.family).or_default().push(r.op_type);
    }
    let mut s = format!("{} supported ops (default ONNX domain), by family:\n", rows.len());
    for (family, ops) in by_family {
        let _ = writeln!(s, "  {family:<14} {}", ops.join(", "));
    }
    let notes: Vec<&OpRow> = rows.iter().filter(|r| !r.note.is_empty()).collect();
    if !notes.is_empty() {
        s.push_str("\nRestrictions:\n");
        for r in notes {
            let _ = writeln!(s, "  {}: {}", r.op_type, r.note);
        }
    }
    emit(&s);
    Ok(0)
}
