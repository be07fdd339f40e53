//! Validation against ONNX Runtime.
