//! `onnx2ait ops [--json]`: every supported op, read from the registry (never a hand-kept list).

use super::{emit, Failure};
use clap::Args;
use onnx2ait::ir::ops::registry;
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Args, Debug)]
pub struct OpsArgs {
    /// Print JSON: a list of {domain, op_type, family}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct OpRow {
    domain: &'static str,
    op_type: &'static str,
    family: &'static str,
}

pub fn run(a: &OpsArgs) -> Result<u8, Failure> {
    let rows: Vec<OpRow> =
        registry().ops().map(|(domain, op_type, family)| OpRow { domain, op_type, family }).collect();
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
    emit(&s);
    Ok(0)
}
