//! Resumable transfers: an upload (protocol v3) or a download (v4) cut at any byte
//! offset, over a real link (toxiproxy's `limit_data` closes the connection after that
//! many bytes in one direction), goes on from where it stopped on the next attempt, also
//! on another server sharing the consolidated database; the data lands exactly once.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use rowsync_client::transport::{self, Transfer};
use rowsync_client::{Client, ClientError, Compression, SyncOptions, SyncReport};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_protocol::{encode_frame, ErrorCode, FrameDecoder, Message, FRAME_BYTES_MAX_DEFAULT};
use rowsync_server::metrics::{Metrics, Outcome};
use rowsync_server::{Endpoint, ServerConfig, Transport};
use rowsync_testkit::link::{Direction, Link, Toxiproxy};
use support::*;
use tokio::net::TcpListener;

/// Rows each round uploads: about 200 KB of frames, several frames long.
const ROWS_PER_ROUND: usize = 2500;

/// Inserts a round's rows (ids unique to the round) into alice's client.
fn insert_round(client: &Client, round: usize) {
    let connection = client.connection();
    connection.execute_batch("BEGIN").unwrap();
    for n in 0..ROWS_PER_ROUND {
        connection
            .execute(
                "INSERT INTO orders VALUES (?1, 'alice', ?2, ?3)",
                rusqlite::params![
                    format!("r{round:03}-{n:05}"),
                    format!("item {n:05} of round {round:03}, a line long enough to matter"),
                    n as i64
                ],
            )
            .unwrap();
    }
    connection.execute_batch("COMMIT").unwrap();
}

/// Syncs that ended so far. A cut upload ends unsuccessfully; a cut download may end
/// "ok" when every write had succeeded (its stream is then held for want of the
/// client's receipt).
fn ended(metrics: &Metrics) -> u64 {
    [
        Outcome::ok,
        Outcome::failed,
        Outcome::refused,
        Outcome::busy,
    ]
    .into_iter()
    .map(|outcome| metrics.syncs_ended(outcome))
    .sum()
}

/// The count of ended syncs once no sync is in progress: the syncs a client saw end
/// are all in it, even those whose server side ended after the client's.
async fn ended_when_idle(metrics: &Metrics) -> u64 {
    server_idle(metrics).await;
    ended(metrics)
}

/// Waits until the server has finished with a cut connection (held what it received):
/// its count of ended syncs passed `before`.
async fn server_done_with_cut(metrics: &Metrics, before: u64, client_saw: &str) {
    // At the latest after the server's read timeout (30 s).
    for _ in 0..4000 {
        if ended(metrics) > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the server never ended the cut sync ({} ended, {before} before; \
         {} syncs in progress, {} connections awaiting their hello, {} ended ok, {} busy; \
         the client saw: {client_saw})",
        ended(metrics),
        metrics.connections.get(),
        metrics.connections_awaiting_hello.get(),
        metrics.syncs_ended(Outcome::ok),
        metrics.syncs_ended(Outcome::busy)
    );
}

/// The data is right and exactly once: the consolidated partition equals the client's,
/// and holds every row of every round once.
fn assert_landed_once(server: &TestServer, client: &Client, rounds: usize) {
    assert_landed(server, client, rounds);
    assert_eq!(
        held_rows(server),
        0,
        "a transfer resumed whole is no longer held"
    );
}

fn assert_landed(server: &TestServer, client: &Client, rounds: usize) {
    let consolidated = server.consolidated_orders(Some("alice"));
    assert_eq!(consolidated.len(), 2 + rounds * ROWS_PER_ROUND);
    assert!(
        consolidated == client_orders(client),
        "client and server agree"
    );
}

fn held_rows(server: &TestServer) -> i64 {
    server
        .consolidated()
        .query_row("SELECT count(*) FROM rs_held_upload", [], |row| row.get(0))
        .unwrap()
}

/// Alice's client `name` over a new link to `server`: synchronized once, then round 1's
/// rows inserted (not yet uploaded).
async fn client_over_a_link(server: &TestServer, name: &str) -> (Link, SyncOptions, Client) {
    let link = Link::start(server.address).unwrap();
    let options = server.options_via(link.addr(), "alice");
    let mut client = server.client(name);
    client.sync(&options).await.unwrap();
    insert_round(&client, 1);
    (link, options, client)
}

/// One round: the upload is cut after `cut_at` bytes on the link, then synchronized
/// again without the cut (through `retry`, or the link). Returns the retry's report.
async fn cut_and_resume(
    server_metrics: &Metrics,
    link: &Link,
    client: &mut Client,
    options: &SyncOptions,
    retry: &SyncOptions,
    cut_at: u64,
) -> SyncReport {
    let cut = Cut {
        direction: Direction::Upstream,
        at: cut_at,
    };
    let report = cut_then_retry(server_metrics, link, client, options, retry, cut).await;
    assert!(!report.upload_already_applied);
    assert_eq!(report.rows_uploaded, ROWS_PER_ROUND as u64);
    report
}

/// The most bytes of a stream's start that are not the upload's: the hello (with the
/// session token of protocol 8, about 300 bytes) and `upload_resume`.
const HELLO_BYTES_MAX: u64 = 800;

/// Where a link is cut: after `at` bytes in `direction`.
#[derive(Clone, Copy)]
struct Cut {
    direction: Direction,
    at: u64,
}

/// A sync cut on the link as `cut` says, then synchronized again without the cut
/// (through `retry`, or the link), after the server ended the cut sync. Returns the
/// retry's report.
async fn cut_then_retry(
    server_metrics: &Metrics,
    link: &Link,
    client: &mut Client,
    options: &SyncOptions,
    retry: &SyncOptions,
    cut: Cut,
) -> SyncReport {
    link.cut_after(cut.direction, cut.at).unwrap();
    let before = ended_when_idle(server_metrics).await;
    eprintln!(
        "cutting {} at {} {:?}",
        options.address, cut.at, cut.direction
    );
    let failed = client
        .sync(options)
        .await
        .expect_err(&format!("a sync cut after {} bytes completed", cut.at));
    server_done_with_cut(server_metrics, before, &failed.to_string()).await;
    link.remove("limit_data", cut.direction).unwrap();
    client.sync(retry).await.unwrap()
}

/// 20 cuts across the upload's bytes over plain TCP, each resumed: uncompressed, what the
/// server held is exactly what crossed the link after the hello and `upload_resume`.
async fn cuts_across_the_upload(compression: Compression) {
    let server = TestServer::start().await;
    let link = Link::start(server.address).unwrap();
    let mut options = server.options_via(link.addr(), "alice");
    options.transport.compression = compression;
    let mut client = server.client(&format!("cut-{compression}"));
    client.sync(&options).await.unwrap();
    insert_round(&client, 0);
    let clean = client.sync(&options).await.unwrap();
    assert_eq!(clean.upload_bytes_resumed, 0);
    let full = clean.wire.sent;
    let mut resumed_total = 0;
    let cuts = 20;
    for k in 1..=cuts {
        let cut_at = full * k / (cuts + 1);
        insert_round(&client, k as usize);
        let report = cut_and_resume(
            &server.metrics,
            &link,
            &mut client,
            &options,
            &options,
            cut_at,
        )
        .await;
        let resumed = report.upload_bytes_resumed;
        resumed_total += resumed;
        if compression == Compression::None {
            // Everything past the hello and `upload_resume` (well under 800 bytes, the
            // hello's session token included) that
            // crossed the link was held and not sent again.
            assert!(
                resumed <= cut_at && resumed + HELLO_BYTES_MAX >= cut_at,
                "cut at {cut_at}: {resumed} bytes resumed"
            );
            assert!(
                report.wire.sent + cut_at <= full + 2_000,
                "cut at {cut_at}: the retry sent {} of {full}",
                report.wire.sent
            );
        }
        eprintln!(
            "{compression}: cut at {cut_at} of {full}: {resumed} bytes resumed, the retry sent {}",
            report.wire.sent
        );
        if k >= 5 {
            // A compressed upload is flushed every 32 KiB of its stream: past the first
            // few blocks, a cut always leaves something held.
            assert!(
                resumed > 0,
                "{compression}: a cut at {cut_at} of {full} resumed nothing"
            );
        }
    }
    assert!(resumed_total > 0, "{compression}: nothing was ever resumed");
    assert_landed_once(&server, &client, cuts as usize + 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_at_any_of_20_offsets_resumes_where_it_stopped() {
    cuts_across_the_upload(Compression::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_upload_cut_at_any_of_20_offsets_resumes() {
    cuts_across_the_upload(Compression::Zstd).await;
}

/// TLS, HTTP and HTTPS: cuts at a third and two thirds of the upload resume too.
///
/// HTTPS speaks HTTP/1.1 here. Over HTTP/2 the server grants a 1 MiB window, so the
/// whole 236 KB upload may be in flight at once: in 3 of 15 runs the cut connection's
/// request was dropped by the HTTP/2 layer before it reached the sync (the client saw a
/// broken pipe right after the TLS handshake, the server began no sync), and nothing
/// could be held. Such a cut costs no more than the bytes in flight, but they are most
/// of this small upload, so resumption is asserted where the stream is read as it
/// arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_resume_over_tls_http_and_https() {
    let server = TestServer::start().await;
    let toxiproxy = Toxiproxy::start().unwrap();
    let mut round = 0;
    for (via, upstream) in [
        (Via::Tls, server.tls_address),
        (Via::Http, server.http_address),
        (Via::HttpsHttp1, server.https_address),
    ] {
        let link = toxiproxy.proxy(upstream).unwrap();
        let mut options = server.options_over("alice", via, Compression::None);
        let real = upstream.to_string();
        options.address = options.address.replace(&real, &link.addr().to_string());
        let mut client = server.client(&format!("cut-{via:?}"));
        client.sync(&options).await.unwrap();
        round += 1;
        insert_round(&client, round);
        let full = client.sync(&options).await.unwrap().wire.sent;
        for third in [1, 2] {
            round += 1;
            insert_round(&client, round);
            let cut_at = full * third / 3;
            let report = cut_and_resume(
                &server.metrics,
                &link,
                &mut client,
                &options,
                &options,
                cut_at,
            )
            .await;
            assert!(
                report.upload_bytes_resumed > 0,
                "{via:?}: a cut at {cut_at} of {full} bytes resumed nothing"
            );
        }
    }
    let mut reader = server.client("reader");
    reader.sync(&server.options("alice")).await.unwrap();
    assert_landed_once(&server, &reader, round);
    server.stop().await;
}

/// A second server on the same consolidated database (plain TCP).
async fn second_server(
    server: &TestServer,
    config: ServerConfig,
) -> (SocketAddr, Arc<Metrics>, tokio::sync::oneshot::Sender<()>) {
    second_server_over(server, config, Transport::Tcp).await
}

/// A second server on the same consolidated database, on one transport.
async fn second_server_over(
    server: &TestServer,
    config: ServerConfig,
    transport: Transport,
) -> (SocketAddr, Arc<Metrics>, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let backend = SqliteConsolidated::new(&server.consolidated_path);
    let metrics = Arc::new(Metrics::new());
    let serving = Arc::clone(&metrics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        rowsync_server::serve_endpoints_with_metrics(
            vec![Endpoint {
                listener,
                transport,
            }],
            backend,
            config,
            serving,
            async {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap();
    });
    (address, metrics, stop)
}

/// Behind a load balancer the retry may reach another server: the held bytes are in the
/// consolidated database, so it goes on from there all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_server_resumes_from_the_shared_database() {
    let server = TestServer::start().await;
    let (other, other_metrics, stop) = second_server(&server, ServerConfig::default()).await;
    let (link, options, mut client) = client_over_a_link(&server, "roaming").await;
    let on_other = server.options_via(other, "alice");
    let full = 200_000;
    let report = cut_and_resume(
        &server.metrics,
        &link,
        &mut client,
        &options,
        &on_other,
        full / 2,
    )
    .await;
    assert!(report.upload_bytes_resumed + HELLO_BYTES_MAX >= full / 2);
    // The other server took the held start from the database.
    assert_eq!(
        other_metrics.upload_resumed_bytes.get(),
        report.upload_bytes_resumed
    );
    assert_landed_once(&server, &client, 1);
    let _ = stop.send(());
    server.stop().await;
}

/// A client whose upload differs from what the server holds of its transfer (its stored
/// upload changed between the attempts) starts the transfer again from 0; the data is
/// right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_upload_starts_its_transfer_again_from_zero() {
    let server = TestServer::start().await;
    let (link, options, mut client) = client_over_a_link(&server, "changed").await;
    link.cut_after(Direction::Upstream, 120_000).unwrap();
    let before = ended_when_idle(&server.metrics).await;
    let cut = client
        .sync(&options)
        .await
        .expect_err("the cut sync completed");
    server_done_with_cut(&server.metrics, before, &cut.to_string()).await;
    link.remove("limit_data", Direction::Upstream).unwrap();
    let held: i64 = server
        .consolidated()
        .query_row("SELECT length FROM rs_held_upload", [], |row| row.get(0))
        .unwrap();
    assert!(held > 100_000, "{held} bytes held");
    // The same rows in another order: another byte stream of the same upload.
    let frame: Vec<u8> = client
        .connection()
        .query_row(
            "SELECT frame FROM rs_client_inflight WHERE part = 1",
            [],
            |row| row.get(0),
        )
        .unwrap();
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    decoder.feed(&frame);
    let Some(Message::Upload(mut upload)) = decoder.next_message().unwrap() else {
        panic!("the stored upload's first frame is an upload");
    };
    upload.inserts.reverse();
    client
        .connection()
        .execute(
            "UPDATE rs_client_inflight SET frame = ?1 WHERE part = 1",
            [encode_frame(&Message::Upload(upload))],
        )
        .unwrap();
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.upload_bytes_resumed, 0);
    assert_eq!(report.rows_uploaded, ROWS_PER_ROUND as u64);
    assert_landed(&server, &client, 1);
    // The held start that did not match stays until the client's next cut replaces it
    // or it expires: released only by a resumption (one held transfer per client).
    assert_eq!(held_rows(&server), 1);
    server.stop().await;
}

/// A cut upload above `held_upload_bytes_max` is not held: the retry sends it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_above_the_hold_limit_is_not_held() {
    let server = TestServer::start_with(ServerConfig {
        held_upload_bytes_max: 50_000,
        ..ServerConfig::default()
    })
    .await;
    let (link, options, mut client) = client_over_a_link(&server, "too-large").await;
    let report = cut_and_resume(
        &server.metrics,
        &link,
        &mut client,
        &options,
        &options,
        100_000,
    )
    .await;
    assert_eq!(report.upload_bytes_resumed, 0);
    assert_eq!(server.metrics.uploads_held.get(), 0);
    assert_landed_once(&server, &client, 1);
    server.stop().await;
}

/// Held uploads older than `held_upload_expiry` go with the background cleanup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_uploads_expire() {
    let server = TestServer::start_with(ServerConfig {
        held_upload_expiry: Duration::ZERO,
        cleanup_interval: Duration::from_millis(50),
        ..ServerConfig::default()
    })
    .await;
    let (link, options, mut client) = client_over_a_link(&server, "expired").await;
    link.cut_after(Direction::Upstream, 100_000).unwrap();
    let before = ended_when_idle(&server.metrics).await;
    let cut = client
        .sync(&options)
        .await
        .expect_err("the cut sync completed");
    server_done_with_cut(&server.metrics, before, &cut.to_string()).await;
    assert_eq!(server.metrics.uploads_held.get(), 1);
    let count = || -> i64 {
        server
            .consolidated()
            .query_row("SELECT count(*) FROM rs_held_upload", [], |row| row.get(0))
            .unwrap()
    };
    for _ in 0..1000 {
        if count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(), 0, "the held upload expired");
    link.remove("limit_data", Direction::Upstream).unwrap();
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.upload_bytes_resumed, 0);
    assert_landed_once(&server, &client, 1);
    server.stop().await;
}

/// A resumption the server cannot serve (nothing held) is refused with code 14, and the
/// refusal names the transfer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_transfer_the_server_does_not_hold_is_refused_with_code_14() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut hello = hello_v3("alice");
    hello.client_id = "never-cut".into();
    let error = transport::exchange(transport::Exchange {
        address: &options.address,
        transport: &options.transport,
        hello,
        upload_frames: &[],
        upload_sequence: 1,
        frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        timeout: Duration::from_secs(10),
        acknowledge: None,
        transfer: Some(Transfer::Resume {
            transfer_id: "t-unknown".into(),
            offset: 100,
        }),
        download_resume: None,
        key_ranges: &[],
    })
    .await
    .unwrap_err();
    let ClientError::Server(wire) = &error else {
        panic!("expected the server's refusal, got {error}");
    };
    assert_eq!(wire.error_code(), Some(ErrorCode::TransferNotHeld));
    assert!(wire.message.contains("t-unknown"), "{}", wire.message);
    assert!(server.consolidated_orders(Some("alice")).len() == 2);
    server.stop().await;
}

fn hello_v3(user: &str) -> rowsync_protocol::Hello {
    rowsync_protocol::Hello {
        protocol_version: rowsync_protocol::PROTOCOL_VERSION,
        client_id: format!("raw-{user}"),
        user: user.into(),
        password: password(user),
        script_version: "v1".into(),
        last_download_watermark: 0,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    }
}

/// A server of protocol version 2 in front of the real one: it refuses a newer hello with
/// code 4, as such a server does, before reading anything after it; an older hello goes
/// through to the real server.
async fn version_2_server(upstream: SocketAddr) -> SocketAddr {
    older_server(upstream, 2).await
}

/// A server of protocol version `version_max` in front of the real one (see
/// [`version_2_server`]).
async fn older_server(upstream: SocketAddr, version_max: u16) -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut header = [0u8; 4];
                client.read_exact(&mut header).await.unwrap();
                let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
                client.read_exact(&mut body).await.unwrap();
                let Message::Hello(hello) = rowsync_protocol::decode_message(&body).unwrap() else {
                    panic!("the first frame is a hello");
                };
                if hello.protocol_version > version_max {
                    let refusal = rowsync_protocol::WireError::new(
                        ErrorCode::UnsupportedProtocolVersion,
                        format!(
                            "protocol version {} is not supported; this server speaks versions 1 to {version_max}",
                            hello.protocol_version
                        ),
                    );
                    let _ = client
                        .write_all(&encode_frame(&Message::Error(refusal)))
                        .await;
                    return;
                }
                let mut server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                server.write_all(&header).await.unwrap();
                server.write_all(&body).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    address
}

/// A client of this version meeting a server of version 2 speaks version 2 to it: the
/// sync completes (without resumable uploads), and again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v3_client_syncs_with_a_version_2_server() {
    let server = TestServer::start().await;
    let old = version_2_server(server.address).await;
    let options = server.options_via(old, "alice");
    let mut client = server.client("meets-old");
    client.sync(&options).await.unwrap();
    insert_round(&client, 1);
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.rows_uploaded, ROWS_PER_ROUND as u64);
    assert_eq!(report.upload_bytes_resumed, 0);
    assert_landed_once(&server, &client, 1);
    server.stop().await;
}

/// The client sees the cut as the server does and may ask at once: the question waits
/// for the server to finish holding what the cut left (issue 20's bench retried at once
/// and, before, found nothing held yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_at_once_finds_what_the_cut_left() {
    let server = TestServer::start().await;
    let (link, options, mut client) = client_over_a_link(&server, "impatient").await;
    link.cut_after(Direction::Upstream, 150_000).unwrap();
    assert!(client.sync(&options).await.is_err());
    link.remove("limit_data", Direction::Upstream).unwrap();
    let report = client.sync(&options).await.unwrap();
    assert!(
        report.upload_bytes_resumed + HELLO_BYTES_MAX >= 150_000,
        "{} bytes resumed",
        report.upload_bytes_resumed
    );
    assert_landed_once(&server, &client, 1);
    server.stop().await;
}

// Resumable downloads (protocol v4).

/// Alice's rows reach the server from a writer client: the next download of every
/// other client of alice carries them.
async fn write_round(server: &TestServer, writer: &mut Client, round: usize) {
    insert_round(writer, round);
    writer.sync(&server.options("alice")).await.unwrap();
}

/// One row of the downloading client's own, so its sync has an upload too.
fn insert_own_row(client: &Client, round: usize) {
    client
        .connection()
        .execute(
            "INSERT INTO orders VALUES (?1, 'alice', 'own row', 1)",
            [format!("own-{round:03}")],
        )
        .unwrap();
}

fn held_download_rows(server: &TestServer) -> i64 {
    server
        .consolidated()
        .query_row("SELECT count(*) FROM rs_held_download", [], |row| {
            row.get(0)
        })
        .unwrap()
}

/// The downloading client holds what the server holds for alice, as an uncut sync
/// would have left it.
fn assert_same_as_server(server: &TestServer, client: &Client) {
    assert!(
        server.consolidated_orders(Some("alice")) == client_orders(client),
        "client and server agree"
    );
}

/// A client behind a link, a writer beside it, both synchronized once.
async fn downloader_over_a_link(
    server: &TestServer,
    name: &str,
) -> (Link, SyncOptions, Client, Client) {
    let link = Link::start(server.address).unwrap();
    let options = server.options_via(link.addr(), "alice");
    let mut client = server.client(name);
    client.sync(&options).await.unwrap();
    let mut writer = server.client(&format!("{name}-writer"));
    writer.sync(&server.options("alice")).await.unwrap();
    (link, options, client, writer)
}

/// A download cut `cuts` times across its bytes (over `options`, a link to `server`),
/// each resumed; the client's data equals the server's after each.
async fn cuts_across_the_download(compression: Compression, cuts: u64) {
    let server = TestServer::start().await;
    let name = format!("down-{compression}");
    let (link, mut options, mut client, mut writer) = downloader_over_a_link(&server, &name).await;
    options.transport.compression = compression;
    write_round(&server, &mut writer, 0).await;
    insert_own_row(&client, 0);
    let clean = client.sync(&options).await.unwrap();
    assert_eq!(clean.download_bytes_resumed, 0);
    assert_eq!(
        held_download_rows(&server),
        0,
        "a received download is not held"
    );
    let full = clean.wire.received;
    let mut resumed_total = 0;
    for k in 1..=cuts {
        write_round(&server, &mut writer, k as usize).await;
        insert_own_row(&client, k as usize);
        let cut = Cut {
            direction: Direction::Downstream,
            at: full * k / (cuts + 1),
        };
        let report =
            cut_then_retry(&server.metrics, &link, &mut client, &options, &options, cut).await;
        let resumed = report.download_bytes_resumed;
        resumed_total += resumed;
        eprintln!(
            "{compression}: download cut at {} of {full}: {resumed} bytes resumed, the retry \
             received {} and sent {}",
            cut.at, report.wire.received, report.wire.sent
        );
        // The upload went with the cut sync, once: the retry only asked for the rest.
        assert!(!report.upload_already_applied);
        assert_eq!(report.rows_uploaded, 1);
        assert!(
            report.wire.sent < 1_000,
            "the retry sent {}",
            report.wire.sent
        );
        if compression == Compression::None {
            // Every byte that crossed the link was kept and not sent again.
            assert_eq!(resumed, cut.at, "cut at {}", cut.at);
            assert!(
                report.wire.received + cut.at <= full + 1_000,
                "cut at {}: the retry received {} of {full}",
                cut.at,
                report.wire.received
            );
        }
        assert_same_as_server(&server, &client);
    }
    assert!(resumed_total > 0, "{compression}: nothing was ever resumed");
    assert_eq!(
        held_download_rows(&server),
        0,
        "a resumed download is released"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_cut_at_any_of_12_offsets_resumes_where_it_stopped() {
    cuts_across_the_download(Compression::None, 12).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zstd_download_cut_at_6_offsets_resumes() {
    cuts_across_the_download(Compression::Zstd, 6).await;
}

/// Over TLS the receipt follows the download as over TCP: cuts resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_cuts_resume_over_tls() {
    let server = TestServer::start().await;
    let toxiproxy = Toxiproxy::start().unwrap();
    let link = toxiproxy.proxy(server.tls_address).unwrap();
    let mut options = server.options_over("alice", Via::Tls, Compression::None);
    let real = server.tls_address.to_string();
    options.address = options.address.replace(&real, &link.addr().to_string());
    let mut client = server.client("down-tls");
    client.sync(&options).await.unwrap();
    let mut writer = server.client("down-tls-writer");
    writer.sync(&server.options("alice")).await.unwrap();
    for round in 1..=2 {
        write_round(&server, &mut writer, round).await;
        insert_own_row(&client, round);
        let cut = Cut {
            direction: Direction::Downstream,
            at: 70_000 * round as u64,
        };
        let report =
            cut_then_retry(&server.metrics, &link, &mut client, &options, &options, cut).await;
        assert!(
            report.download_bytes_resumed > 0,
            "a TLS download cut at {} resumed nothing",
            cut.at
        );
        assert_same_as_server(&server, &client);
    }
    server.stop().await;
}

/// Behind a load balancer the retry may reach another server: it continues the download
/// from the consolidated database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_resumes_on_another_server_from_the_shared_database() {
    let server = TestServer::start().await;
    let (other, other_metrics, stop) = second_server(&server, ServerConfig::default()).await;
    let (link, options, mut client, mut writer) = downloader_over_a_link(&server, "roam").await;
    write_round(&server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    let on_other = server.options_via(other, "alice");
    let cut = Cut {
        direction: Direction::Downstream,
        at: 100_000,
    };
    let report = cut_then_retry(
        &server.metrics,
        &link,
        &mut client,
        &options,
        &on_other,
        cut,
    )
    .await;
    assert_eq!(report.download_bytes_resumed, 100_000);
    assert_eq!(other_metrics.download_resumed_bytes.get(), 100_000);
    assert_eq!(server.metrics.downloads_held.get(), 1);
    assert_same_as_server(&server, &client);
    // The other server releases the held download after the client's receipt, which
    // the client sends without waiting for it.
    server_idle(&other_metrics).await;
    assert_eq!(held_download_rows(&server), 0);
    let _ = stop.send(());
    server.stop().await;
}

/// A download cut, `spoil` run, then the client's next attempt, which must fall back to
/// a fresh sync: the client's data equals the server's, the cut sync's upload applied
/// once.
async fn cut_download_then_sync(server: &TestServer, name: &str, spoil: impl FnOnce(&Client)) {
    let (link, options, mut client, mut writer) = downloader_over_a_link(server, name).await;
    write_round(server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    link.cut_after(Direction::Downstream, 100_000).unwrap();
    let before = ended_when_idle(&server.metrics).await;
    let cut = client
        .sync(&options)
        .await
        .expect_err("the cut sync completed");
    server_done_with_cut(&server.metrics, before, &cut.to_string()).await;
    link.remove("limit_data", Direction::Downstream).unwrap();
    spoil(&client);
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.download_bytes_resumed, 0, "{name}: nothing resumed");
    // The fresh sync resent the upload, answered as applied already: applied once.
    assert!(report.upload_already_applied, "{name}");
    assert_same_as_server(server, &client);
    let own: i64 = server
        .consolidated()
        .query_row(
            "SELECT count(*) FROM orders WHERE id = 'own-001'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(own, 1, "{name}: the cut sync's upload landed once");
}

/// A cut download above `held_download_bytes_max` is not held; one held and expired, or
/// whose kept start does not match the server's (its digest differs), is not resumed:
/// each falls back to a fresh sync, nothing mixed applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_not_held_expired_or_mismatched_falls_back_to_a_fresh_sync() {
    let small = TestServer::start_with(ServerConfig {
        held_download_bytes_max: 50_000,
        ..ServerConfig::default()
    })
    .await;
    cut_download_then_sync(&small, "too-large", |_| {}).await;
    assert_eq!(small.metrics.downloads_held.get(), 0);
    small.stop().await;

    let expiring = TestServer::start_with(ServerConfig {
        held_download_expiry: Duration::ZERO,
        cleanup_interval: Duration::from_millis(50),
        ..ServerConfig::default()
    })
    .await;
    cut_download_then_sync(&expiring, "expired", |_| {
        for _ in 0..1000 {
            if held_download_rows(&expiring) == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the held download never expired");
    })
    .await;
    assert_eq!(expiring.metrics.downloads_held.get(), 1);
    expiring.stop().await;

    let server = TestServer::start().await;
    cut_download_then_sync(&server, "mismatched", |client| {
        // The kept start differs from what the server sent (as a disk fault would make
        // it): the whole stream's digest then differs from the server's.
        let connection = client.connection();
        let mut kept: Vec<u8> = connection
            .query_row("SELECT bytes FROM rs_client_download", [], |row| row.get(0))
            .expect("the cut left a kept download");
        kept[40_000] ^= 0xff;
        let changed = connection
            .execute("UPDATE rs_client_download SET bytes = ?1", [kept])
            .unwrap();
        assert_eq!(changed, 1, "the cut left a kept download");
    })
    .await;
    server.stop().await;
}

/// Bad resumptions get a clear refusal (code 14), nothing applied: an unknown transfer,
/// another user's, an offset past the held length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_download_resumptions_are_refused_with_code_14() {
    let server = TestServer::start().await;
    let (link, options, mut client, mut writer) = downloader_over_a_link(&server, "held").await;
    write_round(&server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    link.cut_after(Direction::Downstream, 50_000).unwrap();
    let before = ended_when_idle(&server.metrics).await;
    let cut = client
        .sync(&options)
        .await
        .expect_err("the cut sync completed");
    server_done_with_cut(&server.metrics, before, &cut.to_string()).await;
    let (transfer_id, length): (String, i64) = server
        .consolidated()
        .query_row(
            "SELECT transfer_id, length FROM rs_held_download",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    let too_long = vec![0u8; length as usize + 1];
    let ask = |user: &'static str, client_id: String, transfer: String, prefix: Vec<u8>| {
        let options = server.options(user);
        async move {
            let mut hello = hello_v3(user);
            hello.client_id = client_id;
            let error = transport::exchange(transport::Exchange {
                address: &options.address,
                transport: &options.transport,
                hello,
                upload_frames: &[],
                upload_sequence: 1,
                frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
                timeout: Duration::from_secs(10),
                acknowledge: None,
                transfer: None,
                download_resume: Some(transport::HeldDownload {
                    transfer_id: &transfer,
                    prefix: &prefix,
                }),
                key_ranges: &[],
            })
            .await
            .unwrap_err();
            let ClientError::Server(wire) = &error else {
                panic!("expected the server's refusal, got {error}");
            };
            assert_eq!(
                wire.error_code(),
                Some(ErrorCode::TransferNotHeld),
                "{error}"
            );
            wire.message.clone()
        }
    };
    let id = client.client_id().to_string();
    let unknown = ask("alice", id.clone(), "t-unknown".into(), vec![1, 2, 3]).await;
    assert!(unknown.contains("t-unknown"), "{unknown}");
    let past = ask("alice", id.clone(), transfer_id.clone(), too_long).await;
    assert!(past.contains(&format!("{length} bytes")), "{past}");
    // Bob asks with a client id of his own about alice's transfer: not his.
    let other = ask("bob", "bobs-client".into(), transfer_id.clone(), Vec::new()).await;
    assert!(other.contains("no download"), "{other}");
    // The refusals changed nothing: alice's client resumes.
    link.remove("limit_data", Direction::Downstream).unwrap();
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.download_bytes_resumed, 50_000);
    assert_same_as_server(&server, &client);
    server.stop().await;
}

/// A client of version 4 meeting a server of version 3 speaks version 3 to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v4_client_syncs_with_a_version_3_server() {
    let server = TestServer::start().await;
    let old = older_server(server.address, 3).await;
    let options = server.options_via(old, "alice");
    let mut client = server.client("meets-v3");
    client.sync(&options).await.unwrap();
    insert_round(&client, 1);
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.rows_uploaded, ROWS_PER_ROUND as u64);
    assert_landed_once(&server, &client, 1);
    assert_eq!(server.metrics.downloads_held.get(), 0);
    server.stop().await;
}

// Resumable downloads over HTTP(S): the request body has ended before the download, so
// the receipt is a request of its own (docs/protocol.md §5.12).

/// The endpoint of `server` that `via` speaks to.
fn endpoint_of(server: &TestServer, via: Via) -> SocketAddr {
    match via {
        Via::Tcp => server.address,
        Via::Tls => server.tls_address,
        Via::Http | Via::H2c => server.http_address,
        Via::Https | Via::HttpsHttp1 => server.https_address,
    }
}

/// Alice's client over a toxiproxy link to `server`'s endpoint for `via` (uncompressed),
/// a writer beside it on plain TCP, both synchronized once.
async fn downloader_via(
    server: &TestServer,
    toxiproxy: &Toxiproxy,
    via: Via,
    name: &str,
) -> (Link, SyncOptions, Client, Client) {
    let upstream = endpoint_of(server, via);
    let link = toxiproxy.proxy(upstream).unwrap();
    let mut options = server.options_over("alice", via, Compression::None);
    options.address = options
        .address
        .replace(&upstream.to_string(), &link.addr().to_string());
    let mut client = server.client(name);
    client.sync(&options).await.unwrap();
    let mut writer = server.client(&format!("{name}-writer"));
    writer.sync(&server.options("alice")).await.unwrap();
    (link, options, client, writer)
}

/// Waits until the server has no sync in progress: a download waiting for its receipt
/// is a sync in progress until the receipt comes or it is held.
async fn server_idle(metrics: &Metrics) {
    for _ in 0..3000 {
        if metrics.connections.get() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} syncs still in progress", metrics.connections.get());
}

/// What a cut's count of wire bytes holds besides the download's stream that reached
/// the client: the response's head and chunk headers (HTTP/1.1); over HTTPS also the
/// TLS handshake and, since a TLS record decrypts only whole, up to one record (16 KiB)
/// cut in the middle.
fn framing_bytes_max(via: Via) -> u64 {
    match via {
        Via::Http | Via::H2c => 1_500,
        _ => 24_000,
    }
}

/// Cuts an HTTP(S) download at offsets across it, three of them within its last 64 KiB
/// (before, the server took a response written into its buffers as delivered, and such
/// a cut fell back to a fresh sync); each resumed: what the client received of the
/// stream before the cut is not sent again, the data is the server's, and the resumed
/// download is released by its receipt.
async fn http_download_cuts(via: Via) {
    let server = TestServer::start().await;
    let toxiproxy = Toxiproxy::start().unwrap();
    let name = format!("down-{via:?}");
    let (link, options, mut client, mut writer) =
        downloader_via(&server, &toxiproxy, via, &name).await;
    write_round(&server, &mut writer, 0).await;
    insert_own_row(&client, 0);
    let clean = client.sync(&options).await.unwrap();
    let full = clean.wire.received;
    let slack = framing_bytes_max(via);
    let cuts = [
        full / 4,
        full / 2,
        full - 60_000,
        full - 20_000,
        full - 1_000,
    ];
    let mut resumed_total = 0;
    for (k, at) in cuts.into_iter().enumerate() {
        let round = k + 1;
        write_round(&server, &mut writer, round).await;
        insert_own_row(&client, round);
        let cut = Cut {
            direction: Direction::Downstream,
            at,
        };
        let report =
            cut_then_retry(&server.metrics, &link, &mut client, &options, &options, cut).await;
        let resumed = report.download_bytes_resumed;
        resumed_total += resumed;
        eprintln!(
            "{via:?}: download cut at {at} of {full}: {resumed} bytes resumed, the retry \
             received {} and sent {}",
            report.wire.received, report.wire.sent
        );
        assert!(!report.upload_already_applied, "{via:?}: cut at {at}");
        assert_eq!(report.rows_uploaded, 1);
        // What crossed the link was kept, less the HTTP (and TLS) framing around it.
        assert!(
            resumed <= at && resumed + slack >= at,
            "{via:?}: cut at {at} of {full}: {resumed} bytes resumed"
        );
        assert!(
            report.wire.received + resumed <= full + slack,
            "{via:?}: cut at {at}: the retry received {} of {full}",
            report.wire.received
        );
        assert_same_as_server(&server, &client);
        assert_eq!(
            held_download_rows(&server),
            0,
            "{via:?}: the resumed download was released by its receipt"
        );
    }
    // The server sent none of what the client had kept.
    assert_eq!(server.metrics.download_resumed_bytes.get(), resumed_total);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_download_cuts_resume_also_in_the_last_64_kib() {
    http_download_cuts(Via::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_download_cuts_resume_also_in_the_last_64_kib() {
    http_download_cuts(Via::HttpsHttp1).await;
}

/// A download received whole over HTTP or HTTPS (HTTP/1.1 and HTTP/2), large or small,
/// is never held: the receipt of a large one arrives, a small one needs none; the
/// server writes nothing to `rs_held_download`. The server's read timeout is short, so
/// a receipt that did not come would have it held within the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_received_whole_over_http_is_not_held() {
    let server = TestServer::start_with(ServerConfig {
        read_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    })
    .await;
    let mut writer = server.client("whole-writer");
    writer.sync(&server.options("alice")).await.unwrap();
    let mut round = 0;
    for via in [Via::Http, Via::H2c, Via::Https, Via::HttpsHttp1] {
        let options = server.options_over("alice", via, Compression::None);
        let mut client = server.client(&format!("whole-{via:?}"));
        client.sync(&options).await.unwrap();
        for rows in [ROWS_PER_ROUND, 3] {
            round += 1;
            insert_own_row(&client, round);
            if rows == ROWS_PER_ROUND {
                write_round(&server, &mut writer, round).await;
            }
            let report = client.sync(&options).await.unwrap();
            assert_eq!(report.download_bytes_resumed, 0);
            server_idle(&server.metrics).await;
            assert_eq!(
                held_download_rows(&server),
                0,
                "{via:?}: a download of {} bytes received whole was held",
                report.wire.received
            );
            assert_same_as_server(&server, &client);
        }
    }
    assert_eq!(server.metrics.downloads_held.get(), 0);
    server.stop().await;
}

/// POSTs a bare receipt (a `download_resume` frame, no hello) to an HTTP endpoint, as a
/// client does after an HTTP download; returns the status and the body (chunked
/// framing removed when it is only the end).
async fn post_receipt(address: SocketAddr, transfer_id: &str, offset: u64) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let frame = encode_frame(&Message::DownloadResume(rowsync_protocol::DownloadResume {
        transfer_id: transfer_id.to_string(),
        offset,
    }));
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /sync HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/x-rowsync\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        frame.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&frame).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let split = answer
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("an HTTP answer");
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    let status = head[9..12].parse().unwrap();
    let mut body = answer[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
        && body == b"0\r\n\r\n"
    {
        body.clear();
    }
    (status, body)
}

/// Behind a load balancer the receipt may reach another server, which does not keep
/// the download: it releases the download held in the shared database when the
/// receipt names its transfer at its length (and nothing else), and answers with an
/// empty body. The client's next attempt then finds nothing held and syncs afresh, its
/// upload applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_reaching_another_server_releases_the_held_download() {
    let server = TestServer::start().await;
    let toxiproxy = Toxiproxy::start().unwrap();
    let (other, _other_metrics, stop) =
        second_server_over(&server, ServerConfig::default(), Transport::Http).await;
    let (link, options, mut client, mut writer) =
        downloader_via(&server, &toxiproxy, Via::Http, "roam-http").await;
    write_round(&server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    link.cut_after(Direction::Downstream, 100_000).unwrap();
    let before = ended_when_idle(&server.metrics).await;
    let cut = client
        .sync(&options)
        .await
        .expect_err("the cut sync completed");
    server_done_with_cut(&server.metrics, before, &cut.to_string()).await;
    link.remove("limit_data", Direction::Downstream).unwrap();
    let (transfer_id, length): (String, i64) = server
        .consolidated()
        .query_row(
            "SELECT transfer_id, length FROM rs_held_download",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    let length = length as u64;
    // Another length, another transfer: answered, nothing released.
    for (transfer, offset) in [(transfer_id.as_str(), length - 1), ("t-unknown", length)] {
        let (status, body) = post_receipt(other, transfer, offset).await;
        assert_eq!(
            (status, body.as_slice()),
            (200, &b""[..]),
            "{transfer} {offset}"
        );
        assert_eq!(held_download_rows(&server), 1);
    }
    let (status, body) = post_receipt(other, &transfer_id, length).await;
    assert_eq!((status, body.as_slice()), (200, &b""[..]));
    assert_eq!(held_download_rows(&server), 0, "the receipt released it");
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.download_bytes_resumed, 0);
    assert!(report.upload_already_applied);
    assert_same_as_server(&server, &client);
    let _ = stop.send(());
    server.stop().await;
}

/// An HTTP server of protocol version 3 in front of the real one's HTTP endpoint: it
/// refuses a newer hello with code 4, and anything but a hello first (a receipt) with
/// code 1, as such a server does; an older sync goes through. Returns its address and
/// the count of requests it refused for not starting with a hello.
async fn version_3_http_server(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    use http_body_util::{BodyExt, Full};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let not_hello = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&not_hello);
    tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                let counted = Arc::clone(&counted);
                async move {
                    let body: hyper::body::Incoming = request.into_body();
                    let body = body.collect().await?.to_bytes();
                    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
                    decoder.feed(&body);
                    let refusal = match decoder.next_message() {
                        Ok(Some(Message::Hello(hello))) if hello.protocol_version > 3 => {
                            Some(rowsync_protocol::WireError::new(
                                ErrorCode::UnsupportedProtocolVersion,
                                "this server speaks versions 1 to 3",
                            ))
                        }
                        Ok(Some(Message::Hello(_))) => None,
                        _ => {
                            counted.fetch_add(1, AtomicOrdering::SeqCst);
                            Some(rowsync_protocol::WireError::new(
                                ErrorCode::Protocol,
                                "expected hello",
                            ))
                        }
                    };
                    let answer = match refusal {
                        Some(refusal) => Bytes::from(encode_frame(&Message::Error(refusal))),
                        None => forward(upstream, body).await,
                    };
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(answer)))
                }
            });
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(connection);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    (address, not_hello)
}

/// One POST of `body` to the real server's HTTP endpoint; its response body.
async fn forward(upstream: SocketAddr, body: Bytes) -> Bytes {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(upstream).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post("/sync")
        .header("host", upstream.to_string())
        .header("content-type", "application/x-rowsync")
        .body(Full::new(body))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    response.into_body().collect().await.unwrap().to_bytes()
}

/// A client of version 4 meeting an HTTP server of version 3 speaks version 3 to it,
/// and sends it no receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v4_client_syncs_over_http_with_a_version_3_server() {
    let server = TestServer::start().await;
    let (old, not_hello) = version_3_http_server(server.http_address).await;
    let mut options = server.options_over("alice", Via::Http, Compression::None);
    options.address = format!("http://{old}/sync");
    let mut client = server.client("meets-v3-http");
    client.sync(&options).await.unwrap();
    let mut writer = server.client("meets-v3-http-writer");
    writer.sync(&server.options("alice")).await.unwrap();
    write_round(&server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.rows_uploaded, 1);
    assert!(report.rows_downloaded >= ROWS_PER_ROUND as u64);
    assert_same_as_server(&server, &client);
    assert_eq!(not_hello.load(AtomicOrdering::SeqCst), 0, "no receipt sent");
    server_idle(&server.metrics).await;
    assert_eq!(held_download_rows(&server), 0);
    server.stop().await;
}

/// Over a slow link the network's buffers hold the end of a download long after the
/// server wrote it, and an HTTP/1.1 server closes the idle keep-alive connection after
/// its header timeout, before the client can send its receipt on it: the client sends
/// it on a connection of its own, and the server, which did not take that close for a
/// cut, still waits for it: nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_outlasting_the_keep_alive_comes_on_a_new_connection() {
    let server = TestServer::start_with(ServerConfig {
        header_read_timeout: Duration::from_millis(500),
        ..ServerConfig::default()
    })
    .await;
    let toxiproxy = Toxiproxy::start().unwrap();
    let (link, options, mut client, mut writer) =
        downloader_via(&server, &toxiproxy, Via::Http, "slow-http").await;
    write_round(&server, &mut writer, 1).await;
    insert_own_row(&client, 1);
    // About 240 KB at 1,000 kbit/s: 2 s, most of it after the server wrote the last byte.
    link.set_bandwidth(Direction::Downstream, 1_000).unwrap();
    let report = client.sync(&options).await.unwrap();
    assert_eq!(report.download_bytes_resumed, 0);
    assert_same_as_server(&server, &client);
    server_idle(&server.metrics).await;
    assert_eq!(held_download_rows(&server), 0);
    assert_eq!(server.metrics.downloads_held.get(), 0, "nothing was held");
    server.stop().await;
}

/// Issue 32, item 7: receipts need no login and any transfer id was looked up (an
/// empty one, or 3 MB), 869 a second from one client. A transfer id not of the
/// unguessable form (32 to 128 hex digits) is answered without a lookup, and so is a
/// receipt beyond `receipts_per_connection_per_second_max` on its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_receipts_are_answered_without_lookups() {
    use http_body_util::{BodyExt, Full};
    let server = TestServer::start_with(ServerConfig {
        receipts_per_connection_per_second_max: 4,
        ..ServerConfig::default()
    })
    .await;
    for forged in [
        String::new(),
        "3f2a9c1e0b7d4e58".into(),
        "a".repeat(3_000_000),
    ] {
        let (status, body) = post_receipt(server.http_address, &forged, 10).await;
        assert_eq!((status, body.len()), (200, 0));
    }
    assert_eq!(server.metrics.receipts_refused.get(), 3);
    // Ten well-formed receipts on one keep-alive connection, at once: four looked up.
    let stream = tokio::net::TcpStream::connect(server.http_address)
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let frame = encode_frame(&Message::DownloadResume(rowsync_protocol::DownloadResume {
        transfer_id: "0123456789abcdef0123456789abcdef".into(),
        offset: 70_000,
    }));
    for _ in 0..10 {
        let request = hyper::Request::post("/sync")
            .header("host", server.http_address.to_string())
            .header("content-type", "application/x-rowsync")
            .body(Full::new(bytes::Bytes::from(frame.clone())))
            .unwrap();
        sender.ready().await.expect("the connection is kept alive");
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        response.into_body().collect().await.unwrap();
    }
    assert_eq!(server.metrics.receipts_refused.get(), 3 + 6);
    server.stop().await;
}

/// A version 3 upload, zlib-compressed, of `rows` rows of 1 KiB under `client_id`,
/// sent without its end and cut (closed): the server holds what it received.
async fn cut_compressed_upload(server: &TestServer, user: &str, client_id: &str, rows: usize) {
    use rowsync_protocol::{compress_all, Compression as Wire, Preamble, UploadResume};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut hello = hello_v3(user);
    hello.client_id = client_id.into();
    let mut frames = encode_frame(&Message::Hello(hello));
    frames.extend(encode_frame(&Message::UploadResume(UploadResume {
        transfer_id: format!("{client_id:0>32}"),
        offset: 0,
    })));
    frames.extend(encode_frame(&orders_chunk("orders", user, rows)));
    let mut bytes = Preamble {
        compression: Wire::Zlib,
    }
    .encode()
    .to_vec();
    bytes.extend(compress_all(Wire::Zlib, &frames).unwrap());
    let mut stream = tokio::net::TcpStream::connect(server.address)
        .await
        .unwrap();
    stream.write_all(&bytes).await.unwrap();
    stream.shutdown().await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
}

fn held_upload_bytes(server: &TestServer, user: &str) -> i64 {
    server
        .consolidated()
        .query_row(
            "SELECT coalesce(sum(length), 0) FROM rs_held_upload WHERE user_name = ?1",
            [user],
            |row| row.get(0),
        )
        .unwrap()
}

/// Issue 32, item 5: one user's compressed cut uploads (4 KB on the wire, 4 MB held
/// each) from 16 client ids filled the server-wide budget. Each user's held bytes, as
/// stored (decompressed), stay within `held_uploads_bytes_per_user_max`; another user's
/// cut upload is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_holds_no_more_than_its_share_of_cut_uploads() {
    let per_user_max = 1_000_000;
    let server = TestServer::start_with(ServerConfig {
        held_uploads_bytes_max: 4_000_000,
        held_uploads_bytes_per_user_max: per_user_max,
        ..ServerConfig::default()
    })
    .await;
    for n in 0..16 {
        cut_compressed_upload(&server, "alice", &format!("alice-{n}"), 300).await;
    }
    server_idle(&server.metrics).await;
    let alice = held_upload_bytes(&server, "alice");
    eprintln!("alice holds {alice} bytes after 16 cut uploads of 300 KiB each");
    assert!(alice > 0 && alice as u64 <= per_user_max, "{alice}");
    cut_compressed_upload(&server, "bob", "bob-0", 300).await;
    server_idle(&server.metrics).await;
    assert!(held_upload_bytes(&server, "bob") > 300_000);
    server.stop().await;
}

/// Issue 32, item 4: a user cutting an upload under another user's client id replaced
/// that user's held upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_upload_is_not_replaced_by_another_user() {
    let server = TestServer::start().await;
    cut_compressed_upload(&server, "alice", "shared-id", 50).await;
    server_idle(&server.metrics).await;
    let held = held_upload_bytes(&server, "alice");
    assert!(held > 50_000);
    cut_compressed_upload(&server, "bob", "shared-id", 10).await;
    server_idle(&server.metrics).await;
    assert_eq!(
        held_upload_bytes(&server, "alice"),
        held,
        "alice's upload stays"
    );
    assert_eq!(held_upload_bytes(&server, "bob"), 0);
    server.stop().await;
}
