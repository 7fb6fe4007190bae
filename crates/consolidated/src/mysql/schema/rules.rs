//! A table's scripts from its sync rule (`crate::rules`), in MySQL's and MariaDB's SQL:
//! the default scripts' statements with the rule's scope in place of the owner column.

use std::collections::BTreeMap;

use mysql_async::prelude::Queryable;

use super::super::names::{tombstone_table, ORIGIN_COLUMN, STAMP_COLUMN};
use super::{table_shape, ColumnInfo};
use crate::names::{column_list, key_match};
use crate::rules::scope::{and, RuleSql, Scope};
use crate::rules::{kept_columns, RuleSet, TableRule};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, DbError};

/// The types of the columns a rule reaches, by (table, column).
#[derive(Default)]
pub(super) struct MysqlRuleSql {
    data_types: BTreeMap<(String, String), String>,
}

impl RuleSql for MysqlRuleSql {
    fn group_text_as(&self, expr: &str, table: &str, column: &str) -> String {
        let data_type = self
            .data_types
            .get(&(table.to_string(), column.to_string()))
            .map_or("", String::as_str);
        if data_type.ends_with("int") {
            format!("CAST({expr} AS SIGNED)")
        } else {
            expr.to_string()
        }
    }

    fn to_text(&self, expr: &str) -> String {
        format!("CAST({expr} AS CHAR)")
    }

    fn user_as(&self, _table: &str, _column: &str) -> String {
        ":user".into()
    }

    fn changed(&self, _table: &str, _keys: &[String], alias: &str) -> String {
        format!(
            "({alias}.{stamp} >= :last_download OR {alias}.{stamp} IS NULL)",
            stamp = q(STAMP_COLUMN)
        )
    }
}

/// The keys and column types of `table` and every table up its parent chain.
pub(super) async fn rule_facts(
    connection: &mut impl Queryable,
    rules: &RuleSet,
    table: &str,
) -> Result<(BTreeMap<String, Vec<String>>, MysqlRuleSql), DbError> {
    let mut keys = BTreeMap::new();
    let mut sql = MysqlRuleSql::default();
    for current in rules.chain(table) {
        let (shape, infos) = table_shape(connection, current)
            .await?
            .ok_or_else(|| DbError::Invalid(format!("table {current:?} does not exist")))?;
        for info in infos {
            sql.data_types
                .insert((current.to_string(), info.name), info.data_type);
        }
        keys.insert(current.to_string(), shape.key_columns);
    }
    Ok((keys, sql))
}

/// A rule's columns of the table, as a shape, with their infos.
pub(super) fn rule_shape(
    shape: &TableShape,
    infos: &[ColumnInfo],
    rule: &TableRule,
) -> Result<(TableShape, Vec<ColumnInfo>), DbError> {
    let kept = kept_columns(&shape.name, &shape.column_names(), &shape.key_columns, rule)?;
    let kept_infos = kept
        .iter()
        .filter_map(|&i| {
            infos
                .iter()
                .find(|info| info.name == shape.columns[i].name)
                .cloned()
        })
        .collect();
    Ok((
        TableShape {
            name: shape.name.clone(),
            columns: kept.iter().map(|&i| shape.columns[i].clone()).collect(),
            key_columns: shape.key_columns.clone(),
        },
        kept_infos,
    ))
}

/// Rows written by anyone but this client's previous sync, since its last download.
fn changed_not_own(alias: &str) -> String {
    format!(
        "({alias}.{stamp} >= :last_download OR {alias}.{stamp} IS NULL) AND ({alias}.{origin} = 0 OR {alias}.{origin} <> :last_sync_xid)",
        stamp = q(STAMP_COLUMN),
        origin = q(ORIGIN_COLUMN)
    )
}

/// The scripts of a table under a rule other than `owner` (`shape`: the columns the
/// rule synchronizes). `{upload}` and `{keys}` are named once per statement.
pub(super) fn rule_scripts(shape: &TableShape, scope: &Scope<'_>) -> Vec<(&'static str, String)> {
    let name = shape.name.as_str();
    let table = q(name);
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let tu = key_match(keys, "t", "u");
    let writable_new = scope.writable(name, "u");
    let writable_old = scope.writable(name, "t");
    let changed = changed_not_own("t");
    let mut scripts = vec![
        (
            UPLOAD_INSERT,
            format!(
                "INSERT INTO {table} ({columns}) SELECT {u_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE ({writable_new}) AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {tu})",
                columns = column_list(&all, ""),
                u_columns = column_list(&all, "u."),
            ),
        ),
        (UPLOAD_UPDATE, update_script(shape, scope)),
        (
            UPLOAD_DELETE,
            format!(
                "DELETE t FROM {table} AS t JOIN {UPLOAD_PLACEHOLDER} AS u ON {tu} WHERE ({writable_old}) \
                 AND NOT (COALESCE(t.{stamp}, -1) >= :last_download AND (t.{origin} = 0 OR t.{origin} <> :last_sync_xid))",
                stamp = q(STAMP_COLUMN),
                origin = q(ORIGIN_COLUMN),
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
                "SELECT {t_columns} FROM {table} AS t WHERE {condition}",
                t_columns = column_list(&all, "t."),
                condition = and(&[
                    scope.visible(name, "t"),
                    Some(match scope.brought_in(name, "t") {
                        Some(brought) => format!("({changed}) OR {brought}"),
                        None => changed.clone(),
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
/// as the table holds it. `{upload}` is named once.
fn update_script(shape: &TableShape, scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let non_keys: Vec<&String> = all.iter().filter(|c| !keys.contains(c)).collect();
    let set_new = if non_keys.is_empty() {
        format!("t.{k} = u.{k}", k = q(&keys[0]))
    } else {
        non_keys
            .iter()
            .map(|c| format!("t.{c} = u.{c}", c = q(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let old_matches = all
        .iter()
        .map(|c| format!("t.{} <=> u.{}", q(c), q(&format!("{OLD_IMAGE_PREFIX}{c}"))))
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "UPDATE {} AS t JOIN {UPLOAD_PLACEHOLDER} AS u ON {tu} SET {set_new} \
         WHERE ({writable_old}) AND ({writable_new}) AND {old_matches}",
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
        "SELECT {d_keys} FROM {tombstones} AS d WHERE {which} \
         AND (d.stamp >= :last_download OR d.stamp IS NULL) AND (d.origin = 0 OR d.origin <> :last_sync_xid) \
         AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {td} AND {visible})",
        d_keys = column_list(keys, "d."),
        tombstones = q(&tombstone_table(name)),
        which = and(&[scope.tombstones(name, "d.rs_partition")]),
        table = q(name),
        td = key_match(keys, "t", "d"),
        visible = and(&[scope.visible(name, "t")]),
    );
    scope.with_rows_gone_out(name, tombstones)
}
