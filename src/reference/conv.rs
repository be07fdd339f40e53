//! Reference kernels of the conv op family.
