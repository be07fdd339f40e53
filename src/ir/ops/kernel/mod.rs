//! Kernel-level ops produced by the optimiser (fused conv/gemm, elementwise chains, layernorm,
//! layout transforms). They are not ONNX ops and are not in the ONNX registry.
