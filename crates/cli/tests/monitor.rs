//! The monitor page in a real headless Chromium, driven through chromedriver's WebDriver
//! HTTP API: `rowsync serve --admin-listen` serves it, the page shows a sync that just
//! ran, and shows the next one without a reload, and the profile report `rowsync profile
//! --out` wrote. Also the JSON API behind it.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs them); set
//! `ROWSYNC_TEST_SKIP_BROWSER=1` to skip where no browser can run.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{add_user, init_notes, serve, sync_client};

/// How long the page may take to show what the test waits for (generous: a loaded CI
/// machine; the test passes as soon as the page shows it).
const PAGE_WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_monitor_page_shows_a_sync_that_just_ran_and_updates() {
    if std::env::var_os("ROWSYNC_TEST_SKIP_BROWSER").is_some() {
        eprintln!("skipped: ROWSYNC_TEST_SKIP_BROWSER is set");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    init_notes(&db);
    add_user(&db, "erin", "erin-password-1");
    add_user(&db, "frank", "frank-password-1");
    // The plan advisor's report (SQLite: the advisor only), shown by the page.
    let report = dir.path().join("profile.json");
    let report_arg = report.to_str().unwrap();
    support::run_command_ok(
        support::rowsync(),
        &[
            "profile",
            "--db",
            db.to_str().unwrap(),
            "--version",
            "v1",
            "--plans",
            "--out",
            report_arg,
        ],
        None,
    );
    let server = serve(
        &db,
        &[
            "--admin-listen",
            "127.0.0.1:0",
            "--profile-report",
            report_arg,
        ],
    );
    let admin = server.admin.clone().expect("the admin banner");
    let profile: Value = serde_json::from_str(&http_get(&admin, "/api/monitor/profile")).unwrap();
    assert_eq!(profile["script_version"], "v1");
    assert_eq!(profile["plans"][0]["event"], "download_cursor", "{profile}");

    let erin = sync_client(&dir, "erin", &server.address, "erin-password-1").await;
    assert_eq!(erin.rows_downloaded, 1);

    // The JSON API the page reads.
    let syncs: Value =
        serde_json::from_str(&http_get(&admin, "/api/monitor/syncs?user=erin")).unwrap();
    let first = &syncs[0];
    assert_eq!(first["user"], "erin");
    assert_eq!(first["outcome"], "ok");
    assert_eq!(first["rows_downloaded"], 1);
    assert_eq!(first["phases"].as_array().unwrap().len(), 7);
    let none: Value =
        serde_json::from_str(&http_get(&admin, "/api/monitor/syncs?outcome=refused")).unwrap();
    assert_eq!(none, json!([]));

    let driver = ChromeDriver::start();
    let session = driver.session();
    driver.post(
        &format!("/session/{session}/url"),
        json!({ "url": format!("http://{admin}/monitor") }),
    );
    let shown = |user: &str| {
        format!(
            "return Array.from(document.querySelectorAll('#recent tbody tr'))\
             .filter(row => row.dataset.user === '{user}').length"
        )
    };
    driver.wait_for(&session, &shown("erin"), |count| count.as_u64() >= Some(1));
    let polls = driver.script(
        &session,
        "return Number(document.getElementById('status').dataset.polls)",
    );
    let charts = driver.script(
        &session,
        "return document.querySelectorAll('.uplot').length",
    );
    assert_eq!(charts, json!(4), "the four charts are drawn");
    driver.wait_for(
        &session,
        "return document.getElementById('profile-status').textContent",
        |status| {
            status
                .as_str()
                .is_some_and(|text| text.contains("script version v1 on SQLite"))
        },
    );

    // A sync after the page loaded appears without a reload.
    let frank = sync_client(&dir, "frank", &server.address, "frank-password-1").await;
    assert_eq!(frank.rows_downloaded, 1);
    driver.wait_for(&session, &shown("frank"), |count| count.as_u64() >= Some(1));
    let later = driver.script(
        &session,
        "return Number(document.getElementById('status').dataset.polls)",
    );
    assert!(
        later.as_u64() > polls.as_u64(),
        "{later} polls after {polls}"
    );
    if let Some(path) = std::env::var_os("ROWSYNC_MONITOR_SCREENSHOT") {
        let png = driver.get(&format!("/session/{session}/screenshot"));
        std::fs::write(path, decode_base64(png.as_str().unwrap())).unwrap();
    }
    driver.delete(&format!("/session/{session}"));
}

/// A chromedriver process on a free port, killed when dropped.
struct ChromeDriver {
    child: Child,
    address: String,
}

impl ChromeDriver {
    fn start() -> ChromeDriver {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; scripts/test installs it)");
        let driver = ChromeDriver {
            child,
            address: format!("127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let ready = TcpStream::connect(&driver.address).is_ok()
                && driver.get("/status")["ready"] == json!(true);
            if ready {
                return driver;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn session(&self) -> String {
        let created = self.post(
            "/session",
            json!({ "capabilities": { "alwaysMatch": { "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1500,1100"]
            }}}}),
        );
        created["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string()
    }

    fn script(&self, session: &str, script: &str) -> Value {
        self.post(
            &format!("/session/{session}/execute/sync"),
            json!({ "script": script, "args": [] }),
        )
    }

    /// Runs `script` until `done` accepts its value (the page polls once a second).
    fn wait_for(&self, session: &str, script: &str, done: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + PAGE_WAIT;
        loop {
            let value = self.script(session, script);
            if done(&value) {
                return;
            }
            if Instant::now() > deadline {
                let page = self.script(session, "return document.body.innerText");
                panic!("the page never showed it ({script} = {value}):\n{page}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn get(&self, path: &str) -> Value {
        webdriver_value(&http(&self.address, "GET", path, None))
    }

    fn post(&self, path: &str, body: Value) -> Value {
        webdriver_value(&http(&self.address, "POST", path, Some(body.to_string())))
    }

    fn delete(&self, path: &str) {
        http(&self.address, "DELETE", path, None);
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn webdriver_value(body: &str) -> Value {
    let answer: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    answer["value"].clone()
}

fn http_get(address: &str, path: &str) -> String {
    http(address, "GET", path, None)
}

/// One HTTP/1.1 request; the response body (read to its Content-Length, or chunked, or
/// to the close: chromedriver keeps the connection open whatever the request asks).
fn http(address: &str, method: &str, path: &str, body: Option<String>) -> String {
    let mut stream = TcpStream::connect(address).unwrap();
    let body = body.unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    loop {
        if let Some(body) = complete_body(&response) {
            return body;
        }
        let read = stream.read(&mut buffer).unwrap();
        if read == 0 {
            let text = String::from_utf8_lossy(&response).into_owned();
            let (_, rest) = text.split_once("\r\n\r\n").expect("an HTTP response");
            return rest.to_string();
        }
        response.extend_from_slice(&buffer[..read]);
    }
}

/// The body, once `response` holds all of it.
fn complete_body(response: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(response);
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let head = head.to_ascii_lowercase();
    if head.contains("transfer-encoding: chunked") {
        return rest.ends_with("0\r\n\r\n").then(|| dechunk(rest));
    }
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))?
        .trim()
        .parse()
        .ok()?;
    (rest.len() >= length).then(|| rest[..length].to_string())
}

fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    body
}

fn decode_base64(text: &str) -> Vec<u8> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut bytes = Vec::new();
    for byte in text.bytes() {
        let Some(value) = alphabet.iter().position(|&letter| letter == byte) else {
            continue;
        };
        bits = (bits << 6) | value as u32;
        count += 6;
        if count >= 8 {
            count -= 8;
            bytes.push((bits >> count) as u8);
        }
    }
    bytes
}
