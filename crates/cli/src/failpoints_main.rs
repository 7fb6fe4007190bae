//! `rowsync-failpoints`: the `rowsync` program built with the `failpoints` feature, for
//! the fault matrix (`tests/faults.rs`; `rowsync_consolidated::failpoints`). A binary of
//! its own, so `rowsync` never has failpoints and the two never overwrite each other.

#[path = "main.rs"]
mod rowsync;

fn main() -> std::process::ExitCode {
    rowsync::main()
}
