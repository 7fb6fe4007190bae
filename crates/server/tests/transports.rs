//! The same sync suite over every transport x compression combination, and the limits
//! every transport keeps: a decompression bomb, oversized frames, header and body read
//! timeouts, certificate refusals, plain text to a TLS port, busy on every transport.
//! Real sockets, real TLS, real SQLite files.

mod support;

use std::sync::Arc;
use std::time::Duration;

use rowsync_client::{BusyRetry, ClientError, Compression};
use rowsync_protocol::*;
use rowsync_server::ServerConfig;
use support::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A guard against a hang: every wait in these tests ends well before it.
const TEST_WAIT: Duration = Duration::from_secs(20);

fn row(id: &str, rep: &str, item: &str, quantity: i64) -> Vec<Value> {
    vec![id.into(), rep.into(), item.into(), Value::Int(quantity)]
}

/// Two devices of one user and the consolidated database exchange inserts, updates,
/// deletes, a conflict and a download of many frames; everyone ends in agreement.
async fn sync_suite(via: Via, compression: Compression) {
    let server = TestServer::start().await;
    let options = server.options_over("alice", via, compression);
    let mut phone = server.client("phone");
    let mut laptop = server.client("laptop");
    let first = phone.sync(&options).await.unwrap();
    assert_eq!(first.rows_downloaded, 2);
    laptop.sync(&options).await.unwrap();

    let db = phone.connection();
    db.execute("INSERT INTO orders VALUES ('new', 'alice', 'lamp', 3)", [])
        .unwrap();
    db.execute(
        "UPDATE orders SET quantity = 42 WHERE id = 'alice-seed-0'",
        [],
    )
    .unwrap();
    db.execute("DELETE FROM orders WHERE id = 'alice-seed-1'", [])
        .unwrap();
    let report = phone.sync(&options).await.unwrap();
    assert_eq!((report.rows_uploaded, report.conflicts), (3, 0));
    assert_eq!(
        server.consolidated_orders(Some("alice")),
        vec![
            row("alice-seed-0", "alice", "seed", 42),
            row("new", "alice", "lamp", 3)
        ]
    );

    // A conflict: the laptop edits a row the phone already changed; the server wins.
    laptop
        .connection()
        .execute(
            "UPDATE orders SET quantity = 7 WHERE id = 'alice-seed-0'",
            [],
        )
        .unwrap();
    let report = laptop.sync(&options).await.unwrap();
    assert_eq!(report.conflicts, 1);

    // Many rows written on the server come down in many (compressed) frames.
    {
        let office = server.consolidated();
        let text = "a description of ordinary length that compresses ".repeat(4);
        for n in 0..3000 {
            office
                .execute(
                    "INSERT INTO orders VALUES (?1, 'alice', ?2, ?3)",
                    rusqlite::params![format!("bulk-{n:05}"), text, n],
                )
                .unwrap();
        }
    }
    let report = phone.sync(&options).await.unwrap();
    assert_eq!(report.rows_downloaded, 3000);
    laptop.sync(&options).await.unwrap();
    let expected = server.consolidated_orders(Some("alice"));
    assert_eq!(expected.len(), 3002);
    assert_eq!(client_orders(&phone), expected);
    assert_eq!(client_orders(&laptop), expected);
    server.stop().await;
}

macro_rules! matrix {
    ($($name:ident: $via:expr, $compression:expr;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                sync_suite($via, $compression).await;
            }
        )*
    };
}

matrix! {
    suite_over_tcp: Via::Tcp, Compression::None;
    suite_over_tcp_zlib: Via::Tcp, Compression::Zlib;
    suite_over_tcp_zstd: Via::Tcp, Compression::Zstd;
    suite_over_tls: Via::Tls, Compression::None;
    suite_over_tls_zlib: Via::Tls, Compression::Zlib;
    suite_over_tls_zstd: Via::Tls, Compression::Zstd;
    suite_over_http1: Via::Http, Compression::None;
    suite_over_http1_zlib: Via::Http, Compression::Zlib;
    suite_over_http1_zstd: Via::Http, Compression::Zstd;
    suite_over_h2c: Via::H2c, Compression::None;
    suite_over_h2c_zlib: Via::H2c, Compression::Zlib;
    suite_over_h2c_zstd: Via::H2c, Compression::Zstd;
    suite_over_https_h2: Via::Https, Compression::None;
    suite_over_https_h2_zlib: Via::Https, Compression::Zlib;
    suite_over_https_h2_zstd: Via::Https, Compression::Zstd;
    suite_over_https_http1: Via::HttpsHttp1, Compression::None;
    suite_over_https_http1_zlib: Via::HttpsHttp1, Compression::Zlib;
    suite_over_https_http1_zstd: Via::HttpsHttp1, Compression::Zstd;
}

// ---- raw exchanges: exactly the bytes given, over each transport ----

fn hello(user: &str) -> Message {
    Message::Hello(Hello {
        protocol_version: 2, // raw frames: a v2 client, its upload right after the hello
        client_id: "raw-client".into(),
        user: user.into(),
        password: password(user),
        script_version: "v1".into(),
        last_download_watermark: 0,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    })
}

fn tls_connector(server: &TestServer, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rowsync_server::tls::load_certificates(&server.pki.ca_cert).unwrap() {
        roots.add(certificate).unwrap();
    }
    let mut config =
        rustls::ClientConfig::builder_with_provider(rowsync_server::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn tls_stream(
    server: &TestServer,
    address: std::net::SocketAddr,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(address).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tls_connector(server, alpn)
        .connect(name, tcp)
        .await
        .unwrap()
}

/// Writes `bytes`, then reads everything until the server closes.
async fn write_then_read_all(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    bytes: &[u8],
) -> Vec<u8> {
    let _ = stream.write_all(bytes).await;
    let _ = stream.flush().await;
    let mut received = Vec::new();
    let _ = tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut received))
        .await
        .expect("the server answers and closes");
    received
}

/// An HTTP/1.1 POST of `body` as raw text, the raw response back.
fn http_post(host: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /sync HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/x-rowsync\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

/// The rowsync messages in a raw HTTP/1.1 response (chunked or not).
fn messages_in_http_response(response: &[u8]) -> (String, Vec<Message>) {
    let text = String::from_utf8_lossy(response);
    let head_end = text.find("\r\n\r\n").expect("an HTTP response") + 4;
    let head = text[..head_end].to_string();
    let mut body = response[head_end..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut unchunked = Vec::new();
        let mut rest = &body[..];
        loop {
            let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                    .unwrap();
            rest = &rest[line_end + 2..];
            if size == 0 {
                break;
            }
            unchunked.extend_from_slice(&rest[..size]);
            rest = &rest[size + 2..];
        }
        body = unchunked;
    }
    (head, decode_all(&body))
}

fn decode_all(bytes: &[u8]) -> Vec<Message> {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    decoder.feed(bytes);
    let mut messages = Vec::new();
    while let Some(message) = decoder.next_message().unwrap() {
        messages.push(message);
    }
    decoder.finish().unwrap();
    messages
}

/// Sends the raw client byte stream over a transport; the server's messages back.
async fn exchange_raw(server: &TestServer, via: Via, bytes: &[u8]) -> Vec<Message> {
    match via {
        Via::Tcp => {
            let stream = TcpStream::connect(server.address).await.unwrap();
            decode_all(&write_then_read_all(stream, bytes).await)
        }
        Via::Tls => {
            let stream = tls_stream(server, server.tls_address, b"rowsync").await;
            decode_all(&write_then_read_all(stream, bytes).await)
        }
        Via::Http => {
            let stream = TcpStream::connect(server.http_address).await.unwrap();
            let request = http_post(&server.http_address.to_string(), bytes);
            messages_in_http_response(&write_then_read_all(stream, &request).await).1
        }
        Via::HttpsHttp1 => {
            let stream = tls_stream(server, server.https_address, b"http/1.1").await;
            let request = http_post("localhost", bytes);
            messages_in_http_response(&write_then_read_all(stream, &request).await).1
        }
        Via::H2c | Via::Https => unreachable!("raw exchanges use HTTP/1.1"),
    }
}

fn expect_error(messages: &[Message], code: ErrorCode, fragment: &str) {
    match messages {
        [Message::Error(error)] => {
            assert_eq!(error.error_code(), Some(code), "{error}");
            assert!(
                error.message.contains(fragment),
                "{:?} lacks {fragment:?}",
                error.message
            );
        }
        other => panic!("expected one error, got {other:?}"),
    }
}

const RAW_TRANSPORTS: [Via; 4] = [Via::Tcp, Via::Tls, Via::Http, Via::HttpsHttp1];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decompression_bomb_is_refused_at_the_limit_before_any_database_work() {
    let limit = 8 * 1024 * 1024;
    let server = TestServer::start_with(ServerConfig {
        decompressed_bytes_max: limit,
        ..ServerConfig::default()
    })
    .await;
    let before = server.snapshot();
    // hello, then valid upload frames of ~1 MiB each: zstd packs 3 GiB into ~100 KB.
    let chunk = encode_frame(&Message::Upload(TableUpload {
        table: "orders".into(),
        columns: vec!["id".into(), "rep".into(), "item".into(), "quantity".into()],
        key_columns: vec!["id".into()],
        inserts: vec![vec![
            "bomb".into(),
            "alice".into(),
            Value::Text("\0".repeat(1 << 20)),
            Value::Int(1),
        ]],
        ..TableUpload::default()
    }));
    let mut outbound = Outbound::new(Compression::Zstd, true).unwrap();
    let mut stream = outbound.take_preamble().unwrap().to_vec();
    stream.extend(
        outbound
            .compressor()
            .compress(&encode_frame(&hello("alice")))
            .unwrap(),
    );
    for _ in 0..3 * 1024 {
        stream.extend(outbound.compressor().compress(&chunk).unwrap());
    }
    stream.extend(outbound.finish().unwrap());
    assert!(stream.len() < 200 * 1024, "{} bytes", stream.len());
    for via in [Via::Tcp, Via::Http] {
        expect_error(
            &exchange_raw(&server, via, &stream).await,
            ErrorCode::UploadTooLarge,
            &format!("the decompressed stream exceeds the limit of {limit} bytes"),
        );
    }
    assert_eq!(server.snapshot(), before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_refused_from_its_header_on_every_transport() {
    let server = TestServer::start_with(ServerConfig {
        frame_bytes_max: 64 * 1024,
        ..ServerConfig::default()
    })
    .await;
    let before = server.snapshot();
    let mut frames = encode_frame(&hello("alice"));
    frames.extend((1u32 << 30).to_be_bytes()); // claims 1 GiB; none of it is sent
    for via in RAW_TRANSPORTS {
        expect_error(
            &exchange_raw(&server, via, &frames).await,
            ErrorCode::FrameTooLarge,
            "exceeds the limit of 65536 bytes",
        );
    }
    // The same inside a compressed stream.
    let mut outbound = Outbound::new(Compression::Zlib, true).unwrap();
    let mut stream = outbound.take_preamble().unwrap().to_vec();
    stream.extend(outbound.compressor().compress(&frames).unwrap());
    stream.extend(outbound.finish().unwrap());
    expect_error(
        &exchange_raw(&server, Via::Tcp, &stream).await,
        ErrorCode::FrameTooLarge,
        "exceeds the limit of 65536 bytes",
    );
    assert_eq!(server.snapshot(), before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_preamble_is_refused_by_name() {
    let server = TestServer::start().await;
    expect_error(
        &exchange_raw(&server, Via::Tcp, b"RSYN\x01\x07\x00\x00").await,
        ErrorCode::Protocol,
        "unknown compression id 7",
    );
    let mut bytes = b"RSYN\x01\x01\x00\x00".to_vec();
    bytes.extend_from_slice(b"this is not zlib data");
    expect_error(
        &exchange_raw(&server, Via::Http, &bytes).await,
        ErrorCode::Protocol,
        "invalid zlib data",
    );
    server.stop().await;
}

fn short_timeouts(header_ms: u64, body_ms: u64) -> ServerConfig {
    ServerConfig {
        header_read_timeout: Duration::from_millis(header_ms),
        read_timeout: Duration::from_millis(body_ms),
        tls_handshake_timeout: Duration::from_millis(header_ms),
        ..ServerConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_slower_than_the_header_timeout_is_refused() {
    let server = TestServer::start_with(short_timeouts(300, 60_000)).await;
    let before = server.snapshot();
    // TCP and TLS: a partial hello, then silence.
    let partial = &encode_frame(&hello("alice"))[..10];
    for via in [Via::Tcp, Via::Tls] {
        let mut stream: Box<dyn AsyncReadWrite> = match via {
            Via::Tcp => Box::new(TcpStream::connect(server.address).await.unwrap()),
            _ => Box::new(tls_stream(&server, server.tls_address, b"rowsync").await),
        };
        stream.write_all(partial).await.unwrap();
        let mut received = Vec::new();
        tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut received))
            .await
            .unwrap()
            .unwrap();
        expect_error(
            &decode_all(&received),
            ErrorCode::Timeout,
            "did not arrive within the header read timeout of 300 ms",
        );
    }
    // TLS: no handshake at all within the handshake timeout: the connection is closed.
    let mut silent = TcpStream::connect(server.tls_address).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(TEST_WAIT, silent.read_to_end(&mut received))
        .await
        .expect("closed after the handshake timeout")
        .unwrap();
    assert!(received.is_empty());
    // HTTP, HTTPS (after the handshake) and h2c (after the preface): a connection that
    // sends no request is closed.
    let mut silent = TcpStream::connect(server.http_address).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(TEST_WAIT, silent.read_to_end(&mut received))
        .await
        .expect("closed after the header timeout")
        .unwrap();
    assert!(received.is_empty());
    let mut silent = tls_stream(&server, server.https_address, b"http/1.1").await;
    let mut received = Vec::new();
    let _ = tokio::time::timeout(TEST_WAIT, silent.read_to_end(&mut received))
        .await
        .expect("closed after the header timeout");
    assert!(received.is_empty());
    let mut h2c = TcpStream::connect(server.http_address).await.unwrap();
    h2c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let _ = tokio::time::timeout(TEST_WAIT, h2c.read_to_end(&mut received))
        .await
        .expect("closed after the header timeout");
    // HTTP: headers that never end: hyper closes the connection.
    let mut stream = TcpStream::connect(server.http_address).await.unwrap();
    stream
        .write_all(b"POST /sync HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    let _ = tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut received))
        .await
        .expect("closed after the header timeout");
    assert!(
        received.is_empty() || String::from_utf8_lossy(&received).starts_with("HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&received)
    );
    assert_eq!(server.snapshot(), before);
    server.stop().await;
}

trait AsyncReadWrite: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncReadWrite for T {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_that_stalls_is_refused_after_the_body_timeout() {
    let server = TestServer::start_with(short_timeouts(60_000, 300)).await;
    let before = server.snapshot();
    let hello_frame = encode_frame(&hello("alice"));
    // TCP: the hello, then silence.
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream.write_all(&hello_frame).await.unwrap();
    let mut received = Vec::new();
    tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut received))
        .await
        .unwrap()
        .unwrap();
    expect_error(
        &decode_all(&received),
        ErrorCode::Timeout,
        "nothing received for 300 ms",
    );
    // HTTP: a body announced longer than what is sent.
    let mut stream = TcpStream::connect(server.http_address).await.unwrap();
    let mut request =
        b"POST /sync HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\nconnection: close\r\n\r\n"
            .to_vec();
    request.extend_from_slice(&hello_frame);
    stream.write_all(&request).await.unwrap();
    let mut received = Vec::new();
    let _ = tokio::time::timeout(TEST_WAIT, stream.read_to_end(&mut received))
        .await
        .unwrap();
    let (head, messages) = messages_in_http_response(&received);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    expect_error(&messages, ErrorCode::Timeout, "nothing received for 300 ms");
    assert_eq!(server.snapshot(), before);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_refuse_an_unknown_ca_and_a_wrong_host_name() {
    let server = TestServer::start().await;
    let mut client = server.client("c");
    for via in [Via::Tls, Via::Https] {
        // The public web roots do not know the test CA.
        let mut options = server.options_over("alice", via, Compression::None);
        options.transport.tls.ca_file = None;
        let error = client.sync(&options).await.unwrap_err();
        assert!(
            matches!(error, ClientError::Tls { .. }) && error.to_string().contains("UnknownIssuer"),
            "{via:?}: {error}"
        );
        // Another CA.
        let other = tempfile::tempdir().unwrap();
        let other_pki = rowsync_cli::cert::write_test_pki(
            other.path(),
            &["localhost".into()],
            rowsync_cli::cert::KeyKind::EcdsaP256,
        )
        .unwrap();
        let mut options = server.options_over("alice", via, Compression::None);
        options.transport.tls.ca_file = Some(other_pki.ca_cert);
        let error = client.sync(&options).await.unwrap_err();
        // Same CA name, another key: the signature does not verify.
        assert!(
            error.to_string().contains("invalid peer certificate"),
            "{via:?}: {error}"
        );
        // The right CA, a name the certificate does not carry.
        let mut options = server.options_over("alice", via, Compression::None);
        options.transport.tls.server_name = Some("sync.example.com".into());
        let error = client.sync(&options).await.unwrap_err();
        assert!(
            error.to_string().contains("not valid for name"),
            "{via:?}: {error}"
        );
        // A name it does carry works.
        options.transport.tls.server_name = Some("localhost".into());
        client.sync(&options).await.unwrap();
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_requiring_client_certificates_refuses_clients_without_one() {
    let server = TestServer::start_requiring_client_certificates().await;
    let mut client = server.client("c");
    for via in [Via::Tls, Via::Https] {
        let options = server.options_over("alice", via, Compression::Zstd);
        let error = client.sync(&options).await.unwrap_err();
        assert!(
            error.to_string().to_lowercase().contains("certificate"),
            "{via:?}: {error}"
        );
        // A client certificate of another CA is refused too.
        let other = tempfile::tempdir().unwrap();
        let other_pki = rowsync_cli::cert::write_test_pki(
            other.path(),
            &["localhost".into()],
            rowsync_cli::cert::KeyKind::EcdsaP256,
        )
        .unwrap();
        let mut options = options;
        options.transport.tls.client_cert = Some(other_pki.client_cert);
        options.transport.tls.client_key = Some(other_pki.client_key);
        let error = client.sync(&options).await.unwrap_err();
        assert!(
            error.to_string().to_lowercase().contains("certificate")
                || error.to_string().contains("alert"),
            "{via:?}: {error}"
        );
        options.transport.tls.client_cert = Some(server.pki.client_cert.clone());
        options.transport.tls.client_key = Some(server.pki.client_key.clone());
        client.sync(&options).await.unwrap();
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_to_a_tls_port_and_tls_to_a_plain_port_get_clear_errors() {
    let server = TestServer::start().await;
    let mut client = server.client("c");
    // A tcp:// client on the TLS port hears a rowsync error in plain text.
    let options = server.options_via(server.tls_address, "alice");
    let error = client.sync(&options).await.unwrap_err();
    let ClientError::Server(refusal) = &error else {
        panic!("expected the server's refusal, got {error}")
    };
    assert!(refusal.message.contains("this port speaks TLS"), "{error}");
    // An http:// client on the HTTPS port gets a 400 saying so.
    let mut options = server.options_over("alice", Via::Http, Compression::None);
    options.address = format!("http://{}/sync", server.https_address);
    let error = client.sync(&options).await.unwrap_err();
    assert!(
        matches!(
            error,
            ClientError::Http {
                status: Some(400),
                ..
            }
        ) && error.to_string().contains("this port speaks HTTPS"),
        "{error}"
    );
    // A tls:// client on the plain TCP port: the handshake fails, and says why.
    let mut options = server.options_over("alice", Via::Tls, Compression::None);
    options.address = format!("tls://{}", server.address);
    let error = client.sync(&options).await.unwrap_err();
    assert!(
        matches!(error, ClientError::Tls { .. })
            && error.to_string().contains("did not answer in TLS"),
        "{error}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_the_connection_limit_every_transport_answers_busy() {
    let server = TestServer::start_with(ServerConfig {
        connections_max: 1,
        busy_retry_after_ms: 1500,
        ..ServerConfig::default()
    })
    .await;
    // A silent TCP connection holds the only sync slot.
    let squatter = TcpStream::connect(server.address).await.unwrap();
    let mut client = server.client("c");
    for via in [Via::Tcp, Via::Tls, Via::Http, Via::H2c, Via::Https] {
        for compression in [Compression::None, Compression::Zstd] {
            let mut options = server.options_over("alice", via, compression);
            options.busy_retry = BusyRetry::Never;
            let error = client.sync(&options).await.unwrap_err();
            assert!(
                matches!(
                    error,
                    ClientError::Busy {
                        retry_after_ms: 1500
                    }
                ),
                "{via:?} {compression}: {error}"
            );
        }
    }
    // HTTP: 503 with Retry-After, and the busy frame in the body; the same when the
    // HTTP connections themselves are at the limit (a silent one holds the only one).
    let _idle_http = TcpStream::connect(server.http_address).await.unwrap();
    let stream = TcpStream::connect(server.http_address).await.unwrap();
    let response =
        write_then_read_all(stream, &http_post("x", &encode_frame(&hello("alice")))).await;
    let (head, messages) = messages_in_http_response(&response);
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 2"),
        "{head}"
    );
    assert_eq!(
        messages,
        vec![Message::Busy {
            retry_after_ms: 1500
        }]
    );
    drop(squatter);
    server.stop().await;
}

/// Issue 32, item 8: a request with both Content-Length and Transfer-Encoding (the
/// request-smuggling shape, when a proxy in front trusts Content-Length) was accepted;
/// hyper takes the chunked body and drops Content-Length. It is refused with 400, in
/// either order of the two, and the connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_length_with_transfer_encoding_is_refused_with_400() {
    let server = TestServer::start().await;
    let heads = [
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "transfer-encoding: chunked\r\ncontent-length: 5",
    ];
    for head in heads {
        let mut stream = TcpStream::connect(server.http_address).await.unwrap();
        let request = format!(
            "POST /sync HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-rowsync\r\n{head}\r\n\r\n0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut received))
            .await
            .expect("the server answers and closes")
            .unwrap();
        let answer = String::from_utf8_lossy(&received);
        assert!(answer.starts_with("HTTP/1.1 400"), "{head:?}: {answer}");
    }
    // Either alone is served as ever.
    let mut stream = TcpStream::connect(server.http_address).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    stream.read_to_end(&mut received).await.unwrap();
    assert!(String::from_utf8_lossy(&received).starts_with("HTTP/1.1 405"));
    server.stop().await;
}
