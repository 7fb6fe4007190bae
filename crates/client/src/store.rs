//! The client's SQLite side: its own `rs_client_*` tables, the per-table change logs
//! kept by triggers, turning the logs into an in-flight upload, applying a download.

use std::collections::HashMap;

use rand::RngCore;
use rowsync_protocol::{
    message_frames, Download, KeyRange, Message, RefusedRow, Row, RowUpdate, TableUpload,
    TableWatermark, Value,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::kept::{for_each_upload, LosingRows, KEPT_CONFLICTS_DDL};
use crate::keys::{self, KEY_RANGE_DDL};
use crate::login::LOGIN_DDL;
use crate::rejected::{self, Refusals, REJECTED_DDL};
use crate::ClientError;

/// Random bytes in a generated client id (hex-encoded).
pub const CLIENT_ID_BYTES: usize = 16;

/// Upload messages are cut before they pass this many bytes, far below any frame limit.
pub const UPLOAD_MESSAGE_BYTES_MAX: usize = 1024 * 1024;

/// The largest single change (both images of an update) an upload can carry in its own
/// message: what fits one default-size frame with room for the message's own header.
/// Text and blob values of more than `UPLOAD_MESSAGE_BYTES_MAX / 16` bytes do not count:
/// in a change larger than a message they travel in pieces before it (protocol v2), each
/// up to the server's `value_bytes_max`.
pub const UPLOAD_ROW_BYTES_MAX: usize = rowsync_protocol::FRAME_BYTES_MAX_DEFAULT - 64 * 1024;

const OLD_PREFIX: &str = "rs_old_";

const CLIENT_TABLES: &str = "
CREATE TABLE IF NOT EXISTS rs_client_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    client_id TEXT NOT NULL,
    upload_sequence_acknowledged INTEGER NOT NULL DEFAULT 0,
    download_watermark INTEGER NOT NULL DEFAULT 0,
    applying_download INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rs_client_table (
    table_name TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS rs_client_inflight (
    upload_sequence INTEGER NOT NULL,
    part INTEGER NOT NULL,
    frame BLOB NOT NULL,
    operations INTEGER NOT NULL,
    PRIMARY KEY (upload_sequence, part)
);
CREATE TABLE IF NOT EXISTS rs_client_transfer (
    upload_sequence INTEGER PRIMARY KEY,
    transfer_id TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS rs_client_table_watermark (
    table_name TEXT PRIMARY KEY,
    watermark INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_client_download (
    upload_sequence INTEGER PRIMARY KEY,
    transfer_id TEXT NOT NULL,
    bytes BLOB NOT NULL
);
";

pub fn q(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn log_table(table: &str) -> String {
    format!("rs_log_{table}")
}

/// Columns added to the client's tables after their first release: (table, column, type).
const ADDED_COLUMNS: [(&str, &str, &str); 3] = [
    // The script version of the last download applied (NULL before it was recorded).
    ("rs_client_state", "script_version", "TEXT"),
    // The script version the in-flight upload was first sent with: it is resent with it.
    ("rs_client_inflight", "script_version", "TEXT"),
    // The tables the in-flight upload covers, one per line (NULL: all): it is resent
    // as a sync of those tables.
    ("rs_client_inflight", "tables", "TEXT"),
];

pub fn install(connection: &Connection, client_id: Option<&str>) -> Result<String, ClientError> {
    connection.execute_batch(CLIENT_TABLES)?;
    connection.execute_batch(KEPT_CONFLICTS_DDL)?;
    connection.execute_batch(REJECTED_DDL)?;
    connection.execute_batch(KEY_RANGE_DDL)?;
    connection.execute_batch(LOGIN_DDL)?;
    for (table, column, sql_type) in ADDED_COLUMNS {
        if !has_column(connection, table, column)? {
            connection.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN {column} {sql_type}"
            ))?;
        }
    }
    let existing: Option<String> = connection
        .query_row(
            "SELECT client_id FROM rs_client_state WHERE id = 1",
            [],
            |row| row.get(0),
        )
        .optional()?;
    match (existing, client_id) {
        (Some(existing), Some(wanted)) if existing != wanted => Err(ClientError::Schema(format!(
            "this database already belongs to client id {existing:?}, not {wanted:?}"
        ))),
        (Some(existing), _) => Ok(existing),
        (None, wanted) => {
            let client_id = wanted.map_or_else(new_client_id, str::to_owned);
            connection.execute(
                "INSERT INTO rs_client_state (id, client_id) VALUES (1, ?1)",
                [&client_id],
            )?;
            Ok(client_id)
        }
    }
}

/// A generated client id: `CLIENT_ID_BYTES` random bytes in lowercase hex.
fn new_client_id() -> String {
    let mut bytes = [0u8; CLIENT_ID_BYTES];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// Makes this database a new client of the server, in one transaction, after the server
/// found it is a copy or a restored backup of the one it knows under its client id: a
/// new generated client id, nothing acknowledged or downloaded yet (the next download
/// brings every row; rows with changes not yet uploaded are left alone as always), and
/// the upload in flight, if any, renumbered as the new client's first (its sequence is
/// only in the end of upload, not in its frames) with a new transfer id. The change logs
/// and the kept conflicts stay. Returns the new client id.
pub fn reregister(connection: &mut Connection) -> Result<String, ClientError> {
    let client_id = new_client_id();
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    transaction.execute(
        "UPDATE rs_client_state SET client_id = ?1, upload_sequence_acknowledged = 0, \
         download_watermark = 0 WHERE id = 1",
        [&client_id],
    )?;
    // At most one upload is in flight; were there two, the key would refuse this.
    transaction.execute("UPDATE rs_client_inflight SET upload_sequence = 1", [])?;
    transaction.execute("DELETE FROM rs_client_transfer", [])?;
    transaction.execute("DELETE FROM rs_client_download", [])?;
    transaction.execute("DELETE FROM rs_client_table_watermark", [])?;
    transaction.commit()?;
    Ok(client_id)
}

fn has_column(connection: &Connection, table: &str, column: &str) -> Result<bool, ClientError> {
    Ok(connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
        [table, column],
        |row| row.get(0),
    )?)
}

#[derive(Debug, Clone)]
pub struct Shape {
    pub columns: Vec<String>,
    pub key_columns: Vec<String>,
}

impl Shape {
    /// The columns outside the primary key, in table order: the change log's old image
    /// (the key's old values are the entry's key).
    pub fn value_columns(&self) -> impl Iterator<Item = &String> {
        self.columns
            .iter()
            .filter(|c| !self.key_columns.contains(c))
    }
}

pub fn shape(connection: &Connection, table: &str) -> Result<Option<Shape>, ClientError> {
    let mut statement =
        connection.prepare("SELECT name, pk FROM pragma_table_info(?1) ORDER BY cid")?;
    let mut columns = Vec::new();
    let mut keys = Vec::new();
    let mut rows = statement.query([table])?;
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let position: i64 = row.get(1)?;
        if position > 0 {
            keys.push((position, name.clone()));
        }
        columns.push(name);
    }
    if columns.is_empty() {
        return Ok(None);
    }
    keys.sort();
    Ok(Some(Shape {
        columns,
        key_columns: keys.into_iter().map(|(_, name)| name).collect(),
    }))
}

/// Installs the change log of `table` and its triggers. Idempotent.
///
/// The log holds one operation per primary key, changed between two syncs:
/// `I` inserted here, `U` changed here (with the old image: the row as the server last
/// had it), `D` deleted here (with the old image), `X` inserted and deleted again here.
/// Collapse rules: insert → `I`, after `D` → `U`, after `X` → `I`; update of an
/// unlogged row → `U` with the old image, of a logged row → unchanged (the new image
/// is read at upload time); delete of an unlogged row or after `U` → `D` (keeping the
/// first old image), after `I` → `X`, after `D` or `X` → unchanged. An update that
/// changes the key is a delete of the old key and an insert of the new one.
///
/// Rows that `INSERT OR REPLACE`, `REPLACE` or `UPDATE OR REPLACE` will displace are
/// recorded as deleted by BEFORE triggers, since SQLite runs no delete trigger for them
/// unless the writing connection turned `recursive_triggers` on. A delete recorded
/// twice changes nothing, so the outcome is the same with the pragma on or off. A
/// displacement recorded for a row that then stayed (the statement was an `OR IGNORE`
/// or an upsert) is harmless: the upload reads whether each logged row exists (see
/// [`next_batch`]).
///
/// When the table is tracked for the first time, the rows it already holds are logged
/// as inserts (uploaded at the next sync), unless `existing` says they came from the
/// server; tracked again (after a schema change) it logs nothing new.
pub fn track(
    connection: &mut Connection,
    table: &str,
    existing: ExistingRows,
) -> Result<(), ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    track_in(&transaction, table, existing)?;
    transaction.commit()?;
    Ok(())
}

/// What the first `track` of a table does with the rows the table already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExistingRows {
    /// They are this client's own writes: uploaded as inserts at the next sync (a key
    /// the server has already is then a conflict, and the losing row is kept).
    #[default]
    Upload,
    /// They came from the server (a database seeded by a download, or shipped
    /// pre-synced): not uploaded. Their later changes are, as for any row.
    FromServer,
}

impl std::str::FromStr for ExistingRows {
    type Err = ClientError;

    fn from_str(name: &str) -> Result<ExistingRows, ClientError> {
        match name {
            "upload" => Ok(ExistingRows::Upload),
            "from_server" | "from-server" => Ok(ExistingRows::FromServer),
            other => Err(ClientError::Schema(format!(
                "existing rows {other:?}: say \"upload\" (the rows are this client's own \
                 writes) or \"from_server\" (they came from the server)"
            ))),
        }
    }
}

/// Changes a tracked table's schema with `sql` (`ALTER TABLE ... DROP COLUMN`, which
/// SQLite refuses while triggers name the column) and tracks it again, in one
/// transaction: the triggers are dropped first and the change log migrated after.
pub fn alter_tracked(
    connection: &mut Connection,
    table: &str,
    sql: &str,
) -> Result<(), ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    drop_triggers(&transaction, table)?;
    transaction.execute_batch(sql)?;
    track_in(&transaction, table, ExistingRows::FromServer)?;
    transaction.commit()?;
    Ok(())
}

fn track_in(
    connection: &Connection,
    table: &str,
    existing: ExistingRows,
) -> Result<(), ClientError> {
    if table.starts_with("rs_") {
        return Err(ClientError::Schema(
            "tables named rs_* are rowsync's own".into(),
        ));
    }
    let shape = shape(connection, table)?.ok_or_else(|| {
        ClientError::Schema(format!(
            "table {table:?} does not exist in the client database"
        ))
    })?;
    if shape.key_columns.is_empty() {
        return Err(ClientError::Schema(format!(
            "table {table:?} has no primary key; rowsync identifies rows by their primary key"
        )));
    }
    let unique_sets = unique_column_sets(connection, table)?;
    let first = !tracked_tables(connection)?.iter().any(|t| t == table);
    migrate_log(connection, table, &shape)?;
    connection.execute_batch(&TriggerSql::new(table, &shape).ddl(&unique_sets))?;
    if first && existing == ExistingRows::Upload {
        log_existing_rows(connection, table, &shape)?;
    }
    Ok(())
}

/// Logs every row `table` holds as inserted here (a row logged already keeps its entry).
fn log_existing_rows(
    connection: &Connection,
    table: &str,
    shape: &Shape,
) -> Result<(), ClientError> {
    let keys = join(&shape.key_columns, |k| q(k), ", ");
    connection.execute(
        &format!(
            "INSERT INTO {log} ({keys}, rs_op) SELECT {keys}, 'I' FROM {table} WHERE true
             ON CONFLICT ({keys}) DO NOTHING",
            log = q(&log_table(table)),
            table = q(table),
        ),
        [],
    )?;
    Ok(())
}

/// The suffixes of the triggers `track` installs (`rs_log_<suffix>_<table>`).
const TRIGGER_SUFFIXES: [&str; 6] = [
    "displace_insert",
    "displace_update",
    "insert",
    "update",
    "rekey",
    "delete",
];

fn drop_triggers(connection: &Connection, table: &str) -> Result<(), ClientError> {
    for suffix in TRIGGER_SUFFIXES {
        connection.execute_batch(&format!(
            "DROP TRIGGER IF EXISTS {}",
            q(&format!("rs_log_{suffix}_{table}"))
        ))?;
    }
    Ok(())
}

/// Brings an existing change log to the table's columns, keeping every entry: a column
/// added since gets its old image from the row as it is now (what the server has, once
/// it added the column with the same default), a column dropped since leaves the log.
/// A changed primary key is refused while changes are pending.
fn migrate_log(connection: &Connection, table: &str, shape: &Shape) -> Result<(), ClientError> {
    let log = log_table(table);
    let Some(logged) = self::shape(connection, &log)? else {
        return Ok(());
    };
    let wanted: Vec<String> = shape
        .key_columns
        .iter()
        .cloned()
        .chain(std::iter::once("rs_op".to_string()))
        .chain(shape.value_columns().map(|c| format!("{OLD_PREFIX}{c}")))
        .collect();
    if logged.columns == wanted {
        return Ok(());
    }
    drop_triggers(connection, table)?;
    if logged.key_columns != shape.key_columns {
        return drop_log_of_old_key(connection, table, &log);
    }
    connection.execute_batch(&log_migration(table, shape, &logged))?;
    Ok(())
}

/// The log of a table whose primary key changed goes, unless changes wait in it.
fn drop_log_of_old_key(connection: &Connection, table: &str, log: &str) -> Result<(), ClientError> {
    let pending: i64 =
        connection.query_row(&format!("SELECT count(*) FROM {}", q(log)), [], |row| {
            row.get(0)
        })?;
    if pending > 0 {
        return Err(ClientError::Schema(format!(
            "the primary key of table {table:?} changed while {pending} changes of it wait \
             for upload; sync them before changing the key"
        )));
    }
    connection.execute_batch(&format!("DROP TABLE {}", q(log)))?;
    Ok(())
}

/// The statements that copy the log (`logged`) into one of the table's columns now
/// (`shape`), filling added columns' old images from the rows as they are.
fn log_migration(table: &str, shape: &Shape, logged: &Shape) -> String {
    let log = log_table(table);
    let sql = TriggerSql::new(table, shape);
    let migrating = format!("{log}_migrating");
    // A log made before the old image left out the key columns (`rs_old_<key>`, always
    // equal to the entry's key) loses them here.
    let kept: Vec<String> = shape
        .value_columns()
        .map(|c| format!("{OLD_PREFIX}{c}"))
        .filter(|old| logged.columns.contains(old))
        .collect();
    let added: Vec<&String> = shape
        .value_columns()
        .filter(|c| !logged.columns.contains(&format!("{OLD_PREFIX}{c}")))
        .collect();
    let moved = join(&shape.key_columns, |k| q(k), ", ")
        + ", rs_op"
        + &kept
            .iter()
            .map(|c| format!(", {}", q(c)))
            .collect::<String>();
    let mut batch = format!(
        "CREATE TABLE {m} ({keys}, rs_op TEXT NOT NULL{old}, PRIMARY KEY ({keys})) WITHOUT ROWID;
         INSERT INTO {m} ({moved}) SELECT {moved} FROM {l};\n",
        m = q(&migrating),
        keys = sql.keys,
        old = sql.old_columns,
        l = q(&log),
    );
    if !added.is_empty() {
        let row_is_logged = join(
            &shape.key_columns,
            |k| format!("t.{k} = {m}.{k}", k = q(k), m = q(&migrating)),
            " AND ",
        );
        let current = join(
            &added,
            |c| {
                format!(
                    "{} = (SELECT t.{} FROM {} AS t WHERE {row_is_logged})",
                    q(&format!("{OLD_PREFIX}{c}")),
                    q(c),
                    q(table)
                )
            },
            ", ",
        );
        batch.push_str(&format!("UPDATE {} SET {current};\n", q(&migrating)));
    }
    batch.push_str(&format!(
        "DROP TABLE {l}; ALTER TABLE {m} RENAME TO {l};",
        l = q(&log),
        m = q(&migrating)
    ));
    batch
}

/// The column sets of the secondary UNIQUE constraints and indexes of `table` (the
/// primary key excluded): an `OR REPLACE` write displaces the rows equal on any of
/// them. Indexes on expressions are left out, as no trigger can compare them.
fn unique_column_sets(
    connection: &Connection,
    table: &str,
) -> Result<Vec<Vec<String>>, ClientError> {
    let mut indexes = connection.prepare(
        "SELECT name FROM pragma_index_list(?1) WHERE \"unique\" = 1 AND origin <> 'pk' ORDER BY name",
    )?;
    let names: Vec<String> = indexes
        .query_map([table], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut columns_of =
        connection.prepare("SELECT cid, name FROM pragma_index_info(?1) ORDER BY seqno")?;
    let mut sets = Vec::new();
    for name in names {
        let columns: Vec<(i64, Option<String>)> = columns_of
            .query_map([&name], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let plain: Option<Vec<String>> = columns
            .into_iter()
            .map(|(cid, column)| column.filter(|_| cid >= 0))
            .collect();
        if let Some(plain) = plain.filter(|set| !set.is_empty()) {
            sets.push(plain);
        }
    }
    Ok(sets)
}

/// The SQL of one tracked table's log and triggers.
struct TriggerSql {
    table: String,
    log: String,
    target: String,
    /// Quoted key columns, comma-separated.
    keys: String,
    /// `, "rs_old_c"` for each column outside the key (empty when every column is a
    /// key column): the log's old-image columns, written after `rs_op`.
    old_columns: String,
    key_columns: Vec<String>,
    /// The columns outside the key.
    value_columns: Vec<String>,
}

impl TriggerSql {
    fn new(table: &str, shape: &Shape) -> TriggerSql {
        let value_columns: Vec<String> = shape.value_columns().cloned().collect();
        TriggerSql {
            table: table.to_string(),
            log: q(&log_table(table)),
            target: q(table),
            keys: join(&shape.key_columns, |k| q(k), ", "),
            old_columns: join(
                &value_columns,
                |c| format!(", {}", q(&format!("{OLD_PREFIX}{c}"))),
                "",
            ),
            key_columns: shape.key_columns.clone(),
            value_columns,
        }
    }

    /// `alias.column` for each of `names`.
    fn image(alias: &str, names: &[String]) -> String {
        join(names, |c| format!("{alias}.{}", q(c)), ", ")
    }

    /// `, alias.column` for each column outside the key: the old image's values.
    fn old_image(&self, alias: &str) -> String {
        join(&self.value_columns, |c| format!(", {alias}.{}", q(c)), "")
    }

    /// Records an insert of the row `NEW`.
    fn log_insert(&self) -> String {
        format!(
            "INSERT INTO {log} ({keys}, rs_op) VALUES ({new_keys}, 'I')
                 ON CONFLICT ({keys}) DO UPDATE SET rs_op = CASE rs_op WHEN 'D' THEN 'U' WHEN 'X' THEN 'I' ELSE rs_op END;",
            log = self.log,
            keys = self.keys,
            new_keys = Self::image("NEW", &self.key_columns),
        )
    }

    /// Records the delete of the rows `SELECT ... FROM target AS t WHERE {condition}`
    /// finds (at most one per unique column set).
    fn log_delete_where(&self, condition: &str) -> String {
        format!(
            "INSERT INTO {log} ({keys}, rs_op{old_columns})
                 SELECT {t_keys}, 'D'{t_image} FROM {target} AS t WHERE {condition}
                 ON CONFLICT ({keys}) DO UPDATE SET rs_op = CASE rs_op WHEN 'I' THEN 'X' WHEN 'X' THEN 'X' ELSE 'D' END;",
            log = self.log,
            keys = self.keys,
            old_columns = self.old_columns,
            t_keys = Self::image("t", &self.key_columns),
            t_image = self.old_image("t"),
            target = self.target,
        )
    }

    /// Records the delete of the row `OLD`.
    fn log_delete_old(&self) -> String {
        format!(
            "INSERT INTO {log} ({keys}, rs_op{old_columns}) VALUES ({old_keys}, 'D'{old_image})
                 ON CONFLICT ({keys}) DO UPDATE SET rs_op = CASE rs_op WHEN 'I' THEN 'X' WHEN 'X' THEN 'X' ELSE 'D' END;",
            log = self.log,
            keys = self.keys,
            old_columns = self.old_columns,
            old_keys = Self::image("OLD", &self.key_columns),
            old_image = self.old_image("OLD"),
        )
    }

    /// Logs an update of a row's other columns: its old image, unless already logged.
    fn log_update(&self) -> String {
        format!(
            "INSERT INTO {log} ({keys}, rs_op{old_columns}) VALUES ({new_keys}, 'U'{old_image})
        ON CONFLICT ({keys}) DO NOTHING;",
            log = self.log,
            keys = self.keys,
            old_columns = self.old_columns,
            new_keys = Self::image("NEW", &self.key_columns),
            old_image = self.old_image("OLD"),
        )
    }

    /// Logs as deleted the rows an OR REPLACE write would displace: equal to NEW on the
    /// key or on a secondary unique column set, and (`updating`) not the row updated.
    fn log_displaced(&self, unique_sets: &[Vec<String>], updating: bool) -> String {
        let equal = |set: &[String], alias: &str| {
            join(set, |c| format!("t.{c} = {alias}.{c}", c = q(c)), " AND ")
        };
        let is_old_row = equal(&self.key_columns, "OLD");
        std::iter::once(&self.key_columns)
            .chain(unique_sets)
            .map(|set| {
                let new_row_equal = equal(set, "NEW");
                self.log_delete_where(&match updating {
                    true => format!("{new_row_equal} AND NOT ({is_old_row})"),
                    false => new_row_equal,
                })
            })
            .collect::<Vec<_>>()
            .join("\n    ")
    }

    /// The key's columns and those of every secondary unique column set, once each.
    fn unique_columns(&self, unique_sets: &[Vec<String>]) -> Vec<String> {
        let mut columns: Vec<String> = self.key_columns.clone();
        for column in unique_sets.iter().flatten() {
            if !columns.contains(column) {
                columns.push(column.clone());
            }
        }
        columns
    }

    fn trigger(&self, suffix: &str) -> String {
        q(&format!("rs_log_{suffix}_{}", self.table))
    }

    /// `UPDATE OF` column list of a trigger that must see every change of `columns`:
    /// with SQLite's names of the rowid too, since `SET rowid = ...` changes an
    /// `INTEGER PRIMARY KEY` without naming it (names that are no column match nothing).
    fn update_of(columns: &[String]) -> String {
        let mut names: Vec<String> = columns.to_vec();
        for alias in ["rowid", "_rowid_", "oid"] {
            if !names.iter().any(|n| n.eq_ignore_ascii_case(alias)) {
                names.push(alias.to_string());
            }
        }
        join(&names, |c| q(c), ", ")
    }

    /// The log, and one trigger per kind of change. Only the triggers a statement's
    /// kind and `SET` list can fire are compiled into it, and SQLite sets each fired
    /// trigger program up once per statement: an update of non-key columns runs one
    /// trigger, a delete one, an insert two (the displacement probe and the log).
    fn ddl(&self, unique_sets: &[Vec<String>]) -> String {
        let not_applying = "(SELECT applying_download FROM rs_client_state WHERE id = 1) = 0";
        let key_changed = join(
            &self.key_columns,
            |k| format!("OLD.{k} IS NOT NEW.{k}", k = q(k)),
            " OR ",
        );
        let mut ddl = format!(
            "CREATE TABLE IF NOT EXISTS {log} ({keys}, rs_op TEXT NOT NULL{old_columns}, PRIMARY KEY ({keys})) WITHOUT ROWID;\n",
            log = self.log,
            keys = self.keys,
            old_columns = self.old_columns,
        );
        let mut trigger = |suffix: &str, timing_event: &str, when: &str, body: &str| {
            let name = self.trigger(suffix);
            ddl.push_str(&format!(
                "DROP TRIGGER IF EXISTS {name};
CREATE TRIGGER {name} {timing_event} ON {target} WHEN {not_applying}{when} BEGIN
    {body}
END;
",
                target = self.target
            ));
        };
        trigger(
            "displace_insert",
            "BEFORE INSERT",
            "",
            &self.log_displaced(unique_sets, false),
        );
        let unique_columns = self.unique_columns(unique_sets);
        trigger(
            "displace_update",
            &format!("BEFORE UPDATE OF {}", Self::update_of(&unique_columns)),
            "",
            &self.log_displaced(unique_sets, true),
        );
        trigger("insert", "AFTER INSERT", "", &self.log_insert());
        trigger(
            "update",
            "AFTER UPDATE",
            &format!(" AND NOT ({key_changed})"),
            &self.log_update(),
        );
        // Fired only by statements that set a key column (or the rowid).
        trigger(
            "rekey",
            &format!("AFTER UPDATE OF {}", Self::update_of(&self.key_columns)),
            &format!(" AND ({key_changed})"),
            &format!("{}\n    {}", self.log_delete_old(), self.log_insert()),
        );
        trigger("delete", "AFTER DELETE", "", &self.log_delete_old());
        ddl.push_str(&format!(
            "INSERT OR IGNORE INTO rs_client_table (table_name) VALUES ('{}');\n",
            self.table.replace('\'', "''")
        ));
        ddl
    }
}

fn join<T>(items: &[T], each: impl Fn(&T) -> String, separator: &str) -> String {
    items.iter().map(each).collect::<Vec<_>>().join(separator)
}

pub fn tracked_tables(connection: &Connection) -> Result<Vec<String>, ClientError> {
    let mut statement =
        connection.prepare("SELECT table_name FROM rs_client_table ORDER BY table_name")?;
    let tables = statement
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(tables)
}

/// The tracked tables in the order an upload carries them: parents first by the foreign
/// keys of the client's own schema (`rowsync_protocol::parent_first`, the order the
/// server applies inserts and updates in), so a server that applies tables as they come
/// gets a rental before its payment too.
pub fn upload_order(connection: &Connection) -> Result<Vec<String>, ClientError> {
    let references = references(connection)?;
    let tables: Vec<(String, Vec<String>)> = tracked_tables(connection)?
        .into_iter()
        .map(|table| {
            let parents = references
                .iter()
                .filter(|(child, _)| *child == table)
                .map(|(_, parent)| parent.clone())
                .collect();
            (table, parents)
        })
        .collect();
    let order = rowsync_protocol::parent_first(&tables).parent_first;
    Ok(order.into_iter().map(|i| tables[i].0.clone()).collect())
}

/// (child, parent) for each foreign key of a tracked table, by the client's own schema,
/// the parent named as tracked where it is.
fn references(connection: &Connection) -> Result<Vec<(String, String)>, ClientError> {
    let mut statement = connection.prepare(
        "SELECT t.table_name, COALESCE((SELECT r.table_name FROM rs_client_table AS r
                 WHERE r.table_name = f.\"table\" COLLATE NOCASE), f.\"table\")
         FROM rs_client_table AS t, pragma_foreign_key_list(t.table_name) AS f",
    )?;
    let references = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(references)
}

/// `tables` and the tracked tables they reference, transitively (by the foreign keys of
/// the client's schema), in their order: a sync of some tables never sends or brings a
/// row before its parent.
pub fn with_parents(
    connection: &Connection,
    tables: &[String],
) -> Result<Vec<String>, ClientError> {
    let references = references(connection)?;
    let tracked = tracked_tables(connection)?;
    let mut covered = tables.to_vec();
    let mut next = 0;
    while let Some(table) = covered.get(next).cloned() {
        next += 1;
        for (_, parent) in references.iter().filter(|(child, _)| *child == table) {
            if tracked.contains(parent) && !covered.contains(parent) {
                covered.push(parent.clone());
            }
        }
    }
    Ok(covered)
}

#[derive(Debug, Clone)]
pub struct State {
    pub upload_sequence_acknowledged: u64,
    pub download_watermark: i64,
    /// The script version of the last download applied; `None` before one was recorded.
    pub script_version: Option<String>,
}

pub fn state(connection: &Connection) -> Result<State, ClientError> {
    Ok(connection.query_row(
        "SELECT upload_sequence_acknowledged, download_watermark, script_version FROM rs_client_state WHERE id = 1",
        [],
        |row| {
            Ok(State {
                upload_sequence_acknowledged: row.get::<_, i64>(0)? as u64,
                download_watermark: row.get(1)?,
                script_version: row.get(2)?,
            })
        },
    )?)
}

/// An upload waiting for the server's acknowledgement, as the frames to send.
#[derive(Debug)]
pub struct Batch {
    pub upload_sequence: u64,
    /// The script version the upload was first sent with (a resend uses it again, so
    /// the scripts that expect its columns apply it); `None` when not recorded.
    pub script_version: Option<String>,
    pub frames: Vec<Vec<u8>>,
    pub operations: u64,
    /// This batch was sent before without an answer: the server may have applied it.
    pub is_retry: bool,
    /// The key ranges this client holds, as they stood when the batch was taken
    /// (protocol v7 sends them before the end of upload).
    pub key_ranges: Vec<KeyRange>,
    /// The tables the sync of this upload covers (protocol v9); `None`: all.
    pub tables: Option<Vec<String>>,
}

/// The watermarks of tables synced on their own since the last sync of every table
/// (protocol v9): each is above the client's `download_watermark`.
pub fn table_watermarks(connection: &Connection) -> Result<Vec<TableWatermark>, ClientError> {
    let mut statement = connection.prepare(
        "SELECT table_name, watermark FROM rs_client_table_watermark ORDER BY table_name",
    )?;
    let watermarks = statement
        .query_map([], |row| {
            Ok(TableWatermark {
                table: row.get(0)?,
                last_download: row.get(1)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(watermarks)
}

fn tables_text(tables: Option<&[String]>) -> Option<String> {
    tables.map(|tables| tables.join("\n"))
}

fn tables_of(text: Option<String>) -> Option<Vec<String>> {
    text.map(|text| text.split('\n').map(str::to_owned).collect())
}

/// The transfer an upload is sent as (protocol v3), and the attempts made before this
/// one: created with `new_id` on the first attempt, kept until the upload is
/// acknowledged, each call counting one attempt.
pub fn transfer_attempt(
    connection: &mut Connection,
    upload_sequence: u64,
    new_id: &str,
) -> Result<(String, u64), ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    transaction.execute(
        "INSERT OR IGNORE INTO rs_client_transfer (upload_sequence, transfer_id) VALUES (?1, ?2)",
        params![upload_sequence as i64, new_id],
    )?;
    let (transfer_id, attempts): (String, i64) = transaction.query_row(
        "UPDATE rs_client_transfer SET attempts = attempts + 1 WHERE upload_sequence = ?1 \
         RETURNING transfer_id, attempts - 1",
        [upload_sequence as i64],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    transaction.commit()?;
    Ok((transfer_id, attempts.max(0) as u64))
}

/// The start of a cut download the client keeps for its transfer (protocol v4), if any.
pub fn kept_download(
    connection: &Connection,
    upload_sequence: u64,
    transfer_id: &str,
) -> Result<Option<Vec<u8>>, ClientError> {
    Ok(connection
        .query_row(
            "SELECT bytes FROM rs_client_download WHERE upload_sequence = ?1 AND transfer_id = ?2",
            params![upload_sequence as i64, transfer_id],
            |row| row.get(0),
        )
        .optional()?)
}

/// Keeps the start of a cut download (replacing what was kept), durably: the next
/// attempt continues from its end.
pub fn keep_download(
    connection: &Connection,
    upload_sequence: u64,
    transfer_id: &str,
    bytes: &[u8],
) -> Result<(), ClientError> {
    connection.execute(
        "INSERT OR REPLACE INTO rs_client_download (upload_sequence, transfer_id, bytes) \
         VALUES (?1, ?2, ?3)",
        params![upload_sequence as i64, transfer_id, bytes],
    )?;
    Ok(())
}

/// Drops a kept download start (the server no longer holds it, or it did not match).
pub fn forget_download(connection: &Connection) -> Result<(), ClientError> {
    connection.execute("DELETE FROM rs_client_download", [])?;
    Ok(())
}

/// The in-flight upload if one awaits acknowledgement (it is resent unchanged, with
/// its sequence, so the server can tell it applied it already); otherwise a new one
/// made by moving the change logs out, in one transaction.
#[cfg(test)]
pub fn next_batch(connection: &mut Connection) -> Result<Batch, ClientError> {
    next_batch_for(connection, None, None)
}

/// [`next_batch`], recording that a new upload is sent with `script_version`, as a sync
/// of `tables` (their changes only; `None`: all).
pub fn next_batch_for(
    connection: &mut Connection,
    script_version: Option<&str>,
    tables: Option<&[String]>,
) -> Result<Batch, ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Before an upload in flight is sent again: a refused option sends nothing.
    let order = upload_order(&transaction)?;
    if let Some(untracked) = tables
        .unwrap_or_default()
        .iter()
        .find(|table| !order.contains(table))
    {
        return Err(ClientError::Option(format!(
            "table {untracked:?} is not tracked in this client database: sync some tables \
             only among those tracked (`rowsync track`, Client::track)"
        )));
    }
    let inflight: Option<i64> = transaction.query_row(
        "SELECT max(upload_sequence) FROM rs_client_inflight",
        [],
        |row| row.get(0),
    )?;
    if let Some(sequence) = inflight {
        let (sent_with, covered): (Option<String>, Option<String>) = transaction.query_row(
            "SELECT script_version, tables FROM rs_client_inflight WHERE upload_sequence = ?1 AND part = 0",
            [sequence],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
        let mut statement = transaction
            .prepare("SELECT frame, operations FROM rs_client_inflight WHERE upload_sequence = ?1 AND part > 0 ORDER BY part")?;
        let mut frames = Vec::new();
        let mut operations = 0u64;
        let mut rows = statement.query([sequence])?;
        while let Some(row) = rows.next()? {
            frames.push(row.get::<_, Vec<u8>>(0)?);
            operations += row.get::<_, i64>(1)? as u64;
        }
        return Ok(Batch {
            upload_sequence: sequence as u64,
            script_version: sent_with,
            frames,
            operations,
            is_retry: true,
            key_ranges: keys::held(&transaction)?,
            tables: tables_of(covered),
        });
    }
    let sequence = state(&transaction)?.upload_sequence_acknowledged + 1;
    let mut messages = Vec::new();
    for table in order {
        if tables.is_none_or(|tables| tables.contains(&table)) {
            collect_table_upload(&transaction, &table, &mut messages)?;
        }
    }
    let marker = Marker {
        sequence,
        script_version,
        tables,
    };
    let (frames, operations_total) = write_inflight(&transaction, &marker, messages)?;
    let key_ranges = keys::held(&transaction)?;
    transaction.commit()?;
    Ok(Batch {
        upload_sequence: sequence,
        script_version: script_version.map(str::to_owned),
        frames,
        operations: operations_total,
        is_retry: false,
        key_ranges,
        tables: tables.map(<[String]>::to_vec),
    })
}

/// What the marker row of an upload in flight records.
struct Marker<'a> {
    sequence: u64,
    script_version: Option<&'a str>,
    tables: Option<&'a [String]>,
}

/// Writes an upload in flight as its frames: the marker row (part 0, with the script
/// version it is sent with), then the messages' frames. Returns the frames and the
/// operations they carry.
fn write_inflight(
    transaction: &Connection,
    marker: &Marker,
    messages: Vec<TableUpload>,
) -> Result<(Vec<Vec<u8>>, u64), ClientError> {
    let sequence = marker.sequence;
    let mut operations_total = 0u64;
    let mut frames = Vec::with_capacity(messages.len());
    let mut insert = transaction.prepare(
        "INSERT INTO rs_client_inflight (upload_sequence, part, frame, operations) VALUES (?1, ?2, ?3, ?4)",
    )?;
    // An empty upload still gets its sequence and this marker row: the sync is then
    // acknowledged like any other.
    transaction.execute(
        "INSERT INTO rs_client_inflight (upload_sequence, part, frame, operations, script_version, tables)
         VALUES (?1, 0, x'', 0, ?2, ?3)",
        params![sequence as i64, marker.script_version, tables_text(marker.tables)],
    )?;
    for upload in messages {
        let operations =
            (upload.inserts.len() + upload.updates.len() + upload.deletes.len()) as u64;
        operations_total += operations;
        // A change larger than a message sends its large values first, in pieces: each
        // piece is a part of its own; the message's part counts the operations.
        let mut frames_of =
            message_frames(Message::Upload(upload), UPLOAD_MESSAGE_BYTES_MAX).peekable();
        while let Some(frame) = frames_of.next() {
            let counted = if frames_of.peek().is_none() {
                operations
            } else {
                0
            };
            insert.execute(params![
                sequence as i64,
                frames.len() as i64 + 1,
                frame,
                counted as i64
            ])?;
            frames.push(frame);
        }
    }
    Ok((frames, operations_total))
}

/// Records that the upload in flight is sent with `script_version` from now on (the
/// server refused the version it was first sent with).
pub fn send_with(
    connection: &Connection,
    batch: &Batch,
    script_version: &str,
) -> Result<(), ClientError> {
    connection.execute(
        "UPDATE rs_client_inflight SET script_version = ?2 WHERE upload_sequence = ?1 AND part = 0",
        params![batch.upload_sequence as i64, script_version],
    )?;
    Ok(())
}

/// After the server refused rows of the upload in flight (and applied nothing): moves
/// their changes into `rs_client_rejected` and rewrites the upload without them, under
/// the same sequence, for `script_version` (the version the application now asks for),
/// with a new transfer id. In one transaction; returns the changes set aside.
pub fn set_aside(
    connection: &mut Connection,
    batch: &Batch,
    refused: &[RefusedRow],
    script_version: &str,
) -> Result<u64, ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let refusals = Refusals::new(refused);
    let mut messages = Vec::new();
    let mut set_aside = 0;
    for_each_upload(&batch.frames, |mut upload| {
        set_aside += refusals.set_aside(&transaction, &mut upload, batch.upload_sequence)?;
        if !(upload.inserts.is_empty() && upload.updates.is_empty() && upload.deletes.is_empty()) {
            messages.push(upload);
        }
        Ok(())
    })?;
    let sequence = batch.upload_sequence as i64;
    transaction.execute(
        "DELETE FROM rs_client_inflight WHERE upload_sequence = ?1",
        [sequence],
    )?;
    transaction.execute(
        "DELETE FROM rs_client_transfer WHERE upload_sequence = ?1",
        [sequence],
    )?;
    transaction.execute("DELETE FROM rs_client_download", [])?;
    let marker = Marker {
        sequence: batch.upload_sequence,
        script_version: Some(script_version),
        tables: batch.tables.as_deref(),
    };
    write_inflight(&transaction, &marker, messages)?;
    transaction.commit()?;
    Ok(set_aside)
}

/// Puts a rejected change back in its table's change log, replacing the entry a later
/// write made there (the server never took the change, so it still holds the row the
/// rejected change started from), and removes it from `rs_client_rejected`. The next
/// sync uploads the row as it is then. Returns false when there is no such change.
pub fn requeue(connection: &mut Connection, id: i64) -> Result<bool, ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(rejected) = rejected::rejected_row(&transaction, id)? else {
        return Ok(false);
    };
    let table = rejected.table.as_str();
    if !tracked_tables(&transaction)?.iter().any(|t| t == table) {
        return Err(ClientError::Schema(format!(
            "table {table:?} is no longer tracked: track it again before re-queueing its \
             rejected change {id}"
        )));
    }
    let shape = shape(&transaction, table)?
        .ok_or_else(|| ClientError::Schema(format!("tracked table {table:?} no longer exists")))?;
    let op = match rejected.operation.as_str() {
        "insert" => "I",
        "update" => "U",
        _ => "D",
    };
    let mut columns = shape.key_columns.clone();
    let mut values = rejected::sql_values(&rejected.key, &shape.key_columns)?;
    if let Some(old) = &rejected.old_row {
        let value_columns: Vec<String> = shape.value_columns().cloned().collect();
        values.extend(rejected::sql_values(old, &value_columns)?);
        columns.extend(value_columns.iter().map(|c| format!("{OLD_PREFIX}{c}")));
    }
    // The entry is replaced whole: a later write's old image never stays.
    let sql = format!(
        "INSERT OR REPLACE INTO {log} ({names}, rs_op) VALUES ({marks}, ?{op_mark})",
        log = q(&log_table(table)),
        names = join(&columns, |c| q(c), ", "),
        marks = (1..=columns.len())
            .map(|n| format!("?{n}"))
            .collect::<Vec<_>>()
            .join(", "),
        op_mark = columns.len() + 1,
    );
    values.push(rusqlite::types::Value::Text(op.into()));
    transaction.execute(&sql, rusqlite::params_from_iter(values))?;
    rejected::remove_rejected(&transaction, id)?;
    transaction.commit()?;
    Ok(true)
}

/// Stops tracking `table`: its triggers and change log go, and changes it logged that
/// were not uploaded yet are set aside in `rs_client_rejected` (with that reason), not
/// dropped. Changes already in flight still go up. In one transaction.
pub fn untrack(connection: &mut Connection, table: &str) -> Result<u64, ClientError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if !tracked_tables(&transaction)?.iter().any(|t| t == table) {
        return Err(ClientError::Schema(format!(
            "table {table:?} is not tracked"
        )));
    }
    let mut messages = Vec::new();
    if shape(&transaction, table)?.is_some() {
        collect_table_upload(&transaction, table, &mut messages)?;
    }
    let untracked = [RefusedRow {
        table: table.to_string(),
        key_columns: Vec::new(),
        key: Row::new(),
        code: 0,
        reason: format!("table {table:?} was untracked before this change was uploaded"),
    }];
    let refusals = Refusals::new(&untracked);
    let mut set_aside = 0;
    for mut upload in messages {
        set_aside += refusals.set_aside(&transaction, &mut upload, 0)?;
    }
    drop_triggers(&transaction, table)?;
    transaction.execute_batch(&format!("DROP TABLE IF EXISTS {}", q(&log_table(table))))?;
    transaction.execute("DELETE FROM rs_client_table WHERE table_name = ?1", [table])?;
    transaction.commit()?;
    Ok(set_aside)
}

/// What one change-log entry uploads.
enum Change {
    Insert,
    Update,
    Delete,
}

impl Change {
    /// What an entry of operation `op` uploads, given whether its row exists and whether
    /// the row equals the entry's old image; `None`: nothing.
    fn of(
        table: &str,
        op: &str,
        exists: bool,
        unchanged: bool,
    ) -> Result<Option<Change>, ClientError> {
        Ok(match (op, exists) {
            ("I" | "X", true) => Some(Change::Insert),
            ("I" | "X", false) => None,
            // Recorded as displaced by a write that then left it in place, or changed
            // and changed back: nothing to send.
            ("U" | "D", true) if unchanged => None,
            ("U" | "D", true) => Some(Change::Update),
            ("U" | "D", false) => Some(Change::Delete),
            (other, _) => {
                return Err(ClientError::Schema(format!(
                    "change log of {table:?} holds unknown operation {other:?}"
                )))
            }
        })
    }
}

/// The query over a table's change log: each entry's operation, key and old image,
/// whether its row exists now, and the row as it is.
fn log_entries_query(table: &str, shape: &Shape) -> Result<String, ClientError> {
    let join = shape
        .key_columns
        .iter()
        .map(|k| format!("t.{k} = l.{k}", k = q(k)))
        .collect::<Vec<_>>()
        .join(" AND ");
    // Whether the row exists: its first key column is non-NULL exactly when the join
    // matched (`=` never matches NULL). Not `t.rowid`: WITHOUT ROWID tables have none.
    Ok(format!(
        "SELECT l.rs_op, {keys}, {old}, t.{first_key} IS NOT NULL, {new} FROM {log} AS l LEFT JOIN {table_q} AS t ON {join}",
        first_key = q(shape.key_columns.first().ok_or_else(|| {
            ClientError::Schema(format!("tracked table {table:?} no longer has a primary key"))
        })?),
        keys = shape.key_columns.iter().map(|k| format!("l.{}", q(k))).collect::<Vec<_>>().join(", "),
        // The old image in table order: a key column's old value is the entry's key.
        old = shape
            .columns
            .iter()
            .map(|c| match shape.key_columns.contains(c) {
                true => format!("l.{}", q(c)),
                false => format!("l.{}", q(&format!("{OLD_PREFIX}{c}"))),
            })
            .collect::<Vec<_>>()
            .join(", "),
        new = shape.columns.iter().map(|c| format!("t.{}", q(c))).collect::<Vec<_>>().join(", "),
        table_q = q(table),
        log = q(&log_table(table)),
    ))
}

/// Reads and empties the change log of one table into upload messages of bounded size.
///
/// An entry is read together with the row as it is now: `I` or `X` uploads an insert
/// if the row exists (nothing if not); `U` or `D` uploads an update from the old image
/// if the row exists and differs from it (nothing if equal), a delete if it does not.
fn collect_table_upload(
    connection: &Connection,
    table: &str,
    out: &mut Vec<TableUpload>,
) -> Result<(), ClientError> {
    let shape = shape(connection, table)?
        .ok_or_else(|| ClientError::Schema(format!("tracked table {table:?} no longer exists")))?;
    let width = shape.columns.len();
    let key_count = shape.key_columns.len();
    let log = q(&log_table(table));
    let select = log_entries_query(table, &shape)?;
    let new_message = || TableUpload {
        table: table.to_string(),
        columns: shape.columns.clone(),
        key_columns: shape.key_columns.clone(),
        ..TableUpload::default()
    };
    let mut current = new_message();
    let mut current_bytes = 0usize;
    let mut statement = connection.prepare(&select)?;
    let mut rows = statement.query([])?;
    let row_values = |row: &rusqlite::Row, start: usize, count: usize| -> rusqlite::Result<Row> {
        (start..start + count)
            .map(|index| row.get::<_, Value>(index))
            .collect()
    };
    while let Some(row) = rows.next()? {
        let op: String = row.get(0)?;
        let key = row_values(row, 1, key_count)?;
        let old = row_values(row, 1 + key_count, width)?;
        let exists: bool = row.get(1 + key_count + width)?;
        let new = row_values(row, 2 + key_count + width, width)?;
        // What to send follows from the operation and whether the row exists now.
        let Some(change) = Change::of(table, &op, exists, old == new)? else {
            continue;
        };
        let images: Vec<&Value> = match change {
            Change::Insert => new.iter().collect(),
            Change::Update => old.iter().chain(&new).collect(),
            Change::Delete => key.iter().collect(),
        };
        let size: usize = images.iter().map(|value| value.encoded_len()).sum();
        let inline_size: usize = images.iter().map(|value| inline_len(value)).sum();
        if inline_size > UPLOAD_ROW_BYTES_MAX {
            // The batch is not built and the log is left as it is: nothing is lost.
            return Err(ClientError::Schema(format!(
                "a change of table {table:?} (key {key:?}) takes {size} bytes; the most one \
                 message carries is {UPLOAD_ROW_BYTES_MAX} bytes"
            )));
        }
        // Cut before the row that would pass the message size, so no frame grows past it.
        if current_bytes + size > UPLOAD_MESSAGE_BYTES_MAX && current_bytes > 0 {
            out.push(std::mem::replace(&mut current, new_message()));
            current_bytes = 0;
        }
        current_bytes += size;
        match change {
            Change::Insert => current.inserts.push(new),
            Change::Update => current.updates.push(RowUpdate { old, new }),
            Change::Delete => current.deletes.push(key),
        }
    }
    drop(rows);
    drop(statement);
    if !(current.inserts.is_empty() && current.updates.is_empty() && current.deletes.is_empty()) {
        out.push(current);
    }
    connection.execute(&format!("DELETE FROM {log}"), [])?;
    Ok(())
}

/// The bytes a value takes in its row's message when the row is larger than a message:
/// one (the tag `in_pieces`) for a text or blob value that then travels in pieces.
fn inline_len(value: &Value) -> usize {
    let in_pieces = UPLOAD_MESSAGE_BYTES_MAX / 16;
    match value {
        Value::Text(text) if text.len() > in_pieces => 1,
        Value::Blob(bytes) if bytes.len() > in_pieces => 1,
        _ => value.encoded_len(),
    }
}

pub fn has_pending_changes(connection: &Connection) -> Result<bool, ClientError> {
    for table in tracked_tables(connection)? {
        let any: bool = connection.query_row(
            &format!(
                "SELECT EXISTS (SELECT 1 FROM {} WHERE rs_op <> 'X')",
                q(&log_table(&table))
            ),
            [],
            |row| row.get(0),
        )?;
        if any {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Records the watermark of a download applied: of every table (a sync of `None`, which
/// brought every table up to it), or of the tables synced (protocol v9).
fn record_watermark(
    connection: &Connection,
    tables: Option<&[String]>,
    watermark: i64,
) -> Result<(), ClientError> {
    let Some(tables) = tables else {
        connection.execute(
            "UPDATE rs_client_state SET download_watermark = ?1 WHERE id = 1",
            [watermark],
        )?;
        connection.execute("DELETE FROM rs_client_table_watermark", [])?;
        return Ok(());
    };
    let mut upsert = connection.prepare(
        "INSERT INTO rs_client_table_watermark (table_name, watermark) VALUES (?1, ?2)
         ON CONFLICT (table_name) DO UPDATE SET watermark = excluded.watermark",
    )?;
    for table in tables {
        upsert.execute(params![table, watermark])?;
    }
    Ok(())
}

/// Applies a download and acknowledges the upload in one transaction (the whole
/// download at once; [`DownloadApply`] takes it message by message).
#[cfg(test)]
pub fn apply_download(
    connection: &mut Connection,
    upload_sequence: u64,
    downloads: &[Download],
    watermark: i64,
) -> Result<u64, ClientError> {
    let mut apply = DownloadApply::new();
    let applied = (|| {
        for download in downloads {
            apply.apply(connection, download)?;
        }
        let batch = Batch {
            upload_sequence,
            script_version: None,
            frames: Vec::new(),
            operations: 0,
            is_retry: false,
            key_ranges: Vec::new(),
            tables: None,
        };
        Ok(apply
            .finish(connection, &batch, watermark, &[])?
            .rows_applied)
    })();
    if applied.is_err() {
        DownloadApply::abort(connection);
    }
    applied
}

/// One download applied as its messages arrive, all in one transaction that also
/// acknowledges the upload. Rows with local changes not yet uploaded (made while the
/// sync was in flight) are left alone: those changes go up in the next sync and the
/// server resolves them.
///
/// The transaction begins with the first message (or at [`DownloadApply::finish`] for
/// an empty download), so the database stays writable while the server works. After an
/// error, call [`DownloadApply::abort`].
#[derive(Debug, Default)]
pub struct DownloadApply {
    /// Set once the transaction began: the tracked tables.
    tracked: Option<Vec<String>>,
    shapes: HashMap<String, Shape>,
    pub rows_applied: u64,
    /// Recorded with the watermark: the script version the download came from.
    pub script_version: Option<String>,
    /// The conflicts the server named, with its rows as the download brings them: kept
    /// with the client's side when the download is committed.
    pub losing: LosingRows,
    /// Deletes made here of rows the server has changed since (kept as conflicts).
    stale_deletes: u64,
}

/// What a committed download did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppliedDownload {
    pub rows_applied: u64,
    /// Conflicts whose losing side this download kept in `rs_client_conflict`.
    pub conflicts_kept: u64,
}

impl DownloadApply {
    pub fn new() -> DownloadApply {
        DownloadApply::default()
    }

    /// Begins the download's transaction. Foreign keys the device enforces are checked
    /// at its commit (`defer_foreign_keys`, which SQLite resets there): a download
    /// arrives table by table, a child's rows possibly before its parent's.
    fn begin(&mut self, connection: &Connection) -> Result<(), ClientError> {
        if self.tracked.is_none() {
            connection.execute_batch(
                "BEGIN IMMEDIATE; PRAGMA defer_foreign_keys = ON;
                 UPDATE rs_client_state SET applying_download = 1 WHERE id = 1;",
            )?;
            self.tracked = Some(tracked_tables(connection)?);
        }
        Ok(())
    }

    /// Applies one download message; returns the rows it changed.
    pub fn apply(
        &mut self,
        connection: &Connection,
        download: &Download,
    ) -> Result<u64, ClientError> {
        self.begin(connection)?;
        let table = download.table.as_str();
        if !self.shapes.contains_key(table) {
            let found = shape(connection, table)?.ok_or_else(|| {
                ClientError::Schema(format!(
                    "the download names table {table:?}, which the client database lacks"
                ))
            })?;
            self.shapes.insert(table.to_string(), found);
        }
        let shape = &self.shapes[table];
        if download.key_columns != shape.key_columns {
            return Err(ClientError::Schema(format!(
                "table {table:?} has primary key {:?} here, the download names {:?}",
                shape.key_columns, download.key_columns
            )));
        }
        for column in &download.columns {
            if !shape.columns.contains(column) {
                return Err(ClientError::Schema(format!(
                    "the download names column {column:?}, which table {table:?} lacks here"
                )));
            }
        }
        let is_tracked = self.tracked.iter().flatten().any(|t| t == table);
        self.losing.answered(download);
        if is_tracked {
            self.stale_deletes += keep_stale_deletes(connection, download, shape)?;
        }
        let applied = apply_table(connection, download, is_tracked)?;
        self.rows_applied += applied;
        Ok(applied)
    }

    /// Keeps the losing side of the conflicts named (from the frames of `batch`, the
    /// upload this download answers),
    /// keeps the key ranges handed out (protocol v7), records the watermark and the
    /// upload's acknowledgement, and commits.
    pub fn finish(
        mut self,
        connection: &Connection,
        batch: &Batch,
        watermark: i64,
        key_ranges: &[KeyRange],
    ) -> Result<AppliedDownload, ClientError> {
        self.begin(connection)?;
        keys::keep(connection, key_ranges)?;
        let upload_sequence = batch.upload_sequence;
        let conflicts_kept = self
            .losing
            .record(connection, &batch.frames, upload_sequence)?;
        record_watermark(connection, batch.tables.as_deref(), watermark)?;
        connection.execute(
            "UPDATE rs_client_state SET applying_download = 0,
                 upload_sequence_acknowledged = max(upload_sequence_acknowledged, ?1),
                 script_version = coalesce(?2, script_version) WHERE id = 1",
            params![upload_sequence as i64, self.script_version],
        )?;
        connection.execute(
            "DELETE FROM rs_client_inflight WHERE upload_sequence <= ?1",
            [upload_sequence as i64],
        )?;
        connection.execute(
            "DELETE FROM rs_client_transfer WHERE upload_sequence <= ?1",
            [upload_sequence as i64],
        )?;
        connection.execute("DELETE FROM rs_client_download", [])?;
        connection.execute_batch("COMMIT")?;
        Ok(AppliedDownload {
            rows_applied: self.rows_applied,
            conflicts_kept: conflicts_kept + self.stale_deletes,
        })
    }

    /// Rolls back a download begun and not finished (nothing of it stays).
    pub fn abort(connection: &Connection) {
        if !connection.is_autocommit() {
            // A failed rollback leaves SQLite's own rollback when the connection closes.
            let _ = connection.execute_batch("ROLLBACK");
        }
    }
}

/// A row the download brings that this client deleted and has not uploaded yet, changed
/// on the server since the client last had it (the logged old image differs): the
/// delete would remove a change this client never saw. It loses, as a delete found
/// stale on the server does: the log entry goes, the server's row is applied, and the
/// delete is kept as a conflict (`rs_client_conflict`, upload sequence 0: never sent).
/// Returns how many.
/// `"k1" = ?start AND "k2" = ?start+1 ...`: the key columns equal to numbered parameters.
fn keys_equal(keys: &[String], start: usize) -> String {
    keys.iter()
        .enumerate()
        .map(|(i, k)| format!("{} = ?{}", q(k), start + i))
        .collect::<Vec<_>>()
        .join(" AND ")
}

fn keep_stale_deletes(
    connection: &Connection,
    download: &Download,
    shape: &Shape,
) -> Result<u64, ClientError> {
    if download.upserts.is_empty() {
        return Ok(0);
    }
    let position = |column: &String| download.columns.iter().position(|c| c == column);
    let keys: Vec<usize> = download.key_columns.iter().filter_map(position).collect();
    let compared: Vec<(String, usize)> = shape
        .value_columns()
        .filter_map(|column| Some((format!("{OLD_PREFIX}{column}"), position(column)?)))
        .collect();
    if keys.len() != download.key_columns.len() || compared.is_empty() {
        return Ok(0);
    }
    // Most downloads meet no pending delete: one probe, and no statement per row.
    let log = q(&log_table(&download.table));
    let pending_deletes: bool = connection
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM {log} WHERE rs_op = 'D')"
        ))?
        .query_row([], |row| row.get(0))?;
    if !pending_deletes {
        return Ok(0);
    }
    let key_match = keys_equal(&download.key_columns, 1);
    let differs = compared
        .iter()
        .enumerate()
        .map(|(n, (old, _))| format!("{} IS NOT ?{}", q(old), keys.len() + n + 1))
        .collect::<Vec<_>>()
        .join(" OR ");
    let mut stale = connection.prepare_cached(&format!(
        "DELETE FROM {log} WHERE {key_match} AND rs_op = 'D' AND ({differs})",
    ))?;
    let mut kept = connection.prepare_cached(
        "INSERT INTO rs_client_conflict
             (table_name, operation, key, client_row, server_row, upload_sequence)
         VALUES (?1, 'delete', ?2, NULL, ?3, 0)",
    )?;
    let mut count = 0;
    for row in &download.upserts {
        let key = crate::kept::pick(row, &keys);
        let values = key.iter().chain(compared.iter().map(|(_, at)| &row[*at]));
        if stale.execute(rusqlite::params_from_iter(values))? == 0 {
            continue;
        }
        kept.execute(params![
            download.table,
            crate::kept::object(&download.key_columns, &key).to_string(),
            crate::kept::object(&download.columns, row).to_string(),
        ])?;
        count += 1;
    }
    Ok(count)
}

fn apply_table(
    connection: &Connection,
    download: &Download,
    is_tracked: bool,
) -> Result<u64, ClientError> {
    let mut applied = 0u64;
    if !download.deletes.is_empty() {
        let mut delete = connection.prepare_cached(&delete_sql(download, is_tracked))?;
        for key in &download.deletes {
            applied += delete.execute(rusqlite::params_from_iter(key))? as u64;
        }
    }
    if !download.upserts.is_empty() {
        let mut upsert = connection.prepare_cached(&upsert_sql(download, is_tracked))?;
        for row in &download.upserts {
            applied += upsert.execute(rusqlite::params_from_iter(row))? as u64;
        }
    }
    Ok(applied)
}

/// Deletes a downloaded key's row (bound from `?1`), unless (`is_tracked`) changes of it
/// wait for upload.
fn delete_sql(download: &Download, is_tracked: bool) -> String {
    let keys = &download.key_columns;
    let no_pending = if is_tracked {
        format!(
            "NOT EXISTS (SELECT 1 FROM {} WHERE {})",
            q(&log_table(&download.table)),
            keys_equal(keys, 1)
        )
    } else {
        "1".to_string()
    };
    format!(
        "DELETE FROM {} WHERE {} AND {no_pending}",
        q(&download.table),
        keys_equal(keys, 1),
    )
}

/// Inserts or updates a downloaded row (bound from `?1`, in the download's column
/// order), unless (`is_tracked`) changes of it wait for upload.
fn upsert_sql(download: &Download, is_tracked: bool) -> String {
    let table = q(&download.table);
    let keys = &download.key_columns;
    let width = download.columns.len();
    let columns = download
        .columns
        .iter()
        .map(|c| q(c))
        .collect::<Vec<_>>()
        .join(", ");
    let placeholders = (1..=width)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let key_positions: Vec<usize> = keys
        .iter()
        .map(|k| {
            download
                .columns
                .iter()
                .position(|c| c == k)
                .expect("checked by the session")
        })
        .collect();
    let non_keys: Vec<&String> = download
        .columns
        .iter()
        .filter(|c| !keys.contains(c))
        .collect();
    let conflict_action = if non_keys.is_empty() {
        "NOTHING".to_string()
    } else {
        format!(
            "UPDATE SET {}",
            non_keys
                .iter()
                .map(|c| format!("{c} = excluded.{c}", c = q(c)))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let pending_check = if is_tracked {
        let matches = keys
            .iter()
            .zip(&key_positions)
            .map(|(k, p)| format!("{} = ?{}", q(k), p + 1))
            .collect::<Vec<_>>()
            .join(" AND ");
        format!(
            "NOT EXISTS (SELECT 1 FROM {} WHERE {matches})",
            q(&log_table(&download.table))
        )
    } else {
        "1".to_string()
    };
    format!(
        "INSERT INTO {table} ({columns}) SELECT {placeholders} WHERE {pending_check}
             ON CONFLICT ({key_list}) DO {conflict_action}",
        key_list = keys.iter().map(|k| q(k)).collect::<Vec<_>>().join(", "),
    )
}

#[cfg(test)]
mod tests;
