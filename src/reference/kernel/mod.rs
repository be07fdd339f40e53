//! Reference kernels of the optimiser's kernel-level ops.
