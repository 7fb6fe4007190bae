//! One sync against SQLite, in one `BEGIN IMMEDIATE` transaction:
//! check the script version and the client's subscription, apply each table's upload
//! with set scripts over staging tables (unless this upload sequence was applied
//! before), detect conflicts set-wise, fetch the download, record progress, commit.

use std::collections::HashMap;

use rowsync_protocol::{Row, SyncSummary, TableUpload, Value};
use rusqlite::{params, Connection, OptionalExtension, Statement, TransactionBehavior};

use super::events::{run_bound, run_event, run_row_script};
use super::schema::table_shape;
use crate::names::{column_list, key_match};
use crate::plan::{
    applied_sequence, conflicting_rows, describe_key, image_layout, single_integer, uploaded_rows,
    validate_upload_shape, DownloadFilter, Parameters, Resolution, ScriptRows, Scripts, TableShape,
    UploadedRow,
};
use crate::scripts::*;
use crate::{
    quote_identifier as q, DownloadSender, SyncError, SyncOutcome, SyncRequest, DOWNLOAD_BATCH_ROWS,
};

pub fn synchronize(
    connection: &mut Connection,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, SyncError> {
    let started = std::time::Instant::now();
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
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
    run_event(&transaction, scripts, BEGIN_SYNCHRONIZATION, &parameters)?;
    if !upload_already_applied {
        run_event(&transaction, scripts, BEGIN_UPLOAD, &parameters)?;
    }
    // An upload applied before is not applied again, but its conflicts are found again
    // (by comparing it with the table), so a client whose previous reply was lost still
    // receives the server's rows for them.
    {
        for upload in &request.tables {
            let resolution = apply_table(
                &transaction,
                scripts,
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
    if !upload_already_applied {
        run_event(&transaction, scripts, END_UPLOAD, &parameters)?;
    }
    let apply_time = started.elapsed();
    let mut watermark: i64 =
        transaction.query_row("SELECT version FROM rs_clock WHERE id = 1", [], |row| {
            row.get(0)
        })?;
    let next = parameters.with(vec![("next_last_download", Value::Int(watermark))]);
    let modified = run_event(&transaction, scripts, MODIFY_NEXT_LAST_DOWNLOAD, &next)?;
    if let Some(modified) = single_integer(modified, MODIFY_NEXT_LAST_DOWNLOAD)? {
        watermark = modified;
    }
    run_event(&transaction, scripts, BEGIN_DOWNLOAD, &parameters)?;
    let mut download_rows = 0;
    for table in scripts.download_tables() {
        download_rows += stream_download(
            &transaction,
            scripts,
            table,
            &parameters,
            resolutions.get(table),
            download,
        )?;
    }
    run_event(&transaction, scripts, END_DOWNLOAD, &parameters)?;
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
    run_event(&transaction, scripts, END_SYNCHRONIZATION, &parameters)?;
    // The server must hold the whole download before the upload is committed.
    download.blocking_finish()?;
    transaction.commit()?;
    Ok(SyncOutcome {
        download_rows,
        watermark,
        apply_time,
        summary: SyncSummary {
            rows_uploaded: request.upload_operation_count(),
            conflicts,
            upload_already_applied,
        },
    })
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
    let (image_columns, image_keys) = image_layout(upload, &key_positions);
    let mut conflict_keys: Vec<Row> = Vec::new();
    for (event, kind, count) in [
        (UPLOAD_INSERT, "insert", upload.inserts.len()),
        (UPLOAD_UPDATE, "update", upload.updates.len()),
        (UPLOAD_DELETE, "delete", upload.deletes.len()),
    ] {
        if count == 0 {
            continue;
        }
        let staged_columns = if event == UPLOAD_DELETE {
            &upload.key_columns
        } else {
            &upload.columns
        };
        let script = scripts.require(table, event)?;
        let row_script = apply && !is_set_script(script);
        let rows: Vec<UploadedRow>;
        let mut staged: Vec<Vec<&Value>> = if row_script {
            rows = uploaded_rows(upload, event, &image_keys);
            let applied = run_row_script(
                connection,
                scripts,
                table,
                event,
                script,
                &image_columns,
                &image_keys,
                &rows,
                parameters,
            )?;
            // Skipped rows did not land: the client receives the server's row for them.
            conflict_keys.extend(
                applied
                    .skipped
                    .iter()
                    .map(|&index| rows[index].key(&image_keys)),
            );
            // Rows the statement changed nothing for are compared with the table.
            applied
                .unchanged
                .iter()
                .map(|&index| staged_images(&rows[index], event, &image_keys))
                .collect()
        } else {
            match event {
                UPLOAD_INSERT => upload
                    .inserts
                    .iter()
                    .map(|row| row.iter().collect())
                    .collect(),
                UPLOAD_UPDATE => upload
                    .updates
                    .iter()
                    .map(|update| update.new.iter().chain(&update.old).collect())
                    .collect(),
                _ => upload
                    .deletes
                    .iter()
                    .map(|row| row.iter().collect())
                    .collect(),
            }
        };
        if staged.is_empty() {
            continue;
        }
        let staged_count = staged.len();
        let stage = Stage::create(
            connection,
            kind,
            &shape,
            staged_columns,
            event == UPLOAD_UPDATE,
        )?;
        stage.load(connection, &mut staged.drain(..))?;
        let changed = if apply && !row_script {
            run_script(connection, scripts, table, event, &stage.name, parameters)?
        } else {
            0
        };
        if event == UPLOAD_DELETE {
            // Deleting a key already gone changes nothing and is fine: only keys still
            // present are conflicts, whatever the count.
            conflict_keys.extend(stage.keys_still_in_table(connection, &shape)?);
        } else if changed < staged_count {
            conflict_keys.extend(stage.rows_not_matching_table(connection, &shape, &landed)?);
        }
    }
    let mut resolution = Resolution::default();
    resolution.record_upload(upload, &key_positions);
    if !conflict_keys.is_empty() {
        if apply && scripts.get(table, RESOLVE_CONFLICT).is_some() {
            let conflicted = conflicting_rows(upload, &image_keys, &conflict_keys);
            resolve_conflict(
                connection,
                scripts,
                &shape,
                &image_columns,
                &image_keys,
                &conflicted,
                parameters,
            )?;
        }
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

/// A row as its kind's staging table holds it: new values (inserts), new then old
/// (updates), the key (deletes).
fn staged_images<'r>(row: &'r UploadedRow, event: &str, image_keys: &[usize]) -> Vec<&'r Value> {
    match event {
        UPLOAD_INSERT => row.new.iter().flatten().collect(),
        UPLOAD_UPDATE => row
            .new
            .iter()
            .flatten()
            .chain(row.old.iter().flatten())
            .collect(),
        _ => {
            let old = row.old.as_ref().expect("deletes have an old image");
            image_keys.iter().map(|&position| &old[position]).collect()
        }
    }
}

/// Runs `resolve_conflict` for conflicting rows: a set script once over `{conflicts}`
/// (operation, new columns, `rs_old_` columns), a row script once per row with
/// `:new.*`, `:old.*` and `:current.*` (the row the server holds, NULL when gone).
fn resolve_conflict(
    connection: &Connection,
    scripts: &Scripts,
    shape: &TableShape,
    columns: &[String],
    key_positions: &[usize],
    conflicted: &[UploadedRow],
    parameters: &Parameters,
) -> Result<(), SyncError> {
    let table = shape.name.as_str();
    let script = scripts.require(table, RESOLVE_CONFLICT)?;
    if is_set_script(script) {
        let name = q(&format!("rs_stage_clash_{table}"));
        let mut select = vec![format!("'' AS {}", q(CONFLICT_OPERATION_COLUMN))];
        select.extend(columns.iter().map(|column| q(column)));
        select.extend(columns.iter().map(|column| {
            format!(
                "{} AS {}",
                q(column),
                q(&format!("{OLD_IMAGE_PREFIX}{column}"))
            )
        }));
        connection.execute_batch(&format!(
            "DROP TABLE IF EXISTS temp.{name}; CREATE TEMP TABLE {name} AS SELECT {} FROM main.{} WHERE 0;",
            select.join(", "),
            q(table)
        ))?;
        let placeholders = vec!["?"; 1 + 2 * columns.len()].join(", ");
        let mut insert =
            connection.prepare(&format!("INSERT INTO temp.{name} VALUES ({placeholders})"))?;
        let nulls = vec![Value::Null; columns.len()];
        for row in conflicted {
            let operation = Value::Text(row.operation.to_string());
            let values = std::iter::once(&operation)
                .chain(row.new.as_ref().unwrap_or(&nulls))
                .chain(row.old.as_ref().unwrap_or(&nulls));
            insert.execute(rusqlite::params_from_iter(values))?;
        }
        let sql = scripts.expand(
            table,
            RESOLVE_CONFLICT,
            &[(CONFLICTS_PLACEHOLDER, &format!("temp.{name}"))],
        )?;
        run_bound(connection, &sql, parameters, None, table, RESOLVE_CONFLICT)?;
        return Ok(());
    }
    let current_sql = format!(
        "SELECT {} FROM main.{} WHERE {}",
        column_list(columns, ""),
        q(table),
        key_positions
            .iter()
            .enumerate()
            .map(|(index, &position)| format!("{} = ?{}", q(&columns[position]), index + 1))
            .collect::<Vec<_>>()
            .join(" AND ")
    );
    let mut current_statement = connection.prepare(&current_sql)?;
    for row in conflicted {
        let key = row.key(key_positions);
        let current: Option<Row> = current_statement
            .query_row(rusqlite::params_from_iter(&key), |found| {
                (0..columns.len())
                    .map(|index| found.get::<_, Value>(index))
                    .collect::<Result<Row, _>>()
            })
            .optional()?;
        let mut images = row.images(columns);
        images.current = current.as_deref();
        let parameters = parameters.with(vec![("operation", Value::Text(row.operation.into()))]);
        run_bound(
            connection,
            script,
            &parameters,
            Some(&images),
            table,
            RESOLVE_CONFLICT,
        )
        .map_err(|error| error.with_row_key(describe_key(&key)))?;
    }
    Ok(())
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
            return Err(SyncError::script(
                event,
                table,
                format!(
                    "parameter {index} has no name; scripts use named parameters such as :user"
                ),
            ));
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

pub(super) fn script_failure(event: &str, table: &str, error: rusqlite::Error) -> SyncError {
    let code = match &error {
        rusqlite::Error::SqliteFailure(failure, _) => format!("{:?}", failure.code),
        _ => String::new(),
    };
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        row_key: None,
        code,
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
