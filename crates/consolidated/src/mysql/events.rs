//! Script versions and connection events on MySQL: loading (and caching) a version's
//! scripts, `begin_connection`, `authenticate_user` and `download_ack`, each of which
//! runs outside a sync's transaction.

use std::sync::Arc;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, TxOpts};
use rowsync_protocol::Value;

use super::error::db;
use super::query::run_script;
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::types::{refused_acknowledgement, AuthCheck, AuthRequest, DownloadAckRequest};
use crate::version_scripts::{single_integer, ScriptCache, ScriptRows, Scripts};
use crate::SyncError;

/// The scripts of `version`, from the cache unless they changed; runs `begin_connection`
/// the first time this connection serves the version.
pub async fn scripts_for(
    connection: &mut Conn,
    cache: &mut ScriptCache,
    version: &str,
) -> Result<Arc<Scripts>, SyncError> {
    let revision: i64 = connection
        .exec_first(
            "SELECT revision FROM rs_script_version WHERE name = ?",
            (version,),
        )
        .await
        .map_err(db)?
        .ok_or_else(|| SyncError::UnknownScriptVersion(version.to_string()))?;
    let scripts = match cache.get(version, revision) {
        Some(scripts) => scripts,
        None => {
            let rows: Vec<(String, String, String)> = connection
                .exec(
                    "SELECT table_name, event, script FROM rs_script WHERE script_version = ?",
                    (version,),
                )
                .await
                .map_err(db)?;
            cache.insert(
                version,
                revision,
                Scripts::new(
                    version,
                    rows.into_iter()
                        .map(|(table, event, script)| ((table, event), script)),
                ),
            )
        }
    };
    if !cache.is_connected(version) {
        let parameters = Parameters::for_connection(version);
        run_event(connection, &scripts, BEGIN_CONNECTION, &parameters).await?;
        cache.mark_connected(version);
    }
    Ok(scripts)
}

/// Runs a connection event's script if the version has one; returns what it selected.
pub async fn run_event(
    connection: &mut impl Queryable,
    scripts: &Scripts,
    event: &str,
    parameters: &Parameters<'_>,
) -> Result<Option<ScriptRows>, SyncError> {
    run_query_script(connection, scripts, "", event, parameters).await
}

/// Runs the script of `table` and `event` (table "" for a connection event) if the version
/// has one; returns what it selected.
pub async fn run_query_script(
    connection: &mut impl Queryable,
    scripts: &Scripts,
    table: &str,
    event: &str,
    parameters: &Parameters<'_>,
) -> Result<Option<ScriptRows>, SyncError> {
    let Some(script) = scripts.get(table, event) else {
        return Ok(None);
    };
    let (rows, _) = run_script(connection, script, parameters, None, table, event).await?;
    Ok(Some(rows))
}

pub async fn authenticate(
    connection: &mut Conn,
    cache: &mut ScriptCache,
    request: &AuthRequest,
) -> Result<AuthCheck, SyncError> {
    let scripts = scripts_for(connection, cache, &request.script_version).await?;
    if scripts.connection_event(AUTHENTICATE_USER).is_none() {
        return Ok(AuthCheck::BuiltIn(
            super::schema::password_hash(connection, &request.user).await?,
        ));
    }
    let parameters = request
        .parameters()
        .with(vec![("password", Value::Text(request.password.clone()))]);
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    let rows = run_event(&mut transaction, &scripts, AUTHENTICATE_USER, &parameters).await?;
    let status = single_integer(rows, AUTHENTICATE_USER)?.ok_or_else(|| {
        SyncError::script(
            AUTHENTICATE_USER,
            "",
            "the script returned no row; it must select a status (1000 valid, 3000 invalid)",
        )
    })?;
    transaction.commit().await.map_err(db)?;
    Ok(AuthCheck::Script(status))
}

pub async fn acknowledge_download(
    connection: &mut Conn,
    cache: &mut ScriptCache,
    request: &DownloadAckRequest,
) -> Result<bool, SyncError> {
    let scripts = scripts_for(connection, cache, &request.script_version).await?;
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            "UPDATE rs_subscription SET download_acknowledged = GREATEST(download_acknowledged, ?)
             WHERE client_id = ? AND user_name = ? AND download_watermark = ?",
            (
                request.watermark,
                &request.client_id,
                &request.user,
                request.watermark,
            ),
        )
        .await
        .map_err(db)?;
    if transaction.affected_rows() == 0 {
        // The update matched nothing; found rows already at the value count as matched
        // only with CLIENT_FOUND_ROWS, which rowsync sets (see `mod.rs`).
        let owner: Option<String> = transaction
            .exec_first(
                "SELECT user_name FROM rs_subscription WHERE client_id = ?",
                (&request.client_id,),
            )
            .await
            .map_err(db)?;
        return refused_acknowledgement(request, owner);
    }
    let parameters = request
        .parameters()
        .with(vec![("watermark", Value::Int(request.watermark))]);
    run_event(&mut transaction, &scripts, DOWNLOAD_ACK, &parameters).await?;
    transaction.commit().await.map_err(db)?;
    Ok(true)
}
