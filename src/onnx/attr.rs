//! `AttributeProto` → `ir::Attr`.

use super::proto::AttributeProto;
use super::tensor::tensor_from_proto;
use crate::ir::Attr;
use std::path::Path;

/// Decodes one attribute. The `type` field decides; models from before IR version 2 that omit
/// it are read by which value field is set.
pub fn attr_from_proto(a: &AttributeProto, base_dir: &Path) -> Result<Attr, String> {
    let name = a.name.as_deref().unwrap_or("");
    if a.ref_attr_name.is_some() {
        return Err(format!("attribute '{name}' refers to a function attribute, which is only valid inside functions"));
    }
    let kind = a.r#type.unwrap_or(0);
    let kind = if kind != 0 { kind } else { guess_kind(a) };
    let utf8 = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| format!("attribute '{name}' is not valid UTF-8"));
    Ok(match kind {
        1 => Attr::Float(a.f.unwrap_or(0.0)),
        2 => Attr::Int(a.i.unwrap_or(0)),
        3 => Attr::String(utf8(a.s.as_deref().unwrap_or(&[]))?),
        4 => {
            let t = a.t.as_ref().ok_or_else(|| format!("attribute '{name}' is a TENSOR without a value"))?;
            Attr::Tensor(tensor_from_proto(t, base_dir).map_err(|e| format!("attribute '{name}': {e}"))?)
        }
        5 | 10 => Attr::Graph,
        6 => Attr::Floats(a.floats.clone()),
        7 => Attr::Ints(a.ints.clone()),
        8 => Attr::Strings(a.strings.iter().map(|s| utf8(s)).collect::<Result<_, _>>()?),
        9 => Attr::Other("TENSORS"),
        11 => Attr::Other("SPARSE_TENSOR"),
        12 => Attr::Other("SPARSE_TENSORS"),
        13 => Attr::Other("TYPE_PROTO"),
        14 => Attr::Other("TYPE_PROTOS"),
        other => return Err(format!("attribute '{name}' has unknown type {other}")),
    })
}

fn guess_kind(a: &AttributeProto) -> i32 {
    if a.f.is_some() {
        1
    } else if a.i.is_some() {
        2
    } else if a.s.is_some() {
        3
    } else if a.t.is_some() {
        4
    } else if a.g.is_some() {
        5
    } else if !a.floats.is_empty() {
        6
    } else if !a.ints.is_empty() {
        7
    } else if !a.strings.is_empty() {
        8
    } else if a.sparse_tensor.is_some() {
        11
    } else {
        // An empty list: INTS is the harmless reading (ops treat it as "not given").
        7
    }
}
