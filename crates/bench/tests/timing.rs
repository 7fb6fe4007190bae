//! `rowsync-bench timing` at quick size: all five tests run, every sync completes and moves
//! exactly its rows (the bench checks each sync, the timing table and the consolidated
//! database itself), and the results directory holds what the report promises. Speed is
//! not judged here.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use std::path::PathBuf;

use rowsync_bench::timing::clients::ClientMode;
use rowsync_bench::timing::results::{Point, SYNC_TYPES};
use rowsync_bench::timing::server::Workers;
use rowsync_bench::timing::{self as bench, BenchOptions, Size};

/// The `rowsync` binary the bench starts as its server under test: `ROWSYNC_BIN`, else
/// the one cargo built beside this test (`target/<profile>/rowsync`). It lives in another
/// package (rowsync-cli), so cargo does not build it for `cargo test -p rowsync-bench`
/// alone; `cargo test --workspace` (scripts/test) does, before any test runs.
fn rowsync_program() -> PathBuf {
    if let Some(path) = std::env::var_os("ROWSYNC_BIN") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("locating this test executable");
    // target/<profile>/deps/timing-<hash> -> target/<profile>/rowsync
    let program = test
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join(format!("rowsync{}", std::env::consts::EXE_SUFFIX)))
        .expect("this test runs from target/<profile>/deps");
    assert!(
        program.is_file(),
        "{} not found: build it first (`cargo build --bin rowsync`), run `cargo test \
         --workspace`, or set ROWSYNC_BIN to a rowsync binary",
        program.display()
    );
    program
}

fn options(url: String, results_dir: PathBuf, tests: Vec<u8>) -> BenchOptions {
    BenchOptions {
        db: url,
        server_program: rowsync_program(),
        size: Size::Quick,
        tests,
        client_mode: ClientMode::Verify,
        results_dir,
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

/// Every run of `point` has the four sync types in order, each with every client's syncs
/// of every set, each moving the point's rows.
fn assert_every_sync_moved_its_rows(point: &Point) {
    for phases in &point.runs {
        let types: Vec<&str> = phases.iter().map(|p| p.sync_type.as_str()).collect();
        assert_eq!(types, SYNC_TYPES);
        for phase in phases {
            let syncs = (point.clients * point.sets) as u64;
            assert_eq!(phase.syncs, syncs, "{} {}", point.label, phase.sync_type);
            assert_eq!(phase.rows, syncs * point.rows_per_sync as u64);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_five_tests_run_consistently_at_quick_size() {
    let url = rowsync_testkit::fresh_database("bench").await;
    let dir = tempfile::tempdir().unwrap();
    let results = dir.path().join("results");
    let mut out = Vec::new();
    let run = bench::run(options(url, results.clone(), vec![1, 2, 3, 4, 5]), &mut out)
        .await
        .unwrap();
    let printed = String::from_utf8(out).unwrap();
    assert_eq!(
        run.tests.iter().map(|t| t.test).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    for test in &run.tests {
        assert!(!test.points.is_empty(), "test {}", test.test);
        for point in &test.points {
            let limit = point.limit_seconds.expect("every point has its limit");
            assert!(limit.iter().all(|s| *s > 0.0), "{limit:?}");
            // The throwaway PostgreSQL runs here, so its CPU is measured for the limit
            // and for every phase, and the fair reference is computed.
            let limit_cpu = point.limit_cpu.expect("the limit's CPU");
            for cpu in &limit_cpu {
                assert!(cpu.database_seconds.is_some_and(|s| s > 0.0), "{cpu:?}");
            }
            let server_cpu: f64 = point
                .runs
                .iter()
                .flatten()
                .map(|phase| phase.server_cpu_seconds)
                .sum();
            assert!(server_cpu > 0.0, "{}: the server's CPU", point.label);
            let cpu_efficiency = point.cpu_efficiency();
            assert!(
                cpu_efficiency
                    .iter()
                    .all(|e| e.is_some_and(|e| e.is_finite() && e > 0.0)),
                "{} {cpu_efficiency:?}",
                point.label
            );
            assert!(point.server_peak_rss_bytes > 0);
            assert_every_sync_moved_its_rows(point);
            for phases in &point.runs {
                for phase in phases {
                    assert!(phase.total_server_seconds > 0.0);
                    assert!(phase.total_server_seconds <= phase.total_client_seconds);
                    assert!(phase.wire_bytes > 0);
                    // PostgreSQL's backends are read in nanoseconds; the server's
                    // threads only in 10 ms ticks, too coarse for one quick phase.
                    let cpu = phase.cpu.expect("a phase's CPU");
                    assert!(cpu.server_seconds >= 0.0, "{cpu:?}");
                    assert!(cpu.database_seconds.is_some_and(|s| s > 0.0), "{cpu:?}");
                    assert_eq!(cpu.server_seconds, phase.server_cpu_seconds);
                    if point.transport == "TCPIP" {
                        // Uncompressed, even a delete's key takes more than 10 bytes.
                        assert!(
                            phase.wire_bytes > phase.rows * 10,
                            "{} bytes for {} rows",
                            phase.wire_bytes,
                            phase.rows
                        );
                    }
                }
            }
        }
    }
    // Test 1 ran two repetitions per setting and the row-script reference.
    let test1 = &run.tests[0];
    assert!(test1.points.iter().all(|p| p.runs.len() == 2));
    let rows = test1.row_scripts.as_ref().expect("row scripts measured");
    assert_eq!(rows.runs[0].len(), 3, "update, delete, insert");
    // Test 2: above the connection limit clients were told busy and retried.
    let test2 = &run.tests[1];
    let low = test2.points[0].connections_max;
    assert!(low < test2.points[0].clients);
    assert!(test2
        .points
        .iter()
        .filter(|p| p.connections_max == low)
        .any(|p| p.runs[0].iter().any(|phase| phase.busy_retries > 0)));
    // Test 5 covered every transport.
    let labels: Vec<&str> = run.tests[4]
        .points
        .iter()
        .map(|p| p.label.as_str())
        .collect();
    for expected in [
        "TCPIP",
        "TLS:ECC",
        "TLS:RSA",
        "HTTP",
        "HTTPS:ECC",
        "HTTPS:RSA",
        "TCPIP + zlib",
        "TCPIP + zstd",
    ] {
        assert!(labels.contains(&expected), "{expected} in {labels:?}");
    }
    for file in [
        "results.json",
        "report.txt",
        "test1.svg",
        "test2.svg",
        "test3.svg",
        "test4.svg",
        "test5.svg",
    ] {
        let path = results.join(file);
        assert!(
            std::fs::metadata(&path)
                .map(|m| m.len() > 0)
                .unwrap_or(false),
            "{}",
            path.display()
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(json["tests"].as_array().unwrap().len(), 5);
    assert!(
        printed.contains("Efficiency = limit / rowsync"),
        "{printed}"
    );
    assert!(printed.contains("CPU efficiency = limit CPU"), "{printed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_clients_hold_exactly_their_partition_after_every_sync_type() {
    let url = rowsync_testkit::fresh_database("bench_sqlite").await;
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(url, dir.path().join("results"), vec![1]);
    options.client_mode = ClientMode::Sqlite;
    options.workers = Some(Workers::Fixed(2));
    options.repeat = Some(1);
    options.clients = Some(6);
    let mut out = Vec::new();
    // The bench checks each client's SQLite file against its partition after the
    // download, update, delete and insert phases, and fails the run otherwise.
    let run = bench::run(options, &mut out).await.unwrap();
    assert_eq!(run.client_mode, "sqlite");
    let point = &run.tests[0].points[0];
    assert_eq!(point.clients, 6);
    assert_eq!(
        point.runs[0][0].rows,
        (6 * point.rows_per_sync * point.sets) as u64
    );
}

/// Test 6: the same point through one server directly, one server behind HAProxy and a
/// farm of three behind HAProxy, all on one database. The bench checks every sync and
/// the consolidated database as in the other tests; here, that each layout moved every
/// row, that HAProxy spread the farm's syncs over all three servers, and that the
/// throughput ratio is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_farm_runs_behind_haproxy_beside_one_server() {
    let url = rowsync_testkit::fresh_database("bench_farm").await;
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(url, dir.path().join("results"), vec![6]);
    options.workers = Some(Workers::Fixed(2));
    let mut out = Vec::new();
    let run = bench::run(options, &mut out).await.unwrap();
    let printed = String::from_utf8(out).unwrap();
    let test = &run.tests[0];
    let labels: Vec<&str> = test.points.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(
        labels,
        ["1 server", "1 server via HAProxy", "3 servers via HAProxy"]
    );
    for point in &test.points {
        assert_eq!(
            point.runs.len(),
            2,
            "{}: quick size runs each layout twice",
            point.label
        );
        assert_every_sync_moved_its_rows(point);
        assert!(point.limit_seconds.is_some());
    }
    assert!(test.points[0].syncs_per_server.is_empty());
    // One run: the warm-up's empty syncs and the four sync types, each clients x sets.
    let one_run = (test.points[1].clients * (1 + 4 * test.points[1].sets)) as u64;
    assert_eq!(test.points[1].syncs_per_server, [one_run]);
    let farm = &test.points[2].syncs_per_server;
    assert_eq!(farm.len(), 3);
    assert_eq!(farm.iter().sum::<u64>(), one_run, "{farm:?}");
    assert!(
        farm.iter().all(|&syncs| syncs > 0),
        "HAProxy left a server idle: {farm:?}"
    );
    assert!(
        test.notes.iter().any(|note| note.starts_with(
            "throughput of 3 servers via HAProxy against 1 server via HAProxy: download "
        )),
        "{:?}",
        test.notes
    );
    assert!(
        printed.contains("Test 6: A farm behind HAProxy"),
        "{printed}"
    );
}
