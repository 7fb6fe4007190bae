use std::path::Path;
use std::time::{Duration, Instant};

use rowsync_protocol::{Hello, FRAME_BYTES_MAX_DEFAULT, PROTOCOL_VERSION};
use rusqlite::Connection;

use crate::session::SessionEvent;
use crate::transport::{exchange_measured, Exchange, TransportOptions, WireBytes};
use crate::{store, ClientError};

/// Where and as whom to sync.
#[derive(Debug, Clone)]
pub struct SyncOptions {
    /// The server's URL: `tcp://host:port` (or just `host:port`), `tls://host:port`,
    /// `http://host:port/path` or `https://host:port/path`.
    pub address: String,
    /// Compression, TLS verification and client certificate, HTTP version.
    pub transport: TransportOptions,
    pub user: String,
    pub password: String,
    pub script_version: String,
    pub frame_bytes_max: usize,
    /// Limit on connecting and on each wait for the server.
    pub timeout: Duration,
    /// A signed token (JWT) to log in with instead of the password; the server takes the
    /// user from it.
    pub token: Option<String>,
    /// Custom authentication parameters for the server's scripts (`:auth_1`, ...).
    pub auth_parameters: Vec<String>,
    /// Confirm each applied download to the server (MobiLink's download acknowledgement):
    /// the server then records it at once and runs its `download_ack` script.
    pub download_ack: bool,
    /// What to do when the server is at its connection limit.
    pub busy_retry: BusyRetry,
}

/// Retries of a sync the server answered *busy*.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BusyRetry {
    /// Fail with `ClientError::Busy` at once.
    Never,
    /// Wait the server's retry-after hint plus a random share of it up to
    /// `jitter_fraction` (so refused clients do not all return at once).
    ServerHint {
        attempts_max: u32,
        jitter_fraction: f64,
    },
    /// Wait a fixed delay, whatever the server says (the white paper's clients did).
    Fixed { delay: Duration, attempts_max: u32 },
}

/// Retries of one sync after *busy* by default.
pub const BUSY_RETRY_ATTEMPTS_MAX_DEFAULT: u32 = 100;

impl Default for BusyRetry {
    fn default() -> BusyRetry {
        BusyRetry::ServerHint {
            attempts_max: BUSY_RETRY_ATTEMPTS_MAX_DEFAULT,
            jitter_fraction: 0.5,
        }
    }
}

impl BusyRetry {
    /// The wait before retry number `retries_so_far + 1`, or `None` to give up.
    pub fn delay(&self, retry_after_ms: u32, retries_so_far: u32) -> Option<Duration> {
        match *self {
            BusyRetry::Never => None,
            BusyRetry::ServerHint {
                attempts_max,
                jitter_fraction,
            } => (retries_so_far < attempts_max).then(|| {
                let hint = f64::from(retry_after_ms);
                let jitter = hint * jitter_fraction.clamp(0.0, 10.0) * rand::random::<f64>();
                Duration::from_secs_f64((hint + jitter) / 1000.0)
            }),
            BusyRetry::Fixed {
                delay,
                attempts_max,
            } => (retries_so_far < attempts_max).then_some(delay),
        }
    }
}

impl SyncOptions {
    pub fn new(
        address: impl Into<String>,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> SyncOptions {
        SyncOptions {
            address: address.into(),
            transport: TransportOptions::default(),
            user: user.into(),
            password: password.into(),
            script_version: "v1".into(),
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            timeout: Duration::from_secs(60),
            token: None,
            auth_parameters: Vec::new(),
            download_ack: false,
            busy_retry: BusyRetry::default(),
        }
    }
}

/// What one `sync()` did.
#[derive(Debug, Clone, Default)]
pub struct SyncReport {
    pub rows_uploaded: u64,
    pub rows_downloaded: u64,
    pub conflicts: u64,
    /// Round trips made: 2 when an unacknowledged upload had to be resent first.
    pub rounds: u32,
    /// The server had applied a resent upload already and applied nothing again.
    pub upload_already_applied: bool,
    pub watermark: i64,
    pub elapsed: Duration,
    /// Bytes on the wire, both directions, all rounds (TLS and HTTP overhead included).
    pub wire: WireBytes,
    /// Times the server answered busy and the sync was tried again.
    pub busy_retries: u32,
    /// The server confirmed it recorded the download acknowledgement.
    pub download_acknowledged: bool,
}

/// A client database.
pub struct Client {
    connection: Connection,
    client_id: String,
}

impl Client {
    /// Opens (or creates) a client database with a generated client id.
    pub fn open(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        Client::open_with_id(path, None)
    }

    /// Opens a client database; `client_id` fixes the id on first open and must match after.
    pub fn open_with_id(
        path: impl AsRef<Path>,
        client_id: Option<&str>,
    ) -> Result<Client, ClientError> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(Duration::from_secs(30))?;
        connection.pragma_update(None, "journal_mode", "WAL")?;
        let client_id = store::install(&connection, client_id)?;
        Ok(Client {
            connection,
            client_id,
        })
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The application's connection to the client database.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Records every later change of `table` for upload. The table needs a primary key.
    pub fn track(&mut self, table: &str) -> Result<(), ClientError> {
        store::track(&mut self.connection, table)
    }

    /// Changes recorded and not yet moved into an upload.
    pub fn has_pending_changes(&self) -> Result<bool, ClientError> {
        store::has_pending_changes(&self.connection)
    }

    pub fn download_watermark(&self) -> Result<i64, ClientError> {
        Ok(store::state(&self.connection)?.download_watermark)
    }

    /// One synchronization: upload local changes, apply the download.
    ///
    /// If an earlier sync's upload was never acknowledged, it is resent first with its
    /// original sequence (the server applies it at most once), then the changes made
    /// since go up in a second round. A server at its connection limit answers *busy*;
    /// the sync is then tried again as `options.busy_retry` says. SQLite work runs on
    /// the calling task.
    pub async fn sync(&mut self, options: &SyncOptions) -> Result<SyncReport, ClientError> {
        let started = Instant::now();
        let mut report = SyncReport::default();
        loop {
            let batch = store::next_batch(&mut self.connection)?;
            let last_download_watermark = store::state(&self.connection)?.download_watermark;
            let completed = loop {
                let (event, wire) = exchange_measured(Exchange {
                    address: &options.address,
                    transport: &options.transport,
                    hello: self.hello(options, last_download_watermark),
                    upload_frames: &batch.frames,
                    upload_sequence: batch.upload_sequence,
                    frame_bytes_max: options.frame_bytes_max,
                    timeout: options.timeout,
                    acknowledge: None,
                })
                .await?;
                report.wire.sent += wire.sent;
                report.wire.received += wire.received;
                match event {
                    SessionEvent::Complete(completed) => break completed,
                    SessionEvent::Busy { retry_after_ms } => {
                        let Some(delay) = options
                            .busy_retry
                            .delay(retry_after_ms, report.busy_retries)
                        else {
                            return Err(ClientError::Busy { retry_after_ms });
                        };
                        report.busy_retries += 1;
                        tokio::time::sleep(delay).await;
                    }
                    SessionEvent::Acknowledged { .. } | SessionEvent::Continue => {
                        return Err(ClientError::Protocol(
                            "the server answered an upload with an acknowledgement".into(),
                        ))
                    }
                }
            };
            let rows_applied = store::apply_download(
                &mut self.connection,
                batch.upload_sequence,
                &completed.downloads,
                completed.end.watermark,
            )?;
            if options.download_ack {
                let hello = self.hello(options, completed.end.watermark);
                acknowledge(options, hello, completed.end.watermark, &mut report).await?;
            }
            let summary = completed.end.summary;
            report.rounds += 1;
            report.rows_uploaded += if summary.upload_already_applied {
                0
            } else {
                batch.operations
            };
            report.rows_downloaded += rows_applied;
            report.conflicts += summary.conflicts;
            report.upload_already_applied |= summary.upload_already_applied;
            report.watermark = completed.end.watermark;
            if !(batch.is_retry && store::has_pending_changes(&self.connection)?) {
                break;
            }
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    fn hello(&self, options: &SyncOptions, last_download_watermark: i64) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            client_id: self.client_id.clone(),
            user: options.user.clone(),
            password: options.password.clone(),
            script_version: options.script_version.clone(),
            last_download_watermark,
            token: options.token.clone().unwrap_or_default(),
            auth_parameters: options.auth_parameters.clone(),
            download_ack: false,
        }
    }
}

/// Confirms to the server, in a short exchange of its own, that the download ending at
/// `watermark` is applied (it is already committed here whatever happens).
async fn acknowledge(
    options: &SyncOptions,
    hello: Hello,
    watermark: i64,
    report: &mut SyncReport,
) -> Result<(), ClientError> {
    {
        loop {
            let (event, wire) = exchange_measured(Exchange {
                address: &options.address,
                transport: &options.transport,
                hello: hello.clone(),
                upload_frames: &[],
                upload_sequence: 0,
                frame_bytes_max: options.frame_bytes_max,
                timeout: options.timeout,
                acknowledge: Some(watermark),
            })
            .await?;
            report.wire.sent += wire.sent;
            report.wire.received += wire.received;
            match event {
                SessionEvent::Acknowledged { watermark: echoed } if echoed == watermark => {
                    report.download_acknowledged = true;
                    return Ok(());
                }
                SessionEvent::Busy { retry_after_ms } => {
                    let Some(delay) = options
                        .busy_retry
                        .delay(retry_after_ms, report.busy_retries)
                    else {
                        return Err(ClientError::Busy { retry_after_ms });
                    };
                    report.busy_retries += 1;
                    tokio::time::sleep(delay).await;
                }
                other => {
                    return Err(ClientError::Protocol(format!(
                        "the server answered the download acknowledgement with {other:?}"
                    )))
                }
            }
        }
    }
}
