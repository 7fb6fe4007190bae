//! `rowsync-bench link` in quick mode: every bandwidth x compression x spread completes
//! with every change applied (the bench checks each report), the bytes on the wire
//! bound the time from below, and a cut upload and a cut download are retried to
//! completion.

use rowsync_bench::link::{run, LinkOptions};
use rowsync_client::Compression;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_link_runs_in_quick_mode() {
    let options = LinkOptions::sized("quick").unwrap();
    let mut out = Vec::new();
    let results = run(&options, &mut out).await.unwrap();
    let printed = String::from_utf8(out).unwrap();
    let client = &results.client;
    assert_eq!(client.backlogs.len(), 2 * 2 * 2, "{printed}");
    for m in &client.backlogs {
        // No sync beats its wire limit (the link's bandwidth holds).
        assert!(m.ratio() >= 0.95, "{printed}");
        if m.compression == Compression::Zstd {
            let plain = client
                .backlogs
                .iter()
                .find(|p| {
                    p.kbit == m.kbit && p.clients == m.clients && p.compression == Compression::None
                })
                .unwrap();
            assert!(m.wire.sent < plain.wire.sent, "{printed}");
        }
    }
    // Two cuts of the upload and two of a download per one-client backlog; each retry
    // completed (checked by the bench).
    assert_eq!(client.cuts.len(), 2 * 2 * 2 * 2, "{printed}");
    // Uncompressed, what crossed the link before the cut was held and resumed (with zstd
    // the quick upload is less than one compressed block: nothing inflates before it ends).
    for cut in client
        .cuts
        .iter()
        .filter(|c| c.compression == Compression::None)
    {
        assert!(cut.resumed > 0, "{printed}");
        if cut.transfer() == "download" {
            // The client kept every byte that came down: the retry cost its own hello
            // and a few frames, not the download.
            assert!(cut.extra_bytes() < 1_000, "{printed}");
        }
    }
    assert!(printed.contains("x limit"), "{printed}");
    println!("{printed}");
}
