//! A table's scripts from its sync rule (`crate::rules`), in PostgreSQL's SQL: the
//! default scripts' statements with the rule's scope in place of the owner column.

use std::collections::BTreeMap;

use tokio_postgres::GenericClient;

use super::{comparable, deleted_table, holds_text, table_shape, XID_COLUMN};
use crate::names::{column_list, key_match};
use crate::rules::scope::{and, RuleSql, Scope};
use crate::rules::{kept_columns, RuleSet, TableRule};
use crate::scripts::*;
use crate::shape::TableShape;
use crate::{quote_identifier as q, DbError};

/// The column types of the tables a rule reaches, by (table, column).
#[derive(Default)]
pub(super) struct PgRuleSql {
    types: BTreeMap<(String, String), String>,
}

impl PgRuleSql {
    fn type_of(&self, table: &str, column: &str) -> &str {
        self.types
            .get(&(table.to_string(), column.to_string()))
            .map_or("text", String::as_str)
    }
}

impl RuleSql for PgRuleSql {
    fn group_text_as(&self, expr: &str, table: &str, column: &str) -> String {
        format!("CAST({expr} AS {})", self.type_of(table, column))
    }

    fn to_text(&self, expr: &str) -> String {
        format!("{expr}::text")
    }

    fn user_as(&self, table: &str, column: &str) -> String {
        let sql_type = self.type_of(table, column);
        if holds_text(sql_type) {
            ":user::text".into()
        } else {
            format!("CAST(:user::text AS {sql_type})")
        }
    }

    fn changed(&self, _table: &str, _keys: &[String], alias: &str) -> String {
        format!("{alias}.{} >= :last_download", q(XID_COLUMN))
    }
}

/// The keys and column types of `table` and every table up its parent chain.
pub(super) async fn rule_facts(
    client: &impl GenericClient,
    rules: &RuleSet,
    table: &str,
) -> Result<(BTreeMap<String, Vec<String>>, PgRuleSql), DbError> {
    let mut keys = BTreeMap::new();
    let mut sql = PgRuleSql::default();
    for current in rules.chain(table) {
        let (shape, types) = table_shape(client, None, current)
            .await?
            .ok_or_else(|| DbError::Invalid(format!("table {current:?} does not exist")))?;
        for (column, sql_type) in shape.columns.iter().zip(types) {
            sql.types
                .insert((current.to_string(), column.name.clone()), sql_type);
        }
        keys.insert(current.to_string(), shape.key_columns);
    }
    Ok((keys, sql))
}

/// The scripts of a table under a rule other than `owner` (`shape`: the columns the
/// rule synchronizes; `types`: theirs).
pub(super) fn rule_scripts(
    shape: &TableShape,
    types: &[String],
    scope: &Scope<'_>,
) -> Vec<(&'static str, String)> {
    let name = shape.name.as_str();
    let table = q(name);
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let columns = column_list(&all, "");
    let xid = q(XID_COLUMN);
    let visible = scope.visible(name, "t");
    let writable_new = scope.writable(name, "u");
    let writable_old = scope.writable(name, "t");
    let returning = column_list(keys, "t.");
    let mut scripts = vec![
        (
            UPLOAD_INSERT,
            format!(
                "INSERT INTO {table} ({columns}) SELECT {u_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE ({writable_new}) AND NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {tu}) \
                 RETURNING {plain_keys}",
                u_columns = column_list(&all, "u."),
                tu = key_match(keys, "t", "u"),
                plain_keys = column_list(keys, ""),
            ),
        ),
        (
            UPLOAD_INSERT_FAST,
            format!(
                "INSERT INTO {table} ({columns}) SELECT {u_columns} FROM {UPLOAD_PLACEHOLDER} AS u \
                 WHERE ({writable_new})",
                u_columns = column_list(&all, "u."),
            ),
        ),
        (UPLOAD_UPDATE, update_script(shape, types, scope)),
        (
            UPLOAD_DELETE,
            format!(
                "DELETE FROM {table} AS t USING {UPLOAD_PLACEHOLDER} AS u WHERE {tu} AND ({writable_old}) \
                 AND (t.{xid} < :last_download OR t.{xid} = :last_sync_xid) RETURNING {returning}",
                tu = key_match(keys, "t", "u"),
            ),
        ),
        (
            UPLOAD_FETCH,
            format!(
                "SELECT {t_columns} FROM {table} AS t JOIN {KEYS_PLACEHOLDER} AS k ON {tk} WHERE {visible}",
                t_columns = column_list(&all, "t."),
                tk = key_match(keys, "t", "k"),
                visible = and(std::slice::from_ref(&visible)),
            ),
        ),
        (DOWNLOAD_CURSOR, download_cursor(shape, scope)),
        (DOWNLOAD_DELETE_CURSOR, delete_cursor(shape, scope)),
    ];
    if let Some(groups) = scope.groups_query(name) {
        scripts.push((USER_GROUPS, groups));
    }
    scripts
}

/// An update of rows the user may write, before and after, whose old image is the row
/// as the table holds it.
fn update_script(shape: &TableShape, types: &[String], scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let all = shape.column_names();
    let keys = &shape.key_columns;
    let stamp = format!("{} = {}", q(XID_COLUMN), super::CURRENT_XID);
    let set_new = all
        .iter()
        .filter(|name| !keys.contains(name))
        .map(|name| format!("{c} = u.{c}", c = q(name)))
        .chain(std::iter::once(stamp))
        .collect::<Vec<_>>()
        .join(", ");
    let old_matches = all
        .iter()
        .zip(types)
        .map(|(name, sql_type)| {
            format!(
                "{} IS NOT DISTINCT FROM {}",
                comparable(&format!("t.{}", q(name)), sql_type),
                comparable(
                    &format!("u.{}", q(&format!("{OLD_IMAGE_PREFIX}{name}"))),
                    sql_type
                ),
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "UPDATE {} AS t SET {set_new} FROM {UPLOAD_PLACEHOLDER} AS u WHERE {tu} \
         AND {guard} AND {old_matches} RETURNING {returning}",
        q(name),
        tu = key_match(keys, "t", "u"),
        guard = and(&[
            Some(scope.writable(name, "t")),
            Some(scope.writable(name, "u"))
        ]),
        returning = column_list(keys, "t."),
    )
}

fn download_cursor(shape: &TableShape, scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let xid = q(XID_COLUMN);
    let changed =
        format!("t.{xid} >= :last_download AND t.{xid} <> :last_sync_xid AND t.{xid} <> :echo_xid");
    let window = match scope.brought_in(name, "t") {
        Some(brought_in) => format!("(({changed}) OR {brought_in})"),
        None => format!("({changed})"),
    };
    format!(
        "SELECT {} FROM {} AS t WHERE {}",
        column_list(shape.column_names(), "t."),
        q(name),
        and(&[scope.visible(name, "t"), Some(window)])
    )
}

/// Tombstones of keys the client no longer sees, then rows still in the table that
/// left what the client sees (a group it left, a parent that moved away).
fn delete_cursor(shape: &TableShape, scope: &Scope<'_>) -> String {
    let name = shape.name.as_str();
    let keys = &shape.key_columns;
    let tombstones = format!(
        "SELECT {k_keys} FROM {batches} AS d CROSS JOIN LATERAL (SELECT {u_keys} \
         FROM unnest({d_keys}) AS u({key_list}) WHERE NOT EXISTS (SELECT 1 FROM {table} AS t \
         WHERE {tu} AND {visible}) OFFSET 0) AS k \
         WHERE {which} AND d.xid >= :last_download AND d.xid <> :last_sync_xid AND d.xid <> :echo_xid",
        k_keys = column_list(keys, "k."),
        u_keys = column_list(keys, "u."),
        d_keys = column_list(keys, "d."),
        key_list = column_list(keys, ""),
        batches = q(&deleted_table(name)),
        table = q(name),
        tu = key_match(keys, "t", "u"),
        visible = and(&[scope.visible(name, "t")]),
        which = and(&[scope.tombstones(name, "d.rs_partition")]),
    );
    scope.with_rows_gone_out(name, tombstones)
}

/// A rule's columns of the table, as a shape, and their types.
pub(super) fn rule_shape(
    shape: &TableShape,
    types: &[String],
    rule: &TableRule,
) -> Result<(TableShape, Vec<String>), DbError> {
    let kept = kept_columns(&shape.name, &shape.column_names(), &shape.key_columns, rule)
        .map_err(|e| DbError::Invalid(e.to_string()))?;
    Ok((
        TableShape {
            name: shape.name.clone(),
            columns: kept.iter().map(|&i| shape.columns[i].clone()).collect(),
            key_columns: shape.key_columns.clone(),
        },
        kept.iter().map(|&i| types[i].clone()).collect(),
    ))
}
