//! A table's scripts from its sync rule (`crate::rules`), in SQLite's SQL: the
//! default scripts' statements with the rule's scope in place of the owner column.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::{row_version_table, table_shape, tombstone_table};
use crate::names::{column_list, key_match};
use crate::rules::scope::{and, RuleSql, Scope};
use crate::rules::{kept_columns, RuleSet, TableRule};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, DbError};

/// The declared types of the columns a rule reaches, by (table, column).
#[derive(Default)]
pub(super) struct SqliteRuleSql {
    declared: BTreeMap<(String, String), String>,
}

impl RuleSql for SqliteRuleSql {
    /// A text compared with an INTEGER column is made a number first (a text never
    /// equals a number in SQLite).
    fn group_text_as(&self, expr: &str, table: &str, column: &str) -> String {
        let declared = self
            .declared
            .get(&(table.to_string(), column.to_string()))
            .map(|t| t.to_uppercase())
            .unwrap_or_default();
        if declared.contains("INT") {
            format!("CAST({expr} AS INTEGER)")
        } else {
            expr.to_string()
        }
    }

    fn to_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS TEXT)")
    }

    fn user_as(&self, _table: &str, _column: &str) -> String {
        ":user".into()
    }

    fn changed(&self, table: &str, keys: &[String], alias: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {} AS v WHERE {} AND v.version > :last_download)",
            q(&row_version_table(table)),
            key_match(keys, "v", alias)
        )
    }
}

/// The keys and declared column types of `table` and every table up its parent chain.
pub(super) fn rule_facts(
    connection: &Connection,
    rules: &RuleSet,
    table: &str,
) -> Result<(BTreeMap<String, Vec<String>>, SqliteRuleSql), DbError> {
    let mut keys = BTreeMap::new();
    let mut sql = SqliteRuleSql::default();
    for current in rules.chain(table) {
        let shape = table_shape(connection, current)?
            .ok_or_else(|| DbError::Invalid(format!("table {current:?} does not exist")))?;
        let mut statement = connection.prepare("SELECT name, type FROM pragma_table_info(?1)")?;
        let declared = statement.query_map([current], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?;
        for column in declared {
            let (name, declared) = column?;
            sql.declared.insert((current.to_string(), name), declared);
        }
        keys.insert(current.to_string(), shape.key_columns);
    }
    Ok((keys, sql))
}

/// A rule's columns of the table, as a shape.
pub(super) fn rule_shape(shape: &TableShape, rule: &TableRule) -> Result<TableShape, DbError> {
    let kept = kept_columns(&shape.name, &shape.column_names(), &shape.key_columns, rule)?;
    Ok(TableShape {
        name: shape.name.clone(),
        columns: kept.iter().map(|&i| shape.columns[i].clone()).collect(),
        key_columns: shape.key_columns.clone(),
    })
}

/// The scripts of a table under a rule other than `owner` (`shape`: the columns the
/// rule synchronizes).
pub(super) fn rule_scripts(shape: &TableShape, scope: &Scope<'_>) -> Vec<(&'static str, String)> {
    let name = shape.name.as_str();
    let table = q(name);
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let columns = column_list(&all, "");
    let versions = q(&row_version_table(name));
    let writable_new = scope.writable(name, "u");
    let writable_old = scope.writable(name, "t");
    let mut scripts = vec![
        (
            UPLOAD_INSERT,
            format!(
                "INSERT INTO {table} ({columns}) SELECT {u_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE ({writable_new}) ON CONFLICT DO NOTHING",
                u_columns = column_list(&all, "u."),
            ),
        ),
        (UPLOAD_UPDATE, update_script(shape, scope)),
        (
            UPLOAD_DELETE,
            format!(
                "DELETE FROM {table} AS t WHERE ({t_keys}) IN (SELECT {key_columns} FROM {UPLOAD_PLACEHOLDER}) \
                 AND ({writable_old}) AND NOT EXISTS (SELECT 1 FROM {versions} AS v WHERE {vt} AND v.version > :last_download)",
                t_keys = column_list(keys, "t."),
                key_columns = column_list(keys, ""),
                vt = key_match(keys, "v", "t"),
            ),
        ),
        (
            UPLOAD_FETCH,
            format!(
                "SELECT {t_columns} FROM {table} AS t JOIN {KEYS_PLACEHOLDER} AS k ON {tk} WHERE {visible}",
                t_columns = column_list(&all, "t."),
                tk = key_match(keys, "t", "k"),
                visible = and(&[scope.visible(name, "t")]),
            ),
        ),
        (
            DOWNLOAD_CURSOR,
            format!(
                "SELECT {t_columns} FROM {table} AS t JOIN {versions} AS v ON {vt} WHERE {condition}",
                t_columns = column_list(&all, "t."),
                vt = key_match(keys, "v", "t"),
                condition = and(&[
                    scope.visible(name, "t"),
                    Some(match scope.brought_in(name, "t") {
                        Some(brought) => format!("v.version > :last_download OR {brought}"),
                        None => "v.version > :last_download".into(),
                    }),
                ]),
            ),
        ),
        (DOWNLOAD_DELETE_CURSOR, delete_cursor(shape, scope)),
    ];
    if let Some(groups) = scope.groups_query(name) {
        scripts.push((USER_GROUPS, groups));
    }
    scripts
}

/// An update of rows the user may write, before and after, whose old image is the row
/// as the table holds it.
fn update_script(shape: &TableShape, scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let non_keys: Vec<&String> = all.iter().filter(|c| !keys.contains(c)).collect();
    let set_new = if non_keys.is_empty() {
        format!("{k} = u.{k}", k = q(&keys[0]))
    } else {
        non_keys
            .iter()
            .map(|c| format!("{c} = u.{c}", c = q(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let old_matches = all
        .iter()
        .map(|c| format!("t.{} IS u.{}", q(c), q(&format!("{OLD_IMAGE_PREFIX}{c}"))))
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "UPDATE {} AS t SET {set_new} FROM {UPLOAD_PLACEHOLDER} AS u WHERE {tu} \
         AND ({writable_old}) AND ({writable_new}) AND {old_matches}",
        q(name),
        tu = key_match(keys, "t", "u"),
        writable_old = scope.writable(name, "t"),
        writable_new = scope.writable(name, "u"),
    )
}

/// Tombstones of keys the client no longer sees, then rows still in the table that
/// left what the client sees.
fn delete_cursor(shape: &TableShape, scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let keys = &shape.key_columns;
    let tombstones = format!(
        "SELECT {d_keys} FROM {tombstones} AS d WHERE d.version > :last_download AND {which} \
         AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {td} AND {visible})",
        d_keys = column_list(keys, "d."),
        tombstones = q(&tombstone_table(name)),
        which = and(&[scope.tombstones(name, "CAST(d.rs_partition AS TEXT)")]),
        table = q(name),
        td = key_match(keys, "t", "d"),
        visible = and(&[scope.visible(name, "t")]),
    );
    scope.with_rows_gone_out(name, tombstones)
}
