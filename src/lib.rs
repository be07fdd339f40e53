//! onnx2ait: ONNX model → fast, self-contained CUDA inference library.
//!
//! The entry point is [`compile::compile`] (`onnx2ait MODEL -o OUT` is that call):
//!
//! ```no_run
//! let opts = onnx2ait::compile::CompileOptions::default();
//! let build = onnx2ait::compile::compile("resnet50.onnx".as_ref(), "out".as_ref(), &opts)?;
//! assert!(build.library.is_some()); // out/libmodel.so, with out/model.h as its C API
//! # Ok::<(), onnx2ait::Error>(())
//! ```
//!
//! The pipeline, one module per stage, in order:
//! - [`onnx`] decodes the file (initializers, external data, opsets) and imports it;
//! - [`ir`] is the typed graph: op registry, shape inference with symbolic dims and shape
//!   values, constant folding;
//! - [`egraph`] optimises it by equality saturation (rules from `rewrites/*.rules`, phased, then
//!   DAG-aware extraction under a kernel cost model);
//! - [`lower`] gives every kernel-level node a kernel instance (CUTLASS conv/gemm or the
//!   project's own kernels) and plans memory;
//! - [`codegen`] renders the CUDA sources, headers and weights from `templates/`;
//! - [`build`] compiles them with nvcc in parallel, cached by content hash;
//! - [`runtime`] loads, runs and times the built library;
//! - [`profile`] times candidate instances on the GPU and keeps the profile cache;
//! - [`validate`] compares a build (or the CPU executor) with ONNX Runtime;
//! - [`reference`](mod@reference) executes any graph, fused kernels included, on the CPU.
//!
//! [`compile`] assembles the stages; [`error`] is the error every stage reports, naming the
//! file, node and op.

pub mod build;
pub mod codegen;
pub mod compile;
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
