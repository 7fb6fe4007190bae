//! A highly available farm on loopback for tests (docs/operations.md, "Running a farm"):
//! PostgreSQL 15 made highly available by pg_auto_failover (a monitor and two nodes,
//! synchronous replication, failover tuned to seconds) and HAProxy in front of the
//! rowsync servers, each in a temporary directory on free ports, stopped when dropped.
//! The engines are the Debian packages `postgresql-15-auto-failover`,
//! `pg-auto-failover-cli` and `haproxy`, which the test command installs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, is_root, pg_bin_dir, UNPRIVILEGED_GID, UNPRIVILEGED_UID};

/// One rowsync server behind the load balancer: its sync ports and the admin port
/// whose `/readyz` the health check asks.
#[derive(Debug, Clone, Copy)]
pub struct Backend {
    pub tcp_port: u16,
    pub http_port: u16,
    pub admin_port: u16,
}

/// HAProxy balancing TCP and HTTP syncs over [`Backend`]s, each checked on `/readyz`
/// every 200 ms (out after two failures, in after one success); killed when dropped.
pub struct HaProxy {
    child: Child,
    /// The TCP frontend (`tcp://127.0.0.1:port`).
    pub tcp_port: u16,
    /// The HTTP frontend (`http://127.0.0.1:port/sync`).
    pub http_port: u16,
    _dir: tempfile::TempDir,
}

impl HaProxy {
    pub fn start(backends: &[Backend]) -> Result<HaProxy, String> {
        let binary = find_program("haproxy", &["/usr/sbin/haproxy"])?;
        let dir = tempfile::Builder::new()
            .prefix("rowsync-haproxy-")
            .tempdir()
            .map_err(|error| format!("creating a temporary directory: {error}"))?;
        let (tcp_port, http_port) = (free_port()?, free_port()?);
        let config = haproxy_config(tcp_port, http_port, backends);
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).map_err(|error| format!("writing {path:?}: {error}"))?;
        let check = Command::new(&binary)
            .arg("-c")
            .arg("-f")
            .arg(&path)
            .output()
            .map_err(|error| format!("running haproxy -c: {error}"))?;
        if !check.status.success() {
            return Err(format!(
                "haproxy refused its configuration: {}",
                String::from_utf8_lossy(&check.stdout)
            ));
        }
        let child = Command::new(&binary)
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|error| format!("starting haproxy: {error}"))?;
        let proxy = HaProxy {
            child,
            tcp_port,
            http_port,
            _dir: dir,
        };
        wait_for(Duration::from_secs(10), "haproxy's frontends", || {
            std::net::TcpStream::connect(("127.0.0.1", tcp_port)).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", http_port)).is_ok()
        })?;
        Ok(proxy)
    }

    /// The HAProxy process's id (for a CPU meter).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The configuration: a TCP and an HTTP frontend, each balancing to the backends'
/// ports by the fewest connections, health checked on each backend's admin `/readyz`.
fn haproxy_config(tcp_port: u16, http_port: u16, backends: &[Backend]) -> String {
    let servers = |port: fn(&Backend) -> u16| {
        backends
            .iter()
            .enumerate()
            .map(|(n, backend)| {
                format!(
                    "    server rowsync{n} 127.0.0.1:{} check port {} inter 200ms fall 2 rise 1\n",
                    port(backend),
                    backend.admin_port
                )
            })
            .collect::<String>()
    };
    format!(
        "global\n    maxconn 4096\n\
         defaults\n    timeout connect 2s\n    timeout client 120s\n    timeout server 120s\n    \
         timeout check 1s\n    option redispatch\n    retries 2\n\
         frontend tcp_in\n    mode tcp\n    bind 127.0.0.1:{tcp_port}\n    default_backend tcp_servers\n\
         backend tcp_servers\n    mode tcp\n    balance leastconn\n    option httpchk GET /readyz\n{}\
         frontend http_in\n    mode http\n    bind 127.0.0.1:{http_port}\n    default_backend http_servers\n\
         backend http_servers\n    mode http\n    balance leastconn\n    option httpchk GET /readyz\n{}",
        servers(|backend| backend.tcp_port),
        servers(|backend| backend.http_port),
    )
}

/// The first of `program` on the PATH or `fallbacks`, or what to install.
fn find_program(program: &str, fallbacks: &[&str]) -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .collect::<Vec<_>>()
    });
    on_path
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("{program} not found: run scripts/test, which installs it"))
}

/// Polls `ready` every 100 ms until it holds, or fails naming `what` after `limit`.
fn wait_for(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) -> Result<(), String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{what} not ready after {} s", limit.as_secs()))
}

/// The monitor's settings that bring a failover down to about two seconds (defaults:
/// 5 s checks, a node unhealthy after 20 s, a demote timeout of 30 s: ~50 s in all).
const MONITOR_SETTINGS: &str = "
ALTER SYSTEM SET pgautofailover.health_check_period = 1000;
ALTER SYSTEM SET pgautofailover.health_check_timeout = 1000;
ALTER SYSTEM SET pgautofailover.health_check_max_retries = 1;
ALTER SYSTEM SET pgautofailover.health_check_retry_delay = 100;
ALTER SYSTEM SET pgautofailover.node_considered_unhealthy_timeout = 1000;
ALTER SYSTEM SET pgautofailover.primary_demote_timeout = 1000;
ALTER SYSTEM SET pgautofailover.startup_grace_period = 1000;
SELECT pg_reload_conf();
";

/// The keepers' own timeouts, in seconds, shortened to match.
const KEEPER_SETTINGS: [(&str, &str); 5] = [
    ("timeout.prepare_promotion_walreceiver", "1"),
    ("timeout.prepare_promotion_catchup", "5"),
    ("timeout.network_partition_timeout", "5"),
    ("timeout.postgresql_restart_failure_timeout", "5"),
    ("timeout.postgresql_restart_failure_max_retries", "1"),
];

/// Seconds a farm may take to reach one primary and one secondary.
const HA_WAIT_SECONDS: u64 = 120;

/// PostgreSQL 15 made highly available by pg_auto_failover: a monitor and two nodes
/// (`node1`, `node2`) with synchronous replication (`replication-quorum`), each node's
/// keeper and PostgreSQL in a process group of their own so a test can lose a whole
/// node at once. Runs as `nobody` when the tests run as root. Stopped when dropped.
pub struct PgFarm {
    dir: tempfile::TempDir,
    bin: PathBuf,
    monitor_port: u16,
    node_ports: [u16; 2],
    /// The running `pg_autoctl run` of the monitor and of each node.
    keepers: Vec<(String, Child)>,
}

impl PgFarm {
    pub fn start() -> Result<PgFarm, String> {
        let bin = pg_bin_dir()?;
        find_program("pg_autoctl", &["/usr/bin/pg_autoctl"])?;
        let dir = tempfile::Builder::new()
            .prefix("rowsync-farm-")
            .tempdir()
            .map_err(|error| format!("creating a temporary directory: {error}"))?;
        for sub in ["home", "config", "data", "run", "tmp", "sock", "logs"] {
            let path = dir.path().join(sub);
            std::fs::create_dir_all(&path).map_err(|error| format!("{path:?}: {error}"))?;
            hand_over(&path)?;
        }
        hand_over(dir.path())?;
        let mut farm = PgFarm {
            dir,
            bin,
            monitor_port: free_port()?,
            node_ports: [free_port()?, free_port()?],
            keepers: Vec::new(),
        };
        farm.start_monitor()?;
        farm.start_node(0)?;
        wait_for(Duration::from_secs(60), "node1 as a single node", || {
            farm.node_states().contains("single")
        })?;
        farm.start_node(1)?;
        farm.wait_until_replicated()?;
        for node in ["node1", "node2"] {
            for (setting, value) in KEEPER_SETTINGS {
                let pgdata = farm.path(node);
                farm.autoctl(&["config", "set", "--pgdata"], &pgdata, &[setting, value])?;
            }
        }
        Ok(farm)
    }

    /// The URL rowsync connects with: both nodes, the writable one chosen
    /// (`target_session_attrs=read-write`), as the superuser `postgres` of database
    /// `farm`.
    pub fn url(&self) -> String {
        self.url_through(self.node_addresses())
    }

    /// The nodes' addresses, in order (`node1`, `node2`).
    pub fn node_addresses(&self) -> [std::net::SocketAddr; 2] {
        self.node_ports
            .map(|port| std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }

    /// [`PgFarm::url`] through other addresses that lead to the nodes (a proxy each).
    pub fn url_through(&self, nodes: [std::net::SocketAddr; 2]) -> String {
        let [one, two] = nodes;
        format!(
            "postgres://postgres@{one},{two}/farm?target_session_attrs=read-write&sslmode=disable&connect_timeout=2"
        )
    }

    /// The node (0 or 1) the monitor has as primary now, if any.
    pub fn primary(&self) -> Option<usize> {
        let name = self
            .monitor_sql(
                "SELECT nodename FROM pgautofailover.node \
                 WHERE reportedstate IN ('primary', 'wait_primary', 'single') \
                 AND goalstate IN ('primary', 'wait_primary', 'single')",
            )
            .ok()?;
        match name.trim() {
            "node1" => Some(0),
            "node2" => Some(1),
            _ => None,
        }
    }

    /// Loses a whole node at once (kill -9 of its keeper's process group and of its
    /// postmaster): what a machine that dies does.
    pub fn kill_node(&mut self, node: usize) {
        let name = node_name(node);
        let postmaster = std::fs::read_to_string(self.path(name).join("postmaster.pid"))
            .ok()
            .and_then(|pid| pid.lines().next()?.trim().parse::<i32>().ok());
        if let Some(position) = self.keepers.iter().position(|(keeper, _)| keeper == name) {
            let (_, mut child) = self.keepers.remove(position);
            let group = child.id() as i32;
            // SAFETY: kill has no preconditions; a gone group or pid only fails.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
        }
        if let Some(pid) = postmaster {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }

    /// Runs a lost node's keeper again: it rejoins as the secondary (pg_rewind), and
    /// this returns once the farm has a primary and a secondary again.
    pub fn rejoin(&mut self, node: usize) -> Result<(), String> {
        self.run_keeper(node_name(node))?;
        self.wait_until_replicated()
    }

    fn start_monitor(&mut self) -> Result<(), String> {
        let monitor = self.path("monitor");
        self.init_pgdata(&monitor, self.monitor_port)?;
        let port = self.monitor_port.to_string();
        self.autoctl(
            &["create", "monitor", "--pgdata"],
            &monitor,
            &[
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
            ]
            .into_iter()
            .chain(["--no-ssl", "--ssl-mode", "disable"])
            .collect::<Vec<_>>(),
        )?;
        let listen = ["postgresql.listen_addresses", "127.0.0.1"];
        self.autoctl(&["config", "set", "--pgdata"], &monitor, &listen)?;
        self.run_keeper("monitor")?;
        wait_for(
            Duration::from_secs(30),
            "the pg_auto_failover monitor",
            || self.monitor_sql("SELECT 1").is_ok(),
        )?;
        // One statement at a time: ALTER SYSTEM refuses a transaction block.
        for statement in MONITOR_SETTINGS.split(';').filter(|s| !s.trim().is_empty()) {
            self.monitor_sql(statement)?;
        }
        Ok(())
    }

    /// Registers node `node` with the monitor and runs it: the first becomes the
    /// primary, the second is copied from it (`pg_basebackup`) as its standby.
    fn start_node(&mut self, node: usize) -> Result<(), String> {
        let name = node_name(node);
        let pgdata = self.path(name);
        if node == 0 {
            self.init_pgdata(&pgdata, self.node_ports[0])?;
        }
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let port = self.node_ports[node].to_string();
        let mut command = self.as_farm_user("pg_autoctl");
        command
            .args(["create", "postgres", "--pgdata"])
            .arg(&pgdata)
            .args([
                "--pgport",
                &port,
                "--listen",
                "127.0.0.1",
                "--hostname",
                "127.0.0.1",
            ])
            .args([
                "--name", name, "--dbname", "farm", "--auth", "trust", "--no-ssl",
            ])
            .args(["--ssl-mode", "disable", "--monitor", &monitor])
            .args([
                "--replication-quorum",
                "true",
                "--candidate-priority",
                "50",
                "--run",
            ]);
        self.spawn_keeper(name, command)
    }

    fn run_keeper(&mut self, name: &str) -> Result<(), String> {
        let mut command = self.as_farm_user("pg_autoctl");
        command.args(["run", "--pgdata"]).arg(self.path(name));
        self.spawn_keeper(name, command)
    }

    /// Spawns a keeper in a process group of its own, logging to `logs/NAME.log`.
    fn spawn_keeper(&mut self, name: &str, mut command: Command) -> Result<(), String> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("logs").join(format!("{name}.log")))
            .map_err(|error| format!("opening {name}'s log: {error}"))?;
        let err = log.try_clone().map_err(|error| error.to_string())?;
        let child = command
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|error| format!("starting pg_autoctl for {name}: {error}"))?;
        self.keepers.push((name.to_string(), child));
        Ok(())
    }

    /// Waits for one primary and one secondary; while the standby is being copied, a
    /// checkpoint on the primary spares `pg_basebackup` a spread one (a minute idle).
    fn wait_until_replicated(&self) -> Result<(), String> {
        let result = wait_for(
            Duration::from_secs(HA_WAIT_SECONDS),
            "a primary and a secondary",
            || {
                let states = self.node_states();
                if states.contains("wait_standby") || states.contains("catchingup") {
                    if let Some(primary) = self.primary() {
                        let _ = self.node_sql(primary, "CHECKPOINT");
                    }
                }
                states == "primary/primary secondary/secondary"
            },
        );
        result.map_err(|error| format!("{error}: {}", self.node_states()))
    }

    /// Each node's reported and assigned state, in order of the reported one.
    fn node_states(&self) -> String {
        self.monitor_sql(
            "SELECT string_agg(reportedstate || '/' || goalstate, ' ' ORDER BY reportedstate) \
             FROM pgautofailover.node",
        )
        .unwrap_or_default()
        .trim()
        .to_string()
    }

    fn monitor_sql(&self, sql: &str) -> Result<String, String> {
        psql(&self.bin, self.monitor_port, "pg_auto_failover", sql)
    }

    fn node_sql(&self, node: usize, sql: &str) -> Result<String, String> {
        psql(&self.bin, self.node_ports[node], "postgres", sql)
    }

    /// `initdb` as the farm's user, its socket in the farm and TCP on loopback only
    /// (in `postgresql.auto.conf`, read after the settings pg_autoctl includes).
    fn init_pgdata(&self, pgdata: &Path, port: u16) -> Result<(), String> {
        let mut initdb = self.as_farm_user("initdb");
        initdb.arg("-D").arg(pgdata);
        initdb.args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"]);
        crate::run(&mut initdb, "initdb")?;
        let settings = format!(
            "unix_socket_directories = '{}'\nlisten_addresses = '127.0.0.1'\nport = {port}\n",
            self.dir.path().join("sock").display()
        );
        let auto = pgdata.join("postgresql.auto.conf");
        let mut text =
            std::fs::read_to_string(&auto).map_err(|error| format!("{auto:?}: {error}"))?;
        text.push_str(&settings);
        std::fs::write(&auto, text).map_err(|error| format!("{auto:?}: {error}"))
    }

    /// `pg_autoctl ARGS PGDATA REST` as the farm's user, which must succeed.
    fn autoctl(&self, args: &[&str], pgdata: &Path, rest: &[&str]) -> Result<(), String> {
        let mut command = self.as_farm_user("pg_autoctl");
        command.args(args).arg(pgdata).args(rest);
        crate::run(&mut command, &format!("pg_autoctl {}", args.join(" ")))
    }

    /// `program` as the user PostgreSQL runs as, with the farm's own home, XDG
    /// directories (pg_autoctl keeps its configuration and state there) and socket.
    fn as_farm_user(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let root = self.dir.path();
        let mut command = Command::new(program);
        command.env_clear();
        command.env("PATH", format!("{}:/usr/bin:/bin", self.bin.display()));
        command
            .env("LANG", "C.UTF-8")
            .env("TZ", "UTC")
            .env("PGUSER", "postgres");
        command.env("PGHOST", root.join("sock"));
        command
            .env("HOME", root.join("home"))
            .env("TMPDIR", root.join("tmp"));
        command.env("XDG_CONFIG_HOME", root.join("config"));
        command.env("XDG_DATA_HOME", root.join("data"));
        command.env("XDG_RUNTIME_DIR", root.join("run"));
        command.current_dir(root);
        if is_root() {
            command.uid(UNPRIVILEGED_UID).gid(UNPRIVILEGED_GID);
        }
        command
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for PgFarm {
    fn drop(&mut self) {
        for name in ["node1", "node2", "monitor"] {
            if self.keepers.iter().any(|(keeper, _)| keeper == name) {
                let mut stop = self.as_farm_user("pg_autoctl");
                stop.args(["stop", "--fast", "--pgdata"])
                    .arg(self.path(name));
                let _ = stop.stdout(Stdio::null()).stderr(Stdio::null()).status();
            }
        }
        for (_, mut child) in self.keepers.drain(..) {
            let group = child.id() as i32;
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            // SAFETY: kill has no preconditions; a gone group only fails.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

fn node_name(node: usize) -> &'static str {
    ["node1", "node2"][node]
}

/// One statement through `psql` over loopback TCP as `postgres` (trust); its output.
fn psql(bin: &Path, port: u16, database: &str, sql: &str) -> Result<String, String> {
    let output = Command::new(bin.join("psql"))
        .args(["-qXAt", "-h", "127.0.0.1", "-U", "postgres", "-p"])
        .arg(port.to_string())
        .args(["-d", database, "-c", sql])
        .env("PGCONNECT_TIMEOUT", "2")
        .output()
        .map_err(|error| format!("running psql: {error}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Gives `path` to the user PostgreSQL runs as, when the tests run as root.
fn hand_over(path: &Path) -> Result<(), String> {
    if !is_root() {
        return Ok(());
    }
    std::os::unix::fs::chown(path, Some(UNPRIVILEGED_UID), Some(UNPRIVILEGED_GID))
        .map_err(|error| format!("handing {} to nobody: {error}", path.display()))
}
