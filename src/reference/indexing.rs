//! Reference kernels of the indexing op family.
