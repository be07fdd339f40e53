//! Reference kernels of the activation op family.
