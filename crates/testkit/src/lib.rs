//! Throwaway database servers for tests: PostgreSQL ([`postgres`]) and MariaDB
//! ([`mysql`], in the `mysql` module); link emulation (bandwidth, latency, cuts at a byte
//! offset) through a throwaway toxiproxy server in [`link`].
//!
//! [`postgres`] starts one cluster per test process, on first use: `initdb` from the
//! PostgreSQL packages (found with `pg_config --bindir`, or `ROWSYNC_PG_BINDIR`) into a
//! temporary directory, a free loopback port, no network listener beyond 127.0.0.1.
//! When run as root, the cluster runs as the unprivileged user `nobody`. A watchdog
//! process stops the cluster when the test process exits, however it exits.
//!
//! Set `ROWSYNC_TEST_POSTGRES_URL` (for example `postgres://me@localhost:5432/postgres`)
//! to use an existing server instead; tests then create and drop their own databases
//! on it.
//!
//! Each test takes a fresh database named by [`PgCluster::fresh_database_name`].
//!
//! Transaction ids are cluster-wide, so a transaction open in one test's database holds
//! back the download watermark of syncs in every other database (safe: those rows are
//! downloaded again, never missed). Tests that assert exact downloads take
//! [`exclusive`] for their whole run; autovacuum is off for the same reason.

// Test support, not product: a server start-up reads as one script; the limit is for the product.
#![allow(clippy::too_many_lines)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

pub mod farm;
pub mod link;
mod mysql;
pub use mysql::{fresh_mysql_database, mysql, MysqlServer};

/// The unprivileged user a cluster runs as when tests run as root.
pub(crate) const UNPRIVILEGED_UID: u32 = 65534;
pub(crate) const UNPRIVILEGED_GID: u32 = 65534;

pub struct PgCluster {
    /// `postgres://user@host:port` without a database name.
    base_url: String,
    /// Keeps the cluster's directory alive for the life of the process.
    _dir: Option<tempfile::TempDir>,
    databases_created: AtomicUsize,
}

/// The process-wide cluster, started on first use.
pub fn postgres() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| match std::env::var("ROWSYNC_TEST_POSTGRES_URL") {
        Ok(url) => PgCluster {
            base_url: url
                .rsplit_once('/')
                .map(|(base, _)| base.to_string())
                .unwrap_or(url),
            _dir: None,
            databases_created: AtomicUsize::new(0),
        },
        Err(_) => PgCluster::start()
            .unwrap_or_else(|error| panic!("starting a throwaway PostgreSQL cluster: {error}")),
    })
}

/// A new, empty database on the process-wide cluster; returns its URL.
pub async fn fresh_database(prefix: &str) -> String {
    let cluster = postgres();
    let name = cluster.fresh_database_name(prefix);
    let admin_url = cluster.url("postgres");
    let (client, connection) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|error| panic!("connecting to {admin_url}: {error}"));
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap_or_else(|error| panic!("creating database {name}: {error}"));
    cluster.url(&name)
}

/// A connection to `url`, its driver task spawned on the current runtime.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|error| panic!("connecting to {url}: {error}"));
    tokio::spawn(connection);
    client
}

/// [`fresh_database`] with `sql` run in it: its URL and a connection to it.
pub async fn fresh_database_with(prefix: &str, sql: &str) -> (String, tokio_postgres::Client) {
    let url = fresh_database(prefix).await;
    let client = connect(&url).await;
    client
        .batch_execute(sql)
        .await
        .unwrap_or_else(|error| panic!("running {sql}: {error}"));
    (url, client)
}

/// Serializes the tests that hold it: one at a time per process.
pub async fn exclusive() -> tokio::sync::OwnedMutexGuard<()> {
    static LOCK: OnceLock<std::sync::Arc<tokio::sync::Mutex<()>>> = OnceLock::new();
    let lock = LOCK.get_or_init(|| std::sync::Arc::new(tokio::sync::Mutex::new(())));
    std::sync::Arc::clone(lock).lock_owned().await
}

pub(crate) fn pg_bin_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("ROWSYNC_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let output = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .map_err(|error| format!("running pg_config (install the postgresql package): {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "pg_config --bindir failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if dir.join("initdb").exists() {
        return Ok(dir);
    }
    // Debian's pg_config may point at /usr/bin, where initdb is not linked.
    for version in ["17", "16", "15", "14"] {
        let candidate = PathBuf::from(format!("/usr/lib/postgresql/{version}/bin"));
        if candidate.join("initdb").exists() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "no initdb in {} (install postgresql-15)",
        dir.display()
    ))
}

/// Writes the certificate and key into the data directory (the key readable by the
/// cluster's user alone, as PostgreSQL demands) and a pg_hba.conf of `hostssl` only;
/// the server options that turn TLS on.
fn only_tls(data: &Path, tls: &TlsFiles<'_>, root: bool) -> Result<String, String> {
    let certificate = write_owned(data, "server.crt", tls.certificate_pem, 0o644, root)?;
    let key = write_owned(data, "server.key", tls.key_pem, 0o600, root)?;
    let hba = "hostssl all all 127.0.0.1/32 trust\nlocal all all trust\n";
    write_owned(data, "pg_hba.conf", hba, 0o600, root)?;
    Ok(format!(
        " -c ssl=on -c ssl_cert_file='{}' -c ssl_key_file='{}'",
        certificate.display(),
        key.display()
    ))
}

/// Writes `text` to `dir/name` with `mode`, owned by the servers' user when run as root.
pub(crate) fn write_owned(
    dir: &Path,
    name: &str,
    text: &str,
    mode: u32,
    root: bool,
) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|error| format!("writing {name}: {error}"))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
        .map_err(|error| format!("{name}: {error}"))?;
    if root {
        std::os::unix::fs::chown(&path, Some(UNPRIVILEGED_UID), Some(UNPRIVILEGED_GID))
            .map_err(|error| format!("{name}: {error}"))?;
    }
    Ok(path)
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|error| format!("{what}: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|error| format!("finding a free port: {error}"))?;
    Ok(listener
        .local_addr()
        .map_err(|error| error.to_string())?
        .port())
}

/// A server certificate and its key (PEM), for a cluster that takes only TLS.
pub struct TlsFiles<'a> {
    pub certificate_pem: &'a str,
    pub key_pem: &'a str,
}

/// How a cluster lets clients in.
enum Access<'a> {
    /// Anyone, without a password (the process-wide cluster).
    Trust,
    /// Only over TLS.
    TlsOnly(&'a TlsFiles<'a>),
    /// Over TCP only with the password of user `postgres` (scram-sha-256).
    Password(&'a str),
}

impl PgCluster {
    /// A cluster of its own (trust on loopback), for a test that changes its settings;
    /// stopped when dropped or at exit.
    pub fn start() -> Result<PgCluster, String> {
        PgCluster::start_with(Access::Trust)
    }

    /// A cluster of its own that takes only TLS connections (`ssl = on`, `hostssl`
    /// alone in pg_hba.conf) with `tls`'s certificate; stopped when dropped or at exit.
    pub fn start_tls_only(tls: &TlsFiles<'_>) -> Result<PgCluster, String> {
        PgCluster::start_with(Access::TlsOnly(tls))
    }

    /// A cluster of its own whose TCP connections need the password of user `postgres`
    /// (scram-sha-256); its [`url`](PgCluster::url)s carry no password.
    pub fn start_with_password(password: &str) -> Result<PgCluster, String> {
        PgCluster::start_with(Access::Password(password))
    }

    fn start_with(access: Access<'_>) -> Result<PgCluster, String> {
        let bin = pg_bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("rowsync-pg-")
            .tempdir()
            .map_err(|error| format!("creating a temporary directory: {error}"))?;
        let root = is_root();
        if root {
            std::os::unix::fs::chown(dir.path(), Some(UNPRIVILEGED_UID), Some(UNPRIVILEGED_GID))
                .map_err(|error| format!("handing {} to nobody: {error}", dir.path().display()))?;
        }
        let data = dir.path().join("data");
        let as_cluster_user = |command: &mut Command| {
            if root {
                command.uid(UNPRIVILEGED_UID).gid(UNPRIVILEGED_GID);
            }
            command.current_dir(dir.path()).env_remove("PGDATA");
        };
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]);
        if let Access::Password(password) = access {
            let file = write_owned(dir.path(), "pwfile", password, 0o600, root)?;
            initdb.args(["--auth-local=trust", "--auth-host=scram-sha-256"]);
            initdb.arg(format!("--pwfile={}", file.display()));
        } else {
            initdb.arg("--auth=trust");
        }
        as_cluster_user(&mut initdb);
        run(&mut initdb, "initdb")?;
        let tls_options = match access {
            Access::TlsOnly(tls) => only_tls(&data, tls, root)?,
            Access::Trust | Access::Password(_) => String::new(),
        };

        let port = free_port()?;
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}' -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c autovacuum=off \
             -c max_prepared_transactions=64{tls_options}",
            dir.path().display()
        );
        let mut start = Command::new(bin.join("pg_ctl"));
        start
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("server.log"))
            .args(["-o", &options, "-w", "-t", "60", "start"]);
        as_cluster_user(&mut start);
        run(&mut start, "pg_ctl start")?;
        spawn_watchdog(&bin, &data, root)?;
        Ok(PgCluster {
            base_url: format!("postgres://postgres@127.0.0.1:{port}"),
            _dir: Some(dir),
            databases_created: AtomicUsize::new(0),
        })
    }

    /// The server's log file: a throwaway cluster's own; `None` for a server named by
    /// `ROWSYNC_TEST_POSTGRES_URL`, whose log this process cannot know.
    pub fn log_file(&self) -> Option<PathBuf> {
        self._dir.as_ref().map(|dir| dir.path().join("server.log"))
    }

    /// `postgres://user@host:port/name`
    pub fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.base_url)
    }

    /// A name for a new, empty database, unique in this process; the caller creates it
    /// (`CREATE DATABASE`) through its own driver, so this crate needs none.
    pub fn fresh_database_name(&self, prefix: &str) -> String {
        let n = self.databases_created.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}_{}_{n}", std::process::id())
    }
}

/// A shell that waits for this process to end, then stops the cluster, so no test run
/// leaves a server behind, even after a panic or abort.
fn spawn_watchdog(bin: &Path, data: &Path, root: bool) -> Result<(), String> {
    let script = format!(
        "while [ -e /proc/{pid} ]; do sleep 1; done; '{pg_ctl}' -D '{data}' -m immediate -w stop >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = data.parent().unwrap_or(data).display(),
    );
    watch(&script, root)
}

/// Runs `shell` (a loop that waits for this process to end, then stops a server) in a
/// session of its own, as the unprivileged user when tests run as root.
pub(crate) fn watch(shell: &str, root: bool) -> Result<(), String> {
    let mut watchdog = Command::new("sh");
    watchdog
        .args(["-c", shell])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if root {
        watchdog.uid(UNPRIVILEGED_UID).gid(UNPRIVILEGED_GID);
    }
    // SAFETY: setsid is async-signal-safe; it detaches the watchdog from our process group
    // so a ^C to the tests does not kill it before it has stopped the server.
    unsafe {
        watchdog.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    watchdog
        .spawn()
        .map_err(|error| format!("starting the server watchdog: {error}"))?;
    Ok(())
}
