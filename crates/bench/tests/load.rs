//! `rowsync-bench load` in quick mode: every run completes with every row applied (the
//! bench checks the count after each run); speed is not judged here.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_load_runs_consistently_in_quick_mode() {
    let url = rowsync_testkit::fresh_database("load").await;
    let options = rowsync_bench::load::LoadOptions {
        clients: 8,
        rows_per_client: 50,
        runs: 2,
        fixed_workers: vec![1, 2],
        workers_range: (1, 4),
        connections_low: 2,
    };
    let mut out = Vec::new();
    let series = rowsync_bench::load::run(&url, &options, &mut out)
        .await
        .unwrap();
    let labels: Vec<&str> = series.iter().map(|s| s.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "workers 1",
            "workers 2",
            "workers 1-4 (auto)",
            labels[3],
            labels[4]
        ]
    );
    assert!(series
        .iter()
        .all(|s| s.seconds.len() == 2 && s.best() > 0.0));
    assert!(
        series[3].busy_retries > 0,
        "8 clients over 2 slots are told busy"
    );
    let printed = String::from_utf8(out).unwrap();
    assert!(
        printed.contains("above the connection limit / limit raised"),
        "{printed}"
    );
}
