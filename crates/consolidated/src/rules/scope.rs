//! The predicates a rule puts into a table's scripts: which rows a user's client sees
//! now, which it must receive whatever their change time (a group it joined, a parent
//! that moved in), and which it may hold but no longer sees (a group it left).
//!
//! The groups a client has are kept per client in `rs_client_group` (see
//! `driver::groups`): `added_at` is the watermark of the download that first brought
//! the group, `added_after` that of the client's download before it (`removed_at` and
//! `removed_after` likewise). A change reached the client when the client comes back
//! with a later watermark, or with the same one where no earlier download had it
//! ([`not_yet_delivered`]); else it is sent again, so a download the client never
//! applied loses nothing.

use std::collections::BTreeMap;

use super::{GroupSource, Rule, RuleError, RuleSet};
use crate::names::{column_list, quote_identifier as q};

/// The table that records which groups each client has, per group-rule table.
pub const CLIENT_GROUP_TABLE: &str = "rs_client_group";

/// What a backend's SQL needs that differs between databases.
pub trait RuleSql {
    /// `expr`, a text (`rs_client_group.group_value`), as a value of `table.column`.
    fn group_text_as(&self, expr: &str, table: &str, column: &str) -> String;
    /// `expr` as text, as the tracking triggers write a partition value.
    fn to_text(&self, expr: &str) -> String;
    /// `:user` as a value of `table.column`.
    fn user_as(&self, table: &str, column: &str) -> String;
    /// Whether the row `alias` of `table` (key columns `keys`) changed since the
    /// client's last download, by any writer.
    fn changed(&self, table: &str, keys: &[String], alias: &str) -> String;
}

/// Whether the group change of `rs_client_group` row `g` (`what`: `added` or `removed`)
/// may not have reached the client, which comes back with `:last_download`: its
/// watermark is later, or the same while the client's download before the change had
/// that watermark too (the client may have applied either; see `driver::groups`).
pub fn not_yet_delivered(what: &str) -> String {
    format!(
        "(g.{what}_at > :last_download OR (g.{what}_at = :last_download AND g.{what}_after >= g.{what}_at))"
    )
}

/// A text as an SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The predicates of one rule set, over a backend's SQL.
pub struct Scope<'a> {
    pub rules: &'a RuleSet,
    /// The primary key columns of every table with a rule.
    pub keys: &'a BTreeMap<String, Vec<String>>,
    pub sql: &'a dyn RuleSql,
}

impl Scope<'_> {
    fn rule(&self, table: &str) -> &Rule {
        &self.rules.tables[table].rule
    }

    fn keys_of(&self, table: &str) -> &[String] {
        self.keys.get(table).map_or(&[], Vec::as_slice)
    }

    /// The child's columns that hold the parent's key.
    pub fn via<'b>(&'b self, table: &'b str) -> &'b [String] {
        match self.rule(table) {
            Rule::Parent { parent, via } if via.is_empty() => self.keys_of(parent),
            Rule::Parent { via, .. } => via,
            _ => &[],
        }
    }

    /// The column the tracking triggers partition tombstones by.
    pub fn tracking_column(&self, table: &str) -> Result<String, RuleError> {
        match self.rule(table) {
            Rule::Owner { column } | Rule::Group { column, .. } => Ok(column.clone()),
            _ => self.keys_of(table).first().cloned().ok_or_else(|| {
                super::table_error(table, "has no primary key; rowsync identifies rows by it")
            }),
        }
    }

    /// The script returning the user's groups (`user_groups`), for a group-rule table.
    pub fn groups_query(&self, table: &str) -> Option<String> {
        let Rule::Group { group, .. } = self.rule(table) else {
            return None;
        };
        Some(match &self.rules.groups[group] {
            GroupSource::Sql(sql) => sql.clone(),
            GroupSource::Table {
                table,
                user_column,
                group_column,
            } => format!(
                "SELECT {} FROM {} AS m WHERE {} = :user AND m.{} IS NOT NULL",
                self.sql.to_text(&format!("m.{}", q(group_column))),
                q(table),
                self.sql.to_text(&format!("m.{}", q(user_column))),
                q(group_column),
            ),
        })
    }

    /// `rs_client_group` rows of this client for `table` matching `condition`.
    fn client_groups(&self, table: &str, value: &str, condition: &str) -> String {
        format!(
            "SELECT {value} FROM {CLIENT_GROUP_TABLE} AS g WHERE g.client_id = :client_id \
             AND g.table_name = {} AND {condition}",
            literal(table)
        )
    }

    fn group_values(&self, table: &str, column: &str, condition: &str) -> String {
        let value = self.sql.group_text_as("g.group_value", table, column);
        self.client_groups(table, &value, condition)
    }

    /// The parent row of `alias` (a row of `table`), as `alias`'s parent alias sees it.
    fn parent_join(&self, table: &str, alias: &str, parent_alias: &str) -> String {
        self.keys_of(self.parent_of(table))
            .iter()
            .zip(self.via(table))
            .map(|(key, via)| format!("{parent_alias}.{} = {alias}.{}", q(key), q(via)))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    fn parent_of<'b>(&'b self, table: &'b str) -> &'b str {
        match self.rule(table) {
            Rule::Parent { parent, .. } => parent,
            _ => table,
        }
    }

    /// `EXISTS (the parent row of alias, and `inner` of it)`.
    fn through_parent(
        &self,
        table: &str,
        alias: &str,
        inner: impl Fn(&str, &str) -> Option<String>,
    ) -> String {
        let parent = self.parent_of(table);
        let parent_alias = format!("{alias}p");
        let mut condition = self.parent_join(table, alias, &parent_alias);
        if let Some(more) = inner(parent, &parent_alias) {
            condition = format!("{condition} AND ({more})");
        }
        format!(
            "EXISTS (SELECT 1 FROM {} AS {parent_alias} WHERE {condition})",
            q(parent)
        )
    }

    /// The rows of `table` (as `alias`) the user sees now; `None`: every row.
    pub fn visible(&self, table: &str, alias: &str) -> Option<String> {
        match self.rule(table) {
            Rule::Owner { column } => Some(format!(
                "{alias}.{} = {}",
                q(column),
                self.sql.user_as(table, column)
            )),
            Rule::Shared { .. } => None,
            Rule::Group { column, .. } => Some(format!(
                "{alias}.{} IN ({})",
                q(column),
                self.group_values(table, column, "g.removed_at IS NULL")
            )),
            Rule::Parent { .. } => {
                Some(self.through_parent(table, alias, |parent, p| self.visible(parent, p)))
            }
        }
    }

    /// The rows (as `alias`: new images, or rows the table holds) the user may write now;
    /// `FALSE` for none.
    pub fn writable(&self, table: &str, alias: &str) -> String {
        match self.rule(table) {
            Rule::Shared { writers } if writers.is_empty() => "FALSE".into(),
            Rule::Shared { writers } => format!(
                ":user IN ({})",
                writers
                    .iter()
                    .map(|w| literal(w))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            // The membership now, not the groups the client had at its last sync (the
            // upload comes before they are brought up to date): a member removed since
            // writes nothing more.
            Rule::Group { column, group } => {
                format!("{alias}.{} IN ({})", q(column), self.live_groups(group))
            }
            Rule::Parent { .. } => {
                self.through_parent(table, alias, |parent, p| Some(self.writable(parent, p)))
            }
            Rule::Owner { .. } => self.visible(table, alias).unwrap_or_else(|| "TRUE".into()),
        }
    }

    /// The user's groups of a group source as its group column holds them.
    fn live_groups(&self, group: &str) -> String {
        match &self.rules.groups[group] {
            GroupSource::Sql(sql) => sql.clone(),
            GroupSource::Table {
                table,
                user_column,
                group_column,
            } => format!(
                "SELECT m.{} FROM {} AS m WHERE {} = :user",
                q(group_column),
                q(table),
                self.sql.to_text(&format!("m.{}", q(user_column))),
            ),
        }
    }

    /// Visible rows the client must receive whatever their change time: those of a
    /// group it joined, or below a parent that changed (moved in, perhaps).
    pub fn brought_in(&self, table: &str, alias: &str) -> Option<String> {
        match self.rule(table) {
            Rule::Owner { .. } | Rule::Shared { .. } => None,
            Rule::Group { column, .. } => {
                let since = not_yet_delivered("added");
                Some(format!(
                    "{alias}.{} IN ({})",
                    q(column),
                    self.group_values(table, column, &format!("g.removed_at IS NULL AND {since}"))
                ))
            }
            Rule::Parent { .. } => Some(self.through_parent(table, alias, |parent, p| {
                let changed = self.sql.changed(parent, self.keys_of(parent), p);
                Some(match self.brought_in(parent, p) {
                    Some(brought) => format!("{changed} OR {brought}"),
                    None => changed,
                })
            })),
        }
    }

    /// Rows the user no longer sees that its client may hold: of a group it left, or
    /// below a parent (or with a foreign key) that changed. `None`: such rows leave
    /// by tombstones only.
    pub fn gone_out(&self, table: &str, alias: &str) -> Option<String> {
        match self.rule(table) {
            Rule::Owner { .. } | Rule::Shared { .. } => None,
            Rule::Group { column, .. } => {
                let since = not_yet_delivered("removed");
                Some(format!(
                    "{alias}.{} IN ({})",
                    q(column),
                    self.group_values(
                        table,
                        column,
                        &format!("g.removed_at IS NOT NULL AND {since}")
                    )
                ))
            }
            Rule::Parent { .. } => {
                let own = self.sql.changed(table, self.keys_of(table), alias);
                let above = self.through_parent(table, alias, |parent, p| {
                    let changed = self.sql.changed(parent, self.keys_of(parent), p);
                    Some(match self.gone_out(parent, p) {
                        Some(gone) => format!("{changed} OR {gone}"),
                        None => changed,
                    })
                });
                Some(format!("{own} OR {above}"))
            }
        }
    }

    /// Which tombstones of `table` concern the client, by their partition text
    /// (`partition`): `None` for all.
    pub fn tombstones(&self, table: &str, partition: &str) -> Option<String> {
        match self.rule(table) {
            Rule::Owner { .. } => Some(format!("{partition} = :user")),
            Rule::Group { .. } => {
                let since = not_yet_delivered("removed");
                Some(format!(
                    "{partition} IN ({})",
                    self.client_groups(
                        table,
                        "g.group_value",
                        &format!("(g.removed_at IS NULL OR {since})")
                    )
                ))
            }
            Rule::Shared { .. } | Rule::Parent { .. } => None,
        }
    }

    /// A delete cursor: `tombstones` (the keys of deleted rows the client no longer
    /// sees), then the keys of rows still in the table that left what the client sees.
    pub fn with_rows_gone_out(&self, table: &str, tombstones: String) -> String {
        match (self.gone_out(table, "t"), self.visible(table, "t")) {
            (Some(gone_out), Some(visible)) => format!(
                "{tombstones} UNION ALL SELECT {} FROM {} AS t WHERE NOT ({visible}) AND ({gone_out})",
                self.key_list(table, "t"),
                q(table),
            ),
            _ => tombstones,
        }
    }

    /// The table's synchronized columns, in the table's order.
    pub fn columns(&self, table: &str, all: &[String]) -> Vec<String> {
        let rule = &self.rules.tables[table];
        all.iter().filter(|c| rule.includes(c)).cloned().collect()
    }

    /// `a."k1", a."k2"`.
    pub fn key_list(&self, table: &str, alias: &str) -> String {
        column_list(self.keys_of(table), &format!("{alias}."))
    }
}

/// `condition AND more`, where either may be absent.
pub fn and(conditions: &[Option<String>]) -> String {
    let present: Vec<&String> = conditions.iter().flatten().collect();
    if present.is_empty() {
        "TRUE".into()
    } else {
        present
            .iter()
            .map(|c| format!("({c})"))
            .collect::<Vec<_>>()
            .join(" AND ")
    }
}
