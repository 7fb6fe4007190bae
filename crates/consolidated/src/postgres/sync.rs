//! One sync against PostgreSQL, in one transaction.

use std::collections::HashMap;

use futures_util::pin_mut;
use rowsync_protocol::{Row, SyncSummary, TableUpload, Value};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Transaction};

use super::array_stage::{refusal, takes_cte, ArrayStage, ColumnRefusal, UPLOAD_CTE};
use super::events::run_event;
use super::rows::run_row_script;
use super::schema::table_shape;
use super::statements::{is_stale_statement, Statements};
use super::value::{Bind, Read};
use crate::error::describe_postgres;
use crate::names::{column_list, key_match};
use crate::plan::{
    applied_sequence, conflicting_rows, describe_key, image_layout, positional_parameters,
    single_integer, uploaded_rows, validate_upload_shape, DownloadFilter, Parameters, Resolution,
    ScriptRows, Scripts, TableShape, UploadedRow,
};
use crate::scripts::*;
use crate::{
    quote_identifier as q, DbError, DownloadSender, SyncError, SyncOutcome, SyncRequest,
    DOWNLOAD_BATCH_ROWS,
};

/// Staged rows above which the staging table is analyzed before the script runs, so the
/// planner joins it by hash rather than by nested loop.
const STAGE_ANALYZE_ROWS_MIN: usize = 1000;

/// The download watermark: the lowest transaction id still running in this statement's
/// snapshot, or the snapshot's `xmax` (latest completed + 1) when none is. Every
/// transaction below it has finished and is visible to the download cursors, which run
/// after it. Only the snapshot is trusted: `pg_xact_status` reads the commit log before
/// the process array, so a transaction whose commit is logged but not yet visible (for
/// instance while it waits for synchronous replication) would read as committed. Our
/// own id is at or above `xmax`, so the rows this sync wrote come down once more in the
/// client's next sync: a harmless duplicate.
const WATERMARK_QUERY: &str =
    "SELECT (COALESCE((SELECT min(x) FROM pg_snapshot_xip(pg_current_snapshot()) AS x), \
     pg_snapshot_xmax(pg_current_snapshot()))::text)::bigint";

/// One attempt of a sync with the version's `scripts` (loaded before, so a script
/// changed meanwhile is used from the next sync on, never half-way through this one).
pub async fn synchronize(
    client: &mut Client,
    statements: &Statements,
    scripts: &Scripts,
    request: &SyncRequest,
    download: &DownloadSender,
) -> Result<SyncOutcome, SyncError> {
    let started = std::time::Instant::now();
    let transaction = client.transaction().await?;
    // Held shared by every sync, exclusively by cleanup: see `schema::cleanup`.
    transaction
        .batch_execute("SELECT pg_advisory_xact_lock_shared(7263, 0)")
        .await?;
    let locked: bool = transaction
        .query_one(
            &statements
                .prepare(
                    &transaction,
                    "SELECT pg_try_advisory_xact_lock(7262, hashtext($1))",
                )
                .await?,
            &[&request.client_id],
        )
        .await?
        .get(0);
    if !locked {
        return Err(SyncError::AlreadySynchronizing {
            client_id: request.client_id.clone(),
        });
    }
    let subscription = transaction
        .query_opt(
            &statements
                .prepare(
                    &transaction,
                    "SELECT user_name, upload_sequence, download_watermark, last_sync_xid \
                     FROM rs_subscription WHERE client_id = $1",
                )
                .await?,
            &[&request.client_id],
        )
        .await?;
    // A client that comes back with exactly the watermark of its previous sync applied
    // that sync's download, so it holds every row that sync's transaction wrote.
    let last_sync_xid = match &subscription {
        Some(row) if row.get::<_, i64>(2) == request.last_download_watermark => row.get(3),
        _ => 0,
    };
    let applied_sequence =
        applied_sequence(request, subscription.map(|row| (row.get(0), row.get(1))))?;
    let mut parameters = Parameters::for_request(request)?;
    parameters.last_sync_xid = last_sync_xid;
    let upload_sequence = parameters.upload_sequence;
    let upload_already_applied = upload_sequence <= applied_sequence;
    let mut resolutions: HashMap<&str, Resolution> = HashMap::new();
    let mut conflicts = 0;
    run_event(
        &transaction,
        statements,
        scripts,
        BEGIN_SYNCHRONIZATION,
        &parameters,
    )
    .await?;
    if !upload_already_applied {
        run_event(&transaction, statements, scripts, BEGIN_UPLOAD, &parameters).await?;
    }
    // An upload applied before is not applied again, but its conflicts are found again
    // (by comparing it with the table), so a client whose previous reply was lost still
    // receives the server's rows for them.
    {
        for upload in &request.tables {
            let resolution = apply_table(
                &transaction,
                statements,
                scripts,
                upload,
                &parameters,
                !upload_already_applied,
            )
            .await?;
            // Conflicts are counted when an upload is applied; a resend only
            // delivers their resolution again.
            if !upload_already_applied {
                conflicts += resolution.conflict_count;
            }
            resolutions.insert(&upload.table, resolution);
        }
    }
    if !upload_already_applied {
        run_event(&transaction, statements, scripts, END_UPLOAD, &parameters).await?;
    }
    // Taken before the download is read: the cursors' later snapshots see every
    // transaction below it.
    let apply_time = started.elapsed();
    let mut watermark: i64 = transaction
        .query_one(
            &statements.prepare(&transaction, WATERMARK_QUERY).await?,
            &[],
        )
        .await?
        .get(0);
    let next = parameters.with(vec![("next_last_download", Value::Int(watermark))]);
    let modified = run_event(
        &transaction,
        statements,
        scripts,
        MODIFY_NEXT_LAST_DOWNLOAD,
        &next,
    )
    .await?;
    if let Some(modified) = single_integer(modified, MODIFY_NEXT_LAST_DOWNLOAD)? {
        watermark = modified;
    }
    run_event(
        &transaction,
        statements,
        scripts,
        BEGIN_DOWNLOAD,
        &parameters,
    )
    .await?;
    let mut download_rows = 0;
    for table in scripts.download_tables() {
        let shape = shape_of(&transaction, statements, table).await?;
        let mut filter = DownloadFilter::new(&shape, resolutions.get(table));
        if scripts.get(table, DOWNLOAD_DELETE_CURSOR).is_some() {
            let mut batches = Batches::open(
                &transaction,
                statements,
                scripts,
                table,
                DOWNLOAD_DELETE_CURSOR,
                &parameters,
            )
            .await?;
            while let Some(keys) = batches.next(&transaction).await? {
                download
                    .send(filter.deletes(&batches.columns, keys)?)
                    .await?;
            }
        }
        download.send(filter.conflict_deletes()).await?;
        if scripts.get(table, DOWNLOAD_CURSOR).is_some() {
            let mut batches = Batches::open(
                &transaction,
                statements,
                scripts,
                table,
                DOWNLOAD_CURSOR,
                &parameters,
            )
            .await?;
            while let Some(rows) = batches.next(&transaction).await? {
                download
                    .send(filter.upserts(&batches.columns, rows)?)
                    .await?;
            }
        }
        download.send(filter.conflict_upserts()).await?;
        download_rows += filter.rows_sent;
    }
    run_event(&transaction, statements, scripts, END_DOWNLOAD, &parameters).await?;
    let upsert = statements
        .prepare(
            &transaction,
            "INSERT INTO rs_subscription (client_id, user_name, script_version, upload_sequence, download_watermark,
                 download_acknowledged, last_sync_xid, last_sync_at)
             VALUES ($1, $2, $3, $4, $5, $6, (pg_current_xact_id()::text)::bigint, now())
             ON CONFLICT (client_id) DO UPDATE SET
                 script_version = excluded.script_version,
                 upload_sequence = greatest(rs_subscription.upload_sequence, excluded.upload_sequence),
                 download_watermark = excluded.download_watermark,
                 download_acknowledged = greatest(rs_subscription.download_acknowledged, excluded.download_acknowledged),
                 last_sync_xid = excluded.last_sync_xid,
                 last_sync_at = excluded.last_sync_at",
        )
        .await?;
    transaction
        .execute(
            &upsert,
            &[
                &request.client_id,
                &request.user,
                &request.script_version,
                &upload_sequence,
                &watermark,
                &request.last_download_watermark,
            ],
        )
        .await?;
    run_event(
        &transaction,
        statements,
        scripts,
        END_SYNCHRONIZATION,
        &parameters,
    )
    .await?;
    // The server must hold the whole download before the upload is committed.
    download.finish().await?;
    transaction.commit().await?;
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

/// A query script read through a portal, `DOWNLOAD_BATCH_ROWS` rows at a time, so a
/// download of any size takes bounded memory.
struct Batches {
    portal: tokio_postgres::Portal,
    columns: Vec<String>,
    table: String,
    event: &'static str,
    done: bool,
}

impl Batches {
    async fn open(
        transaction: &Transaction<'_>,
        statements: &Statements,
        scripts: &Scripts,
        table: &str,
        event: &'static str,
        parameters: &Parameters<'_>,
    ) -> Result<Batches, SyncError> {
        let sql = scripts.expand(table, event, &[])?;
        let (sql, values) = bind_script(&sql, parameters, table, event)?;
        let statement = statements
            .prepare(transaction, &sql)
            .await
            .map_err(|error| script_failure(event, table, error))?;
        let binds = binds_of(&values);
        let params: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        let portal = transaction
            .bind(&statement, &params)
            .await
            .map_err(|error| script_failure(event, table, error))?;
        Ok(Batches {
            portal,
            columns: statement
                .columns()
                .iter()
                .map(|column| column.name().to_string())
                .collect(),
            table: table.to_string(),
            event,
            done: false,
        })
    }

    async fn next(&mut self, transaction: &Transaction<'_>) -> Result<Option<Vec<Row>>, SyncError> {
        if self.done {
            return Ok(None);
        }
        let rows = transaction
            .query_portal(&self.portal, DOWNLOAD_BATCH_ROWS as i32)
            .await
            .map_err(|error| script_failure(self.event, &self.table, error))?;
        self.done = rows.len() < DOWNLOAD_BATCH_ROWS;
        let batch = rows
            .iter()
            .map(|row| {
                (0..row.len())
                    .map(|index| row.try_get::<_, Read>(index).map(|read| read.0))
                    .collect()
            })
            .collect::<Result<Vec<Row>, _>>()
            .map_err(|error| script_failure(self.event, &self.table, error))?;
        Ok(if batch.is_empty() { None } else { Some(batch) })
    }
}

async fn shape_of(
    transaction: &Transaction<'_>,
    statements: &Statements,
    table: &str,
) -> Result<TableShape, SyncError> {
    Ok(shape_and_types(transaction, statements, table).await?.0)
}

/// A table's shape and its columns' SQL types, in column order.
async fn shape_and_types(
    transaction: &Transaction<'_>,
    statements: &Statements,
    table: &str,
) -> Result<(TableShape, Vec<String>), SyncError> {
    table_shape(transaction, Some(statements), table)
        .await?
        .ok_or_else(|| {
            SyncError::Schema(format!(
                "table {table:?} does not exist in the consolidated database"
            ))
        })
}

/// Failures that a second attempt of the whole sync may not meet: a concurrent insert
/// of the same key, a serialization failure, a deadlock.
const RETRYABLE: [SqlState; 3] = [
    SqlState::UNIQUE_VIOLATION,
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
];

/// Whether a sync failed because a prepared statement no longer fits its tables.
pub fn is_stale(error: &SyncError) -> bool {
    match error {
        SyncError::Database(DbError::Postgres(error)) => is_stale_statement(error),
        SyncError::Script { code, message, .. } => {
            code == SqlState::FEATURE_NOT_SUPPORTED.code()
                && message.contains("cached plan must not change result type")
        }
        _ => false,
    }
}

pub fn is_retryable(error: &SyncError) -> bool {
    matches!(error, SyncError::Database(DbError::Postgres(error)) if error.code().is_some_and(|code| RETRYABLE.contains(code)))
}

pub(super) fn script_failure(event: &str, table: &str, error: tokio_postgres::Error) -> SyncError {
    if error.code().is_some_and(|code| RETRYABLE.contains(code)) {
        return SyncError::Database(DbError::Postgres(error));
    }
    SyncError::Script {
        event: event.to_string(),
        table: table.to_string(),
        row_key: None,
        code: error
            .code()
            .map_or_else(String::new, |code| code.code().to_string()),
        message: describe_postgres(&error),
    }
}

/// A temporary staging table, dropped at commit or rollback.
struct Stage {
    name: String,
    columns: Vec<String>,
    key_columns: Vec<String>,
}

impl Stage {
    async fn create(
        transaction: &Transaction<'_>,
        kind: &str,
        shape: &TableShape,
        columns: &[String],
        with_old_image: bool,
        with_operation: bool,
    ) -> Result<Stage, SyncError> {
        let name = q(&format!("rs_stage_{kind}_{}", shape.name));
        let mut select: Vec<String> = Vec::new();
        let mut staged = Vec::new();
        if with_operation {
            select.push(format!("''::text AS {}", q(CONFLICT_OPERATION_COLUMN)));
            staged.push(CONFLICT_OPERATION_COLUMN.to_string());
        }
        select.extend(columns.iter().map(|column| q(column)));
        staged.extend(columns.iter().cloned());
        if with_old_image {
            for column in columns {
                let old = format!("{OLD_IMAGE_PREFIX}{column}");
                select.push(format!("{} AS {}", q(column), q(&old)));
                staged.push(old);
            }
        }
        transaction
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS pg_temp.{name}; CREATE TEMP TABLE {name} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA",
                select.join(", "),
                q(&shape.name)
            ))
            .await?;
        Ok(Stage {
            name: format!("pg_temp.{name}"),
            columns: staged,
            key_columns: shape.key_columns.clone(),
        })
    }

    /// Loads rows with binary COPY; a value a column cannot take is refused by name.
    async fn load<'r>(
        &self,
        transaction: &Transaction<'_>,
        table: &str,
        rows: impl Iterator<Item = Vec<&'r Value>>,
        row_count: usize,
    ) -> Result<(), SyncError> {
        let columns = self
            .columns
            .iter()
            .map(|c| q(c))
            .collect::<Vec<_>>()
            .join(", ");
        let types: Vec<Type> = transaction
            .prepare(&format!("SELECT {columns} FROM {}", self.name))
            .await?
            .columns()
            .iter()
            .map(|column| column.type_().clone())
            .collect();
        let sink = transaction
            .copy_in(&format!(
                "COPY {} ({columns}) FROM STDIN (FORMAT binary)",
                self.name
            ))
            .await?;
        let writer = BinaryCopyInWriter::new(sink, &types);
        pin_mut!(writer);
        let refuse = |error: tokio_postgres::Error| {
            SyncError::Schema(format!(
                "upload of table {table:?} holds a value its column cannot take: {}",
                describe_postgres(&error)
            ))
        };
        for row in rows {
            let binds: Vec<Bind> = row.into_iter().map(Bind).collect();
            writer
                .as_mut()
                .write_raw(binds.iter())
                .await
                .map_err(refuse)?;
        }
        writer.finish().await.map_err(refuse)?;
        if row_count >= STAGE_ANALYZE_ROWS_MIN {
            transaction
                .batch_execute(&format!("ANALYZE {}", self.name))
                .await?;
        }
        Ok(())
    }

    fn key_list(&self, alias: &str) -> String {
        column_list(&self.key_columns, &format!("{alias}."))
    }

    fn key_match(&self, left: &str, right: &str) -> String {
        key_match(&self.key_columns, left, right)
    }
}

pub(super) fn binds_of(values: &[Value]) -> Vec<Bind<'_>> {
    values.iter().map(Bind).collect()
}

/// Binds a script's named parameters as positional ones.
pub(super) fn bind_script(
    sql: &str,
    parameters: &Parameters,
    table: &str,
    event: &str,
) -> Result<(String, Vec<Value>), SyncError> {
    let (sql, names) = positional_parameters(sql);
    let values = names
        .iter()
        .map(|name| parameters.value(name, table, event))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((sql, values))
}

pub(super) async fn query_rows(
    transaction: &impl GenericClient,
    statements: &Statements,
    sql: &str,
    values: &[Value],
) -> Result<(Vec<String>, Vec<Row>), tokio_postgres::Error> {
    let binds = binds_of(values);
    let parameters: Vec<&(dyn ToSql + Sync)> = binds
        .iter()
        .map(|bind| bind as &(dyn ToSql + Sync))
        .collect();
    query_bound(transaction, statements, sql, &parameters).await
}

/// Runs `sql` with its parameters bound; its column names and rows.
async fn query_bound(
    transaction: &impl GenericClient,
    statements: &Statements,
    sql: &str,
    parameters: &[&(dyn ToSql + Sync)],
) -> Result<(Vec<String>, Vec<Row>), tokio_postgres::Error> {
    let statement = statements.prepare(transaction, sql).await?;
    let rows = transaction.query(&statement, parameters).await?;
    let columns = statement
        .columns()
        .iter()
        .map(|column| column.name().to_string())
        .collect();
    let rows = rows
        .iter()
        .map(|row| {
            (0..row.len())
                .map(|index| row.try_get::<_, Read>(index).map(|read| read.0))
                .collect()
        })
        .collect::<Result<Vec<Row>, _>>()?;
    Ok((columns, rows))
}

async fn query_script(
    transaction: &Transaction<'_>,
    statements: &Statements,
    scripts: &Scripts,
    table: &str,
    event: &str,
    substitutions: &[(&str, &str)],
    parameters: &Parameters<'_>,
) -> Result<ScriptRows, SyncError> {
    let sql = scripts.expand(table, event, substitutions)?;
    let (sql, values) = bind_script(&sql, parameters, table, event)?;
    query_rows(transaction, statements, &sql, &values)
        .await
        .map_err(|error| script_failure(event, table, error))
}

/// Runs an upload set script over its staging table and returns the staged keys that
/// did not land as sent. A script that returns the keys it applied (`RETURNING`) is
/// wrapped so the same statement reports the others; any other script is followed by
/// one comparison query when it changed fewer rows than were staged.
/// Whether a script has a `RETURNING` clause (the keyword, not a name containing it).
fn returns_rows(sql: &str) -> bool {
    sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word.eq_ignore_ascii_case("returning"))
}

/// What every upload script of one table runs with.
struct TableContext<'a> {
    scripts: &'a Scripts,
    shape: &'a TableShape,
    parameters: &'a Parameters<'a>,
    partition_column: Option<&'a str>,
    /// False for an upload applied before: scripts do not run, only the comparison.
    apply: bool,
}

/// Where an upload set script reads its staged rows: arrays bound in its own statement
/// (one data-modifying statement), or a temporary table (any other script).
enum UploadStage<'v> {
    Arrays(ArrayStage<'v>),
    Table(Stage),
}

impl<'v> UploadStage<'v> {
    /// Stages `rows` (values in the order of `columns`): in arrays if the statements
    /// that read them can take a CTE, else in a temporary table.
    #[allow(clippy::too_many_arguments)]
    async fn create(
        transaction: &Transaction<'_>,
        arrays: bool,
        kind: &str,
        shape: &TableShape,
        types: &[String],
        columns: &[String],
        with_old_image: bool,
        rows: Vec<Vec<&'v Value>>,
    ) -> Result<UploadStage<'v>, SyncError> {
        if arrays {
            let type_of = |column: &str| -> Result<String, SyncError> {
                shape
                    .columns
                    .iter()
                    .position(|c| c.name == column)
                    .and_then(|index| types.get(index).cloned())
                    .ok_or_else(|| {
                        SyncError::Schema(format!(
                            "table {:?} has no column {column:?}",
                            shape.name
                        ))
                    })
            };
            let mut staged = columns.to_vec();
            let mut staged_types = columns
                .iter()
                .map(|column| type_of(column))
                .collect::<Result<Vec<_>, _>>()?;
            if with_old_image {
                staged.extend(
                    columns
                        .iter()
                        .map(|column| format!("{OLD_IMAGE_PREFIX}{column}")),
                );
                staged_types.extend(staged_types.clone());
            }
            return Ok(UploadStage::Arrays(ArrayStage::new(
                staged,
                staged_types,
                shape.key_columns.clone(),
                rows,
            )));
        }
        let stage = Stage::create(transaction, kind, shape, columns, with_old_image, false).await?;
        let count = rows.len();
        stage
            .load(transaction, &shape.name, rows.into_iter(), count)
            .await?;
        Ok(UploadStage::Table(stage))
    }

    fn name(&self) -> &str {
        match self {
            UploadStage::Arrays(_) => UPLOAD_CTE,
            UploadStage::Table(stage) => &stage.name,
        }
    }

    fn columns(&self) -> &[String] {
        match self {
            UploadStage::Arrays(stage) => &stage.columns,
            UploadStage::Table(stage) => &stage.columns,
        }
    }

    fn key_list(&self, alias: &str) -> String {
        match self {
            UploadStage::Arrays(stage) => stage.key_list(alias),
            UploadStage::Table(stage) => stage.key_list(alias),
        }
    }

    fn key_match(&self, left: &str, right: &str) -> String {
        match self {
            UploadStage::Arrays(stage) => stage.key_match(left, right),
            UploadStage::Table(stage) => stage.key_match(left, right),
        }
    }

    /// `sql` (which reads the stage by [`Self::name`], its own `values` as `$1…`) as
    /// sent, with every parameter it takes.
    fn bound<'s>(
        &'s self,
        sql: &str,
        binds: &'s [Bind<'s>],
    ) -> (String, Vec<&'s (dyn ToSql + Sync)>) {
        let mut parameters: Vec<&(dyn ToSql + Sync)> = binds
            .iter()
            .map(|bind| bind as &(dyn ToSql + Sync))
            .collect();
        let sql = match self {
            UploadStage::Arrays(stage) => {
                parameters.extend(stage.parameters());
                stage.statement(sql, binds.len())
            }
            UploadStage::Table(_) => sql.to_string(),
        };
        (sql, parameters)
    }

    /// Runs `sql` and returns its rows; a staged value its column refuses is named with
    /// the table and column (the outer error), any other failure is the script's.
    async fn query(
        &self,
        transaction: &Transaction<'_>,
        statements: &Statements,
        table: &str,
        sql: &str,
        values: &[Value],
    ) -> Result<Result<(Vec<String>, Vec<Row>), tokio_postgres::Error>, SyncError> {
        let binds = binds_of(values);
        let (sql, parameters) = self.bound(sql, &binds);
        refused_by_column(
            table,
            query_bound(transaction, statements, &sql, &parameters).await,
        )
    }

    /// As [`Self::query`], for a statement whose rows are not read: the rows changed.
    async fn execute(
        &self,
        transaction: &Transaction<'_>,
        statements: &Statements,
        table: &str,
        sql: &str,
        values: &[Value],
    ) -> Result<Result<u64, tokio_postgres::Error>, SyncError> {
        let binds = binds_of(values);
        let (sql, parameters) = self.bound(sql, &binds);
        let executed = match statements.prepare(transaction, &sql).await {
            Ok(statement) => transaction.execute(&statement, &parameters).await,
            Err(error) => Err(error),
        };
        refused_by_column(table, executed)
    }
}

/// A staged value its column refused, as the sync's error; anything else as it came.
fn refused_by_column<T>(
    table: &str,
    done: Result<T, tokio_postgres::Error>,
) -> Result<Result<T, tokio_postgres::Error>, SyncError> {
    match done {
        Err(error) => match refusal(&error) {
            Some(refused) => Err(refused_value(table, refused)),
            None => Ok(Err(error)),
        },
        done => Ok(done),
    }
}

fn refused_value(table: &str, refused: &ColumnRefusal) -> SyncError {
    SyncError::Schema(format!(
        "upload of table {table:?} holds a value its column cannot take: {refused}"
    ))
}

async fn apply_script(
    transaction: &Transaction<'_>,
    statements: &Statements,
    context: &TableContext<'_>,
    event: &str,
    stage: &UploadStage<'_>,
    staged_rows: usize,
) -> Result<Vec<Row>, SyncError> {
    let TableContext {
        scripts,
        shape,
        parameters,
        partition_column,
        apply,
    } = *context;
    let table = shape.name.as_str();
    let script = scripts.expand(table, event, &[(UPLOAD_PLACEHOLDER, stage.name())])?;
    let target = q(table);
    let is_delete = event == UPLOAD_DELETE;
    // Deletes of keys already gone are not conflicts: only keys still present are.
    let still_present = format!(
        "EXISTS (SELECT 1 FROM {target} AS t WHERE {})",
        stage.key_match("t", "s")
    );
    if apply && returns_rows(&script) {
        let unmatched = if is_delete {
            format!(" WHERE {still_present}")
        } else {
            String::new()
        };
        // EXCEPT rather than NOT EXISTS: the planner cannot estimate what a data-modifying
        // CTE returns (often 1 row) and then anti-joins by nested loop, quadratic in the
        // rows applied; a set operation hashes or sorts whatever its estimate.
        let wrapped = format!(
            "WITH rs_applied AS ({script}) SELECT {keys} FROM \
             (SELECT {keys} FROM {stage} AS s EXCEPT SELECT {applied} FROM rs_applied AS a) AS s{unmatched}",
            keys = stage.key_list("s"),
            stage = stage.name(),
            applied = stage.key_list("a"),
        );
        let (sql, values) = bind_script(&wrapped, parameters, table, event)?;
        let (_, keys) = stage
            .query(transaction, statements, table, &sql, &values)
            .await?
            .map_err(|error| script_failure(event, table, error))?;
        return Ok(keys);
    }
    let changed = if apply {
        let (sql, values) = bind_script(&script, parameters, table, event)?;
        stage
            .execute(transaction, statements, table, &sql, &values)
            .await?
            .map_err(|error| script_failure(event, table, error))? as usize
    } else {
        0
    };
    if changed >= staged_rows && !is_delete {
        return Ok(Vec::new());
    }
    let condition = if is_delete {
        still_present
    } else {
        let mut matches: Vec<String> = stage
            .columns()
            .iter()
            .filter(|column| !column.starts_with(OLD_IMAGE_PREFIX))
            .map(|column| format!("t.{c} IS NOT DISTINCT FROM s.{c}", c = q(column)))
            .collect();
        if let Some(partition) = partition_column {
            matches.push(format!("t.{}::text = $1", q(partition)));
        }
        format!(
            "NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {})",
            matches.join(" AND ")
        )
    };
    let sql = format!(
        "SELECT {} FROM {} AS s WHERE {condition}",
        stage.key_list("s"),
        stage.name()
    );
    let values = if !is_delete && partition_column.is_some() {
        vec![Value::Text(parameters.user.to_string())]
    } else {
        Vec::new()
    };
    Ok(stage
        .query(transaction, statements, table, &sql, &values)
        .await??
        .1)
}

async fn apply_table(
    transaction: &Transaction<'_>,
    statements: &Statements,
    scripts: &Scripts,
    upload: &TableUpload,
    parameters: &Parameters<'_>,
    apply: bool,
) -> Result<Resolution, SyncError> {
    let table = upload.table.as_str();
    scripts.check_synchronizes(table)?;
    let (shape, types) = shape_and_types(transaction, statements, table).await?;
    let key_positions = validate_upload_shape(upload, &shape)?;
    let partition_column: Option<String> = transaction
        .query_opt(
            &statements
                .prepare(
                    transaction,
                    "SELECT partition_column FROM rs_table WHERE table_name = $1",
                )
                .await?,
            &[&table],
        )
        .await?
        .map(|row| row.get(0));
    let context = TableContext {
        scripts,
        shape: &shape,
        parameters,
        partition_column: partition_column.as_deref(),
        apply,
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
        let with_old_image = event == UPLOAD_UPDATE;
        let script = scripts.require(table, event)?;
        let rows: Vec<UploadedRow>;
        let staged: Vec<Vec<&Value>> = if apply && !is_set_script(script) {
            rows = uploaded_rows(upload, event, &image_keys);
            let applied = run_row_script(
                transaction,
                statements,
                scripts,
                table,
                event,
                script,
                &image_columns,
                &image_keys,
                &rows,
                parameters,
            )
            .await?;
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
        let is_row_script = apply && !is_set_script(script);
        let staged_count = staged.len();
        // A row script's unchanged rows are compared by rowsync's own SELECT, which
        // reads arrays too.
        let stage = UploadStage::create(
            transaction,
            is_row_script || takes_cte(script),
            kind,
            &shape,
            &types,
            staged_columns,
            with_old_image,
            staged,
        )
        .await?;
        let compare_only = TableContext {
            apply: apply && !is_row_script,
            ..context
        };
        conflict_keys.extend(
            apply_script(
                transaction,
                statements,
                &compare_only,
                event,
                &stage,
                staged_count,
            )
            .await?,
        );
    }
    let mut resolution = Resolution::default();
    resolution.record_upload(upload, &key_positions);
    if !conflict_keys.is_empty() {
        if apply && scripts.get(table, RESOLVE_CONFLICT).is_some() {
            let conflicted = conflicting_rows(upload, &image_keys, &conflict_keys);
            resolve_conflict(
                transaction,
                statements,
                scripts,
                &shape,
                &image_columns,
                &image_keys,
                &conflicted,
                parameters,
            )
            .await?;
        }
        let stage = Stage::create(
            transaction,
            "keys",
            &shape,
            &shape.key_columns,
            false,
            false,
        )
        .await?;
        stage
            .load(
                transaction,
                table,
                conflict_keys.iter().map(|row| row.iter().collect()),
                conflict_keys.len(),
            )
            .await?;
        let (columns, rows) = query_script(
            transaction,
            statements,
            scripts,
            table,
            UPLOAD_FETCH,
            &[(KEYS_PLACEHOLDER, &stage.name)],
            parameters,
        )
        .await?;
        resolution.resolve(&shape, conflict_keys, columns, rows)?;
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
#[allow(clippy::too_many_arguments)]
async fn resolve_conflict(
    transaction: &Transaction<'_>,
    statements: &Statements,
    scripts: &Scripts,
    shape: &TableShape,
    columns: &[String],
    key_positions: &[usize],
    conflicted: &[UploadedRow],
    parameters: &Parameters<'_>,
) -> Result<(), SyncError> {
    let table = shape.name.as_str();
    let script = scripts.require(table, RESOLVE_CONFLICT)?;
    if is_set_script(script) {
        let stage = Stage::create(transaction, "clash", shape, columns, true, true).await?;
        let operations: Vec<Value> = conflicted
            .iter()
            .map(|row| Value::Text(row.operation.to_string()))
            .collect();
        let nulls = vec![Value::Null; columns.len()];
        let rows = conflicted.iter().zip(&operations).map(|(row, operation)| {
            std::iter::once(operation)
                .chain(row.new.as_ref().unwrap_or(&nulls))
                .chain(row.old.as_ref().unwrap_or(&nulls))
                .collect()
        });
        stage
            .load(transaction, table, rows, conflicted.len())
            .await?;
        let sql = scripts.expand(
            table,
            RESOLVE_CONFLICT,
            &[(CONFLICTS_PLACEHOLDER, &stage.name)],
        )?;
        let (sql, values) = bind_script(&sql, parameters, table, RESOLVE_CONFLICT)?;
        query_rows(transaction, statements, &sql, &values)
            .await
            .map_err(|error| script_failure(RESOLVE_CONFLICT, table, error))?;
        return Ok(());
    }
    let current_sql = format!(
        "SELECT {} FROM {} WHERE {}",
        column_list(columns, ""),
        q(table),
        key_positions
            .iter()
            .enumerate()
            .map(|(index, &position)| format!("{} = ${}", q(&columns[position]), index + 1))
            .collect::<Vec<_>>()
            .join(" AND ")
    );
    let (sql, names) = positional_parameters(script);
    for row in conflicted {
        let key = row.key(key_positions);
        let (_, current) = query_rows(transaction, statements, &current_sql, &key).await?;
        let mut images = row.images(columns);
        images.current = current.first().map(Vec::as_slice);
        let parameters = parameters.with(vec![("operation", Value::Text(row.operation.into()))]);
        let values = names
            .iter()
            .map(|name| parameters.value_for_row(name, Some(&images), table, RESOLVE_CONFLICT))
            .collect::<Result<Vec<_>, _>>()?;
        query_rows(transaction, statements, &sql, &values)
            .await
            .map_err(|error| {
                script_failure(RESOLVE_CONFLICT, table, error).with_row_key(describe_key(&key))
            })?;
    }
    Ok(())
}
