//! `rowsync-bench logins` in quick mode: every sync of both servers completes and the
//! report names the ratio; speed is not judged here.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_logins_runs_in_quick_mode() {
    let options = rowsync_bench::logins::LoginsOptions {
        clients: 8,
        syncs_per_client: 2,
        rounds: 1,
    };
    let mut out = Vec::new();
    let measured = rowsync_bench::logins::run(&options, &mut out)
        .await
        .unwrap();
    assert_eq!(measured.map(|entry| entry.syncs), [16, 16]);
    let printed = String::from_utf8(out).unwrap();
    assert!(
        printed.contains("session tokens against a password check every sync"),
        "{printed}"
    );
}
