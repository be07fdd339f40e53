//! Reference kernels of the linalg op family.
