//! Two `rowsync serve` processes (the real binary) on one SQLite consolidated database,
//! behind nginx (from the Debian packages) on loopback, reached over HTTP/1.1 and over
//! HTTPS with HTTP/2 (nginx terminates TLS with a certificate made by `rowsync cert`).
//! Syncs land on both servers, and every client ends with exactly its partition.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
        .map(|address| format!("        server {address};\n"))
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
    let (http_port, https_port) = (free_port(), free_port());
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
