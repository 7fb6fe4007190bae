//! Record and replay: `rowsync serve --record` writes a session (never a password),
//! `rowsync replay` plays it against a copy of the database taken before the session,
//! and `rowsync replay --diff` agrees with the recording when the scripts are the same
//! and names the sync that differs when a script changed.

mod support;

use std::path::Path;

use rowsync_client::SyncOptions;
use support::{add_user, client, init_notes, rowsync, run_ok, serve};

const PASSWORD: &str = "S3cret-replay-Pa55";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_session_replays_and_a_changed_script_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    init_notes(&db);
    add_user(&db, "erin", PASSWORD);
    add_user(&db, "frank", PASSWORD);
    // Copies of the database as it was before the session.
    let same = dir.path().join("same.db");
    let changed = dir.path().join("changed.db");
    std::fs::copy(&db, &same).unwrap();
    std::fs::copy(&db, &changed).unwrap();

    let recording = dir.path().join("recording");
    let record = recording.to_str().unwrap();
    {
        let server = serve(&db, &["--record", record]);
        session(dir.path(), &server.address).await;
        // Each sync's files are written as it ends, after its client has its answer.
        wait_for_outcomes(&recording, 4);
    }
    assert_no_password_in(&recording);

    // The same scripts: the replay's outcomes are the recording's.
    let same_run = dir.path().join("same-run");
    replay(&recording, &same, &same_run);
    let agree = rowsync()
        .args(["replay", "--diff", record, same_run.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&agree.stdout);
    assert!(agree.status.success(), "{text}");
    assert!(text.contains("the runs agree"), "{text}");

    // Updates to notes now change nothing: erin's update becomes a conflict, and the
    // server's row comes down instead.
    let changed_run = dir.path().join("changed-run");
    set_update_script(&changed, "UPDATE notes SET body = body WHERE 1 = 0");
    replay(&recording, &changed, &changed_run);
    let differ = rowsync()
        .args(["replay", "--diff", record, changed_run.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&differ.stdout);
    assert_eq!(differ.status.code(), Some(1), "{text}");
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("sync "))
        .collect();
    assert_eq!(lines.len(), 1, "only the update differs:\n{text}");
    let line = lines[0];
    assert!(line.contains("user \"erin\""), "{line}");
    assert!(line.contains("rows applied 1 -> 0"), "{line}");
    assert!(line.contains("conflicts 0 -> 1"), "{line}");
    assert!(line.contains("download differs"), "{line}");
}

/// erin: a first sync (download), an insert, an update; frank: one sync.
async fn session(dir: &Path, address: &str) {
    let options = |user: &str| SyncOptions::new(address, user, PASSWORD);
    let mut erin = client(dir, "erin");
    erin.sync(&options("erin")).await.unwrap();
    erin.connection()
        .execute("INSERT INTO notes VALUES (10, 'erin', 'new')", [])
        .unwrap();
    erin.sync(&options("erin")).await.unwrap();
    erin.connection()
        .execute("UPDATE notes SET body = 'edited' WHERE id = 1", [])
        .unwrap();
    let report = erin.sync(&options("erin")).await.unwrap();
    assert_eq!(report.rows_uploaded, 1);
    let mut frank = client(dir, "frank");
    frank.sync(&options("frank")).await.unwrap();
}

fn wait_for_outcomes(recording: &Path, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(recording.join("outcomes.jsonl")).unwrap_or_default();
        if text.lines().count() >= count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "outcomes.jsonl: {text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn replay(recording: &Path, db: &Path, out: &Path) {
    let server = serve(db, &[]);
    let stdout = run_ok(
        &[
            "replay",
            recording.to_str().unwrap(),
            "--server",
            &server.address,
            "--clients",
            "2",
            "--password-stdin",
            "--out",
            out.to_str().unwrap(),
        ],
        &format!("{PASSWORD}\n"),
    );
    assert!(
        stdout.contains("replayed 4 syncs (0 with errors"),
        "{stdout}"
    );
}

fn set_update_script(db: &Path, script: &str) {
    run_ok(
        &[
            "script",
            "set",
            "--db",
            db.to_str().unwrap(),
            "--version",
            "v1",
            "--table",
            "notes",
            "--event",
            "upload_update",
        ],
        script,
    );
}

/// No file of the recording holds the password, in any case.
fn assert_no_password_in(recording: &Path) {
    let mut files = 0;
    for entry in walk(recording) {
        let bytes = std::fs::read(&entry).unwrap();
        let text = String::from_utf8_lossy(&bytes).to_lowercase();
        assert!(
            !text.contains(&PASSWORD.to_lowercase()),
            "{} holds the password",
            entry.display()
        );
        files += 1;
    }
    // outcomes.jsonl, and a .json and an .upload per sync.
    assert_eq!(files, 1 + 2 * 4);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}
