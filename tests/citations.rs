//! The repository's comments and Markdown cite only what a reader can open: a file of this
//! repository, an IBTA section, or a public source (rdma-core, librdmacm's man pages, the
//! Linux kernel). This scans every `.rs` and `.md` file (not `target/`) for citations of
//! things outside it — private notes (`../shared/…`, `facts/…`, `notes/…`, `DESIGN.md`) and
//! issue numbers (`issue 12`, `#12`, "the issue's") — and fails listing each one found.

use std::fs;
use std::path::{Path, PathBuf};

/// Directories that hold no sources of the repository (build output, fuzzer data).
const SKIP_DIRS: [&str; 5] = ["target", ".git", "artifacts", "corpus", "node_modules"];

/// This file names the patterns it looks for.
const SELF: &str = "tests/citations.rs";

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let kind = entry.file_type().expect("a file type");
        if kind.is_dir() {
            if !SKIP_DIRS.contains(&name.as_ref()) {
                sources(&path, out);
            }
        } else if kind.is_file() && (name.ends_with(".rs") || name.ends_with(".md")) {
            out.push(path);
        }
    }
}

/// Whether `s` starts with `#` and decimal digits that end there (`#12`, not `#1a` or `#[`).
fn hash_number(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('#') else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && !rest[digits..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
}

/// What in `line` cites something a reader of the repository cannot open.
fn dead_citations(line: &str) -> Vec<&'static str> {
    let lower = line.to_ascii_lowercase();
    let mut found = Vec::new();
    for (needle, what) in [
        ("../shared", "a file outside the repository"),
        ("shared/", "a private notes directory"),
        ("facts/", "a private notes directory"),
        ("notes/", "a private notes directory"),
        ("design.md", "a design document not in the repository"),
        ("the issue's", "an issue"),
        ("(issue:", "an issue"),
    ] {
        let at_word = lower.match_indices(needle).any(|(i, _)| {
            needle.starts_with('.')
                || needle.starts_with('(')
                || !lower[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        });
        if at_word {
            found.push(what);
        }
    }
    // `issue 12`, `issue #12`, `issues/12`.
    for (i, _) in lower.match_indices("issue") {
        if lower[..i].ends_with(|c: char| c.is_ascii_alphanumeric()) {
            continue;
        }
        let rest = lower[i + "issue".len()..].trim_start_matches('s');
        let rest = rest.trim_start_matches([' ', '/', '#']);
        if rest.starts_with(|c: char| c.is_ascii_digit()) {
            found.push("an issue number");
        }
    }
    // `#12` after a space or an opening bracket (not `r#"`, `{:#x}`, `%#0`).
    for (i, _) in line.match_indices('#') {
        let before_ok = i == 0 || line[..i].ends_with([' ', '(', '[', '\t']);
        if before_ok && hash_number(&line[i..]) {
            found.push("an issue number");
        }
    }
    found
}

#[test]
fn the_matcher_finds_each_kind_of_dead_citation_and_nothing_else() {
    for cited in [
        "see ../shared/facts/cm.md",
        "(facts/mlx4.md)",
        "as DESIGN.md says",
        "fixed for issue 12",
        "fixed for Issue #12",
        "github.com/o/r/issues/12",
        "see #12.",
        "(#7)",
        "The issue's goals",
        "(issue: \"the driver hangs\")",
        "notes/brief.md",
    ] {
        assert!(
            !dead_citations(cited).is_empty(),
            "{cited:?} is a dead citation"
        );
    }
    for fine in [
        "#[derive(Debug)]",
        "format!(\"{:#x}\", v)",
        "printf(\"%#0<width>x\")",
        "r#\"raw\"#",
        "the driver does not issue MADs",
        "a request issued at once",
        "IBTA 12.6.5, rdma-core's libibverbs/verbs.c",
        "tests/support/src/lib.rs",
        "the shared receive queue",
        "# Errors",
    ] {
        assert_eq!(dead_citations(fine), Vec::<&str>::new(), "{fine:?}");
    }
}

#[test]
fn no_source_cites_what_is_not_in_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("src/lib.rs")),
        "the scan found the facade's sources under {}",
        root.display()
    );
    let mut dead = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(root).expect("under the root");
        if rel == Path::new(SELF) {
            continue;
        }
        let text =
            fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for (n, line) in text.lines().enumerate() {
            for what in dead_citations(line) {
                dead.push(format!(
                    "{}:{}: cites {what}: {}",
                    rel.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        dead.is_empty(),
        "cite a file of this repository, an IBTA section or a public source instead:\n{}",
        dead.join("\n")
    );
}
