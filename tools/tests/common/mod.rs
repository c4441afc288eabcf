//! Helpers shared by the CLI tests: run the built `portverbs` binary and pick its output apart.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

/// Every run of the binary spins an engine thread and busy-polls; running them one at a time
/// keeps small machines responsive and the runs independent.
static SERIAL: Mutex<()> = Mutex::new(());

/// The finished run of one command.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Panics with the whole output unless the command exited with 0.
    pub(crate) fn ok(self) -> Self {
        assert_eq!(
            self.code,
            Some(0),
            "command failed:\n{}\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    /// Panics unless the command failed with a message on stderr (and no panic).
    pub(crate) fn failed(self) -> Self {
        assert!(
            matches!(self.code, Some(c) if c != 0),
            "command should fail:\n{}\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stderr.trim_start().starts_with("portverbs: ") || self.stderr.contains("error:"),
            "no error message: {:?}",
            self.stderr
        );
        assert!(!self.stderr.contains("panicked"), "panic: {}", self.stderr);
        self
    }
}

/// Runs `portverbs <args>`.
pub(crate) fn portverbs(args: &[&str]) -> Run {
    portverbs_with(args, None, &[])
}

/// Runs `portverbs <args>` in the working directory `cwd` (the test's own when `None`) with
/// the environment variables `env` set.
pub(crate) fn portverbs_with(args: &[&str], cwd: Option<&Path>, env: &[(&str, &str)]) -> Run {
    let _serial: MutexGuard<'_, ()> = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_portverbs"));
    cmd.args(args).envs(env.iter().copied());
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("the portverbs binary runs");
    Run {
        code: status.code(),
        stdout: String::from_utf8(stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(stderr).expect("UTF-8 stderr"),
    }
}

/// The numbers of a whitespace-separated line.
pub(crate) fn numbers(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .map(|w| {
            w.parse()
                .unwrap_or_else(|_| panic!("not a number {w:?} in {line:?}"))
        })
        .collect()
}

/// The result rows of a perftest table: the lines after the ` #bytes` header up to the closing
/// rule.
pub(crate) fn table_rows(stdout: &str) -> Vec<Vec<f64>> {
    let lines: Vec<&str> = stdout.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with(" #bytes"))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    lines[header + 1..]
        .iter()
        .take_while(|l| !l.starts_with("-----"))
        .map(|l| numbers(l))
        .collect()
}

/// The header line of the table.
pub(crate) fn table_header(stdout: &str) -> &str {
    stdout
        .lines()
        .find(|l| l.starts_with(" #bytes"))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"))
}

/// A fresh, empty directory for one test (removed when dropped).
pub(crate) struct ScratchDir(pub(crate) PathBuf);

impl ScratchDir {
    /// Creates `<tmp>/portverbs-cli-<pid>-<name>`.
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("portverbs-cli-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Self(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The JSON document in the file at `path`.
pub(crate) fn json_file(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no JSON report at {}: {e}", path.display()));
    serde_json::from_str(&text).expect("the JSON document parses")
}

/// Starts the binary with `args` and extra environment, its output piped (a process that
/// runs beside another: a server and its client).
pub(crate) fn spawn(args: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_portverbs"))
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the portverbs binary starts")
}

/// Waits for a [`spawn`]ed process: its exit code, stdout and stderr.
pub(crate) fn finish(child: Child) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("the process ends");
    (
        status.code(),
        String::from_utf8(stdout).expect("UTF-8"),
        String::from_utf8(stderr).expect("UTF-8"),
    )
}
