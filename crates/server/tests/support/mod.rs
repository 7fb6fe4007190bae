//! Test harness: a real server over a real SQLite consolidated file, listening on four
//! loopback ports (TCP, TLS, HTTP, HTTPS, with a freshly generated test CA), real client
//! databases, and a TCP proxy that can cut or hold the server's reply.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rowsync_cli::cert::{self, KeyKind, PkiFiles};
use rowsync_client::{Client, Compression, HttpVersion, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;
use rowsync_server::tls::{self, TlsFiles};
use rowsync_server::{auth, Endpoint, ServerConfig, Transport};
use rusqlite::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

pub const TABLE_DDL: &str =
    "CREATE TABLE orders (id TEXT PRIMARY KEY, rep TEXT NOT NULL, item TEXT NOT NULL, quantity INTEGER NOT NULL)";
pub const USERS: [&str; 2] = ["alice", "bob"];

pub fn password(user: &str) -> String {
    format!("{user}-password")
}

/// How a test client reaches the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Tcp,
    Tls,
    /// HTTP/1.1.
    Http,
    /// HTTP/2 with prior knowledge (h2c).
    H2c,
    /// HTTPS, HTTP/2 chosen by ALPN.
    Https,
    /// HTTPS, HTTP/1.1 only.
    HttpsHttp1,
}

pub struct TestServer {
    /// The plain TCP endpoint.
    pub address: SocketAddr,
    pub tls_address: SocketAddr,
    pub http_address: SocketAddr,
    pub https_address: SocketAddr,
    /// The test CA, the server's certificate (for localhost and 127.0.0.1) and a client
    /// certificate.
    pub pki: PkiFiles,
    pub dir: tempfile::TempDir,
    pub consolidated_path: PathBuf,
    /// What the server counts.
    pub metrics: Arc<rowsync_server::metrics::Metrics>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(ServerConfig::default()).await
    }

    /// A consolidated database with `orders` partitioned by `rep`, two seeded rows per
    /// user, users alice and bob, and a server on a free loopback port.
    pub async fn start_with(config: ServerConfig) -> TestServer {
        TestServer::start_full(config, false).await
    }

    /// A server whose TLS and HTTPS endpoints require a client certificate of the test CA.
    pub async fn start_requiring_client_certificates() -> TestServer {
        TestServer::start_full(ServerConfig::default(), true).await
    }

    async fn start_full(config: ServerConfig, client_certificates: bool) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let consolidated_path = dir.path().join("consolidated.db");
        {
            let connection = Connection::open(&consolidated_path).unwrap();
            connection.execute_batch(TABLE_DDL).unwrap();
            for user in USERS {
                for n in 0..2 {
                    connection
                        .execute(
                            "INSERT INTO orders VALUES (?1, ?2, 'seed', ?3)",
                            rusqlite::params![format!("{user}-seed-{n}"), user, n],
                        )
                        .unwrap();
                }
            }
        }
        let backend = SqliteConsolidated::new(&consolidated_path);
        let mut connection = backend.connect().await.unwrap();
        connection.install_system_tables().await.unwrap();
        connection
            .init_table(&TableInit {
                table: "orders".into(),
                partition_column: "rep".into(),
                script_version: Some("v1".into()),
                based_on: None,
            })
            .await
            .unwrap();
        for user in USERS {
            let hash = auth::hash_password(&password(user)).unwrap();
            connection.set_user(user, &hash).await.unwrap();
        }
        let pki = cert::write_test_pki(
            dir.path(),
            &["localhost".into(), "127.0.0.1".into()],
            KeyKind::EcdsaP256,
        )
        .unwrap();
        let files = TlsFiles {
            cert_chain: pki.server_cert.clone(),
            private_key: pki.server_key.clone(),
            client_ca: client_certificates.then(|| pki.ca_cert.clone()),
        };
        let mut endpoints = Vec::new();
        for transport in [
            Transport::Tcp,
            Transport::Tls(tls::server_config(&files, &[tls::ALPN_ROWSYNC]).unwrap()),
            Transport::Http,
            Transport::Https(tls::server_config(&files, &tls::ALPN_HTTP).unwrap()),
        ] {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            endpoints.push(Endpoint {
                listener,
                transport,
            });
        }
        let address_of = |index: usize| endpoints[index].listener.local_addr().unwrap();
        let (address, tls_address, http_address, https_address) =
            (address_of(0), address_of(1), address_of(2), address_of(3));
        let (stop, stopped) = oneshot::channel::<()>();
        let metrics = Arc::new(rowsync_server::metrics::Metrics::new());
        let serving_metrics = Arc::clone(&metrics);
        let handle = tokio::spawn(async move {
            rowsync_server::serve_endpoints_with_metrics(
                endpoints,
                backend,
                config,
                serving_metrics,
                async {
                    let _ = stopped.await;
                },
            )
            .await
            .unwrap();
        });
        TestServer {
            address,
            tls_address,
            http_address,
            https_address,
            pki,
            dir,
            consolidated_path,
            metrics,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub fn options(&self, user: &str) -> SyncOptions {
        SyncOptions::new(self.address.to_string(), user, password(user))
    }

    /// The URL of one transport's endpoint.
    pub fn url(&self, via: Via) -> String {
        match via {
            Via::Tcp => format!("tcp://{}", self.address),
            Via::Tls => format!("tls://{}", self.tls_address),
            Via::Http | Via::H2c => format!("http://{}/sync", self.http_address),
            Via::Https | Via::HttpsHttp1 => format!("https://{}/sync", self.https_address),
        }
    }

    /// Options for `user` over one transport with one compression, trusting the test CA.
    pub fn options_over(&self, user: &str, via: Via, compression: Compression) -> SyncOptions {
        let mut options = SyncOptions::new(self.url(via), user, password(user));
        options.transport.compression = compression;
        options.transport.tls.ca_file = Some(self.pki.ca_cert.clone());
        options.transport.http_version = match via {
            Via::H2c => HttpVersion::Http2,
            Via::HttpsHttp1 => HttpVersion::Http1,
            _ => HttpVersion::Auto,
        };
        options
    }

    pub fn options_via(&self, address: SocketAddr, user: &str) -> SyncOptions {
        SyncOptions::new(address.to_string(), user, password(user))
    }

    /// A new client database with the `orders` table tracked.
    pub fn client(&self, name: &str) -> Client {
        let mut client = Client::open(self.dir.path().join(format!("{name}.db"))).unwrap();
        client.connection().execute_batch(TABLE_DDL).unwrap();
        client.track("orders").unwrap();
        client
    }

    pub fn consolidated(&self) -> Connection {
        Connection::open(&self.consolidated_path).unwrap()
    }

    /// Every orders row of one partition (or all), ordered by id.
    pub fn consolidated_orders(&self, rep: Option<&str>) -> Vec<Vec<Value>> {
        orders(&self.consolidated(), rep)
    }

    /// The full contents of every table, to prove something changed nothing.
    pub fn snapshot(&self) -> Vec<(String, Vec<Vec<Value>>)> {
        let connection = self.consolidated();
        let tables: Vec<String> = connection
            .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        tables
            .into_iter()
            .map(|table| {
                let mut statement = connection
                    .prepare(&format!("SELECT * FROM \"{table}\" ORDER BY 1, 2"))
                    .unwrap();
                let width = statement.column_count();
                let rows = statement
                    .query_map([], |row| {
                        (0..width)
                            .map(|i| row.get::<_, Value>(i))
                            .collect::<rusqlite::Result<Vec<_>>>()
                    })
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                (table, rows)
            })
            .collect()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle.await.unwrap();
        }
    }
}

pub fn orders(connection: &Connection, rep: Option<&str>) -> Vec<Vec<Value>> {
    let (sql, parameters): (&str, Vec<&str>) = match rep {
        Some(rep) => (
            "SELECT id, rep, item, quantity FROM orders WHERE rep = ?1 ORDER BY id",
            vec![rep],
        ),
        None => (
            "SELECT id, rep, item, quantity FROM orders ORDER BY id",
            vec![],
        ),
    };
    let mut statement = connection.prepare(sql).unwrap();
    statement
        .query_map(rusqlite::params_from_iter(parameters), |row| {
            (0..4)
                .map(|i| row.get::<_, Value>(i))
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

pub fn client_orders(client: &Client) -> Vec<Vec<Value>> {
    orders(client.connection(), None)
}

pub fn path_of(client_dir: &Path, name: &str) -> PathBuf {
    client_dir.join(format!("{name}.db"))
}

/// What the proxy does with the server's reply on the connections it is told to disturb.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Disturbance {
    /// Drop both sides as soon as the server's first reply byte arrives (after the
    /// server committed), without forwarding it.
    CutReply,
    /// Hold the server's reply until [`Proxy::release`] is called.
    HoldReply,
}

/// A loopback TCP proxy in front of the server. The first `disturbed` connections get
/// the disturbance; later ones pass through untouched.
pub struct Proxy {
    pub address: SocketAddr,
    pub reply_seen: Arc<Notify>,
    release: Arc<Notify>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr, disturbance: Disturbance, disturbed: usize) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let reply_seen = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let remaining = Arc::new(AtomicUsize::new(disturbed));
        let (seen, released) = (Arc::clone(&reply_seen), Arc::clone(&release));
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let disturb = remaining
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                        left.checked_sub(1)
                    })
                    .is_ok();
                let (seen, released) = (Arc::clone(&seen), Arc::clone(&released));
                tokio::spawn(async move {
                    let server = TcpStream::connect(upstream).await.unwrap();
                    relay(
                        client,
                        server,
                        disturb.then_some(disturbance),
                        seen,
                        released,
                    )
                    .await;
                });
            }
        });
        Proxy {
            address,
            reply_seen,
            release,
        }
    }

    pub fn release(&self) {
        self.release.notify_one();
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    disturbance: Option<Disturbance>,
    reply_seen: Arc<Notify>,
    release: Arc<Notify>,
) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    let mut first = true;
    loop {
        let read = match server_read.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if first {
            first = false;
            match disturbance {
                Some(Disturbance::CutReply) => {
                    reply_seen.notify_one();
                    upstream.abort();
                    return; // both halves dropped: the client sees the connection close
                }
                Some(Disturbance::HoldReply) => {
                    reply_seen.notify_one();
                    release.notified().await;
                }
                None => {}
            }
        }
        if client_write.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    let _ = client_write.shutdown().await;
    let _ = upstream.await;
}

/// The encoded hello of a raw test client logging in as `user`.
pub fn hello_frame(user: &str) -> Vec<u8> {
    rowsync_protocol::encode_frame(&rowsync_protocol::Message::Hello(rowsync_protocol::Hello {
        protocol_version: 2, // raw frames: a v2 client, its upload right after the hello
        client_id: format!("raw-{user}"),
        user: user.into(),
        password: password(user),
        script_version: "v1".into(),
        last_download_watermark: 0,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    }))
}

/// Sends raw bytes (then closes our side) and returns every message the server sent back
/// (decompressed, if the server compressed its reply).
pub async fn exchange_raw(server: &TestServer, bytes: &[u8]) -> Vec<rowsync_protocol::Message> {
    exchange_raw_closing(server, bytes, true).await
}

/// [`exchange_raw`] for a complete sync, whose client keeps its sending side open until
/// the download ends (the server takes the end of its stream as the client gone).
pub async fn exchange_raw_open(
    server: &TestServer,
    bytes: &[u8],
) -> Vec<rowsync_protocol::Message> {
    exchange_raw_closing(server, bytes, false).await
}

/// Sends `bytes`, closes the sending side when `close` (so a truncated stream ends), and
/// decodes every reply until the server closes.
async fn exchange_raw_closing(
    server: &TestServer,
    bytes: &[u8],
    close: bool,
) -> Vec<rowsync_protocol::Message> {
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    let _ = stream.write_all(bytes).await;
    if close {
        let _ = stream.shutdown().await;
    }
    let mut received = Vec::new();
    let _ = stream.read_to_end(&mut received).await;
    // The reply may come compressed, after a preamble, when the request was.
    let mut inbound = rowsync_protocol::Inbound::new(u64::MAX);
    inbound.feed(&received).unwrap();
    let mut decoder =
        rowsync_protocol::FrameDecoder::new(rowsync_protocol::FRAME_BYTES_MAX_DEFAULT);
    while let Some(chunk) = inbound.next_chunk().unwrap() {
        decoder.feed(chunk);
    }
    let mut messages = Vec::new();
    while let Some(message) = decoder.next_message().unwrap() {
        messages.push(message);
    }
    decoder.finish().unwrap();
    messages
}

/// Frames as a zstd-compressed stream with its preamble: a large upload in few wire
/// bytes, which the server's socket takes in whole whenever it stops reading.
pub fn zstd_stream(frames: &[u8]) -> Vec<u8> {
    use rowsync_protocol::{compress_all, Compression, Preamble};
    let mut bytes = Preamble {
        compression: Compression::Zstd,
    }
    .encode()
    .to_vec();
    bytes.extend(compress_all(Compression::Zstd, frames).unwrap());
    bytes
}

static CHUNKS: AtomicUsize = AtomicUsize::new(0);

/// An upload chunk of `table` with the columns of `orders`, inserting `rows` rows of a
/// 1 KiB item each for `rep`, with keys no other chunk has.
pub fn orders_chunk(table: &str, rep: &str, rows: usize) -> rowsync_protocol::Message {
    let item = "x".repeat(1024);
    rowsync_protocol::Message::Upload(rowsync_protocol::TableUpload {
        table: table.into(),
        columns: vec!["id".into(), "rep".into(), "item".into(), "quantity".into()],
        key_columns: vec!["id".into()],
        inserts: (0..rows)
            .map(|n| {
                vec![
                    Value::Text(format!(
                        "{table}-{}-{n}",
                        CHUNKS.fetch_add(1, Ordering::Relaxed)
                    )),
                    rep.into(),
                    item.as_str().into(),
                    Value::Int(1),
                ]
            })
            .collect(),
        ..rowsync_protocol::TableUpload::default()
    })
}

/// A second server on the test server's database, on a TCP port of its own.
pub async fn second_server(
    server: &TestServer,
    config: ServerConfig,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let backend = rowsync_consolidated::sqlite::SqliteConsolidated::new(&server.consolidated_path);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        rowsync_server::serve(listener, backend, config, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (address, stop)
}
