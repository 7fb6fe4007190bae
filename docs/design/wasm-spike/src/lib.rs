//! rowsync wasm spike: rusqlite on `wasm32-unknown-unknown`, the database in OPFS
//! through the `opfs-sahpool` VFS (sqlite-wasm-vfs), driven from a dedicated worker.
//!
//! Every exported function returns a JSON string (or throws a JS `Error`), so the
//! worker can post the result back to the page as is.

use std::cell::RefCell;

use rusqlite::{params, Connection, OpenFlags};
use serde_json::json;
use sqlite_wasm_rs::vfs::VfsFilesManager;
use sqlite_wasm_vfs::sahpool::{install, OpfsSAHPoolCfgBuilder, OpfsSAHPoolUtil};
use wasm_bindgen::prelude::*;
use web_time::Instant;

/// The VFS name the pool registers under; connections name it explicitly.
const VFS: &str = "rowsync-opfs";

thread_local! {
    static POOL: RefCell<Option<OpfsSAHPoolUtil>> = const { RefCell::new(None) };
    static DB: RefCell<Option<Connection>> = const { RefCell::new(None) };
}

fn js_err(error: impl std::fmt::Display) -> JsError {
    JsError::new(&error.to_string())
}

fn with_db<T>(f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, JsError> {
    DB.with_borrow(|db| match db {
        Some(connection) => f(connection).map_err(js_err),
        None => Err(JsError::new("store not open")),
    })
}

fn elapsed_ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

#[wasm_bindgen(start)]
pub fn start() {
    console_error_panic_hook::set_once();
}

/// Installs the sahpool VFS over OPFS directory `directory` (idempotent for the
/// same name and directory) and returns the pool's state.
async fn ensure_pool(directory: &str) -> Result<serde_json::Value, JsError> {
    let started = Instant::now();
    let installed = POOL.with_borrow(|pool| pool.is_some());
    if !installed {
        let cfg = OpfsSAHPoolCfgBuilder::new()
            .vfs_name(VFS)
            .directory(directory)
            .initial_capacity(6)
            .build();
        let util = install::<sqlite_wasm_rs::WasmOsCallback>(&cfg, false)
            .await
            .map_err(|e| js_err(format!("installing opfs-sahpool: {e:?}")))?;
        POOL.with_borrow_mut(|pool| *pool = Some(util));
    }
    POOL.with_borrow(|pool| {
        let util = pool.as_ref().expect("installed above");
        Ok(json!({
            "vfs": VFS,
            "directory": directory,
            "install_ms": elapsed_ms(started),
            "capacity": format!("{:?}", util.capacity()),
            "files": format!("{:?}", util.names()),
        }))
    })
}

/// Opens (creating if needed) database `name` on the sahpool VFS and makes it the
/// store the other functions use.
#[wasm_bindgen]
pub async fn open_store(directory: String, name: String) -> Result<String, JsError> {
    let pool = ensure_pool(&directory).await?;
    let started = Instant::now();
    let connection = Connection::open_with_flags_and_vfs(
        &name,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS,
    )
    .map_err(js_err)?;
    connection
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS items(
                 id INTEGER PRIMARY KEY,
                 tag TEXT NOT NULL,
                 payload BLOB NOT NULL,
                 at INTEGER NOT NULL)",
        )
        .map_err(js_err)?;
    let count: i64 = connection
        .query_row("SELECT count(*) FROM items", [], |row| row.get(0))
        .map_err(js_err)?;
    let journal: String = connection
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .map_err(js_err)?;
    let version: String = connection
        .query_row("SELECT sqlite_version()", [], |row| row.get(0))
        .map_err(js_err)?;
    let open_ms = elapsed_ms(started);
    DB.with_borrow_mut(|db| *db = Some(connection));
    Ok(json!({
        "pool": pool,
        "database": name,
        "sqlite_version": version,
        "journal_mode": journal,
        "rows_at_open": count,
        "open_ms": open_ms,
        "cross_origin_isolated": js_sys::Reflect::get(&js_sys::global(), &"crossOriginIsolated".into())
            .ok().and_then(|v| v.as_bool()),
    })
    .to_string())
}

/// Inserts `n` rows tagged `tag` in one transaction; returns the new total.
#[wasm_bindgen]
pub fn insert_rows(n: u32, tag: String) -> Result<String, JsError> {
    let started = Instant::now();
    let now_ms = js_sys::Date::now() as i64;
    let total = with_db(|db| {
        db.execute_batch("BEGIN IMMEDIATE")?;
        {
            let mut insert =
                db.prepare_cached("INSERT INTO items(tag, payload, at) VALUES (?1, ?2, ?3)")?;
            for i in 0..n {
                let payload = format!("{tag}-{i}").into_bytes();
                insert.execute(params![tag, payload, now_ms])?;
            }
        }
        db.execute_batch("COMMIT")?;
        db.query_row("SELECT count(*) FROM items", [], |row| row.get::<_, i64>(0))
    })?;
    Ok(json!({ "inserted": n, "total": total, "ms": elapsed_ms(started) }).to_string())
}

/// Counts per tag, the last rows, and an integrity check.
#[wasm_bindgen]
pub fn summary() -> Result<String, JsError> {
    let started = Instant::now();
    let value = with_db(|db| {
        let mut by_tag = db.prepare("SELECT tag, count(*) FROM items GROUP BY tag ORDER BY tag")?;
        let tags: Vec<(String, i64)> = by_tag
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut last = db.prepare("SELECT id, tag, payload FROM items ORDER BY id DESC LIMIT 3")?;
        let rows: Vec<(i64, String, String)> = last
            .query_map([], |row| {
                let payload: Vec<u8> = row.get(2)?;
                Ok((row.get(0)?, row.get(1)?, String::from_utf8_lossy(&payload).into_owned()))
            })?
            .collect::<rusqlite::Result<_>>()?;
        let integrity: String = db.query_row("PRAGMA integrity_check", [], |row| row.get(0))?;
        let pages: i64 = db.query_row("PRAGMA page_count", [], |row| row.get(0))?;
        let page_size: i64 = db.query_row("PRAGMA page_size", [], |row| row.get(0))?;
        Ok(json!({
            "by_tag": tags,
            "last_rows": rows,
            "integrity_check": integrity,
            "bytes": pages * page_size,
        }))
    })?;
    Ok(json!({ "summary": value, "ms": elapsed_ms(started) }).to_string())
}

/// Closes the store's connection (its pool file stays; the handles stay with the pool).
#[wasm_bindgen]
pub fn close_store() -> Result<String, JsError> {
    let had = DB.with_borrow_mut(|db| db.take()).is_some();
    Ok(json!({ "closed": had }).to_string())
}

/// What `PRAGMA journal_mode=WAL` does on this VFS (rowsync's file modes use WAL),
/// plain and under `locking_mode=EXCLUSIVE` (WAL without shared memory).
#[wasm_bindgen]
pub fn probe_wal() -> Result<String, JsError> {
    let plain = Connection::open_with_flags_and_vfs(
        "wal-probe-plain.db",
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS,
    )
    .map_err(js_err)?;
    let plain_mode: String = plain
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(js_err)?;
    let plain_write = plain
        .execute_batch("CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES(1);")
        .map_err(|e| e.to_string());
    drop(plain);

    let exclusive = Connection::open_with_flags_and_vfs(
        "wal-probe-exclusive.db",
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS,
    )
    .map_err(js_err)?;
    let locking: String = exclusive
        .query_row("PRAGMA locking_mode=EXCLUSIVE", [], |row| row.get(0))
        .map_err(js_err)?;
    let exclusive_mode: Result<String, String> = exclusive
        .query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))
        .map_err(|e| e.to_string());
    let exclusive_write = exclusive
        .execute_batch("CREATE TABLE IF NOT EXISTS t(x); INSERT INTO t VALUES(1);")
        .and_then(|()| exclusive.query_row("SELECT count(*) FROM t", [], |row| row.get::<_, i64>(0)))
        .map_err(|e| e.to_string());
    let synchronous = exclusive
        .pragma_update(None, "synchronous", "FULL")
        .map_err(|e| e.to_string());
    Ok(json!({
        "plain": { "journal_mode": plain_mode, "write": format!("{plain_write:?}") },
        "exclusive": {
            "locking_mode": locking,
            "journal_mode": format!("{exclusive_mode:?}"),
            "write_then_count": format!("{exclusive_write:?}"),
            "synchronous_full": format!("{synchronous:?}"),
        },
    })
    .to_string())
}

/// rowsync's `Durability::Memory` path: a private `memdb` database, copied with the
/// backup API into a sahpool file, then read back from the file.
#[wasm_bindgen]
pub fn memdb_roundtrip(rows: u32) -> Result<String, JsError> {
    let started = Instant::now();
    let memory = Connection::open_with_flags_and_vfs(
        "rowsync-memory-spike",
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        c"memdb",
    )
    .map_err(js_err)?;
    memory
        .execute_batch("CREATE TABLE m(id INTEGER PRIMARY KEY, v TEXT)")
        .map_err(js_err)?;
    for i in 0..rows {
        memory
            .execute("INSERT INTO m(v) VALUES (?1)", params![format!("v{i}")])
            .map_err(js_err)?;
    }
    let mut copy = Connection::open_with_flags_and_vfs(
        "memdb-copy.db",
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE,
        VFS,
    )
    .map_err(js_err)?;
    let step = {
        let backup = rusqlite::backup::Backup::new(&memory, &mut copy).map_err(js_err)?;
        backup.step(-1).map_err(js_err)?
    };
    drop(copy);
    let reopened = Connection::open_with_flags_and_vfs(
        "memdb-copy.db",
        OpenFlags::SQLITE_OPEN_READ_WRITE,
        VFS,
    )
    .map_err(js_err)?;
    let count: i64 = reopened
        .query_row("SELECT count(*) FROM m", [], |row| row.get(0))
        .map_err(js_err)?;
    Ok(json!({ "backup_step": format!("{step:?}"), "rows_in_copy": count, "ms": elapsed_ms(started) })
        .to_string())
}

/// zstd (C, through zstd-sys's wasm shim), flate2 (miniz_oxide) and rand 0.8
/// (getrandom 0.2 with `js`), as the protocol and client use them.
#[cfg(feature = "codecs")]
#[wasm_bindgen]
pub fn codecs_roundtrip() -> Result<String, JsError> {
    use rand::RngCore;
    use std::io::{Read, Write};
    let input: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
    let zstd_packed = zstd::bulk::compress(&input, 3).map_err(js_err)?;
    let zstd_back = zstd::bulk::decompress(&zstd_packed, input.len()).map_err(js_err)?;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(&input).map_err(js_err)?;
    let gz = encoder.finish().map_err(js_err)?;
    let mut gz_back = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut gz_back)
        .map_err(js_err)?;
    let mut id = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut id);
    Ok(json!({
        "input": input.len(),
        "zstd": zstd_packed.len(), "zstd_ok": zstd_back == input,
        "gzip": gz.len(), "gzip_ok": gz_back == input,
        "random_id": id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
    })
    .to_string())
}

/// What std's unsupported platform pieces do here (rowsync's durability.rs uses
/// `std::process::id`, `Path::exists`, `File::sync_all` and `fs::rename`).
#[wasm_bindgen]
pub fn probe_std_fs() -> String {
    let exists = std::path::Path::new("client.db").exists();
    let open = std::fs::File::open("client.db").map(|_| ()).map_err(|e| e.to_string());
    let rename = std::fs::rename("a", "b").map_err(|e| e.to_string());
    json!({
        "path_exists": exists,
        "file_open": format!("{open:?}"),
        "rename": format!("{rename:?}"),
    })
    .to_string()
}

/// Calls a std function that panics on this target; `which` picks it. The worker
/// sees the panic as a thrown `RuntimeError: unreachable` (panic = abort).
#[wasm_bindgen]
pub fn probe_panics(which: String) -> String {
    match which.as_str() {
        "process_id" => format!("{}", std::process::id()),
        "instant" => format!("{:?}", std::time::Instant::now()),
        "system_time" => format!("{:?}", std::time::SystemTime::now()),
        other => format!("unknown probe {other}"),
    }
}
