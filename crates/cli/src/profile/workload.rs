//! What a profile runs: the version's scripts, its tables, and the users and clients
//! whose parameters the copies take (from a recording, or from the data itself).

use std::collections::HashMap;
use std::path::Path;

use rowsync_consolidated::quote_identifier as q;
use rowsync_consolidated::ScriptEntry;
use rowsync_protocol::{Row, Value};
use tokio_postgres::Client;

use super::sampler::{literal, primary_key};
use super::ProfileError;

/// The change-tracking column `init` adds on PostgreSQL: never uploaded.
pub const TRACKING_COLUMN: &str = "rs_xid";

/// One synchronized table of the version.
#[derive(Debug, Clone)]
pub struct SyncTable {
    pub name: String,
    /// `None` for a table with scripts but no `init` (hand-written scripts only).
    pub partition_column: Option<String>,
    /// Uploadable columns (all but the tracking column), in table order.
    pub columns: Vec<String>,
    pub key_columns: Vec<String>,
}

/// Whose parameters a copy runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Participant {
    pub user: String,
    pub client_id: String,
    pub last_download: i64,
}

pub struct Workload {
    pub script_version: String,
    pub scripts: Vec<ScriptEntry>,
    pub tables: Vec<SyncTable>,
    pub participants: Vec<Participant>,
    pub source: String,
}

impl Workload {
    pub fn script(&self, table: &str, event: &str) -> Option<&str> {
        self.scripts
            .iter()
            .find(|entry| entry.table == table && entry.event == event)
            .map(|entry| entry.script.as_str())
    }

    /// Copy `index`'s participant: the first for identical parameters, each in turn
    /// for distinct ones.
    pub fn participant(&self, index: usize, distinct: bool) -> &Participant {
        let at = if distinct {
            index % self.participants.len()
        } else {
            0
        };
        &self.participants[at]
    }
}

pub async fn load(
    client: &Client,
    script_version: &str,
    recording: Option<&Path>,
    wanted: usize,
) -> Result<Workload, ProfileError> {
    let version = client
        .query_opt(
            "SELECT 1 FROM rs_script_version WHERE name = $1",
            &[&script_version],
        )
        .await?;
    if version.is_none() {
        return Err(ProfileError::Input(format!(
            "script version {script_version:?} does not exist"
        )));
    }
    let scripts: Vec<ScriptEntry> = client
        .query(
            "SELECT table_name, event, script FROM rs_script WHERE script_version = $1 ORDER BY table_name, event",
            &[&script_version],
        )
        .await?
        .iter()
        .map(|row| ScriptEntry {
            script_version: script_version.to_string(),
            table: row.get(0),
            event: row.get(1),
            script: row.get(2),
        })
        .collect();
    let mut tables = Vec::new();
    let mut names: Vec<&str> = scripts
        .iter()
        .map(|entry| entry.table.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    names.dedup();
    for name in names {
        tables.push(sync_table(client, name).await?);
    }
    let (participants, source) = match recording {
        Some(dir) => (
            from_recording(dir, script_version)?,
            format!("recording {}", dir.display()),
        ),
        None => from_data(client, script_version, &tables, wanted).await?,
    };
    if participants.is_empty() {
        return Err(ProfileError::Input(format!(
            "no users to run as: no client synced version {script_version:?} and its tables hold no rows; give --record DIR"
        )));
    }
    Ok(Workload {
        script_version: script_version.to_string(),
        scripts,
        tables,
        participants,
        source,
    })
}

async fn sync_table(client: &Client, name: &str) -> Result<SyncTable, ProfileError> {
    let partition_column = client
        .query_opt(
            "SELECT partition_column FROM rs_table WHERE table_name = $1",
            &[&name],
        )
        .await?
        .map(|row| row.get(0));
    let relation = q(name);
    let columns = client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnum > 0 \
             AND NOT attisdropped ORDER BY attnum",
            &[&relation],
        )
        .await?
        .iter()
        .map(|row| row.get::<_, String>(0))
        .filter(|column| column != TRACKING_COLUMN)
        .collect();
    Ok(SyncTable {
        name: name.to_string(),
        partition_column,
        columns,
        key_columns: primary_key(client, &relation).await?,
    })
}

/// The recording's clients of this version, most syncs first, each with the newest
/// watermark it brought.
fn from_recording(dir: &Path, script_version: &str) -> Result<Vec<Participant>, ProfileError> {
    let syncs = rowsync_server::record::read_recording(dir)
        .map_err(|error| ProfileError::Input(error.to_string()))?;
    let mut seen: HashMap<(String, String), (usize, i64)> = HashMap::new();
    for sync in syncs
        .iter()
        .filter(|sync| sync.hello.script_version == script_version)
    {
        let entry = seen
            .entry((sync.hello.user.clone(), sync.hello.client_id.clone()))
            .or_insert((0, 0));
        entry.0 += 1;
        entry.1 = entry.1.max(sync.hello.last_download_watermark);
    }
    let mut ranked: Vec<_> = seen.into_iter().collect();
    ranked.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    Ok(ranked
        .into_iter()
        .map(|((user, client_id), (_, last_download))| Participant {
            user,
            client_id,
            last_download,
        })
        .collect())
}

/// Subscribed clients of the version (latest syncs first), then the largest
/// partitions of its first partitioned table, up to `wanted` users.
async fn from_data(
    client: &Client,
    script_version: &str,
    tables: &[SyncTable],
    wanted: usize,
) -> Result<(Vec<Participant>, String), ProfileError> {
    let limit = wanted as i64;
    let mut participants: Vec<Participant> = client
        .query(
            "SELECT DISTINCT ON (user_name) user_name, client_id, download_watermark FROM rs_subscription \
             WHERE script_version = $1 AND client_id NOT LIKE 'rowsync-profile-%' \
             ORDER BY user_name, last_sync_at DESC NULLS LAST LIMIT $2",
            &[&script_version, &limit],
        )
        .await?
        .iter()
        .map(|row| Participant { user: row.get(0), client_id: row.get(1), last_download: row.get(2) })
        .collect();
    let subscribed = participants.len();
    if let Some(table) = tables.iter().find(|table| table.partition_column.is_some()) {
        let partition = q(table.partition_column.as_deref().unwrap_or_default());
        let sql = format!(
            "SELECT {partition}::text FROM {} WHERE {partition} IS NOT NULL GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT $1",
            q(&table.name)
        );
        for row in client.query(&sql, &[&limit]).await? {
            let user: String = row.get(0);
            if participants.len() < wanted && !participants.iter().any(|known| known.user == user) {
                participants.push(Participant {
                    client_id: format!("rowsync-profile-{user}"),
                    user,
                    last_download: 0,
                });
            }
        }
    }
    let source = format!(
        "data: {subscribed} subscribed client(s), {} partition value(s)",
        participants.len() - subscribed
    );
    Ok((participants, source))
}

/// Up to `count` rows of `user`'s partition of `table`, skipping the first `skip`, in
/// key order (the columns of `SyncTable::columns`).
pub async fn partition_rows(
    client: &Client,
    table: &SyncTable,
    user: &str,
    skip: usize,
    count: usize,
) -> Result<Vec<Row>, ProfileError> {
    let Some(partition) = &table.partition_column else {
        return Ok(Vec::new());
    };
    let columns: Vec<String> = table.columns.iter().map(|column| q(column)).collect();
    let order = if table.key_columns.is_empty() {
        "1".to_string()
    } else {
        table
            .key_columns
            .iter()
            .map(|column| q(column))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let sql = format!(
        "SELECT {} FROM {} WHERE {}::text = {} ORDER BY {order} OFFSET {skip} LIMIT {count}",
        columns.join(", "),
        q(&table.name),
        q(partition),
        literal(user),
    );
    let rows = client.query(&sql, &[]).await?;
    rows.iter()
        .map(|row| {
            (0..row.len())
                .map(|index| {
                    row.try_get::<_, rowsync_consolidated::postgres::value::Read>(index)
                        .map(|read| read.0)
                })
                .collect::<Result<Vec<Value>, _>>()
                .map_err(ProfileError::from)
        })
        .collect()
}
