//! `rowsync-bench transport` in quick mode: every transport x compression completes the
//! workload consistently (the bench checks each client against the consolidated
//! database) and compression shrinks the bytes on the wire; speed is not judged here.

use rowsync_bench::transport::{run, Link};
use rowsync_client::Compression;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_transport_runs_every_combination_in_quick_mode() {
    let mut out = Vec::new();
    let measurements = run(30, 1, &mut out).await.unwrap();
    assert_eq!(measurements.len(), Link::ALL.len() * Compression::ALL.len());
    for link in Link::ALL {
        let of = |compression| {
            measurements
                .iter()
                .find(|m| m.link == link && m.compression == compression)
                .unwrap()
        };
        let plain = of(Compression::None);
        for compression in [Compression::Zlib, Compression::Zstd] {
            let compressed = of(compression);
            assert!(
                compressed.wire.sent < plain.wire.sent,
                "{}: {} sent vs {} uncompressed",
                compressed.label(),
                compressed.wire.sent,
                plain.wire.sent
            );
        }
        assert!(plain.times.iter().all(|time| !time.is_zero()));
    }
    let printed = String::from_utf8(out).unwrap();
    assert!(printed.contains("relative to plain TCP"), "{printed}");
    assert!(printed.contains("HTTPS:RSA + zstd"), "{printed}");
}
