//! The target a profile is for, and the toolchain that builds its profiler: CUDA (nvcc and
//! CUTLASS) or ROCm (clang in HIP mode and Composable Kernel). Times hold only for the code one
//! toolchain produces, so the compiler's and the instance library's versions are part of every
//! cached time's device key ([`super::cache::device_key`]).

use crate::build::hip::HipClang;
use crate::build::nvcc::Nvcc;
use crate::build::Compiler;
use crate::error::Result;
use crate::lower::cuda::Arch;
use crate::lower::rocm::RocmArch;

/// What a profile times instances for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileTarget {
    /// CUTLASS instances, for an NVIDIA architecture.
    Cuda(Arch),
    /// Composable Kernel instances, for an AMD architecture.
    Rocm(RocmArch),
}

impl ProfileTarget {
    /// The architecture's name (`sm_90a`, `gfx942`): part of the device key.
    pub fn arch_name(&self) -> &'static str {
        match self {
            ProfileTarget::Cuda(a) => a.as_str(),
            ProfileTarget::Rocm(a) => a.as_str(),
        }
    }

    /// The template folder of the target's profiler and instances (`templates/<target>/`).
    pub fn templates(&self) -> &'static str {
        match self {
            ProfileTarget::Cuda(_) => "cuda",
            ProfileTarget::Rocm(_) => "rocm",
        }
    }
}

/// A discovered toolchain of a [`ProfileTarget`].
pub enum Toolchain {
    Cuda(Nvcc),
    Rocm(HipClang),
}

impl Toolchain {
    /// Finds the target's toolchain (an error says what to install).
    pub fn discover(target: ProfileTarget) -> Result<Toolchain> {
        Ok(match target {
            ProfileTarget::Cuda(a) => Toolchain::Cuda(Nvcc::discover(a)?),
            ProfileTarget::Rocm(a) => Toolchain::Rocm(HipClang::discover(a)?),
        })
    }

    pub fn target(&self) -> ProfileTarget {
        match self {
            Toolchain::Cuda(n) => ProfileTarget::Cuda(n.arch()),
            Toolchain::Rocm(h) => ProfileTarget::Rocm(h.arch()),
        }
    }

    pub fn compiler(&self) -> &dyn Compiler {
        match self {
            Toolchain::Cuda(n) => n,
            Toolchain::Rocm(h) => h,
        }
    }

    /// The compiler's part of the device key: `nvcc 13.0.88`, `clang-hip 19.1.7`.
    pub fn compiler_key(&self) -> String {
        match self {
            Toolchain::Cuda(n) => format!("nvcc {}", n.version()),
            Toolchain::Rocm(h) => format!("clang-hip {}", h.version()),
        }
    }

    /// The instance library's part of the device key: `cutlass 4.2.0`, `ck <the tools' stamp>`.
    pub fn library_key(&self) -> String {
        match self {
            Toolchain::Cuda(n) => format!("cutlass {}", n.cutlass_version()),
            Toolchain::Rocm(h) => format!("ck {}", h.ck_version()),
        }
    }

    /// The key of this toolchain's times on GPU `gpu` (its name as the runtime reports it).
    pub fn device_key(&self, gpu: &str) -> String {
        super::cache::device_key(gpu, self.target().arch_name(), &self.compiler_key(), &self.library_key())
    }

    /// The device keys of `cache` with times for this toolchain (any GPU).
    pub fn devices_in(&self, cache: &super::cache::ProfileCache) -> Vec<String> {
        cache.devices_for(self.target().arch_name(), &self.compiler_key(), &self.library_key())
    }
}
