//! Reference kernels of the normalization op family.
