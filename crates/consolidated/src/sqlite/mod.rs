//! The SQLite backend: the embedded default, one file, nothing to install.
//!
//! Writers in SQLite are serialized, so a change counter bumped by triggers inside each
//! writing transaction commits in counter order: reading the counter inside a sync's
//! write transaction gives a watermark below which every change is committed. That is
//! why a counter is a safe watermark here (and would not be on PostgreSQL).

mod error;
mod events;
mod held;
mod key_space;
mod query;
mod schema;
mod scratch;
mod transaction;
mod users;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::trace::{TraceEvent, TraceEventCodes};
use rusqlite::{Connection, OpenFlags};

use crate::key_space::{KeyRangeInit, KeySpace};
use crate::version_scripts::ScriptCache;
use crate::UserEntry;
use crate::{
    AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, DbError, DownloadAckRequest,
    DownloadSender, InitOutcome, LoginFailures, ScriptEntry, SessionKey, SyncError, SyncOutcome,
    SyncRequest, TableInit,
};
use held::SqliteHeld;
use transaction::SqliteBackend;

/// How long a connection waits for another writer before failing with "database is locked".
pub const BUSY_TIMEOUT_MS: u64 = 30_000;

/// Receives the text of every statement a connection runs, as written (parameters
/// unexpanded): SQLite's counterpart of PostgreSQL's `log_statement = 'all'`.
pub type StatementLog = Arc<dyn Fn(&str) + Send + Sync>;

/// Receives, as each statement ends, its text and the virtual-machine steps it took
/// (`SQLITE_STMTSTATUS_VM_STEP`, triggers included): a statement's work as a count,
/// the same on a loaded machine as on an idle one.
pub type StatementSteps = Arc<dyn Fn(&str, u64) + Send + Sync>;

#[derive(Clone)]
pub struct SqliteConsolidated {
    path: PathBuf,
    statement_log: Option<StatementLog>,
    statement_steps: Option<StatementSteps>,
}

impl std::fmt::Debug for SqliteConsolidated {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SqliteConsolidated")
            .field("path", &self.path)
            .field("statement_log", &self.statement_log.is_some())
            .field("statement_steps", &self.statement_steps.is_some())
            .finish()
    }
}

impl SqliteConsolidated {
    /// A consolidated database in the SQLite file at `path` (created when missing).
    pub fn new(path: impl AsRef<Path>) -> SqliteConsolidated {
        SqliteConsolidated {
            path: path.as_ref().to_path_buf(),
            statement_log: None,
            statement_steps: None,
        }
    }

    /// Every connection opened from now on reports each statement's text to `log`.
    pub fn with_statement_log(mut self, log: StatementLog) -> SqliteConsolidated {
        self.statement_log = Some(log);
        self
    }

    /// Every connection opened from now on reports each statement's steps to `steps`.
    pub fn with_statement_steps(mut self, steps: StatementSteps) -> SqliteConsolidated {
        self.statement_steps = Some(steps);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a plain rusqlite connection with the settings every rowsync connection uses.
    pub fn open_blocking(&self) -> Result<Connection, DbError> {
        let mut connection = Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        connection.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
        // WAL lets downloads read while another sync writes; synchronous=FULL makes a
        // commit durable before the client is told its upload was applied.
        connection.pragma_update(None, "journal_mode", "WAL")?;
        connection.pragma_update(None, "synchronous", "FULL")?;
        connection.pragma_update(None, "foreign_keys", "ON")?;
        // REPLACE deletes the old row; only with recursive triggers on does that delete
        // leave its tombstone (a row replaced into another partition must reach its old owner).
        connection.pragma_update(None, "recursive_triggers", "ON")?;
        self.trace(&mut connection)?;
        Ok(connection)
    }

    /// Hands the connection's statements to the statement log and the step counter.
    fn trace(&self, connection: &mut Connection) -> Result<(), DbError> {
        let mut codes = TraceEventCodes::empty();
        if self.statement_log.is_some() || self.statement_steps.is_some() {
            codes |= TraceEventCodes::SQLITE_TRACE_STMT;
        }
        if self.statement_steps.is_some() {
            codes |= TraceEventCodes::SQLITE_TRACE_PROFILE;
        }
        if codes.is_empty() {
            return Ok(());
        }
        let (log, steps) = (self.statement_log.clone(), self.statement_steps.clone());
        // A statement's step counter runs on across its runs: each run reports the steps
        // since it started (trigger programs start inside a run and are part of it).
        let mut started: std::collections::HashMap<String, i32> = Default::default();
        let step_count = |statement: &rusqlite::trace::StmtRef<'_>| {
            statement.get_status(rusqlite::StatementStatus::VmStep)
        };
        connection.trace_v2(
            codes,
            Some(move |event: TraceEvent<'_>| match event {
                TraceEvent::Stmt(statement, text) => {
                    if let Some(log) = &log {
                        log(&statement.sql());
                    }
                    if steps.is_some() && !text.starts_with("--") {
                        started.insert(statement.sql().into_owned(), step_count(&statement));
                    }
                }
                TraceEvent::Profile(statement, _) => {
                    if let Some(steps) = &steps {
                        let sql = statement.sql();
                        let start = started.remove(sql.as_ref()).unwrap_or(0);
                        let taken = step_count(&statement).saturating_sub(start);
                        steps(&sql, u64::try_from(taken).unwrap_or(0));
                    }
                }
                _ => {}
            }),
        )?;
        Ok(())
    }
}

impl Consolidated for SqliteConsolidated {
    type Connection = SqliteConnection;

    async fn connect(&self) -> Result<SqliteConnection, DbError> {
        let backend = self.clone();
        let connection = tokio::task::spawn_blocking(move || backend.open_blocking())
            .await
            .map_err(|error| DbError::Task(error.to_string()))??;
        Ok(SqliteConnection {
            interrupt: Arc::new(connection.get_interrupt_handle()),
            session: Arc::new(Mutex::new(Session {
                connection,
                cache: ScriptCache::default(),
            })),
        })
    }
}

/// A pooled SQLite connection. Its blocking calls run on tokio's blocking threads.
pub struct SqliteConnection {
    session: Arc<Mutex<Session>>,
    /// Interrupts the statement the session runs, while a blocking thread holds it.
    interrupt: Arc<rusqlite::InterruptHandle>,
}

/// A connection with the scripts it has loaded.
struct Session {
    connection: Connection,
    cache: ScriptCache,
}

impl SqliteConnection {
    async fn run<T, E>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        self.run_session(move |session| work(&mut session.connection))
            .await
    }

    async fn run_session<T, E>(
        &self,
        work: impl FnOnce(&mut Session) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        let session = Arc::clone(&self.session);
        tokio::task::spawn_blocking(move || {
            let mut guard = session.lock().map_err(|_| {
                DbError::Task("a previous task panicked holding this connection".into())
            })?;
            work(&mut guard)
        })
        .await
        .map_err(|error| E::from(DbError::Task(error.to_string())))?
    }
}

impl ConsolidatedConnection for SqliteConnection {
    async fn install_system_tables(&mut self) -> Result<(), DbError> {
        self.run(|connection| {
            schema::install_system_tables(connection)?;
            let tables = crate::held::tables_sql(&held::SQL).join(";\n");
            connection.execute_batch(&tables)?;
            users::session_keys(connection, &crate::new_session_secret())?;
            Ok(())
        })
        .await
    }

    async fn hold_transfer(
        &mut self,
        direction: crate::Direction,
        held: &crate::HeldTransfer,
        bytes: &[u8],
        bounds: impl Into<crate::HoldBounds> + Send,
    ) -> Result<bool, DbError> {
        let (held, bytes, bounds) = (held.clone(), bytes.to_vec(), bounds.into());
        self.run(move |connection| {
            held::on_thread(crate::held::hold(
                &mut SqliteHeld { connection },
                direction,
                &held,
                &bytes,
                bounds,
            ))
        })
        .await
    }

    async fn held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<Option<crate::HeldTransfer>, DbError> {
        let (client_id, transfer_id) = (client_id.to_string(), transfer_id.to_string());
        self.run(move |connection| {
            let mut storage = SqliteHeld { connection };
            held::on_thread(crate::held::held(
                &mut storage,
                direction,
                &client_id,
                &transfer_id,
            ))
        })
        .await
    }

    async fn held_transfer_client(
        &mut self,
        direction: crate::Direction,
        transfer_id: &str,
    ) -> Result<Option<String>, DbError> {
        let transfer_id = transfer_id.to_string();
        self.run(move |connection| {
            let mut storage = SqliteHeld { connection };
            held::on_thread(crate::held::held_client(
                &mut storage,
                direction,
                &transfer_id,
            ))
        })
        .await
    }

    async fn held_transfer_bytes(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
        length: u64,
    ) -> Result<Vec<u8>, DbError> {
        let (client_id, transfer_id) = (client_id.to_string(), transfer_id.to_string());
        self.run(move |connection| {
            let mut storage = SqliteHeld { connection };
            let step =
                crate::held::held_bytes(&mut storage, direction, &client_id, &transfer_id, length);
            held::on_thread(step)
        })
        .await
    }

    async fn release_held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<bool, DbError> {
        let (client_id, transfer_id) = (client_id.to_string(), transfer_id.to_string());
        self.run(move |connection| {
            let mut storage = SqliteHeld { connection };
            held::on_thread(crate::held::release(
                &mut storage,
                direction,
                &client_id,
                &transfer_id,
            ))
        })
        .await
    }

    async fn expire_held_transfers(
        &mut self,
        direction: crate::Direction,
        created_before_unix_ms: i64,
    ) -> Result<u64, DbError> {
        self.run(move |connection| {
            let mut storage = SqliteHeld { connection };
            held::on_thread(crate::held::expire(
                &mut storage,
                direction,
                created_before_unix_ms,
            ))
        })
        .await
    }

    async fn set_user(&mut self, name: &str, password_hash: &str) -> Result<(), DbError> {
        let (name, password_hash) = (name.to_string(), password_hash.to_string());
        self.run(move |connection| schema::set_user(connection, &name, &password_hash))
            .await
    }

    async fn append_sync_history(
        &mut self,
        records: &[crate::HistoryRecord],
        rows_max: u64,
    ) -> Result<(), DbError> {
        let records = records.to_vec();
        self.run(move |connection| schema::append_sync_history(connection, &records, rows_max))
            .await
    }

    async fn sync_history(&mut self, limit: u64) -> Result<Vec<crate::HistoryRecord>, DbError> {
        self.run(move |connection| schema::sync_history(connection, limit))
            .await
    }

    async fn users(&mut self) -> Result<Vec<UserEntry>, DbError> {
        self.run(move |connection| users::users(connection)).await
    }

    async fn remove_user(&mut self, name: &str) -> Result<bool, DbError> {
        let name = name.to_string();
        self.run(move |connection| users::remove_user(connection, &name))
            .await
    }

    async fn set_user_disabled(&mut self, name: &str, disabled: bool) -> Result<bool, DbError> {
        let name = name.to_string();
        self.run(move |connection| users::set_user_disabled(connection, &name, disabled))
            .await
    }

    async fn user_disabled(&mut self, name: &str) -> Result<bool, DbError> {
        let name = name.to_string();
        self.run(move |connection| users::user_disabled(connection, &name))
            .await
    }

    async fn session_keys(&mut self, new_secret: &str) -> Result<Vec<SessionKey>, DbError> {
        let new_secret = new_secret.to_string();
        self.run(move |connection| users::session_keys(connection, &new_secret))
            .await
    }

    async fn farm_servers(
        &mut self,
        server_id: &str,
        now_unix_ms: i64,
        alive_since_unix_ms: i64,
    ) -> Result<u64, DbError> {
        let server_id = server_id.to_string();
        self.run(move |connection| {
            users::farm_servers(connection, &server_id, now_unix_ms, alive_since_unix_ms)
        })
        .await
    }

    async fn share_login_failures(
        &mut self,
        server_id: &str,
        own: &[LoginFailures],
        since_unix_ms: i64,
    ) -> Result<Vec<LoginFailures>, DbError> {
        let (server_id, own) = (server_id.to_string(), own.to_vec());
        self.run(move |connection| {
            users::share_login_failures(connection, &server_id, &own, since_unix_ms)
        })
        .await
    }

    async fn password_hash(&mut self, name: &str) -> Result<Option<String>, DbError> {
        let name = name.to_string();
        self.run(move |connection| schema::password_hash(connection, &name))
            .await
    }

    async fn init_key_ranges(&mut self, init: &KeyRangeInit) -> Result<KeySpace, DbError> {
        let init = init.clone();
        self.run(move |connection| key_space::init_key_ranges(connection, &init))
            .await
    }

    async fn ping(&mut self) -> Result<(), DbError> {
        self.run(|connection| {
            connection.query_row("SELECT 1", [], |_| Ok(()))?;
            Ok(())
        })
        .await
    }

    async fn init_table(&mut self, init: &TableInit) -> Result<InitOutcome, DbError> {
        let init = init.clone();
        self.run(move |connection| schema::init_table(connection, &init, None))
            .await
    }

    async fn client_columns(&mut self, table: &str) -> Result<Option<crate::ClientTable>, DbError> {
        let table = table.to_string();
        self.run(move |connection| schema::client_columns(connection, &table))
            .await
    }

    async fn index_columns(&mut self, table: &str) -> Result<Vec<Vec<String>>, DbError> {
        let table = table.to_string();
        self.run(move |connection| {
            let mut statement = connection.prepare(
                "SELECT il.name, ii.name FROM pragma_index_list(?1) AS il, \
                 pragma_index_info(il.name) AS ii ORDER BY il.name, ii.seqno",
            )?;
            let rows = statement.query_map([&table], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            Ok(crate::shape::columns_by_index(rows))
        })
        .await
    }

    async fn init_rule_table(
        &mut self,
        init: &TableInit,
        rules: &crate::rules::RuleSet,
    ) -> Result<InitOutcome, DbError> {
        let (init, rules) = (init.clone(), rules.clone());
        self.run(move |connection| schema::init_table(connection, &init, Some(&rules)))
            .await
    }

    async fn run_sync_transaction(
        &mut self,
        request: Arc<SyncRequest>,
        download: DownloadSender,
    ) -> Result<SyncOutcome, SyncError> {
        self.run_session(move |session| {
            let Session { connection, cache } = session;
            let scripts = events::scripts_for(connection, cache, &request.script_version)?;
            // The driver's steps on this connection are blocking calls; the download
            // channel is async: run the driver here, on this blocking thread.
            let mut backend = SqliteBackend { connection };
            tokio::runtime::Handle::current().block_on(crate::driver::sync_with_retries(
                &mut backend,
                &scripts,
                &request,
                &download,
            ))
        })
        .await
    }

    async fn authenticate(&mut self, request: &AuthRequest) -> Result<AuthCheck, SyncError> {
        let request = request.clone();
        self.run_session(move |session| {
            events::authenticate(&mut session.connection, &mut session.cache, &request)
        })
        .await
    }

    async fn acknowledge_download(
        &mut self,
        request: &DownloadAckRequest,
    ) -> Result<bool, SyncError> {
        let request = request.clone();
        self.run_session(move |session| {
            events::acknowledge_download(&mut session.connection, &mut session.cache, &request)
        })
        .await
    }

    async fn scripts(&mut self, script_version: Option<&str>) -> Result<Vec<ScriptEntry>, DbError> {
        let script_version = script_version.map(str::to_owned);
        self.run(move |connection| schema::scripts(connection, script_version.as_deref()))
            .await
    }

    async fn set_script(&mut self, entry: &ScriptEntry) -> Result<(), DbError> {
        let entry = entry.clone();
        self.run(move |connection| schema::set_script(connection, &entry))
            .await
    }

    async fn remove_script(
        &mut self,
        script_version: &str,
        table: &str,
        event: &str,
    ) -> Result<bool, DbError> {
        let (script_version, table, event) = (
            script_version.to_owned(),
            table.to_owned(),
            event.to_owned(),
        );
        self.run(move |connection| {
            schema::remove_script(connection, &script_version, &table, &event)
        })
        .await
    }

    async fn add_script_version(&mut self, name: &str, description: &str) -> Result<(), DbError> {
        let (name, description) = (name.to_owned(), description.to_owned());
        self.run(move |connection| schema::add_script_version(connection, &name, &description))
            .await
    }

    async fn script_versions(&mut self) -> Result<Vec<(String, String)>, DbError> {
        self.run(|connection| schema::script_versions(connection))
            .await
    }

    fn canceller(&self) -> crate::Canceller {
        crate::Canceller::new(Interrupt(Arc::clone(&self.interrupt)))
    }

    async fn cleanup(&mut self) -> Result<u64, DbError> {
        self.run(schema::cleanup).await
    }

    async fn execute_sql(&mut self, sql: &str) -> Result<(), DbError> {
        let sql = sql.to_string();
        self.run(move |connection| Ok(connection.execute_batch(&sql)?))
            .await
    }

    async fn query_sql(&mut self, sql: &str) -> Result<Vec<rowsync_protocol::Row>, DbError> {
        let sql = sql.to_string();
        self.run(move |connection| {
            let mut statement = connection.prepare(&sql)?;
            let width = statement.column_count();
            let rows = statement
                .query_map([], |row| {
                    (0..width)
                        .map(|index| row.get::<_, rowsync_protocol::Value>(index))
                        .collect::<rusqlite::Result<rowsync_protocol::Row>>()
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .await
    }
}

/// SQLite's interrupt: the running statement fails with `SQLITE_INTERRUPT`.
struct Interrupt(Arc<rusqlite::InterruptHandle>);

impl crate::cancel::CancelStatement for Interrupt {
    fn cancel(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DbError>> + Send + '_>> {
        self.0.interrupt();
        Box::pin(std::future::ready(Ok(())))
    }
}
