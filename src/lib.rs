//! onnx2ait: ONNX model → fast, self-contained CUDA inference library.
//!
//! Pipeline (one module per stage, in order): [`onnx`] decodes the file, [`ir`] builds the
//! typed graph with shape inference and constant folding, [`reference`] executes it on the CPU,
//! [`validate`] compares it with ONNX Runtime.

pub mod build;
pub mod codegen;
pub mod egraph;
pub mod error;
pub mod ir;
pub mod lower;
pub mod onnx;
pub mod profile;
pub mod reference;
pub mod runtime;
pub mod validate;

pub use error::{Error, Result};
