//! The conformance suite against the PostgreSQL backend: a throwaway cluster (see
//! `rowsync-testkit`), a fresh database per test.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod conformance;

use conformance::{Factory, RawSql};
use rowsync_consolidated::postgres::value::Read;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_protocol::Value;
use tokio_postgres::{Client, NoTls};

struct PostgresFactory;

struct PostgresSql {
    client: Client,
    /// Held for the whole test: see `rowsync_testkit::exclusive`.
    _exclusive: tokio::sync::OwnedMutexGuard<()>,
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
    tokio::spawn(connection);
    client
}

impl Factory for PostgresFactory {
    type Backend = PostgresConsolidated;
    type Sql = PostgresSql;

    /// PostgreSQL's own wait: a day's sleep.
    fn endless_query() -> &'static str {
        "SELECT pg_sleep(86400)"
    }

    fn widen_to_bigint(table: &str, columns: &[&str]) -> Option<String> {
        let changes: Vec<String> = columns
            .iter()
            .map(|column| format!("ALTER COLUMN {column} TYPE BIGINT"))
            .collect();
        // A key column's type cannot change under the trigger whose WHEN names it; init
        // makes it again (docs/schema-changes.md).
        Some(format!(
            "DROP TRIGGER rs_moved_{table} ON {table}; ALTER TABLE {table} {}",
            changes.join(", ")
        ))
    }

    fn with_apply_streams(
        backend: &PostgresConsolidated,
        settings: rowsync_consolidated::ApplyStreamSettings,
    ) -> PostgresConsolidated {
        backend.with_other_apply_streams(settings)
    }

    async fn create() -> (PostgresConsolidated, PostgresSql) {
        let exclusive = rowsync_testkit::exclusive().await;
        let url = rowsync_testkit::fresh_database("conformance").await;
        (
            PostgresConsolidated::new(&url),
            PostgresSql {
                client: connect(&url).await,
                _exclusive: exclusive,
            },
        )
    }
}

impl RawSql for PostgresSql {
    async fn execute(&mut self, sql: &str) {
        self.client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
    }

    async fn query_rows(&mut self, sql: &str) -> Vec<Vec<Value>> {
        let rows = self
            .client
            .query(sql, &[])
            .await
            .unwrap_or_else(|error| panic!("{sql}: {error:?}"));
        rows.iter()
            .map(|row| (0..row.len()).map(|i| row.get::<_, Read>(i).0).collect())
            .collect()
    }
}

conformance::conformance_suite!(PostgresFactory);

/// Like [`PostgresFactory`], with every statement of the database logged.
struct LoggingPostgresFactory;

impl Factory for LoggingPostgresFactory {
    type Backend = PostgresConsolidated;
    type Sql = PostgresSql;

    fn with_apply_streams(
        backend: &PostgresConsolidated,
        settings: rowsync_consolidated::ApplyStreamSettings,
    ) -> PostgresConsolidated {
        backend.with_other_apply_streams(settings)
    }

    async fn create() -> (PostgresConsolidated, PostgresSql) {
        let (backend, sql) = PostgresFactory::create().await;
        sql.client
            .batch_execute(
                "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET log_statement = %L', current_database(), 'all'); END $$",
            )
            .await
            .expect("log every statement of this database");
        (backend, sql)
    }
}

/// The server log's records (a line with the log prefix and its continuation lines).
fn log_records(log: &str) -> Vec<String> {
    let mut records: Vec<String> = Vec::new();
    for line in log.lines() {
        let starts_record = line.len() > 4 && line[..4].chars().all(|c| c.is_ascii_digit());
        match records.last_mut() {
            Some(record) if !starts_record => {
                record.push('\n');
                record.push_str(line);
            }
            _ => records.push(line.to_string()),
        }
    }
    records
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_parameters_reach_the_statement_log_only_as_bound_values() {
    let log_file = rowsync_testkit::postgres()
        .log_file()
        .expect("this test reads the throwaway cluster's log; unset ROWSYNC_TEST_POSTGRES_URL");
    conformance::hostile_values_in_every_parameter_are_data_not_sql::<LoggingPostgresFactory>()
        .await;
    let log = std::fs::read_to_string(&log_file).expect("read the server log");
    let records = log_records(&log);
    let mut bound = 0;
    for payload in conformance::PAYLOADS {
        for record in records.iter().filter(|record| record.contains(payload)) {
            assert!(
                record.contains("DETAIL:  parameters:"),
                "a hostile value appears in a statement's text, not as a bound parameter:\n{record}"
            );
            bound += 1;
        }
    }
    assert!(
        bound >= conformance::PAYLOADS.len(),
        "the statement log must show the hostile values as bound parameters ({bound} records)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_its_column_cannot_take_is_refused_by_column_and_nothing_applies() {
    conformance::a_value_its_column_cannot_take_is_refused_by_column_and_nothing_applies::<
        PostgresFactory,
    >()
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_administrator_shutdown_inside_a_cursor_is_a_database_error() {
    conformance::an_administrator_shutdown_inside_a_cursor_is_a_database_error::<PostgresFactory>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_applied_before_is_rechecked_by_key() {
    conformance::an_upload_applied_before_is_rechecked_by_key::<PostgresFactory>().await;
}

/// Issue 15, finding 2, measured: the figure the issue asks for (before the re-check
/// went by key, 1,000 rows took 18 s and 200,000 about an hour).
/// `cargo test -p rowsync-consolidated --test postgres -- --ignored --nocapture resend`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of a 200,000-row resend, run by hand"]
async fn a_200_000_row_resend_against_a_400_000_row_partition() {
    let resend =
        conformance::resend_of_an_applied_upload::<PostgresFactory>(400_000, 200_000).await;
    println!(
        "resend of 200,000 rows against a 400,000-row partition: {:.2} s, {} rows read by sequential scans",
        resend.elapsed.as_secs_f64(),
        resend.read_by_sequential_scans
    );
}

/// Issue 31: a foreign key declared on a partitioned table (`payment`, by range of its
/// key) orders the upload as a plain table's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_uploads_after_the_table_it_references() {
    let partitioned = conformance::PAYMENT_DDL.to_string()
        + " PARTITION BY RANGE (payment_id);
           CREATE TABLE payment_low PARTITION OF payment FOR VALUES FROM (MINVALUE) TO (100);
           CREATE TABLE payment_high PARTITION OF payment FOR VALUES FROM (100) TO (MAXVALUE)";
    conformance::uploads_in_foreign_key_order::<PostgresFactory>(&partitioned).await;
}

const STORE_DDL: &str =
    "CREATE TABLE store (store_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, manager_id INTEGER)";

/// `staff` references `store` (DEFERRABLE) and `store` references `staff` (`deferrable`
/// or not): a cycle.
fn store_and_staff_ddl(deferrable: &str) -> [String; 3] {
    [
        STORE_DDL.into(),
        "CREATE TABLE staff (staff_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, store_id INTEGER, \
         CONSTRAINT staff_store_fkey FOREIGN KEY (store_id) REFERENCES store (store_id) DEFERRABLE)"
            .into(),
        format!(
            "ALTER TABLE store ADD CONSTRAINT store_manager_fkey \
             FOREIGN KEY (manager_id) REFERENCES staff (staff_id) {deferrable}"
        ),
    ]
}

/// A cycle whose every key is DEFERRABLE (initially immediate: the sync defers them
/// itself with `SET CONSTRAINTS ... DEFERRED`) is accepted and syncs in one upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_of_deferrable_foreign_keys_is_deferred_for_the_sync() {
    let ddl = store_and_staff_ddl("DEFERRABLE");
    let ddl: Vec<&str> = ddl.iter().map(String::as_str).collect();
    conformance::a_cycle_of_deferrable_keys_syncs_in_one_transaction::<PostgresFactory>(&ddl).await;
}

/// A cycle with a key that is not DEFERRABLE is refused at `init`, naming it and the
/// statement that fixes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_with_a_key_that_is_not_deferrable_is_refused_at_init() {
    let ddl = store_and_staff_ddl("");
    let ddl: Vec<&str> = ddl.iter().map(String::as_str).collect();
    conformance::a_cycle_of_keys_that_cannot_wait_is_refused_at_init::<PostgresFactory>(
        &ddl,
        &[
            r#"tables ["staff", "store"] reference each other in a cycle of foreign keys"#,
            r#"not deferrable: "store_manager_fkey" of "store"."#,
            r#"ALTER TABLE "store" ALTER CONSTRAINT "store_manager_fkey" DEFERRABLE INITIALLY DEFERRED;"#,
        ],
    )
    .await;
}

/// Issue 16: `point` (which rowsync does not carry) is refused at `init` by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_of_a_type_rowsync_cannot_carry_is_refused_at_init_by_name() {
    conformance::a_column_of_a_type_rowsync_cannot_carry_is_refused_at_init_by_name::<
        PostgresFactory,
    >()
    .await;
}

/// Issue 17: the default cursors' `:echo_xid` names the upload's own writes, and only
/// when nothing else wrote to the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_xid_names_exactly_the_uploads_own_writes() {
    conformance::echo_xid_names_exactly_the_uploads_own_writes::<PostgresFactory>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_write_one_tombstone_batch_per_statement_and_partition() {
    conformance::deletes_write_one_tombstone_batch_per_statement_and_partition::<PostgresFactory>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_turns_an_older_tombstone_table_into_batches() {
    conformance::init_turns_an_older_tombstone_table_into_batches::<PostgresFactory>().await;
}

/// How often this connection has run statements that read `pg_attribute` as the
/// table-shape statement does (their prepared statements' plans, PostgreSQL 14 and
/// later).
async fn shape_reads(connection: &mut rowsync_consolidated::postgres::PostgresConnection) -> i64 {
    connection
        .client()
        .query_one(
            "SELECT COALESCE(sum(generic_plans + custom_plans), 0)::int8 FROM pg_prepared_statements \
             WHERE statement LIKE '%FROM pg_attribute a%'",
            &[],
        )
        .await
        .expect("count the shape statement's runs")
        .get(0)
}

/// Issue 17: a connection reads a table's shape once and keeps it across syncs until
/// the schema generation moves (any DDL but on temporary tables, any change of
/// `rs_table`); with the event triggers disabled it reads the shape at every sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_keeps_table_shapes_until_the_schema_changes() {
    use rowsync_consolidated::{
        sync_and_collect, Consolidated, ConsolidatedConnection, SyncRequest, TableInit,
    };
    let (backend, mut sql) = PostgresFactory::create().await;
    let mut connection = backend.connect().await.expect("connect");
    connection.install_system_tables().await.expect("install");
    sql.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, rep TEXT NOT NULL)")
        .await;
    connection
        .init_table(&TableInit {
            table: "orders".into(),
            partition_column: "rep".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await
        .expect("init");
    let generation = "SELECT generation FROM rs_schema_generation";
    let mut watermark = 0;
    let mut sequence = 0;
    // Statements init ran may match too: count from here.
    let reads_before = shape_reads(&mut connection).await;
    let mut reads_after_syncs = Vec::new();
    for step in [
        "",
        "",
        "ALTER TABLE orders ADD COLUMN note TEXT",
        "",
        "BEGIN; CREATE TEMP TABLE scratch ON COMMIT DROP AS SELECT * FROM orders; COMMIT",
        "",
        "ALTER EVENT TRIGGER rs_schema_changed DISABLE",
        "",
        "",
    ] {
        let before = sql.query_rows(generation).await;
        if !step.is_empty() {
            sql.execute(step).await;
        }
        let after = sql.query_rows(generation).await;
        let bumps = step.starts_with("ALTER TABLE");
        assert_eq!(
            before != after,
            bumps,
            "generation {before:?} -> {after:?} after {step:?}"
        );
        sequence += 1;
        let outcome = sync_and_collect(
            &mut connection,
            std::sync::Arc::new(SyncRequest {
                client_id: "c1".into(),
                user: "alice".into(),
                script_version: "v1".into(),
                last_download_watermark: watermark,
                upload_sequence: sequence,
                tables: Vec::new(),
                auth_parameters: Vec::new(),
                client_ids_per_user_max: None,
                transfer_id: None,
                check_identity: false,
                refused_rows_max: 0,
                key_ranges: None,
                sync_tables: Default::default(),
            }),
        )
        .await
        .expect("sync");
        watermark = outcome.watermark;
        reads_after_syncs.push(shape_reads(&mut connection).await - reads_before);
    }
    // Read at the first sync, again after ALTER TABLE, never for a temporary table, and
    // at every sync once the generation cannot be trusted.
    assert_eq!(reads_after_syncs, vec![1, 1, 2, 2, 2, 2, 3, 4, 5]);
}

/// Issue 17: a sync's statements run without parallel workers (a parallel tombstone
/// cursor spent more starting its worker than reading: 12-15 ms against 2-6 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_runs_without_parallel_workers() {
    let seen = conformance::what_a_sync_sees::<PostgresFactory>(
        "current_setting('max_parallel_workers_per_gather')",
    )
    .await;
    assert_eq!(seen, vec![vec![Value::Text("0".into())]]);
}

/// Issue 17: `upload_insert_fast` (docs/scripts.md): tried first, one INSERT when no key
/// conflicts, the checked script after a unique violation, conflicts as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_without_conflicts_runs_only_the_fast_form() {
    conformance::an_insert_without_conflicts_runs_only_the_fast_form::<PostgresFactory>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_with_existing_keys_falls_back_to_the_checked_script() {
    conformance::an_insert_with_existing_keys_falls_back_to_the_checked_script::<PostgresFactory>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_insert_reports_a_row_of_another_partition() {
    conformance::a_fast_insert_reports_a_row_of_another_partition::<PostgresFactory>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setting_upload_insert_removes_its_fast_form() {
    conformance::setting_upload_insert_removes_its_fast_form::<PostgresFactory>().await;
}

/// A TCP proxy in front of PostgreSQL that counts a connection's round trips: the
/// flights of bytes the client sends after an answer came back (statements sent at once,
/// pipelined, are one flight). Returns the URL through it and the count.
async fn round_trip_counting_proxy(
    url: &str,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config: tokio_postgres::Config = url.parse().expect("a PostgreSQL URL");
    let port = config.get_ports()[0];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_port = listener.local_addr().unwrap().port();
    let flights = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&flights);
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let server = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            // Whether the last bytes that passed were the server's (an answer).
            let answered = Arc::new(AtomicBool::new(true));
            let (answered_up, flights) = (Arc::clone(&answered), Arc::clone(&counted));
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = client_read.read(&mut buffer).await {
                    if read == 0 {
                        return;
                    }
                    // Counted before it is passed on: the answer comes only after.
                    if answered_up.swap(false, Ordering::SeqCst) {
                        flights.fetch_add(1, Ordering::SeqCst);
                    }
                    if server_write.write_all(&buffer[..read]).await.is_err() {
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                while let Ok(read) = server_read.read(&mut buffer).await {
                    // Marked before it is passed on: the client answers only after.
                    answered.store(true, Ordering::SeqCst);
                    if read == 0 || client_write.write_all(&buffer[..read]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let through = url.replacen(&format!(":{port}/"), &format!(":{proxy_port}/"), 1);
    assert_ne!(through, url, "the URL names port {port}");
    (through, flights)
}

/// Issues 17 and 20: an empty sync on a warm connection takes 5 round trips (BEGIN;
/// the client's lock with its subscription and the scripts' revision; the delete and
/// download cursors, sent at once; the subscription; COMMIT), each of which costs a
/// whole round trip when the database is far away. The scripts' revision is read with the lock, in the
/// sync's own transaction, and a script changed between syncs is still used by the
/// next one. On one thread, so that statements sent at once leave in one write (on
/// several, the connection's task may write the first before the second is queued,
/// and the proxy would count the answer between them as a round trip).
#[tokio::test(flavor = "current_thread")]
async fn an_empty_sync_on_a_warm_connection_takes_five_round_trips() {
    use rowsync_consolidated::{
        sync_and_collect, Consolidated, ConsolidatedConnection, ScriptEntry, SyncRequest, TableInit,
    };
    use std::sync::atomic::Ordering;
    let _exclusive = rowsync_testkit::exclusive().await;
    let database_url = rowsync_testkit::fresh_database("conformance").await;
    let backend = PostgresConsolidated::new(&database_url);
    let sql = connect(&database_url).await;
    let mut admin = backend.connect().await.expect("connect");
    admin.install_system_tables().await.expect("install");
    sql.batch_execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, rep TEXT NOT NULL); \
         CREATE TABLE event_log (detail TEXT NOT NULL)",
    )
    .await
    .expect("create the tables");
    admin
        .init_table(&TableInit {
            table: "orders".into(),
            partition_column: "rep".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await
        .expect("init");
    let (url, flights) = round_trip_counting_proxy(&database_url).await;
    let mut connection = PostgresConsolidated::new(&url)
        .connect()
        .await
        .expect("connect");
    let mut watermark = 0;
    let mut round_trips = Vec::new();
    for sequence in 1..=4 {
        if sequence == 4 {
            admin
                .set_script(&ScriptEntry {
                    script_version: "v1".into(),
                    table: String::new(),
                    event: "begin_synchronization".into(),
                    script: "INSERT INTO event_log (detail) VALUES (:user)".into(),
                })
                .await
                .expect("set a script");
        }
        let before = flights.load(Ordering::SeqCst);
        let outcome = sync_and_collect(
            &mut connection,
            std::sync::Arc::new(SyncRequest {
                client_id: "c1".into(),
                user: "alice".into(),
                script_version: "v1".into(),
                last_download_watermark: watermark,
                upload_sequence: sequence,
                tables: Vec::new(),
                auth_parameters: Vec::new(),
                client_ids_per_user_max: None,
                transfer_id: None,
                check_identity: false,
                refused_rows_max: 0,
                key_ranges: None,
                sync_tables: Default::default(),
            }),
        )
        .await
        .expect("sync");
        watermark = outcome.watermark;
        round_trips.push(flights.load(Ordering::SeqCst) - before);
    }
    eprintln!("round trips per sync: {round_trips:?}");
    // The first sync reads the version's scripts, prepares its statements and the table
    // shape; the fourth finds the scripts changed with the lock, loads them and starts
    // again.
    assert_eq!(
        round_trips[1..3],
        [5, 5],
        "round trips per sync: {round_trips:?}"
    );
    assert!(round_trips[3] > 5, "round trips per sync: {round_trips:?}");
    let logged: Vec<String> = sql
        .query("SELECT detail FROM event_log", &[])
        .await
        .expect("read the log")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(logged, ["alice"], "the changed scripts ran once");
}

/// Issue 17: the fast form's SAVEPOINT, INSERT and RELEASE go in one flight, so an
/// insert sync on a warm connection takes no more round trips with `upload_insert_fast`
/// (which it runs: its rows are written in a subtransaction) than with `upload_insert`
/// alone. On one thread, so the connection's task writes the three requests together
/// (on several, it may write the first before the others are queued, which the proxy
/// counts as a flight of its own although nothing waited).
#[tokio::test(flavor = "current_thread")]
async fn the_fast_form_costs_no_round_trip() {
    use rowsync_consolidated::{
        sync_and_collect, Consolidated, ConsolidatedConnection, SyncRequest, TableInit,
    };
    use rowsync_protocol::TableUpload;
    use std::sync::atomic::Ordering;
    let _exclusive = rowsync_testkit::exclusive().await;
    let database_url = rowsync_testkit::fresh_database("conformance").await;
    let backend = PostgresConsolidated::new(&database_url);
    let sql = connect(&database_url).await;
    let mut admin = backend.connect().await.expect("connect");
    admin.install_system_tables().await.expect("install");
    sql.batch_execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, rep TEXT NOT NULL)")
        .await
        .expect("create the table");
    admin
        .init_table(&TableInit {
            table: "orders".into(),
            partition_column: "rep".into(),
            script_version: Some("v1".into()),
            based_on: None,
        })
        .await
        .expect("init");
    let (url, flights) = round_trip_counting_proxy(&database_url).await;
    let mut connection = PostgresConsolidated::new(&url)
        .connect()
        .await
        .expect("connect");
    let mut watermark = 0;
    let mut round_trips = Vec::new();
    for sequence in 1..=6_u64 {
        if sequence == 4 {
            sql.batch_execute("DELETE FROM rs_script WHERE event = 'upload_insert_fast'")
                .await
                .expect("remove the fast form");
        }
        let inserts = (0..3)
            .map(|offset| {
                vec![
                    Value::Int(sequence as i64 * 10 + offset),
                    Value::Text("alice".into()),
                ]
            })
            .collect();
        let before = flights.load(Ordering::SeqCst);
        let outcome = sync_and_collect(
            &mut connection,
            std::sync::Arc::new(SyncRequest {
                client_id: "c1".into(),
                user: "alice".into(),
                script_version: "v1".into(),
                last_download_watermark: watermark,
                upload_sequence: sequence,
                tables: vec![TableUpload {
                    table: "orders".into(),
                    columns: vec!["id".into(), "rep".into()],
                    key_columns: vec!["id".into()],
                    inserts,
                    updates: Vec::new(),
                    deletes: Vec::new(),
                }],
                auth_parameters: Vec::new(),
                client_ids_per_user_max: None,
                transfer_id: None,
                check_identity: false,
                refused_rows_max: 0,
                key_ranges: None,
                sync_tables: Default::default(),
            }),
        )
        .await
        .expect("sync");
        assert_eq!(outcome.summary.conflicts, 0);
        watermark = outcome.watermark;
        round_trips.push(flights.load(Ordering::SeqCst) - before);
    }
    eprintln!("round trips per insert sync: {round_trips:?}");
    let in_subtransactions: Vec<bool> = sql
        .query(
            "SELECT xmin::text::bigint <> rs_xid % 4294967296 FROM orders WHERE id IN (30, 60) ORDER BY id",
            &[],
        )
        .await
        .expect("read how the rows were written")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        in_subtransactions,
        [true, false],
        "sync 3 ran the fast form, sync 6 upload_insert alone"
    );
    // Syncs 1 and 4 prepare their statements (4 also reloads the changed scripts).
    assert_eq!(
        round_trips[1..3],
        round_trips[4..6],
        "round trips per insert sync: {round_trips:?}"
    );
}
