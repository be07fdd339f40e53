//! nvcc as the [`Compiler`] for the CUDA target, with CUTLASS on the include path.
//!
//! Discovery is ordered from most to least explicit: `NVCC`, then `CUDA_HOME/bin/nvcc`, then
//! `nvcc` on `PATH`, then the project's Python environment, where `scripts/setup-python.sh`
//! installs the pinned nvidia-cuda-nvcc 13.0 wheels (so CPU-only machines and CI can compile
//! without a CUDA install). CUTLASS comes from `CUTLASS_DIR` or that environment's nvidia-cutlass
//! wheel. The environment is looked up under the current directory and the crate's source
//! directory, as [`crate::validate::ort`] does for ONNX Runtime. A variable that is set but
//! wrong is an error rather than a reason to fall back: the user asked for that toolchain.
//!
//! Flags, and why (see also shared/cutlass/README.md):
//! - Hopper kernels need `compute_90a`/`sm_90a`; under plain `sm_90` a CUTLASS 3.x kernel still
//!   compiles but into a stub that aborts at run time, so the architecture is an explicit [`Arch`].
//! - `-DNDEBUG` always: CUTLASS asserts make ptxas serialise wgmma.
//! - `-DO2A_PDL` for Hopper ([`Arch::programmatic_launch`]): kernels are launched with
//!   programmatic dependent launch and wait for their predecessor in the stream
//!   (templates/cuda/library.cuh.hbs says why that is safe).
//! - `--expt-relaxed-constexpr` and C++17 are what CUTLASS 4.2 requires; `-fPIC` because the
//!   objects go into a shared library.
//! - The wheel layout puts `libcudart_static.a` in `cu13/lib`, where nvcc.profile (which expects
//!   `lib64`) does not look, so linking adds `-L` for it. cccl headers need no flag: nvcc.profile
//!   adds `include/cccl` as a system include in both the wheel and a regular CUDA install.
//! - cudart is linked statically so the library depends only on the driver, and with
//!   `--no-undefined` so a missing kernel definition fails the build instead of `dlopen`.
//! - `--objdir-as-tempdir` where `nvcc --help` lists it (13.0 does): nvcc otherwise names its
//!   intermediate files `/tmp/tmpxft_<pid>_…`, and the host object keeps that name as its source
//!   file symbol, so every compile gave a different object and library. With it they are named
//!   after the object, which the build keeps free of process ids (see [`super::build`]). With it
//!   goes `-Xcudafe --orig_src_path_name=<source as given>`: the front end hashes that path into
//!   anonymous-namespace names, and nvcc would give the absolute path, which holds the staging
//!   folder's process id.
//!
//! The commands are built with `std::process::Command` rather than the `cc` crate: cc is made for
//! build scripts (it wants TARGET/HOST/OUT_DIR, archives objects into a static library and prints
//! cargo directives), and it only takes nvcc from `NVCC`/`PATH` — pointing it at a discovered path
//! with `.compiler()` misdetects the compiler's flavour — so it would add configuration without
//! doing any of the work.

use super::Compiler;
use crate::error::{Error, Result};
use crate::lower::cuda::Arch;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Environment variable naming the nvcc executable.
pub const NVCC_ENV: &str = "NVCC";
/// Environment variable naming a CUDA installation (`$CUDA_HOME/bin/nvcc`).
pub const CUDA_HOME_ENV: &str = "CUDA_HOME";
/// Environment variable naming the CUTLASS headers: a CUTLASS checkout or the
/// `cutlass_library/source` folder of the nvidia-cutlass wheel (both have `include/` and
/// `tools/util/include/`).
pub const CUTLASS_DIR_ENV: &str = "CUTLASS_DIR";

/// Oldest CUDA whose nvcc compiles CUTLASS 4.x kernels for `sm_90a`.
const MIN_CUDA_MAJOR: u32 = 12;
/// The CUTLASS API the CUDA templates are written against: 4.x, from 4.2 on.
const CUTLASS_MAJOR: u32 = 4;
const CUTLASS_MIN_MINOR: u32 = 2;

const HOW_TO_GET_NVCC: &str =
    "run scripts/setup-python.sh, which installs the pinned nvidia-cuda-nvcc 13.0 wheels into \
     .venv, or set CUDA_HOME (a CUDA 12+ installation) or NVCC (the nvcc executable)";
const HOW_TO_GET_CUTLASS: &str =
    "run scripts/setup-python.sh, which installs the pinned nvidia-cutlass 4.2 wheel into .venv, \
     or set CUTLASS_DIR to a CUTLASS 4.2 checkout (the folder holding include/ and tools/util/include/)";

/// The CUTLASS headers in use.
#[derive(Clone, Debug)]
struct Cutlass {
    include: PathBuf,
    util_include: PathBuf,
    version: String,
}

/// nvcc configured for one architecture, with CUTLASS.
#[derive(Clone, Debug)]
pub struct Nvcc {
    nvcc: PathBuf,
    /// "13.0.88".
    version: String,
    /// The "Cuda compilation tools, release …" and "Build …" lines of `nvcc --version`.
    version_text: String,
    arch: Arch,
    cutlass: Cutlass,
    /// Folder holding `libcudart_static.a` when nvcc's profile would not search it (wheel layout).
    cudart_dir: Option<PathBuf>,
    /// Whether nvcc has `--objdir-as-tempdir` (see the module docs).
    objtemp: bool,
    extra_flags: Vec<String>,
}

impl Nvcc {
    /// nvcc for `arch` in a compile-only test: `None` (the caller skips, after a printed reason)
    /// where the toolchain is missing, except in CI (`CI` set) or with `ONNX2AIT_REQUIRE_NVCC`,
    /// where a missing toolchain panics (naming `what` needs it) instead of hiding behind a pass.
    #[doc(hidden)]
    pub fn discover_for_test(arch: Arch, what: &str) -> Option<Nvcc> {
        let required = std::env::var_os("CI").is_some() || std::env::var_os("ONNX2AIT_REQUIRE_NVCC").is_some();
        match Nvcc::discover(arch) {
            Ok(n) => Some(n),
            Err(e) if required => panic!("{what} needs nvcc: {e}"),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    /// Finds nvcc and CUTLASS (see the module docs for the order) and checks that they run and
    /// are recent enough. When something is missing, the error says what and how to get it.
    pub fn discover(arch: Arch) -> Result<Nvcc> {
        let roots = search_roots();
        let nvcc =
            locate_nvcc(std::env::var_os(NVCC_ENV), std::env::var_os(CUDA_HOME_ENV), std::env::var_os("PATH"), &roots);
        let cutlass = locate_cutlass(std::env::var_os(CUTLASS_DIR_ENV), &roots);
        match (nvcc, cutlass) {
            (Ok(nvcc), Ok(cutlass)) => Nvcc::new(nvcc, &cutlass, arch),
            (Err(a), Err(b)) => Err(Error::Other(format!("{a}\n{b}"))),
            (Err(e), _) | (_, Err(e)) => Err(Error::Other(e)),
        }
    }

    /// nvcc at an explicit path, CUTLASS from an explicit folder (a checkout or the wheel's
    /// `cutlass_library/source`).
    pub fn new(nvcc: PathBuf, cutlass_dir: &Path, arch: Arch) -> Result<Nvcc> {
        let cutlass = cutlass_at(cutlass_dir).map_err(Error::Other)?;
        let (version, version_text) = probe_version(&nvcc)?;
        let cudart_dir = nvcc
            .parent()
            .and_then(Path::parent)
            .map(|top| top.join("lib"))
            .filter(|lib| lib.join("libcudart_static.a").is_file());
        let objtemp = has_option(&nvcc, "--objdir-as-tempdir");
        Ok(Nvcc { nvcc, version, version_text, arch, cutlass, cudart_dir, objtemp, extra_flags: Vec::new() })
    }

    /// Adds a compile flag (e.g. `-lineinfo`); it becomes part of the fingerprint.
    pub fn with_flag(mut self, flag: impl Into<String>) -> Nvcc {
        self.extra_flags.push(flag.into());
        self
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    pub fn nvcc_path(&self) -> &Path {
        &self.nvcc
    }

    /// nvcc's version, e.g. "13.0.88".
    pub fn version(&self) -> &str {
        &self.version
    }

    /// CUTLASS's version, e.g. "4.2.0".
    pub fn cutlass_version(&self) -> &str {
        &self.cutlass.version
    }

    /// The CUTLASS `include/` folder.
    pub fn cutlass_include(&self) -> &Path {
        &self.cutlass.include
    }

    /// For reports: "nvcc 13.0.88 (/…/nvcc), CUTLASS 4.2.0 (/…/include), sm_90a".
    pub fn describe(&self) -> String {
        format!(
            "nvcc {} ({}), CUTLASS {} ({}), {}",
            self.version,
            self.nvcc.display(),
            self.cutlass.version,
            self.cutlass.include.display(),
            self.arch
        )
    }

    /// Compile flags that do not name paths (those are what the fingerprint covers).
    pub fn flags(&self) -> Vec<String> {
        let mut f: Vec<String> =
            ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC", self.arch.gencode()]
                .iter()
                .map(|s| s.to_string())
                .collect();
        if self.arch.programmatic_launch() {
            // Kernels wait for their predecessor in the stream and are launched with PDL
            // (templates/cuda/library.cuh.hbs).
            f.push("-DO2A_PDL".to_string());
        }
        if self.objtemp {
            f.push("--objdir-as-tempdir".to_string());
        }
        f.extend(self.extra_flags.iter().cloned());
        f
    }
}

impl Compiler for Nvcc {
    fn name(&self) -> &str {
        "nvcc"
    }

    fn fingerprint(&self) -> String {
        format!(
            "nvcc {}\n{}\nCUTLASS {}\ncompile {}\nlink -shared -cudart static -Xlinker=--no-undefined",
            self.version,
            self.version_text,
            self.cutlass.version,
            self.flags().join(" ")
        )
    }

    fn describe(&self) -> String {
        Nvcc::describe(self)
    }

    fn compile_command(&self, src: &Path, obj: &Path, include_dir: &Path) -> Command {
        let mut cmd = Command::new(&self.nvcc);
        cmd.args(self.flags());
        cmd.arg(include_flag(include_dir));
        cmd.arg(include_flag(&self.cutlass.include));
        cmd.arg(include_flag(&self.cutlass.util_include));
        if self.objtemp {
            // The front end names anonymous namespaces after a hash of the source's absolute path
            // (`_GLOBAL__N__<hash>_…`), which nvcc passes as --orig_src_path_name: the path as given
            // (relative to OUT in a build) keeps the names, and the object, the same wherever OUT is.
            let mut path = OsString::from("--orig_src_path_name=");
            path.push(src);
            cmd.arg("-Xcudafe").arg(path);
        }
        cmd.arg("-c").arg(src).arg("-o").arg(obj);
        cmd
    }

    fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command {
        let mut cmd = Command::new(&self.nvcc);
        cmd.arg("-shared").arg(self.arch.gencode()).arg("-o").arg(lib);
        cmd.args(objs);
        cmd.args(["-cudart", "static", "-Xlinker=--no-undefined"]);
        if let Some(dir) = &self.cudart_dir {
            let mut l = OsString::from("-L");
            l.push(dir);
            cmd.arg(l);
        }
        cmd
    }

    fn version_script_args(&self, script: &Path) -> Vec<OsString> {
        // nvcc hands -Xlinker's value to the host linker split at commas: the script is named
        // relative to OUT (`exports.map`), so no comma of a path can split it.
        let mut a = OsString::from("-Xlinker=--version-script=");
        a.push(script);
        vec![a]
    }
}

fn include_flag(dir: &Path) -> OsString {
    let mut s = OsString::from("-I");
    s.push(dir);
    s
}

/// Whether `nvcc --help` lists `option` (false when it cannot be run: `probe_version` reports that).
fn has_option(nvcc: &Path, option: &str) -> bool {
    Command::new(nvcc).arg("--help").output().is_ok_and(|out| {
        String::from_utf8_lossy(&out.stdout).split(|c: char| c.is_whitespace() || c == ',').any(|w| w == option)
    })
}

/// Runs `nvcc --version`; returns ("13.0.88", the release and build lines).
fn probe_version(nvcc: &Path) -> Result<(String, String)> {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| Error::Other(format!("nvcc at {} cannot be run: {e}; {HOW_TO_GET_NVCC}", nvcc.display())))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(Error::Other(format!(
            "nvcc at {} failed to report its version ({}): {} {}",
            nvcc.display(),
            out.status,
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let version = parse_version(&text).ok_or_else(|| {
        Error::Other(format!("nvcc at {} printed no recognisable version: {}", nvcc.display(), text.trim()))
    })?;
    let major: u32 = version.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
    if major < MIN_CUDA_MAJOR {
        return Err(Error::Other(format!(
            "nvcc at {} is CUDA {version}; CUTLASS 4.2 and sm_90a need CUDA {MIN_CUDA_MAJOR} or newer; {HOW_TO_GET_NVCC}",
            nvcc.display()
        )));
    }
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("Cuda compilation tools") || l.starts_with("Build "))
        .collect();
    Ok((version, lines.join("\n")))
}

/// "Cuda compilation tools, release 13.0, V13.0.88" → "13.0.88" (or "13.0" without the V part).
fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.contains("release"))?;
    if let Some(v) = line.rsplit(", V").next().filter(|v| v.chars().next().is_some_and(|c| c.is_ascii_digit())) {
        return Some(v.trim().to_string());
    }
    let after = line.split("release ").nth(1)?;
    Some(after.split(',').next()?.trim().to_string())
}

/// The current directory and the crate's source directory, where `.venv` may be.
fn search_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if !roots.contains(&manifest) {
        roots.push(manifest);
    }
    roots
}

fn non_empty(v: Option<OsString>) -> Option<OsString> {
    v.filter(|s| !s.is_empty())
}

/// Finds nvcc: `NVCC`, `CUDA_HOME/bin/nvcc`, `PATH`, then `<root>/.venv`.
fn locate_nvcc(
    nvcc_env: Option<OsString>,
    cuda_home: Option<OsString>,
    path: Option<OsString>,
    roots: &[PathBuf],
) -> std::result::Result<PathBuf, String> {
    if let Some(p) = non_empty(nvcc_env).map(PathBuf::from) {
        if !p.is_file() {
            return Err(format!("{NVCC_ENV}={} does not name a file; {HOW_TO_GET_NVCC}", p.display()));
        }
        return Ok(p);
    }
    if let Some(home) = non_empty(cuda_home).map(PathBuf::from) {
        let p = home.join("bin").join("nvcc");
        if !p.is_file() {
            return Err(format!("{CUDA_HOME_ENV}={} has no bin/nvcc; {HOW_TO_GET_NVCC}", home.display()));
        }
        return Ok(p);
    }
    let mut looked: Vec<String> = Vec::new();
    if let Some(path) = non_empty(path) {
        if let Some(p) = std::env::split_paths(&path).map(|d| d.join("nvcc")).find(|p| p.is_file()) {
            return Ok(p);
        }
        looked.push("PATH".to_string());
    }
    for root in roots {
        for sp in site_packages(&root.join(".venv")) {
            let p = sp.join("nvidia").join("cu13").join("bin").join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
        looked.push(format!("{}/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc", root.display()));
    }
    Err(format!("nvcc not found (looked in: {NVCC_ENV}, {CUDA_HOME_ENV}, {}); {HOW_TO_GET_NVCC}", looked.join(", ")))
}

/// Finds the CUTLASS folder (holding `include/` and `tools/util/include/`): `CUTLASS_DIR`, then
/// the nvidia-cutlass wheel of `<root>/.venv`.
fn locate_cutlass(cutlass_env: Option<OsString>, roots: &[PathBuf]) -> std::result::Result<PathBuf, String> {
    if let Some(dir) = non_empty(cutlass_env).map(PathBuf::from) {
        // Accept the wheel's package folder too, not only its source/ subfolder.
        let wheel_source = dir.join("source");
        if !dir.join("include").is_dir() && wheel_source.join("include").is_dir() {
            return cutlass_at(&wheel_source).map(|_| wheel_source);
        }
        return cutlass_at(&dir).map(|_| dir).map_err(|e| format!("{CUTLASS_DIR_ENV}: {e}"));
    }
    let mut looked: Vec<String> = Vec::new();
    for root in roots {
        for sp in site_packages(&root.join(".venv")) {
            let dir = sp.join("cutlass_library").join("source");
            if dir.join("include").join("cutlass").join("cutlass.h").is_file() {
                return Ok(dir);
            }
        }
        looked.push(format!("{}/.venv/lib/python3*/site-packages/cutlass_library/source", root.display()));
    }
    Err(format!(
        "CUTLASS {CUTLASS_MAJOR}.{CUTLASS_MIN_MINOR} headers not found (looked in: {CUTLASS_DIR_ENV}, {}); {HOW_TO_GET_CUTLASS}",
        looked.join(", ")
    ))
}

/// Checks a CUTLASS folder and reads its version.
fn cutlass_at(dir: &Path) -> std::result::Result<Cutlass, String> {
    let include = dir.join("include");
    let util_include = dir.join("tools").join("util").join("include");
    let version_h = include.join("cutlass").join("version.h");
    if !include.join("cutlass").join("cutlass.h").is_file() {
        return Err(format!(
            "{} is not a CUTLASS folder (no include/cutlass/cutlass.h); {HOW_TO_GET_CUTLASS}",
            dir.display()
        ));
    }
    if !util_include.join("cutlass").join("util").is_dir() {
        return Err(format!(
            "{} lacks tools/util/include/cutlass/util (needed for cutlass/util/packed_stride.hpp); {HOW_TO_GET_CUTLASS}",
            dir.display()
        ));
    }
    let text = std::fs::read_to_string(&version_h)
        .map_err(|e| format!("cannot read {}: {e}; {HOW_TO_GET_CUTLASS}", version_h.display()))?;
    let (major, minor, patch) = parse_cutlass_version(&text)
        .ok_or_else(|| format!("{} defines no CUTLASS_MAJOR/MINOR/PATCH", version_h.display()))?;
    if major != CUTLASS_MAJOR || minor < CUTLASS_MIN_MINOR {
        return Err(format!(
            "{} holds CUTLASS {major}.{minor}.{patch}, but the CUDA kernels are written for CUTLASS \
             {CUTLASS_MAJOR}.x from {CUTLASS_MAJOR}.{CUTLASS_MIN_MINOR} on; {HOW_TO_GET_CUTLASS}",
            dir.display()
        ));
    }
    Ok(Cutlass { include, util_include, version: format!("{major}.{minor}.{patch}") })
}

fn parse_cutlass_version(version_h: &str) -> Option<(u32, u32, u32)> {
    let get = |name: &str| -> Option<u32> {
        version_h.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            if it.next()? == "#define" && it.next()? == name {
                it.next()?.parse().ok()
            } else {
                None
            }
        })
    };
    Some((get("CUTLASS_MAJOR")?, get("CUTLASS_MINOR")?, get("CUTLASS_PATCH")?))
}

/// `<venv>/lib/python3*/site-packages`, sorted.
fn site_packages(venv: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(venv.join("lib")) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
            .map(|e| e.path().join("site-packages"))
            .filter(|p| p.is_dir())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onnx2ait-nvcc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn touch(p: &Path, text: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn arch_parses_and_rejects() {
        assert_eq!("sm_80".parse::<Arch>().unwrap(), Arch::Sm80);
        assert_eq!("SM_90A".parse::<Arch>().unwrap(), Arch::Sm90a);
        assert_eq!(" sm_90 ".parse::<Arch>().unwrap(), Arch::Sm90);
        let e = "sm_86".parse::<Arch>().unwrap_err().to_string();
        assert!(e.contains("'sm_86'") && e.contains("sm_80, sm_90, sm_90a"), "{e}");
        assert_eq!(Arch::Sm90a.gencode(), "-gencode=arch=compute_90a,code=sm_90a");
        assert_eq!(serde_json::to_string(&Arch::Sm90a).unwrap(), "\"sm_90a\"");
    }

    #[test]
    fn versions_parse() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild x\n";
        assert_eq!(parse_version(text).as_deref(), Some("13.0.88"));
        assert_eq!(parse_version("Cuda compilation tools, release 12.4\n").as_deref(), Some("12.4"));
        assert_eq!(parse_version("nothing"), None);
        let h = "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0 \n";
        assert_eq!(parse_cutlass_version(h), Some((4, 2, 0)));
        assert_eq!(parse_cutlass_version("#define CUTLASS_MAJOR 4\n"), None);
    }

    #[test]
    fn nvcc_lookup_order_and_messages() {
        let d = tempdir("lookup");
        let bin = d.join("cuda/bin/nvcc");
        touch(&bin, "");
        let venv_nvcc = d.join("proj/.venv/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc");
        touch(&venv_nvcc, "");
        let roots = vec![d.join("empty"), d.join("proj")];

        // Explicit settings win, and a wrong one is an error, not a fall-back.
        assert_eq!(locate_nvcc(Some(bin.clone().into()), None, None, &roots).unwrap(), bin);
        let e = locate_nvcc(Some("/nonexistent/nvcc".into()), None, None, &roots).unwrap_err();
        assert!(e.contains("NVCC=/nonexistent/nvcc") && e.contains("setup-python.sh"), "{e}");
        assert_eq!(locate_nvcc(None, Some(d.join("cuda").into()), None, &roots).unwrap(), bin);
        let e = locate_nvcc(None, Some("/nonexistent".into()), None, &roots).unwrap_err();
        assert!(e.contains("CUDA_HOME=/nonexistent has no bin/nvcc"), "{e}");
        let path = std::env::join_paths([d.join("none"), d.join("cuda/bin")]).unwrap();
        assert_eq!(locate_nvcc(None, None, Some(path), &roots).unwrap(), bin);
        // Empty variables count as unset.
        assert_eq!(locate_nvcc(Some("".into()), Some("".into()), None, &roots).unwrap(), venv_nvcc);

        let e = locate_nvcc(None, None, Some(d.join("none").into()), &roots[..1]).unwrap_err();
        assert!(e.starts_with("nvcc not found (looked in: NVCC, CUDA_HOME, PATH, "), "{e}");
        assert!(e.contains("empty/.venv/lib/python3*/site-packages/nvidia/cu13/bin/nvcc"), "{e}");
        assert!(e.contains("nvidia-cuda-nvcc 13.0"), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn cutlass_lookup_and_version_check() {
        let d = tempdir("cutlass");
        let make = |dir: &Path, minor: u32| {
            touch(&dir.join("include/cutlass/cutlass.h"), "");
            touch(
                &dir.join("include/cutlass/version.h"),
                &format!("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR {minor}\n#define CUTLASS_PATCH 1\n"),
            );
            std::fs::create_dir_all(dir.join("tools/util/include/cutlass/util")).unwrap();
        };
        let wheel = d.join("proj/.venv/lib/python3.12/site-packages/cutlass_library");
        make(&wheel.join("source"), 2);
        let old = d.join("old");
        make(&old, 1);
        let roots = vec![d.join("proj")];

        assert_eq!(locate_cutlass(None, &roots).unwrap(), wheel.join("source"));
        assert_eq!(locate_cutlass(Some(wheel.clone().into()), &[]).unwrap(), wheel.join("source"));
        assert_eq!(locate_cutlass(Some(wheel.join("source").into()), &[]).unwrap(), wheel.join("source"));
        assert_eq!(cutlass_at(&wheel.join("source")).unwrap().version, "4.2.1");
        let e = locate_cutlass(Some(old.clone().into()), &roots).unwrap_err();
        assert!(e.contains("CUTLASS 4.1.1") && e.contains("CUTLASS_DIR"), "{e}");
        let e = locate_cutlass(Some(d.join("nothing").into()), &roots).unwrap_err();
        assert!(e.contains("not a CUTLASS folder"), "{e}");
        let e = locate_cutlass(None, &[d.join("empty")]).unwrap_err();
        assert!(e.starts_with("CUTLASS 4.2 headers not found (looked in: CUTLASS_DIR, "), "{e}");
        assert!(e.contains("or set CUTLASS_DIR"), "{e}");
        std::fs::remove_dir_all(&d).ok();
    }
}
