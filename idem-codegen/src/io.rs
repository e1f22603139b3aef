//! Reading inputs with a size limit, and writing outputs so that a failure leaves nothing
//! behind: every output goes to a temporary file in the target's folder and is renamed
//! over the target only once it is complete.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::{Error, position_of};

/// The largest input file read, in bytes: 128 MiB. The largest public OpenAPI documents
/// are a few tens of MB; past this limit a file is refused before it can exhaust memory
/// (a device such as `/dev/zero` included).
pub const MAX_INPUT_BYTES: u64 = 128 * 1024 * 1024;

/// Reads `path` as UTF-8 text of at most [`MAX_INPUT_BYTES`] bytes. A leading byte order
/// mark is kept; callers strip it.
///
/// # Errors
///
/// The file cannot be read, is larger than the limit, or is not UTF-8 (with the line and
/// column of the first bad byte).
pub fn read_text(path: &Path) -> Result<String, Error> {
    let file = std::fs::File::open(path)
        .map_err(|e| Error::in_file(path, format!("cannot read the file: {e}")))?;
    if file.metadata().is_ok_and(|m| m.is_dir()) {
        return Err(Error::in_file(path, "is a directory, not a file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_INPUT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::in_file(path, format!("cannot read the file: {e}")))?;
    if bytes.len() as u64 > MAX_INPUT_BYTES {
        return Err(Error::in_file(
            path,
            format!(
                "the file is larger than {} MiB, the most idem reads",
                MAX_INPUT_BYTES / 1024 / 1024
            ),
        ));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        // The valid prefix is text, so its last line and column can be counted.
        let prefix = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        let p = position_of(prefix, valid);
        Error::at(
            path,
            p.line,
            p.column,
            format!(
                "the file is not UTF-8 text (byte 0x{:02x} at offset {valid}); save it as UTF-8",
                bytes[valid]
            ),
        )
    })
}

/// Writes `contents` to `path` atomically: a temporary file in the same folder, then a
/// rename. On failure the target is untouched (not created, not truncated). An existing
/// target keeps its permissions. `-` writes to standard output.
///
/// # Errors
///
/// The folder cannot be written, or the rename fails.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), Error> {
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        return out
            .write_all(contents)
            .and_then(|()| out.flush())
            .map_err(|e| Error::new(format!("cannot write to standard output: {e}")));
    }
    let fail = |e: std::io::Error| Error::in_file(path, format!("cannot write the file: {e}"));
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".idem-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(fail)?;
    tmp.write_all(contents).map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    // A new file gets the usual 0644 rather than the temporary file's 0600.
    match std::fs::metadata(path) {
        Ok(m) => std::fs::set_permissions(tmp.path(), m.permissions()).map_err(fail)?,
        Err(_) => set_default_permissions(tmp.path()).map_err(fail)?,
    }
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

#[cfg(unix)]
fn set_default_permissions(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn set_default_permissions(_: &Path) -> std::io::Result<()> {
    Ok(())
}
