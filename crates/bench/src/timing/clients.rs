//! Simulated clients, all tasks of this process: `verify` clients decode and checksum
//! the download and send prepared uploads, with no local store (how the paper isolated
//! the server); `sqlite` clients are real rowsync clients with their own SQLite files.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use rowsync_client::transport::{exchange_measured, Exchange};
use rowsync_client::{
    BusyRetry, Client, ClientError, HttpVersion, SessionEvent, SyncOptions, TransportOptions,
};
use rowsync_protocol::{Compression, Hello, FRAME_BYTES_MAX_DEFAULT, PROTOCOL_VERSION};
use rusqlite::params_from_iter;

use super::workload::{self, UploadKind, CLIENT_TABLE_DDL, TABLE};

/// One sync may take this long, retries included, before the bench gives up on it.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(3600);
/// The same at `--size quick` (a few hundred rows per sync).
pub const SYNC_TIMEOUT_QUICK: Duration = Duration::from_secs(120);
/// Retries of one sync after busy answers or refused connections.
pub const RETRIES_MAX: u32 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMode {
    Verify,
    Sqlite,
}

impl ClientMode {
    pub fn label(self) -> &'static str {
        match self {
            ClientMode::Verify => "verify",
            ClientMode::Sqlite => "sqlite",
        }
    }
}

/// What a busy client waits before retrying.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Retry {
    /// The server's retry-after hint plus jitter (the client library's default).
    Hint,
    /// A fixed delay, as the paper's clients used.
    Fixed(Duration),
}

impl Retry {
    pub fn label(self) -> String {
        match self {
            Retry::Hint => "server hint".into(),
            Retry::Fixed(delay) => format!("{} s", delay.as_secs_f64()),
        }
    }

    fn policy(self) -> BusyRetry {
        match self {
            Retry::Hint => BusyRetry::ServerHint {
                attempts_max: RETRIES_MAX,
                jitter_fraction: 0.5,
            },
            Retry::Fixed(delay) => BusyRetry::Fixed {
                delay,
                attempts_max: RETRIES_MAX,
            },
        }
    }
}

/// What every client of a point shares.
#[derive(Debug, Clone)]
pub struct Connection {
    pub url: String,
    pub transport: TransportOptions,
    pub retry: Retry,
    pub script_version: String,
    /// One sync, retries included, may take this long.
    pub sync_timeout: Duration,
    /// HS256 token per client, by client index.
    pub tokens: Arc<Vec<String>>,
}

impl Connection {
    pub fn new(
        url: &str,
        ca_file: Option<&Path>,
        compression: Compression,
        retry: Retry,
        tokens: Arc<Vec<String>>,
    ) -> Connection {
        // HTTP/1.1 for both HTTP and HTTPS, as the paper's Test 5 compared them (HTTPS
        // would otherwise negotiate HTTP/2 and change two things at once).
        let mut transport = TransportOptions {
            compression,
            http_version: HttpVersion::Http1,
            ..TransportOptions::default()
        };
        transport.tls.ca_file = ca_file.map(Path::to_path_buf);
        Connection {
            url: url.into(),
            transport,
            retry,
            script_version: String::new(),
            sync_timeout: SYNC_TIMEOUT,
            tokens,
        }
    }
}

/// What one timed sync must do, checked when it ends.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    /// Nothing to upload, nothing expected (the warm-up).
    Empty,
    /// Download set `set` (rows rows).
    Download { set: usize, rows: usize },
    /// Upload set `set` of this kind.
    Upload {
        kind: UploadKind,
        set: usize,
        rows: usize,
    },
}

/// One sync as the client saw it.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub client_start: SystemTime,
    pub client_end: SystemTime,
    pub wire_bytes: u64,
    pub busy_retries: u64,
    pub rows: u64,
}

/// A simulated client and its state between syncs.
pub enum SimClient {
    Verify(VerifyClient),
    Sqlite(Box<SqliteClient>),
}

pub struct VerifyClient {
    index: usize,
    client_id: String,
    upload_sequence: u64,
    watermark: i64,
    /// Frames made ready for the next sync (outside the timed section).
    prepared: Vec<Vec<u8>>,
}

pub struct SqliteClient {
    index: usize,
    client: Client,
}

pub fn client_id(index: usize) -> String {
    format!("bench-{index}")
}

impl SimClient {
    pub fn new(mode: ClientMode, index: usize, dir: &Path) -> Result<SimClient> {
        Ok(match mode {
            ClientMode::Verify => SimClient::Verify(VerifyClient {
                index,
                client_id: client_id(index),
                upload_sequence: 0,
                watermark: 0,
                prepared: Vec::new(),
            }),
            ClientMode::Sqlite => {
                let path = dir.join(format!("client-{index}.db"));
                let mut client = Client::open_with_id(&path, Some(&client_id(index)))?;
                // WAL with synchronous=NORMAL, as apps commonly run: a thousand clients'
                // fsyncs would otherwise time the disk, not the server.
                client
                    .connection()
                    .pragma_update(None, "synchronous", "NORMAL")?;
                client.connection().execute_batch(CLIENT_TABLE_DDL)?;
                client.track(TABLE)?;
                SimClient::Sqlite(Box::new(SqliteClient { index, client }))
            }
        })
    }

    /// Makes the change the next sync uploads (not timed: the application's work).
    pub fn prepare(&mut self, work: Work) -> Result<()> {
        match self {
            SimClient::Verify(client) => {
                client.prepared = match work {
                    Work::Upload { kind, set, rows } => workload::upload_frames(
                        kind,
                        client.index,
                        workload::set_indexes(set, rows),
                    ),
                    Work::Empty | Work::Download { .. } => Vec::new(),
                };
            }
            SimClient::Sqlite(client) => {
                let Work::Upload { kind, set, rows } = work else {
                    return Ok(());
                };
                let index = client.index;
                let connection = client.client.connection();
                let transaction = connection.unchecked_transaction()?;
                {
                    let mut statement = transaction.prepare_cached(match kind {
                        UploadKind::Update => "UPDATE purchase SET cost = ?3 WHERE emp_id = ?1 AND purch_id = ?2",
                        UploadKind::Delete => "DELETE FROM purchase WHERE emp_id = ?1 AND purch_id = ?2",
                        UploadKind::Insert => "INSERT INTO purchase (emp_id, purch_id, cust_id, cost, order_date, notes) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    })?;
                    for row_index in workload::set_indexes(set, rows) {
                        let changed = match kind {
                            UploadKind::Update => {
                                let new = workload::row(index, row_index, 1);
                                statement.execute(params_from_iter([&new[0], &new[1], &new[3]]))?
                            }
                            UploadKind::Delete => statement.execute(params_from_iter(
                                workload::key(index, row_index).iter(),
                            ))?,
                            UploadKind::Insert => statement.execute(params_from_iter(
                                workload::row(index, row_index, 0).iter(),
                            ))?,
                        };
                        if changed != 1 {
                            bail!("client {index}: the local {kind:?} of row {row_index} changed {changed} rows");
                        }
                    }
                }
                transaction.commit()?;
            }
        }
        Ok(())
    }

    /// One timed sync: from the client start time to the client end time, retries
    /// included; checks what it moved.
    pub async fn sync(&mut self, connection: &Connection, work: Work) -> Result<Outcome> {
        match self {
            SimClient::Verify(client) => client.sync(connection, work).await,
            SimClient::Sqlite(client) => client.sync(connection, work).await,
        }
    }

    /// Rows the client's own database holds (sqlite clients), for the consistency check.
    pub fn local_rows(&self) -> Result<Option<(u64, u64)>> {
        match self {
            SimClient::Verify(_) => Ok(None),
            SimClient::Sqlite(client) => {
                let mut statement = client.client.connection().prepare(
                    "SELECT emp_id, purch_id, cust_id, cost, order_date, notes FROM purchase",
                )?;
                let rows = statement
                    .query_map([], |row| {
                        (0..6)
                            .map(|i| row.get::<_, rowsync_protocol::Value>(i))
                            .collect::<Result<Vec<_>, _>>()
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some((rows.len() as u64, local_checksum(&rows))))
            }
        }
    }
}

/// The checksum of rows as a SQLite client stores them (decimals and timestamps as
/// text), comparable with [`expected_local_checksum`].
fn local_checksum(rows: &[rowsync_protocol::Row]) -> u64 {
    workload::checksum(rows.iter())
}

/// What a sqlite client holding the rows `indexes` at `version` (0 as inserted, 1
/// after the update phase) must checksum to: each value passed through SQLite, so
/// decimals and timestamps take the form a client stores.
pub fn expected_local_checksum(
    client: usize,
    indexes: std::ops::Range<usize>,
    version: i64,
) -> Result<u64> {
    let connection = rusqlite::Connection::open_in_memory()?;
    let mut statement = connection.prepare("SELECT ?1")?;
    let rows = indexes
        .map(|i| {
            workload::row(client, i, version)
                .iter()
                .map(|value| statement.query_row([value], |r| r.get(0)))
                .collect::<Result<Vec<rowsync_protocol::Value>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(local_checksum(&rows))
}

/// Checks what a sync moved. A download may bring more than its set: rows the client
/// already holds come again while another transaction (in any database of the cluster:
/// transaction ids are cluster-wide) holds the watermark back, which is how rowsync
/// never misses a late commit. So a download must bring at least its set; uploads
/// may bring such rows back too.
fn check_moved(
    index: usize,
    work: Work,
    uploaded: u64,
    downloaded: u64,
    conflicts: u64,
) -> Result<u64> {
    if conflicts != 0 {
        bail!("client {index}: {conflicts} conflicts in a conflict-free workload");
    }
    match work {
        Work::Empty => {
            if uploaded != 0 {
                bail!("client {index}: an empty sync uploaded {uploaded} operations");
            }
            Ok(0)
        }
        Work::Download { rows, .. } => {
            if downloaded < rows as u64 || uploaded != 0 {
                bail!("client {index}: the download brought {downloaded} rows, expected at least {rows}");
            }
            Ok(rows as u64)
        }
        Work::Upload { rows, .. } => {
            if uploaded != rows as u64 {
                bail!("client {index}: the upload sent {uploaded} operations, expected {rows}");
            }
            Ok(uploaded)
        }
    }
}

/// A verify client's download of set `set`: exactly the set's rows (by checksum), and
/// any other row one it already received, unchanged.
fn check_download(
    client: usize,
    set: usize,
    rows: usize,
    downloaded: &[&rowsync_protocol::Row],
) -> Result<()> {
    let first = workload::purch_id(set * rows);
    let (current, earlier): (Vec<&rowsync_protocol::Row>, Vec<&rowsync_protocol::Row>) =
        downloaded.iter().partition(
            |row| matches!(row.get(1), Some(rowsync_protocol::Value::Int(p)) if *p >= first),
        );
    if current.len() != rows
        || workload::checksum(current.iter().copied())
            != workload::expected_download_checksum(client, set, rows)
    {
        bail!("client {client}: the download of set {set} ({} rows of it) does not match its checksum", current.len());
    }
    for row in earlier {
        let expected = match row.get(1) {
            Some(rowsync_protocol::Value::Int(p)) if *p >= workload::PURCH_ID_BASE => {
                workload::row(client, (*p - workload::PURCH_ID_BASE) as usize, 0)
            }
            _ => bail!("client {client}: the download holds a row that is not its own: {row:?}"),
        };
        if **row != expected {
            bail!("client {client}: a row sent again differs from what it received: {row:?}");
        }
    }
    Ok(())
}

/// A refused or reset connection is the server at its limit too (the operating system
/// may refuse before the server can answer busy): retried like busy.
fn is_refusal(error: &ClientError) -> bool {
    let refused = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
        )
    };
    match error {
        ClientError::Io(e) => refused(e),
        ClientError::Connect { source, .. } => refused(source),
        _ => false,
    }
}

/// The server's hint when a refusal came without one.
const REFUSAL_HINT_MS: u32 = 100;

impl VerifyClient {
    async fn sync(&mut self, connection: &Connection, work: Work) -> Result<Outcome> {
        let client_start = SystemTime::now();
        self.upload_sequence += 1;
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            client_id: self.client_id.clone(),
            user: String::new(),
            password: String::new(),
            script_version: connection.script_version.clone(),
            last_download_watermark: self.watermark,
            token: connection.tokens[self.index].clone(),
            auth_parameters: Vec::new(),
            download_ack: false,
            tables: Default::default(),
        };
        let policy = connection.retry.policy();
        let mut retries = 0u32;
        let mut wire_bytes = 0;
        let done = loop {
            let exchanged = exchange_measured(Exchange {
                address: &connection.url,
                transport: &connection.transport,
                hello: hello.clone(),
                upload_frames: &self.prepared,
                upload_sequence: self.upload_sequence,
                frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
                timeout: connection.sync_timeout,
                acknowledge: None,
                transfer: None,
                download_resume: None,
                key_ranges: &[],
            })
            .await;
            let hint = match exchanged {
                Ok((SessionEvent::Complete(done), wire)) => {
                    wire_bytes += wire.sent + wire.received;
                    break done;
                }
                Ok((SessionEvent::Busy { retry_after_ms }, wire)) => {
                    wire_bytes += wire.sent + wire.received;
                    retry_after_ms
                }
                Ok((other, _)) => bail!("client {}: the sync ended with {other:?}", self.index),
                Err(error) if is_refusal(&error) => REFUSAL_HINT_MS,
                Err(error) => {
                    return Err(error).with_context(|| format!("client {} sync", self.index))
                }
            };
            let Some(delay) = policy.delay(hint, retries) else {
                bail!("client {}: still busy after {retries} retries", self.index);
            };
            retries += 1;
            tokio::time::sleep(delay).await;
        };
        let client_end = SystemTime::now();
        self.watermark = done.end.watermark;
        self.prepared = Vec::new();
        let downloaded: Vec<&rowsync_protocol::Row> = done
            .downloads
            .iter()
            .filter(|d| d.table == TABLE)
            .flat_map(|d| d.upserts.iter())
            .collect();
        let rows = check_moved(
            self.index,
            work,
            done.end.summary.rows_uploaded,
            downloaded.len() as u64,
            done.end.summary.conflicts,
        )?;
        if let Work::Download { set, rows } = work {
            check_download(self.index, set, rows, &downloaded)?;
        }
        Ok(Outcome {
            client_start,
            client_end,
            wire_bytes,
            busy_retries: u64::from(retries),
            rows,
        })
    }
}

impl SqliteClient {
    async fn sync(&mut self, connection: &Connection, work: Work) -> Result<Outcome> {
        let options = SyncOptions {
            address: connection.url.clone(),
            transport: connection.transport.clone(),
            user: String::new(),
            password: String::new(),
            script_version: connection.script_version.clone(),
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            timeout: connection.sync_timeout,
            token: Some(connection.tokens[self.index].clone()),
            auth_parameters: Vec::new(),
            download_ack: false,
            busy_retry: connection.retry.policy(),
            download_kept_bytes_max: rowsync_client::DOWNLOAD_KEPT_BYTES_MAX_DEFAULT,
            rejected_rows_max: rowsync_client::REJECTED_ROWS_MAX_DEFAULT,
            tables: Vec::new(),
            priorities: Vec::new(),
        };
        let policy = connection.retry.policy();
        let client_start = SystemTime::now();
        let mut refusals = 0u32;
        let report = loop {
            match self.client.sync(&options).await {
                Ok(report) => break report,
                // Refused before the server could answer busy: retried like busy,
                // by the same policy (the client library counts its busy answers).
                Err(error) if is_refusal(&error) => {
                    let Some(delay) = policy.delay(REFUSAL_HINT_MS, refusals) else {
                        bail!(
                            "client {}: still refused after {refusals} retries",
                            self.index
                        );
                    };
                    refusals += 1;
                    tokio::time::sleep(delay).await;
                }
                Err(error) => {
                    return Err(error).with_context(|| format!("client {} sync", self.index))
                }
            }
        };
        let client_end = SystemTime::now();
        let rows = check_moved(
            self.index,
            work,
            report.rows_uploaded,
            report.rows_downloaded,
            report.conflicts,
        )?;
        Ok(Outcome {
            client_start,
            client_end,
            wire_bytes: report.wire.sent + report.wire.received,
            busy_retries: u64::from(report.busy_retries) + u64::from(refusals),
            rows,
        })
    }
}
