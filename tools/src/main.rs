//! The `portverbs` command-line tool (work in progress).
mod report;

fn main() {}
