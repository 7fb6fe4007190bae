//! Script versions and connection events on SQLite: loading (and caching) a version's
//! scripts, `begin_connection`, `authenticate_user`, `download_ack` and `report_error`,
//! each of which runs outside the sync's own transaction. Also row scripts.

use std::sync::Arc;

use rowsync_protocol::{Row, Value};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::sync::script_failure;
use crate::plan::{
    describe_key, error_parameters, positional_parameters_with, single_integer, Parameters,
    RowImages, ScriptCache, ScriptRows, Scripts, UploadedRow,
};
use crate::scripts::*;
use crate::types::{AuthCheck, AuthRequest, DownloadAckRequest};
use crate::{SyncError, SyncRequest};

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

/// Runs `sql` with its named parameters (dotted names included) bound by position;
/// returns what it selected.
pub fn run_bound(
    connection: &Connection,
    sql: &str,
    parameters: &Parameters,
    row: Option<&RowImages>,
    table: &str,
    event: &str,
) -> Result<(ScriptRows, usize), SyncError> {
    let (sql, names) = positional_parameters_with(sql, '?');
    let mut statement = connection
        .prepare_cached(&sql)
        .map_err(|error| script_failure(event, table, error))?;
    for (index, name) in names.iter().enumerate() {
        let value = parameters.value_for_row(name, row, table, event)?;
        statement
            .raw_bind_parameter(index + 1, value)
            .map_err(|error| script_failure(event, table, error))?;
    }
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    if columns.is_empty() {
        let changed = statement
            .raw_execute()
            .map_err(|error| script_failure(event, table, error))?;
        return Ok(((columns, Vec::new()), changed));
    }
    let width = columns.len();
    let mut rows = Vec::new();
    let mut cursor = statement.raw_query();
    while let Some(row) = cursor
        .next()
        .map_err(|error| script_failure(event, table, error))?
    {
        rows.push(
            (0..width)
                .map(|index| row.get::<_, Value>(index))
                .collect::<Result<Row, _>>()
                .map_err(|error| script_failure(event, table, error))?,
        );
    }
    Ok(((columns, rows), 0))
}

pub fn run_event(
    connection: &Connection,
    scripts: &Scripts,
    event: &str,
    parameters: &Parameters,
) -> Result<Option<ScriptRows>, SyncError> {
    let Some(script) = scripts.connection_event(event) else {
        return Ok(None);
    };
    Ok(Some(
        run_bound(connection, script, parameters, None, "", event)?.0,
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
        return Ok(false);
    }
    let parameters = request
        .parameters()
        .with(vec![("watermark", Value::Int(request.watermark))]);
    run_event(&transaction, &scripts, DOWNLOAD_ACK, &parameters)?;
    transaction.commit()?;
    Ok(true)
}

pub fn report_error(
    connection: &mut Connection,
    scripts: &Scripts,
    request: &SyncRequest,
    error: &SyncError,
) -> Result<(), SyncError> {
    if scripts.connection_event(REPORT_ERROR).is_none() {
        return Ok(());
    }
    let parameters = Parameters::for_request(request)?.with(error_parameters(error));
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    run_event(&transaction, scripts, REPORT_ERROR, &parameters)?;
    transaction.commit()?;
    Ok(())
}

/// Rows a row script changed nothing for, and rows `handle_error` skipped.
pub struct RowsApplied {
    pub unchanged: Vec<usize>,
    pub skipped: Vec<usize>,
}

/// Runs a row script once per row. A failing statement changes nothing (SQLite undoes
/// it alone); `handle_error` then decides whether to skip the row or roll back.
#[allow(clippy::too_many_arguments)]
pub fn run_row_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    script: &str,
    columns: &[String],
    key_positions: &[usize],
    rows: &[UploadedRow],
    parameters: &Parameters,
) -> Result<RowsApplied, SyncError> {
    let mut applied = RowsApplied {
        unchanged: Vec::new(),
        skipped: Vec::new(),
    };
    for (index, row) in rows.iter().enumerate() {
        let images = row.images(columns);
        match run_bound(connection, script, parameters, Some(&images), table, event) {
            Ok((_, 0)) => applied.unchanged.push(index),
            Ok(_) => {}
            Err(error) => {
                let error = error.with_row_key(describe_key(&row.key(key_positions)));
                if !skip_row(connection, scripts, parameters, &error)? {
                    return Err(error);
                }
                applied.skipped.push(index);
            }
        }
    }
    Ok(applied)
}

fn skip_row(
    connection: &Connection,
    scripts: &Scripts,
    parameters: &Parameters,
    error: &SyncError,
) -> Result<bool, SyncError> {
    if !matches!(error, SyncError::Script { .. }) {
        return Ok(false);
    }
    let parameters = parameters.with(error_parameters(error));
    let rows = run_event(connection, scripts, HANDLE_ERROR, &parameters)?;
    let action = single_integer(rows, HANDLE_ERROR)?.unwrap_or(ERROR_ACTION_ROLLBACK);
    Ok(action == ERROR_ACTION_SKIP_ROW)
}
