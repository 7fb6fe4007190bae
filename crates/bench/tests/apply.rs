//! `rowsync-bench apply` in quick mode: every operation completes and is consistent
//! (the bench itself checks row counts after each one); speed is not judged here.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_apply_runs_consistently_in_quick_mode() {
    let url = rowsync_testkit::fresh_database("bench").await;
    let mut out = Vec::new();
    let measurements = rowsync_bench::apply::run(&url, 2_000, &mut out)
        .await
        .unwrap();
    let operations: Vec<&str> = measurements.iter().map(|m| m.operation).collect();
    assert_eq!(
        operations,
        [
            "upload insert",
            "upload update",
            "download",
            "upload delete",
            "insert, row scripts"
        ]
    );
    assert!(measurements
        .iter()
        .all(|m| m.rows == 2_000 && m.efficiency() > 0.0));
    let printed = String::from_utf8(out).unwrap();
    assert!(printed.contains("efficiency"), "{printed}");
    assert!(printed.contains("faster than row scripts"), "{printed}");
}
