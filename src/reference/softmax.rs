//! Reference kernels of the softmax op family.
