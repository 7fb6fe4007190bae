//! System tables, users, table shapes and `init` (change tracking plus default
//! scripts) for PostgreSQL.

use std::collections::HashMap;

use tokio_postgres::{Client, GenericClient, Transaction};

mod partitions;
mod rules;

use super::shapes::SCHEMA_GENERATION_DDL;
use super::statements::Statements;
use super::value::kind_of;
use crate::foreign_keys::{refuse_undeferrable_cycles, ForeignKey};
use crate::names::{column_list, key_match};
use crate::reinit::{self, Rewrite, Target, VersionFacts};
use crate::rules::{RuleSet, Ruled};
use crate::scripts::*;
use crate::shape::{partition_column_refusal, unsupported_column_type, Column, TableShape};
use crate::{quote_identifier as q, DbError, InitOutcome, ScriptEntry, TableInit};

const SYSTEM_TABLES: &str = "
CREATE TABLE IF NOT EXISTS rs_sync_history (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ended_unix_ms BIGINT NOT NULL,
    user_name TEXT,
    outcome TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rs_user (
    name TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- The keys session tokens are signed with (server/src/session_tokens.rs).
CREATE TABLE IF NOT EXISTS rs_session_key (
    id BIGSERIAL PRIMARY KEY,
    secret TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- The servers of a farm, each heard of at beat_ms (server/src/background.rs).
CREATE TABLE IF NOT EXISTS rs_server (
    server_id TEXT PRIMARY KEY,
    beat_ms BIGINT NOT NULL
);
-- Refused logins each server counted, shared by the farm (server/src/throttle.rs).
CREATE TABLE IF NOT EXISTS rs_login_failure (
    server_id TEXT NOT NULL,
    failure_key TEXT NOT NULL,
    failures BIGINT NOT NULL,
    since_ms BIGINT NOT NULL,
    PRIMARY KEY (server_id, failure_key)
);
CREATE TABLE IF NOT EXISTS rs_script_version (
    name TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
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
    upload_sequence BIGINT NOT NULL DEFAULT 0,
    download_watermark BIGINT NOT NULL DEFAULT 0,
    download_acknowledged BIGINT NOT NULL DEFAULT 0,
    last_sync_xid BIGINT NOT NULL DEFAULT 0,
    last_sync_at TIMESTAMPTZ
);
-- Apply streams (driver::streams): a group of prepared transactions is committed when
-- its decision says so; a server that finds the group prepared at start-up without a
-- decision records `committed = false` and rolls it back.
CREATE TABLE IF NOT EXISTS rs_stream_decision (
    group_id TEXT PRIMARY KEY,
    committed BOOLEAN NOT NULL,
    decided_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Columns added after a table's first release.
ALTER TABLE rs_subscription ADD COLUMN IF NOT EXISTS download_acknowledged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rs_subscription ADD COLUMN IF NOT EXISTS last_sync_xid BIGINT NOT NULL DEFAULT 0;
ALTER TABLE rs_subscription ADD COLUMN IF NOT EXISTS upload_transfer_id TEXT;
ALTER TABLE rs_user ADD COLUMN IF NOT EXISTS disabled BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS rs_subscription_user ON rs_subscription (user_name);
CREATE TABLE IF NOT EXISTS rs_table (
    table_name TEXT PRIMARY KEY,
    partition_column TEXT NOT NULL
);
-- Tables whose scripts come from a sync rule other than `owner` (`rowsync rules`): their
-- partition column is the tracking column, not the user's name.
CREATE TABLE IF NOT EXISTS rs_table_rule (
    table_name TEXT PRIMARY KEY,
    rule TEXT NOT NULL
);
-- The groups each client has, per group-rule table (driver::groups).
CREATE TABLE IF NOT EXISTS rs_client_group (
    client_id TEXT NOT NULL,
    table_name TEXT NOT NULL,
    group_value TEXT NOT NULL,
    added_at BIGINT NOT NULL,
    added_after BIGINT NOT NULL,
    removed_at BIGINT,
    removed_after BIGINT,
    PRIMARY KEY (client_id, table_name, group_value)
);
CREATE TABLE IF NOT EXISTS rs_script_column (
    script_version TEXT NOT NULL,
    table_name TEXT NOT NULL,
    column_name TEXT NOT NULL,
    position INTEGER NOT NULL,
    dropped BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (script_version, table_name, column_name)
);
-- Every change of a script gives its version a new revision, so servers reload it at
-- their next sync of that version (never during one). A sequence never repeats a
-- revision, even for a version removed and added again.
ALTER TABLE rs_script_version ADD COLUMN IF NOT EXISTS revision BIGINT NOT NULL DEFAULT 0;
CREATE SEQUENCE IF NOT EXISTS rs_script_revision;
CREATE OR REPLACE FUNCTION rs_script_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE rs_script_version SET revision = nextval('rs_script_revision') WHERE name = OLD.script_version;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        UPDATE rs_script_version SET revision = nextval('rs_script_revision') WHERE name = NEW.script_version;
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER rs_script_changed AFTER INSERT OR UPDATE OR DELETE ON rs_script
    FOR EACH ROW EXECUTE FUNCTION rs_script_changed();
-- A table's upload_insert_fast is written for its upload_insert, which it replaces
-- whenever no key conflicts: changing or removing that upload_insert removes it, however
-- the change is made (write the fast form after its upload_insert).
CREATE OR REPLACE FUNCTION rs_insert_script_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR NEW IS DISTINCT FROM OLD THEN
        DELETE FROM rs_script WHERE script_version = OLD.script_version
            AND table_name = OLD.table_name AND event = 'upload_insert_fast';
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER rs_insert_script_changed AFTER UPDATE OR DELETE ON rs_script
    FOR EACH ROW WHEN (OLD.event = 'upload_insert') EXECUTE FUNCTION rs_insert_script_changed();
";

/// The id of the current transaction as a bigint (xid8 fits for 2^63 transactions).
pub const CURRENT_XID: &str = "(pg_current_xact_id()::text)::bigint";

pub async fn install_system_tables(client: &impl GenericClient) -> Result<(), DbError> {
    // Concurrent installers would race on CREATE TABLE IF NOT EXISTS; serialize them.
    client
        .batch_execute(&format!(
            "SELECT pg_advisory_xact_lock(7261); {SYSTEM_TABLES} {SCHEMA_GENERATION_DDL}"
        ))
        .await?;
    Ok(())
}

pub async fn set_user(client: &Client, name: &str, password_hash: &str) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid("a user name must not be empty".into()));
    }
    client
        .execute(
            "INSERT INTO rs_user (name, password_hash) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET password_hash = excluded.password_hash",
            &[&name, &password_hash],
        )
        .await?;
    Ok(())
}

/// A table's columns (with their SQL types) and primary key, `None` if it does not exist.
pub async fn table_shape(
    client: &impl GenericClient,
    statements: Option<&Statements>,
    table: &str,
) -> Result<Option<(TableShape, Vec<String>)>, DbError> {
    let rows = match statements {
        Some(statements) => {
            let statement = statements.prepare(client, TABLE_SHAPE_QUERY).await?;
            client.query(&statement, &[&q(table)]).await?
        }
        None => client.query(TABLE_SHAPE_QUERY, &[&q(table)]).await?,
    };
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(shape_from_rows(table, rows)))
}

/// See `ConsolidatedConnection::client_columns`.
pub async fn client_columns(
    client: &impl GenericClient,
    table: &str,
) -> Result<Option<crate::ClientTable>, DbError> {
    let Some((shape, types)) = table_shape(client, None, table).await? else {
        return Ok(None);
    };
    let affinity = |sql_type: &str| match sql_type {
        "boolean" | "smallint" | "integer" | "bigint" => "INTEGER",
        "real" | "double precision" => "REAL",
        "bytea" => "BLOB",
        _ => "TEXT",
    };
    Ok(Some(crate::ClientTable {
        columns: shape
            .columns
            .iter()
            .zip(&types)
            .map(|(column, sql_type)| (column.name.clone(), affinity(sql_type)))
            .collect(),
        key_columns: shape.key_columns,
    }))
}

/// A table's columns in order, their SQL types, and their position in the primary key.
const TABLE_SHAPE_QUERY: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
                    COALESCE(array_position(i.indkey::int2[], a.attnum) + 1, 0)
             FROM pg_attribute a
             LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary
             WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.attname <> 'rs_xid'
             ORDER BY a.attnum";

fn shape_from_rows(table: &str, rows: Vec<tokio_postgres::Row>) -> (TableShape, Vec<String>) {
    let mut keys: Vec<(i32, String)> = Vec::new();
    let mut columns = Vec::new();
    let mut types = Vec::new();
    for row in rows {
        let name: String = row.get(0);
        let position: i32 = row.get(2);
        if position > 0 {
            keys.push((position, name.clone()));
        }
        types.push(row.get::<_, String>(1));
        columns.push(Column { name });
    }
    keys.sort();
    (
        TableShape {
            name: table.to_string(),
            columns,
            key_columns: keys.into_iter().map(|(_, name)| name).collect(),
        },
        types,
    )
}

/// A table's foreign keys, each with the table it references. A key declared on a
/// partitioned table is its own (and each partition's, as the partition's copy of it);
/// the copies PostgreSQL adds to the referencing table for each partition of a
/// partitioned referenced table are left out (their parent is on the same table).
const FOREIGN_KEYS_QUERY: &str = "SELECT c.conname::text, r.relname::text, c.condeferrable
             FROM pg_constraint AS c JOIN pg_class AS r ON r.oid = c.confrelid
             WHERE c.conrelid = to_regclass($1) AND c.contype = 'f'
               AND NOT EXISTS (SELECT FROM pg_constraint AS p
                               WHERE p.oid = c.conparentid AND p.conrelid = c.conrelid)
             ORDER BY c.conname";

pub async fn foreign_keys(
    client: &impl GenericClient,
    statements: Option<&Statements>,
    table: &str,
) -> Result<Vec<ForeignKey>, DbError> {
    let rows = match statements {
        Some(statements) => {
            let statement = statements.prepare(client, FOREIGN_KEYS_QUERY).await?;
            client.query(&statement, &[&q(table)]).await?
        }
        None => client.query(FOREIGN_KEYS_QUERY, &[&q(table)]).await?,
    };
    Ok(rows
        .iter()
        .map(|row| ForeignKey {
            constraint: row.get(0),
            referenced: row.get(1),
            deferrable: row.get(2),
        })
        .collect())
}

/// `init`'s refusal of a cycle of foreign keys through `table` among the synchronized
/// tables unless every key of it is DEFERRABLE (syncs that write the cycle's tables then
/// run `SET CONSTRAINTS ... DEFERRED` naming them).
async fn refuse_undeferrable_cycles_through(
    client: &impl GenericClient,
    table: &str,
) -> Result<(), DbError> {
    let names = client
        .query("SELECT table_name FROM rs_table ORDER BY table_name", &[])
        .await?;
    let mut tables = Vec::with_capacity(names.len());
    for row in names {
        let name: String = row.get(0);
        let keys = foreign_keys(client, None, &name).await?;
        tables.push((name, keys));
    }
    refuse_undeferrable_cycles(table, &tables, |undeferrable| {
        let statements: Vec<String> = undeferrable
            .iter()
            .map(|found| {
                format!(
                    "ALTER TABLE {} ALTER CONSTRAINT {} DEFERRABLE INITIALLY DEFERRED;",
                    q(found.table),
                    q(&found.key.constraint)
                )
            })
            .collect();
        format!(
            "Make them deferrable and rowsync defers them for the syncs that write these \
             tables: {}",
            statements.join(" ")
        )
    })
}

/// The column `init` adds: the id of the transaction that last wrote the row.
pub const XID_COLUMN: &str = "rs_xid";

/// The view of a table's tombstones, one row per deleted key (see `tracking_ddl`).
pub fn tombstone_table(table: &str) -> String {
    format!("rs_tombstone_{table}")
}

/// The table that holds a table's tombstones in batches (see `tracking_ddl`).
pub fn deleted_table(table: &str) -> String {
    format!("rs_deleted_{table}")
}

/// The longest table name whose derived names (`rs_track_delete_<T>`,
/// `rs_deleted_<T>_xid`) fit PostgreSQL's 63-byte identifiers.
pub const TABLE_NAME_BYTES_MAX: usize = 46;

pub async fn init_table(
    client: &mut Client,
    init: &TableInit,
    rules: Option<&RuleSet>,
) -> Result<InitOutcome, DbError> {
    refuse_unusable_name(&init.table)?;
    let transaction = client.transaction().await?;
    install_system_tables(&transaction).await?;
    let table = tracked_table(&transaction, init, rules).await?;
    let init = &table.init;
    let (shape, types, ruled) = (&table.shape, &table.types, &table.ruled);
    if ruled.as_ref().is_none_or(|ruled| ruled.rule.is_owner()) {
        refuse_misfit_users(&transaction, init, &table.partition_type).await?;
    }
    let versions = version_facts(&transaction, &init.table).await?;
    let target = reinit::choose_version(init, &versions, &shape.column_names())?;
    register_tracking(&transaction, &table).await?;
    refuse_undeferrable_cycles_through(&transaction, &init.table).await?;
    create_version(&transaction, &target).await?;
    let mut outcome = InitOutcome {
        script_version: target.name.clone(),
        created: target.create,
        based_on: target.based_on.clone(),
        ..InitOutcome::default()
    };
    // A part of the table's columns (an older version's) with their types; a column the
    // table lost has none, which only means it is compared as it is.
    let defaults = |part: &TableShape| {
        let part_types: Vec<String> = part
            .columns
            .iter()
            .map(|column| {
                shape
                    .columns
                    .iter()
                    .position(|c| c.name == column.name)
                    .map_or_else(String::new, |index| types[index].clone())
            })
            .collect();
        match ruled {
            Some(ruled) if !ruled.rule.is_owner() => ruled.scripts(part, &part_types),
            _ => default_scripts(
                part,
                &part_types,
                &init.partition_column,
                &table.partition_type,
            ),
        }
    };
    write_default_scripts(&transaction, &target.name, shape, defaults(shape)).await?;
    for rewrite in reinit::dropped_column_rewrites(&versions, &target.name, shape) {
        let rewrite_defaults = reinit::RewriteDefaults::of(&rewrite, shape, defaults);
        rewrite_dropped(
            &transaction,
            &rewrite,
            &shape.name,
            rewrite_defaults,
            &mut outcome,
        )
        .await?;
    }
    transaction.commit().await?;
    Ok(outcome)
}

/// Refuses a table whose derived names would not fit, or one of rowsync's own.
fn refuse_unusable_name(table: &str) -> Result<(), DbError> {
    if table.len() > TABLE_NAME_BYTES_MAX {
        return Err(DbError::Invalid(format!(
            "table name {table:?} is {} bytes; the names rowsync derives from it would pass \
             PostgreSQL's 63-byte identifier limit (at most {TABLE_NAME_BYTES_MAX} bytes)",
            table.len()
        )));
    }
    if table.starts_with("rs_") {
        return Err(DbError::Invalid(
            "tables named rs_* are rowsync's own".into(),
        ));
    }
    Ok(())
}

/// A table `init` makes synchronizable: all its columns, those its scripts carry (a
/// rule's), and its partition column (the rule's tracking column) with that type.
struct Tracked {
    init: TableInit,
    full_shape: TableShape,
    full_types: Vec<String>,
    shape: TableShape,
    types: Vec<String>,
    partition_type: String,
    ruled: Option<RuledTable>,
}

async fn tracked_table(
    transaction: &Transaction<'_>,
    init: &TableInit,
    rules: Option<&RuleSet>,
) -> Result<Tracked, DbError> {
    let (full_shape, full_types) = table_shape(transaction, None, &init.table)
        .await?
        .ok_or_else(|| DbError::Invalid(format!("table {:?} does not exist", init.table)))?;
    if full_shape.key_columns.is_empty() {
        return Err(DbError::Invalid(format!(
            "table {:?} has no primary key; rowsync identifies rows by their primary key",
            init.table
        )));
    }
    let ruled = match rules {
        Some(rules) => Some(RuledTable::new(transaction, rules, &full_shape, &full_types).await?),
        None => None,
    };
    let (init, shape, types) = match &ruled {
        Some(ruled) => (
            TableInit {
                partition_column: ruled.rule.tracking_column.clone(),
                ..init.clone()
            },
            ruled.shape.clone(),
            ruled.types.clone(),
        ),
        None => (init.clone(), full_shape.clone(), full_types.clone()),
    };
    refuse_unsupported_types(transaction, &shape, &types).await?;
    let Some(partition_type) = full_shape
        .columns
        .iter()
        .position(|column| column.name == init.partition_column)
        .map(|index| full_types[index].clone())
    else {
        return Err(DbError::Invalid(format!(
            "table {:?} has no column {:?} to partition by",
            init.table, init.partition_column
        )));
    };
    Ok(Tracked {
        init,
        full_shape,
        full_types,
        shape,
        types,
        partition_type,
        ruled,
    })
}

/// The table's change tracking, and its entries in `rs_table` and `rs_table_rule`.
async fn register_tracking(transaction: &Transaction<'_>, table: &Tracked) -> Result<(), DbError> {
    let init = &table.init;
    install_tracking(transaction, &table.full_shape, &table.full_types, init).await?;
    if table
        .ruled
        .as_ref()
        .is_some_and(RuledTable::by_change_stamp)
    {
        // Its cursors find changed rows by rs_xid alone (the tracking index leads with
        // the partition column, here the first key column).
        transaction
            .batch_execute(&format!(
                "CREATE INDEX IF NOT EXISTS {} ON {} ({})",
                q(&format!("rs_xid_only_{}", init.table)),
                q(&init.table),
                q(XID_COLUMN)
            ))
            .await?;
    }
    transaction
        .execute(
            "INSERT INTO rs_table (table_name, partition_column) VALUES ($1, $2)
             ON CONFLICT (table_name) DO UPDATE SET partition_column = excluded.partition_column",
            &[&init.table, &init.partition_column],
        )
        .await?;
    record_rule(transaction, &init.table, table.ruled.as_ref()).await
}

/// A table with a rule: the columns it synchronizes and what its scripts are made from.
struct RuledTable {
    rule: Ruled<rules::PgRuleSql>,
    shape: TableShape,
    types: Vec<String>,
}

impl RuledTable {
    async fn new(
        client: &impl GenericClient,
        rule_set: &RuleSet,
        shape: &TableShape,
        types: &[String],
    ) -> Result<RuledTable, DbError> {
        let (keys, sql) = rules::rule_facts(client, rule_set, &shape.name).await?;
        let rule = Ruled::new(rule_set, &shape.name, keys, sql)?;
        let (shape, types) = rules::rule_shape(shape, types, rule.rule())?;
        Ok(RuledTable { rule, shape, types })
    }

    fn by_change_stamp(&self) -> bool {
        self.rule.by_change_stamp()
    }

    fn scripts(&self, part: &TableShape, types: &[String]) -> Vec<(&'static str, String)> {
        rules::rule_scripts(part, types, &self.rule.scope())
    }
}

/// Records whether the table's scripts come from a rule other than `owner`.
async fn record_rule(
    transaction: &Transaction<'_>,
    table: &str,
    ruled: Option<&RuledTable>,
) -> Result<(), DbError> {
    let rule = ruled
        .filter(|ruled| !ruled.rule.is_owner())
        .map(|ruled| ruled.rule.rule().rule.kind());
    match rule {
        Some(kind) => {
            transaction
                .execute(
                    "INSERT INTO rs_table_rule (table_name, rule) VALUES ($1, $2)
                 ON CONFLICT (table_name) DO UPDATE SET rule = excluded.rule",
                    &[&table, &kind],
                )
                .await?
        }
        None => {
            transaction
                .execute("DELETE FROM rs_table_rule WHERE table_name = $1", &[&table])
                .await?
        }
    };
    Ok(())
}

/// The table's change tracking (`tracking_ddl`; a partitioned table's partitions
/// followed, see `partitions`).
async fn install_tracking(
    transaction: &Transaction<'_>,
    shape: &TableShape,
    types: &[String],
    init: &TableInit,
) -> Result<(), DbError> {
    let key_types: Vec<&str> = shape
        .key_columns
        .iter()
        .map(|key| {
            let index = shape
                .columns
                .iter()
                .position(|column| &column.name == key)
                .expect("key is a column");
            types[index].as_str()
        })
        .collect();
    let partitioned = partitions::is_partitioned(transaction, &init.table).await?;
    if partitioned {
        partitions::initializing(transaction).await?;
    }
    let ddl = tracking_ddl(shape, &key_types, &init.partition_column, partitioned);
    transaction.batch_execute(&ddl).await?;
    if partitioned {
        partitions::follow_partitions(transaction, &init.table).await?;
    }
    Ok(())
}

/// Refuses, naming it, a column of a type rowsync cannot carry ([`kind_of`]), so that
/// no sync ever meets one.
async fn refuse_unsupported_types(
    client: &impl GenericClient,
    shape: &TableShape,
    types: &[String],
) -> Result<(), DbError> {
    let names: Vec<String> = shape.columns.iter().map(|c| c.name.clone()).collect();
    let statement = client
        .prepare(&format!(
            "SELECT {} FROM {}",
            column_list(&names, ""),
            q(&shape.name)
        ))
        .await?;
    for ((column, name), type_name) in statement.columns().iter().zip(&names).zip(types) {
        if kind_of(column.type_()).is_none() {
            return Err(unsupported_column_type(&shape.name, name, type_name));
        }
    }
    Ok(())
}

/// `expression` in a form `IS NOT DISTINCT FROM` can compare: `json` has no equality
/// operator, so json columns compare as their text (exactly as stored).
pub fn comparable(expression: &str, sql_type: &str) -> String {
    if sql_type == "json" || sql_type.starts_with("json[") {
        format!("{expression}::text")
    } else {
        expression.to_string()
    }
}

/// Every script version, oldest first, with what it holds of `table`.
async fn version_facts(
    transaction: &Transaction<'_>,
    table: &str,
) -> Result<Vec<VersionFacts>, DbError> {
    let rows = transaction
        .query(
            "SELECT v.name,
                    EXISTS (SELECT 1 FROM rs_subscription AS s WHERE s.script_version = v.name),
                    EXISTS (SELECT 1 FROM rs_script AS s WHERE s.script_version = v.name AND s.table_name = $1),
                    (SELECT array_agg(c.column_name ORDER BY c.position) FROM rs_script_column AS c
                     WHERE c.script_version = v.name AND c.table_name = $1 AND NOT c.dropped)
             FROM rs_script_version AS v ORDER BY v.created_at, v.name",
            &[&table],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| VersionFacts {
            name: row.get(0),
            in_use: row.get(1),
            synchronizes_table: row.get(2),
            columns: row.get(3),
        })
        .collect())
}

/// Creates the target version, as a copy of its base (scripts and recorded columns).
async fn create_version(transaction: &Transaction<'_>, target: &Target) -> Result<(), DbError> {
    if !target.create {
        return Ok(());
    }
    transaction
        .execute(
            "INSERT INTO rs_script_version (name, revision) VALUES ($1, nextval('rs_script_revision'))",
            &[&target.name],
        )
        .await?;
    if let Some(base) = &target.based_on {
        transaction
            .execute(
                "INSERT INTO rs_script (script_version, table_name, event, script)
                 SELECT $1, table_name, event, script FROM rs_script WHERE script_version = $2",
                &[&target.name, base],
            )
            .await?;
        transaction
            .execute(
                "INSERT INTO rs_script_column (script_version, table_name, column_name, position, dropped)
                 SELECT $1, table_name, column_name, position, dropped FROM rs_script_column WHERE script_version = $2",
                &[&target.name, base],
            )
            .await?;
    }
    Ok(())
}

async fn write_script(
    transaction: &Transaction<'_>,
    version: &str,
    table: &str,
    event: &str,
    script: &str,
) -> Result<(), DbError> {
    transaction
        .execute(
            "INSERT INTO rs_script (script_version, table_name, event, script) VALUES ($1, $2, $3, $4)
             ON CONFLICT (script_version, table_name, event) DO UPDATE SET script = excluded.script",
            &[&version, &table, &event, &script],
        )
        .await?;
    Ok(())
}

/// The table's default scripts in `version`, and the columns they carry.
async fn write_default_scripts(
    transaction: &Transaction<'_>,
    version: &str,
    shape: &TableShape,
    scripts: Vec<(&'static str, String)>,
) -> Result<(), DbError> {
    for (event, script) in scripts {
        write_script(transaction, version, &shape.name, event, &script).await?;
    }
    let columns = shape.column_names();
    transaction
        .execute(
            "DELETE FROM rs_script_column WHERE script_version = $1 AND table_name = $2",
            &[&version, &shape.name],
        )
        .await?;
    transaction
        .execute(
            "INSERT INTO rs_script_column (script_version, table_name, column_name, position)
             SELECT $1, $2, c.name, c.position::int FROM unnest($3::text[]) WITH ORDINALITY AS c (name, position)",
            &[&version, &shape.name, &columns],
        )
        .await?;
    Ok(())
}

/// Rewrites an older version's default scripts without the columns the table lost,
/// and marks those dropped (its clients' values for them are ignored from now on).
async fn rewrite_dropped(
    transaction: &Transaction<'_>,
    rewrite: &Rewrite,
    table: &str,
    defaults: reinit::RewriteDefaults,
    outcome: &mut InitOutcome,
) -> Result<(), DbError> {
    let stored: HashMap<String, String> = transaction
        .query(
            "SELECT event, script FROM rs_script WHERE script_version = $1 AND table_name = $2",
            &[&rewrite.version, &table],
        )
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let (write, left_alone) =
        reinit::rewritten_scripts(&stored, defaults.recorded, defaults.remaining);
    for (event, script) in write {
        write_script(transaction, &rewrite.version, table, event, &script).await?;
    }
    transaction
        .execute(
            "UPDATE rs_script_column SET dropped = true
             WHERE script_version = $1 AND table_name = $2 AND column_name = ANY($3)",
            &[&rewrite.version, &table, &rewrite.dropped],
        )
        .await?;
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
    client: &impl GenericClient,
    version: &str,
    table: &str,
) -> Result<Vec<String>, DbError> {
    Ok(client
        .query(
            "SELECT column_name FROM rs_script_column
             WHERE script_version = $1 AND table_name = $2 AND dropped",
            &[&version, &table],
        )
        .await?
        .into_iter()
        .map(|row| row.get(0))
        .collect())
}

/// Change tracking: an `rs_xid` column stamped with the writing transaction's id (by
/// its default on insert, by a row trigger on update unless the statement set it, as
/// rowsync's own scripts do), and tombstones for deleted rows and rows that left their
/// key or partition.
///
/// Tombstones are written in batches: a delete statement writes one row per partition
/// it deleted from into `rs_deleted_<T>` (each key column an array, in step), not one
/// row and one index entry per key, which cost three times the delete itself (issue 17:
/// 1,000 keys, 2.7 ms as rows against 0.5 ms as one batch). `rs_tombstone_<T>` is a view
/// that unnests them, one row per key as the table of that name held before, so the
/// default delete cursor and hand-written ones read them as before, and the planner
/// still finds a partition's batches above a watermark by the `(rs_partition, xid)`
/// index. The log is append-only (a key deleted twice simply has two tombstones;
/// cleanup drops the batches every client passed). Row triggers are guarded by `WHEN`
/// clauses, evaluated without calling a function, so a bulk apply pays almost nothing
/// for them; deletes use one statement-level trigger over the transition table.
fn tracking_ddl(
    shape: &TableShape,
    key_types: &[&str],
    partition_column: &str,
    partitioned: bool,
) -> String {
    let tables = tracking_tables_ddl(shape, key_types, partition_column);
    let triggers = tracking_triggers_ddl(shape, partition_column, partitioned);
    format!("{tables}{triggers}")
}

/// The `rs_xid` column and its index, the delete batches and the tombstone view over them.
fn tracking_tables_ddl(shape: &TableShape, key_types: &[&str], partition_column: &str) -> String {
    let name = &shape.name;
    let table = q(name);
    let batches = q(&deleted_table(name));
    let keys = &shape.key_columns;
    let array_definitions = keys
        .iter()
        .zip(key_types)
        .map(|(key, ty)| format!("{} {ty}[] NOT NULL", q(key)))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {xid} BIGINT NOT NULL DEFAULT {CURRENT_XID};
CREATE INDEX IF NOT EXISTS {xid_index} ON {table} ({partition}, {xid});
CREATE TABLE IF NOT EXISTS {batches} ({array_definitions}, rs_partition TEXT NOT NULL, xid BIGINT NOT NULL);
CREATE INDEX IF NOT EXISTS {batches_index} ON {batches} (rs_partition, xid);
{migrate}
{widen_keys}
CREATE OR REPLACE VIEW {tombstones} AS
    SELECT {unnested_keys}, b.rs_partition, b.xid FROM {batches} AS b, unnest({batch_keys}) AS k({key_columns});",
        xid = q(XID_COLUMN),
        partition = q(partition_column),
        tombstones = q(&tombstone_table(name)),
        key_columns = column_list(keys, ""),
        xid_index = q(&format!("rs_xid_{name}")),
        batches_index = q(&format!("{}_xid", deleted_table(name))),
        unnested_keys = column_list(keys, "k."),
        batch_keys = column_list(keys, "b."),
        migrate = migrate_tombstone_rows(name, keys),
        widen_keys = widen_batch_keys(name, keys, key_types),
    )
}

/// The triggers that stamp changed rows with `rs_xid` and record deleted keys (and keys
/// moved out of a partition) in the batches.
fn tracking_triggers_ddl(shape: &TableShape, partition_column: &str, partitioned: bool) -> String {
    let name = &shape.name;
    let table = q(name);
    let batches = q(&deleted_table(name));
    let keys = &shape.key_columns;
    let key_columns = column_list(keys, "");
    let partition = q(partition_column);
    let xid = q(XID_COLUMN);
    let function = |kind: &str| q(&format!("rs_track_{kind}_{name}"));
    let trigger = |kind: &str| q(&format!("rs_{kind}_{name}"));
    let key_moved = keys
        .iter()
        .map(|key| format!("OLD.{k} IS DISTINCT FROM NEW.{k}", k = q(key)))
        .collect::<Vec<_>>()
        .join(" OR ");
    let aggregated = keys
        .iter()
        .map(|key| format!("array_agg(o.{})", q(key)))
        .collect::<Vec<_>>()
        .join(", ");
    let singletons = singleton_arrays(keys, "OLD.");
    format!(
        "

CREATE OR REPLACE FUNCTION {stamp_function}() RETURNS trigger LANGUAGE plpgsql AS $rs$
BEGIN
    NEW.{xid} := {CURRENT_XID};
    RETURN NEW;
END $rs$;
CREATE OR REPLACE FUNCTION {moved_function}() RETURNS trigger LANGUAGE plpgsql AS $rs$
BEGIN
    IF OLD.{partition} IS NOT NULL THEN
        INSERT INTO {batches} ({key_columns}, rs_partition, xid)
            VALUES ({singletons}, OLD.{partition}::text, {CURRENT_XID});
    END IF;
    RETURN NEW;
END $rs$;
CREATE OR REPLACE FUNCTION {delete_function}() RETURNS trigger LANGUAGE plpgsql AS $rs$
BEGIN
    INSERT INTO {batches} ({key_columns}, rs_partition, xid)
        SELECT {aggregated}, o.{partition}::text, {CURRENT_XID} FROM rs_old AS o
        WHERE o.{partition} IS NOT NULL GROUP BY o.{partition}::text;
    RETURN NULL;
END $rs$;
DROP TRIGGER IF EXISTS {stamp_trigger} ON {table};
CREATE TRIGGER {stamp_trigger} BEFORE UPDATE ON {table} FOR EACH ROW
    WHEN (NEW.{xid} IS NOT DISTINCT FROM OLD.{xid}) EXECUTE FUNCTION {stamp_function}();
DROP TRIGGER IF EXISTS {moved_trigger} ON {table};
CREATE TRIGGER {moved_trigger} {moved_timing} UPDATE ON {table} FOR EACH ROW
    WHEN ({key_moved} OR OLD.{partition} IS DISTINCT FROM NEW.{partition}) EXECUTE FUNCTION {moved_function}();
DROP TRIGGER IF EXISTS {delete_trigger} ON {table};
CREATE TRIGGER {delete_trigger} AFTER DELETE ON {table} REFERENCING OLD TABLE AS rs_old
    FOR EACH STATEMENT EXECUTE FUNCTION {delete_function}();
{truncate}",
        // An update moving a row to another partition fires no AFTER UPDATE row trigger.
        moved_timing = if partitioned { "BEFORE" } else { "AFTER" },
        truncate = partitions::truncate_ddl(name, keys, partition_column),
        stamp_function = function("stamp"),
        moved_function = function("moved"),
        delete_function = function("delete"),
        stamp_trigger = trigger("stamp"),
        moved_trigger = trigger("moved"),
        delete_trigger = trigger("delete"),
    )
}

/// A tombstone table of rowsync before batches (one row per key) becomes batches of
/// one key each, keeping every tombstone, and makes way for the view of its name.
fn migrate_tombstone_rows(name: &str, keys: &[String]) -> String {
    let tombstones = q(&tombstone_table(name));
    format!(
        "DO $rs$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass({literal}) AND relkind = 'r') THEN
        INSERT INTO {batches} ({key_columns}, rs_partition, xid)
            SELECT {singletons}, rs_partition, xid FROM {tombstones};
        DROP TABLE {tombstones};
    END IF;
END $rs$;",
        literal = quote_literal(&tombstones),
        batches = q(&deleted_table(name)),
        key_columns = column_list(keys, ""),
        singletons = singleton_arrays(keys, ""),
    )
}

/// Each key column as a batch of one key: `ARRAY[{prefix}k1], ARRAY[{prefix}k2]`.
fn singleton_arrays(keys: &[String], prefix: &str) -> String {
    keys.iter()
        .map(|key| format!("ARRAY[{prefix}{}]", q(key)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A key column whose type was widened since: its batches' arrays widen with it (the
/// view over them is made again after).
fn widen_batch_keys(name: &str, keys: &[String], key_types: &[&str]) -> String {
    let batches = q(&deleted_table(name));
    keys.iter()
        .zip(key_types)
        .map(|(key, ty)| {
            format!(
                "DO $rs$ BEGIN
    IF (SELECT format_type(atttypid, atttypmod) FROM pg_attribute
        WHERE attrelid = to_regclass({batches_literal}) AND attname = {key_literal}) <> {type_literal} THEN
        DROP VIEW IF EXISTS {tombstones};
        ALTER TABLE {batches} ALTER COLUMN {column} TYPE {ty}[];
    END IF;
END $rs$;",
                batches_literal = quote_literal(&batches),
                key_literal = quote_literal(key),
                type_literal = quote_literal(&format!("{ty}[]")),
                tombstones = q(&tombstone_table(name)),
                column = q(key),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A string as an SQL string literal, its quotes doubled (backslashes are kept as they
/// are under `standard_conforming_strings`, PostgreSQL's default since 9.1).
pub(super) fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Whether a partition column of this type takes a user name as it is; any other the
/// default scripts compare with the name cast to its type.
fn holds_text(sql_type: &str) -> bool {
    matches!(sql_type, "text" | "character varying") || sql_type.starts_with("character varying(")
}

/// Whether `user` is a value of `sql_type` without asking the database: any name of a
/// text column, a number in range of an integer one (the common partition columns; a
/// sync pays no round trip for them).
fn surely_fits(sql_type: &str, user: &str) -> bool {
    holds_text(sql_type)
        || match sql_type {
            "smallint" => user.parse::<i16>().is_ok(),
            "integer" => user.parse::<i32>().is_ok(),
            "bigint" => user.parse::<i64>().is_ok(),
            _ => false,
        }
}

/// `None` when `user` is a value of a partition column of type `sql_type` (as the
/// default scripts cast it), else the type. A failed cast is undone by a savepoint, so
/// the transaction goes on.
pub async fn partition_value_misfit(
    client: &impl GenericClient,
    sql_type: &str,
    user: &str,
) -> Result<Option<String>, DbError> {
    if surely_fits(sql_type, user) {
        return Ok(None);
    }
    client.batch_execute("SAVEPOINT rs_partition_value").await?;
    let cast = client
        .query_one(&format!("SELECT CAST($1::text AS {sql_type})"), &[&user])
        .await;
    let misfit = match cast {
        Ok(_) => false,
        // Class 22, data exception: not a value of the type.
        Err(error)
            if error
                .code()
                .is_some_and(|code| code.code().starts_with("22")) =>
        {
            true
        }
        Err(error) => return Err(error.into()),
    };
    client
        .batch_execute(if misfit {
            "ROLLBACK TO SAVEPOINT rs_partition_value; RELEASE SAVEPOINT rs_partition_value"
        } else {
            "RELEASE SAVEPOINT rs_partition_value"
        })
        .await?;
    Ok(misfit.then(|| sql_type.to_string()))
}

/// Refuses at `init` a partition column that some user's name is no value of.
async fn refuse_misfit_users(
    client: &impl GenericClient,
    init: &TableInit,
    sql_type: &str,
) -> Result<(), DbError> {
    if holds_text(sql_type) {
        return Ok(());
    }
    for row in client
        .query("SELECT name FROM rs_user ORDER BY name", &[])
        .await?
    {
        let user: String = row.get(0);
        if let Some(type_name) = partition_value_misfit(client, sql_type, &user).await? {
            return Err(partition_column_refusal(init, &user, &type_name));
        }
    }
    Ok(())
}

/// The default set scripts. Upload scripts return the keys they applied, so the server
/// finds conflicts (scratch keys not returned) in the same statement; inserts are first
/// tried without that check (`upload_insert_fast`).
pub fn default_scripts(
    shape: &TableShape,
    types: &[String],
    partition_column: &str,
    partition_type: &str,
) -> Vec<(&'static str, String)> {
    let table = q(&shape.name);
    let partition = q(partition_column);
    let user = user_as(partition_type);
    let all: Vec<String> = shape
        .columns
        .iter()
        .map(|column| column.name.clone())
        .collect();
    let keys = &shape.key_columns;
    let columns = column_list(&all, "");
    let returning_keys = column_list(keys, &format!("{table}."));
    let set_new = set_new_values(&all, keys);
    let old_matches = old_image_matches(&table, &all, types);
    let table_columns = column_list(&all, "t.");
    // Where a statement finds rows by key, the partition is checked as `(...) IS TRUE`,
    // which no index can serve: compared as a column it offers the (partition, rs_xid)
    // index too, and when the planner's estimates tie (statistics older than a bulk load)
    // a probe by that index reads the whole partition for every key, quadratic.
    vec![
        (
            UPLOAD_INSERT,
            // An anti-join rather than ON CONFLICT: half the cost in bulk. A concurrent
            // insert of the same key makes the sync retry, then it is a conflict.
            format!(
                "INSERT INTO {table} ({columns}) SELECT {upload_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE u.{partition} = {user} AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {tu}) \
                 RETURNING {returning_keys}",
                upload_columns = column_list(&all, "u."),
                tu = key_match(keys, "t", "u"),
            ),
        ),
        (
            UPLOAD_INSERT_FAST,
            // What an insert with no conflict needs: no anti-join, no RETURNING, no
            // comparison. A key that exists fails it with a unique violation; the sync
            // then rolls it back and runs upload_insert (docs/scripts.md).
            format!(
                "INSERT INTO {table} ({columns}) SELECT {upload_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE u.{partition} = {user}",
                upload_columns = column_list(&all, "u."),
            ),
        ),
        (
            UPLOAD_UPDATE,
            format!(
                "UPDATE {table} SET {set_new} FROM {UPLOAD_PLACEHOLDER} AS u WHERE {m} AND ({table}.{partition} = {user}) IS TRUE \
                 AND u.{partition} = {user} AND {old_matches} RETURNING {returning_keys}",
                m = key_match(keys, &table, "u")
            ),
        ),
        // A delete lands only on a row the client has seen: one its download window
        // would bring (changed since its last download, and not by its own last sync)
        // changed after it looked, and the delete is then a conflict, never a silent
        // loss of that change (docs/scripts.md, "Deletes of changed rows").
        (
            UPLOAD_DELETE,
            format!(
                "DELETE FROM {table} USING {UPLOAD_PLACEHOLDER} AS u WHERE {m} AND ({table}.{partition} = {user}) IS TRUE \
                 AND ({table}.{xid} < :last_download OR {table}.{xid} = :last_sync_xid) RETURNING {returning_keys}",
                m = key_match(keys, &table, "u"),
                xid = q(XID_COLUMN),
            ),
        ),
        (
            UPLOAD_FETCH,
            format!(
                "SELECT {table_columns} FROM {table} AS t JOIN {KEYS_PLACEHOLDER} AS k ON {m} WHERE (t.{partition} = {user}) IS TRUE",
                m = key_match(keys, "t", "k")
            ),
        ),
        (
            DOWNLOAD_CURSOR,
            format!(
                "SELECT {table_columns} FROM {table} AS t WHERE t.{partition} = {user} AND t.{xid} >= :last_download \
                 AND t.{xid} <> :last_sync_xid AND t.{xid} <> :echo_xid",
                xid = q(XID_COLUMN),
            ),
        ),
        (
            DOWNLOAD_DELETE_CURSOR,
            download_delete_cursor(shape, &partition, &user),
        ),
    ]
}

/// The user name compared in the partition column's own type, so its index is usable.
fn user_as(partition_type: &str) -> String {
    if holds_text(partition_type) {
        ":user::text".to_string()
    } else {
        format!("CAST(:user::text AS {partition_type})")
    }
}

/// The set-wise update's `SET` list: every column but the key from the upload (`u`).
fn set_new_values(all: &[String], keys: &[String]) -> String {
    // Setting rs_xid here keeps the stamping trigger from being called for each row.
    let stamp = format!("{} = {CURRENT_XID}", q(XID_COLUMN));
    all.iter()
        .filter(|name| !keys.contains(name))
        .map(|name| format!("{c} = u.{c}", c = q(name)))
        .chain(std::iter::once(stamp))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table's row still is the old image the client uploaded (`u`), each column
/// compared in its type's comparable form.
fn old_image_matches(table: &str, all: &[String], types: &[String]) -> String {
    all.iter()
        .zip(types)
        .map(|(name, sql_type)| {
            format!(
                "{} IS NOT DISTINCT FROM {}",
                comparable(&format!("{table}.{}", q(name)), sql_type),
                comparable(
                    &format!("u.{}", q(&format!("{OLD_IMAGE_PREFIX}{name}"))),
                    sql_type
                ),
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// The default `download_delete_cursor`: the keys deleted from the user's partition
/// since the client's download, less those back in it.
fn download_delete_cursor(shape: &TableShape, partition: &str, user: &str) -> String {
    let table = q(&shape.name);
    let keys = &shape.key_columns;
    // Keys back in the partition are downloaded as rows; their tombstones are moot.
    // The batches are read by their index and unnested per batch, each key probed
    // by the primary key: the `OFFSET 0` keeps the planner from joining all the
    // keys at once, whose count it cannot estimate (an unnest counts as 10 rows),
    // to a scan of the whole table (100 ms for 2,000 keys, against 6 ms probed).
    // (The probe by the (partition, rs_xid) index read the whole partition for each
    // tombstone: 40 ms for 500 keys, delete phases 5 times as long; see above.)
    format!(
        "SELECT {k_keys} FROM {batches} AS d CROSS JOIN LATERAL (SELECT {u_keys} \
         FROM unnest({d_keys}) AS u({key_list}) WHERE NOT EXISTS (SELECT 1 FROM {table} AS t \
         WHERE {tu} AND (t.{partition} = {user}) IS TRUE) OFFSET 0) AS k \
         WHERE d.rs_partition = :user::text AND d.xid >= :last_download \
         AND d.xid <> :last_sync_xid AND d.xid <> :echo_xid",
        k_keys = column_list(keys, "k."),
        u_keys = column_list(keys, "u."),
        d_keys = column_list(keys, "d."),
        key_list = column_list(keys, ""),
        batches = q(&deleted_table(&shape.name)),
        tu = key_match(keys, "t", "u"),
    )
}

/// The lowest of this statement's snapshot horizon and every watermark a sync in flight
/// announced (`transaction::LOCK_CLIENT_QUERY`: the low 32 bits of a transaction id
/// near this snapshot's `xmax`, widened back to 64 here).
const IN_FLIGHT_HORIZON_QUERY: &str = concat!(
    "WITH s AS (SELECT ",
    snapshot_horizon!(),
    " AS horizon, (pg_snapshot_xmax(pg_current_snapshot())::text)::bigint + 2147483648 AS reference) \
     SELECT least(s.horizon, \
       min(s.reference - (((s.reference - l.objid::text::bigint) % 4294967296) + 4294967296) % 4294967296)) \
     FROM s LEFT JOIN pg_locks AS l ON l.locktype = 'advisory' AND l.classid = 7264 AND l.objsubid = 2 \
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     GROUP BY s.horizon"
);

/// See `ConsolidatedConnection::cleanup`. The delete cursor asks for ids at or above the
/// client's watermark, so tombstones below every acknowledged watermark are done.
///
/// No sync waits for cleanup, and cleanup waits for no sync. A client's next sync brings
/// a watermark at or above the one its subscription records as acknowledged, so only a
/// client's first sync, whose subscription is invisible until it commits, could lose a
/// tombstone: one written by a transaction that was running when the sync took its
/// watermark and committed before cleanup. Every sync announces, before it takes its
/// watermark, a value at or below it (a shared advisory lock, seen in `pg_locks` at
/// once). The first statement here takes its snapshot, then reads the announcements: a
/// sync not announced yet takes its watermark later, at or above this snapshot's horizon
/// (the lowest running id never decreases). The second statement's snapshot is taken
/// after that read, so a sync whose announcement was gone had committed and its
/// subscription is seen.
pub async fn cleanup(client: &mut Client) -> Result<u64, DbError> {
    let transaction = client.transaction().await?;
    let in_flight: i64 = transaction
        .query_one(IN_FLIGHT_HORIZON_QUERY, &[])
        .await?
        .get(0);
    // With no subscription at all, every future client starts empty: all tombstones
    // below the horizon go.
    let acknowledged: Option<i64> = transaction
        .query_one(
            "SELECT min(download_acknowledged) FROM rs_subscription",
            &[],
        )
        .await?
        .get(0);
    let threshold = acknowledged.map_or(in_flight, |acknowledged| acknowledged.min(in_flight));
    let tables: Vec<String> = transaction
        .query("SELECT table_name FROM rs_table", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let mut removed = 0;
    for table in tables {
        removed += remove_passed_tombstones(&transaction, &table, threshold).await?;
        crate::failpoint!("mid_cleanup");
    }
    transaction.commit().await?;
    Ok(removed)
}

/// Removes a table's tombstones below `threshold`; how many keys they held. A table
/// whose tracking predates batches (not initialized again since) still has one row per
/// key in `rs_tombstone_<T>`.
async fn remove_passed_tombstones(
    transaction: &Transaction<'_>,
    table: &str,
    threshold: i64,
) -> Result<u64, DbError> {
    let first_key: Option<String> = transaction
        .query_opt(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attnum > 0 AND NOT attisdropped ORDER BY attnum LIMIT 1",
            &[&q(&deleted_table(table))],
        )
        .await?
        .map(|row| row.get(0));
    let Some(first_key) = first_key else {
        let statement = format!("DELETE FROM {} WHERE xid < $1", q(&tombstone_table(table)));
        return Ok(transaction.execute(&statement, &[&threshold]).await?);
    };
    let statement = format!(
        "WITH gone AS (DELETE FROM {} WHERE xid < $1 RETURNING cardinality({}) AS keys) \
         SELECT COALESCE(sum(keys), 0)::int8 FROM gone",
        q(&deleted_table(table)),
        q(&first_key),
    );
    let keys: i64 = transaction
        .query_one(&statement, &[&threshold])
        .await?
        .get(0);
    Ok(keys as u64)
}

pub async fn scripts(
    client: &Client,
    script_version: Option<&str>,
) -> Result<Vec<ScriptEntry>, DbError> {
    let rows = client
        .query(
            "SELECT script_version, table_name, event, script FROM rs_script
             WHERE $1::text IS NULL OR script_version = $1 ORDER BY 1, 2, 3",
            &[&script_version],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| ScriptEntry {
            script_version: row.get(0),
            table: row.get(1),
            event: row.get(2),
            script: row.get(3),
        })
        .collect())
}

pub async fn set_script(client: &Client, entry: &ScriptEntry) -> Result<(), DbError> {
    check_event(&entry.table, &entry.event).map_err(DbError::Invalid)?;
    let known = client
        .query_opt(
            "SELECT 1 FROM rs_script_version WHERE name = $1",
            &[&entry.script_version],
        )
        .await?;
    if known.is_none() {
        return Err(DbError::Invalid(format!(
            "script version {:?} does not exist; add it with `rowsync version add`",
            entry.script_version
        )));
    }
    client
        .execute(
            "INSERT INTO rs_script (script_version, table_name, event, script) VALUES ($1, $2, $3, $4)
             ON CONFLICT (script_version, table_name, event) DO UPDATE SET script = excluded.script",
            &[&entry.script_version, &entry.table, &entry.event, &entry.script],
        )
        .await?;
    Ok(())
}

pub async fn remove_script(
    client: &Client,
    script_version: &str,
    table: &str,
    event: &str,
) -> Result<bool, DbError> {
    let removed = client
        .execute(
            "DELETE FROM rs_script WHERE script_version = $1 AND table_name = $2 AND event = $3",
            &[&script_version, &table, &event],
        )
        .await?;
    Ok(removed > 0)
}

pub async fn add_script_version(
    client: &Client,
    name: &str,
    description: &str,
) -> Result<(), DbError> {
    if name.is_empty() {
        return Err(DbError::Invalid(
            "a script version name must not be empty".into(),
        ));
    }
    client
        .execute(
            "INSERT INTO rs_script_version (name, description, revision) VALUES ($1, $2, nextval('rs_script_revision'))
             ON CONFLICT (name) DO UPDATE SET description = excluded.description",
            &[&name, &description],
        )
        .await?;
    Ok(())
}

pub async fn script_versions(client: &Client) -> Result<Vec<(String, String)>, DbError> {
    Ok(client
        .query(
            "SELECT name, description FROM rs_script_version ORDER BY name",
            &[],
        )
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect())
}

/// Appends to the monitor's history and keeps its newest `rows_max` rows.
pub async fn append_sync_history(
    client: &mut tokio_postgres::Client,
    records: &[crate::HistoryRecord],
    rows_max: u64,
) -> Result<(), DbError> {
    let transaction = client.transaction().await?;
    let insert = transaction
        .prepare(
            "INSERT INTO rs_sync_history (ended_unix_ms, user_name, outcome, record) VALUES ($1, $2, $3, $4)",
        )
        .await?;
    for record in records {
        transaction
            .execute(
                &insert,
                &[
                    &record.ended_unix_ms,
                    &record.user,
                    &record.outcome,
                    &record.record,
                ],
            )
            .await?;
    }
    let newest: Option<i64> = transaction
        .query_one("SELECT max(id) FROM rs_sync_history", &[])
        .await?
        .get(0);
    if let Some(first_kept) = crate::history::first_kept(newest, rows_max) {
        transaction
            .execute("DELETE FROM rs_sync_history WHERE id < $1", &[&first_kept])
            .await?;
    }
    transaction.commit().await?;
    Ok(())
}

/// The newest `limit` rows of the monitor's history, oldest first.
pub async fn sync_history(
    client: &tokio_postgres::Client,
    limit: u64,
) -> Result<Vec<crate::HistoryRecord>, DbError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client
        .query(
            "SELECT ended_unix_ms, user_name, outcome, record FROM \
             (SELECT * FROM rs_sync_history ORDER BY id DESC LIMIT $1) AS newest ORDER BY id",
            &[&limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| crate::HistoryRecord {
            ended_unix_ms: row.get(0),
            user: row.get(1),
            outcome: row.get(2),
            record: row.get(3),
        })
        .collect())
}
