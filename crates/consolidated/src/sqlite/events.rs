//! Script versions and connection events on SQLite: loading (and caching) a version's
//! scripts, `begin_connection`, `authenticate_user` and `download_ack`, each of which
//! runs outside a sync's transaction, and running any event's script.

use std::sync::Arc;

use rowsync_protocol::Value;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::query::run_bound;
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::types::refused_acknowledgement;
use crate::types::{AuthCheck, AuthRequest, DownloadAckRequest};
use crate::version_scripts::{single_integer, ScriptCache, ScriptRows, Scripts};
use crate::SyncError;

pub fn scripts_for(
    connection: &Connection,
    cache: &mut ScriptCache,
    version: &str,
) -> Result<Arc<Scripts>, SyncError> {
    let revision: i64 = connection
        .query_row(
            "SELECT revision FROM rs_script_version WHERE name = ?1",
            [version],
            |row| row.get(0),
        )
        .optional()?
        .ok_or_else(|| SyncError::UnknownScriptVersion(version.to_string()))?;
    let scripts = match cache.get(version, revision) {
        Some(scripts) => scripts,
        None => {
            let mut statement = connection.prepare(
                "SELECT table_name, event, script FROM rs_script WHERE script_version = ?1",
            )?;
            let rows = statement
                .query_map([version], |row| {
                    Ok(((row.get(0)?, row.get(1)?), row.get(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            cache.insert(version, revision, Scripts::new(version, rows))
        }
    };
    if !cache.is_connected(version) {
        run_event(
            connection,
            &scripts,
            BEGIN_CONNECTION,
            &Parameters::for_connection(version),
        )?;
        cache.mark_connected(version);
    }
    Ok(scripts)
}

pub fn run_event(
    connection: &Connection,
    scripts: &Scripts,
    event: &str,
    parameters: &Parameters,
) -> Result<Option<ScriptRows>, SyncError> {
    run_query_script(connection, scripts, "", event, parameters)
}

/// Runs the script of `table` and `event` (table "" for a connection event) if the version
/// has one; returns what it selected.
pub fn run_query_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    parameters: &Parameters,
) -> Result<Option<ScriptRows>, SyncError> {
    let Some(script) = scripts.get(table, event) else {
        return Ok(None);
    };
    Ok(Some(
        run_bound(connection, script, parameters, None, table, event)?.0,
    ))
}

pub fn authenticate(
    connection: &mut Connection,
    cache: &mut ScriptCache,
    request: &AuthRequest,
) -> Result<AuthCheck, SyncError> {
    let scripts = scripts_for(connection, cache, &request.script_version)?;
    if scripts.connection_event(AUTHENTICATE_USER).is_none() {
        return Ok(AuthCheck::BuiltIn(super::schema::password_hash(
            connection,
            &request.user,
        )?));
    }
    let parameters = request
        .parameters()
        .with(vec![("password", Value::Text(request.password.clone()))]);
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let rows = run_event(&transaction, &scripts, AUTHENTICATE_USER, &parameters)?;
    let status = single_integer(rows, AUTHENTICATE_USER)?.ok_or_else(|| {
        SyncError::script(
            AUTHENTICATE_USER,
            "",
            "the script returned no row; it must select a status (1000 valid, 3000 invalid)",
        )
    })?;
    transaction.commit()?;
    Ok(AuthCheck::Script(status))
}

pub fn acknowledge_download(
    connection: &mut Connection,
    cache: &mut ScriptCache,
    request: &DownloadAckRequest,
) -> Result<bool, SyncError> {
    let scripts = scripts_for(connection, cache, &request.script_version)?;
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let updated = transaction.execute(
        "UPDATE rs_subscription SET download_acknowledged = max(download_acknowledged, ?3)
         WHERE client_id = ?1 AND user_name = ?2 AND download_watermark = ?3",
        rusqlite::params![request.client_id, request.user, request.watermark],
    )?;
    if updated == 0 {
        let owner: Option<String> = transaction
            .query_row(
                "SELECT user_name FROM rs_subscription WHERE client_id = ?1",
                [&request.client_id],
                |row| row.get(0),
            )
            .optional()?;
        return refused_acknowledgement(request, owner);
    }
    let parameters = request
        .parameters()
        .with(vec![("watermark", Value::Int(request.watermark))]);
    run_event(&transaction, &scripts, DOWNLOAD_ACK, &parameters)?;
    transaction.commit()?;
    Ok(true)
}
