//! The plan advisor on SQLite, with what SQLite offers: `EXPLAIN QUERY PLAN` of each
//! download cursor and connection event (upload scripts need a scratch upload, which
//! only a sync makes). A `SCAN` of a table (no `USING` index) that filters a column no
//! index leads with is a full scan, with the `CREATE INDEX` that would serve it.

use std::path::Path;

use rowsync_consolidated::quote_identifier as q;
use rowsync_consolidated::{positional_parameters_with, scripts::*, Parameters};
use rowsync_protocol::Value;
use rusqlite::{params_from_iter, Connection, OpenFlags};

use super::plans::filter_columns;
use super::report::{PlanFinding, PlanReport};
use super::{ProfileError, PROFILED_EVENTS};

/// Explains the version's cursors and connection events in the SQLite file at `path`.
pub fn advise(path: &Path, script_version: &str) -> Result<Vec<PlanReport>, ProfileError> {
    let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let scripts: Vec<(String, String, String)> = connection
        .prepare("SELECT table_name, event, script FROM rs_script WHERE script_version = ?1 ORDER BY table_name, event")?
        .query_map([script_version], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<_, _>>()?;
    if scripts.is_empty() {
        return Err(ProfileError::Input(format!(
            "script version {script_version:?} has no scripts"
        )));
    }
    let user = representative_user(&connection, script_version)?;
    let mut reports = Vec::new();
    for (table, event, sql) in &scripts {
        let profiled = if table.is_empty() {
            PROFILED_EVENTS.contains(&event.as_str())
        } else {
            [DOWNLOAD_CURSOR, DOWNLOAD_DELETE_CURSOR].contains(&event.as_str())
        };
        if profiled {
            reports.push(explain(
                &connection,
                script_version,
                &user,
                table,
                event,
                sql,
            )?);
        }
    }
    Ok(reports)
}

/// A subscribed user of the version, else the first partition value of a table.
fn representative_user(
    connection: &Connection,
    script_version: &str,
) -> Result<String, ProfileError> {
    let subscribed: Option<String> = connection
        .query_row(
            "SELECT user_name FROM rs_subscription WHERE script_version = ?1 LIMIT 1",
            [script_version],
            |row| row.get(0),
        )
        .ok();
    if let Some(user) = subscribed {
        return Ok(user);
    }
    let partitioned: Option<(String, String)> = connection
        .query_row(
            "SELECT table_name, partition_column FROM rs_table LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .ok();
    Ok(partitioned
        .and_then(|(table, column)| {
            connection
                .query_row(
                    &format!(
                        "SELECT CAST({} AS TEXT) FROM {} LIMIT 1",
                        q(&column),
                        q(&table)
                    ),
                    [],
                    |row| row.get(0),
                )
                .ok()
        })
        .unwrap_or_default())
}

fn explain(
    connection: &Connection,
    script_version: &str,
    user: &str,
    table: &str,
    event: &str,
    sql: &str,
) -> Result<PlanReport, ProfileError> {
    let mut report = PlanReport {
        table: table.into(),
        event: event.into(),
        plan: Vec::new(),
        findings: Vec::new(),
        error: None,
    };
    let parameters = Parameters {
        user,
        client_id: "rowsync-profile",
        script_version,
        last_download: 0,
        table_watermarks: &[],
        upload_sequence: 1,
        last_sync_xid: 0,
        auth_parameters: &[],
        extra: vec![
            ("next_last_download", Value::Int(0)),
            ("watermark", Value::Int(0)),
        ],
    };
    let (positional, names) = positional_parameters_with(sql, '?');
    let values: Result<Vec<Value>, _> = names
        .iter()
        .map(|name| parameters.value(name, table, event))
        .collect();
    let values = match values {
        Ok(values) => values,
        Err(error) => {
            report.error = Some(error.to_string());
            return Ok(report);
        }
    };
    let rows: Result<Vec<String>, rusqlite::Error> = connection
        .prepare(&format!("EXPLAIN QUERY PLAN {positional}"))
        .and_then(|mut statement| {
            statement
                .query_map(params_from_iter(values.iter()), |row| {
                    row.get::<_, String>(3)
                })?
                .collect()
        });
    match rows {
        Ok(details) => {
            for detail in &details {
                report
                    .findings
                    .extend(scan_finding(connection, detail, sql)?);
            }
            report.plan = details;
        }
        Err(error) => report.error = Some(error.to_string()),
    }
    Ok(report)
}

/// The table a plan names: SQLite names an aliased table by its alias (`SCAN t`), which
/// the script's `FROM notes AS t` (or `JOIN notes t`) resolves.
fn table_of(connection: &Connection, scanned: &str, sql: &str) -> Result<String, ProfileError> {
    let tables: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    if tables.iter().any(|table| table == scanned) {
        return Ok(scanned.to_string());
    }
    let tokens = super::plans::tokens(sql);
    for (index, token) in tokens.iter().enumerate() {
        if !tables.contains(token) {
            continue;
        }
        let mut next = index + 1;
        if tokens
            .get(next)
            .is_some_and(|word| word.eq_ignore_ascii_case("as"))
        {
            next += 1;
        }
        if tokens.get(next).map(String::as_str) == Some(scanned) {
            return Ok(token.clone());
        }
    }
    Ok(scanned.to_string())
}

/// `SCAN notes` or `SCAN notes AS t` (not `... USING ... INDEX`): a finding when the
/// script compares a column of that table no index leads with.
fn scan_finding(
    connection: &Connection,
    detail: &str,
    sql: &str,
) -> Result<Option<PlanFinding>, ProfileError> {
    let Some(rest) = detail.strip_prefix("SCAN ") else {
        return Ok(None);
    };
    if rest.contains(" USING ") {
        return Ok(None);
    }
    let scanned = rest.split(' ').next().unwrap_or_default().trim_matches('"');
    let relation = table_of(connection, scanned, sql)?;
    let relation = relation.as_str();
    let columns: Vec<String> = connection
        .prepare(&format!(
            "SELECT name FROM pragma_table_info({})",
            super::sampler::literal(relation)
        ))?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let leading: Vec<String> = connection
        .prepare(&format!(
            "SELECT ii.name FROM pragma_index_list({0}) AS il, pragma_index_info(il.name) AS ii WHERE ii.seqno = 0",
            super::sampler::literal(relation)
        ))?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let filter = sql
        .to_lowercase()
        .find(" where ")
        .map_or("", |at| &sql[at + 7..]);
    let compared = filter_columns(filter, &columns);
    if compared.is_empty() || compared.iter().any(|column| leading.contains(column)) {
        return Ok(None);
    }
    Ok(Some(PlanFinding {
        kind: "full_scan".into(),
        detail: format!(
            "{detail}: reads all of {relation} to filter {}",
            compared.join(", ")
        ),
        proposal: Some(format!(
            "CREATE INDEX {} ON {} ({});",
            q(&format!("{relation}_{}", compared.join("_"))),
            q(relation),
            compared
                .iter()
                .map(|column| q(column))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }))
}
