//! Two `rowsync serve` processes (the real binary) on one SQLite consolidated database,
//! behind nginx (from the Debian packages) on loopback, reached over HTTP/1.1 and over
//! HTTPS with HTTP/2 (nginx terminates TLS with a certificate made by `rowsync cert`).
//! Syncs land on both servers, and every client ends with exactly its partition. A
//! rolling restart (SIGTERM to one server, then the other) under continuous syncs fails
//! none, and every row lands exactly once.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rowsync_client::{Client, Compression, SyncOptions};

const NOTES: &str = "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT)";
const USERS: [&str; 2] = ["erin", "frank"];

fn rowsync() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rowsync"))
}

/// nginx from `ROWSYNC_TEST_NGINX`, the PATH, or the sbin directories Debian uses.
fn find_nginx() -> PathBuf {
    if let Some(path) = std::env::var_os("ROWSYNC_TEST_NGINX") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/local/nginx/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("nginx"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "nginx not found (looked in PATH, /usr/sbin, /usr/local/sbin): this test needs a \
                 real reverse proxy. Install it with `sudo apt-get install -y nginx-light` \
                 (scripts/test does this), or set ROWSYNC_TEST_NGINX to an nginx binary."
            )
        })
}

/// A child process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `rowsync serve` with an HTTP endpoint; its log lines are collected.
fn start_server(db: &Path) -> (Running, String, Arc<Mutex<Vec<String>>>) {
    let mut child = rowsync()
        .args(["serve", "--db", db.to_str().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .args(["--workers", "2"])
        .env("ROWSYNC_LOG", "debug")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    let http = banner
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://"))
        .unwrap_or_else(|| panic!("no http endpoint in {banner}"))
        .to_string();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let collected = Arc::clone(&lines);
    std::thread::spawn(move || {
        for line in stderr.lines() {
            let Ok(line) = line else { break };
            collected.lock().unwrap().push(line);
        }
    });
    (Running(child), http, lines)
}

fn syncs_logged(lines: &Mutex<Vec<String>>) -> usize {
    lines
        .lock()
        .unwrap()
        .iter()
        .filter(|line| line.contains("rows up"))
        .count()
}

fn write_nginx_config(dir: &Path, upstreams: &[String], http_port: u16, https_port: u16) {
    let servers: String = upstreams
        .iter()
        // Never marked down: a server restarting is refused for a moment, then back.
        .map(|address| format!("        server {address} max_fails=0;\n"))
        .collect();
    let d = dir.display();
    let config = format!(
        "daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/client_body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream rowsync {{
{servers}    }}
    server {{
        listen 127.0.0.1:{http_port};
        listen 127.0.0.1:{https_port} ssl http2;
        ssl_certificate {d}/pki/server.pem;
        ssl_certificate_key {d}/pki/server-key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        # rowsync bounds uploads itself; nginx's default is 1 MiB.
        client_max_body_size 0;
        location / {{
            proxy_pass http://rowsync;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_buffering off;
            proxy_read_timeout 120s;
            # A draining server answers busy (503, nothing applied): try the other one.
            proxy_next_upstream error timeout http_503 non_idempotent;
        }}
    }}
}}
"
    );
    std::fs::write(dir.join("nginx.conf"), config).unwrap();
}

fn start_nginx(dir: &Path, http_port: u16) -> Running {
    let mut child = Command::new(find_nginx())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-e")
        .arg(dir.join("error.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting nginx");
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut output = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut output);
            let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
            panic!("nginx exited ({status}): {output}\n{log}");
        }
        if std::net::TcpStream::connect(("127.0.0.1", http_port)).is_ok() {
            return Running(child);
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nginx did not listen on {http_port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syncs_through_nginx_land_on_both_servers_over_http_and_https() {
    let nginx_binary = find_nginx();
    assert!(nginx_binary.is_file());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("consolidated.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(NOTES)
        .unwrap();
    let init = rowsync()
        .args(["init", "--db", db.to_str().unwrap()])
        .args(["--table", "notes", "--partition-column", "owner"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{init:?}");
    for user in USERS {
        let added = rowsync()
            .args(["user", "add", "--db", db.to_str().unwrap(), "--name", user])
            .env("ROWSYNC_PASSWORD", format!("{user}-secret"))
            .output()
            .unwrap();
        assert!(added.status.success(), "{added:?}");
    }
    let pki = dir.path().join("pki");
    let cert = rowsync()
        .args(["cert", "--dir", pki.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cert.status.success(), "{cert:?}");

    let (_first, first_http, first_log) = start_server(&db);
    let (_second, second_http, second_log) = start_server(&db);
    let (http_port, https_port) = (support::free_port(), support::free_port());
    write_nginx_config(
        dir.path(),
        &[first_http, second_http],
        http_port,
        https_port,
    );
    let _nginx = start_nginx(dir.path(), http_port);

    let mut clients = Vec::new();
    for (n, user) in USERS.iter().chain(USERS.iter()).enumerate() {
        let mut client = Client::open(dir.path().join(format!("client-{n}.db"))).unwrap();
        client.connection().execute_batch(NOTES).unwrap();
        client.track("notes").unwrap();
        clients.push((user.to_string(), client));
    }
    let options = |user: &str, round: usize| {
        let (url, compression) = if round % 2 == 1 {
            (
                format!("https://127.0.0.1:{https_port}/sync"),
                Compression::Zstd,
            )
        } else {
            (
                format!("http://127.0.0.1:{http_port}/sync"),
                Compression::Zlib,
            )
        };
        let mut options = SyncOptions::new(url, user, format!("{user}-secret"));
        options.transport.compression = compression;
        options.transport.tls.ca_file = Some(pki.join("ca.pem"));
        options
    };
    for round in 0..4 {
        for (n, (user, client)) in clients.iter_mut().enumerate() {
            client
                .connection()
                .execute(
                    "INSERT INTO notes VALUES (?1, ?2, ?3)",
                    rusqlite::params![format!("{n}-{round}"), &*user, format!("round {round}")],
                )
                .unwrap();
            client
                .sync(&options(user, round))
                .await
                .unwrap_or_else(|error| panic!("client {n} round {round}: {error}"));
        }
    }
    // One more round brings every client what the others uploaded.
    for (user, client) in clients.iter_mut() {
        client.sync(&options(user, 0)).await.unwrap();
    }

    let consolidated = rusqlite::Connection::open(&db).unwrap();
    let rows_of = |connection: &rusqlite::Connection, user: &str| -> Vec<(String, String)> {
        let mut statement = connection
            .prepare("SELECT id, body FROM notes WHERE owner = ?1 ORDER BY id")
            .unwrap();
        statement
            .query_map([user], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    for (user, client) in &clients {
        let expected = rows_of(&consolidated, user);
        assert_eq!(expected.len(), 8, "two clients x four rounds for {user}");
        assert_eq!(rows_of(client.connection(), user), expected);
        let others: i64 = client
            .connection()
            .query_row(
                "SELECT count(*) FROM notes WHERE owner <> ?1",
                [user],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(others, 0, "{user} holds only its partition");
    }
    // 20 syncs, one request each, round robin: both servers did real syncs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while syncs_logged(&first_log) + syncs_logged(&second_log) < 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (first, second) = (syncs_logged(&first_log), syncs_logged(&second_log));
    assert_eq!(first + second, 20, "syncs logged: {first} + {second}");
    assert!(
        first >= 5 && second >= 5,
        "syncs per server: {first} and {second}"
    );
}

/// A `rowsync serve` on fixed ports (HTTP and admin), so nginx finds it again after a
/// restart; returns once it serves.
fn start_server_on(db: &Path, http_port: u16, admin_port: u16) -> Running {
    let mut child = rowsync()
        .args(["serve", "--db", db.to_str().unwrap(), "--workers", "2"])
        .args(["--listen", "127.0.0.1:0"])
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin_port}")])
        .args(["--drain-timeout-seconds", "20"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut banner = String::new();
    stderr.read_line(&mut banner).unwrap();
    assert!(banner.starts_with("rowsync serving"), "{banner}");
    std::thread::spawn(move || for _ in stderr.lines() {});
    Running(child)
}

/// `GET path` on the admin endpoint: the status code and the body (status 0 while
/// nothing listens yet).
fn admin_get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let authorization = token.map_or(String::new(), |token| {
        format!("Authorization: Bearer {token}\r\n")
    });
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{authorization}\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

fn wait_ready(admin_port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_get(admin_port, "/readyz", None).0 != 200 {
        assert!(Instant::now() < deadline, "the server never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM, then the server's exit: 0, within its drain.
fn stop_gracefully(server: &mut Running) {
    let pid = server.0.id() as libc::pid_t;
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = server.0.wait().unwrap();
    assert!(status.success(), "a drained server exits 0, not {status}");
}

fn consolidated_with_erin(dir: &Path) -> PathBuf {
    let db = dir.join("consolidated.db");
    support::init_notes(&db);
    support::add_user(&db, "erin", "erin-secret");
    db
}

/// Clients that insert a row and sync, again and again, until `stop`; each returns its
/// client, the rows it made and the syncs that failed. Their table is `notes` of
/// `support::init_notes` (integer keys, a row of erin's and one of frank's).
fn keep_syncing(
    dir: &Path,
    url: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(Client, usize, Vec<String>)>> {
    (0..3)
        .map(|n| {
            let mut client = Client::open(dir.join(format!("client-{n}.db"))).unwrap();
            client
                .connection()
                .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, owner TEXT, body TEXT)")
                .unwrap();
            client.track("notes").unwrap();
            let (url, stop) = (url.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let options = SyncOptions::new(url, "erin", "erin-secret");
                let (mut made, mut failed) = (0, Vec::new());
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    client
                        .connection()
                        .execute(
                            "INSERT INTO notes VALUES (?1, 'erin', 'made under load')",
                            [(1000 * (n + 1) + made) as i64],
                        )
                        .unwrap();
                    made += 1;
                    if let Err(error) = client.sync(&options).await {
                        failed.push(error.to_string());
                    }
                }
                (client, made, failed)
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_behind_nginx_fails_no_sync_and_loses_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = consolidated_with_erin(dir.path());
    let ports: Vec<(u16, u16)> = (0..2)
        .map(|_| (support::free_port(), support::free_port()))
        .collect();
    let mut servers: Vec<Running> = ports
        .iter()
        .map(|&(http, admin)| start_server_on(&db, http, admin))
        .collect();
    for &(_, admin) in &ports {
        wait_ready(admin);
    }
    let upstreams: Vec<String> = ports
        .iter()
        .map(|(http, _)| format!("127.0.0.1:{http}"))
        .collect();
    let (http_port, https_port) = (support::free_port(), support::free_port());
    let pki = dir.path().join("pki");
    let cert = rowsync()
        .args(["cert", "--dir", pki.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cert.status.success(), "{cert:?}");
    write_nginx_config(dir.path(), &upstreams, http_port, https_port);
    let _nginx = start_nginx(dir.path(), http_port);

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = format!("http://127.0.0.1:{http_port}/sync");
    let clients = keep_syncing(dir.path(), url.clone(), Arc::clone(&stop));
    for (index, &(http, admin)) in ports.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let server = &mut servers[index];
        tokio::task::block_in_place(|| stop_gracefully(server));
        servers[index] = start_server_on(&db, http, admin);
        wait_ready(admin);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);

    let mut made_in_all = 0;
    let options = SyncOptions::new(url, "erin", "erin-secret");
    let mut finished = Vec::new();
    for handle in clients {
        let (mut client, made, failed) = handle.await.unwrap();
        let first: Vec<&String> = failed.iter().take(2).collect();
        assert!(
            failed.is_empty(),
            "{} failed syncs, first: {first:?}",
            failed.len()
        );
        assert!(made > 3, "the load ran: {made} syncs");
        made_in_all += made;
        client.sync(&options).await.unwrap();
        finished.push(client);
    }
    // erin's rows: the one `init_notes` made, and each made under load exactly once.
    let count = |connection: &rusqlite::Connection| -> (i64, i64) {
        let sql = "SELECT count(*), count(DISTINCT id) FROM notes WHERE owner = 'erin'";
        connection
            .query_row(sql, [], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
    };
    let expected = made_in_all as i64 + 1;
    let on_server = count(&rusqlite::Connection::open(&db).unwrap());
    assert_eq!(on_server, (expected, expected), "every row exactly once");
    for client in &mut finished {
        client.sync(&options).await.unwrap();
        assert_eq!(count(client.connection()), (expected, expected));
    }
    eprintln!("rolling restart: {made_in_all} syncs under load, 0 failed");
}

#[test]
fn the_admin_endpoint_tells_readiness_and_wants_its_token_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let db = consolidated_with_erin(dir.path());
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, "0123456789abcdef0123\n").unwrap();
    let admin = support::free_port();
    let mut child = rowsync()
        .args([
            "serve",
            "--db",
            db.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--admin-token-file", token_file.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let _server = Running(child);
    wait_ready(admin);
    assert_eq!(
        admin_get(admin, "/healthz", None),
        (200, "ok\n".to_string())
    );
    assert_eq!(
        admin_get(admin, "/readyz", None),
        (200, "ready\n".to_string())
    );
    assert_eq!(admin_get(admin, "/metrics", None).0, 401);
    assert_eq!(
        admin_get(admin, "/metrics", Some("0123456789abcdef0124")).0,
        401
    );
    let (status, metrics) = admin_get(admin, "/metrics", Some("0123456789abcdef0123"));
    assert_eq!(status, 200);
    assert!(metrics.contains("rowsync_database_up 1"), "{metrics}");

    let open = rowsync()
        .args([
            "serve",
            "--db",
            db.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--admin-listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!open.status.success());
    let said = String::from_utf8_lossy(&open.stderr);
    assert!(
        said.contains("beyond loopback") && said.contains("--admin-token-file"),
        "{said}"
    );
}
