//! clang in HIP mode as the [`Compiler`] for the ROCm target, with Composable Kernel on the
//! include path: compile-only, no ROCm install and no AMD GPU needed (the objects carry real
//! gfx90a / gfx942 code objects, the library links against HIP's runtime library).
//!
//! The toolchain is what `scripts/setup-rocm.sh` installs: Debian 12's clang-19 (HIP mode needs
//! clang ≥ 17 for current CK; clang-19 knows gfx942), HIP 5.2 headers and `libamdhip64`, the
//! device bitcode, and in `.tools/rocm/` the CK headers (from the pinned amd-aiter wheel), CK's
//! `config.h` and a device-library folder with gfx942's ISA-version file. Discovery:
//! `ROCM_CLANG` (the clang++ executable) else `clang++-19` on `PATH`; `ROCM_TOOLS` (the folder the
//! script fills) else `.tools/rocm` under the current directory or the crate's source directory.
//! A variable that is set but wrong is an error, not a reason to fall back.
//!
//! Flags: `-x hip` (the sources keep the `.cu` suffix the generated tree uses), `-O3 -DNDEBUG
//! -std=c++17 -fPIC`, `--offload-arch=<arch>`, `--rocm-device-lib-path`; the link is
//! `clang++ -shared … -lamdhip64 -Wl,--no-undefined`. Objects compile in OUT on relative paths,
//! and clang names nothing after process ids, so builds are reproducible.

use super::Compiler;
use crate::error::{Error, Result};
use crate::lower::rocm::RocmArch;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming the clang++ executable.
pub const ROCM_CLANG_ENV: &str = "ROCM_CLANG";
/// Environment variable naming the folder `scripts/setup-rocm.sh` fills.
pub const ROCM_TOOLS_ENV: &str = "ROCM_TOOLS";

/// What to do when the toolchain is missing.
pub const HOW_TO_GET_HIP: &str =
    "run scripts/setup-rocm.sh (as root on Debian 12: it installs clang-19, clang-tools-19, \
     lld-19, llvm-19, libamdhip64-dev and rocm-device-libs with apt-get, and Composable Kernel's headers into \
     .tools/rocm), or set ROCM_CLANG and ROCM_TOOLS";

/// Oldest clang that compiles current CK for gfx942.
const MIN_CLANG_MAJOR: u32 = 17;

/// clang++ in HIP mode for one architecture, with CK.
#[derive(Clone, Debug)]
pub struct HipClang {
    clang: PathBuf,
    /// "19.1.7".
    version: String,
    arch: RocmArch,
    tools: PathBuf,
    /// The `.stamp` of the tools folder (the CK wheel pinned by the script).
    ck_version: String,
}

impl HipClang {
    /// Finds the toolchain (see the module docs).
    pub fn discover(arch: RocmArch) -> Result<HipClang> {
        let clang = locate_clang(std::env::var_os(ROCM_CLANG_ENV), std::env::var_os("PATH")).map_err(Error::Other)?;
        let tools = locate_tools(std::env::var_os(ROCM_TOOLS_ENV)).map_err(Error::Other)?;
        HipClang::new(clang, tools, arch)
    }

    /// The toolchain for a compile-only test `what` (the test's path): where it is missing, `None`
    /// after a `GPU-SKIPPED: what (why)` line on stderr, which scripts/test.sh's summary lists (the
    /// caller skips); in CI (`CI` set) or with `ONNX2AIT_REQUIRE_ROCM` a missing toolchain
    /// panics instead of hiding behind a pass.
    #[doc(hidden)]
    pub fn discover_for_test(arch: RocmArch, what: &str) -> Option<HipClang> {
        let required = std::env::var_os("CI").is_some() || std::env::var_os("ONNX2AIT_REQUIRE_ROCM").is_some();
        match HipClang::discover(arch) {
            Ok(c) => Some(c),
            Err(e) if required => panic!("{what} needs the ROCm toolchain: {e}"),
            Err(e) => {
                // On the real stderr (test capture would hide an eprintln!): scripts/test.sh's
                // summary lists these lines.
                use std::io::Write as _;
                let why = e.to_string();
                let why = why.lines().next().unwrap_or_default();
                let _ = writeln!(std::io::stderr().lock(), "GPU-SKIPPED: {what} (no ROCm toolchain: {why})");
                None
            }
        }
    }

    pub fn new(clang: PathBuf, tools: PathBuf, arch: RocmArch) -> Result<HipClang> {
        let out = Command::new(&clang)
            .arg("--version")
            .output()
            .map_err(|e| Error::Other(format!("{} cannot be run: {e}; {HOW_TO_GET_HIP}", clang.display())))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let version = text
            .split_whitespace()
            .skip_while(|w| *w != "version")
            .nth(1)
            .map(|v| v.split(['-', '~']).next().unwrap_or(v).to_string())
            .ok_or_else(|| Error::Other(format!("{} printed no clang version: {}", clang.display(), text.trim())))?;
        let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
        if major < MIN_CLANG_MAJOR {
            return Err(Error::Other(format!(
                "{} is clang {version}; Composable Kernel needs clang {MIN_CLANG_MAJOR} or newer; {HOW_TO_GET_HIP}",
                clang.display()
            )));
        }
        tools_at(&tools).map_err(Error::Other)?;
        let ck_version = std::fs::read_to_string(tools.join(".stamp")).unwrap_or_default().trim().to_string();
        Ok(HipClang { clang, version, arch, tools, ck_version })
    }

    pub fn arch(&self) -> RocmArch {
        self.arch
    }

    /// clang's version, e.g. "19.1.7".
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The Composable Kernel headers' version: the tools folder's stamp (the wheel pinned by
    /// scripts/setup-rocm.sh), empty when it has none.
    pub fn ck_version(&self) -> &str {
        &self.ck_version
    }

    pub fn clang_path(&self) -> &Path {
        &self.clang
    }

    /// The folder with `ck/include`, `cfg` and `devlibs`.
    pub fn tools(&self) -> &Path {
        &self.tools
    }

    /// Compile flags that name no path.
    pub fn flags(&self) -> Vec<String> {
        ["-x", "hip", "-std=c++17", "-O3", "-DNDEBUG", "-fPIC", "-Wno-unused-command-line-argument"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("--offload-arch={}", self.arch)])
            .collect()
    }
}

impl Compiler for HipClang {
    fn name(&self) -> &str {
        "clang-hip"
    }

    fn fingerprint(&self) -> String {
        format!(
            "clang {}\nHIP {}\nCK {}\ncompile {}\nlink -shared -lamdhip64 -Wl,--no-undefined",
            self.version,
            hip_version(),
            self.ck_version,
            self.flags().join(" ")
        )
    }

    fn describe(&self) -> String {
        format!(
            "clang {} ({}) in HIP mode, Composable Kernel ({}), {}",
            self.version,
            self.clang.display(),
            self.tools.join("ck/include").display(),
            self.arch
        )
    }

    fn compile_command(&self, src: &Path, obj: &Path, include_dir: &Path) -> Command {
        let mut cmd = Command::new(&self.clang);
        cmd.args(self.flags());
        let mut devlibs = OsString::from("--rocm-device-lib-path=");
        devlibs.push(self.tools.join("devlibs"));
        cmd.arg(devlibs);
        for dir in [include_dir.to_path_buf(), self.tools.join("cfg"), self.tools.join("ck/include")] {
            let mut i = OsString::from("-I");
            i.push(dir);
            cmd.arg(i);
        }
        cmd.arg("-c").arg(src).arg("-o").arg(obj);
        cmd
    }

    fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command {
        let mut cmd = Command::new(&self.clang);
        cmd.arg("-shared").arg("-o").arg(lib);
        cmd.args(objs);
        cmd.args(["-lamdhip64", "-Wl,--no-undefined"]);
        cmd
    }
}

/// The device code of one GPU target in a HIP object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceCode {
    /// The offload bundle entry (`hipv4-amdgcn-amd-amdhsa--gfx942`).
    pub target: String,
    /// Kernels (`.kd` symbols in the code object's notes).
    pub kernels: usize,
    /// MFMA instructions (`v_mfma*`) in its disassembly.
    pub mfma: usize,
}

/// What device code a HIP object holds (none for a translation unit without kernels): its
/// `.hip_fatbin` section unbundled per GPU target,
/// each code object's kernels counted and disassembled for MFMA instructions (llvm-objcopy-19,
/// clang-offload-bundler-19, llvm-readelf-19, llvm-objdump-19 — installed with clang-19).
pub fn device_code(obj: &Path) -> Result<Vec<DeviceCode>> {
    static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("onnx2ait-device-code-{}-{seq}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::Other(format!("{}: {e}", dir.display())))?;
    let result = device_code_in(obj, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn device_code_in(obj: &Path, tmp: &Path) -> Result<Vec<DeviceCode>> {
    let fatbin = tmp.join("fatbin");
    let run = |cmd: &mut Command, what: &str| -> Result<String> {
        let out = cmd.output().map_err(|e| Error::Other(format!("{what}: cannot run: {e}; {HOW_TO_GET_HIP}")))?;
        if !out.status.success() {
            return Err(Error::Other(format!(
                "{what} failed on {}: {}",
                obj.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    run(
        Command::new("llvm-objcopy-19").args(["-O", "binary", "--only-section=.hip_fatbin"]).arg(obj).arg(&fatbin),
        "llvm-objcopy-19",
    )?;
    // A translation unit without kernels (a node launcher calling library instances) has an
    // empty bundle: no device code.
    if std::fs::metadata(&fatbin).map(|m| m.len()).unwrap_or(0) == 0 {
        return Ok(Vec::new());
    }
    let mut input = OsString::from("--input=");
    input.push(&fatbin);
    let list = run(
        Command::new("clang-offload-bundler-19").args(["--list", "--type=o"]).arg(&input),
        "clang-offload-bundler-19",
    )?;
    let mut code = Vec::new();
    for target in list.lines().map(str::trim).filter(|t| !t.is_empty() && !t.starts_with("host-")) {
        let co = tmp.join("co");
        let mut output = OsString::from("--output=");
        output.push(&co);
        run(
            Command::new("clang-offload-bundler-19")
                .args(["--unbundle", "--type=o"])
                .arg(&input)
                .arg(format!("--targets={target}"))
                .arg(output),
            "clang-offload-bundler-19",
        )?;
        let notes = run(Command::new("llvm-readelf-19").arg("--notes").arg(&co), "llvm-readelf-19")?;
        let kernels = notes.lines().filter(|l| l.contains(".symbol:") && l.trim_end().ends_with(".kd")).count();
        let disasm = run(Command::new("llvm-objdump-19").arg("-d").arg(&co), "llvm-objdump-19")?;
        let mfma = disasm.lines().filter(|l| l.trim_start().starts_with("v_mfma")).count();
        code.push(DeviceCode { target: target.to_string(), kernels, mfma });
    }
    Ok(code)
}

/// HIP's version from its header (`HIP_VERSION_MAJOR` … in hip_version.h), for the fingerprint.
fn hip_version() -> String {
    let text = std::fs::read_to_string("/usr/include/hip/hip_version.h").unwrap_or_default();
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("#define ").and_then(|r| r.strip_prefix(key)).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| "?".into())
    };
    format!("{}.{}.{}", get("HIP_VERSION_MAJOR"), get("HIP_VERSION_MINOR"), get("HIP_VERSION_PATCH"))
}

fn locate_clang(env: Option<OsString>, path: Option<OsString>) -> std::result::Result<PathBuf, String> {
    if let Some(p) = env.filter(|s| !s.is_empty()).map(PathBuf::from) {
        if !p.is_file() {
            return Err(format!("{ROCM_CLANG_ENV}={} does not name a file; {HOW_TO_GET_HIP}", p.display()));
        }
        return Ok(p);
    }
    if let Some(path) = path.filter(|s| !s.is_empty()) {
        if let Some(p) = std::env::split_paths(&path).map(|d| d.join("clang++-19")).find(|p| p.is_file()) {
            return Ok(p);
        }
    }
    Err(format!("clang++-19 not found (looked in: {ROCM_CLANG_ENV}, PATH); {HOW_TO_GET_HIP}"))
}

fn locate_tools(env: Option<OsString>) -> std::result::Result<PathBuf, String> {
    if let Some(dir) = env.filter(|s| !s.is_empty()).map(PathBuf::from) {
        return tools_at(&dir).map(|_| dir).map_err(|e| format!("{ROCM_TOOLS_ENV}: {e}"));
    }
    let mut roots: Vec<PathBuf> = std::env::current_dir().into_iter().collect();
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if !roots.contains(&manifest) {
        roots.push(manifest);
    }
    let mut looked = Vec::new();
    for root in roots {
        let dir = root.join(".tools").join("rocm");
        if tools_at(&dir).is_ok() {
            return Ok(dir);
        }
        looked.push(dir.display().to_string());
    }
    Err(format!(
        "Composable Kernel headers not found (looked in: {ROCM_TOOLS_ENV}, {}); {HOW_TO_GET_HIP}",
        looked.join(", ")
    ))
}

/// Checks a tools folder: CK's headers, its config.h, the device libraries with gfx942's file.
fn tools_at(dir: &Path) -> std::result::Result<(), String> {
    for (rel, what) in [
        ("ck/include/ck/ck.hpp", "Composable Kernel's headers"),
        ("cfg/ck/config.h", "CK's config.h"),
        ("devlibs/oclc_isa_version_942.bc", "the device libraries"),
    ] {
        if !dir.join(rel).is_file() {
            return Err(format!("{} has no {rel} ({what}); {HOW_TO_GET_HIP}", dir.display()));
        }
    }
    if !Path::new("/usr/include/hip/hip_runtime.h").is_file() {
        return Err(format!("no HIP headers (/usr/include/hip/hip_runtime.h); {HOW_TO_GET_HIP}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_explicit_toolchain_is_an_error() {
        let e = locate_clang(Some("/nonexistent/clang++".into()), None).unwrap_err();
        assert!(e.contains("ROCM_CLANG=/nonexistent/clang++") && e.contains("setup-rocm.sh"), "{e}");
        let e = locate_clang(None, Some("/nonexistent-dir".into())).unwrap_err();
        assert!(e.contains("clang++-19 not found"), "{e}");
        let e = locate_tools(Some("/nonexistent-tools".into())).unwrap_err();
        assert!(e.contains("ROCM_TOOLS") && e.contains("ck/include/ck/ck.hpp"), "{e}");
    }
}
