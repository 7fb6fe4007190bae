//! `--config FILE` and `ROWSYNC_*` variables for every option: a server started from a
//! file, the command line over the environment over the file, a misspelt key refused
//! with the nearest one, and `rowsync config check` with the database password masked.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use rowsync_client::{Client, SyncOptions};
use support::rowsync;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_runs_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    support::init_notes(&db);
    support::add_user(&db, "erin", "erin-secret");
    let file = dir.path().join("rowsync.toml");
    std::fs::write(
        &file,
        format!(
            "# rowsync serve --config rowsync.toml\ndb = {:?}\nlisten = \"127.0.0.1:0\"\nworkers = 2\nmax_connections = 64\n",
            db.display().to_string()
        ),
    )
    .unwrap();
    let mut server = rowsync()
        .args(["serve", "--config", file.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(server.stderr.as_mut().unwrap())
        .read_line(&mut banner)
        .unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let address = banner.split_whitespace().last().unwrap().to_string();
    let mut client = Client::open(dir.path().join("erin.db")).unwrap();
    client
        .connection()
        .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT, body TEXT)")
        .unwrap();
    client.track("notes").unwrap();
    let synced = client
        .sync(&SyncOptions::new(address, "erin", "erin-secret"))
        .await;
    server.kill().unwrap();
    server.wait().unwrap();
    assert_eq!(synced.unwrap().rows_downloaded, 1);
}

#[test]
fn the_command_line_wins_over_the_environment_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rowsync.toml");
    std::fs::write(
        &file,
        "db = \"postgres://app:s3cret@db.example.com/app?sslmode=verify-full\"\nworkers = 2\nmax_connections = 64\nlisten = \"127.0.0.1:7000\"\n",
    )
    .unwrap();
    let check = |extra: &[&str], environment: &[(&str, &str)]| {
        let output = rowsync()
            .args([
                "config",
                "check",
                "--config",
                file.to_str().unwrap(),
                "--",
                "serve",
            ])
            .args(extra)
            .envs(environment.iter().copied())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let from_file = check(&[], &[]);
    assert!(
        from_file.contains("workers = 2    # config file"),
        "{from_file}"
    );
    assert!(
        from_file.contains("db = postgres://app:********@db.example.com/app?sslmode=verify-full"),
        "{from_file}"
    );
    assert!(!from_file.contains("s3cret"), "{from_file}");
    let from_environment = check(&[], &[("ROWSYNC_WORKERS", "3")]);
    assert!(
        from_environment.contains("workers = 3    # environment"),
        "{from_environment}"
    );
    let from_flag = check(&["--workers", "4"], &[("ROWSYNC_WORKERS", "3")]);
    assert!(
        from_flag.contains("workers = 4    # command line"),
        "{from_flag}"
    );
}

#[test]
fn a_misspelt_key_is_refused_with_the_nearest_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rowsync.toml");
    std::fs::write(&file, "db = \"central.db\"\nmax_conections = 64\n").unwrap();
    let output = rowsync()
        .args(["serve", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("\"max_conections\"") && said.contains("did you mean \"max_connections\""),
        "{said}"
    );
    let invalid = std::fs::write(&file, "db = \"central.db\"\nworkers = \"many\"\n");
    invalid.unwrap();
    let output = rowsync()
        .args([
            "config",
            "check",
            "--config",
            file.to_str().unwrap(),
            "--",
            "serve",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("would not start") && said.contains("many"),
        "{said}"
    );
}

#[test]
fn the_documented_example_file_is_taken() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/rowsync.example.toml"
    );
    let output = rowsync()
        .args(["config", "check", "--config", example, "--", "serve"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        said.contains("drain_timeout_seconds = 30    # config file"),
        "{said}"
    );
    assert!(said.contains("workers_max = 8"), "{said}");
    assert!(
        said.contains("oidc_issuer = https://login.example.com/realms/app    # config file"),
        "{said}"
    );
    assert!(
        said.contains("log_format = json    # config file"),
        "{said}"
    );
}
