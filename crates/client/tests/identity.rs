//! A client database proves it is the one the server knows (issue 30, item 2): a copy
//! of a synced client file, or a backup restored over it, is refused before anything is
//! applied, takes a new client id, and uploads its own changes as that client, so
//! nothing either copy wrote is lost. An unchanged resend of an in-flight upload is
//! still answered as applied before.
//!
//! Each test runs on a SQLite, a PostgreSQL and a MariaDB consolidated database through
//! a real server (`backends`).

#[macro_use]
mod backends;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use backends::{options, password, Backend, CLIENT_DDL, POSTGRES_ITEMS};
use rowsync_client::{Client, ClientOptions, Durability, ExistingRows, SyncOptions, SyncReport};
use rowsync_server::ServerConfig;

/// A client database at `path` with `items` created and tracked.
fn client_at(path: &Path, ddl: &str) -> Client {
    let mut client = Client::open(path).unwrap();
    client.connection().execute_batch(ddl).unwrap();
    client.track_with("items", ExistingRows::Upload).unwrap();
    client
}

/// Copies a client database file as a backup or a file copy would: its write-ahead log
/// checkpointed into it first, so the copy is the whole database.
fn copy_file(client: &Client, from: &Path, to: &Path) {
    client
        .connection()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(to, suffix));
    }
    std::fs::copy(from, to).unwrap();
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn insert(client: &Client, ids: &[&str]) {
    for id in ids {
        client
            .connection()
            .execute(
                "INSERT INTO items (id, owner, body) VALUES (?1, 'alice', ?1)",
                [id],
            )
            .unwrap();
    }
}

/// A client's `items` ids, in order.
fn local_ids(client: &Client) -> Vec<String> {
    let mut statement = client
        .connection()
        .prepare("SELECT id FROM items ORDER BY id")
        .unwrap();
    let rows = statement.query_map([], |row| row.get(0)).unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

async fn server_ids(backend: &Backend) -> Vec<String> {
    backend.items().await.into_iter().map(|row| row.0).collect()
}

fn ids(expected: &[&str]) -> Vec<String> {
    expected.iter().map(|id| id.to_string()).collect()
}

/// What the report says of the client database's identity, as `to_json` (and so
/// `rowsync sync --json`, the C library) gives it.
fn identity(report: &SyncReport) -> serde_json::Value {
    report.to_json()["identity"].clone()
}

/// A synced client file copied: the copy syncs first, then the original, each with
/// its own new rows. The original is told it is a copy, takes a new client id, and
/// both end with every row.
async fn copied_database_loses_nothing(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let (original_path, copy_path) = (dir.path().join("original.db"), dir.path().join("copy.db"));
    let mut original = client_at(&original_path, CLIENT_DDL);
    insert(&original, &["o1"]);
    original.sync(&options(address, "alice")).await.unwrap();
    copy_file(&original, &original_path, &copy_path);
    let mut copy = Client::open(&copy_path).unwrap();
    assert_eq!(copy.client_id(), original.client_id());

    insert(&copy, &["c1"]);
    let report = copy.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(identity(&report), serde_json::Value::Null, "{report:?}");
    insert(&original, &["a1", "a2", "a3"]);
    let old_id = original.client_id().to_string();
    let report = original.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(
        server_ids(&backend).await,
        ids(&["a1", "a2", "a3", "c1", "o1"])
    );
    assert_eq!(identity(&report), "copied", "{report:?}");
    assert!(!report.upload_already_applied, "{report:?}");
    assert_eq!(report.rows_uploaded, 3, "{report:?}");
    assert_ne!(original.client_id(), old_id);
    assert_eq!(local_ids(&original), ids(&["a1", "a2", "a3", "c1", "o1"]));

    let report = copy.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(identity(&report), serde_json::Value::Null, "{report:?}");
    let report = original.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(identity(&report), serde_json::Value::Null, "{report:?}");
    assert_eq!(local_ids(&copy), ids(&["a1", "a2", "a3", "c1", "o1"]));
    assert_eq!(local_ids(&original), ids(&["a1", "a2", "a3", "c1", "o1"]));
}

/// A backup restored over a device that synced twice since: the restored database is
/// behind the server's record of its client id. It is told so, keeps its own new row,
/// and gets the rows synced after the backup.
async fn restored_backup_loses_nothing(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let (device_path, backup_path) = (dir.path().join("device.db"), dir.path().join("backup.db"));
    let mut device = client_at(&device_path, CLIENT_DDL);
    insert(&device, &["b0"]);
    device.sync(&options(address, "alice")).await.unwrap();
    copy_file(&device, &device_path, &backup_path);
    for id in ["d1", "d2"] {
        insert(&device, &[id]);
        device.sync(&options(address, "alice")).await.unwrap();
    }
    drop(device);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(with_suffix(&device_path, suffix));
    }
    std::fs::copy(&backup_path, &device_path).unwrap();

    let mut restored = Client::open(&device_path).unwrap();
    insert(&restored, &["r1"]);
    let report = restored.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(server_ids(&backend).await, ids(&["b0", "d1", "d2", "r1"]));
    assert_eq!(identity(&report), "restored", "{report:?}");
    assert_eq!(report.rows_uploaded, 1, "{report:?}");
    assert_eq!(local_ids(&restored), ids(&["b0", "d1", "d2", "r1"]));
    let report = restored.sync(&options(address, "alice")).await.unwrap();
    assert_eq!(identity(&report), serde_json::Value::Null, "{report:?}");
}

/// An upload the server applied whose download the client could not apply (here: a
/// downloaded row breaks a CHECK constraint of the client's table) stays in flight;
/// sent again unchanged, it is applied before, not a copy.
async fn resent_upload_is_applied_before(backend: Backend) {
    let address = backend.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let mut other = client_at(&dir.path().join("other.db"), CLIENT_DDL);
    other
        .connection()
        .execute_batch("INSERT INTO items (id, owner, body) VALUES ('x1', 'alice', 'bad')")
        .unwrap();
    other.sync(&options(address, "alice")).await.unwrap();
    let checked = "CREATE TABLE items (id TEXT PRIMARY KEY, owner TEXT NOT NULL, \
                   body TEXT CHECK (body <> 'bad'), quantity INTEGER)";
    let mut phone = client_at(&dir.path().join("phone.db"), checked);
    insert(&phone, &["p1"]);
    let failed = phone.sync(&options(address, "alice")).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(server_ids(&backend).await, ids(&["p1", "x1"]));

    other
        .connection()
        .execute_batch("UPDATE items SET body = 'good' WHERE id = 'x1'")
        .unwrap();
    other.sync(&options(address, "alice")).await.unwrap();
    let id = phone.client_id().to_string();
    let report = phone.sync(&options(address, "alice")).await.unwrap();
    assert!(report.upload_already_applied, "{report:?}");
    assert_eq!(identity(&report), serde_json::Value::Null, "{report:?}");
    assert_eq!(phone.client_id(), id);
    assert_eq!(local_ids(&phone), ids(&["p1", "x1"]));
}

/// The new client id of a copy counts towards its user's `client_ids_per_user_max`: at
/// the limit the copy's sync fails (code 13) with its changes kept in flight under the
/// new id, and they go up once the limit allows.
#[tokio::test]
async fn a_copy_at_the_client_id_limit_waits_with_its_changes() {
    let backend = Backend::sqlite(&[CLIENT_DDL]).await;
    let limited = ServerConfig {
        client_ids_per_user_max: Some(1),
        ..ServerConfig::default()
    };
    let address = backend.serve_with(limited).await;
    let dir = tempfile::tempdir().unwrap();
    let (original_path, copy_path) = (dir.path().join("original.db"), dir.path().join("copy.db"));
    let mut original = client_at(&original_path, CLIENT_DDL);
    insert(&original, &["o1"]);
    original.sync(&options(address, "alice")).await.unwrap();
    copy_file(&original, &original_path, &copy_path);
    let mut copy = Client::open(&copy_path).unwrap();
    insert(&copy, &["c1"]);
    copy.sync(&options(address, "alice")).await.unwrap();

    insert(&original, &["a1"]);
    let old_id = original.client_id().to_string();
    let error = original
        .sync(&options(address, "alice"))
        .await
        .expect_err("a second client id of alice is refused");
    assert_eq!(
        error.server_code(),
        Some(rowsync_protocol::ErrorCode::ClientIdsExceeded),
        "{error}"
    );
    assert_ne!(original.client_id(), old_id);
    assert_eq!(server_ids(&backend).await, ids(&["c1", "o1"]));

    let unlimited = backend.serve().await;
    let report = original.sync(&options(unlimited, "alice")).await.unwrap();
    assert_eq!(report.rows_uploaded, 1, "{report:?}");
    assert_eq!(server_ids(&backend).await, ids(&["a1", "c1", "o1"]));
    assert_eq!(local_ids(&original), ids(&["a1", "c1", "o1"]));
}

on_every_backend!(
    copied_database_loses_nothing,
    restored_backup_loses_nothing,
    resent_upload_is_applied_before,
);

/// What the identity check costs an empty sync: empty syncs per second of one client
/// against `rowsync serve` programs named in `ROWSYNC_EMPTY_SYNC_PROGRAMS`
/// (`name=path,name=path`, e.g. a build of main and one of this branch), each on a fresh
/// SQLite and a fresh PostgreSQL database, taking turns sync by sync in 5 rounds of
/// `ROWSYNC_EMPTY_SYNCS` (default 300) syncs each, so both see the same machine:
///
/// `ROWSYNC_EMPTY_SYNC_PROGRAMS=old=/tmp/rowsync-main,new=target/debug/rowsync
/// cargo test -p rowsync-client --test identity -- --ignored empty_syncs --nocapture`
///
/// With `ROWSYNC_EMPTY_SYNC_JWT_SECRET_FILE` and `ROWSYNC_EMPTY_SYNC_JWT` (an HS256 token
/// of subject alice signed with that file's secret) the client logs in with the token,
/// so the password hash (argon2id, the larger part of an empty sync) is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; needs ROWSYNC_EMPTY_SYNC_PROGRAMS"]
async fn empty_syncs_per_second() {
    let programs = std::env::var("ROWSYNC_EMPTY_SYNC_PROGRAMS").expect("programs to compare");
    let syncs: u32 = std::env::var("ROWSYNC_EMPTY_SYNCS").map_or(300, |n| n.parse().unwrap());
    let programs: Vec<(String, PathBuf)> = programs
        .split(',')
        .map(|pair| {
            let (name, path) = pair.split_once('=').expect("name=path");
            (name.to_string(), PathBuf::from(path))
        })
        .collect();
    for backend in ["sqlite", "postgres"] {
        let dir = tempfile::tempdir().unwrap();
        let mut servers = Vec::new();
        for (name, program) in &programs {
            let db = measured_database(backend, dir.path(), name).await;
            let server = MeasuredServer::start(program, &db);
            // No flush on the client: the server's share of each sync is what is compared.
            let mut client = Client::open_with(
                dir.path().join(format!("{name}.db")),
                &ClientOptions {
                    durable_before_sync: false,
                    ..ClientOptions::new(Durability::Off)
                },
            )
            .unwrap();
            client.connection().execute_batch(CLIENT_DDL).unwrap();
            client.track("items").unwrap();
            client
                .sync(&measured_options(server.address))
                .await
                .unwrap();
            servers.push((name.clone(), server, client, Vec::new()));
        }
        // The servers take turns sync by sync, so a change in the machine's load
        // meets both alike; each round's rate is its syncs over their summed times.
        for _round in 0..5 {
            let mut spent = vec![std::time::Duration::ZERO; servers.len()];
            for _ in 0..syncs {
                for ((_, server, client, _), spent) in servers.iter_mut().zip(&mut spent) {
                    let started = std::time::Instant::now();
                    client
                        .sync(&measured_options(server.address))
                        .await
                        .unwrap();
                    *spent += started.elapsed();
                }
            }
            for ((_, _, _, rates), spent) in servers.iter_mut().zip(spent) {
                rates.push(f64::from(syncs) / spent.as_secs_f64());
            }
        }
        for (name, _, _, rates) in &mut servers {
            rates.sort_by(f64::total_cmp);
            let shown: Vec<String> = rates.iter().map(|rate| format!("{rate:.0}")).collect();
            println!(
                "{backend} {name}: median {:.0} empty syncs/s (rounds of {syncs}: {})",
                rates[rates.len() / 2],
                shown.join(", ")
            );
        }
    }
}

/// How the measuring client syncs: as alice, with the token if one is given.
fn measured_options(address: SocketAddr) -> SyncOptions {
    let mut options = options(address, "alice");
    options.token = std::env::var("ROWSYNC_EMPTY_SYNC_JWT").ok();
    options
}

/// A fresh consolidated database for one measured server, with the `items` table.
async fn measured_database(backend: &str, dir: &Path, name: &str) -> String {
    match backend {
        "sqlite" => {
            let path = dir.join(format!("consolidated-{name}.db"));
            let connection = rusqlite::Connection::open(&path).unwrap();
            connection.execute_batch(CLIENT_DDL).unwrap();
            path.to_string_lossy().into_owned()
        }
        _ => {
            rowsync_testkit::fresh_database_with("empty_syncs", POSTGRES_ITEMS)
                .await
                .0
        }
    }
}

/// A `rowsync serve` child process on a database it initialized (`items`, alice).
struct MeasuredServer {
    child: std::process::Child,
    address: SocketAddr,
}

impl MeasuredServer {
    fn start(program: &Path, db: &str) -> MeasuredServer {
        let run = |arguments: &[&str]| {
            let status = std::process::Command::new(program)
                .args(arguments)
                .stdout(std::process::Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "{program:?} {arguments:?}");
        };
        run(&[
            "init",
            "--db",
            db,
            "--table",
            "items",
            "--partition-column",
            "owner",
        ]);
        let password = password("alice");
        run(&[
            "user",
            "add",
            "--db",
            db,
            "--name",
            "alice",
            "--password",
            &password,
        ]);
        let address = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut serve = vec!["serve".to_string(), "--db".into(), db.into()];
        serve.extend(["--listen".into(), address.to_string()]);
        if let Ok(secret) = std::env::var("ROWSYNC_EMPTY_SYNC_JWT_SECRET_FILE") {
            serve.extend(["--jwt-hs256-secret-file".into(), secret]);
        }
        let child = std::process::Command::new(program)
            .args(&serve)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Dropped (killed and waited for) whether it listens or not.
        let server = MeasuredServer { child, address };
        let listening = (0..200).any(|_| {
            let connected = std::net::TcpStream::connect(address).is_ok();
            if !connected {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            connected
        });
        assert!(listening, "{program:?} did not listen on {address}");
        server
    }
}

impl Drop for MeasuredServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
