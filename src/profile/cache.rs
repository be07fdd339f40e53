//! The on-disk profile cache: measured kernel times shared across models and runs.
//!
//! One JSON file (default `~/.cache/onnx2ait/profile.json`, env `ONNX2AIT_PROFILE_CACHE`), keyed
//! by device — GPU name, architecture, nvcc version and CUTLASS version, since a time holds only
//! for the same chip and the same compiled code — then by problem signature (sizes, layouts,
//! epilogue: `CudaTarget`'s signatures), then by instance configuration. Every outcome is kept,
//! not only times: an instance that cannot run a problem or disagrees with the reference is not
//! tried again on the next run, which is what makes an interrupted profile resumable. The file is
//! written atomically (temporary file + rename) after every problem.
//!
//! Several `profile` runs may share the file (two models profiled at once, or one per GPU). Each
//! save therefore takes an advisory lock (`profile.json.lock` beside it), reads the file as it is
//! now, adds what this run measured since its last save and writes the merge: no run's results
//! are lost to another's, and each run sees the others' results from its next save on.

use crate::error::{Error, Result};
use crate::lower::target::Measurements;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bumped when signatures or configurations change meaning: old entries are then ignored.
pub const FORMAT_VERSION: u32 = 1;

/// The outcome of one (problem, instance) measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// Ran and matched the reference: the median time.
    Ok { ms: f64 },
    /// The instance's CHECK mode refused the problem (the reason).
    Unsupported { why: String },
    /// Ran but disagreed with the reference (max |out − ref| and max |ref|).
    Mismatch { max_abs_err: f64, max_abs_ref: f64 },
    /// Failed at run time (the message).
    Failed { why: String },
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    format_version: u32,
    /// device key → signature → instance config → outcome.
    devices: BTreeMap<String, BTreeMap<String, BTreeMap<String, Outcome>>>,
}

pub struct ProfileCache {
    path: PathBuf,
    data: CacheFile,
    /// Outcomes put since the last save, which it merges into the file: (device, signature,
    /// config, outcome).
    unsaved: Vec<(String, String, String, Outcome)>,
}

/// The lock file of the cache file `path`: `<path>.lock`. A lock on the cache file itself would
/// not do: each save replaces that file by renaming another over it.
fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    path.with_file_name(name)
}

/// The device part of a cache key: `NVIDIA H200 | sm_90a | nvcc 13.0.88 | cutlass 4.2.0`, with
/// the toolchain's compiler and instance library as `profile::toolchain` names them.
pub fn device_key(gpu: &str, arch: &str, compiler: &str, library: &str) -> String {
    format!("{gpu} | {arch} | {compiler} | {library}")
}

/// The cache file used when none is given: `$ONNX2AIT_PROFILE_CACHE`, else
/// `$XDG_CACHE_HOME/onnx2ait/profile.json`, else `~/.cache/onnx2ait/profile.json`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ONNX2AIT_PROFILE_CACHE") {
        return Some(PathBuf::from(p));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("onnx2ait").join("profile.json"))
}

impl ProfileCache {
    /// Opens a cache file; a missing file is an empty cache, an unreadable one an error.
    pub fn open(path: &Path) -> Result<ProfileCache> {
        Ok(ProfileCache { path: path.to_path_buf(), data: Self::read(path)?, unsaved: Vec::new() })
    }

    /// The file's contents: empty when it is missing or of another format version.
    fn read(path: &Path) -> Result<CacheFile> {
        let data = match std::fs::read(path) {
            Ok(bytes) => {
                let data: CacheFile = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::Other(format!(
                        "profile cache {}: not a profile cache ({e}); delete it or pick another file",
                        path.display()
                    ))
                })?;
                if data.format_version == FORMAT_VERSION {
                    data
                } else {
                    // An older layout: start over (its keys would not match).
                    CacheFile { format_version: FORMAT_VERSION, ..Default::default() }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                CacheFile { format_version: FORMAT_VERSION, ..Default::default() }
            }
            Err(e) => return Err(Error::Other(format!("profile cache {}: {e}", path.display()))),
        };
        Ok(data)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, device: &str, signature: &str, config: &str) -> Option<&Outcome> {
        self.data.devices.get(device)?.get(signature)?.get(config)
    }

    pub fn put(&mut self, device: &str, signature: &str, config: &str, outcome: Outcome) {
        self.unsaved.push((device.to_string(), signature.to_string(), config.to_string(), outcome.clone()));
        Self::insert(&mut self.data, device, signature, config, outcome);
    }

    fn insert(data: &mut CacheFile, device: &str, signature: &str, config: &str, outcome: Outcome) {
        data.devices
            .entry(device.to_string())
            .or_default()
            .entry(signature.to_string())
            .or_default()
            .insert(config.to_string(), outcome);
    }

    /// Merges what was put since the last save into the file as it is now, under the file's lock,
    /// and writes it atomically (a reader never sees half a file). Afterwards this cache also
    /// holds what other runs saved meanwhile.
    pub fn save(&mut self) -> Result<()> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Other(format!("profile cache: cannot create {}: {e}", dir.display())))?;
        }
        let _held = crate::build::lock::lock(&lock_path(&self.path))?;
        let mut data = Self::read(&self.path)?;
        for (device, signature, config, outcome) in &self.unsaved {
            Self::insert(&mut data, device, signature, config, outcome.clone());
        }
        let text = serde_json::to_string_pretty(&data).map_err(|e| Error::Other(e.to_string()))? + "\n";
        // The lock makes the temporary name private to this save.
        let tmp = self.path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, text).and_then(|_| std::fs::rename(&tmp, &self.path)).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::Other(format!("profile cache {}: cannot write: {e}", self.path.display()))
        })?;
        self.data = data;
        self.unsaved.clear();
        Ok(())
    }

    /// The device keys whose architecture and toolchain match (any GPU name).
    pub fn devices_for(&self, arch: &str, compiler: &str, library: &str) -> Vec<String> {
        let suffix = device_key("", arch, compiler, library);
        self.data.devices.keys().filter(|k| k.ends_with(&suffix) && k.len() > suffix.len()).cloned().collect()
    }

    /// The successful times of one device, for the target's choice.
    pub fn measurements(&self, device: &str) -> Measurements {
        let mut m = Measurements::new();
        if let Some(sigs) = self.data.devices.get(device) {
            for (sig, configs) in sigs {
                let times: BTreeMap<String, f64> = configs
                    .iter()
                    .filter_map(|(c, o)| match o {
                        Outcome::Ok { ms } => Some((c.clone(), *ms)),
                        _ => None,
                    })
                    .collect();
                if !times.is_empty() {
                    m.insert(sig.clone(), times);
                }
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("o2a-profile-cache-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d.join("sub").join("profile.json")
    }

    #[test]
    fn round_trip_and_measurements() {
        let path = tmp("rt");
        let mut c = ProfileCache::open(&path).expect("missing file = empty cache");
        let dev = device_key("NVIDIA H200", "sm_90a", "nvcc 13.0.88", "cutlass 4.2.0");
        c.put(&dev, "conv2d n1 ...", "conv2d_sm80 64x64x32", Outcome::Ok { ms: 0.012 });
        c.put(&dev, "conv2d n1 ...", "conv2d_sm90 128x128x64 c1x1", Outcome::Unsupported { why: "C % 8".into() });
        c.put(&dev, "conv2d n1 ...", "x", Outcome::Mismatch { max_abs_err: 3.0, max_abs_ref: 1.0 });
        c.save().unwrap();
        let c = ProfileCache::open(&path).unwrap();
        assert_eq!(c.get(&dev, "conv2d n1 ...", "conv2d_sm80 64x64x32"), Some(&Outcome::Ok { ms: 0.012 }));
        let m = c.measurements(&dev);
        assert_eq!(m["conv2d n1 ..."].len(), 1, "only successful runs are choices");
        assert_eq!(c.devices_for("sm_90a", "nvcc 13.0.88", "cutlass 4.2.0"), std::slice::from_ref(&dev));
        assert!(c.devices_for("sm_90a", "nvcc 13.0.99", "cutlass 4.2.0").is_empty());
        assert!(c.measurements("another GPU").is_empty());
    }

    #[test]
    fn concurrent_writers_keep_each_others_results() {
        let path = tmp("merge");
        let dev = device_key("GPU", "sm_90a", "nvcc 13.0.88", "cutlass 4.2.0");
        // Two runs opened the (empty) cache before either saved.
        let mut a = ProfileCache::open(&path).unwrap();
        let mut b = ProfileCache::open(&path).unwrap();
        a.put(&dev, "sig a", "cfg", Outcome::Ok { ms: 1.0 });
        b.put(&dev, "sig b", "cfg", Outcome::Ok { ms: 2.0 });
        a.save().unwrap();
        b.save().unwrap();
        // b's save took a's results in too; a sees b's after its next save.
        assert_eq!(b.get(&dev, "sig a", "cfg"), Some(&Outcome::Ok { ms: 1.0 }));
        a.put(&dev, "sig a", "cfg2", Outcome::Failed { why: "x".into() });
        a.save().unwrap();
        assert_eq!(a.get(&dev, "sig b", "cfg"), Some(&Outcome::Ok { ms: 2.0 }));
        let c = ProfileCache::open(&path).unwrap();
        assert_eq!(c.get(&dev, "sig a", "cfg"), Some(&Outcome::Ok { ms: 1.0 }));
        assert_eq!(c.get(&dev, "sig b", "cfg"), Some(&Outcome::Ok { ms: 2.0 }));
        assert!(c.get(&dev, "sig a", "cfg2").is_some());

        // Many writers at once, each saving after every result: every result survives.
        let threads = 4;
        let per_thread = 15;
        std::thread::scope(|s| {
            for t in 0..threads {
                let (path, dev) = (&path, &dev);
                s.spawn(move || {
                    let mut c = ProfileCache::open(path).unwrap();
                    for i in 0..per_thread {
                        c.put(dev, &format!("thread {t}"), &format!("cfg {i}"), Outcome::Ok { ms: i as f64 });
                        c.save().unwrap();
                    }
                });
            }
        });
        let c = ProfileCache::open(&path).unwrap();
        for t in 0..threads {
            assert_eq!(c.measurements(&dev)[&format!("thread {t}")].len(), per_thread, "thread {t}");
        }
        assert!(c.get(&dev, "sig b", "cfg").is_some());
        // Only the cache and its lock file remain (no temporary files).
        let mut names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["profile.json", "profile.json.lock"]);
    }

    #[test]
    fn corrupt_file_names_itself() {
        let path = tmp("bad");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "not json").unwrap();
        let e = ProfileCache::open(&path).err().expect("an error").to_string();
        assert!(e.contains("profile.json") && e.contains("not a profile cache"), "{e}");
    }
}
