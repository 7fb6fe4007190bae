use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rowsync_protocol::{
    Conflicts, Download, DownloadHeld, EndDownload, ErrorCode, Hello,
    DOWNLOAD_RESUME_SINCE_VERSION, FRAME_BYTES_MAX_DEFAULT, PROTOCOL_VERSION, RESUME_SINCE_VERSION,
    SESSION_TOKEN_SINCE_VERSION,
};
use rusqlite::Connection;
use sha2::{Digest, Sha256};

use crate::durability::{self, ClientOptions, Durability};
use crate::kept::{self, KeptConflict};
use crate::keys;
use crate::login;
use crate::rejected::{self, RejectedRow};
use crate::report::{ConflictedRow, ConflictedRows, Identity, SyncProgress, SyncReport};
use crate::session::{CompletedSync, SessionEvent};
use crate::store::{AppliedDownload, DownloadApply, ExistingRows};
use crate::transport::{
    end_upload_frame, exchange_measured, exchange_streaming, new_transfer_id, transfer_stream,
    DownloadHandler, Exchange, HeldDownload, Transfer, TransportOptions, WireBytes,
};
use crate::{store, tables, ClientError};

/// Adds one round's figures to `report`: its download, and the upload of `operations`
/// unless the server had applied it before.
fn count_round(
    report: &mut SyncReport,
    completed: &EndDownload,
    applied: &AppliedDownload,
    operations: u64,
) {
    let summary = &completed.summary;
    report.rounds += 1;
    report.rows_uploaded += if summary.upload_already_applied {
        0
    } else {
        operations
    };
    report.rows_downloaded += applied.rows_applied;
    report.conflicts_kept += applied.conflicts_kept;
    report.conflicts += summary.conflicts;
    report.upload_already_applied |= summary.upload_already_applied;
    report.watermark = completed.watermark;
}

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
    /// Bytes of a download's stream (decompressed) the client keeps while it arrives
    /// (in memory), and after a cut in its database file, to continue it on the next
    /// attempt instead of downloading again (protocol v4). A cut download longer than
    /// this is downloaded afresh; 0 keeps nothing.
    pub download_kept_bytes_max: u64,
    /// The most changes one sync sets aside in `rs_client_rejected` when the server
    /// refuses their rows (protocol v6); above it the sync fails with the server's
    /// error, nothing set aside. 0 never sets aside.
    pub rejected_rows_max: u64,
    /// Sync only these tables (a publication; protocol v9): their changes go up, theirs
    /// come down, each table from its own last download. Empty: every table.
    pub tables: Vec<String>,
    /// Tables synced first, level by level, each level's download committed before the
    /// next is asked for (protocol v9), so that a first sync makes them usable before
    /// the rest arrives; the last round brings every table (or `tables`).
    pub priorities: Vec<Vec<String>>,
}

/// Changes one sync sets aside at most, by default.
pub const REJECTED_ROWS_MAX_DEFAULT: u64 = 1000;

/// Rounds of one sync that end with refused rows set aside: each sends the rest again.
const REFUSED_ROUNDS_MAX: u32 = 4;

/// Bytes of a cut download kept to resume it, by default (the server's default
/// `held_download_bytes_max`).
pub const DOWNLOAD_KEPT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

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
            download_kept_bytes_max: DOWNLOAD_KEPT_BYTES_MAX_DEFAULT,
            rejected_rows_max: REJECTED_ROWS_MAX_DEFAULT,
            tables: Vec::new(),
            priorities: Vec::new(),
        }
    }
}

/// A client database.
pub struct Client {
    connection: Connection,
    client_id: String,
    path: PathBuf,
    durability: Durability,
    durable_before_sync: bool,
    /// The protocol version spoken: the newest, until a server refuses it (an older
    /// server: this client then speaks version 3, without resumable downloads, or 2,
    /// without resumable uploads).
    protocol_version: u16,
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
        let options = ClientOptions {
            client_id: client_id.map(str::to_owned),
            ..ClientOptions::default()
        };
        Client::open_with(path, &options)
    }

    /// Opens a client database with a durability mode (docs/client.md §10 says what each
    /// can lose). In [`Durability::Memory`] only [`Client::connection`] reaches the data.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: &ClientOptions,
    ) -> Result<Client, ClientError> {
        let path = path.as_ref().to_path_buf();
        let connection = durability::open(&path, options)?;
        let client_id = store::install(&connection, options.client_id.as_deref())?;
        Ok(Client {
            connection,
            client_id,
            path,
            durability: options.durability,
            durable_before_sync: options.durable_before_sync,
            protocol_version: PROTOCOL_VERSION,
        })
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Whether every commit is made durable before an upload is sent (default: in
    /// every mode but [`Durability::Full`]). [`Durability::Memory`] cannot turn it off.
    pub fn set_durable_before_sync(&mut self, on: bool) -> Result<(), ClientError> {
        if !on && self.durability == Durability::Memory {
            return Err(durability::memory_needs_persist());
        }
        self.durable_before_sync = on;
        Ok(())
    }

    /// Makes every commit so far durable: syncs the files to disk, or in
    /// [`Durability::Memory`] replaces the file with a copy of the database.
    pub fn persist(&self) -> Result<(), ClientError> {
        durability::persist(&self.connection, &self.path, self.durability)
    }

    /// The application's connection to the client database.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Records every later change of `table` for upload. The table needs a primary key.
    /// The rows the table holds when it is first tracked are this client's own: they are
    /// uploaded as inserts at the next sync ([`Client::track_with`] says otherwise).
    ///
    /// Called again after the table's columns changed (`ALTER TABLE ... ADD COLUMN`), it
    /// migrates the table's change log to the new columns, keeping every pending change,
    /// and rebuilds its triggers (docs/schema-changes.md).
    pub fn track(&mut self, table: &str) -> Result<(), ClientError> {
        self.track_with(table, ExistingRows::Upload)
    }

    /// [`Client::track`], saying where the rows the table holds already came from:
    /// [`ExistingRows::FromServer`] for a database seeded by a download or shipped
    /// pre-synced (they are not uploaded). Only the first call for a table looks at it.
    pub fn track_with(&mut self, table: &str, existing: ExistingRows) -> Result<(), ClientError> {
        store::track(&mut self.connection, table, existing)
    }

    /// Runs `sql`, a change of a tracked table's schema, and tracks the table again, in
    /// one transaction. Needed for `ALTER TABLE ... DROP COLUMN`, which SQLite refuses
    /// while the tracking triggers name the column; fine for any other change too.
    pub fn alter_tracked_table(&mut self, table: &str, sql: &str) -> Result<(), ClientError> {
        store::alter_tracked(&mut self.connection, table, sql)
    }

    /// The losing side of every conflict this client met and the application has not
    /// removed yet, oldest first: the change it uploaded, and the server's row that won
    /// (docs/client.md). Also readable with SQL in `rs_client_conflict`.
    pub fn kept_conflicts(&self) -> Result<Vec<KeptConflict>, ClientError> {
        kept::kept_conflicts(&self.connection)
    }

    /// Removes a kept conflict the application has dealt with; `false` if no conflict
    /// has that id.
    pub fn remove_kept_conflict(&self, id: i64) -> Result<bool, ClientError> {
        kept::remove_kept_conflict(&self.connection, id)
    }

    /// Changes recorded and not yet moved into an upload.
    /// Every change the server refused and this client set aside, oldest first.
    pub fn rejected_rows(&self) -> Result<Vec<RejectedRow>, ClientError> {
        rejected::rejected_rows(&self.connection)
    }

    /// Puts a rejected change back in line for the next sync (after the application
    /// fixed its row, or the server now takes it); false when there is no such change.
    pub fn requeue_rejected(&mut self, id: i64) -> Result<bool, ClientError> {
        store::requeue(&mut self.connection, id)
    }

    /// Removes a rejected change for good (the application gave it up); false when
    /// there is no such change.
    pub fn remove_rejected(&self, id: i64) -> Result<bool, ClientError> {
        rejected::remove_rejected(&self.connection, id)
    }

    /// Stops tracking `table`: its triggers and change log go; changes it logged that
    /// were not uploaded yet are set aside as rejected, with that reason. Returns how
    /// many.
    pub fn untrack(&mut self, table: &str) -> Result<u64, ClientError> {
        store::untrack(&mut self.connection, table)
    }

    /// Takes the next key of `table` from the key ranges the server handed this client
    /// (protocol v7): a key no other client and no writer on the server is handed, for
    /// a row inserted offline. [`ClientError::NoKeys`] when none is left: sync first
    /// (the server hands a range out with the first sync, and a new one when less than
    /// half of one is left). docs/types.md, "Keys for rows made offline".
    pub fn next_key(&mut self, table: &str) -> Result<i64, ClientError> {
        keys::next_key(&mut self.connection, table)
    }

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
        self.sync_with_progress(options, &mut |_| {}).await
    }

    /// [`Client::sync`], calling `progress` after each piece of the upload is sent and
    /// after each download message is applied. The download is applied as it arrives,
    /// in one transaction that begins with its first message.
    pub async fn sync_with_progress(
        &mut self,
        options: &SyncOptions,
        progress: &mut (dyn FnMut(&SyncProgress) + Send),
    ) -> Result<SyncReport, ClientError> {
        let started = Instant::now();
        let mut report = SyncReport::default();
        let rounds = tables::rounds(
            &self.connection,
            &options.script_version,
            &options.tables,
            &options.priorities,
        )?;
        for covered in rounds {
            self.sync_covering(options, covered.as_deref(), &mut report, progress)
                .await?;
        }
        report.elapsed = started.elapsed();
        Ok(report)
    }

    /// Syncs `covered` (`None`: every table) until the upload in flight, if one was,
    /// and this sync's own are through, adding to `report`.
    async fn sync_covering(
        &mut self,
        options: &SyncOptions,
        covered: Option<&[String]>,
        report: &mut SyncReport,
        progress: &mut (dyn FnMut(&SyncProgress) + Send),
    ) -> Result<(), ClientError> {
        let mut refused_rounds = 0;
        loop {
            let batch = store::next_batch_for(
                &mut self.connection,
                Some(&options.script_version),
                covered,
            )?;
            let round = self.sync_round(options, &batch, report, progress).await;
            if round.is_err() {
                DownloadApply::abort(&self.connection);
            }
            let round = match round {
                // First sent with a version the server does not have (or no longer):
                // nothing was applied under it, so it goes with the one asked for now
                // (the sequence still keeps it from being applied twice).
                Err(error)
                    if error.server_code() == Some(ErrorCode::UnknownScriptVersion)
                        && batch.is_retry
                        && sent_with(options, &batch) != options.script_version =>
                {
                    store::send_with(&self.connection, &batch, &options.script_version)?;
                    continue;
                }
                Err(error) if refused_rounds < REFUSED_ROUNDS_MAX => {
                    match self.set_aside(&error, &batch, options, report)? {
                        true => {
                            refused_rounds += 1;
                            continue;
                        }
                        false => Err(error),
                    }
                }
                round => round,
            };
            let (completed, applied) = match round {
                // Refused as a copy or a restored backup (once per sync): a new client
                // id, and the same changes sent again as that client.
                Err(error) if report.identity.is_none() => match Identity::of_refusal(&error) {
                    Some(identity) => {
                        self.client_id = store::reregister(&mut self.connection)?;
                        report.identity = Some(identity);
                        continue;
                    }
                    None => return Err(error),
                },
                round => round?,
            };
            // A sync of some tables is not acknowledged: the acknowledgement would
            // vouch for tables it did not bring (the next sync records the lowest).
            if options.download_ack && batch.tables.is_none() {
                let mut hello = self.hello(options, completed.watermark);
                hello.script_version = sent_with(options, &batch).to_string();
                acknowledge(options, hello, completed.watermark, report).await?;
            }
            count_round(report, &completed, &applied, batch.operations);
            // After a resend: again for the changes made meanwhile, for the version
            // asked for when the resend went with the one it was first sent with, or
            // for the tables asked for when it covered others.
            let moved_on = sent_with(options, &batch) != options.script_version
                || batch.tables.as_deref() != covered;
            if !(batch.is_retry && (moved_on || store::has_pending_changes(&self.connection)?)) {
                return Ok(());
            }
        }
    }

    /// After the server refused rows of `batch` (protocol v6, nothing applied): sets
    /// their changes aside and rewrites the batch without them (true: send it again),
    /// unless that would pass `options.rejected_rows_max` or matches nothing.
    fn set_aside(
        &mut self,
        error: &ClientError,
        batch: &store::Batch,
        options: &SyncOptions,
        report: &mut SyncReport,
    ) -> Result<bool, ClientError> {
        let ClientError::Server(wire) = error else {
            return Ok(false);
        };
        let refused = &wire.refused;
        let allowed = report.rows_rejected + refused.len() as u64 <= options.rejected_rows_max;
        if wire.error_code() != Some(ErrorCode::RowsRefused) || refused.is_empty() || !allowed {
            return Ok(false);
        }
        let set_aside = store::set_aside(
            &mut self.connection,
            batch,
            refused,
            &options.script_version,
        )?;
        report.rows_rejected += set_aside;
        if set_aside > 0 && self.durable_before_sync {
            self.persist()?;
        }
        Ok(set_aside > 0)
    }

    /// Sends one batch (again after busy answers) and applies its download as it
    /// arrives; returns the end of the download and the rows applied.
    async fn sync_round(
        &mut self,
        options: &SyncOptions,
        batch: &store::Batch,
        report: &mut SyncReport,
        progress: &mut (dyn FnMut(&SyncProgress) + Send),
    ) -> Result<(EndDownload, AppliedDownload), ClientError> {
        let (transfer_id, attempts) = self.transfer_attempt(batch)?;
        if attempts > 0 {
            let kept = KeptAttempt {
                options,
                hello: self.round_hello(options, batch)?,
                batch,
                transfer_id: &transfer_id,
            };
            if let Some(done) = self.continue_kept_download(kept, report, progress).await? {
                return Ok(done);
            }
        }
        let mut offset = None;
        loop {
            let mut hello = self.round_hello(options, batch)?;
            if offset.is_none() {
                // An earlier attempt may have been cut: the server may hold its start.
                let held = match attempts {
                    0 => 0,
                    _ => {
                        self.held_offset(options, &hello, batch, &transfer_id, report)
                            .await?
                    }
                };
                offset = Some(held);
                hello.protocol_version = self.protocol_version;
            }
            let transfer = self.transfer_for(&transfer_id, offset.unwrap_or(0));
            let keeping = self.protocol_version >= DOWNLOAD_RESUME_SINCE_VERSION;
            let kept = KeptStream::new(keeping, Vec::new(), options.download_kept_bytes_max);
            let mut handler = apply_handler(&mut self.connection, report, progress, batch, kept);
            handler.apply.script_version = Some(hello.script_version.clone());
            let exchange = batch_exchange(options, &hello, batch, transfer.clone());
            let exchanged = exchange_streaming(exchange, &mut handler).await;
            let (event, wire) = match exchanged {
                Ok(exchanged) => exchanged,
                Err(error) => {
                    let kept = handler.kept.after(&error);
                    self.keep_after_cut(kept, batch, &transfer_id)?;
                    self.forget_session_token_if_refused(&error, options);
                    match self.fall_back(&error, transfer.as_ref()) {
                        Fallback::Again => {
                            offset = Some(0);
                            continue;
                        }
                        Fallback::No => return Err(error),
                    }
                }
            };
            if matches!(event, SessionEvent::Complete(_)) {
                // The whole upload is out once the download has ended.
                handler.tell(wire, batch.operations);
            }
            let answered = RoundAnswer {
                event,
                apply: handler.apply,
                transfer,
                wire,
            };
            if let Some(done) = self
                .round_answered(answered, batch, options, report)
                .await?
            {
                return Ok(done);
            }
        }
    }

    /// The hello of a round sending `batch`: with the version it is sent with, the
    /// watermark of the client's download of it, and the tables it covers (v9).
    fn round_hello(
        &self,
        options: &SyncOptions,
        batch: &store::Batch,
    ) -> Result<Hello, ClientError> {
        let script_version = sent_with(options, batch);
        let last_download_watermark = self.download_watermark_for(script_version)?;
        let tables = tables::hello_tables(
            &self.connection,
            self.protocol_version,
            script_version,
            batch.tables.as_deref(),
            last_download_watermark,
        )?;
        Ok(Hello {
            tables,
            ..self.hello_with(options, script_version, last_download_watermark)
        })
    }

    /// The download watermark to send with `script_version`: a client moving to another
    /// script version downloads its rows in full once (0), since the new version may
    /// carry columns the old one left out of earlier downloads.
    fn download_watermark_for(&self, script_version: &str) -> Result<i64, ClientError> {
        let state = store::state(&self.connection)?;
        Ok(match &state.script_version {
            Some(last) if last != script_version => 0,
            _ => state.download_watermark,
        })
    }

    /// The hello of a sync with `script_version` (an upload's own, when it is resent).
    fn hello_with(
        &self,
        options: &SyncOptions,
        script_version: &str,
        last_download_watermark: i64,
    ) -> Hello {
        Hello {
            script_version: script_version.to_string(),
            ..self.hello(options, last_download_watermark)
        }
    }

    /// The transfer an upload names from `offset` on (protocol v3), if the session has them.
    fn transfer_for(&self, transfer_id: &str, offset: u64) -> Option<Transfer> {
        (self.protocol_version >= RESUME_SINCE_VERSION).then(|| Transfer::Resume {
            transfer_id: transfer_id.to_string(),
            offset,
        })
    }

    /// The batch's transfer id (made on its first attempt) and the attempts before this
    /// one. The server may apply the upload once sent: with `durable_before_sync` its
    /// record, the transfer id included (a new id under an applied sequence is taken for
    /// a copy, docs/client.md §6.1), is made durable first (durability.rs says why).
    fn transfer_attempt(&mut self, batch: &store::Batch) -> Result<(String, u64), ClientError> {
        let attempt = store::transfer_attempt(
            &mut self.connection,
            batch.upload_sequence,
            &new_transfer_id(),
        )?;
        if self.durable_before_sync {
            self.persist()?;
        }
        Ok(attempt)
    }

    /// What a round's answer comes to: its download applied (`Some`), or a busy answer
    /// waited out (`None`: the batch is sent again).
    async fn round_answered(
        &mut self,
        answered: RoundAnswer,
        batch: &store::Batch,
        options: &SyncOptions,
        report: &mut SyncReport,
    ) -> Result<Option<(EndDownload, AppliedDownload)>, ClientError> {
        let RoundAnswer {
            event,
            apply,
            transfer,
            wire,
        } = answered;
        report.wire.sent += wire.sent;
        report.wire.received += wire.received;
        match event {
            SessionEvent::Complete(completed) => {
                self.keep_session_token(options, &completed);
                let end = completed.end;
                let ranges = &completed.key_ranges;
                let applied = apply.finish(&self.connection, batch, end.watermark, ranges)?;
                if let Some(Transfer::Resume { offset, .. }) = transfer {
                    report.upload_bytes_resumed += offset;
                }
                Ok(Some((end, applied)))
            }
            SessionEvent::Busy { retry_after_ms } => {
                // Nothing came down before a busy answer; if something did, it goes.
                DownloadApply::abort(&self.connection);
                wait_when_busy(options, report, retry_after_ms).await?;
                Ok(None)
            }
            SessionEvent::Acknowledged { .. } | SessionEvent::Held(_) | SessionEvent::Continue => {
                Err(ClientError::Protocol(
                    "the server answered an upload with an acknowledgement".into(),
                ))
            }
        }
    }

    /// After a cut attempt: continues the download the client kept from it, if any
    /// (protocol v4). `None`: nothing kept or nothing to continue (what was kept is
    /// then forgotten); the sync goes on afresh.
    async fn continue_kept_download(
        &mut self,
        attempt: KeptAttempt<'_>,
        report: &mut SyncReport,
        progress: &mut (dyn FnMut(&SyncProgress) + Send),
    ) -> Result<Option<(EndDownload, AppliedDownload)>, ClientError> {
        if self.protocol_version < DOWNLOAD_RESUME_SINCE_VERSION {
            return Ok(None);
        }
        let KeptAttempt {
            options,
            hello,
            batch,
            transfer_id,
        } = attempt;
        let kept = store::kept_download(&self.connection, batch.upload_sequence, transfer_id)?;
        let Some(prefix) = kept else {
            return Ok(None);
        };
        let resume = DownloadResumption {
            options,
            hello,
            batch,
            transfer_id,
            prefix,
        };
        let done = self.resume_download(resume, report, progress).await?;
        if done.is_none() {
            store::forget_download(&self.connection)?;
        }
        Ok(done)
    }

    /// A cut exchange: what it applied is rolled back, and the download's stream it
    /// kept (protocol v4) is stored for the next attempt to continue.
    fn keep_after_cut(
        &self,
        kept: Option<Vec<u8>>,
        batch: &store::Batch,
        transfer_id: &str,
    ) -> Result<(), ClientError> {
        DownloadApply::abort(&self.connection);
        if let Some(kept) = kept {
            store::keep_download(&self.connection, batch.upload_sequence, transfer_id, &kept)?;
        }
        Ok(())
    }

    /// Continues a cut download from the bytes the client kept (protocol v4): the
    /// server's held stream from there, applied after the kept bytes in one transaction
    /// that commits only if the whole stream has the length and SHA-256 the server
    /// named. `None`: nothing to continue (not held, expired, another stream, an older
    /// server): the sync goes on afresh. A new cut keeps what arrived for the next
    /// attempt.
    async fn resume_download(
        &mut self,
        resume: DownloadResumption<'_>,
        report: &mut SyncReport,
        progress: &mut (dyn FnMut(&SyncProgress) + Send),
    ) -> Result<Option<(EndDownload, AppliedDownload)>, ClientError> {
        let DownloadResumption {
            options,
            hello,
            batch,
            transfer_id,
            prefix,
        } = &resume;
        loop {
            let kept = KeptStream::new(true, prefix.clone(), options.download_kept_bytes_max);
            let mut handler = apply_handler(&mut self.connection, report, progress, batch, kept);
            handler.apply.script_version = Some(hello.script_version.clone());
            handler.kept.verifying(prefix);
            let held = HeldDownload {
                transfer_id,
                prefix,
            };
            let exchanged = exchange_streaming(
                Exchange {
                    upload_sequence: batch.upload_sequence,
                    download_resume: Some(held),
                    ..short_exchange(options, hello)
                },
                &mut handler,
            )
            .await;
            let (event, wire) = match exchanged {
                Ok(exchanged) => exchanged,
                Err(error) => {
                    let kept = handler.kept.after(&error);
                    return self.resume_failed(&resume, kept, error);
                }
            };
            let whole = handler.kept.whole();
            let apply = handler.apply;
            report.wire.sent += wire.sent;
            report.wire.received += wire.received;
            match event {
                SessionEvent::Complete(completed) if whole => {
                    self.keep_session_token(options, &completed);
                    let end = completed.end;
                    let ranges = &completed.key_ranges;
                    let applied = apply.finish(&self.connection, batch, end.watermark, ranges)?;
                    report.download_bytes_resumed += prefix.len() as u64;
                    return Ok(Some((end, applied)));
                }
                SessionEvent::Busy { retry_after_ms } => {
                    DownloadApply::abort(&self.connection);
                    wait_when_busy(options, report, retry_after_ms).await?;
                }
                // A stream of another length or digest than the server named: nothing
                // of it is committed, and the sync goes on afresh.
                _ => {
                    DownloadApply::abort(&self.connection);
                    return Ok(None);
                }
            }
        }
    }

    /// A resumption failed: nothing of it stays applied; a new cut keeps what arrived
    /// for the next attempt (and fails the sync); the server's refusal or data that did
    /// not decode or apply sends the sync on afresh (`None`).
    fn resume_failed(
        &mut self,
        resume: &DownloadResumption<'_>,
        kept: Option<Vec<u8>>,
        error: ClientError,
    ) -> Result<Option<(EndDownload, AppliedDownload)>, ClientError> {
        // Kept again only if this attempt brought more than it started from.
        let kept = kept.filter(|kept| kept.len() > resume.prefix.len());
        self.keep_after_cut(kept, resume.batch, resume.transfer_id)?;
        match error.server_code() {
            Some(ErrorCode::TransferNotHeld) => Ok(None),
            Some(ErrorCode::UnsupportedProtocolVersion) => {
                self.protocol_version -= 1;
                Ok(None)
            }
            // The kept start and the server's rest did not decode or apply together.
            None if !is_cut(&error) => Ok(None),
            _ => Err(error),
        }
    }

    /// Whether a failed exchange is tried again at once: a server that does not speak
    /// this protocol version (the client falls back to version 2), or one that does not
    /// hold the start of a resumed transfer (the client sends it whole).
    fn fall_back(&mut self, error: &ClientError, transfer: Option<&Transfer>) -> Fallback {
        match error.server_code() {
            Some(ErrorCode::UnsupportedProtocolVersion)
                if self.protocol_version >= RESUME_SINCE_VERSION =>
            {
                // Version 4 to 3 (no resumable downloads), 3 to 2 (no resumable uploads).
                self.protocol_version -= 1;
                Fallback::Again
            }
            Some(ErrorCode::TransferNotHeld) if matches!(transfer, Some(Transfer::Resume { offset, .. }) if *offset > 0) => {
                Fallback::Again
            }
            _ => Fallback::No,
        }
    }

    /// Where a transfer an earlier attempt began goes on: the length of what the server
    /// holds of it, if that is a prefix of this upload's stream (its SHA-256 matches),
    /// else 0. A question of its own, in a short exchange.
    async fn held_offset(
        &mut self,
        options: &SyncOptions,
        hello: &Hello,
        batch: &store::Batch,
        transfer_id: &str,
        report: &mut SyncReport,
    ) -> Result<u64, ClientError> {
        if self.protocol_version < RESUME_SINCE_VERSION {
            return Ok(0);
        }
        let asked = exchange_measured(Exchange {
            transfer: Some(Transfer::Query {
                transfer_id: transfer_id.to_string(),
            }),
            ..short_exchange(options, hello)
        })
        .await;
        let (event, wire) = match asked {
            Ok(asked) => asked,
            // A server of version 2 is asked nothing; any other failure (credentials,
            // the network) fails the sync as the upload itself would, once.
            Err(error) => {
                return match self.fall_back(&error, None) {
                    Fallback::Again => Ok(0),
                    Fallback::No => Err(error),
                }
            }
        };
        report.wire.sent += wire.sent;
        report.wire.received += wire.received;
        let SessionEvent::Held(held) = event else {
            return Ok(0);
        };
        let end = end_upload_frame(hello, batch.upload_sequence, &batch.key_ranges);
        Ok(
            if held_prefix_matches(
                transfer_stream(&batch.frames, &end),
                held.length,
                &held.sha256,
            ) {
                held.length
            } else {
                0
            },
        )
    }

    fn hello(&self, options: &SyncOptions, last_download_watermark: i64) -> Hello {
        Hello {
            protocol_version: self.protocol_version,
            client_id: self.client_id.clone(),
            user: options.user.clone(),
            password: options.password.clone(),
            script_version: options.script_version.clone(),
            last_download_watermark,
            token: self.login_token(options),
            auth_parameters: options.auth_parameters.clone(),
            download_ack: false,
            tables: Default::default(),
        }
    }

    /// The hello's token: the signed token the options give, else (protocol v8) the
    /// session token kept from an earlier password login to this server, if any.
    fn login_token(&self, options: &SyncOptions) -> String {
        if let Some(token) = &options.token {
            return token.clone();
        }
        if self.protocol_version < SESSION_TOKEN_SINCE_VERSION {
            return String::new();
        }
        login::token(&self.connection, &options.address, &options.user)
            .unwrap_or_else(|error| {
                tracing::warn!("the kept session token could not be read: {error}");
                None
            })
            .unwrap_or_default()
    }

    /// A refused login forgets the kept session token: the server checked the password
    /// when the token did not hold (a server older than protocol v8 never gets one), so
    /// the refusal is the password's, and the token is of no more use.
    fn forget_session_token_if_refused(&self, error: &ClientError, options: &SyncOptions) {
        if options.token.is_some() || error.server_code() != Some(ErrorCode::AuthenticationFailed) {
            return;
        }
        if let Err(error) = login::forget(&self.connection, &options.address, &options.user) {
            tracing::warn!("the session token could not be forgotten: {error}");
        }
    }

    /// Keeps the session token a sync's end handed out, for the next syncs.
    fn keep_session_token(&self, options: &SyncOptions, completed: &CompletedSync) {
        let Some(session_token) = &completed.session_token else {
            return;
        };
        if options.token.is_some() {
            return;
        }
        if let Err(error) = login::keep(
            &self.connection,
            &options.address,
            &options.user,
            session_token,
        ) {
            // Only the next sync's password check is at stake.
            tracing::warn!("the session token could not be kept: {error}");
        }
    }
}

/// The handler that applies a round's download as it arrives.
fn apply_handler<'a>(
    connection: &'a mut Connection,
    report: &'a mut SyncReport,
    progress: &'a mut (dyn FnMut(&SyncProgress) + Send),
    batch: &store::Batch,
    kept: KeptStream,
) -> ApplyHandler<'a> {
    ApplyHandler {
        connection,
        apply: DownloadApply::new(),
        named: ConflictedRows::default(),
        wire_before: report.wire,
        rows_downloaded_before: report.rows_downloaded,
        conflicted_rows: &mut report.conflicted_rows,
        progress,
        rows_to_upload: batch.operations,
        kept,
    }
}

/// The exchange that sends `batch` (from the transfer's offset, when it names one).
fn batch_exchange<'a>(
    options: &'a SyncOptions,
    hello: &Hello,
    batch: &'a store::Batch,
    transfer: Option<Transfer>,
) -> Exchange<'a> {
    Exchange {
        upload_frames: &batch.frames,
        upload_sequence: batch.upload_sequence,
        key_ranges: &batch.key_ranges,
        transfer,
        ..short_exchange(options, hello)
    }
}

/// An exchange without an upload (a question, an acknowledgement, a resumption); a
/// batch's exchange sets its upload over it.
fn short_exchange<'a>(options: &'a SyncOptions, hello: &Hello) -> Exchange<'a> {
    Exchange {
        address: &options.address,
        transport: &options.transport,
        hello: hello.clone(),
        upload_frames: &[],
        upload_sequence: 0,
        frame_bytes_max: options.frame_bytes_max,
        timeout: options.timeout,
        acknowledge: None,
        transfer: None,
        download_resume: None,
        key_ranges: &[],
    }
}

/// A new attempt of a batch whose last attempt was cut: what continuing the download
/// it kept needs.
struct KeptAttempt<'a> {
    options: &'a SyncOptions,
    hello: Hello,
    batch: &'a store::Batch,
    transfer_id: &'a str,
}

/// A round's answer: the session's last event, the download as applied so far, the
/// transfer the upload named, and the bytes the exchange moved.
struct RoundAnswer {
    event: SessionEvent,
    apply: DownloadApply,
    transfer: Option<Transfer>,
    wire: WireBytes,
}

/// A cut download to continue: the sync's hello and batch, its transfer and the start
/// of its stream the client kept.
struct DownloadResumption<'a> {
    options: &'a SyncOptions,
    hello: Hello,
    batch: &'a store::Batch,
    transfer_id: &'a str,
    prefix: Vec<u8>,
}

/// The download's stream as it arrives (protocol v4): kept, up to a bound, so a cut
/// leaves its start for the next attempt; and, for a resumed download, counted and
/// hashed from the first byte, to be checked against what the server named.
struct KeptStream {
    /// `None`: not kept (an older protocol, or past the bound).
    bytes: Option<Vec<u8>>,
    bytes_max: u64,
    /// The whole upload was sent: a cut from here on may leave a held download.
    upload_sent: bool,
    /// A resumed download: the whole stream's length and digest as the server named
    /// them, and the stream so far.
    held: Option<DownloadHeld>,
    verify: Option<(Sha256, u64)>,
}

impl KeptStream {
    fn new(keeping: bool, start: Vec<u8>, bytes_max: u64) -> KeptStream {
        KeptStream {
            bytes: (keeping && start.len() as u64 <= bytes_max).then_some(start),
            bytes_max,
            upload_sent: false,
            held: None,
            verify: None,
        }
    }

    /// Counts and hashes the stream from `prefix` on.
    fn verifying(&mut self, prefix: &[u8]) {
        self.upload_sent = true;
        self.verify = Some((Sha256::new_with_prefix(prefix), prefix.len() as u64));
    }

    fn take(&mut self, bytes: &[u8]) {
        if let Some(kept) = self.bytes.as_mut() {
            if (kept.len() + bytes.len()) as u64 > self.bytes_max {
                self.bytes = None;
            } else {
                kept.extend_from_slice(bytes);
            }
        }
        if let Some((hasher, length)) = self.verify.as_mut() {
            hasher.update(bytes);
            *length += bytes.len() as u64;
        }
    }

    /// What to keep after a failed exchange: the stream so far, when the failure was a
    /// cut after the whole upload was sent (not the server's refusal, nor data that
    /// would not decode or apply).
    fn after(&mut self, error: &ClientError) -> Option<Vec<u8>> {
        let cut = is_cut(error);
        self.bytes.take().filter(|_| cut && self.upload_sent)
    }

    /// A resumed download's stream has the length and SHA-256 the server named.
    fn whole(&mut self) -> bool {
        match (self.held.take(), self.verify.take()) {
            (Some(held), Some((hasher, length))) => {
                length == held.length && hasher.finalize().as_slice() == held.sha256
            }
            _ => false,
        }
    }
}

/// Whether a failed exchange was cut (the network, a timeout, the stream ending early),
/// rather than refused or given data that would not decode or apply.
fn is_cut(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Io(_)
            | ClientError::Timeout { .. }
            | ClientError::Protocol(_)
            | ClientError::Tls { .. }
            | ClientError::Http { status: None, .. }
    )
}

/// What [`Client::fall_back`] decides.
enum Fallback {
    Again,
    No,
}

/// Whether the first `length` bytes of `stream` have the SHA-256 `digest` (false when
/// the stream is shorter, or nothing is held).
fn held_prefix_matches<'a>(
    stream: impl Iterator<Item = &'a [u8]>,
    length: u64,
    digest: &[u8],
) -> bool {
    use sha2::{Digest, Sha256};
    if length == 0 {
        return false;
    }
    let mut hasher = Sha256::new();
    let mut left = length;
    for frame in stream {
        let take = left.min(frame.len() as u64) as usize;
        hasher.update(&frame[..take]);
        left -= take as u64;
        if left == 0 {
            break;
        }
    }
    left == 0 && hasher.finalize().as_slice() == digest
}

/// The script version a batch goes with: the one it was first sent with (a resend of
/// an upload made before the client moved to another version), else the options'.
fn sent_with<'a>(options: &'a SyncOptions, batch: &'a store::Batch) -> &'a str {
    batch
        .script_version
        .as_deref()
        .unwrap_or(&options.script_version)
}

/// Applies each download message as it arrives, notes the conflicts it answers and
/// tells progress.
struct ApplyHandler<'a> {
    /// `&mut`, being `Send` where `&Connection` is not.
    connection: &'a mut Connection,
    apply: DownloadApply,
    /// Conflicting keys the server named in this round.
    named: ConflictedRows,
    conflicted_rows: &'a mut Vec<ConflictedRow>,
    progress: &'a mut (dyn FnMut(&SyncProgress) + Send),
    /// What earlier rounds of this sync moved.
    wire_before: WireBytes,
    rows_to_upload: u64,
    rows_downloaded_before: u64,
    /// The download's stream, kept to resume it after a cut (protocol v4).
    kept: KeptStream,
}

impl ApplyHandler<'_> {
    fn tell(&mut self, wire: WireBytes, rows_uploaded: u64) {
        (self.progress)(&SyncProgress {
            bytes_sent: self.wire_before.sent + wire.sent,
            bytes_received: self.wire_before.received + wire.received,
            rows_uploaded,
            rows_to_upload: self.rows_to_upload,
            rows_downloaded: self.rows_downloaded_before + self.apply.rows_applied,
        });
    }
}

impl DownloadHandler for ApplyHandler<'_> {
    fn download(&mut self, download: Download, wire: WireBytes) -> Result<(), ClientError> {
        self.named.answered(&download, self.conflicted_rows);
        self.apply.apply(self.connection, &download)?;
        self.tell(wire, self.rows_to_upload);
        Ok(())
    }

    fn conflicts(&mut self, conflicts: Conflicts) -> Result<(), ClientError> {
        self.apply.losing.named(&conflicts, self.rows_to_upload)?;
        self.named.named(conflicts, self.conflicted_rows);
        Ok(())
    }

    fn sent(&mut self, wire: WireBytes) {
        // Upload rows are counted whole once the upload is out: until then, none.
        self.tell(wire, 0);
    }

    fn upload_sent(&mut self) {
        self.kept.upload_sent = true;
    }

    fn stream(&mut self, bytes: &[u8]) {
        self.kept.take(bytes);
    }

    fn held(&mut self, held: &DownloadHeld) {
        self.kept.held = Some(held.clone());
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
                acknowledge: Some(watermark),
                ..short_exchange(options, &hello)
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
                    wait_when_busy(options, report, retry_after_ms).await?;
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

/// Waits as `options.busy_retry` says after a busy answer and counts the retry, or
/// gives up with [`ClientError::Busy`] when it says not to try again.
async fn wait_when_busy(
    options: &SyncOptions,
    report: &mut SyncReport,
    retry_after_ms: u32,
) -> Result<(), ClientError> {
    let Some(delay) = options
        .busy_retry
        .delay(retry_after_ms, report.busy_retries)
    else {
        return Err(ClientError::Busy { retry_after_ms });
    };
    report.busy_retries += 1;
    tokio::time::sleep(delay).await;
    Ok(())
}
