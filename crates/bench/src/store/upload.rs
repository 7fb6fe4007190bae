//! The server a tracked single-threaded run syncs with: a SQLite consolidated database
//! in a temporary directory with the workload's tables, served in this process. After
//! each phase the client syncs; the time of that sync is the phase's upload.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_server::{auth, ServerConfig};

use rowsync_cli::local_server::LocalServer;

const USER: &str = "bench";
/// How long the bench waits on the server: a full-size upload applied by a debug build
/// on a busy machine takes minutes.
const SYNC_TIMEOUT: Duration = Duration::from_secs(3600);
const PASSWORD: &str = "bench-store-password";
/// The partition column every workload table has; its value is [`USER`].
pub const OWNER_COLUMN: &str = "owner";

pub struct UploadServer {
    server: LocalServer,
    options: SyncOptions,
    _directory: tempfile::TempDir,
}

impl UploadServer {
    /// A server whose consolidated database has `tables` (name, DDL), partitioned by
    /// [`OWNER_COLUMN`].
    pub async fn start(tables: &[(&str, &str)]) -> Result<UploadServer> {
        let directory = tempfile::tempdir().context("creating the server's directory")?;
        let path = directory.path().join("consolidated.db");
        let connection = rusqlite::Connection::open(&path)?;
        for (_, ddl) in tables {
            connection.execute_batch(ddl)?;
        }
        drop(connection);
        let backend = SqliteConsolidated::new(&path);
        let mut admin = backend.connect().await?;
        admin.install_system_tables().await?;
        for (table, _) in tables {
            admin
                .init_table(&TableInit::new(table, OWNER_COLUMN, "v1"))
                .await?;
        }
        let hash = auth::hash_password(PASSWORD).map_err(|error| anyhow::anyhow!("{error}"))?;
        admin.set_user(USER, &hash).await?;
        drop(admin);
        let server = LocalServer::start(backend, ServerConfig::default()).await?;
        let mut options = SyncOptions::new(format!("tcp://{}", server.address), USER, PASSWORD);
        options.timeout = SYNC_TIMEOUT;
        Ok(UploadServer {
            server,
            options,
            _directory: directory,
        })
    }

    /// Syncs `client` and returns how long it took; a conflict is an error (the
    /// client is the only writer).
    pub async fn sync(&self, client: &mut Client) -> Result<Duration> {
        let started = Instant::now();
        let report = client.sync(&self.options).await.context("bench sync")?;
        let elapsed = started.elapsed();
        if report.conflicts > 0 {
            bail!("the bench's sync met {} conflicts", report.conflicts);
        }
        Ok(elapsed)
    }

    pub async fn stop(self) -> Result<()> {
        self.server.stop().await
    }
}

/// Empties the change logs of `tables`, as a sync would, where a run has no server (the
/// next phase then starts from an empty log, as after a sync). The log's name is the
/// client's (docs/client.md §2).
pub fn discard_logs(client: &Client, tables: &[&str]) -> Result<()> {
    for table in tables {
        client
            .connection()
            .execute(&format!("DELETE FROM \"rs_log_{table}\""), [])?;
    }
    Ok(())
}
