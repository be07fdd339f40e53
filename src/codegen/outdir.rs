//! The output folder of `onnx2ait compile`: staged, swapped in, and never touching a user's files.
//!
//! - **Ownership.** OUT holds [`MANIFEST`], the list of every top-level entry onnx2ait wrote there
//!   (files, and the object cache folder `obj`), the build hash and whether the library belongs
//!   to that build. Only listed entries are ever replaced or removed. A non-empty folder without a
//!   manifest is refused unless `force` (then files of the names onnx2ait writes are replaced and
//!   every other file is left alone). A folder written by an onnx2ait from before the manifest
//!   (a `build.json` whose generator is onnx2ait) is recognised: its `build.json` lists its
//!   sources and headers, the other names are fixed.
//! - **Staging.** Everything is rendered and built in a folder next to OUT
//!   (`.<name>.onnx2ait-staging-<pid>`, same parent, so renames stay on one file system). The
//!   previous build's object cache (`obj`) moves there and its library is hard-linked there, so
//!   an unchanged model neither recompiles nor relinks. OUT keeps the previous, consistent output
//!   until [`Staging::commit`]; an error before it (or an interrupt) leaves OUT as it was, and the
//!   next run removes the abandoned staging folder (keeping its object cache).
//! - **Swap.** A missing OUT is the staging folder renamed. An existing OUT first gets a manifest
//!   claiming the old and the new entries (so an interrupted swap is cleaned up by the next run),
//!   loses its library, receives the new entries (the library last), loses the old entries the
//!   new output does not have, and gets the final manifest. A library is only ever next to the
//!   sources and weights it was built from: after `--no-build` or a failed build OUT has none.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The manifest of an output folder.
pub const MANIFEST: &str = "onnx2ait-manifest.json";

/// Version of the manifest's layout.
const MANIFEST_VERSION: u32 = 1;

/// The object cache of a build without `--cache-dir` (`crate::build::private_cache_dir`).
const OBJ_DIR: &str = "obj";

/// The library and its link stamp (`crate::build`), which only ever sit beside their own build.
const LIBRARY_FILES: [&str; 2] = [crate::runtime::LIB_NAME, "libmodel.so.stamp"];

/// Top-level names of an output folder written by an onnx2ait from before the manifest, besides
/// the sources and headers its `build.json` lists.
const LEGACY_NAMES: &[&str] = &[
    "build.json",
    "weights.bin",
    "weights.json",
    "graph.json",
    "kernels.json",
    "summary.txt",
    "libmodel.so",
    "libmodel.so.stamp",
    "build.log",
    "build_report.json",
    OBJ_DIR,
];

/// What OUT holds, written by onnx2ait as OUT's last step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    pub generator: String,
    /// The build hash of the sources and weights (`O2A_BUILD_HASH`); empty while a swap is under
    /// way.
    pub build_hash: String,
    /// The library built from these sources, when there is one.
    pub library: Option<String>,
    /// Every top-level entry onnx2ait wrote, sorted (the manifest itself excluded).
    pub files: Vec<String>,
}

impl Manifest {
    /// The manifest of `dir`; `None` when it has none.
    pub fn read(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::Other(format!("{}: cannot read: {e}", path.display()))),
        };
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| Error::Other(format!("{}: not an onnx2ait manifest: {e}", path.display())))
    }

    /// Writes the manifest into `dir` through a temporary file, so readers see the old or the new.
    fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| Error::Other(e.to_string()))? + "\n";
        let tmp = dir.join(format!(".{MANIFEST}.tmp{}", std::process::id()));
        let path = dir.join(MANIFEST);
        std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::Other(format!("{}: cannot write: {e}", path.display()))
        })
    }
}

/// A name onnx2ait may own: one plain component (a manifest can never point outside OUT).
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

fn entries(dir: &Path) -> Result<BTreeSet<String>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Other(format!("{}: cannot list: {e}", dir.display())))?;
    Ok(rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
}

/// The entries of a pre-manifest onnx2ait output, or `None` when `dir` is not one.
fn legacy_owned(dir: &Path) -> Option<BTreeSet<String>> {
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("build.json")).ok()?).ok()?;
    if !meta["generator"].as_str().is_some_and(|g| g.starts_with("onnx2ait ")) {
        return None;
    }
    let mut owned: BTreeSet<String> = LEGACY_NAMES.iter().map(|s| s.to_string()).collect();
    for list in ["sources", "headers"] {
        for f in meta[list].as_array().into_iter().flatten().filter_map(|f| f.as_str()) {
            owned.insert(f.to_string());
        }
    }
    Some(owned)
}

fn remove_entry(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether process `pid` is running (Linux: /proc; elsewhere assumed running, so nothing of a
/// live build is ever removed).
fn alive(pid: u32) -> bool {
    !Path::new("/proc/self").exists() || Path::new(&format!("/proc/{pid}")).exists()
}

/// An output folder being written: the staging folder and what OUT held before.
pub struct Staging {
    /// OUT as given (for messages).
    out: PathBuf,
    /// OUT with its parent resolved (where renames happen).
    real: PathBuf,
    dir: PathBuf,
    /// Whether OUT existed when staging began.
    existed: bool,
    /// OUT's entries onnx2ait may replace or remove.
    owned: BTreeSet<String>,
    done: bool,
}

impl Staging {
    /// Checks OUT and creates the staging folder next to it. A non-empty OUT must be an onnx2ait
    /// output (have a manifest, or be a pre-manifest output) unless `force`.
    pub fn begin(out: &Path, force: bool) -> Result<Staging> {
        if out.as_os_str().is_empty() {
            return Err(Error::Other("the output folder is an empty path".into()));
        }
        let shown = out.display();
        let existed = match std::fs::metadata(out) {
            Ok(m) if m.is_dir() => true,
            Ok(_) => return Err(Error::Other(format!("{shown}: exists and is not a directory"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(Error::Other(format!("{shown}: {e}"))),
        };
        let real = if existed {
            std::fs::canonicalize(out).map_err(|e| Error::Other(format!("{shown}: {e}")))?
        } else {
            // A missing OUT becomes the staging folder renamed: its parent must exist.
            let parent = match out.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            std::fs::create_dir_all(&parent)
                .map_err(|e| Error::Other(format!("{}: cannot create directory: {e}", parent.display())))?;
            let parent =
                std::fs::canonicalize(&parent).map_err(|e| Error::Other(format!("{}: {e}", parent.display())))?;
            match out.file_name() {
                Some(name) => parent.join(name),
                None => return Err(Error::Other(format!("{shown}: not a usable output folder name"))),
            }
        };
        let owned = if existed { Self::owned_entries(out, &real, force)? } else { BTreeSet::new() };
        let (Some(parent), Some(name)) = (real.parent().map(Path::to_path_buf), real.file_name()) else {
            return Err(Error::Other(format!("{shown}: cannot stage next to it (it has no parent folder)")));
        };
        let prefix = format!(".{}.onnx2ait-staging-", name.to_string_lossy());
        let dir = parent.join(format!("{prefix}{}", std::process::id()));
        let _ = remove_entry(&dir);
        std::fs::create_dir(&dir).map_err(|e| {
            Error::Other(format!("{shown}: cannot create the staging folder {} next to it: {e}", dir.display()))
        })?;
        let staging = Staging { out: out.to_path_buf(), real, dir, existed, owned, done: false };
        // The previous build's object cache comes along, so unchanged sources are not recompiled.
        if staging.owned.contains(OBJ_DIR) && staging.real.join(OBJ_DIR).is_dir() {
            let _ = std::fs::rename(staging.real.join(OBJ_DIR), staging.dir.join(OBJ_DIR));
        }
        staging.remove_abandoned(&parent, &prefix);
        Ok(staging)
    }

    /// The entries of an existing OUT that onnx2ait owns, or the refusal to write into it.
    fn owned_entries(out: &Path, real: &Path, force: bool) -> Result<BTreeSet<String>> {
        let present = entries(real)?;
        if present.is_empty() {
            return Ok(BTreeSet::new());
        }
        let refuse = |why: String| {
            Error::Other(format!(
                "{}: {why}; onnx2ait writes only into a new or empty folder or one it wrote before \
                 (choose another folder, or pass --force to write into it: files of the names \
                 onnx2ait writes are replaced, every other file is left alone)",
                out.display()
            ))
        };
        let owned = match Manifest::read(real) {
            Ok(Some(m)) => m.files.into_iter().chain([MANIFEST.to_string()]).collect(),
            Ok(None) => match legacy_owned(real) {
                Some(owned) => owned,
                None if force => BTreeSet::new(),
                None => {
                    let shown: Vec<&str> = present.iter().take(5).map(String::as_str).collect();
                    let more = if present.len() > 5 { ", …" } else { "" };
                    return Err(refuse(format!(
                        "the folder is not empty ({}{more}) and was not written by onnx2ait (it has no {MANIFEST})",
                        shown.join(", ")
                    )));
                }
            },
            Err(_) if force => BTreeSet::new(),
            Err(e) => return Err(refuse(e.to_string())),
        };
        Ok(owned.into_iter().filter(|n| plain_name(n)).collect())
    }

    /// Removes staging folders of this OUT left by runs that were killed, keeping the object cache
    /// of the newest when this run has none.
    fn remove_abandoned(&self, parent: &Path, prefix: &str) {
        let Ok(rd) = std::fs::read_dir(parent) else { return };
        let mut abandoned: Vec<(std::time::SystemTime, PathBuf)> = rd
            .flatten()
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix(prefix)
                    .and_then(|pid| pid.parse::<u32>().ok())
                    .is_some_and(|pid| pid != std::process::id() && !alive(pid))
            })
            .map(|e| (e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH), e.path()))
            .collect();
        abandoned.sort();
        for (_, path) in abandoned.iter().rev() {
            if !self.dir.join(OBJ_DIR).exists() && path.join(OBJ_DIR).is_dir() {
                let _ = std::fs::rename(path.join(OBJ_DIR), self.dir.join(OBJ_DIR));
            }
            let _ = std::fs::remove_dir_all(path);
        }
    }

    /// The staging folder: render and build here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// OUT as given.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// `text` with the staging folder's path replaced by OUT's (for messages about files that
    /// will be in OUT).
    pub fn rewrite_paths(&self, text: &str) -> String {
        text.replace(&self.dir.to_string_lossy().into_owned(), &self.out.to_string_lossy())
    }

    /// Hard-links (or copies) the previous build's library and its link stamp into the staging
    /// folder, so a build whose objects are unchanged does not link again. Best effort.
    pub fn carry_library(&self) {
        for name in LIBRARY_FILES {
            if !self.owned.contains(name) {
                continue;
            }
            let (from, to) = (self.real.join(name), self.dir.join(name));
            if from.is_file() && std::fs::hard_link(&from, &to).is_err() {
                let _ = std::fs::copy(&from, &to);
            }
        }
    }

    /// Swaps the staging folder into OUT. `built` says that the staging folder's library was built
    /// from its sources (false after `--no-build` or a failed build: then no library is left in
    /// OUT, neither a carried one nor the previous one). Returns the manifest written.
    pub fn commit(mut self, build_hash: &str, built: bool) -> Result<Manifest> {
        if !built {
            // A library carried from the previous build is not this build's.
            for name in LIBRARY_FILES {
                let _ = std::fs::remove_file(self.dir.join(name));
            }
        }
        let library = built.then_some(crate::runtime::LIB_NAME);
        let new: BTreeSet<String> = entries(&self.dir)?.into_iter().filter(|n| n != MANIFEST).collect();
        let manifest = Manifest {
            format_version: MANIFEST_VERSION,
            generator: concat!("onnx2ait ", env!("CARGO_PKG_VERSION")).to_string(),
            build_hash: build_hash.to_string(),
            library: library.map(str::to_string),
            files: new.iter().cloned().collect(),
        };
        let (out, real, dir) = (self.out.clone(), self.real.clone(), self.dir.clone());
        let io = |what: &str, path: &Path, e: std::io::Error| {
            Error::Other(format!("{}: {what} {}: {e}", out.display(), path.display()))
        };
        if !self.existed {
            manifest.write(&dir)?;
            std::fs::rename(&dir, &real).map_err(|e| io("cannot move the staging folder to", &real, e))?;
            self.done = true;
            return Ok(manifest);
        }
        // 1. Claim every entry of the old and the new output, without a library, so that a swap
        //    cut short is finished by the next run and never leaves a library beside other files.
        let present = entries(&real)?;
        let old: BTreeSet<String> =
            self.owned.iter().filter(|n| present.contains(*n) && *n != MANIFEST).cloned().collect();
        let claim = Manifest {
            build_hash: String::new(),
            library: None,
            files: old.union(&new).cloned().collect(),
            ..manifest.clone()
        };
        claim.write(&real)?;
        // 2. The old library goes first.
        for name in LIBRARY_FILES {
            if old.contains(name) {
                remove_entry(&real.join(name)).map_err(|e| io("cannot remove", &real.join(name), e))?;
            }
        }
        // 3. The new entries, the library last.
        let mut order: Vec<&String> = new.iter().collect();
        order.sort_by_key(|n| library == Some(n.as_str()));
        for name in order {
            let (from, to) = (dir.join(name), real.join(name));
            let from_dir = from.is_dir();
            if to.symlink_metadata().is_ok() {
                if from_dir || to.is_dir() {
                    if !self.owned.contains(name) {
                        // A folder of the user's where onnx2ait would put its object cache:
                        // the cache is dropped instead.
                        if name == OBJ_DIR {
                            continue;
                        }
                        return Err(Error::Other(format!(
                            "{}: {} is in the way of a file onnx2ait writes; move it away",
                            out.display(),
                            to.display()
                        )));
                    }
                    remove_entry(&to).map_err(|e| io("cannot remove", &to, e))?;
                } else if !from_dir && same_bytes(&from, &to) {
                    // Unchanged: keep the file (and its time).
                    continue;
                }
            }
            std::fs::rename(&from, &to).map_err(|e| io("cannot move the new file to", &to, e))?;
        }
        // 4. Entries of the old output the new one does not have.
        for name in old.difference(&new) {
            let path = real.join(name);
            remove_entry(&path).map_err(|e| io("cannot remove the stale", &path, e))?;
        }
        // 5. The manifest of the new output.
        manifest.write(&real)?;
        let _ = std::fs::remove_dir_all(&dir);
        self.done = true;
        Ok(manifest)
    }
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) if x.is_file() && y.is_file() && x.len() == y.len() => {
            matches!((std::fs::read(a), std::fs::read(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
}

impl Drop for Staging {
    /// A staging folder that was never committed (an error before the swap) is removed; OUT is
    /// as it was, except that the previous object cache goes back to it.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let obj = self.dir.join(OBJ_DIR);
        if self.existed && obj.is_dir() && !self.real.join(OBJ_DIR).exists() {
            let _ = std::fs::rename(&obj, self.real.join(OBJ_DIR));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onnx2ait-outdir-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(dir: &Path) -> Vec<String> {
        entries(dir).unwrap().into_iter().collect()
    }

    /// One render: `files` written into the staging folder, and a library when `lib`.
    fn render(out: &Path, force: bool, files: &[(&str, &str)], lib: bool) -> Result<Manifest> {
        let s = Staging::begin(out, force)?;
        s.carry_library();
        for (name, text) in files {
            std::fs::write(s.dir().join(name), text).unwrap();
        }
        std::fs::create_dir_all(s.dir().join(OBJ_DIR)).unwrap();
        std::fs::write(s.dir().join(OBJ_DIR).join(format!("{}.o", files[0].1)), "obj").unwrap();
        if lib {
            std::fs::write(s.dir().join("libmodel.so"), format!("lib of {}", files[0].1)).unwrap();
        }
        s.commit(files[0].1, lib)
    }

    #[test]
    fn user_files_survive_and_stale_outputs_go() {
        let root = temp("swap");
        let out = root.join("out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("my_project.cu"), "user").unwrap();
        std::fs::write(out.join("config.h"), "user").unwrap();
        let e = render(&out, false, &[("model.cu", "A")], true).unwrap_err().to_string();
        assert!(
            e.contains(&out.display().to_string()) && e.contains("not written by onnx2ait") && e.contains("--force"),
            "{e}"
        );
        assert_eq!(names(&out), ["config.h", "my_project.cu"], "a refused render writes nothing");

        let m = render(&out, true, &[("model.cu", "A"), ("k000.cu", "A")], true).unwrap();
        assert_eq!(m.library.as_deref(), Some("libmodel.so"));
        assert_eq!(m.files, ["k000.cu", "libmodel.so", "model.cu", "obj"]);
        assert_eq!(std::fs::read_to_string(out.join("libmodel.so")).unwrap(), "lib of A");
        // Model B without a library: A's library and kernel go, the user's files stay.
        let m = render(&out, false, &[("model.cu", "B"), ("k001.cu", "B")], false).unwrap();
        assert_eq!(m.library, None);
        assert_eq!(
            names(&out),
            ["config.h", "k001.cu", "model.cu", "my_project.cu", "obj", MANIFEST],
            "A's library and sources are gone"
        );
        assert_eq!(std::fs::read_to_string(out.join("my_project.cu")).unwrap(), "user");
        // The object cache moved along: A's object is still there.
        assert!(out.join("obj/A.o").is_file() && out.join("obj/B.o").is_file());
        assert_eq!(Manifest::read(&out).unwrap().unwrap(), m);
        // No staging folder is left next to OUT.
        assert_eq!(names(&root), ["out"]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_new_folder_is_the_staging_folder_renamed_and_errors_leave_out_alone() {
        let root = temp("new");
        let out = root.join("sub/out");
        render(&out, false, &[("model.cu", "A")], true).unwrap();
        assert_eq!(names(&out), ["libmodel.so", "model.cu", "obj", MANIFEST]);
        // A render that fails before the commit leaves OUT as it was, object cache included.
        let s = Staging::begin(&out, false).unwrap();
        assert!(!out.join(OBJ_DIR).exists() && s.dir().join(OBJ_DIR).is_dir());
        std::fs::write(s.dir().join("model.cu"), "B").unwrap();
        drop(s);
        assert_eq!(names(&out), ["libmodel.so", "model.cu", "obj", MANIFEST]);
        assert_eq!(std::fs::read_to_string(out.join("model.cu")).unwrap(), "A");
        assert_eq!(names(&root.join("sub")), ["out"]);
        // A file as OUT is refused.
        let e = Staging::begin(&out.join("model.cu"), true).err().unwrap().to_string();
        assert!(e.contains("model.cu: exists and is not a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn an_interrupted_run_is_cleaned_up() {
        let root = temp("abandoned");
        let out = root.join("out");
        render(&out, false, &[("model.cu", "A")], true).unwrap();
        // A staging folder of a killed run (no such process), holding its object cache.
        let dead = root.join(".out.onnx2ait-staging-4000000000");
        std::fs::create_dir_all(dead.join(OBJ_DIR)).unwrap();
        std::fs::write(dead.join(OBJ_DIR).join("k.o"), "obj").unwrap();
        std::fs::remove_dir_all(out.join(OBJ_DIR)).unwrap();
        // A swap cut short: the claim lists a file that is not in the new output.
        let mut claim = Manifest::read(&out).unwrap().unwrap();
        claim.files.push("k009.cu".into());
        claim.library = None;
        claim.write(&out).unwrap();
        std::fs::write(out.join("k009.cu"), "half-swapped").unwrap();
        render(&out, false, &[("model.cu", "B")], false).unwrap();
        assert_eq!(names(&out), ["model.cu", "obj", MANIFEST]);
        assert!(out.join("obj/k.o").is_file(), "the abandoned object cache is reused");
        assert_eq!(names(&root), ["out"]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_pre_manifest_output_is_recognised() {
        let root = temp("legacy");
        let out = root.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let meta = r#"{"generator": "onnx2ait 0.1.0", "sources": ["model.cu", "k007.cu"], "headers": ["model.h"]}"#;
        for (name, text) in [("build.json", meta), ("model.cu", "A"), ("k007.cu", "A"), ("model.h", "A")] {
            std::fs::write(out.join(name), text).unwrap();
        }
        std::fs::write(out.join("libmodel.so"), "lib A").unwrap();
        std::fs::write(out.join("notes.txt"), "user").unwrap();
        render(&out, false, &[("model.cu", "B")], false).unwrap();
        assert_eq!(names(&out), ["model.cu", "notes.txt", "obj", MANIFEST]);
        let _ = std::fs::remove_dir_all(&root);
    }
}
