//! `rowsync-bench link`'s database link at the quick size: a toxiproxy in front of a
//! throwaway PostgreSQL, the backlog applied on one stream and over four, every row
//! landed (the bench checks the count after each run); speed is not judged here.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_link_database_runs_in_quick_mode() {
    let url = rowsync_testkit::fresh_database("bench_link").await;
    let options = rowsync_bench::link_database::DatabaseLinkOptions::quick();
    let mut out = Vec::new();
    let results = rowsync_bench::link_database::run(&url, &options, &mut out)
        .await
        .unwrap();
    let streams: Vec<usize> = results.iter().map(|result| result.streams).collect();
    assert_eq!(streams, options.streams);
    assert!(results
        .iter()
        .all(|result| result.changes == options.changes));
    let table = rowsync_bench::link_database::markdown(&options, &results);
    assert!(table.contains("| 4 |"), "{table}");
    let printed = String::from_utf8(out).unwrap();
    assert!(printed.contains("commands/s"), "{printed}");
}
