//! The PostgreSQL backend.
//!
//! Uploads are bound as one array parameter per column and read through `unnest` in a
//! CTE (or, for scripts that cannot follow a CTE, loaded with binary `COPY` into a
//! temporary scratch table) and applied with one statement per operation; conflicts
//! come back from the same statements (`RETURNING` inside a data-modifying CTE). Change
//! tracking uses statement-level triggers with transition tables, so a bulk apply costs
//! one trigger run per statement. Every statement a sync runs is prepared once per
//! connection (`statements`).
//!
//! The download watermark is snapshot-based, because a counter or clock would miss rows
//! whose transaction commits after a later one: rows are stamped with the id of the
//! transaction that wrote them, and a sync's watermark is the oldest transaction id
//! still running when its download is read (or the next id to be assigned). Every
//! transaction below the watermark had finished, so its rows were visible to that
//! download; the next sync asks for everything at or above it. Rows of a transaction
//! that commits late carry an id at or above every watermark taken while it ran.

/// The lowest transaction id still running in the statement's snapshot, or the
/// snapshot's `xmax` when none is: a sync's watermark (see `transaction`), and the
/// horizon cleanup keeps below (see `schema::cleanup`).
macro_rules! snapshot_horizon {
    () => {
        "(COALESCE((SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x), \
         pg_snapshot_xmax(pg_current_snapshot()))::text)::bigint"
    };
}

mod array_scratch;
mod error;
mod events;
mod held;
mod key_space;
mod query;
mod rows;
mod schema;
mod scratch;
mod shapes;
mod statements;
mod stored;
mod streams;
mod tls;
mod transaction;
mod users;

pub use streams::ABORT_DECISION_KEEP_HOURS;

pub use rows::ROW_SCRIPT_PIPELINE_DEPTH;
pub use statements::PREPARED_STATEMENTS_MAX;
mod numeric;
pub mod value;

use std::sync::Arc;

use rowsync_protocol::Row;
use tokio_postgres::Client;

use crate::dialect::SyncBackend;
pub use crate::driver::SYNC_ATTEMPTS_MAX;
use crate::key_space::{KeyRangeInit, KeySpace};
use crate::rules::RuleSet;
use crate::version_scripts::ScriptCache;
use crate::UserEntry;
use crate::{
    ApplyStreamSettings, AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, DbError,
    DownloadAckRequest, DownloadSender, InitOutcome, LoginFailures, ScriptEntry, SessionKey,
    SyncError, SyncOutcome, SyncRequest, TableInit,
};
pub use error::describe_postgres;
use shapes::{ShapeCache, SyncGeneration};
use statements::Statements;
use transaction::PgTransaction;

/// Local buffers per connection for temporary scratch tables, in MiB.
pub const SCRATCH_TEMP_BUFFERS_MB: u32 = 256;
/// Memory per sort or hash in a sync's statements, in MiB.
pub const SCRATCH_WORK_MEM_MB: u32 = 64;

#[derive(Clone)]
pub struct PostgresConsolidated {
    url: String,
    /// Apply stream connections, shared by every connection this hands out.
    streams: Arc<streams::StreamPool>,
}

impl std::fmt::Debug for PostgresConsolidated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConsolidated")
            .field("apply_streams", &self.streams.settings)
            .finish_non_exhaustive()
    }
}

impl PostgresConsolidated {
    /// A consolidated database at a `postgres://` URL, applying uploads on one stream.
    pub fn new(url: impl Into<String>) -> PostgresConsolidated {
        PostgresConsolidated::with_apply_streams(url, ApplyStreamSettings::OFF)
    }

    /// A consolidated database whose syncs apply large uploads over apply streams.
    pub fn with_apply_streams(
        url: impl Into<String>,
        settings: ApplyStreamSettings,
    ) -> PostgresConsolidated {
        let url = url.into();
        PostgresConsolidated {
            streams: Arc::new(streams::StreamPool::new(&url, settings)),
            url,
        }
    }

    /// The same database with other apply stream settings (and a pool of its own).
    pub fn with_other_apply_streams(&self, settings: ApplyStreamSettings) -> PostgresConsolidated {
        PostgresConsolidated::with_apply_streams(self.url.clone(), settings)
    }

    /// A connection with the session settings every sync relies on.
    async fn open(url: &str, streams: streams::SharedPool) -> Result<PostgresConnection, DbError> {
        let (config, tls) = tls::connection_settings(url)?;
        let (client, connection) = config.connect(tls).await.map_err(connect_failure)?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "consolidated database connection ended");
            }
        });
        // Scratch tables are temporary: with the default 8 MB of local buffers a large
        // upload is written out and read back; the hash joins that find conflicts
        // likewise spill beyond the default work_mem. Both are per-session maxima,
        // used only as needed. JIT compilation costs more than it saves on statements
        // that run once per sync. Statements stay prepared (`statements`) but are
        // planned for each sync's own values: a generic plan guesses an upload's array
        // at 10 rows and then anti-joins its RETURNING keys by nested loop, quadratic
        // in the rows (a 1,000-row delete took 3.5 times as long). No parallel workers:
        // a cursor over a partition of a large table was planned parallel, and starting
        // the worker cost more than the query (a tombstone cursor 12-15 ms instead of
        // 2-6 ms, which in a standard Test 1 was 63 s of 13,000 syncs' database time);
        // the server's concurrent syncs are what use the database's cores.
        client
            .batch_execute(&format!(
                "SET temp_buffers = '{SCRATCH_TEMP_BUFFERS_MB}MB'; SET work_mem = '{SCRATCH_WORK_MEM_MB}MB'; SET jit = off; \
                 SET plan_cache_mode = force_custom_plan; SET max_parallel_workers_per_gather = 0"
            ))
            .await?;
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])
            .await?
            .get(0);
        Ok(PostgresConnection {
            client,
            cache: ScriptCache::default(),
            statements: Statements::default(),
            shapes: ShapeCache::default(),
            generation: SyncGeneration::default(),
            lender: None,
            streams,
            flushes_counts: version >= FORCE_NEXT_FLUSH_VERSION,
            scripts_revision: None,
        })
    }
}

impl Consolidated for PostgresConsolidated {
    type Connection = PostgresConnection;

    async fn connect(&self) -> Result<PostgresConnection, DbError> {
        PostgresConsolidated::open(&self.url, Some(Arc::clone(&self.streams))).await
    }
}

pub struct PostgresConnection {
    client: Client,
    cache: ScriptCache,
    /// This connection's prepared statements (see `statements`).
    statements: Statements,
    /// Table shapes kept across syncs (see `shapes`).
    shapes: ShapeCache,
    /// The schema generation this connection's open sync read, told to its streams.
    generation: SyncGeneration,
    /// On an apply stream: the generation of the sync it applies for.
    lender: Option<SyncGeneration>,
    /// Where its syncs take apply streams from (none on a stream's own connection).
    streams: streams::SharedPool,
    /// See `PgTransaction::flushes_counts`.
    flushes_counts: bool,
    /// The script version and revision the open sync started with (see
    /// `PgTransaction::scripts_revision`).
    scripts_revision: Option<(String, i64)>,
}

/// Times one sync loads its version's scripts again after finding them changed with
/// the client's lock, before it fails with `SyncError::ScriptsChanged`.
pub const SCRIPT_RELOADS_MAX: u32 = 3;

/// The first `server_version_num` with `pg_stat_force_next_flush`.
const FORCE_NEXT_FLUSH_VERSION: i32 = 150_000;

impl PostgresConnection {
    /// The driver's client, for tools and tests that run their own SQL.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Statements this connection keeps prepared.
    pub fn prepared_statements(&self) -> usize {
        self.statements.len()
    }

    /// Table shapes this connection keeps (`shapes`).
    pub fn cached_shapes(&self) -> usize {
        self.shapes.len()
    }
}

impl SyncBackend for PostgresConnection {
    type Transaction<'t> = PgTransaction<'t>;

    async fn begin(&mut self) -> Result<PgTransaction<'_>, SyncError> {
        let lock_timeout_ms = self
            .streams
            .as_ref()
            .map_or(ApplyStreamSettings::OFF.lock_timeout_ms, |pool| {
                pool.settings.lock_timeout_ms
            });
        self.shapes.begin();
        self.generation.set(None);
        if let Some(generation) = self.lender.as_ref().and_then(SyncGeneration::get) {
            // An apply stream, inside a sync that read the generation.
            self.shapes.confirm(Some(generation));
        }
        Ok(PgTransaction {
            transaction: self.client.transaction().await?,
            statements: &self.statements,
            lock_timeout_ms,
            shapes: &mut self.shapes,
            generation: &self.generation,
            subscription: None,
            scripts_revision: self
                .scripts_revision
                .as_ref()
                .map(|(version, revision)| (version.as_str(), *revision)),
            flushes_counts: self.flushes_counts,
            lock_horizon: None,
            fast_forms_run: 0,
        })
    }

    fn may_retry(&mut self, error: &SyncError) -> bool {
        let stale = error::is_stale(error);
        if stale {
            // A table changed under a prepared statement: prepare afresh.
            self.statements.clear();
            self.shapes.clear();
        }
        stale || error::is_retryable(error)
    }

    fn after_failure(&mut self) {
        // A failed sync may come from a table changed under a prepared statement in a
        // way PostgreSQL does not report as such (a parameter's type): the next sync on
        // this connection prepares afresh and reads table shapes again.
        self.statements.clear();
        self.shapes.clear();
    }

    fn apply_streams_for(&self, rows: u64) -> usize {
        self.streams
            .as_ref()
            .map_or(1, |pool| pool.settings.streams_for(rows))
    }

    async fn take_streams(&mut self, count: usize) -> Vec<PostgresConnection> {
        match &self.streams {
            Some(pool) => {
                let mut streams = pool.take(&self.client, count).await;
                for stream in &mut streams {
                    stream.lender = Some(self.generation.clone());
                }
                streams
            }
            None => Vec::new(),
        }
    }

    fn return_streams(&mut self, streams: Vec<PostgresConnection>, healthy: bool) {
        if let Some(pool) = &self.streams {
            pool.give_back(streams, healthy);
        }
    }

    async fn finish_prepared(&mut self, gid: &str, commit: bool) -> Result<(), SyncError> {
        streams::finish_prepared(&self.client, gid, commit).await
    }

    async fn resolve_group(&mut self, group: &str) -> Result<(), SyncError> {
        streams::resolve_group(&self.client, group).await.map(drop)
    }
}

impl ConsolidatedConnection for PostgresConnection {
    async fn resolve_prepared_streams(&mut self) -> Result<u64, DbError> {
        streams::recover(&self.client).await
    }

    async fn install_system_tables(&mut self) -> Result<(), DbError> {
        schema::install_system_tables(&self.client).await?;
        held::install(&self.client).await?;
        users::session_keys(&self.client, &crate::new_session_secret()).await?;
        Ok(())
    }

    async fn hold_transfer(
        &mut self,
        direction: crate::Direction,
        held: &crate::HeldTransfer,
        bytes: &[u8],
        bounds: impl Into<crate::HoldBounds> + Send,
    ) -> Result<bool, DbError> {
        crate::held::hold(&mut self.client, direction, held, bytes, bounds.into()).await
    }

    async fn held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<Option<crate::HeldTransfer>, DbError> {
        crate::held::held(&mut self.client, direction, client_id, transfer_id).await
    }

    async fn held_transfer_client(
        &mut self,
        direction: crate::Direction,
        transfer_id: &str,
    ) -> Result<Option<String>, DbError> {
        crate::held::held_client(&mut self.client, direction, transfer_id).await
    }

    async fn held_transfer_bytes(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
        length: u64,
    ) -> Result<Vec<u8>, DbError> {
        crate::held::held_bytes(&mut self.client, direction, client_id, transfer_id, length).await
    }

    async fn release_held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<bool, DbError> {
        crate::held::release(&mut self.client, direction, client_id, transfer_id).await
    }

    async fn expire_held_transfers(
        &mut self,
        direction: crate::Direction,
        created_before_unix_ms: i64,
    ) -> Result<u64, DbError> {
        crate::held::expire(&mut self.client, direction, created_before_unix_ms).await
    }

    async fn set_user(&mut self, name: &str, password_hash: &str) -> Result<(), DbError> {
        schema::set_user(&self.client, name, password_hash).await
    }

    async fn append_sync_history(
        &mut self,
        records: &[crate::HistoryRecord],
        rows_max: u64,
    ) -> Result<(), DbError> {
        schema::append_sync_history(&mut self.client, records, rows_max).await
    }

    async fn sync_history(&mut self, limit: u64) -> Result<Vec<crate::HistoryRecord>, DbError> {
        schema::sync_history(&self.client, limit).await
    }

    async fn users(&mut self) -> Result<Vec<UserEntry>, DbError> {
        users::users(&self.client).await
    }

    async fn remove_user(&mut self, name: &str) -> Result<bool, DbError> {
        users::remove_user(&self.client, name).await
    }

    async fn set_user_disabled(&mut self, name: &str, disabled: bool) -> Result<bool, DbError> {
        users::set_user_disabled(&self.client, name, disabled).await
    }

    async fn user_disabled(&mut self, name: &str) -> Result<bool, DbError> {
        users::user_disabled(&self.client, name).await
    }

    async fn session_keys(&mut self, new_secret: &str) -> Result<Vec<SessionKey>, DbError> {
        users::session_keys(&self.client, new_secret).await
    }

    async fn farm_servers(
        &mut self,
        server_id: &str,
        now_unix_ms: i64,
        alive_since_unix_ms: i64,
    ) -> Result<u64, DbError> {
        users::farm_servers(&self.client, server_id, now_unix_ms, alive_since_unix_ms).await
    }

    async fn share_login_failures(
        &mut self,
        server_id: &str,
        own: &[LoginFailures],
        since_unix_ms: i64,
    ) -> Result<Vec<LoginFailures>, DbError> {
        users::share_login_failures(&self.client, server_id, own, since_unix_ms).await
    }

    async fn password_hash(&mut self, name: &str) -> Result<Option<String>, DbError> {
        let row = self
            .client
            .query_opt(users::PASSWORD_HASH, &[&name])
            .await?;
        Ok(row.map(|row| row.get(0)))
    }

    async fn init_key_ranges(&mut self, init: &KeyRangeInit) -> Result<KeySpace, DbError> {
        key_space::init_key_ranges(&mut self.client, init).await
    }

    async fn ping(&mut self) -> Result<(), DbError> {
        self.client.simple_query("SELECT 1").await?;
        Ok(())
    }

    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    async fn init_table(&mut self, init: &TableInit) -> Result<InitOutcome, DbError> {
        schema::init_table(&mut self.client, init, None).await
    }

    async fn client_columns(&mut self, table: &str) -> Result<Option<crate::ClientTable>, DbError> {
        schema::client_columns(&self.client, table).await
    }

    async fn index_columns(&mut self, table: &str) -> Result<Vec<Vec<String>>, DbError> {
        let rows = self
            .client
            .query(
                "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY AS k(n, o) \
                 JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o) \
                 FROM pg_index AS i WHERE i.indrelid = to_regclass($1)",
                &[&crate::quote_identifier(table)],
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn init_rule_table(
        &mut self,
        init: &TableInit,
        rules: &RuleSet,
    ) -> Result<InitOutcome, DbError> {
        schema::init_table(&mut self.client, init, Some(rules)).await
    }

    async fn run_sync_transaction(
        &mut self,
        request: Arc<SyncRequest>,
        download: DownloadSender,
    ) -> Result<SyncOutcome, SyncError> {
        let version = &request.script_version;
        // The scripts cached are checked with the client's lock, in the sync's own
        // transaction; only the first sync of a version on this connection, or one
        // that found them changed, reads them (and their revision) first.
        let mut cached = self.cache.latest(version);
        let mut reloads = 0;
        loop {
            let (scripts, revision) = match cached.take() {
                Some(found) => found,
                None => {
                    let (client, statements) = (&self.client, &self.statements);
                    events::scripts_and_revision(client, statements, &mut self.cache, version)
                        .await?
                }
            };
            self.scripts_revision = Some((version.clone(), revision));
            let synchronized =
                crate::driver::sync_with_retries(self, &scripts, &request, &download).await;
            self.scripts_revision = None;
            match synchronized {
                Err(SyncError::ScriptsChanged { .. }) if reloads < SCRIPT_RELOADS_MAX => {
                    reloads += 1;
                }
                synchronized => return synchronized,
            }
        }
    }

    async fn authenticate(&mut self, request: &AuthRequest) -> Result<AuthCheck, SyncError> {
        events::authenticate(&mut self.client, &self.statements, &mut self.cache, request).await
    }

    async fn acknowledge_download(
        &mut self,
        request: &DownloadAckRequest,
    ) -> Result<bool, SyncError> {
        events::acknowledge_download(&mut self.client, &self.statements, &mut self.cache, request)
            .await
    }

    async fn scripts(&mut self, script_version: Option<&str>) -> Result<Vec<ScriptEntry>, DbError> {
        schema::scripts(&self.client, script_version).await
    }

    async fn set_script(&mut self, entry: &ScriptEntry) -> Result<(), DbError> {
        schema::set_script(&self.client, entry).await
    }

    async fn remove_script(
        &mut self,
        script_version: &str,
        table: &str,
        event: &str,
    ) -> Result<bool, DbError> {
        schema::remove_script(&self.client, script_version, table, event).await
    }

    async fn add_script_version(&mut self, name: &str, description: &str) -> Result<(), DbError> {
        schema::add_script_version(&self.client, name, description).await
    }

    async fn script_versions(&mut self) -> Result<Vec<(String, String)>, DbError> {
        schema::script_versions(&self.client).await
    }

    fn canceller(&self) -> crate::Canceller {
        crate::Canceller::new(self.client.cancel_token())
    }

    async fn cleanup(&mut self) -> Result<u64, DbError> {
        // The apply streams' decisions no longer needed go first, as before tombstones.
        streams::forget_finished(&self.client).await?;
        schema::cleanup(&mut self.client).await
    }

    async fn execute_sql(&mut self, sql: &str) -> Result<(), DbError> {
        self.client.batch_execute(sql).await?;
        Ok(())
    }

    async fn query_sql(&mut self, sql: &str) -> Result<Vec<Row>, DbError> {
        let rows = self.client.query(sql, &[]).await?;
        rows.iter()
            .map(|row| {
                (0..row.len())
                    .map(|index| row.try_get::<_, value::Read>(index).map(|read| read.0))
                    .collect::<Result<Row, _>>()
                    .map_err(DbError::from)
            })
            .collect()
    }
}

/// A plain client of the database `url` names, TLS as its `sslmode` says (for tools
/// beside the server: the profiler); its connection runs on a task of its own.
pub async fn connect_client(url: &str) -> Result<Client, DbError> {
    let (config, tls) = tls::connection_settings(url)?;
    let (client, connection) = config.connect(tls).await.map_err(connect_failure)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A failed connection, with the fix when TLS is why.
fn connect_failure(error: tokio_postgres::Error) -> DbError {
    let text = format!(
        "{error}: {}",
        std::error::Error::source(&error).map_or(String::new(), |source| source.to_string())
    );
    if text.contains("TLS") || text.contains("certificate") {
        return DbError::Invalid(format!(
            "connecting to PostgreSQL over TLS: {text}; check sslmode (disable, prefer, require, \
             verify-ca, verify-full) and sslrootcert (the CA that signed the server's certificate)"
        ));
    }
    if text.contains("SSL off") || text.contains("no encryption") {
        return DbError::Invalid(format!(
            "connecting to PostgreSQL: {text}; the server takes only TLS connections: add \
             sslmode=require (or verify-full with sslrootcert) to the URL"
        ));
    }
    error.into()
}

/// PostgreSQL's cancel request, on a connection of its own.
impl crate::cancel::CancelStatement for tokio_postgres::CancelToken {
    fn cancel(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DbError>> + Send + '_>> {
        Box::pin(async move { Ok(self.cancel_query(tokio_postgres::NoTls).await?) })
    }
}
