//! Scratch rows of an upload on PostgreSQL and finding what of it did not land: array
//! parameters read through a CTE where the script is one data-modifying statement, a
//! temporary table (binary `COPY`) otherwise.

use futures_util::pin_mut;
use rowsync_protocol::{Row, Value};
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Transaction;

use super::array_scratch::{refusal, takes_cte, ArrayScratch, ColumnRefusal, UPLOAD_CTE};
use super::error::{describe_postgres, script_failure};
use super::query::{bind_script, binds_of, query_bound};
use super::schema::comparable;
use super::statements::Statements;
use super::value::Bind;
use crate::dialect::{ScratchRows, TableApply};
use crate::names::{column_list, key_match};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, SyncError};

/// Scratch rows above which the scratch table is analyzed before the script runs, so the
/// planner joins it by hash rather than by nested loop.
const SCRATCH_ANALYZE_ROWS_MIN: usize = 1000;

/// A temporary scratch table, dropped at commit or rollback.
pub(super) struct ScratchTable {
    pub(super) name: String,
    columns: Vec<String>,
    key_columns: Vec<String>,
}

impl ScratchTable {
    pub(super) async fn create(
        transaction: &Transaction<'_>,
        kind: &str,
        shape: &TableShape,
        columns: &[String],
        with_old_image: bool,
        with_operation: bool,
    ) -> Result<ScratchTable, SyncError> {
        let name = q(&format!("rs_stage_{kind}_{}", shape.name));
        let mut select: Vec<String> = Vec::new();
        let mut scratch = Vec::new();
        if with_operation {
            select.push(format!("''::text AS {}", q(CONFLICT_OPERATION_COLUMN)));
            scratch.push(CONFLICT_OPERATION_COLUMN.to_string());
        }
        select.extend(columns.iter().map(|column| q(column)));
        scratch.extend(columns.iter().cloned());
        if with_old_image {
            for column in columns {
                let old = format!("{OLD_IMAGE_PREFIX}{column}");
                select.push(format!("{} AS {}", q(column), q(&old)));
                scratch.push(old);
            }
        }
        transaction
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS pg_temp.{name}; CREATE TEMP TABLE {name} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA",
                select.join(", "),
                q(&shape.name)
            ))
            .await?;
        Ok(ScratchTable {
            name: format!("pg_temp.{name}"),
            columns: scratch,
            key_columns: shape.key_columns.clone(),
        })
    }

    /// Loads rows with binary COPY; a value a column cannot take is refused by name.
    pub(super) async fn load<'r>(
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
        if row_count >= SCRATCH_ANALYZE_ROWS_MIN {
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

/// Where an upload set script reads its scratch rows: arrays bound in its own statement
/// (one data-modifying statement), or a temporary table (any other script).
enum UploadScratch<'v> {
    Arrays(ArrayScratch<'v>),
    Table(ScratchTable),
}

impl<'v> UploadScratch<'v> {
    /// Puts the rows in scratch (values in the order of their columns): in arrays if the
    /// statements that read them can take a CTE, else in a temporary table.
    async fn create(
        target: &ScratchTarget<'_>,
        shape: &TableShape,
        scratch_rows: ScratchRows<'_, 'v>,
        arrays: bool,
    ) -> Result<UploadScratch<'v>, SyncError> {
        let with_old_image = scratch_rows.event == UPLOAD_UPDATE;
        if !arrays {
            let transaction = target.transaction;
            let scratch = ScratchTable::create(
                transaction,
                scratch_rows.kind,
                shape,
                scratch_rows.columns,
                with_old_image,
                false,
            )
            .await?;
            let count = scratch_rows.rows.len();
            scratch
                .load(
                    transaction,
                    &shape.name,
                    scratch_rows.rows.into_iter(),
                    count,
                )
                .await?;
            return Ok(UploadScratch::Table(scratch));
        }
        let type_of = |column: &str| -> Result<String, SyncError> {
            shape
                .columns
                .iter()
                .position(|c| c.name == column)
                .and_then(|index| target.types.get(index).cloned())
                .ok_or_else(|| {
                    SyncError::Schema(format!("table {:?} has no column {column:?}", shape.name))
                })
        };
        let mut columns = scratch_rows.columns.to_vec();
        let mut types = columns
            .iter()
            .map(|column| type_of(column))
            .collect::<Result<Vec<_>, _>>()?;
        if with_old_image {
            columns.extend(
                scratch_rows
                    .columns
                    .iter()
                    .map(|column| format!("{OLD_IMAGE_PREFIX}{column}")),
            );
            types.extend(types.clone());
        }
        Ok(UploadScratch::Arrays(ArrayScratch::new(
            columns,
            types,
            shape.key_columns.clone(),
            scratch_rows.rows,
        )))
    }

    fn name(&self) -> &str {
        match self {
            UploadScratch::Arrays(_) => UPLOAD_CTE,
            UploadScratch::Table(scratch) => &scratch.name,
        }
    }

    fn columns(&self) -> &[String] {
        match self {
            UploadScratch::Arrays(scratch) => &scratch.columns,
            UploadScratch::Table(scratch) => &scratch.columns,
        }
    }

    fn key_list(&self, alias: &str) -> String {
        match self {
            UploadScratch::Arrays(scratch) => scratch.key_list(alias),
            UploadScratch::Table(scratch) => scratch.key_list(alias),
        }
    }

    fn key_match(&self, left: &str, right: &str) -> String {
        match self {
            UploadScratch::Arrays(scratch) => scratch.key_match(left, right),
            UploadScratch::Table(scratch) => scratch.key_match(left, right),
        }
    }

    /// `sql` (which reads the scratch by [`Self::name`], its own `values` as `$1…`) as
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
            UploadScratch::Arrays(scratch) => {
                parameters.extend(scratch.parameters());
                scratch.statement(sql, binds.len())
            }
            UploadScratch::Table(_) => sql.to_string(),
        };
        (sql, parameters)
    }

    /// Runs `sql` and returns its rows; a scratch_rows value its column refuses is named with
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

/// A scratch value its column refused, as the sync's error; anything else as it came.
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

/// Whether a script has a `RETURNING` clause (the keyword, not a name containing it).
fn returns_rows(sql: &str) -> bool {
    sql.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|word| word.eq_ignore_ascii_case("returning"))
}

/// What scratch one kind of a table's upload works with.
pub(super) struct ScratchTarget<'a> {
    pub transaction: &'a Transaction<'a>,
    pub statements: &'a Statements,
    /// The table's columns' SQL types, in the order of its shape's columns.
    pub types: &'a [String],
}

/// Puts the rows in scratch, runs the set script over them when asked, and returns the scratch
/// keys that did not land as sent. A script that returns the keys it applied
/// (`RETURNING`) is wrapped so the same statement reports the others; any other script
/// is followed by one comparison query when it changed fewer rows than were put in scratch.
pub(super) async fn apply_scratch(
    target: &ScratchTarget<'_>,
    context: &TableApply<'_>,
    scratch: ScratchRows<'_, '_>,
) -> Result<Vec<Row>, SyncError> {
    let table = context.table();
    let event = scratch.event;
    let script = context.scripts.require(table, event)?;
    // A row script's unchanged rows are compared by rowsync's own SELECT, which reads
    // arrays too.
    // An array column cannot be put in scratch as an array of arrays (`unnest` would flatten
    // it), so a table with one puts its scratch rows in a temporary table.
    let arrays = (scratch.after_row_script || takes_cte(script))
        && !target.types.iter().any(|ty| ty.ends_with(']'));
    let (run_script, scratch_rows) = (scratch.run_script, scratch.rows.len());
    let scratch = UploadScratch::create(target, context.shape, scratch, arrays).await?;
    let script = context
        .scripts
        .expand(table, event, &[(UPLOAD_PLACEHOLDER, scratch.name())])?;
    let (transaction, statements) = (target.transaction, target.statements);
    if run_script && returns_rows(&script) {
        // EXCEPT rather than NOT EXISTS: the planner cannot estimate what a data-modifying
        // CTE returns (often 1 row) and then anti-joins by nested loop, quadratic in the
        // rows applied; a set operation hashes or sorts whatever its estimate.
        let unmatched = match event {
            UPLOAD_DELETE => format!(" WHERE {}", still_present(&scratch, table)),
            _ => String::new(),
        };
        let wrapped = format!(
            "WITH rs_applied AS ({script}) SELECT {keys} FROM \
             (SELECT {keys} FROM {scratch} AS s EXCEPT SELECT {applied} FROM rs_applied AS a) AS s{unmatched}",
            keys = scratch.key_list("s"),
            scratch = scratch.name(),
            applied = scratch.key_list("a"),
        );
        let (sql, values) = bind_script(&wrapped, context.parameters, table, event)?;
        let (_, keys) = scratch
            .query(transaction, statements, table, &sql, &values)
            .await?
            .map_err(|error| script_failure(event, table, error))?;
        return Ok(keys);
    }
    let changed = if run_script {
        let (sql, values) = bind_script(&script, context.parameters, table, event)?;
        scratch
            .execute(transaction, statements, table, &sql, &values)
            .await?
            .map_err(|error| script_failure(event, table, error))? as usize
    } else {
        0
    };
    if changed >= scratch_rows && event != UPLOAD_DELETE {
        return Ok(Vec::new());
    }
    unlanded_keys(target, context, event, &scratch).await
}

/// The savepoint a fast form runs under.
const FAST_SAVEPOINT: &str = "rs_fast";

/// Puts the rows in scratch and runs the fast form `fast_event` over them under a savepoint:
/// the rows it changed, or `None` when a unique violation rolled it back to the
/// savepoint. `SAVEPOINT`, the statement and `RELEASE` are sent together (their futures
/// polled at once are pipelined), so the fast path costs no round trip of its own; a
/// failed statement makes the `RELEASE` fail too, which the `ROLLBACK TO` then undoes.
/// The savepoint is a subtransaction, but the rows' stamp (`CURRENT_XID`) is the
/// top-level transaction's id, as `pg_current_xact_id` gives inside one.
pub(super) async fn apply_scratch_fast(
    target: &ScratchTarget<'_>,
    context: &TableApply<'_>,
    scratch: ScratchRows<'_, '_>,
    fast_event: &str,
) -> Result<Option<u64>, SyncError> {
    let table = context.table();
    let script = context.scripts.require(table, fast_event)?;
    let arrays = takes_cte(script) && !target.types.iter().any(|ty| ty.ends_with(']'));
    let scratch = UploadScratch::create(target, context.shape, scratch, arrays).await?;
    let script =
        context
            .scripts
            .expand(table, fast_event, &[(UPLOAD_PLACEHOLDER, scratch.name())])?;
    let (sql, values) = bind_script(&script, context.parameters, table, fast_event)?;
    let binds = binds_of(&values);
    let (sql, parameters) = scratch.bound(&sql, &binds);
    let (transaction, statements) = (target.transaction, target.statements);
    let statement = statements
        .prepare(transaction, &sql)
        .await
        .map_err(|error| script_failure(fast_event, table, error))?;
    // `join3` polls them in this order, so they are sent in it.
    let (saved, inserted, released) = futures_util::future::join3(
        transaction.batch_execute(&format!("SAVEPOINT {FAST_SAVEPOINT}")),
        transaction.execute(&statement, &parameters),
        transaction.batch_execute(&format!("RELEASE SAVEPOINT {FAST_SAVEPOINT}")),
    )
    .await;
    saved?;
    match inserted {
        Err(error) if error.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            transaction
                .batch_execute(&format!(
                    "ROLLBACK TO SAVEPOINT {FAST_SAVEPOINT}; RELEASE SAVEPOINT {FAST_SAVEPOINT}"
                ))
                .await?;
            Ok(None)
        }
        inserted => {
            let changed = refused_by_column(table, inserted)?
                .map_err(|error| script_failure(fast_event, table, error))?;
            released?;
            Ok(Some(changed))
        }
    }
}

/// Deletes of keys already gone are not conflicts: only keys still present are.
fn still_present(scratch: &UploadScratch<'_>, table: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {} AS t WHERE {})",
        q(table),
        scratch.key_match("t", "s")
    )
}

/// The scratch keys the table does not reflect: for deletes, keys still present; else
/// rows whose new image the table does not hold in the user's partition.
async fn unlanded_keys(
    target: &ScratchTarget<'_>,
    context: &TableApply<'_>,
    event: &str,
    scratch: &UploadScratch<'_>,
) -> Result<Vec<Row>, SyncError> {
    let table = context.table();
    let is_delete = event == UPLOAD_DELETE;
    let condition = if is_delete {
        still_present(scratch, table)
    } else {
        // The key by equality (a scratch key is never NULL: the driver refuses NULL keys),
        // so the primary key index finds the one row to compare with; the other columns
        // then by IS NOT DISTINCT FROM, which no index serves.
        let keys = &context.shape.key_columns;
        let type_of = |column: &str| {
            let index = context.shape.columns.iter().position(|c| c.name == column);
            index
                .and_then(|index| target.types.get(index))
                .map_or("", String::as_str)
        };
        let mut matches = vec![scratch.key_match("t", "s")];
        matches.extend(
            scratch
                .columns()
                .iter()
                .filter(|column| !column.starts_with(OLD_IMAGE_PREFIX) && !keys.contains(column))
                .map(|column| {
                    let c = q(column);
                    let ty = type_of(column);
                    format!(
                        "{} IS NOT DISTINCT FROM {}",
                        comparable(&format!("t.{c}"), ty),
                        comparable(&format!("s.{c}"), ty)
                    )
                }),
        );
        if let Some(partition) = context.partition_column {
            matches.push(format!("t.{}::text = $1", q(partition)));
        }
        format!(
            "NOT EXISTS (SELECT 1 FROM {} AS t WHERE {})",
            q(table),
            matches.join(" AND ")
        )
    };
    let sql = format!(
        "SELECT {} FROM {} AS s WHERE {condition}",
        scratch.key_list("s"),
        scratch.name()
    );
    let values = if !is_delete && context.partition_column.is_some() {
        vec![Value::Text(context.parameters.user.to_string())]
    } else {
        Vec::new()
    };
    Ok(scratch
        .query(target.transaction, target.statements, table, &sql, &values)
        .await??
        .1)
}
