//! The server under test, as its own `rowsync serve` process (as in the paper, where it
//! ran on its own computer): so that its CPU time and peak resident memory are its own.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rowsync_cli::cert::{self, KeyKind, PkiFiles};
use rowsync_testkit::farm::{Backend, HaProxy};

/// How long a starting server may take to listen.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The shared secret of the clients' HS256 tokens (written to a file for the server).
pub const TOKEN_SECRET: &[u8] = b"rowsync-bench timing token secret, thirty-two bytes or more";

/// Database workers: a fixed count or the controller's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    Fixed(usize),
    Auto(usize, usize),
}

impl Workers {
    pub fn label(self) -> String {
        match self {
            Workers::Fixed(n) => n.to_string(),
            Workers::Auto(min, max) => format!("auto {min}-{max}"),
        }
    }
    /// Connections the limit reference uses: the same as the workers (the most the
    /// controller may run).
    pub fn connections(self) -> usize {
        match self {
            Workers::Fixed(n) => n,
            Workers::Auto(_, max) => max,
        }
    }
}

/// The transport between clients and server (paper, Test 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Tls(KeyKind),
    Http,
    Https(KeyKind),
}

impl Protocol {
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCPIP",
            Protocol::Tls(KeyKind::EcdsaP256) => "TLS:ECC",
            Protocol::Tls(KeyKind::Rsa2048) => "TLS:RSA",
            Protocol::Http => "HTTP",
            Protocol::Https(KeyKind::EcdsaP256) => "HTTPS:ECC",
            Protocol::Https(KeyKind::Rsa2048) => "HTTPS:RSA",
        }
    }

    pub fn parse(text: &str) -> Result<Protocol> {
        Ok(match text.to_ascii_lowercase().as_str() {
            "tcp" => Protocol::Tcp,
            "tls" | "tls-ecc" | "tls-ecdsa" => Protocol::Tls(KeyKind::EcdsaP256),
            "tls-rsa" => Protocol::Tls(KeyKind::Rsa2048),
            "http" => Protocol::Http,
            "https" | "https-ecc" | "https-ecdsa" => Protocol::Https(KeyKind::EcdsaP256),
            "https-rsa" => Protocol::Https(KeyKind::Rsa2048),
            other => bail!(
                "unknown transport {other:?}: tcp, tls-ecc, tls-rsa, http, https-ecc or https-rsa"
            ),
        })
    }

    fn key_kind(self) -> Option<KeyKind> {
        match self {
            Protocol::Tls(kind) | Protocol::Https(kind) => Some(kind),
            Protocol::Tcp | Protocol::Http => None,
        }
    }
}

/// How one server is started.
#[derive(Debug, Clone)]
pub struct ServerSetup {
    pub db: String,
    pub workers: Workers,
    pub connections_max: usize,
    pub protocol: Protocol,
}

/// Where the servers of a point run: how many `rowsync serve` processes on the same
/// database, and whether the clients reach them through HAProxy (Test 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub servers: usize,
    pub proxy: bool,
}

impl Layout {
    /// One server, reached directly (Tests 1-5).
    pub const DIRECT: Layout = Layout {
        servers: 1,
        proxy: false,
    };

    pub fn label(self) -> String {
        let servers = match self.servers {
            1 => "1 server".to_string(),
            n => format!("{n} servers"),
        };
        if self.proxy {
            format!("{servers} via HAProxy")
        } else {
            servers
        }
    }
}

pub struct ServerProcess {
    child: Child,
    /// The URL clients use (`tcp://…`, `https://…`).
    pub url: String,
    /// The CA file clients must trust, for TLS and HTTPS.
    pub ca_file: Option<PathBuf>,
    pid: u32,
    /// The ports a load balancer needs (set when started with `backend`).
    backend: Option<Backend>,
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Test certificates of both kinds, made once per run.
pub struct Certificates {
    ecc: PkiFiles,
    rsa: PkiFiles,
}

impl Certificates {
    pub fn new(dir: &Path) -> Result<Certificates> {
        let names = ["localhost".to_string(), "127.0.0.1".to_string()];
        let ecc_dir = dir.join("ecc");
        let rsa_dir = dir.join("rsa");
        std::fs::create_dir_all(&ecc_dir)?;
        std::fs::create_dir_all(&rsa_dir)?;
        Ok(Certificates {
            ecc: cert::write_test_pki(&ecc_dir, &names, KeyKind::EcdsaP256)?,
            rsa: cert::write_test_pki(&rsa_dir, &names, KeyKind::Rsa2048)?,
        })
    }

    fn files(&self, kind: KeyKind) -> &PkiFiles {
        match kind {
            KeyKind::EcdsaP256 => &self.ecc,
            KeyKind::Rsa2048 => &self.rsa,
        }
    }
}

impl ServerProcess {
    /// Starts `program serve` and waits until it accepts connections.
    /// With `backend`, it also listens for HTTP syncs and on an admin port (`/readyz`),
    /// as a server behind HAProxy does.
    pub fn start(
        program: &Path,
        setup: &ServerSetup,
        work_dir: &Path,
        certificates: &Certificates,
        backend: bool,
    ) -> Result<ServerProcess> {
        let secret_file = work_dir.join("token-secret");
        std::fs::write(&secret_file, TOKEN_SECRET)?;
        let plain: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut command = Command::new(program);
        command
            .arg("serve")
            .arg("--db")
            .arg(&setup.db)
            .arg("--listen")
            .arg(plain.to_string())
            .arg("--max-connections")
            .arg(setup.connections_max.to_string())
            .arg("--jwt-hs256-secret-file")
            .arg(&secret_file)
            // No tombstone cleanup in the middle of a timed set.
            .arg("--cleanup-interval-seconds")
            .arg("86400")
            .env("ROWSYNC_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work_dir.join("server.log"))?);
        match setup.workers {
            Workers::Fixed(n) => command.arg("--workers").arg(n.to_string()),
            Workers::Auto(min, max) => command
                .arg("--workers-min")
                .arg(min.to_string())
                .arg("--workers-max")
                .arg(max.to_string()),
        };
        let mut ca_file = None;
        let (url, protocol_port) = match setup.protocol {
            Protocol::Tcp => (format!("tcp://{plain}"), None),
            protocol => {
                let port = free_port()?;
                let address = format!("127.0.0.1:{port}");
                let (flag, scheme) = match protocol {
                    Protocol::Tls(_) => ("--tls-listen", "tls"),
                    Protocol::Http => ("--http-listen", "http"),
                    _ => ("--https-listen", "https"),
                };
                command.arg(flag).arg(&address);
                if let Some(kind) = protocol.key_kind() {
                    let files = certificates.files(kind);
                    command
                        .arg("--cert")
                        .arg(&files.server_cert)
                        .arg("--key")
                        .arg(&files.server_key);
                    ca_file = Some(files.ca_cert.clone());
                }
                (format!("{scheme}://{address}"), Some(port))
            }
        };
        let backend = match backend {
            true => Some(backend_ports(
                &mut command,
                setup.protocol,
                plain.port(),
                protocol_port,
            )?),
            false => None,
        };
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let pid = child.id();
        let started = Instant::now();
        loop {
            if std::net::TcpStream::connect(plain).is_ok() {
                break;
            }
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(work_dir.join("server.log")).unwrap_or_default();
                bail!("the server exited at start ({status}): {log}");
            }
            if started.elapsed() > SERVER_START_TIMEOUT {
                let _ = child.kill();
                bail!("the server did not listen on {plain} within {SERVER_START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(ServerProcess {
            child,
            url,
            ca_file,
            pid,
            backend,
        })
    }

    /// The server process's id, for the CPU meter.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's peak resident memory so far, in bytes.
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .context("reading the server's /proc status")?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .context("no VmHWM in /proc status")?;
        Ok(kib * 1024)
    }

    pub fn stop(mut self) -> Result<()> {
        self.child.kill().ok();
        self.child.wait()?;
        Ok(())
    }
}

/// The servers of one point, laid out as a [`Layout`] says: the processes and, in front
/// of them, HAProxy; clients use `url`.
pub struct Servers {
    processes: Vec<ServerProcess>,
    proxy: Option<HaProxy>,
    pub url: String,
    pub ca_file: Option<PathBuf>,
}

impl Servers {
    pub fn start(
        program: &Path,
        setup: &ServerSetup,
        layout: Layout,
        work_dir: &Path,
        certificates: &Certificates,
    ) -> Result<Servers> {
        let mut processes = Vec::new();
        for n in 0..layout.servers {
            let dir = work_dir.join(format!("server{n}"));
            std::fs::create_dir_all(&dir)?;
            let process = ServerProcess::start(program, setup, &dir, certificates, layout.proxy)?;
            processes.push(process);
        }
        let (url, ca_file) = (processes[0].url.clone(), processes[0].ca_file.clone());
        if !layout.proxy {
            return Ok(Servers {
                processes,
                proxy: None,
                url,
                ca_file,
            });
        }
        let backends: Vec<Backend> = processes.iter().filter_map(|p| p.backend).collect();
        let proxy = HaProxy::start(&backends).map_err(anyhow::Error::msg)?;
        let url = match setup.protocol {
            Protocol::Http => format!("http://127.0.0.1:{}", proxy.http_port),
            _ => format!("tcp://127.0.0.1:{}", proxy.tcp_port),
        };
        Ok(Servers {
            processes,
            proxy: Some(proxy),
            url,
            ca_file,
        })
    }

    /// The processes whose CPU is the serving tier's: the servers and HAProxy.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.processes.iter().map(ServerProcess::pid).collect();
        pids.extend(self.proxy.as_ref().map(HaProxy::pid));
        pids
    }

    /// The syncs each server completed so far (from its `/metrics`), where the servers
    /// have admin ports (behind HAProxy); empty otherwise.
    pub fn syncs_per_server(&self) -> Result<Vec<u64>> {
        self.processes
            .iter()
            .filter_map(|process| process.backend)
            .map(|backend| syncs_served(backend.admin_port))
            .collect()
    }

    /// The servers' peak resident memory so far, summed, in bytes.
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        self.processes
            .iter()
            .map(ServerProcess::peak_rss_bytes)
            .sum()
    }

    pub fn stop(self) -> Result<()> {
        drop(self.proxy);
        for process in self.processes {
            process.stop()?;
        }
        Ok(())
    }
}

/// `rowsync_syncs_total{outcome="ok"}` from the `/metrics` of the admin port `port`.
fn syncs_served(port: u16) -> Result<u64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .with_context(|| format!("connecting to the admin port {port}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("rowsync_syncs_total{outcome=\"ok\"} "))
        .and_then(|count| count.trim().parse().ok())
        .with_context(|| {
            format!("no rowsync_syncs_total{{outcome=\"ok\"}} in the /metrics of port {port}")
        })
}

/// Adds an admin listener (and an HTTP one, unless the protocol is HTTP and listens on
/// `protocol_port` already) to a server's command line; returns the ports HAProxy
/// balances to.
fn backend_ports(
    command: &mut Command,
    protocol: Protocol,
    tcp_port: u16,
    protocol_port: Option<u16>,
) -> Result<Backend> {
    let admin_port = free_port()?;
    command
        .arg("--admin-listen")
        .arg(format!("127.0.0.1:{admin_port}"));
    let http_port = match protocol {
        Protocol::Tcp => {
            let port = free_port()?;
            command
                .arg("--http-listen")
                .arg(format!("127.0.0.1:{port}"));
            port
        }
        Protocol::Http => protocol_port.context("an HTTP server listens for HTTP")?,
        other => bail!(
            "servers behind HAProxy take tcp or http, not {}",
            other.label()
        ),
    };
    Ok(Backend {
        tcp_port,
        http_port,
        admin_port,
    })
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
