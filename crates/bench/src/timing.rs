//! `rowsync-bench timing`: the white paper's timing framework (Tests 1-5) with the database's
//! own limit and the row-script model measured in the same run.
//!
//! Each test point starts from a fresh state (tables emptied, subscriptions removed,
//! a new server process), lets every client do one empty sync (warm-up), then times
//! sets of syncs in the paper's order: download, update, delete, insert. Clients pass a
//! gate before each set (all start together) and the set ends when the last one has
//! finished. The server records its start and end time of every sync into
//! `bench_server_time` from the `begin_synchronization` and `end_synchronization`
//! scripts; the clients keep theirs in memory. Total server time = the sum over sets of
//! (last server end - first server start).

pub mod clients;
pub mod cpu;
pub mod limit;
pub mod paper;
pub mod pgbench;
pub mod report;
pub mod results;
pub mod server;
pub mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use rowsync_cli::cert::KeyKind;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, ScriptEntry, TableInit};
use rowsync_protocol::Compression;
use tokio_postgres::Client as PgClient;

use crate::apply::connect;
use clients::{ClientMode, Outcome, Retry, SimClient, Work};
use results::{BenchRun, Phase, Point, TestResult, SYNC_TYPES};
use server::{Certificates, Layout, Protocol, ServerSetup, Servers, Workers};
use workload::{UploadKind, RAW_TABLE, TABLE, TABLE_COLUMNS_DDL};

/// The script version of the default (set) scripts.
pub const SET_VERSION: &str = "bench";
/// The script version whose upload scripts run one statement per row (MobiLink's model).
pub const ROW_VERSION: &str = "bench_rows";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Quick,
    Standard,
    Paper,
}

impl Size {
    pub fn parse(text: &str) -> Result<Size> {
        Ok(match text {
            "quick" => Size::Quick,
            "standard" => Size::Standard,
            "paper" => Size::Paper,
            other => bail!("unknown size {other:?}: quick, standard or paper"),
        })
    }
    /// How long one sync (retries included) may take before the run fails: short at
    /// quick size, so that a hang fails CI in minutes rather than an hour.
    pub fn sync_timeout(self) -> Duration {
        match self {
            Size::Quick => clients::SYNC_TIMEOUT_QUICK,
            Size::Standard | Size::Paper => clients::SYNC_TIMEOUT,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Size::Quick => "quick",
            Size::Standard => "standard",
            Size::Paper => "paper",
        }
    }
}

/// Everything `rowsync-bench timing` was asked; `None` keeps the size's default.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// A postgres:// URL of a scratch database (the bench drops and recreates its tables).
    pub db: String,
    /// The `rowsync` executable started as the server.
    pub server_program: PathBuf,
    pub size: Size,
    /// Which of the paper's tests, 1 to 5.
    pub tests: Vec<u8>,
    pub client_mode: ClientMode,
    pub results_dir: PathBuf,
    pub clients: Option<usize>,
    pub rows: Option<usize>,
    pub sets: Option<usize>,
    pub workers: Option<Workers>,
    pub connections_max: Option<usize>,
    pub retry: Option<Retry>,
    pub protocol: Option<Protocol>,
    pub compression: Option<Compression>,
    pub repeat: Option<usize>,
    /// Test 6: the servers of the farm behind HAProxy (None: 3).
    pub farm_servers: Option<usize>,
}

/// One point's parameters.
#[derive(Debug, Clone)]
struct PointSpec {
    label: String,
    x: Option<f64>,
    clients: usize,
    rows: usize,
    sets: usize,
    workers: Workers,
    connections_max: usize,
    retry: Retry,
    protocol: Protocol,
    compression: Compression,
    /// Sets of empty syncs timed after the warm-up (0: none), on warm connections.
    empty_sets: usize,
    layout: Layout,
}

impl PointSpec {
    fn transport_label(&self) -> String {
        match self.compression {
            Compression::None => self.protocol.label().to_string(),
            Compression::Zlib => format!("{} + zlib", self.protocol.label()),
            Compression::Zstd => format!("{} + zstd", self.protocol.label()),
        }
    }
}

/// The fixed parameters of a size (paper: 1,000 clients x 1,000 rows, 10 sets).
struct Base {
    clients: usize,
    rows: usize,
    sets: usize,
    workers: Workers,
    connections_max: usize,
    repeat: usize,
}

fn base(options: &BenchOptions) -> Base {
    let (clients, rows, sets, workers, repeat) = match options.size {
        Size::Quick => (12, 40, 2, 2, 2),
        Size::Standard => (1000, 1000, 1, 4, 3),
        Size::Paper => (1000, 1000, 10, 8, 5),
    };
    Base {
        clients: options.clients.unwrap_or(clients),
        rows: options.rows.unwrap_or(rows),
        sets: options.sets.unwrap_or(sets),
        workers: options.workers.unwrap_or(Workers::Fixed(workers)),
        connections_max: options.connections_max.unwrap_or(1024),
        repeat: options.repeat.unwrap_or(repeat),
    }
}

/// Clients, rows, sets and connections of a limit measurement.
type LimitShape = (usize, usize, usize, usize);

/// Shared by every point of a run.
struct RunContext {
    options: BenchOptions,
    admin: PgClient,
    certificates: Certificates,
    work_dir: tempfile::TempDir,
    tokens: Arc<Vec<String>>,
    limits: Vec<(LimitShape, limit::Measured)>,
    /// Whose CPU each timed section used (the fair second reference).
    meter: cpu::Meter,
}

/// Runs the tests asked for and writes the results directory; returns what it measured.
pub async fn run(options: BenchOptions, out: &mut dyn std::io::Write) -> Result<BenchRun> {
    if options.tests.is_empty() || options.tests.iter().any(|t| !(1..=6).contains(t)) {
        bail!("--tests takes the paper's test numbers, 1 to 5, and 6 (the farm)");
    }
    if options.farm_servers.is_some_and(|n| n < 2) {
        bail!("--farm-servers must be at least 2 (a farm is compared with one server)");
    }
    for (name, value) in [
        ("clients", options.clients),
        ("rows", options.rows),
        ("sets", options.sets),
        ("repeat", options.repeat),
        ("connection-limit", options.connections_max),
    ] {
        if value == Some(0) {
            bail!("--{name} must be at least 1");
        }
    }
    let admin = connect(&options.db).await?;
    prepare_database(&options.db, &admin).await?;
    let meter = cpu::Meter::new(&admin).await?;
    let work_dir = tempfile::tempdir()?;
    let certificates = Certificates::new(work_dir.path())?;
    let mut context = RunContext {
        admin,
        certificates,
        work_dir,
        tokens: Arc::new(Vec::new()),
        limits: Vec::new(),
        meter,
        options: options.clone(),
    };
    let mut run = BenchRun {
        size: options.size.label().into(),
        client_mode: options.client_mode.label().into(),
        wire_bytes_per_row: wire_bytes_per_row(),
        started: chrono::Utc::now().to_rfc3339(),
        machine: machine(),
        tests: Vec::new(),
    };
    let mut best_workers = None;
    for &test in &options.tests {
        writeln!(out, "== Test {test}")?;
        let result = match test {
            1 => {
                let result = test1(&mut context, out).await?;
                best_workers = best_fixed_workers(&result);
                result
            }
            2 => test2(&mut context, best_workers, out).await?,
            3 => test3(&mut context, best_workers, out).await?,
            4 => test4(&mut context, best_workers, out).await?,
            5 => test5(&mut context, best_workers, out).await?,
            _ => test6(&mut context, best_workers, out).await?,
        };
        writeln!(out, "{}", report::render_test(&result))?;
        run.tests.push(result);
    }
    let written = report::write_results(&run, &options.results_dir)?;
    writeln!(out, "results: {}", options.results_dir.display())?;
    for path in written {
        writeln!(out, "  {}", path.display())?;
    }
    Ok(run)
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpus} logical CPUs, {model}; server, PostgreSQL and clients on this one machine")
}

/// Bytes of one uploaded insert row on the wire (uncompressed): a 1,000-row upload
/// frame divided by its rows.
fn wire_bytes_per_row() -> f64 {
    let one = workload::upload_frames(UploadKind::Insert, 0, 0..1);
    let many = workload::upload_frames(UploadKind::Insert, 0, 0..1001);
    let bytes = |frames: &[Vec<u8>]| frames.iter().map(Vec::len).sum::<usize>() as f64;
    (bytes(&many) - bytes(&one)) / 1000.0
}

/// Tables, change tracking, the timing table and both script versions.
async fn prepare_database(url: &str, admin: &PgClient) -> Result<()> {
    admin
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {TABLE} CASCADE; DROP TABLE IF EXISTS {RAW_TABLE};
             DROP TABLE IF EXISTS rs_deleted_{TABLE} CASCADE; DROP TABLE IF EXISTS rs_tombstone_{TABLE};
             DROP TABLE IF EXISTS bench_server_time;
             CREATE TABLE {TABLE} {TABLE_COLUMNS_DDL}; CREATE TABLE {RAW_TABLE} {TABLE_COLUMNS_DDL};
             CREATE TABLE bench_server_time (client_id TEXT NOT NULL, upload_sequence BIGINT NOT NULL,
                 server_start TIMESTAMPTZ NOT NULL, server_end TIMESTAMPTZ,
                 PRIMARY KEY (client_id, upload_sequence));"
        ))
        .await
        .context("creating the bench tables")?;
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    admin
        .execute(
            "DELETE FROM rs_script WHERE script_version = ANY($1)",
            &[&vec![SET_VERSION, ROW_VERSION]],
        )
        .await?;
    admin
        .execute(
            "DELETE FROM rs_script_version WHERE name = ANY($1)",
            &[&vec![SET_VERSION, ROW_VERSION]],
        )
        .await?;
    connection
        .init_table(&TableInit {
            table: TABLE.into(),
            partition_column: "emp_id".into(),
            script_version: Some(SET_VERSION.into()),
            based_on: None,
        })
        .await?;
    connection
        .add_script_version(ROW_VERSION, "bench: one statement per uploaded row")
        .await?;
    for entry in connection.scripts(Some(SET_VERSION)).await? {
        connection
            .set_script(&ScriptEntry {
                script_version: ROW_VERSION.into(),
                ..entry
            })
            .await?;
    }
    let timing = [
        (
            "begin_synchronization",
            "INSERT INTO bench_server_time (client_id, upload_sequence, server_start) \
             VALUES (CAST(:client_id AS text), CAST(:upload_sequence AS bigint), clock_timestamp()) \
             ON CONFLICT (client_id, upload_sequence) DO UPDATE SET server_start = EXCLUDED.server_start, server_end = NULL",
        ),
        (
            "end_synchronization",
            "UPDATE bench_server_time SET server_end = clock_timestamp() \
             WHERE client_id = CAST(:client_id AS text) AND upload_sequence = CAST(:upload_sequence AS bigint)",
        ),
    ];
    let row_scripts = [
        (
            "upload_insert",
            "INSERT INTO purchase (emp_id, purch_id, cust_id, cost, order_date, notes) \
             VALUES (:new.emp_id, :new.purch_id, :new.cust_id, :new.cost, :new.order_date, :new.notes)",
        ),
        (
            "upload_update",
            "UPDATE purchase SET cust_id = :new.cust_id, cost = :new.cost, order_date = :new.order_date, notes = :new.notes \
             WHERE emp_id = :old.emp_id AND purch_id = :old.purch_id AND cust_id = :old.cust_id \
             AND cost = :old.cost AND order_date = :old.order_date AND notes IS NOT DISTINCT FROM CAST(:old.notes AS varchar)",
        ),
        (
            "upload_delete",
            "DELETE FROM purchase WHERE emp_id = :old.emp_id AND purch_id = :old.purch_id",
        ),
    ];
    for version in [SET_VERSION, ROW_VERSION] {
        for (event, script) in timing {
            connection
                .set_script(&ScriptEntry {
                    script_version: version.into(),
                    table: String::new(),
                    event: event.into(),
                    script: script.into(),
                })
                .await?;
        }
    }
    for (event, script) in row_scripts {
        connection
            .set_script(&ScriptEntry {
                script_version: ROW_VERSION.into(),
                table: TABLE.into(),
                event: event.into(),
                script: script.into(),
            })
            .await?;
    }
    Ok(())
}

fn token(user: &str) -> Result<String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        exp: u64,
    }
    let exp = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)?
        .as_secs()
        + 7 * 24 * 3600;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims { sub: user, exp },
        &jsonwebtoken::EncodingKey::from_secret(server::TOKEN_SECRET),
    )?)
}

impl RunContext {
    fn tokens_for(&mut self, clients: usize) -> Result<Arc<Vec<String>>> {
        if self.tokens.len() < clients {
            let mut tokens = (*self.tokens).clone();
            for client in tokens.len()..clients {
                tokens.push(token(&workload::user_name(client))?);
            }
            self.tokens = Arc::new(tokens);
        }
        Ok(Arc::clone(&self.tokens))
    }

    /// The limit at a point's shape, best of `repeat` runs per sync type (as rowsync's
    /// own figure is the best of its runs, with that run's CPU); measured once per shape.
    async fn limit(&mut self, spec: &PointSpec, repeat: usize) -> Result<limit::Measured> {
        let key = (
            spec.clients,
            spec.rows,
            spec.sets,
            spec.workers.connections(),
        );
        if let Some((_, measured)) = self.limits.iter().find(|(k, _)| *k == key) {
            return Ok(measured.clone());
        }
        let mut best = limit::Measured::unmeasured();
        for _ in 0..repeat.max(1) {
            let measured = limit::measure(
                &self.options.db,
                &self.meter,
                spec.clients,
                spec.rows,
                spec.sets,
                spec.workers.connections(),
            )
            .await?;
            best.keep_faster(&measured);
        }
        self.limits.push((key, best.clone()));
        Ok(best)
    }
}

/// Checkpoints PostgreSQL has run so far (PostgreSQL 17 moved the counters to
/// `pg_stat_checkpointer`). A checkpoint in the middle of a timed set makes every page
/// written after it log a full image: the bench reports them, since they, not rowsync,
/// may explain an outlier.
async fn checkpoints(admin: &PgClient) -> Result<i64> {
    for query in [
        "SELECT (checkpoints_timed + checkpoints_req)::int8 FROM pg_stat_bgwriter",
        "SELECT (num_timed + num_requested)::int8 FROM pg_stat_checkpointer",
    ] {
        if let Ok(row) = admin.query_one(query, &[]).await {
            return Ok(row.get(0));
        }
    }
    bail!("neither pg_stat_bgwriter nor pg_stat_checkpointer counts checkpoints")
}

/// The timestamps of one set from the timing table, which is then emptied.
async fn server_set_seconds(admin: &PgClient, syncs: usize) -> Result<f64> {
    let row = admin
        .query_one(
            "SELECT count(*), count(server_end), \
             COALESCE(EXTRACT(EPOCH FROM max(server_end) - min(server_start))::float8, 0) FROM bench_server_time",
            &[],
        )
        .await?;
    let (count, ended, seconds): (i64, i64, f64) = (row.get(0), row.get(1), row.get(2));
    if count != syncs as i64 || ended != syncs as i64 {
        bail!(
            "the server recorded {count} sync starts and {ended} ends for a set of {syncs} syncs"
        );
    }
    admin.batch_execute("TRUNCATE bench_server_time").await?;
    Ok(seconds)
}

fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * fraction).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn seconds_between(a: SystemTime, b: SystemTime) -> f64 {
    b.duration_since(a).unwrap_or_default().as_secs_f64()
}

/// All clients pass the gate, sync once each with `work`, and are given back.
async fn timed_set(
    clients: Vec<SimClient>,
    connection: &clients::Connection,
    work: impl Fn(usize) -> Work,
) -> Result<(Vec<SimClient>, Vec<Outcome>)> {
    let gate = Arc::new(tokio::sync::Barrier::new(clients.len()));
    let mut tasks = tokio::task::JoinSet::new();
    for (index, mut client) in clients.into_iter().enumerate() {
        let (gate, connection, work) = (Arc::clone(&gate), connection.clone(), work(index));
        tasks.spawn(async move {
            gate.wait().await;
            let outcome = client.sync(&connection, work).await;
            (index, client, outcome)
        });
    }
    let mut returned: Vec<Option<(SimClient, Outcome)>> = Vec::new();
    returned.resize_with(tasks.len(), || None);
    let mut first_error = None;
    let mut slots = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (index, client, outcome) = done.context("a client task panicked")?;
        match outcome {
            Ok(outcome) => returned[index] = Some((client, outcome)),
            Err(error) => {
                first_error.get_or_insert(error);
                slots.push(index);
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error.context(format!("{} of the set's syncs failed", slots.len())));
    }
    Ok(returned
        .into_iter()
        .map(|slot| slot.expect("every client returned"))
        .unzip())
}

/// One phase (one sync type over every set) against a running server.
async fn phase(
    context: &RunContext,
    servers: &Servers,
    mut clients: Vec<SimClient>,
    connection: &clients::Connection,
    spec: &PointSpec,
    sync_type: &str,
) -> Result<(Vec<SimClient>, Phase)> {
    let mut result = Phase {
        sync_type: sync_type.into(),
        ..Phase::default()
    };
    let mut cpu = cpu::CpuUsage::zero(context.meter.measures_database());
    let mut client_times = Vec::new();
    for set in 0..spec.sets {
        let rows = spec.rows;
        let work = move |_: usize| match sync_type {
            "download" => Work::Download { set, rows },
            "update" => Work::Upload {
                kind: UploadKind::Update,
                set,
                rows,
            },
            "delete" => Work::Upload {
                kind: UploadKind::Delete,
                set,
                rows,
            },
            "insert" => Work::Upload {
                kind: UploadKind::Insert,
                set,
                rows,
            },
            _ => Work::Empty,
        };
        if sync_type == "download" {
            let all = (0..spec.clients).flat_map(|c| {
                workload::set_indexes(set, rows).map(move |i| workload::row(c, i, 0))
            });
            limit::copy_in(&context.admin, TABLE, all).await?;
            context
                .admin
                .batch_execute(&format!("ANALYZE {TABLE}"))
                .await?;
        }
        for (index, client) in clients.iter_mut().enumerate() {
            client.prepare(work(index))?;
        }
        let pids = servers.pids();
        let before = context.meter.read(&pids)?;
        let (back, outcomes) = timed_set(clients, connection, work).await?;
        cpu.add(&context.meter.read(&pids)?.since(&before));
        clients = back;
        result.total_server_seconds += server_set_seconds(&context.admin, spec.clients).await?;
        let first = outcomes
            .iter()
            .map(|o| o.client_start)
            .min()
            .expect("clients");
        let last = outcomes
            .iter()
            .map(|o| o.client_end)
            .max()
            .expect("clients");
        result.total_client_seconds += seconds_between(first, last);
        for outcome in &outcomes {
            client_times.push(seconds_between(outcome.client_start, outcome.client_end));
            result.syncs += 1;
            result.rows += outcome.rows;
            result.wire_bytes += outcome.wire_bytes;
            result.busy_retries += outcome.busy_retries;
        }
    }
    client_times.sort_by(f64::total_cmp);
    result.client_seconds_median = percentile(&client_times, 0.5);
    result.client_seconds_p99 = percentile(&client_times, 0.99);
    result.server_cpu_seconds = cpu.server_seconds;
    result.cpu = Some(cpu);
    Ok((clients, result))
}

/// What one run of a point measured: the set-script phases, the row-script phases (if
/// asked), the empty syncs, and the server's peak memory.
struct PointRun {
    phases: Vec<Phase>,
    row_phases: Option<Vec<Phase>>,
    empty: EmptySyncs,
    peak_rss_bytes: u64,
    /// Syncs each server completed (servers behind HAProxy only).
    syncs_per_server: Vec<u64>,
}

/// A point's empty syncs: the warm-up (each client's first sync, on connections and
/// prepared statements made for it) and `empty_sets` sets after it (steady state).
#[derive(Default)]
struct EmptySyncs {
    warm_up: Phase,
    steady: Phase,
}

async fn run_point(
    context: &mut RunContext,
    spec: &PointSpec,
    row_scripts: bool,
) -> Result<PointRun> {
    context
        .admin
        .batch_execute(&format!(
            "TRUNCATE {TABLE}, rs_deleted_{TABLE}, bench_server_time; DELETE FROM rs_subscription"
        ))
        .await?;
    ensure_capacity(&context.admin, spec, context.options.client_mode).await?;
    let tokens = context.tokens_for(spec.clients)?;
    let point_dir = tempfile::tempdir_in(context.work_dir.path())?;
    let server = Servers::start(
        &context.options.server_program,
        &ServerSetup {
            db: context.options.db.clone(),
            workers: spec.workers,
            connections_max: spec.connections_max,
            protocol: spec.protocol,
        },
        spec.layout,
        point_dir.path(),
        &context.certificates,
    )?;
    let mut connection = clients::Connection::new(
        &server.url,
        server.ca_file.as_deref(),
        spec.compression,
        spec.retry,
        tokens,
    );
    connection.script_version = SET_VERSION.into();
    connection.sync_timeout = context.options.size.sync_timeout();
    let mut clients = (0..spec.clients)
        .map(|index| SimClient::new(context.options.client_mode, index, point_dir.path()))
        .collect::<Result<Vec<_>>>()?;
    let (back, warm_up) = phase(
        context,
        &server,
        clients,
        &connection,
        &PointSpec {
            sets: 1,
            ..spec.clone()
        },
        "empty",
    )
    .await?;
    clients = back;
    let mut steady = Phase::default();
    if spec.empty_sets > 0 {
        let sets = PointSpec {
            sets: spec.empty_sets,
            ..spec.clone()
        };
        let (back, measured) =
            phase(context, &server, clients, &connection, &sets, "empty").await?;
        clients = back;
        steady = measured;
    }
    let mut phases = Vec::new();
    for sync_type in SYNC_TYPES {
        let (back, measured) =
            phase(context, &server, clients, &connection, spec, sync_type).await?;
        clients = back;
        phases.push(measured);
        check_clients(&clients, spec, sync_type)?;
    }
    check_consolidated(&context.admin, spec).await?;
    let row_phases = if row_scripts {
        connection.script_version = ROW_VERSION.into();
        let mut row_phases = Vec::new();
        for sync_type in &SYNC_TYPES[1..] {
            let (back, measured) =
                phase(context, &server, clients, &connection, spec, sync_type).await?;
            clients = back;
            row_phases.push(measured);
            check_clients(&clients, spec, sync_type)?;
        }
        check_consolidated(&context.admin, spec).await?;
        Some(row_phases)
    } else {
        None
    };
    let peak_rss_bytes = server.peak_rss_bytes()?;
    let syncs_per_server = server.syncs_per_server()?;
    server.stop()?;
    Ok(PointRun {
        phases,
        row_phases,
        empty: EmptySyncs { warm_up, steady },
        peak_rss_bytes,
        syncs_per_server,
    })
}

/// File descriptors a client holds beyond its socket: a sqlite client's database, WAL
/// and shared-memory files.
const SQLITE_CLIENT_FILES: u64 = 3;
/// Descriptors and PostgreSQL connections kept free beyond what a point needs.
const DESCRIPTORS_SPARE: u64 = 256;
const PG_CONNECTIONS_SPARE: i64 = 4;

/// Checks, before a point starts, that its clients fit in this process's (and the
/// server's) file descriptors, raised to the hard limit, and that PostgreSQL accepts the
/// server's workers and authentication connections: a clear error up front instead of
/// failed syncs in the middle of a run.
async fn ensure_capacity(admin: &PgClient, spec: &PointSpec, mode: ClientMode) -> Result<()> {
    let per_client = 1 + if mode == ClientMode::Sqlite {
        SQLITE_CLIENT_FILES
    } else {
        0
    };
    let needed = spec.clients as u64 * per_client + DESCRIPTORS_SPARE;
    let allowed = rlimit::increase_nofile_limit(u64::MAX)
        .context("raising the open-file limit to its hard limit")?;
    if needed > allowed {
        bail!(
            "{} {} clients need about {needed} file descriptors, and this process may open {allowed} (raise the hard limit: ulimit -Hn, or LimitNOFILE)",
            spec.clients,
            mode.label()
        );
    }
    let row = admin
        .query_one(
            "SELECT current_setting('max_connections')::int8 \
                    - current_setting('superuser_reserved_connections')::int8 \
                    - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
            &[],
        )
        .await?;
    let free: i64 = row.get(0);
    let per_server =
        spec.workers.connections() + rowsync_server::ServerConfig::default().auth_connections;
    let needed = (per_server * spec.layout.servers) as i64 + PG_CONNECTIONS_SPARE;
    if needed > free {
        bail!(
            "{} with {} database workers each need about {needed} PostgreSQL connections and {free} are free (raise max_connections or lower --workers)",
            spec.layout.label(),
            spec.workers.label()
        );
    }
    Ok(())
}

/// The consolidated database ends as it began after the download phase: every row of
/// every set, none updated (the inserts put back what the deletes removed).
async fn check_consolidated(admin: &PgClient, spec: &PointSpec) -> Result<()> {
    let row = admin
        .query_one(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE cost = $1::text::numeric) FROM {TABLE}"
            ),
            &[&workload::cost(0).to_string()],
        )
        .await?;
    let (count, original): (i64, i64) = (row.get(0), row.get(1));
    let expected = (spec.clients * spec.rows * spec.sets) as i64;
    if count != expected || original != expected {
        bail!("after the timed syncs {TABLE} holds {count} rows ({original} as first inserted), expected {expected}");
    }
    Ok(())
}

/// sqlite clients hold exactly what the consolidated database holds of their partition
/// after each phase: every row after the download, every row updated after the update,
/// none after the delete, every row as first inserted after the insert.
fn check_clients(clients: &[SimClient], spec: &PointSpec, after: &str) -> Result<()> {
    let all = 0..spec.rows * spec.sets;
    let (indexes, version) = match after {
        "update" => (all, 1),
        "delete" => (0..0, 0),
        _ => (all, 0),
    };
    for (index, client) in clients.iter().enumerate() {
        if let Some((count, checksum)) = client.local_rows()? {
            let expected = clients::expected_local_checksum(index, indexes.clone(), version)?;
            if count != indexes.len() as u64 || checksum != expected {
                bail!(
                    "after the {after} phase client {index} holds {count} rows not matching its partition (expected {})",
                    indexes.len()
                );
            }
        }
    }
    Ok(())
}

/// Runs a point `repeat` times (the limit at its shape best of `repeat` too, measured
/// once per shape), into a result `Point`.
async fn measure_point(
    context: &mut RunContext,
    spec: &PointSpec,
    repeat: usize,
    with_limit: bool,
    out: &mut dyn std::io::Write,
) -> Result<(Point, i64, EmptySyncs)> {
    let mut point = new_point(spec);
    let mut empty = EmptySyncs::default();
    let checkpoints_before = checkpoints(&context.admin).await?;
    for run in 0..repeat {
        let measured = run_point(context, spec, false).await?;
        empty = record_run(&mut point, measured, run, out)?;
    }
    let checkpoints_during = checkpoints(&context.admin).await? - checkpoints_before;
    if with_limit {
        let limit = context.limit(spec, repeat).await?;
        point.limit_seconds = Some(limit.seconds);
        point.limit_cpu = Some(limit.cpu);
    }
    Ok((point, checkpoints_during, empty))
}

/// A point not yet run.
fn new_point(spec: &PointSpec) -> Point {
    Point {
        label: spec.label.clone(),
        x: spec.x,
        clients: spec.clients,
        rows_per_sync: spec.rows,
        sets: spec.sets,
        workers: spec.workers.label(),
        connections_max: spec.connections_max,
        retry: spec.retry.label(),
        transport: spec.transport_label(),
        ..Point::default()
    }
}

/// Adds one run's phases to its point and prints them; gives back its empty syncs.
fn record_run(
    point: &mut Point,
    measured: PointRun,
    run: usize,
    out: &mut dyn std::io::Write,
) -> Result<EmptySyncs> {
    let seconds: Vec<String> = measured
        .phases
        .iter()
        .map(|p| format!("{} {:.3} s", p.sync_type, p.total_server_seconds))
        .collect();
    writeln!(
        out,
        "  {} run {}: {}",
        point.label,
        run + 1,
        seconds.join(", ")
    )?;
    point.runs.push(measured.phases);
    point.server_peak_rss_bytes = point.server_peak_rss_bytes.max(measured.peak_rss_bytes);
    point.syncs_per_server = measured.syncs_per_server;
    Ok(measured.empty)
}

fn note_checkpoints(result: &mut TestResult, point: &Point, checkpoints: i64) {
    if checkpoints > 0 {
        result.notes.push(format!(
            "{}: PostgreSQL ran {checkpoints} checkpoint(s) during its timed syncs (raise max_wal_size for steadier times)",
            point.label
        ));
    }
}

/// The row-script reference at a test's base point.
async fn row_script_reference(
    context: &mut RunContext,
    spec: &PointSpec,
    out: &mut dyn std::io::Write,
) -> Result<Point> {
    let measured = run_point(context, spec, true).await?;
    let row_phases = measured.row_phases.expect("asked for");
    let seconds: Vec<String> = row_phases
        .iter()
        .map(|p| format!("{} {:.3} s", p.sync_type, p.total_server_seconds))
        .collect();
    writeln!(
        out,
        "  row scripts at {}: {}",
        spec.label,
        seconds.join(", ")
    )?;
    Ok(Point {
        label: format!("row scripts, {}", spec.label),
        runs: vec![row_phases],
        server_peak_rss_bytes: measured.peak_rss_bytes,
        ..new_point(spec)
    })
}

fn base_spec(context: &RunContext, best_workers: Option<usize>) -> PointSpec {
    let b = base(&context.options);
    let workers = match (context.options.workers, best_workers) {
        (Some(workers), _) => workers,
        (None, Some(best)) => Workers::Fixed(best),
        (None, None) => b.workers,
    };
    PointSpec {
        label: String::new(),
        x: None,
        clients: b.clients,
        rows: b.rows,
        sets: b.sets,
        workers,
        connections_max: b.connections_max.max(b.clients),
        retry: context.options.retry.unwrap_or(Retry::Hint),
        protocol: context.options.protocol.unwrap_or(Protocol::Tcp),
        compression: context.options.compression.unwrap_or(Compression::None),
        empty_sets: 0,
        layout: Layout::DIRECT,
    }
}

/// The fixed worker count with the smallest sum over the four types (the paper's
/// choice of 75 for the later tests).
fn best_fixed_workers(result: &TestResult) -> Option<usize> {
    result
        .points
        .iter()
        .filter_map(|p| {
            let n = p.workers.parse::<usize>().ok()?;
            let sum: f64 = p
                .best_seconds()
                .iter()
                .map(|s| s.unwrap_or(f64::INFINITY))
                .sum();
            Some((n, sum))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| n)
}

async fn test1(context: &mut RunContext, out: &mut dyn std::io::Write) -> Result<TestResult> {
    let b = base(&context.options);
    let (fixed, auto): (Vec<usize>, Vec<(usize, usize)>) = match context.options.size {
        Size::Quick => (vec![1, 2, 4], vec![(1, 4)]),
        Size::Standard => (vec![1, 2, 4, 8, 16], vec![(1, 16), (2, 16), (4, 16)]),
        Size::Paper => (
            vec![5, 10, 20, 50, 75, 100, 200],
            vec![(5, 100), (25, 100), (50, 100)],
        ),
    };
    let mut settings: Vec<Workers> = fixed.into_iter().map(Workers::Fixed).collect();
    settings.extend(auto.into_iter().map(|(a, z)| Workers::Auto(a, z)));
    if let Some(workers) = context.options.workers {
        settings = vec![workers];
    }
    let base_spec = base_spec(context, None);
    let mut result = TestResult {
        test: 1,
        title: "Database workers".into(),
        parameter: "DB workers".into(),
        ..TestResult::default()
    };
    for workers in settings {
        let spec = PointSpec {
            label: workers.label(),
            x: match workers {
                Workers::Fixed(n) => Some(n as f64),
                Workers::Auto(..) => None,
            },
            workers,
            ..base_spec.clone()
        };
        let (point, checkpoints, _) = measure_point(context, &spec, b.repeat, true, out).await?;
        note_checkpoints(&mut result, &point, checkpoints);
        result.points.push(point);
    }
    let reference = PointSpec {
        label: base_spec.workers.label(),
        ..base_spec
    };
    result.row_scripts = Some(row_script_reference(context, &reference, out).await?);
    result.notes.push(format!(
        "{} clients x {} rows x {} sets per sync type; best of {} runs per setting; limit with as many connections as workers (the range's maximum for auto)",
        reference.clients, reference.rows, reference.sets, b.repeat
    ));
    Ok(result)
}

/// Test 2's fixed parameters: clients, the low connection limit, sets (1 unless
/// `--sets`) and the retry delays (`None`: the server's hint); `--clients`,
/// `--connection-limit`, `--sets` and `--retry-delay-ms` replace them.
#[derive(Debug, PartialEq)]
struct Test2Points {
    clients: usize,
    low: usize,
    sets: usize,
    delays: Vec<Option<f64>>,
}

fn test2_points(options: &BenchOptions) -> Test2Points {
    let (clients, low, delays): (usize, usize, Vec<Option<f64>>) = match options.size {
        Size::Quick => (16, 4, vec![None, Some(0.0), Some(0.05)]),
        Size::Standard => (
            1000,
            100,
            vec![None, Some(0.0), Some(0.5), Some(2.0), Some(5.0)],
        ),
        Size::Paper => (
            10_000,
            1024,
            vec![
                None,
                Some(0.0),
                Some(0.5),
                Some(1.0),
                Some(2.0),
                Some(5.0),
                Some(10.0),
                Some(20.0),
                Some(50.0),
            ],
        ),
    };
    Test2Points {
        clients: options.clients.unwrap_or(clients),
        low: options.connections_max.unwrap_or(low),
        sets: options.sets.unwrap_or(1),
        delays: match options.retry {
            Some(Retry::Fixed(delay)) => vec![Some(delay.as_secs_f64())],
            Some(Retry::Hint) => vec![None],
            None => delays,
        },
    }
}

/// Runs per point of Tests 2 to 5: one, unless `--repeat` (Test 1 has its own default).
fn later_repeat(options: &BenchOptions) -> usize {
    options.repeat.unwrap_or(1)
}

async fn test2(
    context: &mut RunContext,
    best: Option<usize>,
    out: &mut dyn std::io::Write,
) -> Result<TestResult> {
    let base_spec = base_spec(context, best);
    let Test2Points {
        clients,
        low,
        sets,
        delays,
    } = test2_points(&context.options);
    let repeat = later_repeat(&context.options);
    let mut result = TestResult {
        test: 2,
        title: "Retry delay above the connection limit".into(),
        parameter: "Limit / retry delay".into(),
        ..TestResult::default()
    };
    for limit in [low, clients] {
        for delay in &delays {
            let retry = match delay {
                None => Retry::Hint,
                Some(seconds) => Retry::Fixed(Duration::from_secs_f64(*seconds)),
            };
            let spec = PointSpec {
                label: format!("limit {limit}, {}", retry.label()),
                x: None,
                clients,
                sets,
                connections_max: limit,
                retry,
                ..base_spec.clone()
            };
            let (point, checkpoints, _) = measure_point(context, &spec, repeat, true, out).await?;
            note_checkpoints(&mut result, &point, checkpoints);
            result.points.push(point);
        }
    }
    let sum = |p: &Point| {
        p.best_seconds()
            .iter()
            .map(|s| s.unwrap_or(0.0))
            .sum::<f64>()
    };
    let best_of = |limit: usize| {
        result
            .points
            .iter()
            .filter(|p| p.connections_max == limit)
            .map(sum)
            .min_by(f64::total_cmp)
            .unwrap_or(f64::NAN)
    };
    let (above, raised) = (best_of(low), best_of(clients));
    result.notes.push(format!(
        "{clients} clients, {} rows each, {sets} set(s); limit {low} (clients above it are told busy) vs limit raised to {clients}; best sums {above:.3} s vs {raised:.3} s: ratio {:.2} (paper: 344.6 s / 203.7 s = 1.69)",
        base_spec.rows,
        above / raised
    ));
    Ok(result)
}

/// How long the pgbench reference of Test 4 runs, in seconds.
const PGBENCH_SECONDS: u32 = 10;
const PGBENCH_SECONDS_QUICK: u32 = 2;

/// Test 3's points as (clients, sets): the size's client counts, each with the sets
/// that keep the total number of syncs constant; `--clients` runs just that count and
/// `--sets` replaces the computed sets. Also the constant total (for the notes).
fn test3_points(options: &BenchOptions) -> (Vec<(usize, usize)>, usize) {
    let counts: Vec<usize> = match options.size {
        Size::Quick => vec![4, 8, 16],
        Size::Standard => vec![100, 200, 500, 1000],
        Size::Paper => vec![200, 500, 1000, 2000, 5000, 10_000],
    };
    let total_syncs = *counts.last().expect("counts");
    let counts = options.clients.map_or(counts, |clients| vec![clients]);
    let points = counts
        .into_iter()
        .map(|clients| {
            let sets = options.sets.unwrap_or((total_syncs / clients).max(1));
            (clients, sets)
        })
        .collect();
    (points, total_syncs)
}

/// Test 4's points as (rows per sync, sets): the size's row counts, each with the sets
/// that keep the rows per client constant; `--rows` runs just that count and `--sets`
/// replaces the computed sets. Also the constant rows per client.
fn test4_points(options: &BenchOptions) -> (Vec<(usize, usize)>, usize) {
    let (sizes, per_client): (Vec<usize>, usize) = match options.size {
        Size::Quick => (vec![20, 40, 80], 80),
        Size::Standard => (vec![100, 250, 500, 1000], 1000),
        Size::Paper => (vec![100, 200, 500, 1000, 2000, 5000, 10_000], 10_000),
    };
    let sizes = options.rows.map_or(sizes, |rows| vec![rows]);
    let points = sizes
        .into_iter()
        .map(|rows| (rows, options.sets.unwrap_or((per_client / rows).max(1))))
        .collect();
    (points, per_client)
}

async fn test3(
    context: &mut RunContext,
    best: Option<usize>,
    out: &mut dyn std::io::Write,
) -> Result<TestResult> {
    let base_spec = base_spec(context, best);
    let (points, total_syncs) = test3_points(&context.options);
    let mut result = TestResult {
        test: 3,
        title: "Number of clients at a constant total".into(),
        parameter: "Clients".into(),
        ..TestResult::default()
    };
    for (clients, sets) in points {
        let spec = PointSpec {
            label: clients.to_string(),
            x: Some(clients as f64),
            clients,
            sets,
            connections_max: base(&context.options).connections_max,
            ..base_spec.clone()
        };
        let (point, checkpoints, _) =
            measure_point(context, &spec, later_repeat(&context.options), true, out).await?;
        note_checkpoints(&mut result, &point, checkpoints);
        result.points.push(point);
    }
    result.notes.push(format!(
        "{} of {} rows per sync type at every point; connection limit {}",
        context
            .options
            .sets
            .map_or(format!("{total_syncs} syncs"), |sets| format!(
                "{sets} sets of each point's clients' syncs"
            )),
        base_spec.rows,
        base(&context.options).connections_max
    ));
    Ok(result)
}

async fn test4(
    context: &mut RunContext,
    best: Option<usize>,
    out: &mut dyn std::io::Write,
) -> Result<TestResult> {
    let base_spec = base_spec(context, best);
    let (points, per_client) = test4_points(&context.options);
    let mut result = TestResult {
        test: 4,
        title: "Rows per sync at a constant total".into(),
        parameter: "Rows".into(),
        ..TestResult::default()
    };
    let mut empty = EmptySyncs::default();
    for (rows, sets) in points {
        let spec = PointSpec {
            label: rows.to_string(),
            x: Some(rows as f64),
            rows,
            sets,
            empty_sets: empty_sync_sets(context.options.size),
            ..base_spec.clone()
        };
        let (point, checkpoints, measured) =
            measure_point(context, &spec, later_repeat(&context.options), true, out).await?;
        note_checkpoints(&mut result, &point, checkpoints);
        empty = measured;
        result.points.push(point);
    }
    result.notes.push(format!(
        "{} per client per sync type at every point, {} clients",
        context
            .options
            .sets
            .map_or(format!("{per_client} rows"), |sets| format!("{sets} syncs")),
        base_spec.clients
    ));
    let seconds = match context.options.size {
        Size::Quick => PGBENCH_SECONDS_QUICK,
        Size::Standard | Size::Paper => PGBENCH_SECONDS,
    };
    let connections = base_spec.workers.connections();
    let dir = context.work_dir.path();
    let (db, admin) = (&context.options.db, &context.admin);
    let update = pgbench::single_row_update(admin, db, connections, seconds, dir).await?;
    let statements = pgbench::empty_sync_statements(db, connections, seconds, dir).await?;
    let rate = |phase: &Phase| phase.syncs_per_second();
    for (label, phase) in [("warm-up", &empty.warm_up), ("steady", &empty.steady)] {
        result.notes.push(format!(
            "empty syncs ({label}): {} in {:.3} s of server time = {:.0} syncs/s; / pgbench single-row UPDATE = {:.3}; / pgbench empty-sync statements = {:.2}",
            phase.syncs,
            phase.total_server_seconds,
            rate(phase),
            rate(phase) / update.transactions_per_second,
            rate(phase) / statements.transactions_per_second
        ));
    }
    result.notes.push(format!(
        "pgbench over {connections} connections for {seconds} s each: one single-row UPDATE per transaction {:.0} tps; a transaction of an empty sync's 9 statements one after the other (timing::pgbench::EMPTY_SYNC_SCRIPT) {:.0} tps",
        update.transactions_per_second, statements.transactions_per_second
    ));
    Ok(result)
}

/// Sets of empty syncs Test 4 times after the warm-up: each client's first sync also
/// opens connections and prepares statements, so the steady rate is measured apart.
fn empty_sync_sets(size: Size) -> usize {
    match size {
        Size::Quick => 20,
        Size::Standard => 5,
        Size::Paper => 2,
    }
}

async fn test5(
    context: &mut RunContext,
    best: Option<usize>,
    out: &mut dyn std::io::Write,
) -> Result<TestResult> {
    let base_spec = base_spec(context, best);
    let protocols = [
        Protocol::Tcp,
        Protocol::Tls(KeyKind::EcdsaP256),
        Protocol::Tls(KeyKind::Rsa2048),
        Protocol::Http,
        Protocol::Https(KeyKind::EcdsaP256),
        Protocol::Https(KeyKind::Rsa2048),
    ];
    let compressions = [Compression::None, Compression::Zlib, Compression::Zstd];
    let mut combinations: Vec<(Protocol, Compression)> = Vec::new();
    for compression in compressions {
        for protocol in protocols {
            let quick_skip = context.options.size == Size::Quick
                && compression != Compression::None
                && !matches!(
                    protocol,
                    Protocol::Tcp | Protocol::Https(KeyKind::EcdsaP256)
                );
            if !quick_skip {
                combinations.push((protocol, compression));
            }
        }
    }
    if context.options.protocol.is_some() || context.options.compression.is_some() {
        combinations.retain(|(p, c)| {
            context.options.protocol.is_none_or(|want| want == *p)
                && context.options.compression.is_none_or(|want| want == *c)
        });
    }
    let mut result = TestResult {
        test: 5,
        title: "Network protocols".into(),
        parameter: "Protocol".into(),
        ..TestResult::default()
    };
    for (protocol, compression) in combinations {
        let spec = PointSpec {
            protocol,
            compression,
            ..base_spec.clone()
        };
        let spec = PointSpec {
            label: spec.transport_label(),
            ..spec
        };
        let (point, checkpoints, _) =
            measure_point(context, &spec, later_repeat(&context.options), true, out).await?;
        note_checkpoints(&mut result, &point, checkpoints);
        result.points.push(point);
    }
    if context.options.size == Size::Quick {
        result
            .notes
            .push("quick size: zlib and zstd only over TCPIP and HTTPS:ECC".into());
    }
    result.notes.push("no FIPS-approved RSA: rustls with ring has no FIPS mode; HTTP is HTTP/1.1 or HTTP/2 as negotiated".into());
    Ok(result)
}

/// Test 6 (not the paper's): the farm. Test 1's base point with one server reached
/// directly, one server through HAProxy and `--farm-servers` servers (3) through
/// HAProxy, every server on the same database with the same workers, the three
/// alternated run by run so that the machine's noise falls on each alike.
async fn test6(
    context: &mut RunContext,
    best: Option<usize>,
    out: &mut dyn std::io::Write,
) -> Result<TestResult> {
    let base_spec = base_spec(context, best);
    let farm = context.options.farm_servers.unwrap_or(3);
    let one_proxied = Layout {
        servers: 1,
        proxy: true,
    };
    let layouts = [
        Layout::DIRECT,
        one_proxied,
        Layout {
            servers: farm,
            proxy: true,
        },
    ];
    let specs: Vec<PointSpec> = layouts
        .iter()
        .map(|&layout| PointSpec {
            label: layout.label(),
            layout,
            ..base_spec.clone()
        })
        .collect();
    let mut points: Vec<Point> = specs.iter().map(new_point).collect();
    // Best of several runs, as in Test 1: three layouts compared on one noisy machine.
    let repeat = base(&context.options).repeat;
    let checkpoints_before = checkpoints(&context.admin).await?;
    for run in 0..repeat {
        for (spec, point) in specs.iter().zip(points.iter_mut()) {
            let measured = run_point(context, spec, false).await?;
            record_run(point, measured, run, out)?;
        }
    }
    let checkpoints_during = checkpoints(&context.admin).await? - checkpoints_before;
    let limit = context.limit(&base_spec, repeat).await?;
    for point in &mut points {
        point.limit_seconds = Some(limit.seconds);
        point.limit_cpu = Some(limit.cpu);
    }
    let mut result = TestResult {
        test: 6,
        title: "A farm behind HAProxy".into(),
        parameter: "Servers".into(),
        points,
        ..TestResult::default()
    };
    if checkpoints_during > 0 {
        result.notes.push(format!(
            "PostgreSQL ran {checkpoints_during} checkpoint(s) during the timed syncs"
        ));
    }
    result
        .notes
        .push(farm_ratios(&result.points[2], &result.points[1]));
    for point in &result.points[1..] {
        result.notes.push(format!(
            "{}: syncs per server in the last run {:?}",
            point.label, point.syncs_per_server
        ));
    }
    result.notes.push(format!(
        "{} clients x {} rows x {} sets per sync type; best of {repeat} runs, the layouts alternated; every server with {} workers (the farm: {farm} x that many database connections); HAProxy's CPU counted as the server's",
        base_spec.clients, base_spec.rows, base_spec.sets, base_spec.workers.label()
    ));
    Ok(result)
}

/// The farm's throughput against one server's, both through HAProxy, per sync type
/// (above 1: the farm is faster).
fn farm_ratios(farm: &Point, one: &Point) -> String {
    let (farm_label, one_label) = (&farm.label, &one.label);
    let (farm, one) = (farm_best_with_sum(farm), farm_best_with_sum(one));
    let ratios: Vec<String> = SYNC_TYPES
        .iter()
        .chain(&["sum"])
        .zip(farm.iter().zip(one))
        .map(|(sync_type, pair)| match pair {
            (Some(farm), Some(one)) if *farm > 0.0 => format!("{sync_type} {:.2}", one / farm),
            _ => format!("{sync_type} -"),
        })
        .collect();
    format!(
        "throughput of {farm_label} against {one_label}: {}",
        ratios.join(", ")
    )
}

/// A point's best total server time per sync type, then their sum (None if any is).
fn farm_best_with_sum(point: &Point) -> [Option<f64>; 5] {
    let best = point.best_seconds();
    let sum = best.iter().copied().sum::<Option<f64>>();
    [best[0], best[1], best[2], best[3], sum]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(size: Size) -> BenchOptions {
        BenchOptions {
            db: String::new(),
            server_program: PathBuf::new(),
            size,
            tests: vec![3, 4],
            client_mode: ClientMode::Verify,
            results_dir: PathBuf::new(),
            clients: None,
            rows: None,
            sets: None,
            workers: None,
            connections_max: None,
            retry: None,
            protocol: None,
            compression: None,
            repeat: None,
            farm_servers: None,
        }
    }

    #[test]
    fn test3_varies_clients_at_a_constant_total_unless_overridden() {
        let standard = options(Size::Standard);
        let (points, total) = test3_points(&standard);
        assert_eq!(points, vec![(100, 10), (200, 5), (500, 2), (1000, 1)]);
        assert_eq!(total, 1000);
        let one_client = BenchOptions {
            clients: Some(1),
            ..standard.clone()
        };
        assert_eq!(test3_points(&one_client).0, vec![(1, 1000)]);
        let with_sets = BenchOptions {
            clients: Some(100),
            sets: Some(3),
            ..standard
        };
        assert_eq!(test3_points(&with_sets).0, vec![(100, 3)]);
    }

    #[test]
    fn test4_varies_rows_at_a_constant_total_unless_overridden() {
        let standard = options(Size::Standard);
        let (points, per_client) = test4_points(&standard);
        assert_eq!(points, vec![(100, 10), (250, 4), (500, 2), (1000, 1)]);
        assert_eq!(per_client, 1000);
        let rows = BenchOptions {
            rows: Some(10_000),
            ..standard.clone()
        };
        assert_eq!(test4_points(&rows).0, vec![(10_000, 1)]);
        let with_sets = BenchOptions {
            rows: Some(100),
            sets: Some(2),
            ..standard
        };
        assert_eq!(test4_points(&with_sets).0, vec![(100, 2)]);
    }

    #[test]
    fn test2_and_the_later_tests_take_every_override() {
        let quick = options(Size::Quick);
        assert_eq!(
            test2_points(&quick),
            Test2Points {
                clients: 16,
                low: 4,
                sets: 1,
                delays: vec![None, Some(0.0), Some(0.05)],
            }
        );
        assert_eq!(later_repeat(&quick), 1);
        let overridden = BenchOptions {
            clients: Some(40),
            connections_max: Some(8),
            sets: Some(3),
            retry: Some(Retry::Fixed(Duration::from_millis(250))),
            repeat: Some(3),
            ..quick
        };
        assert_eq!(
            test2_points(&overridden),
            Test2Points {
                clients: 40,
                low: 8,
                sets: 3,
                delays: vec![Some(0.25)],
            }
        );
        assert_eq!(later_repeat(&overridden), 3);
    }

    /// Issue 16: protocol v2 must not make the Purchase table's rows bigger. Every value
    /// of a Purchase row has the same tag and bytes in v1 and v2, so the figure is the
    /// one v1 gave: `cargo test -p rowsync-bench --lib purchase_rows -- --nocapture`.
    #[test]
    fn purchase_rows_take_as_many_bytes_on_the_v2_wire_as_on_v1() {
        let v2 = wire_bytes_per_row();
        let row = workload::row(0, 0, 0);
        let v1_row_bytes: usize = 2 + row.iter().map(|v| v.to_v1().encoded_len()).sum::<usize>();
        println!(
            "Purchase insert row on the wire: {v2:.1} bytes (v2), {v1_row_bytes} bytes (v1 forms)"
        );
        assert_eq!(v2, v1_row_bytes as f64);
        assert_eq!(v2, 125.0);
    }
}
