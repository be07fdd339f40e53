//! Reference kernels of the pool op family.
