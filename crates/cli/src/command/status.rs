//! `rowsync status`: what a consolidated database synchronizes, for whom: the tables of
//! each script version with their rules, the clients of each version and when they last
//! synced, the users, held transfers, and (PostgreSQL) whether the event triggers that
//! follow partitions are installed. Reads only; `--json` for tools.

use anyhow::{bail, Result};
use rowsync_cli::database::{Database, DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::Value;
use serde::Serialize;

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// Print it as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Status {
    versions: Vec<VersionStatus>,
    users: Vec<UserStatus>,
    held_uploads: i64,
    held_downloads: i64,
    /// PostgreSQL: the event triggers that follow partitions; `None` elsewhere.
    event_triggers: Option<bool>,
}

#[derive(Serialize)]
struct VersionStatus {
    name: String,
    tables: Vec<TableStatus>,
    clients: i64,
    last_sync: Option<String>,
}

#[derive(Serialize)]
struct TableStatus {
    name: String,
    /// `owner`, `shared`, `group` or `parent`.
    rule: String,
    /// The column the table is partitioned by (the owner's for `owner`).
    partition_column: String,
}

#[derive(Serialize)]
struct UserStatus {
    name: String,
    disabled: bool,
}

struct Read {
    postgres: bool,
}

pub async fn run(args: StatusArgs) -> Result<()> {
    let database = args.database.database()?;
    let postgres = matches!(database, Database::Postgres(_));
    let status = database.run(Read { postgres }).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", describe(&status));
    }
    Ok(())
}

impl OnBackend for Read {
    type Output = Status;
    async fn run<B: Consolidated>(self, backend: B) -> Result<Status> {
        let mut connection = backend.connect().await?;
        let Ok(names) = connection
            .query_sql("SELECT name FROM rs_script_version ORDER BY name")
            .await
        else {
            bail!("rowsync is not set up in this database: run `rowsync init` (or `rowsync rules apply`) first");
        };
        let tables = rows(&mut connection,
            "SELECT s.script_version, s.table_name, COALESCE(r.rule, 'owner'), t.partition_column \
             FROM (SELECT DISTINCT script_version, table_name FROM rs_script WHERE table_name <> '') AS s \
             LEFT JOIN rs_table AS t ON t.table_name = s.table_name \
             LEFT JOIN rs_table_rule AS r ON r.table_name = s.table_name ORDER BY 1, 2").await?;
        let clients = rows(&mut connection,
            "SELECT script_version, count(*), max(last_sync_at) FROM rs_subscription GROUP BY script_version").await?;
        let versions = names
            .iter()
            .map(|row| text(&row[0]))
            .map(|name| version_status(name, &tables, &clients))
            .collect();
        let held = rows(
            &mut connection,
            "SELECT (SELECT count(*) FROM rs_held_upload), (SELECT count(*) FROM rs_held_download)",
        )
        .await?;
        let event_triggers = match self.postgres {
            true => Some(
                integer(
                    &rows(
                        &mut connection,
                        "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'rs%'",
                    )
                    .await?[0][0],
                ) > 0,
            ),
            false => None,
        };
        let users = connection
            .users()
            .await?
            .into_iter()
            .map(|user| UserStatus {
                name: user.name,
                disabled: user.disabled,
            })
            .collect();
        Ok(Status {
            versions,
            users,
            held_uploads: integer(&held[0][0]),
            held_downloads: integer(&held[0][1]),
            event_triggers,
        })
    }
}

async fn rows(connection: &mut impl ConsolidatedConnection, sql: &str) -> Result<Vec<Vec<Value>>> {
    Ok(connection.query_sql(sql).await?)
}

fn version_status(name: String, tables: &[Vec<Value>], clients: &[Vec<Value>]) -> VersionStatus {
    let of_version = |row: &&Vec<Value>| text(&row[0]) == name;
    let (count, last_sync) = clients
        .iter()
        .find(of_version)
        .map_or((0, None), |row| (integer(&row[1]), optional_time(&row[2])));
    VersionStatus {
        tables: tables
            .iter()
            .filter(of_version)
            .map(|row| TableStatus {
                name: text(&row[1]),
                rule: text(&row[2]),
                partition_column: text(&row[3]),
            })
            .collect(),
        name,
        clients: count,
        last_sync,
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Text(text) => text.clone(),
        Value::Null => String::new(),
        other => format!("{other:?}"),
    }
}

fn integer(value: &Value) -> i64 {
    match value {
        Value::Int(number) => *number,
        Value::Decimal(decimal) => decimal.to_string().parse().unwrap_or(0),
        _ => 0,
    }
}

/// A time as the database gave it: text as it is, a timestamp as UTC.
fn optional_time(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::Timestamp(micros) => Some(
            chrono::DateTime::from_timestamp_micros(*micros).map_or_else(
                || micros.to_string(),
                |at| at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            ),
        ),
        other => Some(text(other)),
    }
}

fn describe(status: &Status) -> String {
    let mut out = String::new();
    if status.versions.is_empty() {
        out.push_str("no script version: run `rowsync init` (or `rowsync rules apply`)\n");
    }
    for version in &status.versions {
        let last = version
            .last_sync
            .as_deref()
            .map_or(String::new(), |at| format!(", last sync {at}"));
        out.push_str(&format!(
            "script version {}: {} table(s), {} client(s){last}\n",
            version.name,
            version.tables.len(),
            version.clients
        ));
        for table in &version.tables {
            let how = match table.rule.as_str() {
                "owner" => format!("owner (rows whose {} is the user)", table.partition_column),
                rule => rule.to_string(),
            };
            out.push_str(&format!("  {}: {how}\n", table.name));
        }
    }
    let users: Vec<String> = status
        .users
        .iter()
        .map(|user| match user.disabled {
            true => format!("{} (disabled)", user.name),
            false => user.name.clone(),
        })
        .collect();
    out.push_str(&format!(
        "users: {}\n",
        match users.is_empty() {
            true => "none (`rowsync user add`)".to_string(),
            false => users.join(", "),
        }
    ));
    out.push_str(&format!(
        "held transfers: {} upload(s), {} download(s)\n",
        status.held_uploads, status.held_downloads
    ));
    if let Some(installed) = status.event_triggers {
        out.push_str(match installed {
            true => "event triggers: installed (partitions are followed)\n",
            false => "event triggers: not installed (run `rowsync init` once as a superuser for partitioned tables)\n",
        });
    }
    out
}
