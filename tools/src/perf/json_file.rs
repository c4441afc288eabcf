//! The `--out_json` report file.
//!
//! perftest opens the file (`perftest_out.json`, or `--out_json_file`) when it prints a result
//! and silently goes on when it cannot. Here the file is opened before the test starts, so a
//! path that cannot be written fails at once, and it is rewritten after every size with the
//! document holding every result so far. A file this run created is removed again when the run
//! ends before its first result; an existing file is left as it was until then.

use std::fs::{File, OpenOptions};
use std::io::{Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use crate::error::{CliError, IoContext as _};

/// An open JSON report file.
#[derive(Debug)]
pub(crate) struct JsonFile {
    path: PathBuf,
    file: File,
    /// The file did not exist before this run.
    created: bool,
    /// A document was written.
    written: bool,
}

impl JsonFile {
    /// Opens (creating it when needed) `path` for writing, without touching its contents yet.
    ///
    /// # Errors
    /// The file cannot be created or opened for writing (a missing directory, no permission,
    /// a directory of that name).
    pub(crate) fn open(path: &Path) -> Result<Self, CliError> {
        let existed = path.symlink_metadata().is_ok();
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .io_ctx(format_args!(
                "failed to open {} for the JSON report (--out_json)",
                path.display()
            ))?;
        Ok(Self {
            path: path.to_owned(),
            file,
            created: !existed,
            written: false,
        })
    }

    /// Replaces the file's contents with `doc`.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) fn write(&mut self, doc: &str) -> Result<(), CliError> {
        self.file
            .set_len(0)
            .and_then(|()| self.file.seek(SeekFrom::Start(0)))
            .and_then(|_| self.file.write_all(doc.as_bytes()))
            .and_then(|()| self.file.flush())
            .io_ctx(format_args!(
                "writing the JSON report to {}",
                self.path.display()
            ))?;
        self.written = true;
        Ok(())
    }
}

impl Drop for JsonFile {
    fn drop(&mut self) {
        if self.created && !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("portverbs-json-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn unwritable_paths_fail_before_anything_runs() {
        let dir = scratch("bad");
        let missing = dir.join("no/such/dir/out.json");
        let err = JsonFile::open(&missing).unwrap_err().to_string();
        assert!(err.starts_with("failed to open "), "{err}");
        assert!(err.contains("no/such/dir/out.json"), "{err}");
        // A directory cannot be the report file either.
        assert!(JsonFile::open(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rewrites_and_cleans_up() {
        let dir = scratch("rw");
        let path = dir.join("out.json");
        {
            let _unused = JsonFile::open(&path).unwrap();
            assert!(path.exists(), "created at once");
        }
        assert!(
            !path.exists(),
            "a file created by a run without results is removed"
        );
        let mut f = JsonFile::open(&path).unwrap();
        f.write("{\"a\": 1234}\n").unwrap();
        f.write("{}\n").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        // An existing file is kept (with its contents) when no result comes.
        drop(JsonFile::open(&path).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
