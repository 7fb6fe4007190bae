//! `rowsync-bench store` at its quick size: every mode and table, every phase and both
//! thread counts finish with the records they should hold (the bench checks counts),
//! the tracked runs sync without a conflict, and the tables and plots are written.
//! Speed is not judged here.

use rowsync_bench::store::{self, kv::Phase, Mode, StoreOptions, StoreSize};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_store_runs_every_mode_at_quick_size() {
    let directory = tempfile::tempdir().unwrap();
    let results_directory = directory.path().join("results");
    let options = StoreOptions {
        size: StoreSize::quick(),
        modes: Mode::all(),
        directory: directory.path().to_path_buf(),
        results: Some(results_directory.clone()),
    };
    let mut out = Vec::new();
    let results = store::run(&options, &mut out).await.unwrap();
    let printed = String::from_utf8(out).unwrap();
    for mode in Mode::all() {
        for tracked in [false, true] {
            for phase in Phase::ALL {
                let point = results
                    .kv
                    .iter()
                    .find(|p| {
                        p.mode == mode && p.tracked == tracked && p.threads == 1 && p.phase == phase
                    })
                    .unwrap_or_else(|| panic!("{mode:?} {tracked} {phase:?} missing"));
                assert!(point.records_per_second[0] > 0.0);
                // The sync after each write phase of a tracked single-threaded run.
                let synced = tracked && phase != Phase::Fetch;
                assert_eq!(point.upload_ms.len(), usize::from(synced), "{point:?}");
            }
        }
        assert!(printed.contains(&mode.label()), "{printed}");
    }
    assert!(results.tpcb.iter().all(|p| p.tps[0] > 0.0));
    assert!(printed.contains("TDS SYNC (full)"), "{printed}");
    for file in [
        "results.json",
        "report.txt",
        "store-one-thread.svg",
        "store-tpcb.svg",
        "store-upload.svg",
        "store-threads-full.svg",
    ] {
        let content = std::fs::read_to_string(results_directory.join(file)).unwrap();
        assert!(!content.is_empty(), "{file}");
    }
    let svg = std::fs::read_to_string(results_directory.join("store-tpcb.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tracked"), "{svg}");
}
