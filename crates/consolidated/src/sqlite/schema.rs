//! System tables, users, and `init` (change tracking plus default scripts) for SQLite.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use std::collections::HashMap;

use crate::foreign_keys::ForeignKey;
use crate::names::{column_list, key_match};
use crate::reinit::{self, Rewrite, Target, VersionFacts};
use crate::rules::{RuleSet, Ruled};
use crate::scripts::*;
use crate::shape::{is_number, partition_column_refusal, Column, TableShape};
use crate::{quote_identifier as q, DbError, InitOutcome, ScriptEntry, TableInit};

mod rules;

const SYSTEM_TABLES: &str = "
CREATE TABLE IF NOT EXISTS rs_sync_history (
    id INTEGER PRIMARY KEY,
    ended_unix_ms INTEGER NOT NULL,
    user_name TEXT,
    outcome TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_user (
    name TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
-- The keys session tokens are signed with (server/src/session_tokens.rs).
CREATE TABLE IF NOT EXISTS rs_session_key (
    id INTEGER PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
-- The servers of a farm, each heard of at beat_ms (server/src/background.rs).
CREATE TABLE IF NOT EXISTS rs_server (
    server_id TEXT PRIMARY KEY,
    beat_ms INTEGER NOT NULL
);
-- Refused logins each server counted, shared by the farm (server/src/throttle.rs).
CREATE TABLE IF NOT EXISTS rs_login_failure (
    server_id TEXT NOT NULL,
    failure_key TEXT NOT NULL,
    failures INTEGER NOT NULL,
    since_ms INTEGER NOT NULL,
    PRIMARY KEY (server_id, failure_key)
);
CREATE TABLE IF NOT EXISTS rs_script_version (
    name TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE IF NOT EXISTS rs_script (
    script_version TEXT NOT NULL REFERENCES rs_script_version (name),
    table_name TEXT NOT NULL DEFAULT '',
    event TEXT NOT NULL,
    script TEXT NOT NULL,
    PRIMARY KEY (script_version, table_name, event)
);
CREATE TABLE IF NOT EXISTS rs_subscription (
    client_id TEXT PRIMARY KEY,
    user_name TEXT NOT NULL,
    script_version TEXT NOT NULL,
    upload_sequence INTEGER NOT NULL DEFAULT 0,
    download_watermark INTEGER NOT NULL DEFAULT 0,
    download_acknowledged INTEGER NOT NULL DEFAULT 0,
    last_sync_at TEXT,
    upload_transfer_id TEXT
);
CREATE INDEX IF NOT EXISTS rs_subscription_user ON rs_subscription (user_name);
CREATE TABLE IF NOT EXISTS rs_table (
    table_name TEXT PRIMARY KEY,
    partition_column TEXT NOT NULL
);
-- Tables whose scripts come from a sync rule other than `owner` (`rowsync rules`).
CREATE TABLE IF NOT EXISTS rs_table_rule (
    table_name TEXT PRIMARY KEY,
    rule TEXT NOT NULL
);
-- The groups each client has, per group-rule table (driver::groups).
CREATE TABLE IF NOT EXISTS rs_client_group (
    client_id TEXT NOT NULL,
    table_name TEXT NOT NULL,
    group_value TEXT NOT NULL,
    added_at INTEGER NOT NULL,
    added_after INTEGER NOT NULL,
    removed_at INTEGER,
    removed_after INTEGER,
    PRIMARY KEY (client_id, table_name, group_value)
);
CREATE TABLE IF NOT EXISTS rs_script_column (
    script_version TEXT NOT NULL,
    table_name TEXT NOT NULL,
    column_name TEXT NOT NULL,
    position INTEGER NOT NULL,
    dropped INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (script_version, table_name, column_name)
);
CREATE TABLE IF NOT EXISTS rs_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
);
INSERT OR IGNORE INTO rs_clock (id, version) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS rs_script_revision (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER NOT NULL
);
INSERT OR IGNORE INTO rs_script_revision (id, revision) VALUES (1, 0);
";

/// Every change of a script gives its version a new revision (from a counter that never
/// repeats), so servers reload it at their next sync of that version.
const SCRIPT_REVISION_TRIGGERS: &str = "
CREATE TRIGGER IF NOT EXISTS rs_script_inserted AFTER INSERT ON rs_script BEGIN
    UPDATE rs_script_revision SET revision = revision + 1;
    UPDATE rs_script_version SET revision = (SELECT revision FROM rs_script_revision) WHERE name = NEW.script_version;
END;
CREATE TRIGGER IF NOT EXISTS rs_script_updated AFTER UPDATE ON rs_script BEGIN
    UPDATE rs_script_revision SET revision = revision + 1;
    UPDATE rs_script_version SET revision = (SELECT revision FROM rs_script_revision)
        WHERE name IN (OLD.script_version, NEW.script_version);
END;
CREATE TRIGGER IF NOT EXISTS rs_script_deleted AFTER DELETE ON rs_script BEGIN
    UPDATE rs_script_revision SET revision = revision + 1;
    UPDATE rs_script_version SET revision = (SELECT revision FROM rs_script_revision) WHERE name = OLD.script_version;
END;
";

pub fn install_system_tables(connection: &Connection) -> Result<(), DbError> {
    connection.execute_batch(SYSTEM_TABLES)?;
    let has_revision: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('rs_script_version') WHERE name = 'revision')",
        [],
        |row| row.get(0),
    )?;
    if !has_revision {
        connection.execute_batch(
            "ALTER TABLE rs_script_version ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
        )?;
    }
    let has_disabled: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('rs_user') WHERE name = 'disabled')",
        [],
        |row| row.get(0),
    )?;
    if !has_disabled {
        connection
            .execute_batch("ALTER TABLE rs_user ADD COLUMN disabled INTEGER NOT NULL DEFAULT 0")?;
    }
    // The transfer id of the upload applied last (protocol v5 identity check).
    let has_transfer_id: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('rs_subscription') WHERE name = 'upload_transfer_id')",
        [],
        |row| row.get(0),
    )?;
    if !has_transfer_id {
        connection
            .execute_batch("ALTER TABLE rs_subscription ADD COLUMN upload_transfer_id TEXT")?;
    }
    connection.execute_batch(SCRIPT_REVISION_TRIGGERS)?;
    Ok(())
}

pub fn scripts(
    connection: &Connection,
    script_version: Option<&str>,
) -> Result<Vec<ScriptEntry>, DbError> {
    let mut statement = connection.prepare(
        "SELECT script_version, table_name, event, script FROM rs_script
         WHERE ?1 IS NULL OR script_version = ?1 ORDER BY 1, 2, 3",
    )?;
    let rows = statement
        .query_map([script_version], |row| {
            Ok(ScriptEntry {
                script_version: row.get(0)?,
                table: row.get(1)?,
                event: row.get(2)?,
                script: row.get(3)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub fn set_script(connection: &Connection, entry: &ScriptEntry) -> Result<(), DbError> {
    check_event(&entry.table, &entry.event).map_err(DbError::Invalid)?;
    let known: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM rs_script_version WHERE name = ?1)",
        [&entry.script_version],
        |row| row.get(0),
    )?;
    if !known {
        return Err(DbError::Invalid(format!(
            "script version {:?} does not exist; add it with `rowsync version add`",
            entry.script_version
        )));
    }
    connection.execute(
        "INSERT INTO rs_script (script_version, table_name, event, script) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (script_version, table_name, event) DO UPDATE SET script = excluded.script",
        params![entry.script_version, entry.table, entry.event, entry.script],
    )?;
    Ok(())
}

pub fn remove_script(
    connection: &Connection,
    script_version: &str,
    table: &str,
    event: &str,
) -> Result<bool, DbError> {
    Ok(connection.execute(
        "DELETE FROM rs_script WHERE script_version = ?1 AND table_name = ?2 AND event = ?3",
        params![script_version, table, event],
    )? > 0)
}

pub fn add_script_version(
    connection: &Connection,
    name: &str,
    description: &str,
) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid(
            "a script version name must not be empty".into(),
        ));
    }
    connection.execute_batch("UPDATE rs_script_revision SET revision = revision + 1")?;
    connection.execute(
        "INSERT INTO rs_script_version (name, description, revision)
         VALUES (?1, ?2, (SELECT revision FROM rs_script_revision))
         ON CONFLICT (name) DO UPDATE SET description = excluded.description",
        params![name, description],
    )?;
    Ok(())
}

pub fn script_versions(connection: &Connection) -> Result<Vec<(String, String)>, DbError> {
    let mut statement =
        connection.prepare("SELECT name, description FROM rs_script_version ORDER BY name")?;
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

pub fn set_user(
    connection: &mut Connection,
    name: &str,
    password_hash: &str,
) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid("a user name must not be empty".into()));
    }
    connection.execute(
        "INSERT INTO rs_user (name, password_hash) VALUES (?1, ?2)
         ON CONFLICT (name) DO UPDATE SET password_hash = excluded.password_hash",
        params![name, password_hash],
    )?;
    Ok(())
}

pub fn password_hash(connection: &mut Connection, name: &str) -> Result<Option<String>, DbError> {
    Ok(connection
        .query_row(super::users::PASSWORD_HASH, [name], |row| row.get(0))
        .optional()?)
}

/// See `ConsolidatedConnection::client_columns`: by SQLite's own affinity rules, NUMERIC
/// included (decimals, dates): the central column has already coerced what it holds, so
/// a client column that kept the text instead would upload a value the central refuses
/// as changed (`docs/types.md`, SQLite as the consolidated database).
pub fn client_columns(
    connection: &Connection,
    table: &str,
) -> Result<Option<crate::ClientTable>, DbError> {
    let Some(shape) = table_shape(connection, table)? else {
        return Ok(None);
    };
    let mut statement = connection.prepare("SELECT name, type FROM pragma_table_info(?1)")?;
    let declared: HashMap<String, String> = statement
        .query_map([table], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let affinity = |name: &str| {
        let upper = declared
            .get(name)
            .map(|t| t.to_uppercase())
            .unwrap_or_default();
        // SQLite's own rules (datatype3 §3.1): the client's column coerces values as
        // the central one does, so what one stores the other takes back unchanged (a
        // DECIMAL the central keeps as a REAL is a REAL on the client too).
        if upper.contains("INT") {
            "INTEGER"
        } else if ["CHAR", "CLOB", "TEXT"].iter().any(|t| upper.contains(t)) {
            "TEXT"
        } else if upper.is_empty() || upper.contains("BLOB") {
            "BLOB"
        } else if ["REAL", "FLOA", "DOUB"].iter().any(|t| upper.contains(t)) {
            "REAL"
        } else {
            "NUMERIC"
        }
    };
    Ok(Some(crate::ClientTable {
        columns: shape
            .columns
            .iter()
            .map(|column| (column.name.clone(), affinity(&column.name)))
            .collect(),
        key_columns: shape.key_columns,
    }))
}

pub fn table_shape(connection: &Connection, table: &str) -> Result<Option<TableShape>, DbError> {
    let mut statement =
        connection.prepare("SELECT name, pk FROM pragma_table_info(?1) ORDER BY cid")?;
    let mut columns = Vec::new();
    let mut keys: Vec<(i64, String)> = Vec::new();
    let mut rows = statement.query([table])?;
    while let Some(row) = rows.next()? {
        let name: String = row.get(0)?;
        let key_position: i64 = row.get(1)?;
        if key_position > 0 {
            keys.push((key_position, name.clone()));
        }
        columns.push(Column { name });
    }
    if columns.is_empty() {
        return Ok(None);
    }
    keys.sort();
    Ok(Some(TableShape {
        name: table.to_string(),
        columns,
        key_columns: keys.into_iter().map(|(_, name)| name).collect(),
    }))
}

/// The foreign keys `table` declares, each with the table it references spelled as that
/// table is named (SQLite matches the name in `REFERENCES` without regard to case).
/// SQLite names no constraint: the columns and the referenced table describe it. Every
/// one is deferrable: `PRAGMA defer_foreign_keys` defers them all for a transaction.
pub fn foreign_keys(connection: &Connection, table: &str) -> Result<Vec<ForeignKey>, DbError> {
    let mut statement = connection.prepare_cached(
        "SELECT f.id, f.\"from\", COALESCE((SELECT s.name FROM sqlite_schema AS s
                 WHERE s.type = 'table' AND s.name = f.\"table\" COLLATE NOCASE), f.\"table\")
         FROM pragma_foreign_key_list(?1) AS f ORDER BY f.id, f.seq",
    )?;
    let mut rows = statement.query([table])?;
    let mut keys: Vec<(i64, Vec<String>, String)> = Vec::new();
    while let Some(row) = rows.next()? {
        let (id, column, referenced): (i64, String, String) =
            (row.get(0)?, row.get(1)?, row.get(2)?);
        match keys.last_mut() {
            Some((last, columns, _)) if *last == id => columns.push(column),
            _ => keys.push((id, vec![column], referenced)),
        }
    }
    Ok(keys
        .into_iter()
        .map(|(_, columns, referenced)| ForeignKey {
            constraint: format!("{table}({}) REFERENCES {referenced}", columns.join(", ")),
            referenced,
            deferrable: true,
        })
        .collect())
}

pub fn row_version_table(table: &str) -> String {
    format!("rs_rowversion_{table}")
}

pub fn tombstone_table(table: &str) -> String {
    format!("rs_tombstone_{table}")
}

/// `None` when `user` is a value of `table`'s column `column` as SQLite compares them,
/// else its declared type: a column of numeric affinity (a declared type naming INT, or
/// none of CHAR, CLOB, TEXT, BLOB) never equals text that is no number.
pub fn partition_value_misfit(
    connection: &Connection,
    table: &str,
    column: &str,
    user: &str,
) -> rusqlite::Result<Option<String>> {
    let declared: Option<String> = connection
        .query_row(
            "SELECT type FROM pragma_table_info(?1) WHERE name = ?2",
            [table, column],
            |row| row.get(0),
        )
        .optional()?;
    let Some(declared) = declared else {
        return Ok(None);
    };
    let upper = declared.to_uppercase();
    let numeric = upper.contains("INT")
        || !(upper.is_empty()
            || ["CHAR", "CLOB", "TEXT", "BLOB"]
                .iter()
                .any(|t| upper.contains(t)));
    Ok((numeric && !is_number(user)).then_some(declared))
}

/// Refuses at `init` a partition column that some user's name is no value of.
fn refuse_misfit_users(connection: &Connection, init: &TableInit) -> Result<(), DbError> {
    let mut statement = connection.prepare("SELECT name FROM rs_user ORDER BY name")?;
    let users = statement.query_map([], |row| row.get::<_, String>(0))?;
    for user in users {
        let user = user?;
        if let Some(type_name) =
            partition_value_misfit(connection, &init.table, &init.partition_column, &user)?
        {
            return Err(partition_column_refusal(init, &user, &type_name));
        }
    }
    Ok(())
}

pub fn init_table(
    connection: &mut Connection,
    init: &TableInit,
    rules: Option<&RuleSet>,
) -> Result<InitOutcome, DbError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    install_system_tables(&transaction)?;
    let full_shape = table_shape(&transaction, &init.table)?
        .ok_or_else(|| DbError::Invalid(format!("table {:?} does not exist", init.table)))?;
    let ruled = rules
        .map(|rules| RuledTable::new(&transaction, rules, &full_shape))
        .transpose()?;
    let (shape, init) = match &ruled {
        Some(ruled) => (
            ruled.shape.clone(),
            &TableInit {
                partition_column: ruled.rule.tracking_column.clone(),
                ..init.clone()
            },
        ),
        None => (full_shape.clone(), init),
    };
    if shape.key_columns.is_empty() {
        return Err(DbError::Invalid(format!(
            "table {:?} has no primary key; rowsync identifies rows by their primary key",
            init.table
        )));
    }
    if !shape.has_column(&init.partition_column) {
        return Err(DbError::Invalid(format!(
            "table {:?} has no column {:?} to partition by",
            init.table, init.partition_column
        )));
    }
    if init.table.starts_with("rs_") {
        return Err(DbError::Invalid(
            "tables named rs_* are rowsync's own".into(),
        ));
    }
    if ruled.as_ref().is_none_or(|ruled| ruled.rule.is_owner()) {
        refuse_misfit_users(&transaction, init)?;
    }
    let versions = version_facts(&transaction, &init.table)?;
    let current = shape.column_names();
    let target = reinit::choose_version(init, &versions, &current)?;
    transaction.execute_batch(&tracking_ddl(&full_shape, &init.partition_column))?;
    register(&transaction, init, ruled.as_ref())?;
    let scripts_for = |part: &TableShape| match &ruled {
        Some(ruled) if !ruled.rule.is_owner() => rules::rule_scripts(part, &ruled.rule.scope()),
        _ => default_scripts(part, &init.partition_column),
    };
    create_version(&transaction, &target)?;
    let mut outcome = InitOutcome {
        script_version: target.name.clone(),
        created: target.create,
        based_on: target.based_on.clone(),
        ..InitOutcome::default()
    };
    write_default_scripts(&transaction, &target.name, &shape, scripts_for(&shape))?;
    for rewrite in reinit::dropped_column_rewrites(&versions, &target.name, &shape) {
        let defaults = reinit::RewriteDefaults::of(&rewrite, &shape, scripts_for);
        rewrite_dropped(&transaction, &rewrite, &shape, defaults, &mut outcome)?;
    }
    transaction.commit()?;
    Ok(outcome)
}

/// The table in `rs_table` with its partition column, and in `rs_table_rule` when its
/// rule is not `owner`.
fn register(
    connection: &Connection,
    init: &TableInit,
    ruled: Option<&RuledTable>,
) -> Result<(), DbError> {
    connection.execute(
        "INSERT INTO rs_table (table_name, partition_column) VALUES (?1, ?2)
         ON CONFLICT (table_name) DO UPDATE SET partition_column = excluded.partition_column",
        params![init.table, init.partition_column],
    )?;
    match ruled.filter(|ruled| !ruled.rule.is_owner()) {
        Some(ruled) => connection.execute(
            "INSERT INTO rs_table_rule (table_name, rule) VALUES (?1, ?2)
             ON CONFLICT (table_name) DO UPDATE SET rule = excluded.rule",
            params![init.table, ruled.rule.rule().rule.kind()],
        )?,
        None => connection.execute(
            "DELETE FROM rs_table_rule WHERE table_name = ?1",
            [&init.table],
        )?,
    };
    Ok(())
}

/// A table with a rule: the columns it synchronizes and what its scripts are made from.
struct RuledTable {
    rule: Ruled<rules::SqliteRuleSql>,
    shape: TableShape,
}

impl RuledTable {
    fn new(
        connection: &Connection,
        rule_set: &RuleSet,
        shape: &TableShape,
    ) -> Result<RuledTable, DbError> {
        let (keys, sql) = rules::rule_facts(connection, rule_set, &shape.name)?;
        let rule = Ruled::new(rule_set, &shape.name, keys, sql)?;
        let shape = rules::rule_shape(shape, rule.rule())?;
        Ok(RuledTable { rule, shape })
    }
}

/// Every script version, oldest first, with what it holds of `table`.
fn version_facts(connection: &Connection, table: &str) -> Result<Vec<VersionFacts>, DbError> {
    let mut statement = connection.prepare(
        "SELECT v.name,
                EXISTS (SELECT 1 FROM rs_subscription AS s WHERE s.script_version = v.name),
                EXISTS (SELECT 1 FROM rs_script AS s WHERE s.script_version = v.name AND s.table_name = ?1)
         FROM rs_script_version AS v ORDER BY v.rowid",
    )?;
    let mut versions = statement
        .query_map([table], |row| {
            Ok(VersionFacts {
                name: row.get(0)?,
                in_use: row.get(1)?,
                synchronizes_table: row.get(2)?,
                columns: None,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut columns = connection.prepare(
        "SELECT column_name FROM rs_script_column
         WHERE script_version = ?1 AND table_name = ?2 AND dropped = 0 ORDER BY position",
    )?;
    for version in &mut versions {
        let names = columns
            .query_map([&version.name, table], |row| row.get(0))?
            .collect::<Result<Vec<String>, _>>()?;
        version.columns = (!names.is_empty()).then_some(names);
    }
    Ok(versions)
}

/// Creates the target version, as a copy of its base (scripts and recorded columns).
fn create_version(connection: &Connection, target: &Target) -> Result<(), DbError> {
    if !target.create {
        return Ok(());
    }
    connection.execute(
        "INSERT INTO rs_script_version (name) VALUES (?1)",
        [&target.name],
    )?;
    if let Some(base) = &target.based_on {
        connection.execute(
            "INSERT INTO rs_script (script_version, table_name, event, script)
             SELECT ?1, table_name, event, script FROM rs_script WHERE script_version = ?2",
            [&target.name, base],
        )?;
        connection.execute(
            "INSERT INTO rs_script_column (script_version, table_name, column_name, position, dropped)
             SELECT ?1, table_name, column_name, position, dropped FROM rs_script_column WHERE script_version = ?2",
            [&target.name, base],
        )?;
    }
    Ok(())
}

fn write_default_scripts(
    connection: &Connection,
    version: &str,
    shape: &TableShape,
    scripts: Vec<(&'static str, String)>,
) -> Result<(), DbError> {
    for (event, script) in scripts {
        write_script(connection, version, &shape.name, event, &script)?;
    }
    connection.execute(
        "DELETE FROM rs_script_column WHERE script_version = ?1 AND table_name = ?2",
        [version, &shape.name],
    )?;
    for (position, column) in shape.columns.iter().enumerate() {
        connection.execute(
            "INSERT INTO rs_script_column (script_version, table_name, column_name, position) VALUES (?1, ?2, ?3, ?4)",
            params![version, shape.name, column.name, position as i64],
        )?;
    }
    Ok(())
}

fn write_script(
    connection: &Connection,
    version: &str,
    table: &str,
    event: &str,
    script: &str,
) -> Result<(), DbError> {
    connection.execute(
        "INSERT INTO rs_script (script_version, table_name, event, script) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (script_version, table_name, event) DO UPDATE SET script = excluded.script",
        params![version, table, event, script],
    )?;
    Ok(())
}

/// Rewrites an older version's default scripts without the columns the table lost,
/// and marks those dropped (its clients' values for them are ignored from now on).
fn rewrite_dropped(
    connection: &Connection,
    rewrite: &Rewrite,
    shape: &TableShape,
    defaults: reinit::RewriteDefaults,
    outcome: &mut InitOutcome,
) -> Result<(), DbError> {
    let stored: HashMap<String, String> = connection
        .prepare(
            "SELECT event, script FROM rs_script WHERE script_version = ?1 AND table_name = ?2",
        )?
        .query_map([&rewrite.version, &shape.name], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let (write, left_alone) =
        reinit::rewritten_scripts(&stored, defaults.recorded, defaults.remaining);
    for (event, script) in write {
        write_script(connection, &rewrite.version, &shape.name, event, &script)?;
    }
    for column in &rewrite.dropped {
        connection.execute(
            "UPDATE rs_script_column SET dropped = 1 WHERE script_version = ?1 AND table_name = ?2 AND column_name = ?3",
            [&rewrite.version, &shape.name, column],
        )?;
    }
    outcome
        .rewritten
        .push((rewrite.version.clone(), rewrite.dropped.clone()));
    outcome.left_alone.extend(
        left_alone
            .into_iter()
            .map(|event| (rewrite.version.clone(), event)),
    );
    Ok(())
}

/// The columns of `table` that `version` records as dropped: an upload of that version
/// may still name them (its clients are older than the drop), and they are ignored.
pub fn dropped_columns(
    connection: &Connection,
    version: &str,
    table: &str,
) -> Result<Vec<String>, DbError> {
    Ok(connection
        .prepare(
            "SELECT column_name FROM rs_script_column
             WHERE script_version = ?1 AND table_name = ?2 AND dropped = 1",
        )?
        .query_map([version, table], |row| row.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Row-version and tombstone tables with the triggers that keep them. Every change to
/// the table bumps `rs_clock` and stamps the row (or its tombstone) with the new value.
///
/// A tombstone is kept per key *and* partition the row left: a key deleted from
/// alice's partition and then reused in bob's, or moved on from bob to carol before
/// alice synced, must still reach alice as a delete. Rows without a partition value
/// belong to no one and leave no tombstone.
fn tracking_ddl(shape: &TableShape, partition_column: &str) -> String {
    let table = q(&shape.name);
    let versions = q(&row_version_table(&shape.name));
    let tombstones = q(&tombstone_table(&shape.name));
    let keys = &shape.key_columns;
    let key_columns = column_list(keys, "");
    let new_keys = column_list(keys, "NEW.");
    let old_keys = column_list(keys, "OLD.");
    let partition = q(partition_column);
    let clock = "(SELECT version FROM rs_clock WHERE id = 1)";
    let bump = "UPDATE rs_clock SET version = version + 1 WHERE id = 1;";
    // The row-version and tombstone tables' key columns have no type: compared with
    // `NEW.k` of an INTEGER or TEXT column, SQLite would apply that column's affinity
    // and could not search their primary key, scanning the whole table once per row
    // written (deleting N rows of an INTEGER-keyed table took N²/2 steps). The unary
    // `+` drops the affinity; the values are the row's own, so they compare the same.
    let key_is_new = |alias: &str| {
        keys.iter()
            .map(|key| format!("{alias}.{k} = +NEW.{k}", k = q(key)))
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    let key_is_old = keys
        .iter()
        .map(|key| format!("{k} = +OLD.{k}", k = q(key)))
        .collect::<Vec<_>>()
        .join(" AND ");
    let key_changed = keys
        .iter()
        .map(|key| format!("OLD.{k} IS NOT NEW.{k}", k = q(key)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let trigger = |suffix: &str| q(&format!("rs_{suffix}_{}", shape.name));
    format!(
        "
CREATE TABLE IF NOT EXISTS {versions} ({key_columns}, version INTEGER NOT NULL, PRIMARY KEY ({key_columns})) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {versions_index} ON {versions} (version);
CREATE TABLE IF NOT EXISTS {tombstones} ({key_columns}, rs_partition, version INTEGER NOT NULL, PRIMARY KEY ({key_columns}, rs_partition)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS {tombstones_index} ON {tombstones} (version);
UPDATE rs_clock SET version = version + 1 WHERE id = 1;
INSERT OR IGNORE INTO {versions} ({key_columns}, version) SELECT {key_columns}, {clock} FROM {table};
DROP TRIGGER IF EXISTS {insert_trigger};
CREATE TRIGGER {insert_trigger} AFTER INSERT ON {table} BEGIN
    {bump}
    INSERT INTO {versions} ({key_columns}, version) VALUES ({new_keys}, {clock})
        ON CONFLICT ({key_columns}) DO UPDATE SET version = excluded.version;
    DELETE FROM {tombstones} WHERE {tombstone_is_new} AND rs_partition IS +NEW.{partition};
END;
DROP TRIGGER IF EXISTS {update_trigger};
CREATE TRIGGER {update_trigger} AFTER UPDATE ON {table} BEGIN
    {bump}
    INSERT INTO {tombstones} ({key_columns}, rs_partition, version)
        SELECT {old_keys}, OLD.{partition}, {clock} WHERE (({key_changed}) OR OLD.{partition} IS NOT NEW.{partition}) AND OLD.{partition} IS NOT NULL
        ON CONFLICT ({key_columns}, rs_partition) DO UPDATE SET version = excluded.version;
    DELETE FROM {versions} WHERE {key_is_old} AND ({key_changed});
    INSERT INTO {versions} ({key_columns}, version) VALUES ({new_keys}, {clock})
        ON CONFLICT ({key_columns}) DO UPDATE SET version = excluded.version;
    DELETE FROM {tombstones} WHERE {tombstone_is_new} AND rs_partition IS +NEW.{partition};
END;
DROP TRIGGER IF EXISTS {delete_trigger};
CREATE TRIGGER {delete_trigger} AFTER DELETE ON {table} BEGIN
    {bump}
    DELETE FROM {versions} WHERE {key_is_old};
    INSERT INTO {tombstones} ({key_columns}, rs_partition, version) SELECT {old_keys}, OLD.{partition}, {clock} WHERE OLD.{partition} IS NOT NULL
        ON CONFLICT ({key_columns}, rs_partition) DO UPDATE SET version = excluded.version;
END;
",
        versions_index = q(&format!("{}_version", row_version_table(&shape.name))),
        tombstones_index = q(&format!("{}_version", tombstone_table(&shape.name))),
        insert_trigger = trigger("insert"),
        update_trigger = trigger("update"),
        delete_trigger = trigger("delete"),
        tombstone_is_new = key_is_new(&tombstones),
    )
}

/// The table's row still is the old image the client uploaded (`u`).
fn old_image_matches(table: &str, all: &[&str]) -> String {
    all.iter()
        .map(|name| {
            format!(
                "{table}.{c} IS u.{old}",
                c = q(name),
                old = q(&format!("{OLD_IMAGE_PREFIX}{name}"))
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The default set scripts for a table partitioned by `partition_column`.
pub fn default_scripts(shape: &TableShape, partition_column: &str) -> Vec<(&'static str, String)> {
    let table = q(&shape.name);
    let partition = q(partition_column);
    let all = shape
        .columns
        .iter()
        .map(|column| column.name.as_str())
        .collect::<Vec<_>>();
    let keys = &shape.key_columns;
    let non_keys = all
        .iter()
        .filter(|name| !keys.iter().any(|key| key == *name))
        .collect::<Vec<_>>();
    let columns = column_list(&all, "");
    let set_new = non_keys
        .iter()
        .map(|name| format!("{c} = u.{c}", c = q(name)))
        .collect::<Vec<_>>()
        .join(", ");
    let old_matches = old_image_matches(&table, &all);
    let table_columns = column_list(&all, "t.");
    let update = if non_keys.is_empty() {
        // Nothing but key columns: an update can change nothing; keep conflict detection.
        format!("UPDATE {table} SET {k} = u.{k} FROM {UPLOAD_PLACEHOLDER} AS u WHERE {m} AND {table}.{partition} = :user AND u.{partition} = :user AND {old_matches}",
            k = q(&keys[0]), m = key_match(keys, &table, "u"))
    } else {
        format!("UPDATE {table} SET {set_new} FROM {UPLOAD_PLACEHOLDER} AS u WHERE {m} AND {table}.{partition} = :user AND u.{partition} = :user AND {old_matches}",
            m = key_match(keys, &table, "u"))
    };
    vec![
        (
            UPLOAD_INSERT,
            format!("INSERT INTO {table} ({columns}) SELECT {columns} FROM {UPLOAD_PLACEHOLDER} WHERE {partition} = :user ON CONFLICT DO NOTHING"),
        ),
        (UPLOAD_UPDATE, update),
        (
            // Driven by the scratch keys, each found by the primary key: the cost follows
            // the upload, not the table (an `EXISTS` per table row scanned the table).
            // Only a row the client has seen: one changed since its last download is a
            // conflict (docs/scripts.md, "Deletes of changed rows").
            UPLOAD_DELETE,
            format!(
                "DELETE FROM {table} WHERE {partition} = :user AND ({key_columns}) IN (SELECT {key_columns} FROM {UPLOAD_PLACEHOLDER}) \
                 AND NOT EXISTS (SELECT 1 FROM {versions} AS v WHERE {m} AND v.version > :last_download)",
                key_columns = column_list(keys, ""),
                versions = q(&row_version_table(&shape.name)),
                m = key_match(keys, "v", &table),
            ),
        ),
        (
            UPLOAD_FETCH,
            format!(
                "SELECT {table_columns} FROM {table} AS t JOIN {KEYS_PLACEHOLDER} AS k ON {m} WHERE t.{partition} = :user",
                m = key_match(keys, "t", "k")
            ),
        ),
        (
            DOWNLOAD_CURSOR,
            format!(
                "SELECT {table_columns} FROM {table} AS t JOIN {versions} AS v ON {m} WHERE v.version > :last_download AND t.{partition} = :user",
                versions = q(&row_version_table(&shape.name)),
                m = key_match(keys, "v", "t")
            ),
        ),
        (
            DOWNLOAD_DELETE_CURSOR,
            format!(
                "SELECT {key_columns} FROM {tombstones} WHERE version > :last_download AND rs_partition = :user",
                key_columns = column_list(keys, ""),
                tombstones = q(&tombstone_table(&shape.name)),
            ),
        ),
    ]
}

/// See `ConsolidatedConnection::cleanup`. The delete cursor asks for versions above the
/// client's watermark, so tombstones at or below every acknowledged watermark are done.
pub fn cleanup(connection: &mut Connection) -> Result<u64, DbError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // With no subscription at all, every future client starts empty: all tombstones go.
    let threshold: i64 = transaction.query_row(
        "SELECT coalesce(min(download_acknowledged), (SELECT version FROM rs_clock WHERE id = 1)) FROM rs_subscription",
        [],
        |row| row.get(0),
    )?;
    let tables: Vec<String> = transaction
        .prepare("SELECT table_name FROM rs_table")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut removed = 0;
    for table in tables {
        removed += transaction.execute(
            &format!(
                "DELETE FROM {} WHERE version <= ?1",
                q(&tombstone_table(&table))
            ),
            [threshold],
        )? as u64;
        crate::failpoint!(blocking "mid_cleanup");
    }
    transaction.commit()?;
    Ok(removed)
}

/// Appends to the monitor's history and keeps its newest `rows_max` rows.
pub fn append_sync_history(
    connection: &mut Connection,
    records: &[crate::HistoryRecord],
    rows_max: u64,
) -> Result<(), DbError> {
    let transaction = connection.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let mut insert = transaction.prepare_cached(
            "INSERT INTO rs_sync_history (ended_unix_ms, user_name, outcome, record) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for record in records {
            insert.execute(params![
                record.ended_unix_ms,
                record.user,
                record.outcome,
                record.record
            ])?;
        }
        let newest: Option<i64> =
            transaction.query_row("SELECT max(id) FROM rs_sync_history", [], |row| row.get(0))?;
        if let Some(first_kept) = crate::history::first_kept(newest, rows_max) {
            transaction.execute("DELETE FROM rs_sync_history WHERE id < ?1", [first_kept])?;
        }
    }
    transaction.commit()?;
    Ok(())
}

/// The newest `limit` rows of the monitor's history, oldest first.
pub fn sync_history(
    connection: &mut Connection,
    limit: u64,
) -> Result<Vec<crate::HistoryRecord>, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut query = connection.prepare_cached(
        "SELECT ended_unix_ms, user_name, outcome, record FROM \
         (SELECT * FROM rs_sync_history ORDER BY id DESC LIMIT ?1) ORDER BY id",
    )?;
    let rows = query.query_map([limit], |row| {
        Ok(crate::HistoryRecord {
            ended_unix_ms: row.get(0)?,
            user: row.get(1)?,
            outcome: row.get(2)?,
            record: row.get(3)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
