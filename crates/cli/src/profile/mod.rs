//! `rowsync profile`: the SMP scalability paper's method applied to a script version on
//! PostgreSQL. Each script (in a transaction rolled back) and each whole sync type
//! (through the backend's `run_sync_transaction`) runs alone, then as N copies at once with
//! identical and with distinct parameters; a sampler records what the copies' sessions
//! waited on and which rows they waited for, and the verdict comes from those waits,
//! never from the times (the machine is noisy). `plans` is the plan advisor.

mod copies;
pub mod plans;
pub mod plans_sqlite;
pub mod report;
mod sampler;
mod syncs;
mod verdict;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rowsync_consolidated::{positional_parameters, scripts::*, Parameters};
use rowsync_protocol::Value;

use copies::{script_batch, Session};
pub use report::{ProfileReport, RunReport, TargetReport, VerdictKind};
use sampler::{Gate, Observations, Sampler, APPLICATION_NAME_PREFIX};
use workload::{Participant, Workload};

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("{0}")]
    Input(String),
    #[error("PostgreSQL: {}", rowsync_consolidated::postgres::describe_postgres(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Database(#[from] rowsync_consolidated::DbError),
    #[error("the sampler stopped: {0}")]
    Task(String),
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

/// Connection events run per script: the ones that run in every sync (and the
/// acknowledgement); `authenticate_user`, `handle_error` and `report_error` run only
/// on their occasions.
const PROFILED_EVENTS: [&str; 9] = [
    BEGIN_CONNECTION,
    BEGIN_SYNCHRONIZATION,
    BEGIN_UPLOAD,
    END_UPLOAD,
    MODIFY_NEXT_LAST_DOWNLOAD,
    BEGIN_DOWNLOAD,
    END_DOWNLOAD,
    END_SYNCHRONIZATION,
    DOWNLOAD_ACK,
];

#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// A `postgres://` URL.
    pub url: String,
    pub script_version: String,
    /// Parameters from a recording (`serve --record DIR`) instead of the data.
    pub recording: Option<PathBuf>,
    /// Copy counts, ascending, starting at 1.
    pub copies: Vec<usize>,
    /// Batches per copy count and parameters; the median is reported.
    pub rounds: usize,
    /// Rows each copy of an upload sync type uploads per table.
    pub upload_rows: usize,
    /// Whole sync types too (they commit: run against a copy of the database).
    pub syncs: bool,
    /// Cores perfect scaling is reckoned for.
    pub cores: usize,
    /// Run the plan advisor too.
    pub plans: bool,
}

/// The copy counts asked for, with 1 first, sorted, without repeats.
pub fn copy_counts(asked: &[usize], workers: usize) -> Vec<usize> {
    let mut counts: Vec<usize> = asked
        .iter()
        .copied()
        .chain([1, workers])
        .filter(|n| *n > 0)
        .collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// This run's application name: its sessions carry it, the sampler looks for it.
fn application_name() -> String {
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{APPLICATION_NAME_PREFIX}-{}-{run}", std::process::id())
}

/// The URL with an application name.
fn profile_url(url: &str, application_name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={application_name}")
}

/// Runs the profile (and the plan advisor when asked).
pub async fn run(options: &ProfileOptions) -> Result<ProfileReport, ProfileError> {
    if options.copies.first() != Some(&1) || options.rounds == 0 {
        return Err(ProfileError::Input(
            "copies must start at 1 and rounds be at least 1".into(),
        ));
    }
    let copies_max = *options.copies.iter().max().unwrap_or(&1);
    let admin = copies::connect(&options.url).await?;
    let workload = workload::load(
        &admin.client,
        &options.script_version,
        options.recording.as_deref(),
        copies_max,
    )
    .await?;
    let application_name = application_name();
    let url = profile_url(&options.url, &application_name);
    let mut sessions = Vec::new();
    for _ in 0..copies_max.max(2) {
        sessions.push(copies::connect(&url).await?);
    }
    // The advisor first: the whole syncs below write rows and tombstones whose
    // statistics nobody has analyzed yet.
    let plans = if options.plans {
        Some(plans::advise(&admin.client, &workload).await?)
    } else {
        None
    };
    let sampler = Sampler::start(
        copies::connect(&options.url).await?.client,
        application_name,
    );
    let profiler = Profiler {
        options,
        workload: &workload,
        sessions: &sessions,
        sampler: &sampler,
    };
    let mut targets = Vec::new();
    for (table, event, sql) in script_targets(&workload) {
        targets.push(profiler.script(&table, &event, &sql).await?);
    }
    if options.syncs {
        targets.extend(syncs::profile_syncs(&profiler, &admin.client, &url).await?);
    }
    sampler.stop().await?;
    Ok(ProfileReport {
        created_unix_ms: unix_ms(),
        database: "PostgreSQL".into(),
        script_version: options.script_version.clone(),
        cores: options.cores,
        copies: options.copies.clone(),
        parameter_source: workload.source.clone(),
        users: workload
            .participants
            .iter()
            .map(|participant| participant.user.clone())
            .collect(),
        targets,
        plans,
    })
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// The scripts profiled one by one: connection events, then each table's cursors.
fn script_targets(workload: &Workload) -> Vec<(String, String, String)> {
    let mut targets = Vec::new();
    for event in PROFILED_EVENTS {
        if let Some(sql) = workload.script("", event) {
            targets.push((String::new(), event.to_string(), sql.to_string()));
        }
    }
    for table in &workload.tables {
        for event in [DOWNLOAD_CURSOR, DOWNLOAD_DELETE_CURSOR] {
            if let Some(sql) = workload.script(&table.name, event) {
                targets.push((table.name.clone(), event.to_string(), sql.to_string()));
            }
        }
    }
    targets
}

/// The named parameters a sync of `participant` gives a script of `event`.
pub fn parameters_for<'a>(
    workload: &'a Workload,
    participant: &'a Participant,
    event: &str,
) -> Parameters<'a> {
    let watermark = Value::Int(participant.last_download);
    let extra = match event {
        MODIFY_NEXT_LAST_DOWNLOAD => vec![("next_last_download", watermark)],
        DOWNLOAD_ACK => vec![("watermark", watermark)],
        _ => Vec::new(),
    };
    Parameters {
        user: &participant.user,
        client_id: &participant.client_id,
        script_version: &workload.script_version,
        last_download: participant.last_download,
        table_watermarks: &[],
        upload_sequence: 1,
        last_sync_xid: 0,
        auth_parameters: &[],
        extra,
    }
}

pub(crate) struct Profiler<'a> {
    options: &'a ProfileOptions,
    workload: &'a Workload,
    sessions: &'a [Session],
    sampler: &'a Sampler,
}

/// Measurements of one target, gathered run by run.
#[derive(Default)]
pub(crate) struct Measured {
    pub runs: Vec<RunReport>,
    pub observations: Observations,
    pub first_error: Option<String>,
}

impl Measured {
    /// Records the rounds of `copies` copies (`distinct` parameters or not).
    pub fn record(
        &mut self,
        copies: usize,
        distinct: bool,
        walls: &mut [Duration],
        errors: &[String],
        cores: usize,
    ) {
        walls.sort_unstable();
        let wall_ms = walls
            .get(walls.len() / 2)
            .map_or(0.0, |wall| wall.as_secs_f64() * 1000.0);
        let alone = self
            .runs
            .iter()
            .find(|run| run.copies == 1 && run.errors == 0)
            .map(|run| run.wall_ms);
        let ratio = alone
            .filter(|alone| *alone > 0.0)
            .map(|alone| wall_ms / (alone * copies.div_ceil(cores.max(1)) as f64));
        if self.first_error.is_none() {
            self.first_error = errors.first().cloned();
        }
        self.runs.push(RunReport {
            copies,
            parameters: if distinct { "distinct" } else { "identical" }.into(),
            wall_ms,
            ratio,
            errors: errors.len() as u64,
            first_error: errors.first().cloned(),
        });
    }

    pub fn report(self, name: String, kind: &str) -> TargetReport {
        let alone_ms = self
            .runs
            .iter()
            .find(|run| run.copies == 1 && run.errors == 0)
            .map(|run| run.wall_ms);
        TargetReport {
            name,
            kind: kind.into(),
            alone_ms,
            verdict: verdict::verdict(&self.observations, self.first_error.as_deref()),
            waits: self.observations.wait_counts(),
            hot_rows: self.observations.hot_row_list(),
            runs: self.runs,
        }
    }
}

impl Profiler<'_> {
    /// Parameter orders: identical, then distinct (beyond one copy, and only when
    /// there is more than one participant to differ by).
    pub fn parameter_kinds(&self, copies: usize) -> Vec<bool> {
        if copies > 1 && self.workload.participants.len() > 1 {
            vec![false, true]
        } else {
            vec![false]
        }
    }

    async fn script(
        &self,
        table: &str,
        event: &str,
        sql: &str,
    ) -> Result<TargetReport, ProfileError> {
        let (positional, names) = positional_parameters(sql);
        let values = |copies: usize, distinct: bool| -> Result<Vec<Vec<Value>>, String> {
            (0..copies)
                .map(|index| {
                    let participant = self.workload.participant(index, distinct);
                    let parameters = parameters_for(self.workload, participant, event);
                    names
                        .iter()
                        .map(|name| {
                            parameters
                                .value(name, table, event)
                                .map_err(|error| error.to_string())
                        })
                        .collect()
                })
                .collect()
        };
        let mut measured = Measured::default();
        for &copies in &self.options.copies {
            for distinct in self.parameter_kinds(copies) {
                let values = match values(copies, distinct) {
                    Ok(values) => values,
                    Err(error) => {
                        measured.record(copies, distinct, &mut [], &[error], self.options.cores);
                        continue;
                    }
                };
                let mut walls = Vec::new();
                let mut errors = Vec::new();
                for _ in 0..self.options.rounds {
                    self.sampler.begin(None);
                    let batch = script_batch(self.sessions, &positional, &values, None).await?;
                    measured.observations.add(&self.sampler.take());
                    walls.push(batch.wall);
                    errors.extend(batch.errors);
                }
                measured.record(copies, distinct, &mut walls, &errors, self.options.cores);
            }
        }
        // The probe: two copies that keep their transactions open until each has seen
        // the other finish or wait, so a row they both write is seen whatever the timing.
        for distinct in self.parameter_kinds(2) {
            if let Ok(values) = values(2, distinct) {
                let gate = Arc::new(Gate::default());
                self.sampler.begin(Some(Arc::clone(&gate)));
                script_batch(self.sessions, &positional, &values, Some(&gate)).await?;
                measured.observations.add(&self.sampler.take());
            }
        }
        let name = if table.is_empty() {
            event.to_string()
        } else {
            format!("{table} {event}")
        };
        Ok(measured.report(name, "script"))
    }
}
