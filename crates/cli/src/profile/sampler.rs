//! Samples what the profile's sessions wait on (`pg_stat_activity`) and which rows they
//! wait for (`pg_locks`: a session waiting for a row holds or waits for that row's
//! `tuple` lock, whose page and item are the row's `ctid`), from a connection of its own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rowsync_consolidated::quote_identifier;
use tokio::sync::{watch, Notify};
use tokio_postgres::Client;

use super::report::{HotRow, WaitCount};
use super::ProfileError;

/// Time between two samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(5);
/// The key of a row whose version was gone when the sampler read it (its writer had
/// committed: whole syncs keep no transaction open for the sampler).
pub const UNREAD_KEY: &str = "a row written again before its key was read";
/// The application name the profile's sessions carry, followed by the process id and
/// the run's number, so the sampler finds them and no other run's.
pub const APPLICATION_NAME_PREFIX: &str = "rowsync-profile";

const ACTIVITY: &str = "SELECT a.pid, COALESCE(a.wait_event_type, 'CPU'), COALESCE(a.wait_event, ''), \
     l.relation::regclass::text, l.page, l.tuple \
     FROM pg_stat_activity AS a \
     LEFT JOIN pg_locks AS l ON l.pid = a.pid AND l.locktype = 'tuple' AND a.wait_event_type = 'Lock' \
     WHERE a.application_name = $1 AND a.datname = current_database() AND a.state = 'active' \
       AND a.pid <> pg_backend_pid()";

/// What the samples saw since they were last taken.
#[derive(Debug, Default, Clone)]
pub struct Observations {
    pub waits: BTreeMap<String, u64>,
    pub hot_rows: BTreeMap<(String, String), u64>,
}

impl Observations {
    pub fn add(&mut self, other: &Observations) {
        for (wait, count) in &other.waits {
            *self.waits.entry(wait.clone()).or_default() += count;
        }
        for (row, count) in &other.hot_rows {
            *self.hot_rows.entry(row.clone()).or_default() += count;
        }
    }

    pub fn wait_counts(&self) -> Vec<WaitCount> {
        let mut waits: Vec<WaitCount> = self
            .waits
            .iter()
            .map(|(wait, samples)| WaitCount {
                wait: wait.clone(),
                samples: *samples,
            })
            .collect();
        waits.sort_by(|a, b| b.samples.cmp(&a.samples).then(a.wait.cmp(&b.wait)));
        waits
    }

    pub fn hot_row_list(&self) -> Vec<HotRow> {
        let mut rows: Vec<HotRow> = self
            .hot_rows
            .iter()
            .map(|((relation, key), waits)| HotRow {
                relation: relation.clone(),
                key: key.clone(),
                waits: *waits,
            })
            .collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.waits));
        rows
    }
}

/// Holds each copy's transaction open after its statement until every other copy has
/// finished its statement or been seen waiting on a lock, so a row two copies fight
/// over is seen whatever the timing (the verdict never depends on a sample's luck).
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Default)]
struct GateState {
    /// Backend pids of the copies whose statement ended.
    done: HashSet<i32>,
    /// Backend pids seen waiting on a lock.
    seen_waiting: HashSet<i32>,
}

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn statement_done(&self, pid: i32) {
        self.lock().done.insert(pid);
        self.changed.notify_waiters();
    }

    fn seen_waiting(&self, pid: i32) {
        if self.lock().seen_waiting.insert(pid) {
            self.changed.notify_waiters();
        }
    }

    /// Until each of `others` is done or was seen waiting, at most `wait_max`.
    pub async fn pass(&self, others: &[i32], wait_max: Duration) {
        let _ = tokio::time::timeout(wait_max, async {
            loop {
                let changed = self.changed.notified();
                {
                    let state = self.lock();
                    if others
                        .iter()
                        .all(|pid| state.done.contains(pid) || state.seen_waiting.contains(pid))
                    {
                        return;
                    }
                }
                // Woken by a change, or after a sample's time in case one was missed.
                let _ = tokio::time::timeout(SAMPLE_INTERVAL, changed).await;
            }
        })
        .await;
    }
}

/// The sampler task: samples until stopped; observations are taken per batch.
pub struct Sampler {
    shared: Arc<Mutex<SamplerState>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), ProfileError>>,
}

#[derive(Default)]
struct SamplerState {
    observations: Observations,
    gate: Option<Arc<Gate>>,
}

impl Sampler {
    /// Samples the sessions named `application_name` from `client`'s own session.
    pub fn start(client: Client, application_name: String) -> Sampler {
        let shared = Arc::new(Mutex::new(SamplerState::default()));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(sample_loop(
            client,
            application_name,
            Arc::clone(&shared),
            stopped,
        ));
        Sampler { shared, stop, task }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SamplerState> {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts a batch: forgets what was seen, and tells `gate` whom it sees waiting.
    pub fn begin(&self, gate: Option<Arc<Gate>>) {
        let mut state = self.state();
        state.observations = Observations::default();
        state.gate = gate;
    }

    /// What was seen since `begin`.
    pub fn take(&self) -> Observations {
        let mut state = self.state();
        state.gate = None;
        std::mem::take(&mut state.observations)
    }

    pub async fn stop(self) -> Result<(), ProfileError> {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(result) => result,
            Err(error) => Err(ProfileError::Task(error.to_string())),
        }
    }
}

async fn sample_loop(
    client: Client,
    application_name: String,
    shared: Arc<Mutex<SamplerState>>,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), ProfileError> {
    let statement = client.prepare(ACTIVITY).await?;
    let mut keys = RowKeys::default();
    while !*stopped.borrow() {
        let rows = client.query(&statement, &[&application_name]).await?;
        let mut sample = Observations::default();
        let mut waiting = Vec::new();
        let mut counted = HashSet::new();
        for row in &rows {
            let pid: i32 = row.get(0);
            let kind: String = row.get(1);
            let event: String = row.get(2);
            if counted.insert(pid) {
                let wait = if event.is_empty() {
                    kind.clone()
                } else {
                    format!("{kind}:{event}")
                };
                *sample.waits.entry(wait).or_default() += 1;
            }
            if kind == "Lock" {
                waiting.push(pid);
            }
            let relation: Option<String> = row.get(3);
            if let (Some(relation), Some(page), Some(tuple)) = (
                relation,
                row.get::<_, Option<i32>>(4),
                row.get::<_, Option<i16>>(5),
            ) {
                // A row that cannot be read (its table dropped meanwhile) is still a
                // row waited for.
                let key = keys
                    .key(&client, &relation, page, tuple)
                    .await
                    .unwrap_or_else(|_| UNREAD_KEY.to_string());
                *sample.hot_rows.entry((relation, key)).or_default() += 1;
            }
        }
        let gate = {
            let mut state = shared
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state.observations.add(&sample);
            state.gate.clone()
        };
        if let Some(gate) = gate {
            for pid in waiting {
                gate.seen_waiting(pid);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(SAMPLE_INTERVAL) => {}
            _ = stopped.changed() => {}
        }
    }
    Ok(())
}

/// Primary keys of rows by `ctid`, read while the writer still holds them (the version
/// a waiting session waits for is the one its `ctid` names until the writer commits).
#[derive(Default)]
struct RowKeys {
    key_columns: HashMap<String, Vec<String>>,
    keys: HashMap<(String, i32, i16), String>,
}

impl RowKeys {
    async fn key(
        &mut self,
        client: &Client,
        relation: &str,
        page: i32,
        tuple: i16,
    ) -> Result<String, ProfileError> {
        let id = (relation.to_string(), page, tuple);
        if let Some(key) = self.keys.get(&id) {
            return Ok(key.clone());
        }
        if !self.key_columns.contains_key(relation) {
            let columns = primary_key(client, relation).await?;
            self.key_columns.insert(relation.to_string(), columns);
        }
        let columns = &self.key_columns[relation];
        let text = if columns.is_empty() {
            "row_to_json(t)::text".to_string()
        } else {
            let parts: Vec<String> = columns
                .iter()
                .map(|column| {
                    format!(
                        "{} || '=' || COALESCE({}::text, 'NULL')",
                        literal(column),
                        quote_identifier(column)
                    )
                })
                .collect();
            format!("concat_ws(', ', {})", parts.join(", "))
        };
        // `relation` is the catalog's own quoted name (regclass output).
        let sql =
            format!("SELECT {text} FROM {relation} AS t WHERE t.ctid = '({page},{tuple})'::tid");
        let found = client.query_opt(&sql, &[]).await?;
        let key = found
            .and_then(|row| row.get::<_, Option<String>>(0))
            .unwrap_or_else(|| UNREAD_KEY.to_string());
        self.keys.insert(id, key.clone());
        Ok(key)
    }
}

/// A relation's primary-key columns, in key order.
pub async fn primary_key(client: &Client, relation: &str) -> Result<Vec<String>, ProfileError> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index AS i JOIN pg_attribute AS a \
             ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
             WHERE i.indrelid = $1::text::regclass AND i.indisprimary \
             ORDER BY array_position(i.indkey::int2[], a.attnum)",
            &[&relation],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// A SQL string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}
