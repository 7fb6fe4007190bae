//! `rowsync-bench shared` in quick mode: every first sync downloads the whole shared
//! table in both configurations, and the kept rows are read from the database once
//! per cursor; speed is not judged here.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_shared_runs_consistently_in_quick_mode() {
    let url = rowsync_testkit::fresh_database("bench").await;
    let options = rowsync_bench::shared::SharedOptions {
        clients: 40,
        rows: 500,
        concurrency: 4,
        rounds: 1,
    };
    let mut out = Vec::new();
    let measured = rowsync_bench::shared::run(&url, &options, &mut out)
        .await
        .unwrap();
    assert_eq!(measured[0].database_reads, 80, "two cursors per sync");
    assert!(
        measured[1].database_reads < 80,
        "kept rows serve the others: {}",
        measured[1].database_reads
    );
    let printed = String::from_utf8(out).unwrap();
    assert!(
        printed.contains("read once against read by every sync"),
        "{printed}"
    );
}
