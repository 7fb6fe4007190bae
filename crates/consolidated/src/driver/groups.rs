//! Which groups each client has (sync rules, `rules::scope`): before the watermark is
//! taken, each group-rule table's `user_groups` script says the user's groups now, and
//! the client's row of each group in `rs_client_group` is added, marked removed, or put
//! back, stamped with this sync's watermark once it is known ([`stamp`]). The download
//! cursors read those rows: a group added at or after the client's last download
//! brings all its rows, one removed takes them away, so a download never applied loses
//! nothing. A row marked removed goes once the client has applied a later download.
//!
//! That needs each sync of a client to take a watermark above the one before whenever
//! its groups changed: PostgreSQL's cursors compare inclusively (a repeated watermark
//! only sends a group again); MariaDB's stamper raises the watermark at every sync;
//! SQLite raises its clock when told ([`Dialect::advance_watermark`]).

use std::collections::{BTreeMap, BTreeSet};

use rowsync_protocol::Value;

use crate::dialect::Dialect;
use crate::parameters::Parameters;
use crate::scripts::USER_GROUPS;
use crate::version_scripts::Scripts;
use crate::SyncError;

/// The most groups one user may belong to in one table's rule: a user in more is
/// refused (the groups are held in memory and written row by row).
pub const USER_GROUPS_MAX: usize = 10_000;

const READ: &str = "rs_groups_read";
const ADD: &str = "rs_groups_add";
const PUT_BACK: &str = "rs_groups_put_back";
const REMOVE: &str = "rs_groups_remove";
const FORGET: &str = "rs_groups_forget";
const STAMP_ADDED: &str = "rs_groups_stamp_added";
const STAMP_REMOVED: &str = "rs_groups_stamp_removed";

/// `added_at` or `removed_at` of a change made by this sync before its watermark is
/// known ([`stamp`] replaces it).
const THIS_SYNC: i64 = i64::MAX;

/// The statements, the same on every backend (named parameters, plain SQL).
fn statements(version: &str, table: &str) -> Scripts {
    let this = "client_id = :client_id AND table_name = :group_table";
    let scripts = [
        (
            READ,
            format!("SELECT group_value, added_at, removed_at FROM rs_client_group WHERE {this}"),
        ),
        (
            ADD,
            "INSERT INTO rs_client_group (client_id, table_name, group_value, added_at) \
             VALUES (:client_id, :group_table, :group_value, :group_watermark)"
                .to_string(),
        ),
        (
            PUT_BACK,
            format!("UPDATE rs_client_group SET added_at = :group_watermark, removed_at = NULL WHERE {this} AND group_value = :group_value"),
        ),
        (
            REMOVE,
            format!("UPDATE rs_client_group SET removed_at = :group_watermark WHERE {this} AND group_value = :group_value"),
        ),
        (
            FORGET,
            format!("DELETE FROM rs_client_group WHERE {this} AND group_value = :group_value"),
        ),
        (
            STAMP_ADDED,
            format!("UPDATE rs_client_group SET added_at = :group_watermark WHERE {this} AND added_at = :this_sync"),
        ),
        (
            STAMP_REMOVED,
            format!("UPDATE rs_client_group SET removed_at = :group_watermark WHERE {this} AND removed_at = :this_sync"),
        ),
    ];
    Scripts::new(
        version,
        scripts
            .into_iter()
            .map(|(event, sql)| ((table.to_string(), event.to_string()), sql)),
    )
}

/// A group as `rs_client_group` holds it.
struct Held {
    removed_at: Option<i64>,
}

/// What to do with one group of the client.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    Add,
    PutBack,
    Remove,
    Forget,
}

/// The changes that make the client's groups `now`, given what is `held` and the
/// client's last applied download.
fn changes(
    now: &BTreeSet<String>,
    held: &BTreeMap<String, Held>,
    last_download: i64,
) -> Vec<(String, Change)> {
    let mut changes = Vec::new();
    for group in now {
        match held.get(group) {
            None => changes.push((group.clone(), Change::Add)),
            Some(Held {
                removed_at: Some(_),
            }) => changes.push((group.clone(), Change::PutBack)),
            Some(_) => {}
        }
    }
    for (group, held) in held {
        if now.contains(group) {
            continue;
        }
        match held.removed_at {
            None => changes.push((group.clone(), Change::Remove)),
            // Its removal reached the client (a download after it was applied).
            Some(removed_at) if removed_at < last_download => {
                changes.push((group.clone(), Change::Forget))
            }
            Some(_) => {}
        }
    }
    changes
}

/// Brings every group-rule table's `rs_client_group` rows of this client up to date;
/// returns the tables whose groups changed (their changes are stamped by [`stamp`]).
pub async fn record<'s, D: Dialect>(
    transaction: &mut D,
    scripts: &'s Scripts,
    parameters: &Parameters<'_>,
) -> Result<Vec<&'s str>, SyncError> {
    let mut changed = Vec::new();
    for table in scripts.tables_with(&[USER_GROUPS]) {
        let now = user_groups(transaction, scripts, table, parameters).await?;
        let statements = statements(&scripts.version, table);
        let this = table_parameters(parameters, table, THIS_SYNC);
        let (_, rows) = transaction
            .run_table_query(&statements, table, READ, &this)
            .await?
            .unwrap_or_default();
        let held = rows
            .into_iter()
            .filter_map(|row| {
                let group = group_text(row.first()?)?;
                let removed_at = match row.get(2) {
                    Some(Value::Int(at)) => Some(*at),
                    _ => None,
                };
                Some((group, Held { removed_at }))
            })
            .collect();
        let changes = changes(&now, &held, parameters.last_download);
        if !changes.is_empty() {
            changed.push(table);
        }
        for (group, change) in changes {
            let event = match change {
                Change::Add => ADD,
                Change::PutBack => PUT_BACK,
                Change::Remove => REMOVE,
                Change::Forget => FORGET,
            };
            let one = this.with(vec![("group_value", Value::Text(group))]);
            transaction
                .run_table_query(&statements, table, event, &one)
                .await?;
        }
    }
    Ok(changed)
}

/// Gives the changes [`record`] made to `tables` this sync's `watermark`.
pub async fn stamp<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    parameters: &Parameters<'_>,
    tables: &[&str],
    watermark: i64,
) -> Result<(), SyncError> {
    for table in tables {
        let statements = statements(&scripts.version, table);
        let this = table_parameters(parameters, table, watermark)
            .with(vec![("this_sync", Value::Int(THIS_SYNC))]);
        for event in [STAMP_ADDED, STAMP_REMOVED] {
            transaction
                .run_table_query(&statements, table, event, &this)
                .await?;
        }
    }
    Ok(())
}

fn table_parameters<'p>(parameters: &Parameters<'p>, table: &str, at: i64) -> Parameters<'p> {
    parameters.with(vec![
        ("group_table", Value::Text(table.to_string())),
        ("group_watermark", Value::Int(at)),
    ])
}

/// The user's groups of a table now, as text (the form `rs_client_group` keeps).
async fn user_groups<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    table: &str,
    parameters: &Parameters<'_>,
) -> Result<BTreeSet<String>, SyncError> {
    let (_, rows) = transaction
        .run_table_query(scripts, table, USER_GROUPS, parameters)
        .await?
        .unwrap_or_default();
    if rows.len() > USER_GROUPS_MAX {
        return Err(SyncError::script(
            USER_GROUPS,
            table,
            format!(
                "user {:?} belongs to {} groups; at most {USER_GROUPS_MAX} are synchronized per table",
                parameters.user,
                rows.len()
            ),
        ));
    }
    let mut groups = BTreeSet::new();
    for value in rows.iter().filter_map(|row| row.first()) {
        match value {
            Value::Null => {}
            Value::Int(_) | Value::Text(_) => groups.extend(group_text(value)),
            other => {
                return Err(SyncError::script(
                    USER_GROUPS,
                    table,
                    format!(
                        "a group value must be an integer or a text; the script returned {other:?} (cast it to text in the query)"
                    ),
                ))
            }
        }
    }
    Ok(groups)
}

/// A group value as text: an integer as its digits, a text as it is.
fn group_text(value: &Value) -> Option<String> {
    match value {
        Value::Int(number) => Some(number.to_string()),
        Value::Text(text) => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(entries: &[(&str, Option<i64>)]) -> BTreeMap<String, Held> {
        entries
            .iter()
            .map(|(group, removed_at)| {
                (
                    group.to_string(),
                    Held {
                        removed_at: *removed_at,
                    },
                )
            })
            .collect()
    }

    fn now(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn groups_are_added_removed_put_back_and_forgotten() {
        let held = held(&[("1", None), ("2", Some(50)), ("3", Some(100)), ("4", None)]);
        let changes = changes(&now(&["1", "2", "5"]), &held, 100);
        assert_eq!(
            changes,
            vec![
                ("2".to_string(), Change::PutBack),
                ("5".to_string(), Change::Add),
                // Removed at the client's watermark: kept until a later download.
                ("4".to_string(), Change::Remove),
            ]
        );
        let forgotten = super::changes(&now(&[]), &held_removed(), 101);
        assert_eq!(forgotten, vec![("3".to_string(), Change::Forget)]);
    }

    fn held_removed() -> BTreeMap<String, Held> {
        held(&[("3", Some(100))])
    }
}
