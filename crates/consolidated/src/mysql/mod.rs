//! The MySQL and MariaDB backend (MariaDB 10.6+ and MySQL 8: `SKIP LOCKED`, invisible
//! columns).
//!
//! Every session runs with `ANSI_QUOTES` and `PIPES_AS_CONCAT`, UTC and utf8mb4, so
//! identifiers are quoted and scripts written as on the other backends. Uploads are
//! put in scratch (temporary tables) by multi-row inserts with bound values and applied with
//! one statement per operation. The download watermark comes from stamps given in
//! commit order by a short stamper transaction before each sync: see `stamp`.

mod error;
mod events;
mod held;
mod key_space;
mod names;
mod query;
mod schema;
mod scratch;
mod stamp;
mod tls;
mod transaction;
mod users;
pub mod value;

use std::collections::HashMap;
use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, OptsBuilder};
use rowsync_protocol::Row;

use crate::key_space::{KeyRangeInit, KeySpace};
use crate::version_scripts::ScriptCache;
use crate::UserEntry;
use crate::{
    AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, DbError, DownloadAckRequest,
    DownloadSender, InitOutcome, LoginFailures, ScriptEntry, SessionKey, SyncError, SyncOutcome,
    SyncRequest, TableInit,
};
use error::db;

/// What every rowsync session sets: standard quoting and concatenation, strict inserts,
/// UTC, and text compared as the other backends compare it.
const SESSION_SETUP: [&str; 2] = [
    "SET SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'",
    "SET time_zone = '+00:00', NAMES utf8mb4",
];

#[derive(Debug, Clone)]
pub struct MysqlConsolidated {
    opts: Opts,
}

impl MysqlConsolidated {
    /// A consolidated database at a `mysql://user:password@host:port/database` URL.
    pub fn new(url: &str) -> Result<MysqlConsolidated, DbError> {
        let (url, ssl) = tls::take_ssl_options(url)?;
        // The URL may hold a password: the error names the problem, never the URL.
        let opts = Opts::from_url(&url)
            .map_err(|error| DbError::Invalid(format!("the mysql URL does not parse: {error}")))?;
        let mut builder = OptsBuilder::from_opts(opts);
        if ssl.is_some() {
            builder = builder.ssl_opts(ssl);
        }
        let opts = builder
            .init(SESSION_SETUP.to_vec())
            // An update's count is of the rows it matched, as on the other backends.
            .client_found_rows(true)
            .into();
        Ok(MysqlConsolidated { opts })
    }
}

impl Consolidated for MysqlConsolidated {
    type Connection = MysqlConnection;

    async fn connect(&self) -> Result<MysqlConnection, DbError> {
        let tls = self.opts.ssl_opts().is_some();
        let connection = Conn::new(self.opts.clone())
            .await
            .map_err(|error| tls::connect_failure(error, tls))?;
        Ok(MysqlConnection {
            opts: self.opts.clone(),
            connection,
            cache: ScriptCache::default(),
            stamping: HashMap::new(),
            sync_marked: false,
        })
    }
}

pub struct MysqlConnection {
    /// For the connection `canceller` opens.
    opts: Opts,
    connection: Conn,
    cache: ScriptCache,
    /// Each synchronized table's primary key, for the stamper (see `stamp`).
    stamping: HashMap<String, stamp::StampedTable>,
    /// Whether `@rs_sync` may still be set from a sync that did not commit: it must not
    /// mark what other work on this connection writes.
    sync_marked: bool,
}

impl MysqlConnection {
    /// The driver's connection, for tools and tests that run their own SQL.
    pub fn connection(&mut self) -> &mut Conn {
        &mut self.connection
    }

    async fn clear_sync_mark(&mut self) -> Result<(), DbError> {
        if self.sync_marked {
            self.connection
                .query_drop("SET @rs_sync = NULL")
                .await
                .map_err(db)?;
            self.sync_marked = false;
        }
        Ok(())
    }

    /// Every synchronized table with its primary key, looked up once per table.
    async fn stamped_tables(&mut self) -> Result<Vec<stamp::StampedTable>, DbError> {
        let tables: Vec<String> = self
            .connection
            .query("SELECT table_name FROM rs_table ORDER BY table_name")
            .await
            .map_err(db)?;
        let mut statements = Vec::with_capacity(tables.len());
        for table in tables {
            if !self.stamping.contains_key(&table) {
                let Some((shape, infos)) =
                    schema::table_shape(&mut self.connection, &table).await?
                else {
                    continue;
                };
                let stamped = stamp::StampedTable {
                    table: table.clone(),
                    key_columns: shape.key_columns,
                    keep_auto_updated: schema::keep_auto_updated(&infos),
                };
                self.stamping.insert(table.clone(), stamped);
            }
            statements.push(self.stamping[&table].clone());
        }
        Ok(statements)
    }
}

impl ConsolidatedConnection for MysqlConnection {
    async fn install_system_tables(&mut self) -> Result<(), DbError> {
        schema::install_system_tables(&mut self.connection).await?;
        held::install(&mut self.connection).await?;
        users::session_keys(&mut self.connection, &crate::new_session_secret()).await?;
        Ok(())
    }

    async fn hold_transfer(
        &mut self,
        direction: crate::Direction,
        held: &crate::HeldTransfer,
        bytes: &[u8],
        bounds: impl Into<crate::HoldBounds> + Send,
    ) -> Result<bool, DbError> {
        crate::held::hold(&mut self.connection, direction, held, bytes, bounds.into()).await
    }

    async fn held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<Option<crate::HeldTransfer>, DbError> {
        crate::held::held(&mut self.connection, direction, client_id, transfer_id).await
    }

    async fn held_transfer_client(
        &mut self,
        direction: crate::Direction,
        transfer_id: &str,
    ) -> Result<Option<String>, DbError> {
        crate::held::held_client(&mut self.connection, direction, transfer_id).await
    }

    async fn held_transfer_bytes(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
        length: u64,
    ) -> Result<Vec<u8>, DbError> {
        crate::held::held_bytes(
            &mut self.connection,
            direction,
            client_id,
            transfer_id,
            length,
        )
        .await
    }

    async fn release_held_transfer(
        &mut self,
        direction: crate::Direction,
        client_id: &str,
        transfer_id: &str,
    ) -> Result<bool, DbError> {
        crate::held::release(&mut self.connection, direction, client_id, transfer_id).await
    }

    async fn expire_held_transfers(
        &mut self,
        direction: crate::Direction,
        created_before_unix_ms: i64,
    ) -> Result<u64, DbError> {
        crate::held::expire(&mut self.connection, direction, created_before_unix_ms).await
    }

    async fn set_user(&mut self, name: &str, password_hash: &str) -> Result<(), DbError> {
        schema::set_user(&mut self.connection, name, password_hash).await
    }

    async fn append_sync_history(
        &mut self,
        records: &[crate::HistoryRecord],
        rows_max: u64,
    ) -> Result<(), DbError> {
        schema::append_sync_history(&mut self.connection, records, rows_max).await
    }

    async fn sync_history(&mut self, limit: u64) -> Result<Vec<crate::HistoryRecord>, DbError> {
        schema::sync_history(&mut self.connection, limit).await
    }

    async fn users(&mut self) -> Result<Vec<UserEntry>, DbError> {
        users::users(&mut self.connection).await
    }

    async fn remove_user(&mut self, name: &str) -> Result<bool, DbError> {
        users::remove_user(&mut self.connection, name).await
    }

    async fn set_user_disabled(&mut self, name: &str, disabled: bool) -> Result<bool, DbError> {
        users::set_user_disabled(&mut self.connection, name, disabled).await
    }

    async fn user_disabled(&mut self, name: &str) -> Result<bool, DbError> {
        users::user_disabled(&mut self.connection, name).await
    }

    async fn session_keys(&mut self, new_secret: &str) -> Result<Vec<SessionKey>, DbError> {
        users::session_keys(&mut self.connection, new_secret).await
    }

    async fn farm_servers(
        &mut self,
        server_id: &str,
        now_unix_ms: i64,
        alive_since_unix_ms: i64,
    ) -> Result<u64, DbError> {
        users::farm_servers(
            &mut self.connection,
            server_id,
            now_unix_ms,
            alive_since_unix_ms,
        )
        .await
    }

    async fn share_login_failures(
        &mut self,
        server_id: &str,
        own: &[LoginFailures],
        since_unix_ms: i64,
    ) -> Result<Vec<LoginFailures>, DbError> {
        users::share_login_failures(&mut self.connection, server_id, own, since_unix_ms).await
    }

    async fn password_hash(&mut self, name: &str) -> Result<Option<String>, DbError> {
        schema::password_hash(&mut self.connection, name).await
    }

    async fn init_key_ranges(&mut self, init: &KeyRangeInit) -> Result<KeySpace, DbError> {
        key_space::init_key_ranges(&mut self.connection, init).await
    }

    async fn ping(&mut self) -> Result<(), DbError> {
        self.connection.ping().await.map_err(db)
    }

    async fn init_table(&mut self, init: &TableInit) -> Result<InitOutcome, DbError> {
        schema::init_table(&mut self.connection, init, None).await
    }

    async fn client_columns(&mut self, table: &str) -> Result<Option<crate::ClientTable>, DbError> {
        schema::client_columns(&mut self.connection, table).await
    }

    async fn index_columns(&mut self, table: &str) -> Result<Vec<Vec<String>>, DbError> {
        let rows: Vec<(String, String)> = self
            .connection
            .exec(
                "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY INDEX_NAME, SEQ_IN_INDEX",
                (table,),
            )
            .await
            .map_err(db)?;
        Ok(crate::shape::columns_by_index(rows))
    }

    async fn init_rule_table(
        &mut self,
        init: &TableInit,
        rules: &crate::rules::RuleSet,
    ) -> Result<InitOutcome, DbError> {
        schema::init_table(&mut self.connection, init, Some(rules)).await
    }

    async fn run_sync_transaction(
        &mut self,
        request: Arc<SyncRequest>,
        download: DownloadSender,
    ) -> Result<SyncOutcome, SyncError> {
        self.clear_sync_mark().await?;
        let scripts = events::scripts_for(
            &mut self.connection,
            &mut self.cache,
            &request.script_version,
        )
        .await?;
        crate::driver::sync_with_retries(self, &scripts, &request, &download).await
    }

    async fn authenticate(&mut self, request: &AuthRequest) -> Result<AuthCheck, SyncError> {
        self.clear_sync_mark().await?;
        events::authenticate(&mut self.connection, &mut self.cache, request).await
    }

    async fn acknowledge_download(
        &mut self,
        request: &DownloadAckRequest,
    ) -> Result<bool, SyncError> {
        self.clear_sync_mark().await?;
        events::acknowledge_download(&mut self.connection, &mut self.cache, request).await
    }

    async fn scripts(&mut self, script_version: Option<&str>) -> Result<Vec<ScriptEntry>, DbError> {
        schema::scripts(&mut self.connection, script_version).await
    }

    async fn set_script(&mut self, entry: &ScriptEntry) -> Result<(), DbError> {
        schema::set_script(&mut self.connection, entry).await
    }

    async fn remove_script(
        &mut self,
        script_version: &str,
        table: &str,
        event: &str,
    ) -> Result<bool, DbError> {
        schema::remove_script(&mut self.connection, script_version, table, event).await
    }

    async fn add_script_version(&mut self, name: &str, description: &str) -> Result<(), DbError> {
        schema::add_script_version(&mut self.connection, name, description).await
    }

    async fn script_versions(&mut self) -> Result<Vec<(String, String)>, DbError> {
        schema::script_versions(&mut self.connection).await
    }

    fn canceller(&self) -> crate::Canceller {
        crate::Canceller::new(KillQuery {
            opts: self.opts.clone(),
            connection_id: self.connection.id(),
        })
    }

    async fn cleanup(&mut self) -> Result<u64, DbError> {
        schema::cleanup(&mut self.connection).await
    }

    async fn execute_sql(&mut self, sql: &str) -> Result<(), DbError> {
        self.connection.query_drop(sql).await.map_err(db)
    }

    async fn query_sql(&mut self, sql: &str) -> Result<Vec<Row>, DbError> {
        let rows: Vec<mysql_async::Row> = self.connection.query(sql).await.map_err(db)?;
        rows.into_iter()
            .map(|row| value::read_row(row).map_err(DbError::Invalid))
            .collect()
    }
}

/// MySQL's `KILL QUERY`, on a connection of its own.
struct KillQuery {
    opts: Opts,
    connection_id: u32,
}

impl crate::cancel::CancelStatement for KillQuery {
    fn cancel(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DbError>> + Send + '_>> {
        Box::pin(async move {
            let mut killer = Conn::new(self.opts.clone()).await.map_err(db)?;
            killer
                .query_drop(format!("KILL QUERY {}", self.connection_id))
                .await
                .map_err(db)?;
            killer.disconnect().await.map_err(db)
        })
    }
}
