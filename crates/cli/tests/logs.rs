//! The server's log as a service manager or a log shipper reads it (issue 35, item 7):
//! `log_format = "json"` makes every line of stderr a JSON object (the banner, the
//! library's events, a sync's, the drain notice), and text logs into a pipe carry no
//! colour codes. Also the token key set settings (`jwks_url`) as `serve` takes them: an
//! issuer that cannot be reached is reported at start, and the server serves.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use rowsync_client::SyncOptions;
use serde_json::Value as Json;
use support::rowsync;

/// Serves `db` with `extra` options and `ROWSYNC_LOG=log`; returns the process and the
/// lines of its stderr, read on a thread of their own.
fn serve_logging(
    db: &std::path::Path,
    extra: &[&str],
    log: &str,
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = rowsync()
        .args(["serve", "--listen", "127.0.0.1:0", "--workers", "2", "--db"])
        .arg(db)
        .args(extra)
        .env("ROWSYNC_LOG", log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    (child, received)
}

fn next_line(lines: &std::sync::mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the server said nothing for 30 s")
}

fn message(line: &Json) -> &str {
    line["fields"]["message"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    support::init_notes(&db);
    support::add_user(&db, "erin", "erin-secret");
    let file = dir.path().join("rowsync.toml");
    std::fs::write(&file, "log_format = \"json\"\n").unwrap();
    let (mut server, lines) = serve_logging(
        &db,
        &["--config", file.to_str().unwrap()],
        "rowsync_server=debug",
    );
    let banner: Json = serde_json::from_str(&next_line(&lines)).expect("the banner is JSON");
    assert!(message(&banner).starts_with("rowsync serving"), "{banner}");
    assert_eq!(banner["level"], "INFO", "{banner}");
    assert!(banner["timestamp"].is_string(), "{banner}");
    let address = message(&banner).rsplit(' ').next().unwrap().to_string();
    let mut client = support::client(dir.path(), "erin");
    client
        .sync(&SyncOptions::new(address, "erin", "erin-secret"))
        .await
        .unwrap();
    // SIGTERM: the drain notice, then the end; every line meanwhile is JSON.
    terminate(server.id());
    let status = server.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut said = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        let parsed: Json = serde_json::from_str(&line)
            .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"));
        said.push(parsed);
    }
    assert!(
        said.iter().any(|line| line["target"]
            .as_str()
            .is_some_and(|target| target.starts_with("rowsync_server"))),
        "the library's own events are JSON too: {said:?}"
    );
    assert!(
        said.iter()
            .any(|line| message(line).starts_with("rowsync draining")),
        "{said:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_into_a_pipe_have_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    support::init_notes(&db);
    support::add_user(&db, "erin", "erin-secret");
    let (mut server, lines) = serve_logging(&db, &[], "rowsync_server=debug");
    let banner = next_line(&lines);
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let address = banner.rsplit(' ').next().unwrap().to_string();
    let mut client = support::client(dir.path(), "erin");
    client
        .sync(&SyncOptions::new(address, "erin", "erin-secret"))
        .await
        .unwrap();
    terminate(server.id());
    server.wait().unwrap();
    let mut debug_lines = 0;
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        assert!(
            !line.contains('\u{1b}'),
            "a colour code in a pipe: {line:?}"
        );
        debug_lines += usize::from(line.contains("DEBUG"));
    }
    assert!(debug_lines > 0, "the sync's debug line was logged");
}

#[test]
fn an_unreachable_key_set_is_reported_and_the_server_serves() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    support::init_notes(&db);
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}/keys");
    let (mut server, lines) = serve_logging(
        &db,
        &["--jwks-url", &url, "--jwks-refresh-min-seconds", "1"],
        "warn",
    );
    let warning = next_line(&lines);
    assert!(
        warning.contains(&format!("fetching {url} failed"))
            && warning.contains("jwks_refresh_min_seconds"),
        "{warning}"
    );
    let banner = next_line(&lines);
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let _ = server.kill();
    server.wait().unwrap();

    let output = rowsync()
        .args(["serve", "--db"])
        .arg(&db)
        .args(["--jwks-url", "http://issuer.example/keys"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(said.contains("give an https:// URL"), "{said}");
}

/// SIGTERM to the server (what systemd sends).
fn terminate(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}
