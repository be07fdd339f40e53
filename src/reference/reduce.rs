//! Reference kernels of the reduce op family.
