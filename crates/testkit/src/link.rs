//! Link emulation on loopback: bandwidth, latency and cuts at a chosen byte offset,
//! through a real toxiproxy server (Shopify's TCP proxy for chaos tests).
//!
//! `tc netem` is not available in every kernel the tests run on; toxiproxy is a user-space
//! proxy, so it needs nothing of the kernel. [`Toxiproxy::start`] runs one server on a free
//! loopback port in a temporary directory, stopped when the last handle is dropped (and by
//! a watchdog when the test process ends however it ends). [`Toxiproxy::proxy`] opens a
//! [`Link`]: a listening address that forwards to an upstream address, whose toxics are set
//! and removed through toxiproxy's HTTP API (`POST /proxies`, `POST /proxies/{name}/toxics`,
//! `DELETE /proxies/{name}/toxics/{toxic}`).
//!
//! What toxiproxy does, so tests know what they measure:
//! - toxics act per connection: two connections through one link with a bandwidth toxic
//!   each get the whole rate (a shared bottleneck is emulated by giving each its share);
//! - `bandwidth` is in units of 1,000 bytes a second; [`Link::set_bandwidth`] takes kbit/s
//!   and refuses rates that are not a whole number of those units (a multiple of 8 kbit/s);
//! - `latency` delays every chunk of data in one direction by that many milliseconds, so
//!   a round trip pays the latency of both directions;
//! - `limit_data` closes a connection once that many bytes went through in one direction;
//!   the count starts again for every new connection while the toxic is set.
//!
//! The server program is found as `ROWSYNC_TOXIPROXY_SERVER`, else `toxiproxy-server` on
//! `PATH`, else `target/tools/toxiproxy-server` in this workspace, where `scripts/test`
//! installs it (`go install github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{free_port, watch};

/// How long a fresh server may take to answer its API.
const STARTUP_TIMEOUT_MS: u64 = 10_000;
/// The pause between two checks of a starting server.
const STARTUP_POLL_MS: u64 = 20;
/// How long one API call may take.
const API_TIMEOUT_MS: u64 = 10_000;
/// The largest API response read (toxiproxy's answers are a few hundred bytes).
const API_RESPONSE_BYTES_MAX: u64 = 1 << 20;

/// The direction of data a toxic acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the side connecting to [`Link::addr`]) to the upstream server.
    Upstream,
    /// From the upstream server back to the client.
    Downstream,
}

impl Direction {
    pub const BOTH: [Direction; 2] = [Direction::Upstream, Direction::Downstream];

    fn stream(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

/// A running toxiproxy server; stopped when this and every [`Link`] of it are dropped.
#[derive(Clone)]
pub struct Toxiproxy {
    inner: Arc<Server>,
}

struct Server {
    child: std::sync::Mutex<Child>,
    api: SocketAddr,
    proxies_created: AtomicUsize,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let child = self.child.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// One proxy of a [`Toxiproxy`] server: connect to [`Link::addr`] to reach the upstream.
pub struct Link {
    server: Arc<Server>,
    name: String,
    listen: SocketAddr,
}

/// The toxiproxy server program: see the module's documentation.
pub fn server_program() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("ROWSYNC_TOXIPROXY_SERVER") {
        return Ok(PathBuf::from(path));
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("toxiproxy-server");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    let installed =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/toxiproxy-server");
    if installed.is_file() {
        return Ok(installed);
    }
    Err(format!(
        "no toxiproxy server: set ROWSYNC_TOXIPROXY_SERVER, put toxiproxy-server on PATH, or run \
         scripts/test, which installs it as {}",
        installed.display()
    ))
}

impl Toxiproxy {
    /// Starts a server on a free loopback port; its log is in its temporary directory.
    pub fn start() -> Result<Toxiproxy, String> {
        let program = server_program()?;
        let dir = tempfile::Builder::new()
            .prefix("rowsync-toxiproxy-")
            .tempdir()
            .map_err(|error| format!("creating a temporary directory: {error}"))?;
        let log = std::fs::File::create(dir.path().join("toxiproxy.log"))
            .map_err(|error| format!("creating the toxiproxy log: {error}"))?;
        let log_err = log
            .try_clone()
            .map_err(|error| format!("opening the toxiproxy log: {error}"))?;
        let port = free_port()?;
        let child = Command::new(&program)
            .args(["-host", "127.0.0.1", "-port", &port.to_string()])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|error| format!("starting {}: {error}", program.display()))?;
        // Not as the unprivileged user: the server runs as this process's user.
        watch(
            &format!(
                "while [ -e /proc/{pid} ]; do sleep 1; done; kill {child} 2>/dev/null",
                pid = std::process::id(),
                child = child.id()
            ),
            false,
        )?;
        let server = Server {
            child: std::sync::Mutex::new(child),
            api: SocketAddr::from(([127, 0, 0, 1], port)),
            proxies_created: AtomicUsize::new(0),
            _dir: dir,
        };
        server.wait_ready()?;
        Ok(Toxiproxy {
            inner: Arc::new(server),
        })
    }

    /// A new proxy on a free loopback port, forwarding to `upstream`, with no toxics.
    pub fn proxy(&self, upstream: SocketAddr) -> Result<Link, String> {
        let n = self.inner.proxies_created.fetch_add(1, Ordering::SeqCst);
        let name = format!("link{n}");
        let body = format!(
            r#"{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}","enabled":true}}"#
        );
        let answer = self.inner.call("POST", "/proxies", Some(&body), 201)?;
        let listen = json_string_field(&answer, "listen")
            .ok_or_else(|| format!("toxiproxy answered no listen address: {answer}"))?;
        let listen = listen
            .parse()
            .map_err(|error| format!("toxiproxy's listen address {listen:?}: {error}"))?;
        Ok(Link {
            server: Arc::clone(&self.inner),
            name,
            listen,
        })
    }
}

impl Link {
    /// A link of its own server: [`Toxiproxy::start`] then [`Toxiproxy::proxy`].
    pub fn start(upstream: SocketAddr) -> Result<Link, String> {
        Toxiproxy::start()?.proxy(upstream)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// Delays every chunk of data in `direction` by `ms` milliseconds.
    pub fn set_latency(&self, direction: Direction, ms: u64) -> Result<(), String> {
        self.set_toxic(
            "latency",
            direction,
            &format!(r#"{{"latency":{ms},"jitter":0}}"#),
        )
    }

    /// Limits each connection to `kbit_per_s` (kilobits, 1,000 bits, a second) in
    /// `direction`; a multiple of 8 (toxiproxy counts whole 1,000-byte units).
    pub fn set_bandwidth(&self, direction: Direction, kbit_per_s: u64) -> Result<(), String> {
        if kbit_per_s == 0 || !kbit_per_s.is_multiple_of(8) {
            return Err(format!(
                "bandwidth {kbit_per_s} kbit/s: toxiproxy takes whole 1,000-byte units, so a \
                 positive multiple of 8 kbit/s"
            ));
        }
        let rate = kbit_per_s / 8;
        self.set_toxic("bandwidth", direction, &format!(r#"{{"rate":{rate}}}"#))
    }

    /// Closes each connection once `bytes` went through in `direction` (a cut at that
    /// offset), until [`Link::remove`] or [`Link::clear`].
    pub fn cut_after(&self, direction: Direction, bytes: u64) -> Result<(), String> {
        self.set_toxic("limit_data", direction, &format!(r#"{{"bytes":{bytes}}}"#))
    }

    /// Removes the toxic of `kind` (`latency`, `bandwidth`, `limit_data`) in `direction`;
    /// nothing to remove is not an error.
    pub fn remove(&self, kind: &str, direction: Direction) -> Result<(), String> {
        let path = format!(
            "/proxies/{}/toxics/{}",
            self.name,
            toxic_name(kind, direction)
        );
        match self.server.call("DELETE", &path, None, 204) {
            Ok(_) => Ok(()),
            Err(error) if error.contains("status 404") => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Removes every toxic this module sets, in both directions.
    pub fn clear(&self) -> Result<(), String> {
        for kind in ["latency", "bandwidth", "limit_data"] {
            for direction in Direction::BOTH {
                self.remove(kind, direction)?;
            }
        }
        Ok(())
    }

    fn set_toxic(&self, kind: &str, direction: Direction, attributes: &str) -> Result<(), String> {
        self.remove(kind, direction)?;
        let body = format!(
            r#"{{"name":"{}","type":"{kind}","stream":"{}","toxicity":1.0,"attributes":{attributes}}}"#,
            toxic_name(kind, direction),
            direction.stream()
        );
        let path = format!("/proxies/{}/toxics", self.name);
        self.server
            .call("POST", &path, Some(&body), 200)
            .map(|_| ())
    }
}

fn toxic_name(kind: &str, direction: Direction) -> String {
    format!("{kind}_{}", direction.stream())
}

impl Server {
    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_millis(STARTUP_TIMEOUT_MS);
        loop {
            match self.call("GET", "/version", None, 200) {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    return Err(format!(
                        "toxiproxy did not answer within {STARTUP_TIMEOUT_MS} ms: {error}"
                    ))
                }
                Err(_) => {}
            }
            let exited = self
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait()
                .map_err(|error| format!("checking toxiproxy: {error}"))?;
            if let Some(status) = exited {
                let log = std::fs::read_to_string(self._dir.path().join("toxiproxy.log"))
                    .unwrap_or_default();
                return Err(format!("toxiproxy exited at start ({status}): {log}"));
            }
            std::thread::sleep(Duration::from_millis(STARTUP_POLL_MS));
        }
    }

    /// One HTTP/1.1 request to the API; the response body when its status is `expect`.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        expect: u16,
    ) -> Result<String, String> {
        let what = format!("toxiproxy {method} {path}");
        let timeout = Duration::from_millis(API_TIMEOUT_MS);
        let mut stream = TcpStream::connect_timeout(&self.api, timeout)
            .map_err(|error| format!("{what}: {error}"))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .map_err(|error| format!("{what}: {error}"))?;
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: rowsync-testkit\r\n\
             Connection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.api,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|error| format!("{what}: {error}"))?;
        let mut response = Vec::new();
        stream
            .take(API_RESPONSE_BYTES_MAX)
            .read_to_end(&mut response)
            .map_err(|error| format!("{what}: {error}"))?;
        let response = String::from_utf8_lossy(&response);
        let status: u16 = response
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| format!("{what}: not an HTTP response: {response}"))?;
        let body = response
            .split_once("\r\n\r\n")
            .map_or("", |(_, body)| body)
            .to_string();
        if status == expect {
            Ok(body)
        } else {
            Err(format!("{what}: status {status}: {body}"))
        }
    }
}

/// The value of `"field":"value"` in a flat JSON object (toxiproxy writes no spaces).
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":\"");
    let start = json.find(&key)? + key.len();
    let end = json[start..].find('"')?;
    Some(json[start..start + end].to_string())
}
