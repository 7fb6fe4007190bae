//! A throwaway MariaDB server for tests, started the way the PostgreSQL cluster is.
//!
//! [`mysql`] starts one server per test process, on first use: `mariadb-install-db`
//! (from Debian's `mariadb-server`) into a temporary directory, then `mariadbd` on a free
//! loopback port with its socket in that directory, fsync relaxed, no binary log. An init
//! file creates the passwordless user `rowsync`@`127.0.0.1`. When run as root, the server
//! runs as the unprivileged user `nobody` (mariadbd refuses root without `--user`). A
//! watchdog process kills the server when the test process exits, however it exits, and
//! removes the directory.
//!
//! Set `ROWSYNC_TEST_MYSQL_URL` (for example `mysql://me:secret@127.0.0.1:3306/test`) to
//! use an existing MariaDB or MySQL server instead; tests then create their own databases
//! on it. Each test takes a fresh database from [`fresh_mysql_database`].

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;

use crate::{free_port, is_root, run, watch, UNPRIVILEGED_GID, UNPRIVILEGED_UID};

/// How long a fresh server may take to accept connections.
const STARTUP_TIMEOUT_MS: u64 = 60_000;
/// The pause between two checks of a starting server.
const STARTUP_POLL_MS: u64 = 100;

pub struct MysqlServer {
    /// `mysql://user@host:port` without a database name.
    base_url: String,
    /// Keeps the server's directory alive for the life of the process.
    dir: Option<tempfile::TempDir>,
    databases_created: AtomicUsize,
}

/// The process-wide MariaDB server, started on first use.
pub fn mysql() -> &'static MysqlServer {
    static SERVER: OnceLock<MysqlServer> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("ROWSYNC_TEST_MYSQL_URL") {
        Ok(url) => MysqlServer {
            base_url: base_of(&url),
            dir: None,
            databases_created: AtomicUsize::new(0),
        },
        Err(_) => MysqlServer::start()
            .unwrap_or_else(|error| panic!("starting a throwaway MariaDB server: {error}")),
    })
}

/// `mysql://user@host:port/db?x` without `/db?x`.
fn base_of(url: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |at| at + 3);
    match url[scheme_end..].find('/') {
        Some(slash) => url[..scheme_end + slash].to_string(),
        None => url.to_string(),
    }
}

/// A new, empty database on the process-wide server; returns its URL.
pub async fn fresh_mysql_database(prefix: &str) -> String {
    let server = mysql();
    let name = server.fresh_database_name(prefix);
    let admin_url = server.url("");
    let mut connection = mysql_async::Conn::from_url(&admin_url)
        .await
        .unwrap_or_else(|error| panic!("connecting to {admin_url}: {error}"));
    connection
        .query_drop(format!("CREATE DATABASE `{name}`"))
        .await
        .unwrap_or_else(|error| panic!("creating database {name}: {error}"));
    let _ = connection.disconnect().await;
    server.url(&name)
}

impl MysqlServer {
    fn start() -> Result<MysqlServer, String> {
        MysqlServer::start_with(None)
    }

    /// A server of its own that takes TCP connections only over TLS
    /// (`require_secure_transport`) with `tls`'s certificate; killed at exit.
    pub fn start_tls_only(tls: &crate::TlsFiles<'_>) -> Result<MysqlServer, String> {
        MysqlServer::start_with(Some(tls))
    }

    fn start_with(tls: Option<&crate::TlsFiles<'_>>) -> Result<MysqlServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("rowsync-mysql-")
            .tempdir()
            .map_err(|error| format!("creating a temporary directory: {error}"))?;
        let root = is_root();
        if root {
            std::os::unix::fs::chown(dir.path(), Some(UNPRIVILEGED_UID), Some(UNPRIVILEGED_GID))
                .map_err(|error| format!("handing {} to nobody: {error}", dir.path().display()))?;
        }
        let as_server_user = |command: &mut Command| {
            if root {
                use std::os::unix::process::CommandExt;
                command.uid(UNPRIVILEGED_UID).gid(UNPRIVILEGED_GID);
            }
            command.current_dir(dir.path());
        };
        let data = dir.path().join("data");
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        as_server_user(&mut install);
        run(
            &mut install,
            "mariadb-install-db (install the mariadb-server package)",
        )?;

        let init = dir.path().join("init.sql");
        std::fs::write(
            &init,
            "CREATE USER IF NOT EXISTS 'rowsync'@'127.0.0.1';\n\
             GRANT ALL PRIVILEGES ON *.* TO 'rowsync'@'127.0.0.1' WITH GRANT OPTION;\n",
        )
        .map_err(|error| format!("writing {}: {error}", init.display()))?;
        let port = free_port()?;
        let socket = dir.path().join("mysqld.sock");
        let mut server = Command::new("mariadbd");
        server
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--port={port}"))
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mysqld.pid").display()
            ))
            .arg(format!(
                "--log-error={}",
                dir.path().join("server.log").display()
            ))
            .arg(format!("--init-file={}", init.display()))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-networking=0",
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-doublewrite=0",
                "--innodb-buffer-pool-size=128M",
                "--max-connections=300",
                // Text compares byte for byte, as on the other backends.
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_bin",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(tls) = tls {
            server.args(only_tls(dir.path(), tls, root)?);
        }
        as_server_user(&mut server);
        let child = server
            .spawn()
            .map_err(|error| format!("starting mariadbd: {error}"))?;
        // The watchdog kills the server (as `-m immediate` does for PostgreSQL): its data
        // is thrown away anyway.
        watch(
            &format!(
                "while [ -e /proc/{pid} ]; do sleep 1; done; kill -9 {server} 2>/dev/null; sleep 1; rm -rf '{dir}'",
                pid = std::process::id(),
                server = child.id(),
                dir = dir.path().display(),
            ),
            root,
        )?;
        wait_until_alive(&socket, dir.path())?;
        Ok(MysqlServer {
            base_url: format!("mysql://rowsync@127.0.0.1:{port}"),
            dir: Some(dir),
            databases_created: AtomicUsize::new(0),
        })
    }

    /// The server's error log: a throwaway server's own; `None` for one named by
    /// `ROWSYNC_TEST_MYSQL_URL`.
    pub fn log_file(&self) -> Option<std::path::PathBuf> {
        self.dir.as_ref().map(|dir| dir.path().join("server.log"))
    }

    /// `mysql://user@host:port/name`
    pub fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.base_url)
    }

    /// A name for a new, empty database, unique in this process.
    pub fn fresh_database_name(&self, prefix: &str) -> String {
        let n = self.databases_created.fetch_add(1, Ordering::SeqCst);
        format!("{prefix}_{}_{n}", std::process::id())
    }
}

/// Waits until the server answers on its socket (`mariadb-admin ping` succeeds once the
/// server accepts connections, whether or not it would let this user in).
fn wait_until_alive(socket: &Path, dir: &Path) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(STARTUP_TIMEOUT_MS) {
        let alive = Command::new("mariadb-admin")
            .arg("--no-defaults")
            .arg(format!("--socket={}", socket.display()))
            .args(["--connect-timeout=1", "ping"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if alive {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(STARTUP_POLL_MS));
    }
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    Err(format!(
        "mariadbd did not answer within {STARTUP_TIMEOUT_MS} ms; its log:\n{log}"
    ))
}

/// Writes the certificate and key (readable by the server's user alone); the server
/// options that take TCP connections only over TLS.
fn only_tls(dir: &Path, tls: &crate::TlsFiles<'_>, root: bool) -> Result<Vec<String>, String> {
    let certificate = crate::write_owned(dir, "server.crt", tls.certificate_pem, 0o644, root)?;
    let key = crate::write_owned(dir, "server.key", tls.key_pem, 0o600, root)?;
    Ok(vec![
        format!("--ssl-cert={}", certificate.display()),
        format!("--ssl-key={}", key.display()),
        "--require-secure-transport=ON".to_string(),
        // The client is 'rowsync'@'127.0.0.1' whatever 127.0.0.1 resolves to.
        "--skip-name-resolve".to_string(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_drops_the_database_and_options() {
        assert_eq!(base_of("mysql://u:p@h:1/db?x=1"), "mysql://u:p@h:1");
        assert_eq!(base_of("mysql://u@h:1"), "mysql://u@h:1");
    }

    #[tokio::test]
    async fn a_fresh_database_takes_queries() {
        let url = fresh_mysql_database("testkit").await;
        let mut connection = mysql_async::Conn::from_url(&url).await.unwrap();
        let one: Option<i64> = connection.query_first("SELECT 1").await.unwrap();
        assert_eq!(one, Some(1));
    }
}
