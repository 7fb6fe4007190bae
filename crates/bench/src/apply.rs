//! `rowsync-bench apply`: one sync type at a time through rowsync (client frames over
//! TCP, server decode, set-based apply, commit; or the download) beside the same rows
//! written or read straight into PostgreSQL by its fastest bulk path (binary COPY, or
//! COPY into a temporary table and one set statement), measured in the same run.
//!
//! Efficiency = raw time / rowsync time. The raw table has the same columns and no
//! triggers; rowsync's table carries its change-tracking triggers.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::pin_mut;
use rowsync_client::transport::{exchange, Exchange};
use rowsync_client::{SessionEvent, TransportOptions};
use rowsync_consolidated::postgres::value::Bind;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, ScriptEntry, TableInit};
use rowsync_protocol::{
    encode_frame, Decimal, Hello, Message, Row, RowUpdate, TableUpload, Value,
    FRAME_BYTES_MAX_DEFAULT, PROTOCOL_VERSION,
};
use rowsync_server::{auth, ServerConfig};

use rowsync_cli::local_server::LocalServer;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls};

pub(crate) const USER: &str = "bench";
/// The script version whose upload_insert is a row script.
const ROW_SCRIPT_VERSION: &str = "bench_row_scripts";
pub(crate) const PASSWORD: &str = "bench-password";
/// Upload messages are cut at about this size, as the client library does.
const MESSAGE_BYTES: usize = 1024 * 1024;
pub(crate) const TABLE_DDL: &str =
    "(id BIGINT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, quantity INTEGER NOT NULL, \
     amount NUMERIC(30,6) NOT NULL, updated TIMESTAMPTZ NOT NULL)";
pub(crate) const COLUMNS: [&str; 6] = ["id", "owner", "name", "quantity", "amount", "updated"];
const TYPES: [Type; 6] = [
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::INT4,
    Type::NUMERIC,
    Type::TIMESTAMPTZ,
];

#[derive(Debug, Clone)]
pub struct Measurement {
    pub operation: &'static str,
    pub rows: usize,
    pub rowsync: Duration,
    pub raw: Duration,
}

impl Measurement {
    pub fn efficiency(&self) -> f64 {
        self.raw.as_secs_f64() / self.rowsync.as_secs_f64()
    }
}

pub(crate) fn row(id: i64, generation: i64) -> Row {
    vec![
        Value::Int(id),
        Value::Text(USER.into()),
        Value::Text(format!(
            "item {id} with a name of ordinary length, generation {generation}"
        )),
        Value::Int((id * 7 + generation) % 1000),
        Value::Decimal(
            Decimal::new(i128::from(id) * 1_000_123 + i128::from(generation), 6).expect("scale 6"),
        ),
        Value::Timestamp(1_700_000_000_000_000 + id * 1000 + generation),
    ]
}

pub(crate) async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context("connecting to PostgreSQL")?;
    tokio::spawn(connection);
    Ok(client)
}

pub async fn run(url: &str, rows: usize, out: &mut dyn Write) -> Result<Vec<Measurement>> {
    if rows == 0 {
        bail!("--rows must be at least 1");
    }
    let admin = connect(url).await?;
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS bench_rows; DROP TABLE IF EXISTS bench_raw;
             DROP TABLE IF EXISTS rs_rowversion_bench_rows; DROP TABLE IF EXISTS rs_deleted_bench_rows CASCADE;
             DROP TABLE IF EXISTS rs_tombstone_bench_rows;
             CREATE TABLE bench_rows {TABLE_DDL}; CREATE TABLE bench_raw {TABLE_DDL};"
        ))
        .await?;
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    connection
        .init_table(&TableInit {
            table: "bench_rows".into(),
            partition_column: "owner".into(),
            script_version: Some("bench".into()),
            based_on: None,
        })
        .await?;
    connection
        .set_user(
            USER,
            &auth::hash_password(PASSWORD).map_err(|e| anyhow::anyhow!("{e}"))?,
        )
        .await?;
    admin
        .execute("DELETE FROM rs_subscription WHERE user_name = $1", &[&USER])
        .await?;

    let server = LocalServer::start(backend, ServerConfig::default()).await?;
    let address = server.address.clone();
    let mut sequence = 0u64;
    let mut measurements = Vec::new();
    writeln!(out, "{rows} rows per operation; raw = PostgreSQL's bulk path on an identical table without triggers")?;

    // Inserts.
    let inserts: Vec<Row> = (0..rows as i64).map(|id| row(id, 0)).collect();
    let upload = chunks(inserts.iter().cloned().map(|r| (Some(r), None, None)));
    let rowsync = sync_timed(&address, "writer", &mut sequence, &upload).await?;
    let raw = timed(copy_rows(&admin, "bench_raw", &inserts)).await?;
    check_count(&admin, "bench_rows", rows).await?;
    check_count(&admin, "bench_raw", rows).await?;
    measurements.push(Measurement {
        operation: "upload insert",
        rows,
        rowsync,
        raw,
    });

    // Updates (old image = what was inserted).
    let updates: Vec<RowUpdate> = inserts
        .iter()
        .map(|old| RowUpdate {
            old: old.clone(),
            new: row(old_id(old), 1),
        })
        .collect();
    let upload = chunks(updates.iter().cloned().map(|u| (None, Some(u), None)));
    let rowsync = sync_timed(&address, "writer", &mut sequence, &upload).await?;
    let new_rows: Vec<Row> = updates.iter().map(|u| u.new.clone()).collect();
    let raw = timed(raw_update(&admin, &new_rows)).await?;
    let changed: i64 = admin
        .query_one(
            "SELECT count(*) FROM bench_rows WHERE name LIKE '%generation 1'",
            &[],
        )
        .await?
        .get(0);
    if changed != rows as i64 {
        bail!("{changed} of {rows} rows were updated through rowsync");
    }
    measurements.push(Measurement {
        operation: "upload update",
        rows,
        rowsync,
        raw,
    });

    // Download of everything to a new client.
    let started = Instant::now();
    let downloaded = download_all(&address).await?;
    let rowsync = started.elapsed();
    if downloaded != rows {
        bail!("the download brought {downloaded} rows, expected {rows}");
    }
    let raw = timed(copy_out(&admin)).await?;
    measurements.push(Measurement {
        operation: "download",
        rows,
        rowsync,
        raw,
    });

    // Deletes.
    let keys: Vec<Row> = (0..rows as i64).map(|id| vec![Value::Int(id)]).collect();
    let upload = chunks(keys.iter().cloned().map(|k| (None, None, Some(k))));
    let rowsync = sync_timed(&address, "writer", &mut sequence, &upload).await?;
    let raw = timed(raw_delete(&admin, &keys)).await?;
    check_count(&admin, "bench_rows", 0).await?;
    check_count(&admin, "bench_raw", 0).await?;
    measurements.push(Measurement {
        operation: "upload delete",
        rows,
        rowsync,
        raw,
    });

    // Inserts again, through a MobiLink-style row script (one pipelined statement per
    // row) in a second script version, into the now empty table.
    connection
        .add_script_version(ROW_SCRIPT_VERSION, "row scripts")
        .await?;
    for entry in connection.scripts(Some("bench")).await? {
        connection
            .set_script(&ScriptEntry {
                script_version: ROW_SCRIPT_VERSION.into(),
                ..entry
            })
            .await?;
    }
    connection
        .set_script(&ScriptEntry {
            script_version: ROW_SCRIPT_VERSION.into(),
            table: "bench_rows".into(),
            event: "upload_insert".into(),
            script: "INSERT INTO bench_rows (id, owner, name, quantity, amount, updated) \
                     VALUES (:new.id, :user, :new.name, :new.quantity, :new.amount, :new.updated)"
                .into(),
        })
        .await?;
    let upload = chunks(inserts.iter().cloned().map(|r| (Some(r), None, None)));
    let mut row_sequence = 0;
    let rowsync = sync_timed_version(
        &address,
        "row-writer",
        ROW_SCRIPT_VERSION,
        &mut row_sequence,
        &upload,
    )
    .await?;
    check_count(&admin, "bench_rows", rows).await?;
    let set_insert = measurements[0].rowsync;
    measurements.push(Measurement {
        operation: "insert, row scripts",
        rows,
        rowsync,
        raw: measurements[0].raw,
    });

    server.stop().await?;
    writeln!(
        out,
        "{:<20} {:>12} {:>12} {:>14} {:>14} {:>10}",
        "operation", "rowsync s", "raw s", "rowsync rows/s", "raw rows/s", "efficiency"
    )?;
    for m in &measurements {
        writeln!(
            out,
            "{:<20} {:>12.3} {:>12.3} {:>14.0} {:>14.0} {:>10.2}",
            m.operation,
            m.rowsync.as_secs_f64(),
            m.raw.as_secs_f64(),
            m.rows as f64 / m.rowsync.as_secs_f64(),
            m.rows as f64 / m.raw.as_secs_f64(),
            m.efficiency()
        )?;
    }
    writeln!(
        out,
        "uploaded inserts: set scripts {:.1}x faster than row scripts",
        rowsync.as_secs_f64() / set_insert.as_secs_f64()
    )?;
    Ok(measurements)
}

fn old_id(row: &Row) -> i64 {
    match row[0] {
        Value::Int(id) => id,
        _ => unreachable!("bench ids are integers"),
    }
}

async fn timed<F: std::future::Future<Output = Result<()>>>(work: F) -> Result<Duration> {
    let started = Instant::now();
    work.await?;
    Ok(started.elapsed())
}

async fn check_count(client: &Client, table: &str, expected: usize) -> Result<()> {
    let count: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .await?
        .get(0);
    if count != expected as i64 {
        bail!("{table} holds {count} rows, expected {expected}");
    }
    Ok(())
}

pub(crate) type Operation = (Option<Row>, Option<RowUpdate>, Option<Row>);

/// Upload frames of about `MESSAGE_BYTES` each.
pub(crate) fn chunks(operations: impl Iterator<Item = Operation>) -> Vec<Vec<u8>> {
    let empty = || TableUpload {
        table: "bench_rows".into(),
        columns: COLUMNS.iter().map(|c| c.to_string()).collect(),
        key_columns: vec!["id".into()],
        ..TableUpload::default()
    };
    let mut frames = Vec::new();
    let mut current = empty();
    let mut bytes = 0;
    for (insert, update, delete) in operations {
        if let Some(row) = insert {
            bytes += row.iter().map(Value::encoded_len).sum::<usize>();
            current.inserts.push(row);
        }
        if let Some(update) = update {
            bytes += update
                .old
                .iter()
                .chain(&update.new)
                .map(Value::encoded_len)
                .sum::<usize>();
            current.updates.push(update);
        }
        if let Some(key) = delete {
            bytes += 9;
            current.deletes.push(key);
        }
        if bytes >= MESSAGE_BYTES {
            frames.push(encode_frame(&Message::Upload(std::mem::replace(
                &mut current,
                empty(),
            ))));
            bytes = 0;
        }
    }
    frames.push(encode_frame(&Message::Upload(current)));
    frames
}

pub(crate) fn hello(client_id: &str, last_download_watermark: i64) -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        client_id: client_id.into(),
        user: USER.into(),
        password: PASSWORD.into(),
        script_version: "bench".into(),
        last_download_watermark,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    }
}

async fn sync_timed(
    address: &str,
    client_id: &str,
    sequence: &mut u64,
    frames: &[Vec<u8>],
) -> Result<Duration> {
    sync_timed_version(address, client_id, "bench", sequence, frames).await
}

async fn sync_timed_version(
    address: &str,
    client_id: &str,
    script_version: &str,
    sequence: &mut u64,
    frames: &[Vec<u8>],
) -> Result<Duration> {
    *sequence += 1;
    let started = Instant::now();
    let mut hello = hello(client_id, i64::MAX / 2);
    hello.script_version = script_version.into();
    let event = exchange(Exchange {
        address,
        transport: &TransportOptions::default(),
        // A watermark far ahead: the writer measures the upload, not a download.
        hello,
        upload_frames: frames,
        upload_sequence: *sequence,
        frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        timeout: Duration::from_secs(3600),
        acknowledge: None,
        transfer: None,
        download_resume: None,
        key_ranges: &[],
    })
    .await?;
    let elapsed = started.elapsed();
    match event {
        SessionEvent::Complete(done) if done.end.summary.conflicts == 0 => Ok(elapsed),
        SessionEvent::Complete(done) => bail!(
            "{} conflicts in a conflict-free upload",
            done.end.summary.conflicts
        ),
        other => bail!("the sync did not complete: {other:?}"),
    }
}

/// A new client's first sync, decoding every row (no SQLite).
async fn download_all(address: &str) -> Result<usize> {
    let event = exchange(Exchange {
        address,
        transport: &TransportOptions::default(),
        hello: hello("reader", 0),
        upload_frames: &[],
        upload_sequence: 1,
        frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        timeout: Duration::from_secs(3600),
        acknowledge: None,
        transfer: None,
        download_resume: None,
        key_ranges: &[],
    })
    .await?;
    match event {
        SessionEvent::Complete(done) => Ok(done.downloads.iter().map(|d| d.upserts.len()).sum()),
        other => bail!("the download did not complete: {other:?}"),
    }
}

async fn copy_rows(client: &Client, table: &str, rows: &[Row]) -> Result<()> {
    let sink = client
        .copy_in(&format!(
            "COPY {table} ({}) FROM STDIN (FORMAT binary)",
            COLUMNS.join(", ")
        ))
        .await?;
    let writer = BinaryCopyInWriter::new(sink, &TYPES);
    pin_mut!(writer);
    for row in rows {
        let binds: Vec<Bind> = row.iter().map(Bind).collect();
        writer.as_mut().write_raw(binds.iter()).await?;
    }
    writer.finish().await?;
    Ok(())
}

async fn raw_update(client: &Client, rows: &[Row]) -> Result<()> {
    client
        .batch_execute(&format!(
            "BEGIN; CREATE TEMP TABLE raw_stage {TABLE_DDL} ON COMMIT DROP"
        ))
        .await?;
    copy_rows(client, "raw_stage", rows).await?;
    client
        .batch_execute(
            "ANALYZE raw_stage;
             UPDATE bench_raw AS t SET owner = s.owner, name = s.name, quantity = s.quantity, amount = s.amount,
                 updated = s.updated FROM raw_stage AS s WHERE t.id = s.id;
             COMMIT",
        )
        .await?;
    Ok(())
}

async fn raw_delete(client: &Client, keys: &[Row]) -> Result<()> {
    client
        .batch_execute("BEGIN; CREATE TEMP TABLE raw_keys (id BIGINT) ON COMMIT DROP")
        .await?;
    let sink = client
        .copy_in("COPY raw_keys (id) FROM STDIN (FORMAT binary)")
        .await?;
    let writer = BinaryCopyInWriter::new(sink, &[Type::INT8]);
    pin_mut!(writer);
    for key in keys {
        let binds: Vec<Bind> = key.iter().map(Bind).collect();
        writer.as_mut().write_raw(binds.iter()).await?;
    }
    writer.finish().await?;
    client
        .batch_execute("ANALYZE raw_keys; DELETE FROM bench_raw AS t USING raw_keys AS k WHERE t.id = k.id; COMMIT")
        .await?;
    Ok(())
}

/// Reads the whole raw table with binary COPY, counting the bytes.
async fn copy_out(client: &Client) -> Result<()> {
    use futures_util::StreamExt;
    let stream = client
        .copy_out(&format!(
            "COPY (SELECT {} FROM bench_raw) TO STDOUT (FORMAT binary)",
            COLUMNS.join(", ")
        ))
        .await?;
    pin_mut!(stream);
    let mut bytes = 0usize;
    while let Some(chunk) = stream.next().await {
        bytes += chunk?.len();
    }
    if bytes == 0 {
        bail!("the raw download read nothing");
    }
    Ok(())
}
