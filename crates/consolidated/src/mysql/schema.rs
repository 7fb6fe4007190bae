//! System tables, users, scripts, table shapes and `init` (change tracking plus the
//! default scripts) for MySQL and MariaDB.
//!
//! Every rowsync session runs with `ANSI_QUOTES` and `PIPES_AS_CONCAT` (see `mod.rs`), so
//! generated SQL quotes identifiers as the other backends do and scripts concatenate
//! with `||`.

use std::collections::HashMap;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Transaction, TxOpts};

use super::error::db;
use super::names::{tombstone_table, ORIGIN_COLUMN, STAMP_COLUMN};
use super::stamp;
use crate::foreign_keys::{refuse_undeferrable_cycles, ForeignKey};
use crate::names::{column_list, key_match};
use crate::reinit::{self, Rewrite, Target, VersionFacts};
use crate::rules::{RuleSet, Ruled};
use crate::scripts::*;
use crate::shape::{
    is_number, partition_column_refusal, unsupported_column_type, Column, TableShape,
};
use crate::{quote_identifier as q, DbError, InitOutcome, ScriptEntry, TableInit};

mod rules;

/// Text columns of system tables compare byte for byte, as on the other backends.
const NAME: &str = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";
const LONG_TEXT: &str = "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin";

fn system_tables() -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE IF NOT EXISTS rs_sync_history (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             ended_unix_ms BIGINT NOT NULL, user_name {LONG_TEXT}, outcome {NAME} NOT NULL,
             record {LONG_TEXT} NOT NULL) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_user (name {NAME} PRIMARY KEY, password_hash {LONG_TEXT} NOT NULL,
             created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB"
        ),
        // The keys session tokens are signed with (server/src/session_tokens.rs).
        "CREATE TABLE IF NOT EXISTS rs_session_key (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             secret VARCHAR(128) NOT NULL,
             created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB"
            .to_string(),
        // The servers of a farm, each heard of at beat_ms (server/src/background.rs).
        "CREATE TABLE IF NOT EXISTS rs_server (server_id VARCHAR(64) NOT NULL PRIMARY KEY,
             beat_ms BIGINT NOT NULL) ENGINE = InnoDB"
            .to_string(),
        // Refused logins each server counted, shared by the farm (server/src/throttle.rs).
        "CREATE TABLE IF NOT EXISTS rs_login_failure (server_id VARCHAR(64) NOT NULL,
             failure_key VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
             failures BIGINT NOT NULL, since_ms BIGINT NOT NULL,
             PRIMARY KEY (server_id, failure_key)) ENGINE = InnoDB"
            .to_string(),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_script_version (name {NAME} PRIMARY KEY, description {LONG_TEXT} NOT NULL,
             revision BIGINT NOT NULL DEFAULT 0, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_script (script_version {NAME} NOT NULL, table_name {NAME} NOT NULL DEFAULT '',
             event {NAME} NOT NULL, script {LONG_TEXT} NOT NULL, PRIMARY KEY (script_version, table_name, event),
             FOREIGN KEY (script_version) REFERENCES rs_script_version (name)) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_subscription (client_id {NAME} PRIMARY KEY, user_name {NAME} NOT NULL,
             script_version {NAME} NOT NULL, upload_sequence BIGINT NOT NULL DEFAULT 0,
             download_watermark BIGINT NOT NULL DEFAULT 0, download_acknowledged BIGINT NOT NULL DEFAULT 0,
             last_sync_xid BIGINT NOT NULL DEFAULT 0, last_sync_at TIMESTAMP(6) NULL,
             upload_transfer_id {NAME} NULL,
             INDEX rs_subscription_user (user_name)) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_table (table_name {NAME} PRIMARY KEY, partition_column {NAME} NOT NULL) ENGINE = InnoDB"
        ),
        // Tables whose scripts come from a sync rule other than `owner` (`rowsync rules`).
        format!(
            "CREATE TABLE IF NOT EXISTS rs_table_rule (table_name {NAME} PRIMARY KEY, rule {NAME} NOT NULL) ENGINE = InnoDB"
        ),
        // The groups each client has, per group-rule table (driver::groups).
        format!(
            "CREATE TABLE IF NOT EXISTS rs_client_group (client_id {NAME} NOT NULL, table_name {NAME} NOT NULL,
             group_value {NAME} NOT NULL, added_at BIGINT NOT NULL, added_after BIGINT NOT NULL,
             removed_at BIGINT NULL, removed_after BIGINT NULL,
             PRIMARY KEY (client_id, table_name, group_value)) ENGINE = InnoDB"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS rs_script_column (script_version {NAME} NOT NULL, table_name {NAME} NOT NULL,
             column_name {NAME} NOT NULL, position INT NOT NULL, dropped TINYINT NOT NULL DEFAULT 0,
             PRIMARY KEY (script_version, table_name, column_name)) ENGINE = InnoDB"
        ),
        // Named counters: `clock` (the stamps, see `stamp`) and `revision` (script
        // versions). MySQL has no sequences; a row each is what both servers have.
        format!(
            "CREATE TABLE IF NOT EXISTS rs_counter (name {NAME} PRIMARY KEY, value BIGINT NOT NULL) ENGINE = InnoDB"
        ),
        "INSERT IGNORE INTO rs_counter (name, value) VALUES ('clock', 0), ('revision', 0)".into(),
        // The watermark each sync in flight will hand out, by connection: cleanup keeps
        // the tombstones they will need (see `stamp`).
        // One row per client id, locked by its sync in flight (one sync per client).
        format!("CREATE TABLE IF NOT EXISTS rs_sync_lock (client_id {NAME} PRIMARY KEY) ENGINE = InnoDB"),
        "CREATE TABLE IF NOT EXISTS rs_sync_in_flight (connection_id BIGINT PRIMARY KEY, watermark BIGINT NOT NULL) ENGINE = InnoDB".into(),
    ]
}

/// Every change of a script gives its version a new revision (from a counter that never
/// repeats), so servers reload it at their next sync of that version.
fn revision_triggers() -> Vec<String> {
    let bump = "UPDATE rs_counter SET value = value + 1 WHERE name = 'revision';";
    let revision = "(SELECT value FROM rs_counter WHERE name = 'revision')";
    let mut statements = Vec::new();
    for (event, names) in [
        ("INSERT", "NEW.script_version"),
        ("UPDATE", "OLD.script_version, NEW.script_version"),
        ("DELETE", "OLD.script_version"),
    ] {
        let trigger = format!("rs_script_{}", event.to_lowercase());
        statements.push(format!("DROP TRIGGER IF EXISTS {trigger}"));
        statements.push(format!(
            "CREATE TRIGGER {trigger} AFTER {event} ON rs_script FOR EACH ROW BEGIN {bump}
             UPDATE rs_script_version SET revision = {revision} WHERE name IN ({names}); END"
        ));
    }
    statements
}

/// Serializes concurrent installers and inits (DDL races on `IF NOT EXISTS`).
const INSTALL_LOCK: &str = "rowsync_install";
const INSTALL_LOCK_WAIT_S: u32 = 60;

async fn with_install_lock<T>(
    connection: &mut Conn,
    work: impl AsyncFnOnce(&mut Conn) -> Result<T, DbError>,
) -> Result<T, DbError> {
    let locked: Option<i64> = connection
        .exec_first("SELECT GET_LOCK(?, ?)", (INSTALL_LOCK, INSTALL_LOCK_WAIT_S))
        .await
        .map_err(db)?;
    if locked != Some(1) {
        return Err(DbError::Invalid(format!(
            "another installer held {INSTALL_LOCK:?} for {INSTALL_LOCK_WAIT_S} s"
        )));
    }
    let done = work(connection).await;
    connection
        .exec_drop("DO RELEASE_LOCK(?)", (INSTALL_LOCK,))
        .await
        .map_err(db)?;
    done
}

async fn install_unlocked(connection: &mut Conn) -> Result<(), DbError> {
    for statement in system_tables().into_iter().chain(revision_triggers()) {
        connection.query_drop(statement).await.map_err(db)?;
    }
    // Columns added after a table's first release (MySQL lacks `ADD COLUMN IF NOT EXISTS`).
    if !has_column(connection, "rs_subscription", "upload_transfer_id").await? {
        connection
            .query_drop(format!(
                "ALTER TABLE rs_subscription ADD COLUMN upload_transfer_id {NAME} NULL"
            ))
            .await
            .map_err(db)?;
    }
    if !has_column(connection, "rs_user", "disabled").await? {
        connection
            .query_drop("ALTER TABLE rs_user ADD COLUMN disabled BOOLEAN NOT NULL DEFAULT 0")
            .await
            .map_err(db)?;
    }
    Ok(())
}

pub async fn install_system_tables(connection: &mut Conn) -> Result<(), DbError> {
    with_install_lock(connection, async |connection| {
        install_unlocked(connection).await
    })
    .await
}

pub async fn set_user(
    connection: &mut Conn,
    name: &str,
    password_hash: &str,
) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid("a user name must not be empty".into()));
    }
    connection
        .exec_drop(
            "INSERT INTO rs_user (name, password_hash) VALUES (?, ?)
             ON DUPLICATE KEY UPDATE password_hash = VALUES(password_hash)",
            (name, password_hash),
        )
        .await
        .map_err(db)
}

pub async fn password_hash(connection: &mut Conn, name: &str) -> Result<Option<String>, DbError> {
    connection
        .exec_first(super::users::PASSWORD_HASH, (name,))
        .await
        .map_err(db)
}

/// One column of a table as `information_schema` describes it.
#[derive(Clone)]
pub struct ColumnInfo {
    pub name: String,
    /// The full type, as a column definition takes it (`varchar(20)`, `decimal(30,6)`).
    pub column_type: String,
    /// The type's name alone (`varchar`, `text`), to know which need an index prefix.
    pub data_type: String,
    /// `ON UPDATE CURRENT_TIMESTAMP`: set to now by any update that does not assign it,
    /// so rowsync's own stamping assigns it its value (`keep_auto_updated`).
    pub auto_updated: bool,
}

/// `, "c" = "c"` for each auto-updated column (`ON UPDATE CURRENT_TIMESTAMP`): added to
/// rowsync's own updates of a row (the stamper's), which must not move such a column
/// the application reads as "last changed at".
pub fn keep_auto_updated<'c>(columns: impl IntoIterator<Item = &'c ColumnInfo>) -> String {
    columns
        .into_iter()
        .filter(|column| column.auto_updated)
        .map(|column| format!(", {c} = {c}", c = q(&column.name)))
        .collect()
}

/// What a table's columns would change silently rather than refuse.
#[derive(Debug, Default)]
pub struct ColumnLimits {
    /// Digits after the point each column keeps: a DECIMAL's scale, a TIMESTAMP's,
    /// DATETIME's or TIME's fractional-second precision (0 when unsaid).
    pub scales: std::collections::HashMap<String, u32>,
    /// Numeric columns, which would convert text ('12') to a number.
    pub numeric: std::collections::HashSet<String>,
    /// Integer columns, which would round a double with a fraction (1.5 to 2).
    pub integer: std::collections::HashSet<String>,
}

/// Numeric types (the integer ones first, six of them), which convert text ('12') to a number, and any other text to 0.
const NUMERIC_TYPES: [&str; 10] = [
    "tinyint",
    "smallint",
    "mediumint",
    "int",
    "integer",
    "bigint",
    "decimal",
    "float",
    "double",
    "bit",
];

/// `None` when `user` is a value of a partition column of type `data_type` (as
/// MariaDB compares them), else the type. A numeric column would compare a user name
/// that is no number as 0: no error, another value's rows.
pub fn partition_value_misfit(data_type: &str, user: &str) -> Option<String> {
    (NUMERIC_TYPES.contains(&data_type) && !is_number(user)).then(|| data_type.to_string())
}

/// The limits of a table's columns, read from their types (`decimal(10,2)`: 2,
/// `timestamp`: 0, `datetime(6)`: 6; `int`, `decimal`, `double`... are numeric).
pub fn column_limits(columns: &[ColumnInfo]) -> ColumnLimits {
    let mut limits = ColumnLimits::default();
    for column in columns {
        let inside = column.column_type.split_once('(').map(|(_, inside)| inside);
        let scale = match column.data_type.as_str() {
            "decimal" => {
                inside.map(|inside| inside.split_once(',').map_or("0", |(_, scale)| scale))
            }
            "timestamp" | "datetime" | "time" => Some(inside.unwrap_or("0")),
            _ => None,
        };
        if let Some(scale) = scale {
            let digits: String = scale.chars().filter(char::is_ascii_digit).collect();
            if let Ok(scale) = digits.parse() {
                limits.scales.insert(column.name.clone(), scale);
            }
        }
        if NUMERIC_TYPES.contains(&column.data_type.as_str()) {
            limits.numeric.insert(column.name.clone());
        }
        if NUMERIC_TYPES[..6].contains(&column.data_type.as_str()) {
            limits.integer.insert(column.name.clone());
        }
    }
    limits
}

/// A table's shape and its columns' types, `None` if it does not exist.
/// See `ConsolidatedConnection::client_columns`.
pub async fn client_columns(
    connection: &mut impl Queryable,
    table: &str,
) -> Result<Option<crate::ClientTable>, DbError> {
    let Some((shape, infos)) = table_shape(connection, table).await? else {
        return Ok(None);
    };
    let affinity = |info: &ColumnInfo| match info.data_type.as_str() {
        "tinyint" | "smallint" | "mediumint" | "int" | "bigint" | "year" | "bit" => "INTEGER",
        "float" | "double" => "REAL",
        "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => "BLOB",
        _ => "TEXT",
    };
    Ok(Some(crate::ClientTable {
        columns: infos
            .iter()
            .map(|info| (info.name.clone(), affinity(info)))
            .collect(),
        key_columns: shape.key_columns,
    }))
}

pub async fn table_shape(
    connection: &mut impl Queryable,
    table: &str,
) -> Result<Option<(TableShape, Vec<ColumnInfo>)>, DbError> {
    let rows: Vec<(String, String, String, i64, String)> = connection
        .exec(
            "SELECT c.COLUMN_NAME, c.COLUMN_TYPE, c.DATA_TYPE, COALESCE(s.SEQ_IN_INDEX, 0), c.EXTRA
             FROM information_schema.COLUMNS AS c
             LEFT JOIN information_schema.STATISTICS AS s ON s.TABLE_SCHEMA = c.TABLE_SCHEMA
                 AND s.TABLE_NAME = c.TABLE_NAME AND s.COLUMN_NAME = c.COLUMN_NAME AND s.INDEX_NAME = 'PRIMARY'
             WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = ? AND c.COLUMN_NAME NOT IN (?, ?)
             ORDER BY c.ORDINAL_POSITION",
            (table, STAMP_COLUMN, ORIGIN_COLUMN),
        )
        .await
        .map_err(db)?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut keys: Vec<(i64, String)> = Vec::new();
    let mut columns = Vec::new();
    let mut infos = Vec::new();
    for (name, column_type, data_type, key_position, extra) in rows {
        if key_position > 0 {
            keys.push((key_position, name.clone()));
        }
        columns.push(Column { name: name.clone() });
        infos.push(ColumnInfo {
            name,
            column_type,
            data_type: data_type.to_lowercase(),
            auto_updated: extra.to_lowercase().contains("on update"),
        });
    }
    keys.sort();
    let shape = TableShape {
        name: table.to_string(),
        columns,
        key_columns: keys.into_iter().map(|(_, name)| name).collect(),
    };
    Ok(Some((shape, infos)))
}

/// A table's foreign keys, each with the table it references (in the same database).
/// None is deferrable: InnoDB checks each row as it is written.
pub async fn foreign_keys(
    connection: &mut impl Queryable,
    table: &str,
) -> Result<Vec<ForeignKey>, DbError> {
    let rows: Vec<(String, String)> = connection
        .exec(
            "SELECT CONSTRAINT_NAME, REFERENCED_TABLE_NAME
             FROM information_schema.REFERENTIAL_CONSTRAINTS
             WHERE CONSTRAINT_SCHEMA = DATABASE() AND UNIQUE_CONSTRAINT_SCHEMA = DATABASE()
                 AND TABLE_NAME = ?
             ORDER BY CONSTRAINT_NAME",
            (table,),
        )
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(constraint, referenced)| ForeignKey {
            constraint,
            referenced,
            deferrable: false,
        })
        .collect())
}

/// `init`'s refusal of a cycle of foreign keys through `table` among the synchronized
/// tables (and `table`): MySQL and MariaDB cannot defer a foreign key, so no order of
/// an upload satisfies one. Checked before `init` changes anything.
async fn refuse_cycles_through(connection: &mut Conn, table: &str) -> Result<(), DbError> {
    let mut names: Vec<String> = connection
        .query("SELECT table_name FROM rs_table ORDER BY table_name")
        .await
        .map_err(db)?;
    if !names.iter().any(|name| name == table) {
        names.push(table.to_string());
    }
    let mut tables = Vec::with_capacity(names.len());
    for name in names {
        let keys = foreign_keys(connection, &name).await?;
        tables.push((name, keys));
    }
    refuse_undeferrable_cycles(table, &tables, |undeferrable| {
        let statements: Vec<String> = undeferrable
            .iter()
            .map(|found| {
                format!(
                    "ALTER TABLE `{}` DROP FOREIGN KEY `{}`;",
                    found.table.replace('`', "``"),
                    found.key.constraint.replace('`', "``")
                )
            })
            .collect();
        format!(
            "MySQL and MariaDB check foreign keys row by row and cannot defer them: drop one \
             key of the cycle (one of: {}) or leave one of its tables unsynchronized",
            statements.join(" ")
        )
    })
}

/// MySQL's identifiers are at most 64 characters; the longest derived name is
/// `rs_tombstone_<T>_partition`.
const TABLE_NAME_CHARS_MAX: usize = 64 - "rs_tombstone__partition".len();

/// Characters of a text partition value an index holds (utf8mb4: 4 bytes each, well
/// under InnoDB's 3072-byte key).
const PARTITION_INDEX_PREFIX_CHARS: u32 = 191;

pub async fn init_table(
    connection: &mut Conn,
    init: &TableInit,
    rules: Option<&RuleSet>,
) -> Result<InitOutcome, DbError> {
    refuse_unusable_name(&init.table)?;
    let init = init.clone();
    let rules = rules.cloned();
    with_install_lock(connection, async move |connection| {
        install_unlocked(connection).await?;
        let (full_shape, full_infos) = table_shape(connection, &init.table)
            .await?
            .ok_or_else(|| DbError::Invalid(format!("table {:?} does not exist", init.table)))?;
        let ruled = match &rules {
            Some(rules) => {
                Some(RuledTable::new(connection, rules, &full_shape, &full_infos).await?)
            }
            None => None,
        };
        let (shape, infos, init) = match &ruled {
            Some(ruled) => (
                ruled.shape.clone(),
                ruled.infos.clone(),
                TableInit {
                    partition_column: ruled.rule.tracking_column.clone(),
                    ..init
                },
            ),
            None => (full_shape.clone(), full_infos.clone(), init),
        };
        refuse_keyless(&shape)?;
        let Some(partition) = full_infos
            .iter()
            .find(|info| info.name == init.partition_column)
        else {
            return Err(DbError::Invalid(format!(
                "table {:?} has no column {:?} to partition by",
                init.table, init.partition_column
            )));
        };
        if ruled.as_ref().is_none_or(|ruled| ruled.rule.is_owner()) {
            refuse_misfit_users(connection, &init, partition).await?;
        }
        refuse_unsupported_types(&init.table, &infos)?;
        let versions = version_facts(connection, &init.table).await?;
        let target = reinit::choose_version(&init, &versions, &shape.column_names())?;
        refuse_cycles_through(connection, &init.table).await?;
        // DDL commits as it goes in MySQL: each statement below is idempotent, and the
        // table is registered (with its scripts) only once all of them ran.
        for statement in tracking_ddl(connection, &full_shape, &full_infos, partition).await? {
            connection.query_drop(statement).await.map_err(db)?;
        }
        let scripts_for = |part: &TableShape| match &ruled {
            Some(ruled) if !ruled.rule.is_owner() => rules::rule_scripts(part, &ruled.rule.scope()),
            _ => default_scripts(part, &init.partition_column),
        };
        let registration = Registration {
            shape: &shape,
            infos: &full_infos,
            init: &init,
            target: &target,
            versions: &versions,
            scripts_for: &scripts_for,
            rule: ruled
                .as_ref()
                .filter(|ruled| !ruled.rule.is_owner())
                .map(|ruled| ruled.rule.rule().rule.kind()),
        };
        register(connection, registration).await
    })
    .await
}

fn refuse_keyless(shape: &TableShape) -> Result<(), DbError> {
    match shape.key_columns.is_empty() {
        true => Err(DbError::Invalid(format!(
            "table {:?} has no primary key; rowsync identifies rows by their primary key",
            shape.name
        ))),
        false => Ok(()),
    }
}

/// Refuses a table of rowsync's own, or one whose derived names would not fit.
fn refuse_unusable_name(table: &str) -> Result<(), DbError> {
    if table.starts_with("rs_") {
        return Err(DbError::Invalid(
            "tables named rs_* are rowsync's own".into(),
        ));
    }
    if table.chars().count() > TABLE_NAME_CHARS_MAX {
        return Err(DbError::Invalid(format!(
            "table name {table:?} is longer than {TABLE_NAME_CHARS_MAX} characters, too long for the names rowsync derives from it"
        )));
    }
    Ok(())
}

/// Refuses at `init` a partition column that some user's name is no value of.
async fn refuse_misfit_users(
    connection: &mut Conn,
    init: &TableInit,
    partition: &ColumnInfo,
) -> Result<(), DbError> {
    let users: Vec<String> = connection
        .query("SELECT name FROM rs_user ORDER BY name")
        .await
        .map_err(db)?;
    match users.iter().find_map(|user| {
        partition_value_misfit(&partition.data_type, user).map(|misfit| (user, misfit))
    }) {
        Some((user, type_name)) => Err(partition_column_refusal(init, user, &type_name)),
        None => Ok(()),
    }
}

/// Refuses, naming it, a column of a type rowsync cannot carry.
fn refuse_unsupported_types(table: &str, infos: &[ColumnInfo]) -> Result<(), DbError> {
    match infos
        .iter()
        .find(|info| !super::value::SUPPORTED_DATA_TYPES.contains(&info.data_type.as_str()))
    {
        Some(info) => Err(unsupported_column_type(
            table,
            &info.name,
            &info.column_type,
        )),
        None => Ok(()),
    }
}

/// Every script version, oldest first, with what it holds of `table`.
async fn version_facts(connection: &mut Conn, table: &str) -> Result<Vec<VersionFacts>, DbError> {
    let rows: Vec<(String, i64, i64)> = connection
        .exec(
            "SELECT v.name,
                    EXISTS (SELECT 1 FROM rs_subscription AS s WHERE s.script_version = v.name),
                    EXISTS (SELECT 1 FROM rs_script AS s WHERE s.script_version = v.name AND s.table_name = ?)
             FROM rs_script_version AS v ORDER BY v.created_at, v.name",
            (table,),
        )
        .await
        .map_err(db)?;
    let mut versions = Vec::with_capacity(rows.len());
    for (name, in_use, synchronizes_table) in rows {
        let columns: Vec<String> = connection
            .exec(
                "SELECT column_name FROM rs_script_column
                 WHERE script_version = ? AND table_name = ? AND dropped = 0 ORDER BY position",
                (&name, table),
            )
            .await
            .map_err(db)?;
        versions.push(VersionFacts {
            name,
            in_use: in_use != 0,
            synchronizes_table: synchronizes_table != 0,
            columns: (!columns.is_empty()).then_some(columns),
        });
    }
    Ok(versions)
}

/// What `register` writes.
struct Registration<'a> {
    shape: &'a TableShape,
    infos: &'a [ColumnInfo],
    init: &'a TableInit,
    target: &'a Target,
    versions: &'a [VersionFacts],
    /// The table's scripts for a part of its columns.
    scripts_for: &'a (dyn Fn(&TableShape) -> reinit::DefaultScripts + Sync),
    /// The table's rule, when it is not `owner`.
    rule: Option<&'static str>,
}

/// A table with a rule: the columns it synchronizes and what its scripts are made from.
struct RuledTable {
    rule: Ruled<rules::MysqlRuleSql>,
    shape: TableShape,
    infos: Vec<ColumnInfo>,
}

impl RuledTable {
    async fn new(
        connection: &mut Conn,
        rule_set: &RuleSet,
        shape: &TableShape,
        infos: &[ColumnInfo],
    ) -> Result<RuledTable, DbError> {
        let (keys, sql) = rules::rule_facts(connection, rule_set, &shape.name).await?;
        let rule = Ruled::new(rule_set, &shape.name, keys, sql)?;
        let (shape, infos) = rules::rule_shape(shape, infos, rule.rule())?;
        Ok(RuledTable { rule, shape, infos })
    }
}

/// Creates the target version, as a copy of its base (scripts and recorded columns).
async fn create_version(transaction: &mut Transaction<'_>, target: &Target) -> Result<(), DbError> {
    if !target.create {
        return Ok(());
    }
    transaction
        .exec_drop(
            "INSERT INTO rs_script_version (name, description) VALUES (?, '')",
            (&target.name,),
        )
        .await
        .map_err(db)?;
    if let Some(base) = &target.based_on {
        transaction
            .exec_drop(
                "INSERT INTO rs_script (script_version, table_name, event, script)
                 SELECT ?, table_name, event, script FROM rs_script WHERE script_version = ?",
                (&target.name, base),
            )
            .await
            .map_err(db)?;
        transaction
            .exec_drop(
                "INSERT INTO rs_script_column (script_version, table_name, column_name, position, dropped)
                 SELECT ?, table_name, column_name, position, dropped FROM rs_script_column WHERE script_version = ?",
                (&target.name, base),
            )
            .await
            .map_err(db)?;
    }
    Ok(())
}

async fn write_script(
    transaction: &mut Transaction<'_>,
    version: &str,
    table: &str,
    event: &str,
    script: &str,
) -> Result<(), DbError> {
    transaction
        .exec_drop(
            "INSERT INTO rs_script (script_version, table_name, event, script) VALUES (?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE script = VALUES(script)",
            (version, table, event, script),
        )
        .await
        .map_err(db)
}

/// The table's default scripts in `version`, and the columns they carry.
async fn write_default_scripts(
    transaction: &mut Transaction<'_>,
    version: &str,
    shape: &TableShape,
    scripts: reinit::DefaultScripts,
) -> Result<(), DbError> {
    for (event, script) in scripts {
        write_script(transaction, version, &shape.name, event, &script).await?;
    }
    transaction
        .exec_drop(
            "DELETE FROM rs_script_column WHERE script_version = ? AND table_name = ?",
            (version, &shape.name),
        )
        .await
        .map_err(db)?;
    for (position, column) in shape.columns.iter().enumerate() {
        transaction
            .exec_drop(
                "INSERT INTO rs_script_column (script_version, table_name, column_name, position) VALUES (?, ?, ?, ?)",
                (version, &shape.name, &column.name, position as i64),
            )
            .await
            .map_err(db)?;
    }
    Ok(())
}

/// Rewrites an older version's default scripts without the columns the table lost,
/// and marks those dropped (its clients' values for them are ignored from now on).
async fn rewrite_dropped(
    transaction: &mut Transaction<'_>,
    rewrite: &Rewrite,
    shape: &TableShape,
    defaults: reinit::RewriteDefaults,
    outcome: &mut InitOutcome,
) -> Result<(), DbError> {
    let stored: HashMap<String, String> = transaction
        .exec::<(String, String), _, _>(
            "SELECT event, script FROM rs_script WHERE script_version = ? AND table_name = ?",
            (&rewrite.version, &shape.name),
        )
        .await
        .map_err(db)?
        .into_iter()
        .collect();
    let (write, left_alone) =
        reinit::rewritten_scripts(&stored, defaults.recorded, defaults.remaining);
    for (event, script) in write {
        write_script(transaction, &rewrite.version, &shape.name, event, &script).await?;
    }
    for column in &rewrite.dropped {
        transaction
            .exec_drop(
                "UPDATE rs_script_column SET dropped = 1 WHERE script_version = ? AND table_name = ? AND column_name = ?",
                (&rewrite.version, &shape.name, column),
            )
            .await
            .map_err(db)?;
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

/// The columns of `table` that `version` records as dropped (see `Dialect::dropped_columns`).
pub async fn dropped_columns(
    connection: &mut impl Queryable,
    version: &str,
    table: &str,
) -> Result<Vec<String>, DbError> {
    connection
        .exec(
            "SELECT column_name FROM rs_script_column WHERE script_version = ? AND table_name = ? AND dropped = 1",
            (version, table),
        )
        .await
        .map_err(db)
}

/// Stamps the rows already in the table and registers it with its default scripts, in one
/// transaction: a sync that sees the scripts has a watermark at or below the stamp.
async fn register(
    connection: &mut Conn,
    registration: Registration<'_>,
) -> Result<InitOutcome, DbError> {
    let Registration {
        shape,
        infos,
        init,
        target,
        versions,
        scripts_for,
        rule,
    } = registration;
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    stamp_rows(&mut transaction, shape, infos).await?;
    record_table(&mut transaction, init, rule).await?;
    create_version(&mut transaction, target).await?;
    let mut outcome = InitOutcome {
        script_version: target.name.clone(),
        created: target.create,
        based_on: target.based_on.clone(),
        ..InitOutcome::default()
    };
    write_default_scripts(&mut transaction, &target.name, shape, scripts_for(shape)).await?;
    for rewrite in reinit::dropped_column_rewrites(versions, &target.name, shape) {
        let defaults = reinit::RewriteDefaults::of(&rewrite, shape, scripts_for);
        rewrite_dropped(&mut transaction, &rewrite, shape, defaults, &mut outcome).await?;
    }
    transaction.commit().await.map_err(db)?;
    Ok(outcome)
}

/// Stamps the rows the table holds unstamped with a stamp of their own, and moves the
/// clock to it.
async fn stamp_rows(
    transaction: &mut Transaction<'_>,
    shape: &TableShape,
    infos: &[ColumnInfo],
) -> Result<(), DbError> {
    let stamp = stamp::next_stamp(transaction).await?;
    transaction
        .query_drop("SET @rs_stamping = 1")
        .await
        .map_err(db)?;
    let stamped = transaction
        .exec_drop(
            format!(
                "UPDATE {} SET {} = ?{} WHERE {} IS NULL",
                q(&shape.name),
                q(STAMP_COLUMN),
                keep_auto_updated(infos),
                q(STAMP_COLUMN)
            ),
            (stamp,),
        )
        .await;
    transaction
        .query_drop("SET @rs_stamping = NULL")
        .await
        .map_err(db)?;
    stamped.map_err(db)?;
    stamp::set_clock(transaction, stamp).await?;
    Ok(())
}

/// Records the table, its partition column and its rule (or none).
async fn record_table(
    transaction: &mut Transaction<'_>,
    init: &TableInit,
    rule: Option<&'static str>,
) -> Result<(), DbError> {
    transaction
        .exec_drop(
            "INSERT INTO rs_table (table_name, partition_column) VALUES (?, ?)
             ON DUPLICATE KEY UPDATE partition_column = VALUES(partition_column)",
            (&init.table, &init.partition_column),
        )
        .await
        .map_err(db)?;
    match rule {
        Some(kind) => transaction
            .exec_drop(
                "INSERT INTO rs_table_rule (table_name, rule) VALUES (?, ?)
                 ON DUPLICATE KEY UPDATE rule = VALUES(rule)",
                (&init.table, kind),
            )
            .await
            .map_err(db)?,
        None => transaction
            .exec_drop(
                "DELETE FROM rs_table_rule WHERE table_name = ?",
                (&init.table,),
            )
            .await
            .map_err(db)?,
    }
    Ok(())
}

/// `col` or `col(191)`: a column as an index takes it (text and blob types need a prefix).
fn indexed(info: &ColumnInfo) -> String {
    if info.data_type.ends_with("text") || info.data_type.ends_with("blob") {
        format!("{}({PARTITION_INDEX_PREFIX_CHARS})", q(&info.name))
    } else {
        q(&info.name)
    }
}

async fn has_column(connection: &mut Conn, table: &str, column: &str) -> Result<bool, DbError> {
    let found: Option<i64> = connection
        .exec_first(
            "SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            (table, column),
        )
        .await
        .map_err(db)?;
    Ok(found.is_some())
}

async fn has_index(connection: &mut Conn, table: &str, index: &str) -> Result<bool, DbError> {
    let found: Option<i64> = connection
        .exec_first(
            "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = ? LIMIT 1",
            (table, index),
        )
        .await
        .map_err(db)?;
    Ok(found.is_some())
}

/// Change tracking. Every row carries a stamp (`rs_stamp`, NULL until a stamper gives it
/// the clock's next value, in commit order: see `stamp`) and the stamp of the sync that
/// wrote it (`rs_origin`, from the session's `@rs_sync`; 0 for other writers). Triggers
/// clear the stamp on every write but the stamper's own (`@rs_stamping`), and append a
/// tombstone (unstamped too) for each deleted row and each row that left its key or
/// partition. Both columns are invisible, so `SELECT *` and column-less inserts are as
/// before. Only `IF EXISTS`/`IF NOT EXISTS` forms and checks run here, so `init` can be
/// repeated, on MySQL too (which lacks `ADD COLUMN IF NOT EXISTS`).
async fn tracking_ddl(
    connection: &mut Conn,
    shape: &TableShape,
    infos: &[ColumnInfo],
    partition: &ColumnInfo,
) -> Result<Vec<String>, DbError> {
    let name = &shape.name;
    let table = q(name);
    let tombstones = q(&tombstone_table(name));
    let keys = &shape.key_columns;
    let stamp = q(STAMP_COLUMN);
    let origin = q(ORIGIN_COLUMN);
    let mut statements = Vec::new();
    if !has_column(connection, name, STAMP_COLUMN).await? {
        statements.push(format!(
            "ALTER TABLE {table} ADD COLUMN {stamp} BIGINT NULL INVISIBLE, ADD COLUMN {origin} BIGINT NOT NULL DEFAULT 0 INVISIBLE"
        ));
    }
    let stamp_index = format!("rs_stamp_{name}");
    if !has_index(connection, name, &stamp_index).await? {
        statements.push(format!(
            "CREATE INDEX {} ON {table} ({stamp})",
            q(&stamp_index)
        ));
    }
    let partition_index = format!("rs_partition_{name}");
    if !has_index(connection, name, &partition_index).await? {
        statements.push(format!(
            "CREATE INDEX {} ON {table} ({}, {stamp})",
            q(&partition_index),
            indexed(partition)
        ));
    }
    let key_definitions = keys
        .iter()
        .map(|key| {
            let info = infos
                .iter()
                .find(|info| &info.name == key)
                .expect("key is a column");
            format!("{} {}", q(key), info.column_type)
        })
        .collect::<Vec<_>>()
        .join(", ");
    statements.push(format!(
        "CREATE TABLE IF NOT EXISTS {tombstones} (rs_id BIGINT AUTO_INCREMENT PRIMARY KEY, {key_definitions},
         rs_partition {LONG_TEXT} NOT NULL, stamp BIGINT NULL, origin BIGINT NOT NULL DEFAULT 0,
         INDEX {stamp_index} (stamp), INDEX {partition_index} (rs_partition({PARTITION_INDEX_PREFIX_CHARS}), stamp)) ENGINE = InnoDB",
        stamp_index = q(&format!("{}_stamp", tombstone_table(name))),
        partition_index = q(&format!("{}_partition", tombstone_table(name))),
    ));
    statements.extend(widened_tombstone_keys(connection, shape, infos).await?);
    statements.extend(tracking_triggers(shape, &partition.name));
    Ok(statements)
}

/// A key column whose type changed since (widened): its tombstones' column follows.
async fn widened_tombstone_keys(
    connection: &mut Conn,
    shape: &TableShape,
    infos: &[ColumnInfo],
) -> Result<Vec<String>, DbError> {
    let tombstones = tombstone_table(&shape.name);
    let Some((_, kept)) = table_shape(connection, &tombstones).await? else {
        return Ok(Vec::new());
    };
    Ok(shape
        .key_columns
        .iter()
        .filter_map(|key| {
            let now = infos.iter().find(|info| &info.name == key)?;
            let before = kept.iter().find(|info| &info.name == key)?;
            (now.column_type != before.column_type).then(|| {
                format!(
                    "ALTER TABLE {} MODIFY {} {}",
                    q(&tombstones),
                    q(key),
                    now.column_type
                )
            })
        })
        .collect())
}

/// The four row triggers of `tracking_ddl`, each dropped and created again.
fn tracking_triggers(shape: &TableShape, partition_column: &str) -> Vec<String> {
    let name = &shape.name;
    let table = q(name);
    let tombstones = q(&tombstone_table(name));
    let keys = &shape.key_columns;
    let stamp = q(STAMP_COLUMN);
    let origin = q(ORIGIN_COLUMN);
    let p = q(partition_column);
    let partition_name = partition_column.to_string();
    let mut statements = Vec::new();
    let unstamp = format!(
        "IF @rs_stamping IS NULL THEN SET NEW.{stamp} = NULL, NEW.{origin} = COALESCE(@rs_sync, 0); END IF;"
    );
    let tombstone = format!(
        "INSERT INTO {tombstones} ({}, rs_partition, stamp, origin) VALUES ({}, OLD.{p}, NULL, COALESCE(@rs_sync, 0));",
        column_list(keys, ""),
        column_list(keys, "OLD."),
    );
    let moved = keys
        .iter()
        .chain(std::iter::once(&partition_name))
        .map(|column| format!("NOT (OLD.{c} <=> NEW.{c})", c = q(column)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let trigger = |kind: &str| q(&format!("rs_{kind}_{name}"));
    for (kind, when, body) in [
        ("insert", "BEFORE INSERT", unstamp.clone()),
        ("update", "BEFORE UPDATE", unstamp),
        (
            "moved",
            "AFTER UPDATE",
            format!("IF ({moved}) AND OLD.{p} IS NOT NULL THEN {tombstone} END IF;"),
        ),
        (
            "delete",
            "AFTER DELETE",
            format!("IF OLD.{p} IS NOT NULL THEN {tombstone} END IF;"),
        ),
    ] {
        statements.push(format!("DROP TRIGGER IF EXISTS {}", trigger(kind)));
        statements.push(format!(
            "CREATE TRIGGER {} {when} ON {table} FOR EACH ROW BEGIN {body} END",
            trigger(kind)
        ));
    }
    statements
}

/// The `SET` list of the default update: every column but the key from the upload
/// (`u`); the first key column when there is nothing else, so conflicts are still found.
fn set_new_values(all: &[String], keys: &[String]) -> String {
    let non_keys: Vec<&String> = all.iter().filter(|name| !keys.contains(name)).collect();
    if non_keys.is_empty() {
        // Nothing but key columns: an update can change nothing; keep conflict detection.
        format!("t.{k} = u.{k}", k = q(&keys[0]))
    } else {
        non_keys
            .iter()
            .map(|name| format!("t.{c} = u.{c}", c = q(name)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The table's row (`t`) still is the old image the client uploaded (`u`).
fn old_image_matches(all: &[String]) -> String {
    all.iter()
        .map(|name| {
            format!(
                "t.{c} <=> u.{old}",
                c = q(name),
                old = q(&format!("{OLD_IMAGE_PREFIX}{name}"))
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The default set scripts. `{upload}` and `{keys}` are temporary tables, each named once
/// per statement (MySQL cannot open a temporary table twice in one statement).
pub fn default_scripts(shape: &TableShape, partition_column: &str) -> Vec<(&'static str, String)> {
    let table = q(&shape.name);
    let partition = q(partition_column);
    let all: Vec<String> = shape
        .columns
        .iter()
        .map(|column| column.name.clone())
        .collect();
    let keys = &shape.key_columns;
    let set_new = set_new_values(&all, keys);
    let old_matches = old_image_matches(&all);
    let table_columns = column_list(&all, "t.");
    let tu = key_match(keys, "t", "u");
    vec![
        (
            UPLOAD_INSERT,
            format!(
                "INSERT INTO {table} ({columns}) SELECT {upload_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE u.{partition} = :user AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {tu})",
                columns = column_list(&all, ""),
                upload_columns = column_list(&all, "u."),
            ),
        ),
        (
            UPLOAD_UPDATE,
            format!(
                "UPDATE {table} AS t JOIN {UPLOAD_PLACEHOLDER} AS u ON {tu} SET {set_new} \
                 WHERE t.{partition} = :user AND u.{partition} = :user AND {old_matches}"
            ),
        ),
        (
            UPLOAD_DELETE,
            // Only a row the client has seen: one its download window would bring is a
            // conflict (docs/scripts.md, "Deletes of changed rows"). A row never stamped
            // counts as seen, or it could never be deleted.
            format!(
                "DELETE t FROM {table} AS t JOIN {UPLOAD_PLACEHOLDER} AS u ON {tu} WHERE t.{partition} = :user \
                 AND NOT (COALESCE(t.{stamp}, -1) >= :last_download AND (t.{origin} = 0 OR t.{origin} <> :last_sync_xid))",
                stamp = q(STAMP_COLUMN),
                origin = q(ORIGIN_COLUMN),
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
                "SELECT {table_columns} FROM {table} AS t WHERE t.{partition} = :user \
                 AND (t.{stamp} >= :last_download OR t.{stamp} IS NULL) AND (t.{origin} = 0 OR t.{origin} <> :last_sync_xid)",
                stamp = q(STAMP_COLUMN),
                origin = q(ORIGIN_COLUMN),
            ),
        ),
        (
            DOWNLOAD_DELETE_CURSOR,
            // Keys back in the partition are downloaded as rows; their tombstones are moot.
            format!(
                "SELECT {key_list} FROM {tombstones} AS d WHERE d.rs_partition = :user AND (d.stamp >= :last_download OR d.stamp IS NULL) \
                 AND (d.origin = 0 OR d.origin <> :last_sync_xid) AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {td} AND t.{partition} = :user)",
                key_list = column_list(keys, "d."),
                tombstones = q(&tombstone_table(&shape.name)),
                td = key_match(keys, "t", "d"),
            ),
        ),
    ]
}

/// See `ConsolidatedConnection::cleanup`: drops tombstones below every watermark a
/// client acknowledged and every watermark a sync in flight will hand out. It takes no
/// lock a sync waits for: syncs in flight announce their watermark before they read
/// anything (`rs_sync_in_flight`, committed by their stamper), so none is taken from them.
pub async fn cleanup(connection: &mut Conn) -> Result<u64, DbError> {
    // Announcements of connections that are gone (a sync that never finished).
    connection
        .query_drop(
            "DELETE FROM rs_sync_in_flight WHERE connection_id NOT IN (SELECT ID FROM information_schema.PROCESSLIST)",
        )
        .await
        .map_err(db)?;
    // With no subscription and no sync in flight, every future client starts empty:
    // all tombstones go.
    let threshold: Option<i64> = connection
        .query_first(
            "SELECT LEAST(
                 COALESCE((SELECT min(download_acknowledged) FROM rs_subscription), 9223372036854775807),
                 COALESCE((SELECT min(watermark) FROM rs_sync_in_flight), 9223372036854775807),
                 (SELECT value + 1 FROM rs_counter WHERE name = 'clock'))",
        )
        .await
        .map_err(db)?;
    let threshold = threshold.unwrap_or(0);
    let tables: Vec<String> = connection
        .query("SELECT table_name FROM rs_table")
        .await
        .map_err(db)?;
    let mut removed = 0;
    for table in tables {
        connection
            .exec_drop(
                format!(
                    "DELETE FROM {} WHERE stamp < ?",
                    q(&tombstone_table(&table))
                ),
                (threshold,),
            )
            .await
            .map_err(db)?;
        removed += connection.affected_rows();
        crate::failpoint!("mid_cleanup");
    }
    Ok(removed)
}

pub async fn scripts(
    connection: &mut Conn,
    script_version: Option<&str>,
) -> Result<Vec<ScriptEntry>, DbError> {
    let rows: Vec<(String, String, String, String)> = connection
        .exec(
            "SELECT script_version, table_name, event, script FROM rs_script
             WHERE ? IS NULL OR script_version = ? ORDER BY 1, 2, 3",
            (script_version, script_version),
        )
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(|(script_version, table, event, script)| ScriptEntry {
            script_version,
            table,
            event,
            script,
        })
        .collect())
}

pub async fn set_script(connection: &mut Conn, entry: &ScriptEntry) -> Result<(), DbError> {
    check_event(&entry.table, &entry.event).map_err(DbError::Invalid)?;
    let known: Option<i64> = connection
        .exec_first(
            "SELECT 1 FROM rs_script_version WHERE name = ?",
            (&entry.script_version,),
        )
        .await
        .map_err(db)?;
    if known.is_none() {
        return Err(DbError::Invalid(format!(
            "script version {:?} does not exist; add it with `rowsync version add`",
            entry.script_version
        )));
    }
    connection
        .exec_drop(
            "INSERT INTO rs_script (script_version, table_name, event, script) VALUES (?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE script = VALUES(script)",
            (
                &entry.script_version,
                &entry.table,
                &entry.event,
                &entry.script,
            ),
        )
        .await
        .map_err(db)
}

pub async fn remove_script(
    connection: &mut Conn,
    script_version: &str,
    table: &str,
    event: &str,
) -> Result<bool, DbError> {
    connection
        .exec_drop(
            "DELETE FROM rs_script WHERE script_version = ? AND table_name = ? AND event = ?",
            (script_version, table, event),
        )
        .await
        .map_err(db)?;
    Ok(connection.affected_rows() > 0)
}

pub async fn add_script_version(
    connection: &mut Conn,
    name: &str,
    description: &str,
) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid(
            "a script version name must not be empty".into(),
        ));
    }
    let mut transaction = connection
        .start_transaction(TxOpts::default())
        .await
        .map_err(db)?;
    transaction
        .query_drop("UPDATE rs_counter SET value = value + 1 WHERE name = 'revision'")
        .await
        .map_err(db)?;
    transaction
        .exec_drop(
            "INSERT INTO rs_script_version (name, description, revision)
             VALUES (?, ?, (SELECT value FROM rs_counter WHERE name = 'revision'))
             ON DUPLICATE KEY UPDATE description = VALUES(description)",
            (name, description),
        )
        .await
        .map_err(db)?;
    transaction.commit().await.map_err(db)
}

pub async fn script_versions(connection: &mut Conn) -> Result<Vec<(String, String)>, DbError> {
    connection
        .query("SELECT name, description FROM rs_script_version ORDER BY name")
        .await
        .map_err(db)
}

/// Appends to the monitor's history and keeps its newest `rows_max` rows.
pub async fn append_sync_history(
    connection: &mut Conn,
    records: &[crate::HistoryRecord],
    rows_max: u64,
) -> Result<(), DbError> {
    let mut transaction = connection
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .map_err(db)?;
    transaction
        .exec_batch(
            "INSERT INTO rs_sync_history (ended_unix_ms, user_name, outcome, record) VALUES (?, ?, ?, ?)",
            records.iter().map(|record| {
                (
                    record.ended_unix_ms,
                    record.user.as_deref(),
                    record.outcome.as_str(),
                    record.record.as_str(),
                )
            }),
        )
        .await
        .map_err(db)?;
    let newest: Option<i64> = transaction
        .query_first("SELECT max(id) FROM rs_sync_history")
        .await
        .map_err(db)?
        .flatten();
    if let Some(first_kept) = crate::history::first_kept(newest, rows_max) {
        transaction
            .exec_drop("DELETE FROM rs_sync_history WHERE id < ?", (first_kept,))
            .await
            .map_err(db)?;
    }
    transaction.commit().await.map_err(db)
}

/// The newest `limit` rows of the monitor's history, oldest first.
pub async fn sync_history(
    connection: &mut Conn,
    limit: u64,
) -> Result<Vec<crate::HistoryRecord>, DbError> {
    let rows: Vec<(i64, Option<String>, String, String)> = connection
        .exec(
            "SELECT ended_unix_ms, user_name, outcome, record FROM \
             (SELECT * FROM rs_sync_history ORDER BY id DESC LIMIT ?) AS newest ORDER BY id",
            (limit,),
        )
        .await
        .map_err(db)?;
    Ok(rows
        .into_iter()
        .map(
            |(ended_unix_ms, user, outcome, record)| crate::HistoryRecord {
                ended_unix_ms,
                user,
                outcome,
                record,
            },
        )
        .collect())
}
