//! Script versions and connection events on PostgreSQL: loading (and caching) a
//! version's scripts, `begin_connection`, `authenticate_user` and `download_ack`, each
//! of which runs outside a sync's transaction, and running any event's script.

use std::sync::Arc;

use rowsync_protocol::Value;
use tokio_postgres::{Client, GenericClient};

use super::error::script_failure;
use super::query::{bind_script, query_rows};
use super::statements::Statements;
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::types::refused_acknowledgement;
use crate::types::{AuthCheck, AuthRequest, DownloadAckRequest};
use crate::version_scripts::{single_integer, ScriptCache, ScriptRows, Scripts};
use crate::SyncError;

/// The scripts of `version`, from the cache unless they changed; runs `begin_connection`
/// the first time this connection serves the version.
pub async fn scripts_for(
    client: &Client,
    statements: &Statements,
    cache: &mut ScriptCache,
    version: &str,
) -> Result<Arc<Scripts>, SyncError> {
    Ok(scripts_and_revision(client, statements, cache, version)
        .await?
        .0)
}

/// Reads a version's current revision (bumped by any change of its scripts).
pub const SCRIPT_REVISION_QUERY: &str = "SELECT revision FROM rs_script_version WHERE name = $1";

/// As [`scripts_for`], with the revision the scripts are of.
pub async fn scripts_and_revision(
    client: &Client,
    statements: &Statements,
    cache: &mut ScriptCache,
    version: &str,
) -> Result<(Arc<Scripts>, i64), SyncError> {
    let revision: i64 = client
        .query_opt(
            &statements.prepare(client, SCRIPT_REVISION_QUERY).await?,
            &[&version],
        )
        .await?
        .map(|row| row.get(0))
        .ok_or_else(|| SyncError::UnknownScriptVersion(version.to_string()))?;
    let scripts = match cache.get(version, revision) {
        Some(scripts) => scripts,
        None => {
            // Statements prepared for the previous revision's scripts are done with.
            statements.clear();
            let rows = client
                .query(
                    "SELECT table_name, event, script FROM rs_script WHERE script_version = $1",
                    &[&version],
                )
                .await?;
            cache.insert(
                version,
                revision,
                Scripts::new(
                    version,
                    rows.into_iter()
                        .map(|row| ((row.get(0), row.get(1)), row.get(2))),
                ),
            )
        }
    };
    if !cache.is_connected(version) {
        let parameters = Parameters::for_connection(version);
        run_event(client, statements, &scripts, BEGIN_CONNECTION, &parameters).await?;
        cache.mark_connected(version);
    }
    Ok((scripts, revision))
}

/// Runs a connection event's script if the version has one; returns what it selected.
pub async fn run_event(
    client: &impl GenericClient,
    statements: &Statements,
    scripts: &Scripts,
    event: &str,
    parameters: &Parameters<'_>,
) -> Result<Option<ScriptRows>, SyncError> {
    run_query_script(client, statements, scripts, "", event, parameters).await
}

/// Runs the script of `table` and `event` (table "" for a connection event) if the version
/// has one; returns what it selected.
pub async fn run_query_script(
    client: &impl GenericClient,
    statements: &Statements,
    scripts: &Scripts,
    table: &str,
    event: &str,
    parameters: &Parameters<'_>,
) -> Result<Option<ScriptRows>, SyncError> {
    let Some(script) = scripts.get(table, event) else {
        return Ok(None);
    };
    let (sql, values) = bind_script(script, parameters, table, event)?;
    query_rows(client, statements, &sql, &values)
        .await
        .map(Some)
        .map_err(|error| script_failure(event, table, error))
}

/// `authenticate_user` in its own committed transaction, or the stored password hash
/// when the version has no such script.
pub async fn authenticate(
    client: &mut Client,
    statements: &Statements,
    cache: &mut ScriptCache,
    request: &AuthRequest,
) -> Result<AuthCheck, SyncError> {
    let scripts = scripts_for(client, statements, cache, &request.script_version).await?;
    if scripts.connection_event(AUTHENTICATE_USER).is_none() {
        let hash = client
            .query_opt(super::users::PASSWORD_HASH, &[&request.user])
            .await?
            .map(|row| row.get(0));
        return Ok(AuthCheck::BuiltIn(hash));
    }
    let parameters = request
        .parameters()
        .with(vec![("password", Value::Text(request.password.clone()))]);
    let transaction = client.transaction().await?;
    let rows = run_event(
        &transaction,
        statements,
        &scripts,
        AUTHENTICATE_USER,
        &parameters,
    )
    .await?;
    let status = single_integer(rows, AUTHENTICATE_USER)?.ok_or_else(|| {
        SyncError::script(
            AUTHENTICATE_USER,
            "",
            "the script returned no row; it must select a status (1000 valid, 3000 invalid)",
        )
    })?;
    transaction.commit().await?;
    Ok(AuthCheck::Script(status))
}

/// The client applied the download that ended with `request.watermark`: record it as
/// acknowledged and run `download_ack`, in one transaction. Returns false (and does
/// nothing) when the watermark is not the one last sent to this client.
pub async fn acknowledge_download(
    client: &mut Client,
    statements: &Statements,
    cache: &mut ScriptCache,
    request: &DownloadAckRequest,
) -> Result<bool, SyncError> {
    let scripts = scripts_for(client, statements, cache, &request.script_version).await?;
    let transaction = client.transaction().await?;
    transaction
        .execute(
            "SELECT pg_advisory_xact_lock(7262, hashtext($1))",
            &[&request.client_id],
        )
        .await?;
    let updated = transaction
        .execute(
            "UPDATE rs_subscription SET download_acknowledged = greatest(download_acknowledged, $3)
             WHERE client_id = $1 AND user_name = $2 AND download_watermark = $3",
            &[&request.client_id, &request.user, &request.watermark],
        )
        .await?;
    if updated == 0 {
        let owner: Option<String> = transaction
            .query_opt(
                "SELECT user_name FROM rs_subscription WHERE client_id = $1",
                &[&request.client_id],
            )
            .await?
            .map(|row| row.get(0));
        return refused_acknowledgement(request, owner);
    }
    let parameters = request
        .parameters()
        .with(vec![("watermark", Value::Int(request.watermark))]);
    run_event(
        &transaction,
        statements,
        &scripts,
        DOWNLOAD_ACK,
        &parameters,
    )
    .await?;
    transaction.commit().await?;
    Ok(true)
}
