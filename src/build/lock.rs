//! Advisory file locks for what several onnx2ait processes share: an object cache given to
//! several builds (`--cache-dir`), a profile cache file.
//!
//! Locks are std's `File::lock`/`try_lock` (`flock` on Unix): released when the file is closed,
//! so a build that is killed never leaves a lock behind, and held per open file, so two threads of
//! one process exclude each other just as two processes do. The lock files themselves are empty
//! and stay: deleting one while another process waits on it would let a third lock a new file of
//! the same name, and both would believe they hold the lock.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

fn open(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Other(format!("{}: cannot create the lock's folder: {e}", dir.display())))?;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::Other(format!("{}: cannot open the lock file: {e}", path.display())))
}

/// Takes the exclusive lock on `path` (created if missing), waiting while another holds it.
pub fn lock(path: &Path) -> Result<FileLock> {
    let file = open(path)?;
    file.lock().map_err(|e| Error::Other(format!("{}: cannot lock: {e}", path.display())))?;
    Ok(FileLock { _file: file })
}

/// Takes the exclusive lock on `path` if nobody holds it; `None` when somebody does.
pub fn try_lock(path: &Path) -> Result<Option<FileLock>> {
    let file = open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(FileLock { _file: file })),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(Error::Other(format!("{}: cannot lock: {e}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excludes_other_handles_until_dropped() {
        let dir = std::env::temp_dir().join(format!("o2a-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("x.lock");
        let held = lock(&path).unwrap();
        // Another open file of the same path, even in this process and thread, is refused.
        assert!(try_lock(&path).unwrap().is_none());
        drop(held);
        let again = try_lock(&path).unwrap();
        assert!(again.is_some());
        // A waiter gets the lock once the holder lets go.
        let waiter = std::thread::spawn({
            let path = path.clone();
            move || lock(&path).map(|_| ())
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(again);
        waiter.join().unwrap().unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
