//! `rowsync serve`: the sync server on its endpoints (TCP, TLS, HTTP, HTTPS) and the
//! optional metrics endpoint, until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{Database, DatabaseArg, OnBackend};
use rowsync_cli::logging::notice;
use rowsync_cli::standby;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_server::jwks::{Jwks, JwksSettings, JwksSource};
use rowsync_server::metrics::Metrics;
use rowsync_server::monitor::MonitorSettings;
use rowsync_server::record::{RecordSettings, Recorder};
use rowsync_server::tls::{self, TlsFiles};
use rowsync_server::{Endpoint, ServerConfig, TokenConfig, Transport};

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// Address of the plain TCP endpoint (tcp:// clients).
    #[arg(long, default_value = "127.0.0.1:2439", help_heading = "Endpoints")]
    listen: SocketAddr,
    /// Also serve TLS (tls:// clients) here; needs --cert and --key.
    #[arg(long, help_heading = "Endpoints")]
    tls_listen: Option<SocketAddr>,
    /// Also serve HTTP/1.1 and HTTP/2 (h2c) here (http:// clients).
    #[arg(long, help_heading = "Endpoints")]
    http_listen: Option<SocketAddr>,
    /// Also serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) here; needs --cert and --key.
    #[arg(long, help_heading = "Endpoints")]
    https_listen: Option<SocketAddr>,
    /// PEM certificate chain of the TLS and HTTPS endpoints (see `rowsync cert`).
    #[arg(long, help_heading = "Endpoints")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, help_heading = "Endpoints")]
    key: Option<PathBuf>,
    /// Require TLS and HTTPS clients to present a certificate signed by this CA (PEM).
    #[arg(long, hide = true, help_heading = "Endpoints")]
    client_ca: Option<PathBuf>,
    /// Database workers (each holds one pooled connection while it works): a fixed
    /// count. Give --workers-min and --workers-max instead to let the server choose.
    #[arg(
        long,
        default_value_t = 4,
        conflicts_with_all = ["workers_min", "workers_max"],
        help_heading = "Workers and connections"
    )]
    workers: usize,
    /// The fewest database workers the server may run (with --workers-max).
    #[arg(
        long,
        requires = "workers_max",
        help_heading = "Workers and connections"
    )]
    workers_min: Option<usize>,
    /// The most database workers the server may run (with --workers-min).
    #[arg(
        long,
        requires = "workers_min",
        help_heading = "Workers and connections"
    )]
    workers_max: Option<usize>,
    /// Workers all the servers of this database may run together: each runs at most
    /// this divided by the servers alive (a farm behind a load balancer).
    #[arg(long, help_heading = "Workers and connections")]
    farm_workers_max: Option<usize>,
    /// Syncs in progress at once; more clients are told busy with a retry hint.
    #[arg(long, default_value_t = 1024, help_heading = "Workers and connections")]
    max_connections: usize,
    /// Connections holding a slot that have not sent their hello yet: beyond it, the
    /// oldest of them past --hello-pending-grace-ms is answered busy, so silent
    /// connections hold at most this many slots for longer than the grace.
    #[arg(long, default_value_t = ServerConfig::default().hello_pending_connections_max, hide = true, help_heading = "Workers and connections")]
    hello_pending_connections_max: usize,
    /// Milliseconds a connection may wait for its hello before it can be told to make
    /// room for newer ones (--hello-pending-connections-max).
    #[arg(long, default_value_t = ServerConfig::default().hello_pending_grace.as_millis() as u64, hide = true, help_heading = "Workers and connections")]
    hello_pending_grace_ms: u64,
    /// Refused logins from one address, within --login-failure-window-seconds, after
    /// which its logins are refused unchecked until the window ends.
    #[arg(long, default_value_t = ServerConfig::default().login_failures_per_address_max, hide = true, help_heading = "Logins")]
    login_failures_per_address_max: u32,
    /// Refused logins for one user name from one address (IPv6: its /64), within
    /// --login-failure-window-seconds, after which that user's logins from that address
    /// are refused unchecked.
    #[arg(long, default_value_t = ServerConfig::default().login_failures_per_address_user_max, hide = true, help_heading = "Logins")]
    login_failures_per_address_user_max: u32,
    /// Refused logins for one user name from any address, within
    /// --login-failure-window-seconds, after which its logins are refused unchecked from
    /// every address that failed in the window (never from one that did not).
    #[arg(long, default_value_t = ServerConfig::default().login_failures_per_user_max, hide = true, help_heading = "Logins")]
    login_failures_per_user_max: u32,
    /// Client ids (subscriptions) one user may have; the first sync of a new client id
    /// beyond it is refused (error code 13). 0: no limit.
    #[arg(long, default_value_t = rowsync_server::CLIENT_IDS_PER_USER_MAX_DEFAULT, hide = true, help_heading = "Logins")]
    client_ids_per_user_max: u64,
    /// The window the login failure limits count in.
    #[arg(long, default_value_t = ServerConfig::default().login_failure_window.as_secs(), hide = true, help_heading = "Logins")]
    login_failure_window_seconds: u64,
    /// How often the server shares its refused logins with the other servers of its
    /// database and reads theirs, in milliseconds (0: never).
    #[arg(long, default_value_t = ServerConfig::default().farm_share_interval.as_millis() as u64, hide = true, help_heading = "Logins")]
    farm_share_interval_ms: u64,
    /// Upload and download bytes all syncs in flight keep in memory; beyond, they go
    /// to temporary files. Default: a quarter of physical memory.
    #[arg(long, hide = true, help_heading = "Memory and sizes")]
    cache_bytes_max: Option<usize>,
    /// Memory all connections' zstd decoders may hold together (each holds its stream's
    /// window, 2 MiB for the client library, up to 8 MiB, until its upload is read); a
    /// connection waits for room before inflating. At least about 8.6 MiB.
    /// Default: an eighth of physical memory.
    #[arg(long, hide = true, help_heading = "Memory and sizes")]
    zstd_decoders_bytes_max: Option<usize>,
    /// Rows of shared tables (a catalogue every user reads) kept after one sync read
    /// them, for the syncs after with the same cursor (docs/rules.md); 0 keeps none.
    #[arg(long, hide = true, help_heading = "Memory and sizes",
          default_value_t = rowsync_server::SHARED_DOWNLOAD_CACHE_BYTES_MAX_DEFAULT)]
    shared_download_cache_bytes_max: u64,
    /// How long kept shared rows serve other syncs (their clients then read again at
    /// most this much of the changes at their next sync).
    #[arg(long, hide = true, help_heading = "Memory and sizes",
          default_value_t = ServerConfig::default().shared_download_cache_age.as_secs())]
    shared_download_cache_seconds: u64,
    /// Allocations of at least this many bytes get pages of their own, given back when
    /// freed (glibc's M_MMAP_THRESHOLD; 0 leaves glibc's sliding threshold).
    #[arg(long, default_value_t = rowsync_server::MALLOC_MMAP_THRESHOLD_BYTES_DEFAULT, hide = true, help_heading = "Memory and sizes")]
    malloc_mmap_threshold_bytes: usize,
    /// The whole upload must arrive within this many seconds of connecting.
    #[arg(long, default_value_t = ServerConfig::default().upload_timeout.as_secs(), hide = true, help_heading = "Timeouts")]
    upload_timeout_seconds: u64,
    /// Serve Prometheus metrics (GET /metrics), the live monitor page (GET /monitor),
    /// its JSON API and the probes GET /healthz and GET /readyz on this address, e.g.
    /// 127.0.0.1:9464. An address other than loopback needs --admin-token-file.
    #[arg(long, help_heading = "Admin endpoint and monitor")]
    admin_listen: Option<SocketAddr>,
    /// A file holding the admin endpoint's token: every path but /healthz and /readyz
    /// then needs `Authorization: Bearer <token>`.
    #[arg(long, help_heading = "Admin endpoint and monitor")]
    admin_token_file: Option<PathBuf>,
    /// After SIGTERM or SIGINT, running syncs may finish for this many seconds while new
    /// ones are answered busy and /readyz says draining; a second signal stops at once.
    #[arg(long, default_value_t = ServerConfig::default().drain_timeout.as_secs(), hide = true, help_heading = "Timeouts")]
    drain_timeout_seconds: u64,
    /// This server is one of a highly available farm: at start, check that the
    /// PostgreSQL database replicates synchronously to a standby, and warn when it does
    /// not (a failover could lose acknowledged syncs; docs/operations.md, "Running a farm").
    #[arg(long, hide = true, help_heading = "Workers and connections")]
    ha: bool,
    /// Ended syncs the monitor keeps (its history, in memory).
    #[arg(long, default_value_t = MonitorSettings::default().history_syncs_max, hide = true, help_heading = "Admin endpoint and monitor")]
    monitor_history_syncs_max: usize,
    /// Keep the monitor's history also in the consolidated database (table
    /// `rs_sync_history`, read back at start), at most this many rows (the oldest go).
    #[arg(
        long,
        value_name = "ROWS",
        hide = true,
        help_heading = "Admin endpoint and monitor"
    )]
    monitor_history_table_rows_max: Option<u64>,
    /// Samples the monitor's charts keep (one per second).
    #[arg(long, default_value_t = MonitorSettings::default().samples_max, hide = true, help_heading = "Admin endpoint and monitor")]
    monitor_samples_max: usize,
    /// Show the profile report in this file on the monitor page (the file `rowsync
    /// profile --out FILE` writes; read again at each look, so the newest run shows).
    #[arg(long, hide = true, help_heading = "Admin endpoint and monitor")]
    profile_report: Option<PathBuf>,
    /// Record each sync (hello without credentials, upload, outcome) into this new
    /// directory, for `rowsync replay`.
    #[arg(long, hide = true, help_heading = "Recording syncs for replay")]
    record: Option<PathBuf>,
    /// Syncs recorded at most; later ones are not recorded.
    #[arg(
        long,
        default_value_t = 100_000,
        hide = true,
        help_heading = "Recording syncs for replay"
    )]
    record_syncs_max: u64,
    /// Upload bytes recorded at most, over all syncs.
    #[arg(long, default_value_t = 1024 * 1024 * 1024, hide = true, help_heading = "Recording syncs for replay")]
    record_bytes_max: u64,
    /// Largest frame accepted, in bytes.
    #[arg(long, default_value_t = rowsync_protocol::FRAME_BYTES_MAX_DEFAULT, hide = true, help_heading = "Memory and sizes")]
    frame_bytes_max: usize,
    /// Largest upload accepted for one sync, in bytes.
    #[arg(long, default_value_t = ServerConfig::default().upload_bytes_max, hide = true, help_heading = "Memory and sizes")]
    upload_bytes_max: usize,
    /// Largest value (text or blob bytes) an upload may hold or a download may carry.
    #[arg(long, default_value_t = ServerConfig::default().value_bytes_max, hide = true, help_heading = "Memory and sizes")]
    value_bytes_max: u64,
    /// Close a connection that sends nothing for this many seconds (body read timeout).
    #[arg(long, default_value_t = 30, hide = true, help_heading = "Timeouts")]
    read_timeout_seconds: u64,
    /// The hello (TCP, TLS) or the request headers (HTTP) must arrive within this.
    #[arg(long, default_value_t = ServerConfig::default().header_read_timeout.as_millis() as u64, hide = true, help_heading = "Timeouts")]
    header_read_timeout_ms: u64,
    /// A TLS handshake must complete within this.
    #[arg(long, default_value_t = ServerConfig::default().tls_handshake_timeout.as_millis() as u64, hide = true, help_heading = "Timeouts")]
    tls_handshake_timeout_ms: u64,
    /// Milliseconds an HTTP connection may stay open with no request in progress.
    #[arg(long, default_value_t = ServerConfig::default().http_idle_timeout.as_millis() as u64, hide = true, help_heading = "Timeouts")]
    http_idle_timeout_ms: u64,
    /// Seconds between the pings of an HTTP/2 connection; one not answered within
    /// --read-timeout-seconds closes it.
    #[arg(long, default_value_t = ServerConfig::default().http2_keep_alive_interval.as_secs(), hide = true, help_heading = "Timeouts")]
    http2_keep_alive_interval_seconds: u64,
    /// Download receipts (protocol v4) one HTTP connection may send per second; more are
    /// answered without a lookup.
    #[arg(long, default_value_t = ServerConfig::default().receipts_per_connection_per_second_max, hide = true, help_heading = "Timeouts")]
    receipts_per_connection_per_second_max: u32,
    /// Bytes a compressed upload may inflate to, checked while decompressing.
    #[arg(long, default_value_t = ServerConfig::default().decompressed_bytes_max, hide = true, help_heading = "Memory and sizes")]
    decompressed_bytes_max: u64,
    /// Apply a large upload over at most this many database connections at once, its
    /// rows hashed by primary key, committed together by two-phase commit (PostgreSQL
    /// with max_prepared_transactions above 0 only; SQLite and MySQL use one). 1: off.
    #[arg(
        long,
        default_value_t = 1,
        hide = true,
        help_heading = "Large uploads over several connections"
    )]
    apply_streams_max: usize,
    /// Upload operations (rows) for each apply stream: an upload of R rows is applied
    /// over R / this streams (at least 1, at most --apply-streams-max).
    #[arg(long, default_value_t = rowsync_consolidated::ApplyStreamSettings::OFF.rows_per_stream_min, hide = true, help_heading = "Large uploads over several connections")]
    apply_stream_rows_min: u64,
    /// The longest an apply stream waits for a lock, in milliseconds; beyond it the
    /// streams are aborted and the upload is applied on one stream.
    #[arg(long, default_value_t = rowsync_consolidated::ApplyStreamSettings::OFF.lock_timeout_ms, hide = true, help_heading = "Large uploads over several connections")]
    apply_stream_lock_timeout_ms: u64,
    /// Remove tombstones every client has passed (and expired held uploads) this often.
    #[arg(
        long,
        default_value_t = 300,
        hide = true,
        help_heading = "Cut transfers held for resuming, and cleanup"
    )]
    cleanup_interval_seconds: u64,
    /// Hold at most this many bytes of one cut upload for its client to resume.
    #[arg(long, default_value_t = ServerConfig::default().held_upload_bytes_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_upload_bytes_max: u64,
    /// Hold at most this many bytes of cut uploads in all (in the consolidated database).
    #[arg(long, default_value_t = ServerConfig::default().held_uploads_bytes_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_uploads_bytes_max: u64,
    /// Name at most this many refused rows of one upload (protocol v6 clients set them
    /// aside and send the rest); beyond it the sync fails as a whole.
    #[arg(long, default_value_t = ServerConfig::default().refused_rows_max, hide = true, help_heading = "Memory and sizes")]
    refused_rows_max: u64,
    /// Hold at most this many bytes of cut uploads of one user (all its client ids), as
    /// stored (decompressed).
    #[arg(long, default_value_t = ServerConfig::default().held_uploads_bytes_per_user_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_uploads_bytes_per_user_max: u64,
    /// Remove a held cut upload after this many seconds.
    #[arg(long, default_value_t = ServerConfig::default().held_upload_expiry.as_secs(), hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_upload_expiry_seconds: u64,
    /// Hold at most this many bytes of one cut download for its client to resume.
    #[arg(long, default_value_t = ServerConfig::default().held_download_bytes_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_download_bytes_max: u64,
    /// Hold at most this many bytes of cut downloads in all (in the consolidated database).
    #[arg(long, default_value_t = ServerConfig::default().held_downloads_bytes_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_downloads_bytes_max: u64,
    /// Hold at most this many bytes of cut downloads of one user.
    #[arg(long, default_value_t = ServerConfig::default().held_downloads_bytes_per_user_max, hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_downloads_bytes_per_user_max: u64,
    /// Remove a held cut download after this many seconds.
    #[arg(long, default_value_t = ServerConfig::default().held_download_expiry.as_secs(), hide = true, help_heading = "Cut transfers held for resuming, and cleanup")]
    held_download_expiry_seconds: u64,
    /// Accept HS256 tokens (JWT) signed with the secret in this file.
    #[arg(long, hide = true, help_heading = "Logins")]
    jwt_hs256_secret_file: Option<PathBuf>,
    /// Accept RS256 tokens (JWT) signed for the RSA public key in this PEM file.
    #[arg(long, hide = true, help_heading = "Logins")]
    jwt_rs256_public_key_file: Option<PathBuf>,
    /// Require this `aud` claim in tokens.
    #[arg(long, hide = true, help_heading = "Logins")]
    jwt_audience: Option<String>,
    /// Require this `iss` claim in tokens.
    #[arg(long, hide = true, help_heading = "Logins")]
    jwt_issuer: Option<String>,
    /// After a password login, the server hands a client (protocol v8) a session token
    /// that holds this many seconds: its next syncs skip the password check (argon2id),
    /// until the user is removed, disabled or given a new password. 0: none.
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = rowsync_server::session_token::SESSION_TOKEN_SECONDS_DEFAULT)]
    session_token_seconds: u64,
    /// Clock skew allowed on tokens' `exp` and `nbf`, in seconds.
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = 30)]
    jwt_leeway_seconds: u64,
    /// Accept RS256, ES256 and EdDSA tokens signed with the keys of the key set (JWKS)
    /// at this URL, chosen by the token's `kid` (https://, or http:// to loopback only).
    #[arg(
        long,
        hide = true,
        help_heading = "Logins",
        conflicts_with = "oidc_issuer"
    )]
    jwks_url: Option<String>,
    /// Accept tokens of this OpenID Connect issuer: its key set is the `jwks_uri` of
    /// `{issuer}/.well-known/openid-configuration`, and tokens must carry it as `iss`.
    #[arg(long, hide = true, help_heading = "Logins")]
    oidc_issuer: Option<String>,
    /// Fetch the key set again this often, in seconds.
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = JwksSettings::REFRESH_DEFAULT.as_secs())]
    jwks_refresh_seconds: u64,
    /// A token whose `kid` the key set lacks fetches the set again, at most once in
    /// this many seconds (also the retry interval while the set cannot be fetched).
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = JwksSettings::REFRESH_MIN_DEFAULT.as_secs())]
    jwks_refresh_min_seconds: u64,
    /// Refuse a key set or discovery document larger than this, in bytes.
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = JwksSettings::BYTES_MAX_DEFAULT)]
    jwks_bytes_max: usize,
    /// One fetch of the key set or discovery document must end within this, in ms.
    #[arg(long, hide = true, help_heading = "Logins", default_value_t = JwksSettings::TIMEOUT_DEFAULT.as_millis() as u64)]
    jwks_timeout_ms: u64,
    /// PEM of the CAs the key set's https:// server must chain to (a provider on a
    /// private CA); default: the Mozilla roots built in.
    #[arg(long, hide = true, help_heading = "Logins")]
    jwks_ca_file: Option<PathBuf>,
}

pub async fn run(args: ServeArgs) -> Result<()> {
    if args.apply_streams_max == 0 || args.apply_stream_rows_min == 0 {
        bail!("--apply-streams-max and --apply-stream-rows-min must be at least 1");
    }
    let streams = rowsync_consolidated::ApplyStreamSettings {
        streams_max: args.apply_streams_max,
        rows_per_stream_min: args.apply_stream_rows_min,
        lock_timeout_ms: args.apply_stream_lock_timeout_ms,
    };
    args.database
        .database()?
        .run_with_apply_streams(args, streams)
        .await
}

/// Before serving: the system tables installed, the apply streams a stopped server left
/// prepared resolved (they hold their rows' locks), and with `--ha` the standby checked.
/// Returns how many prepared transactions were resolved.
async fn prepare_database<B: Consolidated>(
    backend: &B,
    database: &Database,
    ha: bool,
) -> Result<u64> {
    let mut connection = backend.connect().await?;
    connection.install_system_tables().await?;
    let resolved = connection.resolve_prepared_streams().await?;
    if ha {
        let standby = standby::check(&mut connection, database).await?;
        if let Some(warning) = standby::warning(&standby) {
            tracing::warn!("{warning}");
            notice(warning);
        }
    }
    Ok(resolved)
}

impl OnBackend for ServeArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let tokens = self.token_config().await?;
        if self.workers == 0 || self.max_connections == 0 || self.hello_pending_connections_max == 0
        {
            bail!(
                "--workers, --max-connections and --hello-pending-connections-max must be at least 1"
            );
        }
        let workers_range = self.workers_range()?;
        let tls_files = self.tls_files()?;
        let (endpoints, shown_endpoints) = self.endpoints(tls_files.as_ref()).await?;
        let database = self.database.database()?;
        let resolved = prepare_database(&backend, &database, self.ha).await?;
        let shown = match &database {
            Database::Sqlite(_) => self.database.db.clone(),
            other => format!("a {} database", other.kind()),
        };
        notice(format!(
            "rowsync serving {shown} on {}",
            shown_endpoints.join(" ")
        ));
        if resolved > 0 {
            notice(format!(
                "rowsync resolved {resolved} prepared apply stream transactions left by a stopped server"
            ));
        }
        let mut config = self.server_config(workers_range, tokens);
        if let Some(dir) = &self.record {
            let recorder = Recorder::create(RecordSettings {
                dir: dir.clone(),
                syncs_max: self.record_syncs_max,
                bytes_max: self.record_bytes_max,
            })?;
            notice(format!("rowsync recording syncs into {}", dir.display()));
            config.recorder = Some(Arc::new(recorder));
        }
        let metrics = Arc::new(Metrics::with_monitor(MonitorSettings {
            history_syncs_max: self.monitor_history_syncs_max,
            samples_max: self.monitor_samples_max,
            history_table_rows_max: self.monitor_history_table_rows_max,
        }));
        if let Some(path) = self.profile_report.clone() {
            metrics.monitor.set_profile_report(path);
        }
        if let Some(address) = self.admin_listen {
            let token = admin_token(address, self.admin_token_file.as_deref())?;
            serve_metrics(address, Arc::clone(&metrics), token).await?;
        }
        let drain_timeout = self.drain_timeout_seconds;
        let shutdown = async move {
            stop_signal().await;
            notice(format!(
                "rowsync draining: new syncs are answered busy, running ones have {drain_timeout} s \
                 to finish (a second signal stops at once)"
            ));
            tokio::spawn(async {
                stop_signal().await;
                notice("rowsync stopping at once");
                std::process::exit(1);
            });
        };
        rowsync_server::serve_endpoints_with_metrics(endpoints, backend, config, metrics, shutdown)
            .await?;
        Ok(())
    }
}

impl ServeArgs {
    /// The JWT settings from the key files named, and the key set (fetched once now: a
    /// failure is reported and retried, so a server can start while its issuer is down).
    async fn token_config(&self) -> Result<TokenConfig> {
        let read = |path: &Option<PathBuf>| -> Result<Option<Vec<u8>>> {
            path.as_ref()
                .map(|path| {
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
                })
                .transpose()
        };
        // A secret file written by `echo` ends with a newline that is not the secret's.
        let secret = read(&self.jwt_hs256_secret_file)?.map(|mut secret| {
            while secret
                .last()
                .is_some_and(|byte| matches!(byte, b'\n' | b'\r'))
            {
                secret.pop();
            }
            secret
        });
        let issuer = match (&self.jwt_issuer, &self.oidc_issuer) {
            (Some(jwt), Some(oidc)) if jwt != oidc => bail!(
                "--jwt-issuer {jwt:?} and --oidc-issuer {oidc:?} differ: tokens of an OIDC \
                 issuer carry it as `iss`; give only --oidc-issuer"
            ),
            (jwt, oidc) => jwt.clone().or_else(|| oidc.clone()),
        };
        Ok(TokenConfig {
            hs256_secret: secret,
            rs256_public_key_pem: read(&self.jwt_rs256_public_key_file)?,
            audience: self.jwt_audience.clone(),
            issuer,
            leeway_seconds: self.jwt_leeway_seconds,
            jwks: self.jwks().await?,
        })
    }

    async fn jwks(&self) -> Result<Option<Arc<Jwks>>> {
        let source = match (&self.jwks_url, &self.oidc_issuer) {
            (Some(url), _) => JwksSource::Url(url.clone()),
            (None, Some(issuer)) => JwksSource::OidcIssuer(issuer.clone()),
            (None, None) => return Ok(None),
        };
        let settings = JwksSettings {
            source,
            refresh: Duration::from_secs(self.jwks_refresh_seconds.max(1)),
            refresh_min: Duration::from_secs(self.jwks_refresh_min_seconds),
            bytes_max: self.jwks_bytes_max,
            timeout: Duration::from_millis(self.jwks_timeout_ms.max(1)),
            ca_file: self.jwks_ca_file.clone(),
        };
        let (jwks, first) = Jwks::start(settings).await?;
        match first {
            Ok(keys) => tracing::info!(keys, "fetched the token key set"),
            Err(error) => notice(format!(
                "rowsync warning: {error}; token logins are refused until the key set is \
                 fetched (retried every {} s, jwks_refresh_min_seconds)",
                self.jwks_refresh_min_seconds
            )),
        }
        Ok(Some(jwks))
    }

    /// The controller's range, when --workers-min and --workers-max are given.
    fn workers_range(&self) -> Result<Option<(usize, usize)>> {
        Ok(match (self.workers_min, self.workers_max) {
            (Some(min), Some(max)) if min >= 1 && min <= max => Some((min, max)),
            (Some(_), Some(_)) => {
                bail!("--workers-min must be at least 1 and at most --workers-max")
            }
            _ => None,
        })
    }

    fn tls_files(&self) -> Result<Option<TlsFiles>> {
        Ok(match (&self.cert, &self.key) {
            (Some(cert_chain), Some(private_key)) => Some(TlsFiles {
                cert_chain: cert_chain.clone(),
                private_key: private_key.clone(),
                client_ca: self.client_ca.clone(),
            }),
            (None, None) => {
                if self.client_ca.is_some() {
                    bail!("--client-ca needs --cert and --key");
                }
                None
            }
            _ => bail!("--cert and --key go together"),
        })
    }

    /// Binds every endpoint asked for; returns them with their URLs for the banner.
    async fn endpoints(
        &self,
        tls_files: Option<&TlsFiles>,
    ) -> Result<(Vec<Endpoint>, Vec<String>)> {
        let mut wanted = vec![(self.listen, "tcp")];
        wanted.extend(self.tls_listen.map(|address| (address, "tls")));
        wanted.extend(self.http_listen.map(|address| (address, "http")));
        wanted.extend(self.https_listen.map(|address| (address, "https")));
        let mut endpoints = Vec::new();
        let mut shown_endpoints = Vec::new();
        for (address, kind) in wanted {
            let transport = match kind {
                "tcp" => Transport::Tcp,
                "http" => Transport::Http,
                _ => {
                    let Some(files) = tls_files else {
                        bail!("--{kind}-listen needs --cert and --key (make a test pair with `rowsync cert`)");
                    };
                    let alpn: &[&[u8]] = if kind == "tls" {
                        &[tls::ALPN_ROWSYNC]
                    } else {
                        &tls::ALPN_HTTP
                    };
                    let config = tls::server_config(files, alpn)?;
                    if kind == "tls" {
                        Transport::Tls(config)
                    } else {
                        Transport::Https(config)
                    }
                }
            };
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("binding {address}"))?;
            shown_endpoints.push(format!("{kind}://{}", listener.local_addr()?));
            endpoints.push(Endpoint {
                listener,
                transport,
            });
        }
        Ok((endpoints, shown_endpoints))
    }

    fn server_config(
        &self,
        workers_range: Option<(usize, usize)>,
        tokens: TokenConfig,
    ) -> ServerConfig {
        let defaults = ServerConfig::default();
        ServerConfig {
            connections_max: self.max_connections,
            hello_pending_connections_max: self.hello_pending_connections_max,
            hello_pending_grace: Duration::from_millis(self.hello_pending_grace_ms),
            login_failures_per_address_max: self.login_failures_per_address_max,
            login_failures_per_address_user_max: self.login_failures_per_address_user_max,
            login_failures_per_user_max: self.login_failures_per_user_max,
            client_ids_per_user_max: (self.client_ids_per_user_max > 0)
                .then_some(self.client_ids_per_user_max),
            login_failure_window: Duration::from_secs(self.login_failure_window_seconds),
            farm_workers_max: self.farm_workers_max,
            farm_share_interval: Duration::from_millis(self.farm_share_interval_ms),
            session_token_lifetime: Duration::from_secs(self.session_token_seconds),
            workers: self.workers,
            workers_range,
            cache_bytes_max: self.cache_bytes_max.unwrap_or(defaults.cache_bytes_max),
            shared_download_cache_bytes_max: self.shared_download_cache_bytes_max,
            shared_download_cache_age: Duration::from_secs(self.shared_download_cache_seconds),
            zstd_decoders_bytes_max: self
                .zstd_decoders_bytes_max
                .unwrap_or(defaults.zstd_decoders_bytes_max),
            malloc_mmap_threshold_bytes: self.malloc_mmap_threshold_bytes,
            upload_timeout: Duration::from_secs(self.upload_timeout_seconds),
            frame_bytes_max: self.frame_bytes_max,
            upload_bytes_max: self.upload_bytes_max,
            value_bytes_max: self.value_bytes_max,
            read_timeout: Duration::from_secs(self.read_timeout_seconds),
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            tls_handshake_timeout: Duration::from_millis(self.tls_handshake_timeout_ms),
            http_idle_timeout: Duration::from_millis(self.http_idle_timeout_ms),
            http2_keep_alive_interval: Duration::from_secs(
                self.http2_keep_alive_interval_seconds.max(1),
            ),
            receipts_per_connection_per_second_max: self.receipts_per_connection_per_second_max,
            decompressed_bytes_max: self.decompressed_bytes_max,
            cleanup_interval: Duration::from_secs(self.cleanup_interval_seconds.max(1)),
            held_upload_bytes_max: self.held_upload_bytes_max,
            held_uploads_bytes_max: self.held_uploads_bytes_max,
            held_uploads_bytes_per_user_max: self.held_uploads_bytes_per_user_max,
            held_upload_expiry: Duration::from_secs(self.held_upload_expiry_seconds),
            refused_rows_max: self.refused_rows_max,
            held_download_bytes_max: self.held_download_bytes_max,
            held_downloads_bytes_max: self.held_downloads_bytes_max,
            held_downloads_bytes_per_user_max: self.held_downloads_bytes_per_user_max,
            held_download_expiry: Duration::from_secs(self.held_download_expiry_seconds),
            drain_timeout: Duration::from_secs(self.drain_timeout_seconds),
            tokens,
            ..defaults
        }
    }
}

/// SIGTERM (what service managers and orchestrators send) or SIGINT (Ctrl-C).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The admin token from its file (a trailing newline is not part of it); refused when
/// the endpoint is reachable beyond loopback without one.
fn admin_token(address: SocketAddr, file: Option<&std::path::Path>) -> Result<Option<Arc<str>>> {
    let Some(file) = file else {
        if !address.ip().is_loopback() {
            anyhow::bail!(
                "the admin endpoint {address} is reachable beyond loopback: give it a token with \
                 --admin-token-file FILE (requests then need Authorization: Bearer <token>), or \
                 bind it to 127.0.0.1"
            );
        }
        return Ok(None);
    };
    let token = std::fs::read_to_string(file)
        .with_context(|| format!("reading the admin token {}", file.display()))?;
    let token = token.trim_end_matches(['\r', '\n']);
    if token.len() < 16 {
        anyhow::bail!(
            "the admin token in {} is {} characters; use at least 16 (e.g. `openssl rand -hex 32`)",
            file.display(),
            token.len()
        );
    }
    Ok(Some(Arc::from(token)))
}

/// Serves the admin endpoint on `address` until the process ends (through a drain, so
/// `/readyz` tells the load balancer), in a task of its own.
async fn serve_metrics(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    token: Option<Arc<str>>,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the admin endpoint {address}"))?;
    let address = listener.local_addr()?;
    notice(format!(
        "rowsync metrics on http://{address}/metrics, monitor on http://{address}/monitor"
    ));
    tokio::spawn(async move {
        let forever = std::future::pending();
        let served =
            rowsync_server::admin::serve_admin_with_token(listener, metrics, token, forever).await;
        if let Err(error) = served {
            tracing::error!(%error, "the admin endpoint stopped");
        }
    });
    Ok(())
}
