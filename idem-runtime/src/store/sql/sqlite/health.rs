//! The health of an SQLite store's file and connections: the file at the store's path must
//! be the one it opened, and connections that a fault left unfit for writes are replaced.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// What the store knows of its file and its connections' fitness.
#[derive(Debug)]
pub(super) struct Health {
    /// The file the store was opened on and its identity (device, inode) when last
    /// seen; `None` for an in-memory database or an application's pool.
    file: Option<(PathBuf, Mutex<Option<FileIdentity>>)>,
    /// The time `reset_after` counts from.
    epoch: Instant,
    /// Connections opened before this many nanoseconds after `epoch` are closed
    /// instead of handed out (0: none).
    reset_after: AtomicU64,
}

impl Health {
    pub(super) fn new(file: Option<PathBuf>) -> Arc<Health> {
        Arc::new(Health {
            file: file.map(|path| (path, Mutex::new(None))),
            epoch: Instant::now(),
            reset_after: AtomicU64::new(0),
        })
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// From now on, every connection opened before now is replaced.
    pub(super) fn recycle(&self) {
        self.reset_after
            .store(self.nanos(Instant::now()).max(1), Ordering::SeqCst);
    }

    /// Whether [`Health::recycle`] was ever called.
    #[cfg(test)]
    pub(super) fn recycled(&self) -> bool {
        self.reset_after.load(Ordering::SeqCst) != 0
    }

    /// Whether a connection that is `age` old may be handed out.
    pub(super) fn is_fresh(&self, age: Duration) -> bool {
        let reset_after = self.reset_after.load(Ordering::SeqCst);
        match Instant::now().checked_sub(age) {
            Some(opened) => self.nanos(opened) >= reset_after,
            None => reset_after == 0,
        }
    }

    /// Checks that the file at the store's path is there and is the one last seen.
    pub(super) fn check_file(&self) -> Result<(), StoreError> {
        let Some((path, seen)) = &self.file else {
            return Ok(());
        };
        let identity = match std::fs::metadata(path) {
            Ok(meta) => file_identity(&meta),
            Err(error) => {
                self.recycle();
                return Err(StoreError::unavailable(format!(
                    "the database file {} cannot be found ({error}): it was moved or removed while the service was running",
                    path.display()
                )));
            }
        };
        let mut seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.is_some_and(|known| known != identity) {
            tracing::warn!(
                path = %path.display(),
                "idem: the SQLite file was replaced while the service was running; reopening its connections"
            );
            self.recycle();
        }
        *seen = Some(identity);
        Ok(())
    }
}

/// A file's device and inode number: what stays the same when a file is renamed back
/// into place, and changes when it is replaced by a copy.
type FileIdentity = (u64, u64);

#[cfg(unix)]
fn file_identity(meta: &std::fs::Metadata) -> FileIdentity {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

#[cfg(not(unix))]
fn file_identity(_: &std::fs::Metadata) -> FileIdentity {
    (0, 0)
}
