//! The `portverbs` command-line tool (work in progress).
#[allow(dead_code)]
mod report;

fn main() {}
