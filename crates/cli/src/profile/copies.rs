//! N copies at once: a script in N transactions rolled back, or N whole syncs through
//! the backend's `run_sync_transaction`, started together and timed to the end of the last.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::{pin_mut, TryStreamExt};
use rowsync_consolidated::postgres::value::Bind;
use rowsync_consolidated::postgres::{describe_postgres, PostgresConnection};
use rowsync_consolidated::{
    download_channel, ConsolidatedConnection, DownloadMessage, SyncRequest,
};
use rowsync_protocol::Value;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use super::sampler::Gate;
use super::ProfileError;

/// How long a gated copy keeps its transaction open waiting to see the others (a
/// bound against a copy that never shows up, not a measurement).
pub const GATE_WAIT_MAX: Duration = Duration::from_secs(5);

/// One session that runs script copies.
pub struct Session {
    pub client: Client,
    pub pid: i32,
}

/// Connects a session the way a server's worker is set up (custom plans, no JIT).
pub async fn connect(url: &str) -> Result<Session, ProfileError> {
    let client = rowsync_consolidated::postgres::connect_client(url).await?;
    client
        .batch_execute("SET jit = off; SET plan_cache_mode = force_custom_plan")
        .await?;
    let pid = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    Ok(Session { client, pid })
}

/// What a batch of copies came to.
pub struct Batch {
    pub wall: Duration,
    pub errors: Vec<String>,
}

/// Runs `sql` once per entry of `values` at once, each in its own transaction rolled
/// back; with a `gate`, each keeps its transaction until it has seen the others.
pub async fn script_batch(
    sessions: &[Session],
    sql: &str,
    values: &[Vec<Value>],
    gate: Option<&Arc<Gate>>,
) -> Result<Batch, ProfileError> {
    let sessions = &sessions[..values.len()];
    let pids: Vec<i32> = sessions.iter().map(|session| session.pid).collect();
    let mut statements = Vec::new();
    for session in sessions {
        match session.client.prepare(sql).await {
            Ok(statement) => statements.push(statement),
            Err(error) => {
                return Ok(Batch {
                    wall: Duration::ZERO,
                    errors: vec![describe_postgres(&error)],
                })
            }
        }
        session.client.batch_execute("BEGIN").await?;
    }
    let start = Instant::now();
    let copies =
        sessions
            .iter()
            .zip(&statements)
            .zip(values)
            .map(|((session, statement), values)| {
                let pids = &pids;
                async move {
                    let result = run_statement(&session.client, statement, values).await;
                    let ended = Instant::now();
                    if let Some(gate) = gate {
                        gate.statement_done(session.pid);
                        let others: Vec<i32> = pids
                            .iter()
                            .copied()
                            .filter(|pid| *pid != session.pid)
                            .collect();
                        gate.pass(&others, GATE_WAIT_MAX).await;
                    }
                    let rolled_back = session.client.batch_execute("ROLLBACK").await;
                    (result, ended, rolled_back)
                }
            });
    let mut batch = Batch {
        wall: Duration::ZERO,
        errors: Vec::new(),
    };
    for (result, ended, rolled_back) in join_all(copies).await {
        batch.wall = batch.wall.max(ended.duration_since(start));
        rolled_back?;
        if let Err(error) = result {
            batch.errors.push(describe_postgres(&error));
        }
    }
    Ok(batch)
}

/// Runs a statement to its last row (counted, never kept).
async fn run_statement(
    client: &Client,
    statement: &tokio_postgres::Statement,
    values: &[Value],
) -> Result<u64, tokio_postgres::Error> {
    let binds: Vec<Bind<'_>> = values.iter().map(Bind).collect();
    let parameters = binds.iter().map(|bind| bind as &(dyn ToSql + Sync));
    let rows = client.query_raw(statement, parameters).await?;
    pin_mut!(rows);
    let mut count = 0;
    while rows.try_next().await?.is_some() {
        count += 1;
    }
    Ok(count)
}

/// What one sync of a batch did.
pub struct SyncResult {
    pub conflicts: u64,
}

/// Runs one whole sync per request at once, each on its own connection, draining
/// their downloads (counted, never kept).
pub async fn sync_batch(
    connections: &mut [PostgresConnection],
    requests: Vec<SyncRequest>,
) -> (Batch, Vec<Option<SyncResult>>) {
    let start = Instant::now();
    let copies = connections
        .iter_mut()
        .zip(requests)
        .map(|(connection, request)| async move {
            let (sender, mut receiver) = download_channel();
            let drain = async move {
                while let Some(message) = receiver.recv().await {
                    if let DownloadMessage::Finish(answer) = message {
                        let _ = answer.send(Ok(()));
                    }
                }
            };
            let (outcome, ()) = tokio::join!(
                connection.run_sync_transaction(Arc::new(request), sender),
                drain
            );
            (outcome, Instant::now())
        });
    let mut batch = Batch {
        wall: Duration::ZERO,
        errors: Vec::new(),
    };
    let mut results = Vec::new();
    for (outcome, ended) in join_all(copies).await {
        batch.wall = batch.wall.max(ended.duration_since(start));
        match outcome {
            Ok(outcome) => results.push(Some(SyncResult {
                conflicts: outcome.summary.conflicts,
            })),
            Err(error) => {
                batch.errors.push(error.to_string());
                results.push(None);
            }
        }
    }
    (batch, results)
}
