//! `rowsync demo`: a complete sync loop, on an embedded SQLite consolidated database by
//! default or on PostgreSQL or MySQL/MariaDB (`--db postgres://...`, `--db mysql://...`,
//! a scratch database: the demo drops and recreates its own tables there).
//!
//! Starts a server on a free loopback port, creates client databases for three users,
//! changes data on both sides (including one conflicting update), syncs, prints what
//! moved, and checks that every client holds exactly its user's partition. Optionally
//! measures a bulk upload and download.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::database::{Database, OnBackend};
use crate::local_server::LocalServer;
use anyhow::{bail, Context, Result};
use rowsync_client::{Client, SyncOptions, SyncReport};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;
use rowsync_server::{auth, ServerConfig};
use rusqlite::{params, Connection};

pub const USERS: [&str; 3] = ["alice", "bob", "carol"];
const BULK_USER: &str = "dave";
const SEED_ROWS_PER_USER: usize = 6;
const TABLE_DDL: &str = "CREATE TABLE orders (
    id VARCHAR(64) PRIMARY KEY,
    rep TEXT NOT NULL,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL,
    amount TEXT NOT NULL
)";

pub struct DemoOptions {
    /// The consolidated database: a `postgres://` or `mysql://` URL or a SQLite file path; a SQLite
    /// file in the demo's directory when `None`.
    pub db: Option<String>,
    pub clients: usize,
    pub bulk_rows: usize,
    /// Keep the databases here; a temporary directory otherwise.
    pub dir: Option<PathBuf>,
    pub out: Box<dyn Write + Send>,
}

#[derive(Debug, Clone)]
pub struct BulkReport {
    pub rows: usize,
    pub upload: Duration,
    pub download: Duration,
}

impl BulkReport {
    pub fn upload_rows_per_second(&self) -> f64 {
        self.rows as f64 / self.upload.as_secs_f64()
    }

    pub fn download_rows_per_second(&self) -> f64 {
        self.rows as f64 / self.download.as_secs_f64()
    }
}

#[derive(Debug, Clone)]
pub struct ClientTotals {
    pub name: String,
    pub user: String,
    pub report: SyncReport,
}

#[derive(Debug)]
pub struct DemoReport {
    pub clients: Vec<ClientTotals>,
    pub conflicts: u64,
    /// Every client holds exactly its partition of the consolidated database.
    pub agreement: bool,
    pub bulk: Option<BulkReport>,
}

fn password_of(user: &str) -> String {
    format!("demo-password-{user}")
}

struct DemoClient {
    name: String,
    user: &'static str,
    client: Client,
    totals: SyncReport,
}

pub async fn run(mut options: DemoOptions) -> Result<DemoReport> {
    if options.clients == 0 {
        bail!("the demo needs at least one client");
    }
    let temporary = tempfile::tempdir().context("creating a temporary directory")?;
    let dir = match &options.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            dir.clone()
        }
        None => temporary.path().to_path_buf(),
    };
    let result = match options.db.clone() {
        Some(db) => {
            let database = Database::parse(&db)?;
            let label = match &database {
                Database::Sqlite(_) => format!("SQLite file {db}"),
                other => format!("{} database (from --db)", other.kind()),
            };
            let demo = DemoOnBackend {
                label,
                dir: &dir,
                options: &mut options,
            };
            database.run(demo).await
        }
        None => {
            let path = dir.join("consolidated.db");
            remove_database(&path)?;
            let label = format!("SQLite file {}", path.display());
            run_on(SqliteConsolidated::new(path), label, &dir, &mut options).await
        }
    };
    drop(temporary);
    result
}

/// The demo on the backend `--db` named.
struct DemoOnBackend<'a> {
    label: String,
    dir: &'a Path,
    options: &'a mut DemoOptions,
}

impl OnBackend for DemoOnBackend<'_> {
    type Output = DemoReport;
    async fn run<B: Consolidated>(self, backend: B) -> Result<DemoReport> {
        run_on(backend, self.label, self.dir, self.options).await
    }
}

async fn run_on<B: Consolidated>(
    backend: B,
    label: String,
    dir: &Path,
    options: &mut DemoOptions,
) -> Result<DemoReport> {
    let mut admin = prepare_consolidated(&backend).await?;
    writeln!(options.out, "consolidated database: {label}")?;
    let server = LocalServer::start(backend, ServerConfig::default()).await?;
    let address = server.address.clone();
    writeln!(options.out, "server listening on {address}")?;
    let result = run_with_server(dir, &mut admin, &address, options).await;
    server.stop().await?;
    result
}

async fn run_with_server<C: ConsolidatedConnection>(
    dir: &Path,
    consolidated: &mut C,
    address: &str,
    options: &mut DemoOptions,
) -> Result<DemoReport> {
    let out = &mut options.out;
    let mut clients = Vec::new();
    for index in 0..options.clients {
        let user = USERS[index % USERS.len()];
        let name = format!("client-{index}");
        clients.push(DemoClient {
            client: open_client(&dir.join(format!("{name}.db")))?,
            name,
            user,
            totals: SyncReport::default(),
        });
    }

    writeln!(
        out,
        "\nround 1: first sync of {} clients (initial download)",
        clients.len()
    )?;
    clients = sync_all(clients, address, out).await?;

    make_changes_on_both_sides(&clients, consolidated, out).await?;

    writeln!(out, "\nround 2: sync with changes on both sides")?;
    clients = sync_all(clients, address, out).await?;
    writeln!(
        out,
        "\nround 3: sync again so devices of the same user see each other's changes"
    )?;
    clients = sync_all(clients, address, out).await?;

    let conflicts = print_totals(&clients, out)?;

    let agreement = check_agreement(&clients, consolidated, out).await?;

    let bulk = if options.bulk_rows > 0 {
        Some(run_bulk(dir, address, options.bulk_rows, consolidated, out).await?)
    } else {
        None
    };
    Ok(DemoReport {
        clients: clients
            .into_iter()
            .map(|demo| ClientTotals {
                name: demo.name,
                user: demo.user.to_string(),
                report: demo.totals,
            })
            .collect(),
        conflicts,
        agreement,
        bulk,
    })
}

/// Each client inserts, updates and deletes rows of its own; the office (the
/// consolidated database) changes one row a client also changes (a conflict), inserts
/// one and deletes one.
async fn make_changes_on_both_sides<C: ConsolidatedConnection>(
    clients: &[DemoClient],
    consolidated: &mut C,
    out: &mut Box<dyn Write + Send>,
) -> Result<()> {
    for (index, demo) in clients.iter().enumerate() {
        let sibling = index / USERS.len();
        make_client_changes(demo.client.connection(), demo.user, &demo.name, sibling)?;
    }
    // The server changes alice's first row, which client-0 (alice) also updates: a conflict.
    consolidated.execute_sql("UPDATE orders SET amount = '1000.000001', quantity = 500 WHERE id = (SELECT min(id) FROM orders WHERE rep = 'alice')").await?;
    consolidated
        .execute_sql(
            "INSERT INTO orders VALUES ('office-carol-1', 'carol', 'desk', 1, '349.990000')",
        )
        .await?;
    consolidated
        .execute_sql("DELETE FROM orders WHERE id = (SELECT max(id) FROM orders WHERE rep = 'bob')")
        .await?;
    writeln!(
        out,
        "changes made: each client inserts 3 rows, updates 1 and deletes 1; the office updates"
    )?;
    writeln!(out, "one of alice's rows (which client-0 also updates), inserts one for carol, deletes one of bob's")?;
    Ok(())
}

/// Prints each client's totals; returns the conflicts of all.
fn print_totals(clients: &[DemoClient], out: &mut Box<dyn Write + Send>) -> Result<u64> {
    writeln!(
        out,
        "\n{:<10} {:<6} {:>8} {:>10} {:>9}",
        "client", "user", "rows up", "rows down", "conflicts"
    )?;
    let mut conflicts = 0;
    for demo in clients {
        let totals = &demo.totals;
        conflicts += totals.conflicts;
        writeln!(
            out,
            "{:<10} {:<6} {:>8} {:>10} {:>9}",
            demo.name, demo.user, totals.rows_uploaded, totals.rows_downloaded, totals.conflicts
        )?;
    }
    Ok(conflicts)
}

/// Compares each client's rows with its user's partition of the consolidated database;
/// whether all agree.
async fn check_agreement<C: ConsolidatedConnection>(
    clients: &[DemoClient],
    consolidated: &mut C,
    out: &mut Box<dyn Write + Send>,
) -> Result<bool> {
    writeln!(
        out,
        "\nagreement check (each client against its partition of the consolidated database):"
    )?;
    let mut agreement = true;
    for demo in clients {
        let client_rows = read_orders(demo.client.connection())?;
        let partition = consolidated_orders(consolidated, demo.user).await?;
        let matches = client_rows == partition;
        agreement &= matches;
        writeln!(
            out,
            "  {:<10} {:<6} {:>4} rows, partition {:>4} rows: {}",
            demo.name,
            demo.user,
            client_rows.len(),
            partition.len(),
            if matches { "identical" } else { "DIFFERENT" }
        )?;
    }
    writeln!(
        out,
        "agreement: {}",
        if agreement { "OK" } else { "FAILED" }
    )?;
    Ok(agreement)
}

fn remove_database(path: &Path) -> Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let file = PathBuf::from(format!("{}{suffix}", path.display()));
        if file.exists() {
            std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
        }
    }
    Ok(())
}

/// Tables the demo owns; dropped and recreated on every run.
const DEMO_TABLES: [&str; 12] = [
    "orders",
    "rs_rowversion_orders",
    "rs_tombstone_orders",
    "rs_script",
    "rs_script_version",
    "rs_subscription",
    "rs_user",
    "rs_table",
    "rs_clock",
    "rs_counter",
    "rs_sync_lock",
    "rs_sync_in_flight",
];

/// A fresh demo schema: the demo's tables dropped, `orders` created and seeded,
/// initialized for sync, users added. Returns an administrative connection.
async fn prepare_consolidated<B: Consolidated>(backend: &B) -> Result<B::Connection> {
    let mut connection = backend.connect().await?;
    for table in DEMO_TABLES {
        connection
            .execute_sql(&format!("DROP TABLE IF EXISTS {table}"))
            .await?;
    }
    connection.execute_sql(TABLE_DDL).await?;
    let mut seed = Vec::new();
    for user in USERS {
        for n in 0..SEED_ROWS_PER_USER {
            seed.push(format!(
                "('office-{user}-seed-{n}', '{user}', '{item}', {quantity}, '{whole}.{fraction:06}')",
                item = ["pens", "paper", "chairs", "lamps", "cables", "mugs"][n % 6],
                quantity = (n + 1) * 10,
                whole = 100 + n * 7,
                fraction = n * 1234,
            ));
        }
    }
    connection
        .execute_sql(&format!("INSERT INTO orders VALUES {}", seed.join(", ")))
        .await?;
    connection.install_system_tables().await?;
    connection
        .init_table(&TableInit {
            table: "orders".into(),
            partition_column: "rep".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await?;
    for user in USERS.iter().chain([&BULK_USER]) {
        let password = password_of(user);
        let hash = tokio::task::spawn_blocking(move || auth::hash_password(&password))
            .await?
            .map_err(|error| anyhow::anyhow!("hashing a password: {error}"))?;
        connection.set_user(user, &hash).await?;
    }
    Ok(connection)
}

fn open_client(path: &Path) -> Result<Client> {
    remove_database(path)?;
    let mut client = Client::open(path)?;
    client.connection().execute_batch(TABLE_DDL)?;
    client.track("orders")?;
    Ok(client)
}

fn options_for(address: &str, user: &str) -> SyncOptions {
    SyncOptions::new(address, user, password_of(user))
}

/// Syncs every client at once and prints one line per client.
async fn sync_all(
    clients: Vec<DemoClient>,
    address: &str,
    out: &mut Box<dyn Write + Send>,
) -> Result<Vec<DemoClient>> {
    let mut tasks = tokio::task::JoinSet::new();
    let count = clients.len();
    for (index, mut demo) in clients.into_iter().enumerate() {
        let options = options_for(address, demo.user);
        tasks.spawn(async move {
            let result = demo.client.sync(&options).await;
            (index, demo, result)
        });
    }
    let mut done: Vec<Option<DemoClient>> = (0..count).map(|_| None).collect();
    let mut lines = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (index, mut demo, result) = joined.context("client task")?;
        let report =
            result.with_context(|| format!("{} ({}) failed to sync", demo.name, demo.user))?;
        lines.push((
            index,
            format!(
                "  {:<10} {:<6} up {:>4}  down {:>4}  conflicts {}  {:>6.1} ms",
                demo.name,
                demo.user,
                report.rows_uploaded,
                report.rows_downloaded,
                report.conflicts,
                report.elapsed.as_secs_f64() * 1000.0
            ),
        ));
        demo.totals.rows_uploaded += report.rows_uploaded;
        demo.totals.rows_downloaded += report.rows_downloaded;
        demo.totals.conflicts += report.conflicts;
        demo.totals.elapsed += report.elapsed;
        done[index] = Some(demo);
    }
    lines.sort();
    for (_, line) in lines {
        writeln!(out, "{line}")?;
    }
    Ok(done
        .into_iter()
        .map(|demo| demo.expect("every task returned"))
        .collect())
}

fn make_client_changes(
    connection: &Connection,
    user: &str,
    name: &str,
    sibling: usize,
) -> Result<()> {
    let ids: Vec<String> = connection
        .prepare("SELECT id FROM orders ORDER BY id")?
        .query_map([], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    for n in 0..3 {
        connection.execute(
            "INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                format!("{name}-new-{n}"),
                user,
                "staplers",
                n + 1,
                format!("{}.500000", 10 + n)
            ],
        )?;
    }
    // Siblings (clients of the same user) touch different rows.
    if let Some(id) = ids.get(sibling * 2) {
        connection.execute(
            "UPDATE orders SET quantity = quantity + 1, item = item || ' (revised)' WHERE id = ?1",
            [id],
        )?;
    }
    if let Some(id) = ids.get(sibling * 2 + 1) {
        connection.execute("DELETE FROM orders WHERE id = ?1", [id])?;
    }
    Ok(())
}

/// One user's partition of the consolidated `orders`, ordered by id.
async fn consolidated_orders<C: ConsolidatedConnection>(
    consolidated: &mut C,
    user: &str,
) -> Result<Vec<Vec<Value>>> {
    // `user` is one of the demo's own constant names, never input.
    Ok(consolidated
        .query_sql(&format!(
            "SELECT id, rep, item, quantity, amount FROM orders WHERE rep = '{user}' ORDER BY id"
        ))
        .await?)
}

/// A client's whole `orders` table, ordered by id.
fn read_orders(connection: &Connection) -> Result<Vec<Vec<Value>>> {
    let mut statement =
        connection.prepare("SELECT id, rep, item, quantity, amount FROM orders ORDER BY id")?;
    let rows = statement
        .query_map([], |row| {
            (0..5)
                .map(|i| row.get::<_, Value>(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

async fn run_bulk<C: ConsolidatedConnection>(
    dir: &Path,
    address: &str,
    rows: usize,
    consolidated: &mut C,
    out: &mut Box<dyn Write + Send>,
) -> Result<BulkReport> {
    writeln!(out, "\nbulk: {rows} rows inserted on one client of {BULK_USER}, uploaded, then downloaded by a new client")?;
    let mut uploader = open_client(&dir.join("bulk-upload.db"))?;
    {
        let transaction = uploader.connection().unchecked_transaction()?;
        {
            let mut insert =
                transaction.prepare("INSERT INTO orders VALUES (?1, ?2, ?3, ?4, ?5)")?;
            for n in 0..rows {
                insert.execute(params![
                    format!("bulk-{n:09}"),
                    BULK_USER,
                    "bulk item with a description of typical length",
                    (n % 100) as i64,
                    format!("{}.{:06}", n, n % 1_000_000),
                ])?;
            }
        }
        transaction.commit()?;
    }
    let options = options_for(address, BULK_USER);
    let upload = uploader.sync(&options).await?;
    if upload.rows_uploaded != rows as u64 {
        bail!(
            "bulk upload sent {} rows, expected {rows}",
            upload.rows_uploaded
        );
    }
    let mut downloader = open_client(&dir.join("bulk-download.db"))?;
    let download = downloader.sync(&options).await?;
    let held: i64 =
        downloader
            .connection()
            .query_row("SELECT count(*) FROM orders", [], |row| row.get(0))?;
    let stored = match consolidated
        .query_sql(&format!(
            "SELECT count(*) FROM orders WHERE rep = '{BULK_USER}'"
        ))
        .await?
        .first()
        .and_then(|row| row.first())
    {
        Some(Value::Int(count)) => *count,
        other => bail!("counting the bulk rows gave {other:?}"),
    };
    if held != rows as i64 || stored != rows as i64 || download.rows_downloaded != rows as u64 {
        bail!("bulk check failed: consolidated holds {stored}, the new client {held}, expected {rows}");
    }
    let report = BulkReport {
        rows,
        upload: upload.elapsed,
        download: download.elapsed,
    };
    writeln!(
        out,
        "  upload:   {rows} rows in {:>7.3} s = {:>9.0} rows/s (client log read, send, server apply, commit)",
        report.upload.as_secs_f64(),
        report.upload_rows_per_second()
    )?;
    writeln!(
        out,
        "  download: {rows} rows in {:>7.3} s = {:>9.0} rows/s (server fetch, send, client apply, commit)",
        report.download.as_secs_f64(),
        report.download_rows_per_second()
    )?;
    Ok(report)
}
