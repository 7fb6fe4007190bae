//! Values larger than a frame (protocol v2: values in pieces) through the `rowsync`
//! binary, on a SQLite file and on PostgreSQL: a 50 MiB blob and a 5 MiB text go from one
//! client to the consolidated database and on to another client, byte for byte; a value
//! just above `value_bytes_max` is refused with code 5 in either direction and nothing of
//! the sync is applied.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Stdio;

use rowsync_client::{Client, ClientError, SyncOptions};
use rowsync_protocol::ErrorCode;
use support::{rowsync, serve, Server};

const BLOB_BYTES: usize = 50 * 1024 * 1024;
/// The refusing server's limit: the 50 MiB blob is above it, the text below.
const SMALL_VALUE_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// The main server's cache: far below the blob, so its memory bound shows.
const CACHE_BYTES_MAX: u64 = 4 * 1024 * 1024;

const SQLITE_FILES: &str =
    "CREATE TABLE files (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, name TEXT, data BLOB)";
const POSTGRES_FILES: &str =
    "CREATE TABLE files (id bigint PRIMARY KEY, owner text NOT NULL, name text, data bytea)";

/// Bytes no compression shrinks (xorshift), so every one of them crosses the wire.
fn noise(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(bytes + 8);
    while out.len() < bytes {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(bytes);
    out
}

/// A text of about 5 MiB with three-byte characters, so pieces cut through characters.
fn large_text() -> String {
    "line ✓ of a long text, ünïcödé included\n".repeat(120_000)
}

/// A sample of the server's Prometheus metrics (`GET /metrics` on its admin endpoint).
fn metric(server: &Server, name: &str) -> f64 {
    let admin = server.admin.as_ref().expect("served with --admin-listen");
    let mut stream = std::net::TcpStream::connect(admin).unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {response}"))
}

fn init(db: &str) {
    let init = rowsync()
        .args([
            "init",
            "--db",
            db,
            "--table",
            "files",
            "--partition-column",
            "owner",
        ])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let mut add = rowsync()
        .args(["user", "add", "--db", db, "--name", "erin"])
        .env_remove("ROWSYNC_PASSWORD")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    add.stdin
        .take()
        .unwrap()
        .write_all(b"erin-secret\n")
        .unwrap();
    assert!(add.wait().unwrap().success());
}

fn client(dir: &tempfile::TempDir, name: &str) -> Client {
    let mut client = Client::open(dir.path().join(format!("{name}.db"))).unwrap();
    client.connection().execute_batch(SQLITE_FILES).unwrap();
    client.track("files").unwrap();
    client
}

fn options(address: &str) -> SyncOptions {
    SyncOptions::new(address, "erin", "erin-secret")
}

fn row_of(client: &Client, id: i64) -> Option<(String, Vec<u8>)> {
    client
        .connection()
        .query_row("SELECT name, data FROM files WHERE id = ?1", [id], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .ok()
}

fn file_ids(client: &Client) -> Vec<i64> {
    let mut statement = client
        .connection()
        .prepare("SELECT id FROM files ORDER BY id")
        .unwrap();
    let ids = statement.query_map([], |row| row.get(0)).unwrap();
    ids.map(Result::unwrap).collect()
}

/// The consolidated row `id` as (name, data), whatever the backend.
type ReadConsolidated<'a> = &'a dyn Fn(i64) -> Option<(String, Vec<u8>)>;

/// The scenario on a consolidated database `db` holding an empty `files` table.
async fn large_values_scenario(
    db: &str,
    dir: &tempfile::TempDir,
    consolidated: ReadConsolidated<'_>,
) {
    init(db);
    let server = serve(
        Path::new(db),
        &[
            "--cache-bytes-max",
            &CACHE_BYTES_MAX.to_string(),
            "--admin-listen",
            "127.0.0.1:0",
        ],
    );
    let address = server.address.clone();
    let small_server = serve(
        Path::new(db),
        &["--value-bytes-max", &SMALL_VALUE_BYTES_MAX.to_string()],
    );
    let small_address = small_server.address.clone();

    // Just above the limit, up: refused with code 5 before any database work.
    let mut uploader = client(dir, "uploader");
    let too_large = noise(SMALL_VALUE_BYTES_MAX as usize + 1, 11);
    uploader
        .connection()
        .execute(
            "INSERT INTO files VALUES (2, 'erin', 'above', ?1)",
            [&too_large],
        )
        .unwrap();
    let refused = uploader.sync(&options(&small_address)).await;
    assert_code_5(
        refused,
        "value of 8388609 bytes in column \"data\" of table \"files\"",
    );
    assert!(
        consolidated(2).is_none(),
        "nothing of the refused upload was applied"
    );
    // Exactly at the limit goes through.
    let mut exact = client(dir, "exact");
    let at_limit = &too_large[..SMALL_VALUE_BYTES_MAX as usize];
    exact
        .connection()
        .execute(
            "INSERT INTO files VALUES (4, 'erin', 'at the limit', ?1)",
            [at_limit],
        )
        .unwrap();
    exact.sync(&options(&small_address)).await.unwrap();
    assert!(consolidated(4).unwrap().1 == at_limit);

    // Up: a 50 MiB blob and a 5 MiB text, each larger than a frame.
    let blob = noise(BLOB_BYTES, 7);
    let text = large_text();
    let mut writer = client(dir, "writer");
    writer
        .connection()
        .execute(
            "INSERT INTO files VALUES (1, 'erin', ?1, ?2)",
            rusqlite::params![text, blob],
        )
        .unwrap();
    let report = writer.sync(&options(&address)).await.unwrap();
    assert_eq!(report.rows_uploaded, 1);
    let stored = consolidated(1).expect("the row reached the consolidated database");
    assert!(stored.0 == text, "the text changed on its way up");
    assert!(stored.1 == blob, "the blob changed on its way up");

    // Down: another client receives both, byte for byte.
    let mut reader = client(dir, "reader");
    let report = reader.sync(&options(&address)).await.unwrap();
    assert_eq!(report.rows_downloaded, 2);
    let received = row_of(&reader, 1).expect("the row reached the other client");
    assert!(received.0 == text, "the text changed on its way down");
    assert!(received.1 == blob, "the blob changed on its way down");
    assert!(row_of(&reader, 4).unwrap().1 == at_limit);
    // Up and down, the server held no more of the blob in memory than its cache allows
    // (the cache's peak, counted in bytes); the rest went through its spill files.
    let peak = metric(&server, "rowsync_cache_bytes_peak");
    assert!(peak <= CACHE_BYTES_MAX as f64, "cache peak {peak}");
    let spilled = metric(&server, "rowsync_spilled_bytes_total");
    assert!(
        spilled >= 2.0 * (BLOB_BYTES as f64 - CACHE_BYTES_MAX as f64),
        "spilled {spilled}"
    );

    // Above the limit, down: the 50 MiB blob is refused to a new client with code 5, and
    // neither its own upload (row 3) nor any of the download is applied.
    let mut late = client(dir, "late");
    late.connection()
        .execute("INSERT INTO files VALUES (3, 'erin', 'small', x'00ff')", [])
        .unwrap();
    let refused = late.sync(&options(&small_address)).await;
    assert_code_5(refused, "column \"data\" of table \"files\"");
    assert!(
        consolidated(3).is_none(),
        "the upload of the refused sync was rolled back"
    );
    assert_eq!(
        file_ids(&late),
        vec![3],
        "nothing of the refused download was applied"
    );
    assert_eq!(late.download_watermark().unwrap(), 0);
    drop((server, small_server));
}

fn assert_code_5<T: std::fmt::Debug>(outcome: Result<T, ClientError>, names: &str) {
    match outcome {
        Err(ClientError::Server(error)) => {
            assert_eq!(
                error.error_code(),
                Some(ErrorCode::UploadTooLarge),
                "{error}"
            );
            assert!(error.message.contains(names), "{error}");
            assert!(error.message.contains("value_bytes_max"), "{error}");
        }
        other => panic!("expected code 5, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mib_blob_and_a_large_text_sync_both_ways_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(SQLITE_FILES)
        .unwrap();
    let path = db.clone();
    let read = move |id: i64| -> Option<(String, Vec<u8>)> {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row("SELECT name, data FROM files WHERE id = ?1", [id], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .ok()
    };
    large_values_scenario(db.to_str().unwrap(), &dir, &read).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mib_blob_and_a_large_text_sync_both_ways_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let (url, client) = rowsync_testkit::fresh_database_with("large_values", POSTGRES_FILES).await;
    let runtime = tokio::runtime::Handle::current();
    let read = move |id: i64| -> Option<(String, Vec<u8>)> {
        tokio::task::block_in_place(|| {
            runtime.block_on(async {
                client
                    .query_opt("SELECT name, data FROM files WHERE id = $1", &[&id])
                    .await
                    .unwrap()
                    .map(|row| (row.get::<_, String>(0), row.get::<_, Vec<u8>>(1)))
            })
        })
    };
    large_values_scenario(&url, &dir, &read).await;
}
