//! One sync against SQLite, in one `BEGIN IMMEDIATE` transaction:
//! check the script version and the client's subscription, apply each table's upload
//! with set scripts over staging tables (unless this upload sequence was applied
//! before), detect conflicts set-wise, fetch the download, record progress, commit.

use std::collections::HashMap;

use rowsync_protocol::{Row, SyncSummary, TableUpload, Value};
use rusqlite::{params, Connection, OptionalExtension, Statement, TransactionBehavior};

use super::schema::table_shape;
use crate::names::{column_list, key_match};
use crate::plan::{
    applied_sequence, validate_upload_shape, DownloadFilter, Parameters, Resolution, ScriptRows,
    Scripts, TableShape,
};
use crate::scripts::*;
use crate::{
    quote_identifier as q, DownloadSender, SyncError, SyncOutcome, SyncRequest, DOWNLOAD_BATCH_ROWS,
};

pub fn synchronize(
    connection: &mut Connection,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, SyncError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let scripts = load_scripts(&transaction, &request.script_version)?;
    let subscription: Option<(String, i64)> = transaction
        .query_row(
            "SELECT user_name, upload_sequence FROM rs_subscription WHERE client_id = ?1",
            [&request.client_id],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let applied_sequence = applied_sequence(request, subscription)?;
    let parameters = Parameters::for_request(request)?;
    let upload_sequence = parameters.upload_sequence;
    let upload_already_applied = upload_sequence <= applied_sequence;
    let mut resolutions: HashMap<&str, Resolution> = HashMap::new();
    let mut conflicts = 0;
    // An upload applied before is not applied again, but its conflicts are found again
    // (by comparing it with the table), so a client whose previous reply was lost still
    // receives the server's rows for them.
    {
        for upload in &request.tables {
            let resolution = apply_table(
                &transaction,
                &scripts,
                upload,
                &parameters,
                !upload_already_applied,
            )?;
            // Conflicts are counted when an upload is applied; a resend only
            // delivers their resolution again.
            if !upload_already_applied {
                conflicts += resolution.conflict_count;
            }
            resolutions.insert(&upload.table, resolution);
        }
    }
    let watermark: i64 =
        transaction.query_row("SELECT version FROM rs_clock WHERE id = 1", [], |row| {
            row.get(0)
        })?;
    let mut download_rows = 0;
    for table in scripts.download_tables() {
        download_rows += stream_download(
            &transaction,
            &scripts,
            table,
            &parameters,
            resolutions.get(table),
            download,
        )?;
    }
    transaction.execute(
        "INSERT INTO rs_subscription (client_id, user_name, script_version, upload_sequence, download_watermark,
             download_acknowledged, last_sync_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, CURRENT_TIMESTAMP)
         ON CONFLICT (client_id) DO UPDATE SET
             script_version = excluded.script_version,
             upload_sequence = max(upload_sequence, excluded.upload_sequence),
             download_watermark = excluded.download_watermark,
             download_acknowledged = max(download_acknowledged, excluded.download_acknowledged),
             last_sync_at = excluded.last_sync_at",
        params![
            request.client_id,
            request.user,
            request.script_version,
            upload_sequence,
            watermark,
            request.last_download_watermark
        ],
    )?;
    // The server must hold the whole download before the upload is committed.
    download.blocking_finish()?;
    transaction.commit()?;
    Ok(SyncOutcome {
        download_rows,
        watermark,
        summary: SyncSummary {
            rows_uploaded: request.upload_operation_count(),
            conflicts,
            upload_already_applied,
        },
    })
}

fn load_scripts(connection: &Connection, version: &str) -> Result<Scripts, SyncError> {
    let exists: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM rs_script_version WHERE name = ?1)",
        [version],
        |row| row.get(0),
    )?;
    if !exists {
        return Err(SyncError::UnknownScriptVersion(version.to_string()));
    }
    let mut statement = connection
        .prepare("SELECT table_name, event, script FROM rs_script WHERE script_version = ?1")?;
    let rows = statement
        .query_map([version], |row| {
            Ok(((row.get(0)?, row.get(1)?), row.get(2)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Scripts::new(version, rows))
}

/// Applies one table's upload with its set scripts (`apply`), or only finds which of its
/// operations the table does not reflect (`!apply`, for an upload applied before), and
/// resolves those server-wins.
fn apply_table(
    connection: &Connection,
    scripts: &Scripts,
    upload: &TableUpload,
    parameters: &Parameters,
    apply: bool,
) -> Result<Resolution, SyncError> {
    let table = upload.table.as_str();
    scripts.check_synchronizes(table)?;
    let shape = table_shape(connection, table)?.ok_or_else(|| {
        SyncError::Schema(format!(
            "table {table:?} does not exist in the consolidated database"
        ))
    })?;
    let key_positions = validate_upload_shape(upload, &shape)?;
    let partition_column: Option<String> = connection
        .query_row(
            "SELECT partition_column FROM rs_table WHERE table_name = ?1",
            [table],
            |row| row.get(0),
        )
        .optional()?;
    let landed = Landed {
        partition_column: partition_column.as_deref(),
        user: parameters.user,
    };
    let mut resolution = Resolution::default();
    let mut conflict_keys: Vec<Row> = Vec::new();

    // Each kind is staged, its script run (unless only reconciling), then compared.
    let stage_and_run = |kind: &str,
                         columns: &[String],
                         with_old_image: bool,
                         rows: &mut dyn Iterator<Item = Vec<&Value>>,
                         event: &str|
     -> Result<(Stage, usize), SyncError> {
        let stage = Stage::create(connection, kind, &shape, columns, with_old_image)?;
        stage.load(connection, rows)?;
        let changed = if apply {
            run_script(connection, scripts, table, event, &stage.name, parameters)?
        } else {
            0
        };
        Ok((stage, changed))
    };
    if !upload.inserts.is_empty() {
        let mut rows = upload.inserts.iter().map(|row| row.iter().collect());
        let (stage, changed) =
            stage_and_run("insert", &upload.columns, false, &mut rows, UPLOAD_INSERT)?;
        if changed < upload.inserts.len() {
            conflict_keys.extend(stage.rows_not_matching_table(connection, &shape, &landed)?);
        }
    }
    if !upload.updates.is_empty() {
        let mut rows = upload
            .updates
            .iter()
            .map(|update| update.new.iter().chain(&update.old).collect());
        let (stage, changed) =
            stage_and_run("update", &upload.columns, true, &mut rows, UPLOAD_UPDATE)?;
        if changed < upload.updates.len() {
            conflict_keys.extend(stage.rows_not_matching_table(connection, &shape, &landed)?);
        }
    }
    if !upload.deletes.is_empty() {
        let mut rows = upload.deletes.iter().map(|row| row.iter().collect());
        let (stage, _) = stage_and_run(
            "delete",
            &upload.key_columns,
            false,
            &mut rows,
            UPLOAD_DELETE,
        )?;
        // Deleting a key already gone changes nothing and is fine: only keys still
        // present are conflicts, whatever the count.
        conflict_keys.extend(stage.keys_still_in_table(connection, &shape)?);
    }
    resolution.record_upload(upload, &key_positions);
    if !conflict_keys.is_empty() {
        resolve_conflicts(
            connection,
            scripts,
            &shape,
            conflict_keys,
            parameters,
            &mut resolution,
        )?;
    }
    Ok(resolution)
}

/// Where an uploaded row counts as landed: in the table and, when the table is
/// partitioned, in the uploading user's partition. An identical row in another
/// partition is not the client's, so its upload is a conflict (sent back as a delete).
struct Landed<'a> {
    partition_column: Option<&'a str>,
    user: &'a str,
}

/// A temporary table holding one kind of a table's staged upload.
struct Stage {
    name: String,
    columns: Vec<String>,
    key_columns: Vec<String>,
}

impl Stage {
    /// Creates (or empties) `temp.rs_stage_<kind>_<table>` with the upload's columns and
    /// the consolidated table's column affinities, so comparisons match the table's.
    fn create(
        connection: &Connection,
        kind: &str,
        shape: &TableShape,
        columns: &[String],
        with_old_image: bool,
    ) -> Result<Stage, SyncError> {
        let name = format!("temp.{}", q(&format!("rs_stage_{kind}_{}", shape.name)));
        let mut select: Vec<String> = columns.iter().map(|column| q(column)).collect();
        let mut staged_columns = columns.to_vec();
        if with_old_image {
            for column in columns {
                let old = format!("{OLD_IMAGE_PREFIX}{column}");
                select.push(format!("{} AS {}", q(column), q(&old)));
                staged_columns.push(old);
            }
        }
        connection.execute_batch(&format!(
            "DROP TABLE IF EXISTS {name}; CREATE TEMP TABLE {bare} AS SELECT {select} FROM main.{table} WHERE 0;",
            bare = q(&format!("rs_stage_{kind}_{}", shape.name)),
            select = select.join(", "),
            table = q(&shape.name),
        ))?;
        Ok(Stage {
            name,
            columns: staged_columns,
            key_columns: shape.key_columns.clone(),
        })
    }

    fn load(
        &self,
        connection: &Connection,
        rows: &mut dyn Iterator<Item = Vec<&Value>>,
    ) -> Result<(), SyncError> {
        let placeholders = vec!["?"; self.columns.len()].join(", ");
        let mut statement = connection.prepare(&format!(
            "INSERT INTO {} VALUES ({placeholders})",
            self.name
        ))?;
        for row in rows {
            statement.execute(rusqlite::params_from_iter(row))?;
        }
        Ok(())
    }

    fn select_keys(
        &self,
        connection: &Connection,
        condition: &str,
        parameters: &[&str],
    ) -> Result<Vec<Row>, SyncError> {
        let keys = column_list(&self.key_columns, "s.");
        let mut statement = connection.prepare(&format!(
            "SELECT {keys} FROM {} AS s WHERE {condition}",
            self.name
        ))?;
        let width = self.key_columns.len();
        let rows = statement
            .query_map(rusqlite::params_from_iter(parameters), |row| {
                (0..width)
                    .map(|i| row.get::<_, Value>(i))
                    .collect::<Result<Row, _>>()
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Staged rows whose new image is not what the table now holds (in the user's
    /// partition): not applied as sent.
    fn rows_not_matching_table(
        &self,
        connection: &Connection,
        shape: &TableShape,
        landed: &Landed,
    ) -> Result<Vec<Row>, SyncError> {
        let mut matches = self
            .columns
            .iter()
            .filter(|column| !column.starts_with(OLD_IMAGE_PREFIX))
            .map(|column| format!("t.{c} IS s.{c}", c = q(column)))
            .collect::<Vec<_>>();
        let mut parameters = Vec::new();
        if let Some(partition_column) = landed.partition_column {
            matches.push(format!("t.{} = ?1", q(partition_column)));
            parameters.push(landed.user);
        }
        self.select_keys(
            connection,
            &format!(
                "NOT EXISTS (SELECT 1 FROM main.{} AS t WHERE {})",
                q(&shape.name),
                matches.join(" AND ")
            ),
            &parameters,
        )
    }

    /// Staged delete keys whose row is still in the table: not deleted.
    fn keys_still_in_table(
        &self,
        connection: &Connection,
        shape: &TableShape,
    ) -> Result<Vec<Row>, SyncError> {
        let matches = key_match(&self.key_columns, "t", "s");
        self.select_keys(
            connection,
            &format!(
                "EXISTS (SELECT 1 FROM main.{} AS t WHERE {matches})",
                q(&shape.name)
            ),
            &[],
        )
    }
}

fn bind_parameters(
    statement: &mut Statement,
    parameters: &Parameters,
    table: &str,
    event: &str,
) -> Result<(), SyncError> {
    for index in 1..=statement.parameter_count() {
        let Some(name) = statement.parameter_name(index).map(str::to_owned) else {
            return Err(SyncError::Script {
                event: event.to_string(),
                table: table.to_string(),
                message: format!(
                    "parameter {index} has no name; scripts use named parameters such as :user"
                ),
            });
        };
        statement.raw_bind_parameter(index, parameters.value(&name, table, event)?)?;
    }
    Ok(())
}

fn prepare_script<'c>(
    connection: &'c Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters,
) -> Result<Statement<'c>, SyncError> {
    let sql = scripts.expand(table, event, substitutions)?;
    let mut statement = connection
        .prepare(&sql)
        .map_err(|error| script_failure(event, table, error))?;
    bind_parameters(&mut statement, parameters, table, event)?;
    Ok(statement)
}

fn script_failure(event: &str, table: &str, error: rusqlite::Error) -> SyncError {
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        message: error.to_string(),
    }
}

/// Runs a set script over a staging table; returns the rows it changed.
fn run_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    stage_name: &str,
    parameters: &Parameters,
) -> Result<usize, SyncError> {
    let mut statement = prepare_script(
        connection,
        scripts,
        table,
        event,
        &[(UPLOAD_PLACEHOLDER, stage_name)],
        parameters,
    )?;
    statement
        .raw_execute()
        .map_err(|error| script_failure(event, table, error))
}

/// Runs a query script and returns its column names and rows.
fn query_script(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters,
) -> Result<ScriptRows, SyncError> {
    let mut statement =
        prepare_script(connection, scripts, table, event, substitutions, parameters)?;
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let width = columns.len();
    let mut rows = Vec::new();
    let mut cursor = statement.raw_query();
    while let Some(row) = cursor
        .next()
        .map_err(|error| script_failure(event, table, error))?
    {
        let values = (0..width)
            .map(|index| row.get::<_, Value>(index))
            .collect::<Result<Row, _>>()
            .map_err(|error| script_failure(event, table, error))?;
        rows.push(values);
    }
    Ok((columns, rows))
}

/// Server wins: fetch the current row of each conflicting key within the client's
/// partition (`upload_fetch`); keys without one are sent as deletes.
fn resolve_conflicts(
    connection: &Connection,
    scripts: &Scripts,
    shape: &TableShape,
    conflict_keys: Vec<Row>,
    parameters: &Parameters,
    resolution: &mut Resolution,
) -> Result<(), SyncError> {
    let stage = Stage::create(connection, "keys", shape, &shape.key_columns, false)?;
    stage.load(
        connection,
        &mut conflict_keys.iter().map(|row| row.iter().collect()),
    )?;
    let (columns, rows) = query_script(
        connection,
        scripts,
        &shape.name,
        UPLOAD_FETCH,
        &[(KEYS_PLACEHOLDER, &stage.name)],
        parameters,
    )?;
    resolution.resolve(shape, conflict_keys, columns, rows)
}

/// Streams one table's download: the delete cursor, conflict deletes, the download
/// cursor, conflict upserts, each cursor read and sent `DOWNLOAD_BATCH_ROWS` at a time.
fn stream_download(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    parameters: &Parameters,
    resolution: Option<&Resolution>,
    download: &DownloadSender,
) -> Result<u64, SyncError> {
    let shape = table_shape(connection, table)?.ok_or_else(|| {
        SyncError::Schema(format!(
            "table {table:?} does not exist in the consolidated database"
        ))
    })?;
    let mut filter = DownloadFilter::new(&shape, resolution);
    if scripts.get(table, DOWNLOAD_DELETE_CURSOR).is_some() {
        for_each_batch(
            connection,
            scripts,
            table,
            DOWNLOAD_DELETE_CURSOR,
            parameters,
            |columns, keys| download.blocking_send(filter.deletes(columns, keys)?),
        )?;
    }
    download.blocking_send(filter.conflict_deletes())?;
    if scripts.get(table, DOWNLOAD_CURSOR).is_some() {
        for_each_batch(
            connection,
            scripts,
            table,
            DOWNLOAD_CURSOR,
            parameters,
            |columns, rows| download.blocking_send(filter.upserts(columns, rows)?),
        )?;
    }
    download.blocking_send(filter.conflict_upserts())?;
    Ok(filter.rows_sent)
}

/// Runs a query script and hands its rows over in batches.
fn for_each_batch(
    connection: &Connection,
    scripts: &Scripts,
    table: &str,
    event: &str,
    parameters: &Parameters,
    mut on_batch: impl FnMut(&[String], Vec<Row>) -> Result<(), SyncError>,
) -> Result<(), SyncError> {
    let mut statement = prepare_script(connection, scripts, table, event, &[], parameters)?;
    let columns: Vec<String> = statement.column_names().map(str::to_owned).collect();
    let width = columns.len();
    let mut batch = Vec::with_capacity(DOWNLOAD_BATCH_ROWS);
    let mut cursor = statement.raw_query();
    while let Some(row) = cursor
        .next()
        .map_err(|error| script_failure(event, table, error))?
    {
        let values = (0..width)
            .map(|index| row.get::<_, Value>(index))
            .collect::<Result<Row, _>>()
            .map_err(|error| script_failure(event, table, error))?;
        batch.push(values);
        if batch.len() == DOWNLOAD_BATCH_ROWS {
            on_batch(&columns, std::mem::take(&mut batch))?;
        }
    }
    on_batch(&columns, batch)
}
