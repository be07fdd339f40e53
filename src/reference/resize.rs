//! Reference kernels of the resize op family.
