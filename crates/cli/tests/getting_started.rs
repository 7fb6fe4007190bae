//! docs/getting-started.md as a newcomer runs it (issue 36): every `sh` block of the
//! page, in order, as one shell script in an empty directory, with the `rowsync` just
//! built on `PATH` and a throwaway PostgreSQL (a cluster of its own, passwords
//! required) for its second part. The page cannot drift from the program.

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn getting_started_runs_as_written() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/getting-started.md");
    let blocks = support::fenced_blocks(&std::fs::read_to_string(page).unwrap(), "sh");
    assert!(blocks.len() >= 6, "{blocks:?}");
    let cluster = rowsync_testkit::PgCluster::start_with_password("admin-secret").unwrap();
    let admin_url = cluster.url("postgres").replacen(
        "postgres://postgres@",
        "postgres://postgres:admin-secret@",
        1,
    );
    let app_url =
        cluster
            .url("shop")
            .replacen("postgres://postgres@", "postgres://shop:shop-secret@", 1);
    let binary = Path::new(env!("CARGO_BIN_EXE_rowsync"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dir = tempfile::tempdir().unwrap();
    let script = format!("set -euo pipefail\n{}", blocks.join("\n"));
    let child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("ADMIN_URL", &admin_url)
        .env("APP_URL", &app_url)
        .env("PORT", support::free_port().to_string())
        .env("PG_PORT", support::free_port().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = child.id() as i32;
    let output = child.wait_with_output().unwrap();
    // Servers the page starts in the background go with the script's process group.
    // SAFETY: sends a signal to a process group this test made.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    for expected in [
        "n1|written at the office",
        "n2|erin|written on the phone",
        "o1|frank|tea|2",
        "script version v1: 1 table(s), 1 client(s), last sync ",
        "  orders: owner (rows whose owner is the user)\nusers: frank\n",
        "event triggers: not installed",
    ] {
        assert!(stdout.contains(expected), "{expected}: {stdout}\n{stderr}");
    }
}
