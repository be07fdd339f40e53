//! ONNX import: decode the protobuf, resolve initializers (inline and external), build the IR.

mod attr;
mod import;
mod sequence;
#[allow(clippy::all, missing_docs)]
pub mod proto;
mod tensor;

pub use import::ModelFile;
pub use tensor::tensor_from_proto;

use crate::error::{Error, Result};
use crate::ir::{Graph, Tensor};
use prost::Message;
use std::path::Path;

/// Reads an ONNX model file and returns the inferred, constant-folded IR graph.
pub fn load_model(path: &Path) -> Result<Graph> {
    ModelFile::open(path)?.to_graph()
}

/// Reads one serialized `TensorProto` file (the ONNX backend tests' `input_0.pb`) as (name, tensor).
pub fn read_tensor_file(path: &Path) -> Result<(String, Tensor)> {
    let src = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| Error::model(&src, format!("cannot read: {e}")))?;
    let proto = proto::TensorProto::decode(bytes.as_slice())
        .map_err(|e| Error::model(&src, format!("not a serialized TensorProto: {e}")))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let t = tensor_from_proto(&proto, base).map_err(|e| Error::model(&src, e))?;
    Ok((proto.name.unwrap_or_default(), t))
}
