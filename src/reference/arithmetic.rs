//! Reference kernels of the arithmetic op family.
