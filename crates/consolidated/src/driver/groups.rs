//! Which groups each client has (sync rules, `rules::scope`): before the watermark is
//! taken, each group-rule table's `user_groups` script says the user's groups now, and
//! the client's row of each group in `rs_client_group` is added, marked removed, or put
//! back, stamped with this sync's watermark once it is known ([`stamp`]), and with the
//! watermark of the client's download before this one. The download cursors read those
//! rows: a group added that may not have reached the client brings all its rows, one
//! removed takes them away (`rules::scope::not_yet_delivered`), so a download never
//! applied loses nothing.
//!
//! A client names the download it applied by its watermark only. A change stamped with
//! a later watermark than the client's has not reached it; one stamped with the same
//! has, unless the download before the change had that watermark too (the client may
//! have applied that one). Watermarks that rise at every sync keep the second case
//! rare: MariaDB's stamper raises them; SQLite raises its clock when a client's groups
//! change ([`Dialect::advance_watermark`]); PostgreSQL's repeat only while a transaction
//! older than the client's last download runs (a group is then sent again).

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
            format!("SELECT group_value, removed_at, removed_after FROM rs_client_group WHERE {this}"),
        ),
        (
            ADD,
            "INSERT INTO rs_client_group (client_id, table_name, group_value, added_at, added_after) \
             VALUES (:client_id, :group_table, :group_value, :group_watermark, :previous_download)"
                .to_string(),
        ),
        (
            PUT_BACK,
            format!("UPDATE rs_client_group SET added_at = :group_watermark, added_after = :previous_download, \
                     removed_at = NULL, removed_after = NULL WHERE {this} AND group_value = :group_value"),
        ),
        (
            REMOVE,
            format!("UPDATE rs_client_group SET removed_at = :group_watermark, removed_after = :previous_download \
                     WHERE {this} AND group_value = :group_value"),
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

/// A group as `rs_client_group` holds it: when it was removed, and the watermark of
/// the client's download before that.
struct Held {
    removed: Option<(i64, i64)>,
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
            Some(Held { removed: Some(_) }) => changes.push((group.clone(), Change::PutBack)),
            Some(_) => {}
        }
    }
    for (group, held) in held {
        if now.contains(group) {
            continue;
        }
        match held.removed {
            None => changes.push((group.clone(), Change::Remove)),
            // Its removal reached the client (`rules::scope::not_yet_delivered`).
            Some((at, after)) if at < last_download || (at == last_download && after < at) => {
                changes.push((group.clone(), Change::Forget))
            }
            Some(_) => {}
        }
    }
    changes
}

/// Brings every group-rule table's `rs_client_group` rows of this client up to date;
/// returns the tables whose groups changed (their changes are stamped by [`stamp`]).
/// `previous_download`: the watermark of the download the server sent the client
/// last (0 for none).
pub async fn record<'s, D: Dialect>(
    transaction: &mut D,
    scripts: &'s Scripts,
    parameters: &Parameters<'_>,
    previous_download: i64,
) -> Result<Vec<&'s str>, SyncError> {
    let mut changed = Vec::new();
    for table in scripts.tables_with(&[USER_GROUPS]) {
        let now = user_groups(transaction, scripts, table, parameters).await?;
        let statements = statements(&scripts.version, table);
        let this = table_parameters(parameters, table, THIS_SYNC)
            .with(vec![("previous_download", Value::Int(previous_download))]);
        let (_, rows) = transaction
            .run_table_query(&statements, table, READ, &this)
            .await?
            .unwrap_or_default();
        let held = rows
            .into_iter()
            .filter_map(|row| {
                let group = group_text(row.first()?)?;
                let removed = match (row.get(1), row.get(2)) {
                    (Some(Value::Int(at)), Some(Value::Int(after))) => Some((*at, *after)),
                    _ => None,
                };
                Some((group, Held { removed }))
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

    fn held(entries: &[(&str, Option<(i64, i64)>)]) -> BTreeMap<String, Held> {
        entries
            .iter()
            .map(|(group, removed)| (group.to_string(), Held { removed: *removed }))
            .collect()
    }

    fn now(groups: &[&str]) -> BTreeSet<String> {
        groups.iter().map(|g| g.to_string()).collect()
    }

    #[test]
    fn groups_are_added_removed_put_back_and_forgotten() {
        let held = held(&[
            ("1", None),
            ("2", Some((50, 40))),
            ("3", Some((100, 90))),
            ("4", None),
        ]);
        let changes = changes(&now(&["1", "2", "5"]), &held, 100);
        assert_eq!(
            changes,
            vec![
                ("2".to_string(), Change::PutBack),
                ("5".to_string(), Change::Add),
                // Removed by the download the client applied: done.
                ("3".to_string(), Change::Forget),
                ("4".to_string(), Change::Remove),
            ]
        );
    }

    #[test]
    fn a_removal_whose_watermark_the_download_before_had_too_is_kept() {
        let held = held(&[("3", Some((100, 100)))]);
        assert_eq!(changes(&now(&[]), &held, 100), vec![]);
        assert_eq!(
            changes(&now(&[]), &held, 101),
            vec![("3".to_string(), Change::Forget)]
        );
    }
}
