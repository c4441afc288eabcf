//! README.md's "Deviations from IBTA" table names every quirk of every backend: a quirk added
//! to a backend's table without a line here fails this test.

use std::collections::BTreeSet;

/// `(backend, quirk)` pairs the README's table lists.
fn documented() -> BTreeSet<(String, String)> {
    let readme = include_str!("../README.md");
    let section = readme
        .split("## Deviations from IBTA")
        .nth(1)
        .expect("README.md has a \"Deviations from IBTA\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut out = BTreeSet::new();
    // Table rows; the header row and the rule have no backticked quirk name.
    for row in section
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains('`'))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(backends), Some(quirk)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let quirk = quirk.trim_matches('`');
        for backend in backends.split(',').map(str::trim) {
            out.insert((backend.to_owned(), quirk.to_owned()));
        }
    }
    out
}

#[test]
fn every_quirk_of_every_backend_is_in_the_readme() {
    let documented = documented();
    let mut seen = BTreeSet::new();
    for dev in portverbs::devices() {
        let info = dev.info();
        for q in info.quirks {
            let key = (info.driver.to_owned(), format!("{:?}", q.id));
            assert!(
                documented.contains(&key),
                "README.md's deviations table lacks {key:?} ({})",
                q.summary
            );
            seen.insert(key);
        }
    }
    let drivers: BTreeSet<String> = seen.iter().map(|(d, _)| d.clone()).collect();
    assert!(
        drivers.contains("soft") && drivers.contains("mlx4"),
        "{drivers:?}"
    );
    // And no line names a quirk a backend does not have.
    let stale: Vec<_> = documented.difference(&seen).collect();
    assert!(
        stale.is_empty(),
        "README.md lists quirks no backend has: {stale:?}"
    );
}
