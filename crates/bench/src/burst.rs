//! A burst of concurrent clients against a `rowsync serve` process of its own on an
//! SQLite consolidated database, for the server's peak resident memory (`VmHWM`): every
//! client connects at once, uploads its rows compressed as a real client compresses them
//! (a streaming compressor, so the frame header announces the encoder's window, not the
//! upload's size) and reads its download.
//!
//! The clients are cheap so that 10,000 fit beside the server on one machine: each
//! upload is compressed before the burst and written raw, and each answer is kept as it
//! arrived (compressed) and decoded only after the burst, one at a time. They speak
//! protocol version 2 (no transfer, no receipt), which every server accepts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_consolidated::ConsolidatedConnection;
use rowsync_protocol::{
    encode_frame, Compression, EndUpload, FrameDecoder, Hello, Inbound, Message, Outbound,
    TableUpload, Value, FRAME_BYTES_MAX_DEFAULT,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::transport::{bench_rows_consolidated, insert_rows};

const TOKEN_SECRET: &[u8] = b"bench-burst secret, thirty-two bytes or more";
const PASSWORD: &str = "bench-burst-password";
/// The protocol version the burst's clients speak: values in pieces but no transfers.
const CLIENT_PROTOCOL_VERSION: u16 = 2;
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the server's resident memory is sampled during the burst.
const SAMPLE_INTERVAL: Duration = Duration::from_millis(20);
/// How long after the burst the resident memory is read again ("after").
const SETTLE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct BurstOptions {
    /// The `rowsync` binary to run as the server.
    pub server_program: PathBuf,
    pub clients: usize,
    /// Rows each client uploads.
    pub rows_up: usize,
    /// Rows of each client's partition in the consolidated database before the burst
    /// (its first sync downloads them).
    pub rows_down: usize,
    pub compression: Compression,
    /// `--max-connections` (at least the clients, so that they are all in at once).
    pub connections_max: usize,
    /// Further `rowsync serve` arguments (e.g. `--cache-bytes-max`, `--workers`).
    pub server_args: Vec<String>,
    /// How the clients log in.
    pub login: Login,
    /// Seconds each client may take for its whole exchange.
    pub timeout: Duration,
    /// Stop the burst after this long (its figures then cover that much of it, and only
    /// the syncs that completed are checked): the peak of a large burst comes once its
    /// connections are all in, long before the last sync.
    pub observe: Option<Duration>,
}

/// How a burst's clients log in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    /// A user name and password (argon2id, checked a few at a time): the usual client,
    /// and what makes a burst wait for authentication with its hello read.
    Password,
    /// A JWT (HS256): checked at once, without the database.
    Token,
}

impl BurstOptions {
    pub fn new(server_program: PathBuf, clients: usize) -> BurstOptions {
        BurstOptions {
            server_program,
            clients,
            rows_up: 20,
            rows_down: 20,
            compression: Compression::Zstd,
            connections_max: clients,
            server_args: Vec::new(),
            login: Login::Password,
            timeout: Duration::from_secs(1800),
            observe: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BurstFigures {
    pub clients: usize,
    /// The server's resident memory once it listened, before the burst.
    pub idle_rss_bytes: u64,
    /// Its peak resident memory (`VmHWM`) at the end of the burst.
    pub peak_rss_bytes: u64,
    /// Its resident memory a moment after the burst.
    pub after_rss_bytes: u64,
    /// Busy answers the clients retried.
    pub busy_retries: u64,
    pub seconds: f64,
    /// Rows all clients downloaded (checks that each sync was whole).
    pub rows_downloaded: u64,
    /// Syncs completed (fewer than the clients when the burst was stopped early).
    pub syncs_completed: usize,
    /// Completed syncs whose answer was not their whole download (a refusal, say), with
    /// the first such answer's reason.
    pub syncs_failed: usize,
    pub first_failure: Option<String>,
}

impl std::fmt::Display for BurstFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "{} clients: server RSS idle {:.1} MiB, peak {:.1} MiB, after {:.1} MiB; \
             {} busy retries, {:.1} s, {} syncs completed ({} failed), {} rows downloaded",
            self.clients,
            mib(self.idle_rss_bytes),
            mib(self.peak_rss_bytes),
            mib(self.after_rss_bytes),
            self.busy_retries,
            self.seconds,
            self.syncs_completed,
            self.syncs_failed,
            self.rows_downloaded
        )?;
        if let Some(failure) = &self.first_failure {
            write!(f, "; first failure: {failure}")?;
        }
        Ok(())
    }
}

fn token(user: &str) -> Result<String> {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        exp: u64,
    }
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 24 * 3600;
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims { sub: user, exp },
        &jsonwebtoken::EncodingKey::from_secret(TOKEN_SECRET),
    )?)
}

fn user(client: usize) -> String {
    format!("burst-{client}")
}

/// Client `client`'s whole request as it goes on the wire: preamble, hello (flushed, as
/// the client library sends it), its rows, the end of the upload, compressed by one
/// streaming compressor.
fn request_bytes(client: usize, options: &BurstOptions) -> Result<Vec<u8>> {
    let owner = user(client);
    let mut hello = Hello {
        protocol_version: CLIENT_PROTOCOL_VERSION,
        client_id: format!("burst-client-{client}"),
        user: owner.clone(),
        password: PASSWORD.into(),
        script_version: "v1".into(),
        last_download_watermark: 0,
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    };
    if options.login == Login::Token {
        hello.password = String::new();
        hello.token = token(&owner)?;
    }
    let upload = TableUpload {
        table: "bench_rows".into(),
        columns: ["id", "owner", "name", "quantity", "note"]
            .iter()
            .map(|c| c.to_string())
            .collect(),
        key_columns: vec!["id".into()],
        inserts: (0..options.rows_up)
            .map(|n| {
                vec![
                    Value::Text(format!("up-{client}-{n:06}")),
                    Value::Text(owner.clone()),
                    Value::Text(format!("burst item {n} of client {client}")),
                    Value::Int((n * 7 % 1000) as i64),
                    Value::Text(format!("uploaded in a burst, row {n}")),
                ]
            })
            .collect(),
        ..TableUpload::default()
    };
    let mut outbound = Outbound::new(options.compression, false)?;
    let mut bytes = Vec::new();
    if let Some(preamble) = outbound.take_preamble() {
        bytes.extend_from_slice(&preamble);
    }
    bytes.extend(
        outbound
            .compressor()
            .compress(&encode_frame(&Message::Hello(hello)))?,
    );
    bytes.extend(outbound.compressor().flush()?);
    bytes.extend(
        outbound
            .compressor()
            .compress(&encode_frame(&Message::Upload(upload)))?,
    );
    bytes.extend(
        outbound
            .compressor()
            .compress(&encode_frame(&Message::EndUpload(EndUpload {
                upload_sequence: 1,
            })))?,
    );
    bytes.extend(outbound.finish()?);
    Ok(bytes)
}

/// What one answer said.
enum Answer {
    Complete { rows: u64 },
    Busy { retry_after_ms: u32 },
}

/// Decodes an answer as it arrived on the wire.
fn decode_answer(wire: &[u8]) -> Result<Answer> {
    let mut inbound = Inbound::new(u64::MAX);
    inbound.feed(wire)?;
    let mut frames = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    while let Some(chunk) = inbound.next_chunk()? {
        frames.feed(chunk);
    }
    let mut rows = 0u64;
    while let Some(message) = frames.next_message()? {
        match message {
            Message::Download(download) => {
                rows += download.upserts.len() as u64;
            }
            Message::EndDownload(_) => return Ok(Answer::Complete { rows }),
            Message::Busy { retry_after_ms } => return Ok(Answer::Busy { retry_after_ms }),
            Message::Error(error) => bail!("the server refused the sync: {error:?}"),
            _ => {}
        }
    }
    bail!(
        "the answer ({} bytes) ended before the download's end",
        wire.len()
    )
}

/// One exchange: the request written whole, the answer read to the server's close.
async fn exchange(address: &str, request: &[u8], timeout: Duration) -> Result<Vec<u8>> {
    let exchanging = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        // A refused client may see its write fail; its answer may still have arrived.
        let written = stream.write_all(request).await;
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer).await;
        match (written, read) {
            (_, Ok(_)) if !answer.is_empty() => Ok(answer),
            (Err(error), _) | (_, Err(error)) => Err(error),
            _ => Ok(answer),
        }
    };
    tokio::time::timeout(timeout, exchanging)
        .await
        .context("the exchange timed out")?
        .context("exchanging with the server")
}

/// A resident memory figure of `/proc/<pid>/status`, in bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .context("reading the server's /proc status")?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim_start_matches(':')
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .with_context(|| format!("no {field} in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

struct Server {
    child: Child,
    address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(options: &BurstOptions, db: &Path, dir: &Path) -> Result<Server> {
    let secret_file = dir.join("token-secret");
    std::fs::write(&secret_file, TOKEN_SECRET)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = format!("127.0.0.1:{port}");
    let log = dir.join("server.log");
    let mut child = Command::new(&options.server_program)
        .arg("serve")
        .arg("--db")
        .arg(db)
        .arg("--listen")
        .arg(&address)
        .arg("--max-connections")
        .arg(options.connections_max.to_string())
        .arg("--jwt-hs256-secret-file")
        .arg(&secret_file)
        .arg("--cleanup-interval-seconds")
        .arg("86400")
        .args(&options.server_args)
        .env("ROWSYNC_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .with_context(|| format!("starting {}", options.server_program.display()))?;
    let started = Instant::now();
    while std::net::TcpStream::connect(&address).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the server exited at start ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if started.elapsed() > SERVER_START_TIMEOUT {
            let _ = child.kill();
            bail!("the server did not listen on {address} within {SERVER_START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Server { child, address })
}

/// Runs one burst and returns the server's memory figures, with the syncs that did not
/// end with their whole download counted.
pub async fn run(options: &BurstOptions) -> Result<BurstFigures> {
    if options.clients == 0 {
        bail!("a burst needs at least one client");
    }
    // Each client holds a socket here and one in the server (which inherits this limit).
    let needed = options.clients as u64 + 256;
    let allowed = rlimit::increase_nofile_limit(u64::MAX)
        .context("raising the open-file limit to its hard limit")?;
    if needed > allowed {
        bail!(
            "{} clients need about {needed} file descriptors, and this process may open \
             {allowed} (raise the hard limit: ulimit -Hn)",
            options.clients
        );
    }
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let db = dir.path().join("consolidated.db");
    let (_, mut admin) = bench_rows_consolidated(&db).await?;
    if options.login == Login::Password {
        // One hash for every user: hashing is argon2id's cost, paid once here.
        let hash = rowsync_server::auth::hash_password(PASSWORD)
            .map_err(|error| anyhow::anyhow!("{error}"))?;
        for client in 0..options.clients {
            admin.set_user(&user(client), &hash).await?;
        }
    }
    drop(admin);
    {
        let connection = rusqlite::Connection::open(&db)?;
        for client in 0..options.clients {
            insert_rows(
                &connection,
                &user(client),
                &format!("down-{client}"),
                options.rows_down,
            )?;
        }
    }
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..options.clients)
            .map(|client| request_bytes(client, options))
            .collect::<Result<_>>()?,
    );

    let server = start_server(options, &db, dir.path())?;
    let pid = server.child.id();
    // Let the server settle (its pools connect at start).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss_bytes = proc_status_bytes(pid, "VmRSS")?;

    // Sampling is for a live view only; VmHWM is the figure.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampled_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sampling, sampled_peak) = (Arc::clone(&sampling), Arc::clone(&sampled_peak));
        std::thread::spawn(move || {
            while sampling.load(Ordering::Acquire) {
                if let Ok(rss) = proc_status_bytes(pid, "VmRSS") {
                    sampled_peak.fetch_max(rss, Ordering::AcqRel);
                }
                std::thread::sleep(SAMPLE_INTERVAL);
            }
        })
    };

    let gate = Arc::new(tokio::sync::Barrier::new(options.clients + 1));
    let address = Arc::new(server.address.clone());
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..options.clients {
        let (gate, address, requests) = (
            Arc::clone(&gate),
            Arc::clone(&address),
            Arc::clone(&requests),
        );
        let timeout = options.timeout;
        tasks.spawn(async move {
            gate.wait().await;
            let mut busy = 0u64;
            loop {
                let answer = exchange(&address, &requests[client], timeout).await;
                // Decoded after the burst, unless it is short (a busy answer is a few
                // bytes): the burst's clients hold no decompressor.
                let answer = match answer {
                    Ok(answer) => answer,
                    Err(error) => {
                        let reset = error
                            .downcast_ref::<std::io::Error>()
                            .or_else(|| error.root_cause().downcast_ref::<std::io::Error>())
                            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset);
                        if reset {
                            busy += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                        return Err(error.context(format!("client {client}")));
                    }
                };
                if answer.len() < 64 {
                    if let Ok(Answer::Busy { retry_after_ms }) = decode_answer(&answer) {
                        busy += 1;
                        let jitter = 0.5 * rand::random::<f64>();
                        let wait = f64::from(retry_after_ms.max(20)) * (1.0 + jitter);
                        tokio::time::sleep(Duration::from_secs_f64(wait / 1000.0)).await;
                        continue;
                    }
                }
                return Ok::<_, anyhow::Error>((client, busy, answer));
            }
        });
    }
    gate.wait().await;
    let started = Instant::now();
    let mut answers = vec![Vec::new(); options.clients];
    let mut completed = vec![false; options.clients];
    let mut busy_retries = 0;
    let deadline = options
        .observe
        .map(|observe| tokio::time::Instant::now() + observe);
    loop {
        let joined = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, tasks.join_next()).await {
                Ok(joined) => joined,
                Err(_) => break,
            },
            None => tasks.join_next().await,
        };
        let Some(joined) = joined else {
            break;
        };
        let (client, busy, answer) = joined??;
        busy_retries += busy;
        answers[client] = answer;
        completed[client] = true;
    }
    let seconds = started.elapsed().as_secs_f64();
    let peak_rss_bytes = proc_status_bytes(pid, "VmHWM")?;
    tokio::time::sleep(SETTLE).await;
    let after_rss_bytes = proc_status_bytes(pid, "VmRSS")?;
    sampling.store(false, Ordering::Release);
    let _ = sampler.join();
    drop(server);
    tasks.abort_all();

    let mut rows_downloaded = 0;
    let mut syncs_failed = 0;
    let mut first_failure = None;
    for (client, answer) in answers.iter().enumerate() {
        if !completed[client] {
            continue;
        }
        let failure = match decode_answer(answer) {
            Ok(Answer::Complete { rows }) if rows == options.rows_down as u64 => {
                rows_downloaded += rows;
                continue;
            }
            Ok(Answer::Complete { rows }) => format!(
                "client {client} downloaded {rows} rows, expected {}",
                options.rows_down
            ),
            Ok(Answer::Busy { .. }) => format!("client {client}'s last answer was busy"),
            Err(error) => format!("client {client}: {error:#}"),
        };
        syncs_failed += 1;
        first_failure.get_or_insert(failure);
    }
    Ok(BurstFigures {
        clients: options.clients,
        idle_rss_bytes,
        peak_rss_bytes: peak_rss_bytes.max(sampled_peak.load(Ordering::Acquire)),
        after_rss_bytes,
        busy_retries,
        seconds,
        rows_downloaded,
        syncs_completed: completed.iter().filter(|&&done| done).count(),
        syncs_failed,
        first_failure,
    })
}
