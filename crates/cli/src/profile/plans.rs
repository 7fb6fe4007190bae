//! The plan advisor on PostgreSQL: each download cursor, upload script and connection
//! event explained with representative parameters (the first participant's, rows of
//! its partition put in scratch as the server puts an upload) inside a transaction rolled
//! back, so `ANALYZE` of a write changes nothing. Findings come from the plans' shapes
//! and the catalog, never from times: a scan that reads a whole table to filter it when
//! no index leads with a column the filter compares (the proposed `CREATE INDEX` would
//! serve it), a synchronized table without the (partition, rs_xid) index, estimates off
//! by more than `ESTIMATE_FACTOR_MAX` on a table scan.

use rowsync_consolidated::quote_identifier as q;
use rowsync_consolidated::{positional_parameters, scripts::*, RowImages};
use rowsync_protocol::Value;
use serde_json::Value as Json;
use tokio_postgres::types::{FromSql, ToSql, Type};
use tokio_postgres::Client;

use super::report::{PlanFinding, PlanReport};
use super::workload::{partition_rows, SyncTable, Workload, TRACKING_COLUMN};
use super::{parameters_for, ProfileError, PROFILED_EVENTS};

/// An estimate this many times above or below the rows a node returned is flagged.
pub const ESTIMATE_FACTOR_MAX: f64 = 10.0;
/// Nodes whose estimate and actual rows both stay below this are never flagged: a few
/// rows off says nothing about a plan.
pub const ESTIMATE_ROWS_MIN: f64 = 100.0;
/// Rows of the partition put in scratch as a representative upload.
pub const STAGED_ROWS: usize = 100;

const UPLOAD_STAGE: &str = "pg_temp.rs_profile_upload";
const KEYS_STAGE: &str = "pg_temp.rs_profile_keys";

/// Explains every script of the version that the advisor can stage and bind.
pub async fn advise(client: &Client, workload: &Workload) -> Result<Vec<PlanReport>, ProfileError> {
    let mut reports = Vec::new();
    for event in PROFILED_EVENTS {
        if let Some(sql) = workload.script("", event) {
            reports.push(explain(client, workload, None, event, sql).await?);
        }
    }
    for table in &workload.tables {
        let events = [
            DOWNLOAD_CURSOR,
            DOWNLOAD_DELETE_CURSOR,
            UPLOAD_INSERT,
            UPLOAD_UPDATE,
            UPLOAD_DELETE,
            UPLOAD_FETCH,
        ];
        for event in events {
            if let Some(sql) = workload.script(&table.name, event) {
                let mut report = explain(client, workload, Some(table), event, sql).await?;
                if event == DOWNLOAD_CURSOR {
                    report.findings.extend(tracking_index(client, table).await?);
                }
                reports.push(report);
            }
        }
    }
    Ok(reports)
}

async fn explain(
    client: &Client,
    workload: &Workload,
    table: Option<&SyncTable>,
    event: &str,
    sql: &str,
) -> Result<PlanReport, ProfileError> {
    let table_name = table.map_or("", |table| table.name.as_str());
    let mut report = PlanReport {
        table: table_name.to_string(),
        event: event.to_string(),
        plan: Vec::new(),
        findings: Vec::new(),
        error: None,
    };
    client.batch_execute("BEGIN").await?;
    let explained = explain_in_transaction(client, workload, table, event, sql).await;
    client.batch_execute("ROLLBACK").await?;
    match explained {
        Ok(Some(analyzed)) => {
            report.findings.extend(full_scans(client, &analyzed).await?);
            lines(&analyzed, 0, &mut report.plan);
            estimates(&analyzed, &mut report.findings);
        }
        Ok(None) => {
            report.error = Some("uses {conflicts}, which the advisor does not stage".into())
        }
        Err(error) => report.error = Some(error),
    }
    Ok(report)
}

/// The plan as run (ANALYZE).
async fn explain_in_transaction(
    client: &Client,
    workload: &Workload,
    table: Option<&SyncTable>,
    event: &str,
    sql: &str,
) -> Result<Option<Json>, String> {
    if sql.contains(CONFLICTS_PLACEHOLDER) {
        return Ok(None);
    }
    let participant = &workload.participants[0];
    let describe =
        |error: tokio_postgres::Error| rowsync_consolidated::postgres::describe_postgres(&error);
    let mut sql = sql.to_string();
    let mut row = None;
    if let Some(table) = table {
        sql = stage(client, table, event, &participant.user, &sql)
            .await
            .map_err(describe)?;
        row = partition_rows(client, table, &participant.user, 0, 1)
            .await
            .map_err(|error| error.to_string())?
            .pop();
    }
    let (positional, names) = positional_parameters(&sql);
    let parameters = parameters_for(workload, participant, event);
    let columns = table.map(|table| table.columns.clone()).unwrap_or_default();
    let images = RowImages {
        columns: &columns,
        new: row.as_deref(),
        old: row.as_deref(),
        current: None,
    };
    let values: Vec<Value> = names
        .iter()
        .map(|name| {
            parameters.value_for_row(name, Some(&images), table.map_or("", |t| &t.name), event)
        })
        .collect::<Result<_, _>>()
        .map_err(|error| error.to_string())?;
    let binds: Vec<_> = values
        .iter()
        .map(rowsync_consolidated::postgres::value::Bind)
        .collect();
    let parameters: Vec<&(dyn ToSql + Sync)> = binds
        .iter()
        .map(|bind| bind as &(dyn ToSql + Sync))
        .collect();
    let plan = |options: &'static str| {
        let text = format!("EXPLAIN ({options}, FORMAT JSON) {positional}");
        let parameters = &parameters;
        async move {
            let row = client
                .query_one(&text, parameters)
                .await
                .map_err(describe)?;
            let json: JsonText = row.try_get(0).map_err(describe)?;
            serde_json::from_str::<Json>(&json.0).map_err(|error| error.to_string())
        }
    };
    let analyzed = plan("ANALYZE, BUFFERS").await?;
    Ok(Some(root(analyzed)))
}

/// The top plan node of EXPLAIN's JSON (`[{"Plan": {...}}]`).
fn root(json: Json) -> Json {
    json.get(0)
        .and_then(|entry| entry.get("Plan"))
        .cloned()
        .unwrap_or(Json::Null)
}

/// Stages rows of the user's partition where the script names `{upload}` or `{keys}`,
/// shaped as the server stages them, and returns the script naming the stages.
async fn stage(
    client: &Client,
    table: &SyncTable,
    event: &str,
    user: &str,
    sql: &str,
) -> Result<String, tokio_postgres::Error> {
    let Some(partition) = &table.partition_column else {
        return Ok(sql.to_string());
    };
    let all: Vec<String> = table.columns.iter().map(|column| q(column)).collect();
    let keys: Vec<String> = table.key_columns.iter().map(|column| q(column)).collect();
    let olds: Vec<String> = table
        .columns
        .iter()
        .map(|column| {
            format!(
                "{} AS {}",
                q(column),
                q(&format!("{OLD_IMAGE_PREFIX}{column}"))
            )
        })
        .collect();
    let upload_columns = match event {
        UPLOAD_UPDATE => format!("{}, {}", all.join(", "), olds.join(", ")),
        UPLOAD_DELETE => keys.join(", "),
        _ => all.join(", "),
    };
    let from = format!(
        "FROM {} WHERE {}::text = {} LIMIT {STAGED_ROWS}",
        q(&table.name),
        q(partition),
        super::sampler::literal(user)
    );
    let mut scratch = sql.to_string();
    for (placeholder, name, columns) in [
        (UPLOAD_PLACEHOLDER, UPLOAD_STAGE, upload_columns),
        (KEYS_PLACEHOLDER, KEYS_STAGE, keys.join(", ")),
    ] {
        if scratch.contains(placeholder) {
            client
                .batch_execute(&format!(
                    "CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {columns} {from}; ANALYZE {name}",
                    name.trim_start_matches("pg_temp.")
                ))
                .await?;
            scratch = scratch.replace(placeholder, name);
        }
    }
    Ok(scratch)
}

/// Every node of a plan, depth first.
fn nodes(plan: &Json) -> Vec<&Json> {
    let mut all = vec![plan];
    if let Some(children) = plan.get("Plans").and_then(Json::as_array) {
        for child in children {
            all.extend(nodes(child));
        }
    }
    all
}

fn text<'j>(node: &'j Json, field: &str) -> &'j str {
    node.get(field).and_then(Json::as_str).unwrap_or("")
}

/// Scans that read a whole table to filter it (a sequential scan, or an index scan with
/// no index condition) where no index of the table leads with a column the filter
/// compares: an index would serve it. A whole scan the planner chose although such an
/// index exists (a small table) is its choice, not a finding; the scratch upload is the
/// advisor's own and never one.
async fn full_scans(client: &Client, plan: &Json) -> Result<Vec<PlanFinding>, ProfileError> {
    let mut findings = Vec::new();
    for node in nodes(plan) {
        let kind = text(node, "Node Type");
        let relation = text(node, "Relation Name");
        let filter = text(node, "Filter");
        let whole =
            kind == "Seq Scan" || (kind.starts_with("Index") && node.get("Index Cond").is_none());
        if !whole || filter.is_empty() || relation.is_empty() || relation.starts_with("rs_profile_")
        {
            continue;
        }
        let columns = table_columns(client, relation).await?;
        let compared = filter_columns(filter, &columns);
        let leading = leading_index_columns(client, relation).await?;
        if compared.is_empty() || compared.iter().any(|column| leading.contains(column)) {
            continue;
        }
        findings.push(PlanFinding {
            kind: "full_scan".into(),
            detail: format!(
                "{kind} reads all of {relation} to filter {filter}: no index leads with {}",
                compared.join(" or ")
            ),
            proposal: Some(format!(
                "CREATE INDEX ON {} ({});",
                q(relation),
                compared
                    .iter()
                    .map(|column| q(column))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        });
    }
    Ok(findings)
}

/// The first column of each of the table's indexes.
async fn leading_index_columns(
    client: &Client,
    relation: &str,
) -> Result<Vec<String>, ProfileError> {
    Ok(client
        .query(
            "SELECT a.attname::text FROM pg_index AS i JOIN pg_attribute AS a \
             ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = $1::text::regclass",
            &[&q(relation)],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

async fn table_columns(client: &Client, relation: &str) -> Result<Vec<String>, ProfileError> {
    Ok(client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped",
            &[&q(relation)],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// The table's columns a filter compares, those compared by equality first (an index
/// serves equality on its leading columns, then one range).
pub fn filter_columns(filter: &str, columns: &[String]) -> Vec<String> {
    let tokens = tokens(filter);
    let (mut equal, mut range) = (Vec::new(), Vec::new());
    for (index, token) in tokens.iter().enumerate() {
        if !columns.contains(token) {
            continue;
        }
        // Skip a closing parenthesis and casts (`(body)::text = ...`) to the operator.
        let mut next = index + 1;
        while let Some(skipped) = tokens.get(next) {
            if skipped == ")" {
                next += 1;
            } else if skipped == "::" {
                next += 2;
            } else {
                break;
            }
        }
        let list = match tokens.get(next).map(String::as_str) {
            Some("=") => &mut equal,
            Some(">=" | ">" | "<" | "<=") => &mut range,
            _ => continue,
        };
        if !list.contains(token) {
            list.push(token.clone());
        }
    }
    range.retain(|column| !equal.contains(column));
    equal.extend(range);
    equal
}

/// Identifiers (unquoted), operators and punctuation of an expression; literals skipped.
pub(super) fn tokens(expression: &str) -> Vec<String> {
    let chars: Vec<char> = expression.chars().collect();
    let mut tokens = Vec::new();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        let start = index;
        if c == '\'' || c == '"' {
            index += 1;
            while index < chars.len() && chars[index] != c {
                index += 1;
            }
            if c == '"' {
                tokens.push(chars[start + 1..index.min(chars.len())].iter().collect());
            } else {
                tokens.push("'".into());
            }
            index += 1;
        } else if c.is_alphanumeric() || c == '_' {
            while index < chars.len() && (chars[index].is_alphanumeric() || chars[index] == '_') {
                index += 1;
            }
            tokens.push(chars[start..index].iter().collect());
        } else if "<>=!:~".contains(c) {
            while index < chars.len() && "<>=!:~".contains(chars[index]) {
                index += 1;
            }
            tokens.push(chars[start..index].iter().collect());
        } else {
            index += 1;
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
    }
    tokens
}

/// Nodes whose row estimate is off by more than `ESTIMATE_FACTOR_MAX`.
fn estimates(analyzed: &Json, findings: &mut Vec<PlanFinding>) {
    for node in nodes(analyzed) {
        let number = |field| node.get(field).and_then(Json::as_f64);
        let (Some(estimated), Some(actual), Some(loops)) = (
            number("Plan Rows"),
            number("Actual Rows"),
            number("Actual Loops"),
        ) else {
            continue;
        };
        // Only a table's own estimate: ANALYZE can fix it. A join's estimate over many
        // correlated conditions (an update matching every old column) is always low
        // and says nothing the planner could use; the advisor's stage is its own.
        let relation = text(node, "Relation Name");
        if !text(node, "Node Type").ends_with("Scan")
            || relation.is_empty()
            || relation.starts_with("rs_profile_")
        {
            continue;
        }
        if loops == 0.0 || estimated.max(actual) < ESTIMATE_ROWS_MIN {
            continue;
        }
        let factor = estimated.max(actual) / estimated.min(actual).max(1.0);
        if factor > ESTIMATE_FACTOR_MAX {
            findings.push(PlanFinding {
                kind: "estimate_off".into(),
                detail: format!(
                    "{} {}: estimated {estimated} rows, returned {actual} ({factor:.0}x): ANALYZE the table, or its statistics miss a correlation",
                    text(node, "Node Type"),
                    text(node, "Relation Name")
                ),
                proposal: None,
            });
        }
    }
}

/// The (partition, rs_xid) index every default cursor's download reads by.
async fn tracking_index(
    client: &Client,
    table: &SyncTable,
) -> Result<Vec<PlanFinding>, ProfileError> {
    let Some(partition) = &table.partition_column else {
        return Ok(Vec::new());
    };
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $3), \
             EXISTS (SELECT 1 FROM pg_index AS i \
               JOIN pg_attribute AS p ON p.attrelid = i.indrelid AND p.attname = $2 \
               JOIN pg_attribute AS x ON x.attrelid = i.indrelid AND x.attname = $3 \
               WHERE i.indrelid = $1::text::regclass AND i.indkey[0] = p.attnum AND i.indkey[1] = x.attnum)",
            &[&q(&table.name), partition, &TRACKING_COLUMN],
        )
        .await?;
    let (tracked, indexed): (bool, bool) = (row.get(0), row.get(1));
    if !tracked || indexed {
        return Ok(Vec::new());
    }
    Ok(vec![PlanFinding {
        kind: "missing_tracking_index".into(),
        detail: format!(
            "{} has no index on its partition and change-tracking columns ({partition}, {TRACKING_COLUMN}): every download reads the whole partition",
            table.name
        ),
        proposal: Some(format!("CREATE INDEX ON {} ({}, {});", q(&table.name), q(partition), q(TRACKING_COLUMN))),
    }])
}

/// One line per node: what it does, on what, estimated and actual rows, time.
fn lines(node: &Json, depth: usize, out: &mut Vec<String>) {
    if node.is_null() {
        return;
    }
    let mut line = format!("{}{}", "  ".repeat(depth), text(node, "Node Type"));
    let relation = text(node, "Relation Name");
    if !relation.is_empty() {
        line.push_str(&format!(" on {relation}"));
    }
    let index = text(node, "Index Name");
    if !index.is_empty() {
        line.push_str(&format!(" using {index}"));
    }
    let number = |field| node.get(field).and_then(Json::as_f64).unwrap_or(0.0);
    line.push_str(&format!(
        " (rows est {} actual {}, {:.3} ms)",
        number("Plan Rows"),
        number("Actual Rows"),
        number("Actual Total Time")
    ));
    for field in ["Index Cond", "Filter"] {
        let condition = text(node, field);
        if !condition.is_empty() {
            line.push_str(&format!(" {field}: {condition}"));
        }
    }
    out.push(line);
    if let Some(children) = node.get("Plans").and_then(Json::as_array) {
        for child in children {
            lines(child, depth + 1, out);
        }
    }
}

/// EXPLAIN's `json` column as text.
struct JsonText(String);

impl<'a> FromSql<'a> for JsonText {
    fn from_sql(
        _: &Type,
        raw: &'a [u8],
    ) -> Result<JsonText, Box<dyn std::error::Error + Sync + Send>> {
        Ok(JsonText(std::str::from_utf8(raw)?.to_string()))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSON || *ty == Type::TEXT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_gives_its_equality_columns_first() {
        let columns: Vec<String> = ["id", "owner", "region", "rs_xid"]
            .map(String::from)
            .to_vec();
        let filter = "((rs_xid >= '0'::bigint) AND ((region)::text = 'north'::text) AND (rs_xid <> '5'::bigint))";
        assert_eq!(filter_columns(filter, &columns), ["region", "rs_xid"]);
        assert!(filter_columns("(body ~~ 'x%'::text)", &columns).is_empty());
    }
}
