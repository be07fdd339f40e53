//! Loading and running the profiler library: `libprofile.so`, linked from the candidate library
//! instances and `profile/profiler.cu` (rendered from `templates/<target>/profile/profiler.cu.hbs`).
//!
//! A *case* is one (problem, candidate) pair: every conv problem's candidates in order, then every
//! gemm problem's. [`ProfilerLib::num_cases`] and [`ProfilerLib::case_info`] are read at load time
//! from host tables and need no GPU; [`ProfilerLib::run`] checks a case against the library's
//! naive reference on the GPU and times it.
//!
//! A candidate that cannot run a problem is [`CaseError::Unsupported`] (expected: the profiler
//! just skips it); anything else is [`CaseError::Failed`]. After a sticky CUDA error (an illegal
//! address in some candidate) the CUDA context is unusable: [`ProfilerLib::context_lost`] says so,
//! and every later run fails; the caller should stop and report the case that broke it.
//!
//! The library is opened like the model library (see [`super`]): `RTLD_NOW | RTLD_LOCAL`.

use super::{c_str, load_local, status_name};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int};
use std::fmt;
use std::path::{Path, PathBuf};

/// The profiler library's file name in its build folder.
pub const PROFILE_LIB_NAME: &str = "libprofile.so";

/// `O2A_ERR_UNSUPPORTED` of library.cuh.
const STATUS_UNSUPPORTED: c_int = 3;

type FnInt = unsafe extern "C" fn() -> c_int;
type FnVoid = unsafe extern "C" fn();
type FnLastError = unsafe extern "C" fn() -> *const c_char;
type FnCaseInfo = unsafe extern "C" fn(c_int, *mut c_int, *mut c_int, *mut c_int) -> c_int;
type FnRun = unsafe extern "C" fn(c_int, c_int, c_int, *mut f32, *mut f32, *mut f32) -> c_int;
type FnDeviceName = unsafe extern "C" fn(*mut c_char, c_int) -> c_int;

/// The profiler's entry points, resolved once; valid while the library is loaded.
struct Api {
    num_cases: FnInt,
    case_info: FnCaseInfo,
    run: FnRun,
    last_error: FnLastError,
    release: FnVoid,
    context_lost: FnInt,
    device_name: FnDeviceName,
    cuda_runtime_version: FnInt,
    sm_count: FnInt,
}

/// What a case measures: problem `problem` (the `index` the profile context gave it) of its kind,
/// with its candidate number `candidate` (position in that problem's candidate list).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CaseInfo {
    pub is_gemm: bool,
    pub problem: usize,
    pub candidate: usize,
}

/// The outcome of a case that ran.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CaseTiming {
    /// Median of the timed runs, milliseconds of device time.
    pub median_ms: f32,
    /// Largest |output − reference| of the checked run (infinite where the output is NaN and
    /// the reference is not, e.g. an element the candidate did not write).
    pub max_abs_err: f32,
    /// Largest |reference| (to judge the error against).
    pub max_abs_ref: f32,
}

/// Why a case has no timing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaseError {
    /// The candidate cannot run this problem (its CHECK said so, with its reason).
    Unsupported(String),
    /// The case failed: a CUDA error, a candidate whose RUN refused what its CHECK accepted, a bad
    /// argument. The message names the case, the problem and the candidate.
    Failed(String),
}

impl fmt::Display for CaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseError::Unsupported(m) => write!(f, "unsupported: {m}"),
            CaseError::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for CaseError {}

/// A loaded `libprofile.so`.
pub struct ProfilerLib {
    path: PathBuf,
    api: Api,
    cases: Vec<CaseInfo>,
    // Dropped last: the function pointers in `api` point into it.
    _lib: libloading::Library,
}

/// Copies one entry point out of the library.
///
/// # Safety
/// `T` must be the function type profiler.cu defines for `name`.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, name: &str, path: &Path) -> Result<T> {
    let cname = format!("{name}\0");
    match lib.get::<T>(cname.as_bytes()) {
        Ok(s) => Ok(*s),
        Err(e) => Err(Error::Other(format!(
            "{}: not an onnx2ait profiler library, or one built by another version (missing {name}: {e}); \
             run `onnx2ait profile` again to rebuild it",
            path.display()
        ))),
    }
}

impl ProfilerLib {
    /// Loads the profiler library at `path` (`…/libprofile.so`) and reads its case table. Needs
    /// no GPU.
    ///
    /// The library is trusted: onnx2ait built it, and loading it runs its initialisers (those of
    /// the statically linked CUDA runtime).
    pub fn load(path: &Path) -> Result<ProfilerLib> {
        if !path.exists() {
            return Err(Error::Other(format!("{}: not found (the profiler library was not built)", path.display())));
        }
        if !path.is_file() {
            return Err(Error::Other(format!("{}: not a file (expected the profiler library)", path.display())));
        }
        // SAFETY: the library is onnx2ait's own output (see the doc comment).
        let lib =
            unsafe { load_local(path) }.map_err(|e| Error::Other(format!("cannot load {}: {e}", path.display())))?;
        // SAFETY: each type below is the signature profiler.cu defines for that name.
        let api = unsafe {
            Api {
                num_cases: symbol(&lib, "o2a_profile_num_cases", path)?,
                case_info: symbol(&lib, "o2a_profile_case_info", path)?,
                run: symbol(&lib, "o2a_profile_run", path)?,
                last_error: symbol(&lib, "o2a_profile_last_error", path)?,
                release: symbol(&lib, "o2a_profile_release", path)?,
                context_lost: symbol(&lib, "o2a_profile_context_lost", path)?,
                device_name: symbol(&lib, "o2a_profile_device_name", path)?,
                cuda_runtime_version: symbol(&lib, "o2a_profile_cuda_runtime_version", path)?,
                sm_count: symbol(&lib, "o2a_profile_sm_count", path)?,
            }
        };
        let mut profiler = ProfilerLib { path: path.to_path_buf(), api, cases: Vec::new(), _lib: lib };
        profiler.cases = profiler.read_cases()?;
        Ok(profiler)
    }

    /// Reads the case table (host-only functions of the library).
    fn read_cases(&self) -> Result<Vec<CaseInfo>> {
        // SAFETY: o2a_profile_num_cases reads a constant.
        let n = unsafe { (self.api.num_cases)() };
        let n = usize::try_from(n).map_err(|_| self.corrupt(&format!("it has {n} cases")))?;
        let mut cases = Vec::with_capacity(n);
        for i in 0..n {
            let c = c_int::try_from(i).map_err(|_| self.corrupt("too many cases"))?;
            let (mut is_gemm, mut problem, mut candidate) = (0, 0, 0);
            // SAFETY: `c` is below the case count; the three pointers are valid for one write.
            let rc = unsafe { (self.api.case_info)(c, &mut is_gemm, &mut problem, &mut candidate) };
            if rc != 0 {
                return Err(self.call_error(&format!("reading case {i}"), rc));
            }
            let problem =
                usize::try_from(problem).map_err(|_| self.corrupt(&format!("case {i} has problem {problem}")))?;
            let candidate =
                usize::try_from(candidate).map_err(|_| self.corrupt(&format!("case {i} has candidate {candidate}")))?;
            cases.push(CaseInfo { is_gemm: is_gemm != 0, problem, candidate });
        }
        Ok(cases)
    }

    fn corrupt(&self, what: &str) -> Error {
        Error::Other(format!("{}: the profiler library is inconsistent: {what}", self.path.display()))
    }

    /// The calling thread's last error message of the library.
    fn last_error(&self) -> String {
        // SAFETY: o2a_profile_last_error returns a thread-local NUL-terminated buffer.
        unsafe { c_str((self.api.last_error)()) }.unwrap_or_default()
    }

    /// The library's message for a failed call, or the status' name when it left none.
    fn message(&self, code: c_int) -> String {
        let msg = self.last_error();
        if msg.is_empty() {
            format!("{} (status {code})", status_name(code))
        } else {
            msg
        }
    }

    fn call_error(&self, what: &str, code: c_int) -> Error {
        Error::Other(format!("{}: {what}: {}", self.path.display(), self.message(code)))
    }

    /// Frees the library's cached device buffers and stream (a later run creates them again):
    /// a profile in parts keeps every part's library loaded, and only the part being timed
    /// needs its buffers.
    pub fn release_buffers(&self) {
        // SAFETY: frees the library's cached device buffers (a no-op when none were created).
        unsafe { (self.api.release)() }
    }

    /// The library file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many (problem, candidate) cases the library holds.
    pub fn num_cases(&self) -> usize {
        self.cases.len()
    }

    /// Every case, in order.
    pub fn cases(&self) -> &[CaseInfo] {
        &self.cases
    }

    /// What case `i` measures.
    pub fn case_info(&self, i: usize) -> Result<CaseInfo> {
        self.cases.get(i).copied().ok_or_else(|| {
            Error::Other(format!(
                "{}: case {i} is out of range (the library has {} cases)",
                self.path.display(),
                self.cases.len()
            ))
        })
    }

    /// Checks case `i` against the reference, then times `iters` runs (after `warmup` untimed
    /// ones) on the current GPU.
    pub fn run(&self, i: usize, warmup: u32, iters: u32) -> std::result::Result<CaseTiming, CaseError> {
        let case = c_int::try_from(i).ok().filter(|_| i < self.cases.len()).ok_or_else(|| {
            CaseError::Failed(format!("case {i} is out of range (the library has {} cases)", self.cases.len()))
        })?;
        let warmup = c_int::try_from(warmup)
            .map_err(|_| CaseError::Failed(format!("case {i}: warmup {warmup} is too large")))?;
        if iters == 0 {
            return Err(CaseError::Failed(format!("case {i}: iters must be at least 1")));
        }
        let iters =
            c_int::try_from(iters).map_err(|_| CaseError::Failed(format!("case {i}: iters {iters} is too large")))?;
        let mut t = CaseTiming { median_ms: 0.0, max_abs_err: 0.0, max_abs_ref: 0.0 };
        // SAFETY: the case is in range; the three pointers are valid for one write each.
        let rc =
            unsafe { (self.api.run)(case, warmup, iters, &mut t.median_ms, &mut t.max_abs_err, &mut t.max_abs_ref) };
        match rc {
            0 => Ok(t),
            STATUS_UNSUPPORTED => Err(CaseError::Unsupported(self.message(rc))),
            _ => Err(CaseError::Failed(self.message(rc))),
        }
    }

    /// Whether a sticky CUDA error made the context unusable: no further case can run in this
    /// process. Host only.
    pub fn context_lost(&self) -> bool {
        // SAFETY: reads a flag under the library's lock.
        unsafe { (self.api.context_lost)() != 0 }
    }

    /// The current GPU's name ("NVIDIA H200").
    pub fn device_name(&self) -> Result<String> {
        let mut buf = vec![0u8; 256];
        let len = c_int::try_from(buf.len()).expect("256 fits in a C int");
        // SAFETY: `buf` holds `len` bytes; the library writes a NUL-terminated string into it.
        let rc = unsafe { (self.api.device_name)(buf.as_mut_ptr().cast(), len) };
        if rc != 0 {
            // The library's message says what it was reading.
            return Err(Error::Other(format!("{}: {}", self.path.display(), self.message(rc))));
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// The CUDA runtime version linked into the library (`major * 1000 + minor * 10`, e.g. 13000).
    pub fn cuda_runtime_version(&self) -> Result<i32> {
        // SAFETY: no arguments.
        let v = unsafe { (self.api.cuda_runtime_version)() };
        if v < 0 {
            return Err(Error::Other(format!("{}: {}", self.path.display(), self.last_error())));
        }
        Ok(v)
    }

    /// The current GPU's multiprocessor count.
    pub fn sm_count(&self) -> Result<u32> {
        // SAFETY: no arguments.
        let n = unsafe { (self.api.sm_count)() };
        u32::try_from(n).map_err(|_| Error::Other(format!("{}: {}", self.path.display(), self.last_error())))
    }
}

impl Drop for ProfilerLib {
    fn drop(&mut self) {
        self.release_buffers();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onnx2ait-profiler-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn load_err(path: &Path) -> String {
        match ProfilerLib::load(path) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn missing_library_is_named() {
        let dir = temp_dir("missing");
        let path = dir.join(PROFILE_LIB_NAME);
        let msg = load_err(&path);
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("not found"), "{msg}");
    }

    #[test]
    fn directory_is_not_a_library() {
        let dir = temp_dir("dir");
        let msg = load_err(&dir);
        assert!(msg.contains(&dir.display().to_string()) && msg.contains("not a file"), "{msg}");
    }

    #[test]
    fn garbage_file_fails_to_load_and_is_named() {
        let dir = temp_dir("garbage");
        let path = dir.join(PROFILE_LIB_NAME);
        std::fs::write(&path, b"not an ELF file").unwrap();
        let msg = load_err(&path);
        assert!(msg.starts_with("cannot load") && msg.contains(&path.display().to_string()), "{msg}");
    }

    #[test]
    fn a_library_without_the_profiler_api_is_rejected() {
        // Any shared library without the o2a_profile_* symbols: the C math library.
        let Some(libm) = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"]
            .iter()
            .map(Path::new)
            .find(|p| p.is_file())
        else {
            eprintln!("skipped: no libm.so.6 at the usual places");
            return;
        };
        let msg = load_err(libm);
        assert!(msg.contains("not an onnx2ait profiler library"), "{msg}");
        assert!(msg.contains("o2a_profile_num_cases") && msg.contains(&libm.display().to_string()), "{msg}");
    }

    #[test]
    fn case_errors_display_their_kind() {
        assert_eq!(CaseError::Unsupported("k % 8".into()).to_string(), "unsupported: k % 8");
        assert_eq!(CaseError::Failed("illegal address".into()).to_string(), "failed: illegal address");
    }
}
