//! The monitor page in a real headless Chromium, driven through chromedriver's WebDriver
//! HTTP API: `rowsync serve --admin-listen` serves it, the page shows a sync that just
//! ran, and shows the next one without a reload, and the profile report `rowsync profile
//! --out` wrote. Also the JSON API behind it.
//!
//! Needs Debian's `chromium` and `chromium-driver` (scripts/test installs them); set
//! `ROWSYNC_TEST_SKIP_BROWSER=1` to skip where no browser can run.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

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
    a_refused_sync_reads_at_a_glance(&driver, &session, &dir, &server.address).await;
    if let Some(path) = std::env::var_os("ROWSYNC_MONITOR_SCREENSHOT") {
        let png = driver.get(&format!("/session/{session}/screenshot"));
        std::fs::write(path, decode_base64(png.as_str().unwrap())).unwrap();
    }
    driver.delete(&format!("/session/{session}"));
}

/// At 1400x1000: a refused sync's error shows in full without scrolling, on a line of its
/// own (the sync's row stays one line); refused and failed are separate series; every
/// legend shows values without hovering; the cache chart draws the use, not the limit.
async fn a_refused_sync_reads_at_a_glance(
    driver: &ChromeDriver,
    session: &str,
    dir: &tempfile::TempDir,
    address: &str,
) {
    // A client database of its own: one that logged in before holds a session token,
    // which would log it in whatever its password (protocol 8).
    let mut client = support::client(dir.path(), "erin-elsewhere");
    let options = rowsync_client::SyncOptions::new(address, "erin", "not-erins-password");
    assert!(
        client.sync(&options).await.is_err(),
        "a wrong password syncs"
    );
    driver.wait_for(
        session,
        "return document.querySelectorAll('#recent tr.error-row.refused').length",
        |count| count.as_u64() >= Some(1),
    );
    let seen = driver.script(
        session,
        "const error = document.querySelector('#recent tr.error-row.refused td div');
         const row = document.querySelector('#recent tbody tr.refused:not(.error-row)');
         const box = error.getBoundingClientRect();
         return { text: error.textContent, scrolled: window.scrollY,
                  page_width: document.documentElement.scrollWidth,
                  right: box.right, bottom: box.bottom, width: innerWidth, height: innerHeight,
                  row: row.getBoundingClientRect().height };",
    );
    assert!(
        seen["text"]
            .as_str()
            .unwrap()
            .contains("unknown user or wrong password"),
        "{seen}"
    );
    assert_eq!(seen["scrolled"], 0, "{seen}");
    let inside = |edge: &str, limit: &str| seen[edge].as_f64() <= seen[limit].as_f64();
    assert!(
        inside("right", "width") && inside("bottom", "height"),
        "{seen}"
    );
    assert!(seen["row"].as_f64().unwrap() < 30.0, "one line: {seen}");
    let legend = |chart: &str| {
        format!(
            "return Array.from(document.querySelectorAll('#chart-{chart} .u-series'))\
             .slice(1).map(s => s.querySelector('.u-label').textContent + '=' + \
             s.querySelector('.u-value').textContent)"
        )
    };
    for chart in ["rate", "workers", "cache"] {
        driver.wait_for(session, &legend(chart), |values| {
            let values = values.as_array().unwrap();
            !values.is_empty()
                && values
                    .iter()
                    .all(|value| !value.as_str().unwrap().ends_with("=--"))
        });
    }
    driver.wait_for(session, &legend("phases"), |values| {
        values.to_string().contains("\"connect=") && !values.to_string().contains("\"connect=--")
    });
    let rate = driver.script(session, &legend("rate")).to_string();
    assert!(
        rate.contains("\"refused=") && rate.contains("\"failed="),
        "{rate}"
    );
    let cache = driver.script(session, &legend("cache")).to_string();
    assert!(
        cache.contains("in memory=") && !cache.contains("limit"),
        "{cache}"
    );
    let limit = driver.script(
        session,
        "return document.getElementById('cache-limit').textContent",
    );
    assert!(limit.as_str().unwrap().parse::<f64>().is_ok(), "{limit}");
}

/// The history kept in the consolidated database (`--monitor-history-table-rows-max`)
/// holds the newest syncs only, and a restarted server shows them before any new sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_kept_in_the_database_outlives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    init_notes(&db);
    add_user(&db, "erin", "erin-password-1");
    let flags = [
        "--admin-listen",
        "127.0.0.1:0",
        "--monitor-history-table-rows-max",
        "2",
    ];
    let server = serve(&db, &flags);
    for _ in 0..3 {
        sync_client(&dir, "erin", &server.address, "erin-password-1").await;
    }
    let admin = server.admin.clone().expect("the admin banner");
    let ids = |syncs: &Value| -> Vec<u64> {
        let syncs = syncs.as_array().unwrap();
        syncs
            .iter()
            .map(|sync| sync["id"].as_u64().unwrap())
            .collect()
    };
    // A sync is recorded as its connection ends, which may be just after the client has
    // its download: the monitor is asked until the third shows (or 10 s have passed).
    let mut before = Value::Null;
    for _ in 0..200 {
        before = serde_json::from_str(&http_get(&admin, "/api/monitor/syncs?user=erin")).unwrap();
        if ids(&before).len() >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(ids(&before).len(), 3, "{before}");
    // Written within a second or so; the table keeps the newest two.
    let table = rusqlite::Connection::open(&db).unwrap();
    let stored = || -> Vec<(String, String)> {
        let mut query = table
            .prepare("SELECT user_name, outcome FROM rs_sync_history ORDER BY id")
            .unwrap();
        let rows = query.query_map([], |row| Ok((row.get(0)?, row.get(1)?)));
        rows.unwrap().map(Result::unwrap).collect()
    };
    let deadline = Instant::now() + PAGE_WAIT;
    while stored().len() < 2 || ids(&before)[0] != newest_stored_id(&table) {
        assert!(Instant::now() < deadline, "never written: {:?}", stored());
        std::thread::sleep(Duration::from_millis(50));
    }
    let erin_ok = ("erin".to_string(), "ok".to_string());
    assert_eq!(stored(), vec![erin_ok.clone(), erin_ok]);
    drop(server);

    let restarted = serve(&db, &flags);
    let admin = restarted.admin.clone().expect("the admin banner");
    let deadline = Instant::now() + PAGE_WAIT;
    let restored = loop {
        // Read back by a background task as the server starts.
        let syncs: Value =
            serde_json::from_str(&http_get(&admin, "/api/monitor/syncs?user=erin")).unwrap();
        if !ids(&syncs).is_empty() || Instant::now() > deadline {
            break syncs;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        ids(&restored),
        ids(&before)[..2],
        "the newest two, newest first"
    );
    assert_eq!(restored[0]["phases"], before[0]["phases"]);
    sync_client(&dir, "erin", &restarted.address, "erin-password-1").await;
    let after: Value =
        serde_json::from_str(&http_get(&admin, "/api/monitor/syncs?user=erin")).unwrap();
    let after_ids = ids(&after);
    assert_eq!(after_ids.len(), 3);
    assert!(
        after_ids[0] > after_ids[1],
        "a new sync is numbered after the history: {after_ids:?}"
    );
}

/// The monitor id of the newest sync in the history table.
fn newest_stored_id(table: &rusqlite::Connection) -> u64 {
    let record: Option<String> = table
        .query_row(
            "SELECT record FROM rs_sync_history ORDER BY id DESC LIMIT 1",
            [],
            |row| row.get(0),
        )
        .unwrap_or(None);
    record.map_or(0, |record| {
        serde_json::from_str::<Value>(&record).unwrap()["id"]
            .as_u64()
            .unwrap()
    })
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
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]
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
