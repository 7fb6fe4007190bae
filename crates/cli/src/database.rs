//! `--db`: which consolidated database a command works on, and the backend behind it.
//!
//! Every command that takes `--db` goes through here, so a new backend is added in this
//! file only: a variant of [`Database`], its URL scheme in [`Database::parse`] and
//! [`SCHEMES`], its name in [`Database::kind`], its backend in [`Database::run`], and the
//! help text of [`DatabaseArg`].
//!
//! A `--db` is taken as the user meant it or refused ([`DbArgError`]): a SQLite file must
//! exist (only `init --create` makes one), a URL's scheme must be one rowsync reads. A
//! URL without a password takes one from `--db-password-file`, else from the variables
//! and files the database's own tools read (`PGPASSWORD`, `PGPASSFILE` or `~/.pgpass`;
//! `~/.my.cnf` or `MYSQL_PWD`). A URL's password is never shown: messages show the URL through
//! [`without_password`].

mod mycnf;
mod pgpass;

use std::future::Future;
use std::path::{Path, PathBuf};

use anyhow::Result;
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{ApplyStreamSettings, Consolidated};

/// The URL schemes `--db` takes, in the order messages name them.
pub const SCHEMES: [&str; 4] = ["postgres", "postgresql", "mysql", "mariadb"];

/// A `--db` refused before any database is touched.
#[derive(Debug, thiserror::Error)]
pub enum DbArgError {
    #[error(
        "there is no SQLite database {path} (a typo?): give the path of an existing file, or \
         make the database: create its tables (sqlite3 {path} \"CREATE TABLE ...\") and run \
         `rowsync init --db {path} --table TABLE --partition-column COLUMN`",
        path = .0.display()
    )]
    MissingSqliteFile(PathBuf),
    #[error(
        "--db {shown}: rowsync does not read {scheme}:// URLs; it reads postgres:// \
         (or postgresql://), mysql:// (or mariadb://) URLs and SQLite file paths{hint}"
    )]
    UnknownScheme {
        /// The URL, its password masked.
        shown: String,
        scheme: String,
        /// `; did you mean postgres://?` when a scheme is close, else empty.
        hint: String,
    },
    #[error("a SQLite database takes no password (--db-password-file)")]
    PasswordForSqlite,
    #[error("reading --db-password-file {path}: {error}", path = .path.display())]
    PasswordFile {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("--db-password-file needs a user in the --db URL (scheme://user@host/...)")]
    NoUser,
    #[error("the --db URL has a password, and --db-password-file names one too: keep one")]
    TwoPasswords,
}

// The `--db` argument of the commands that need a consolidated database (no doc comment:
// on a flattened struct clap would take it for the command's description).
#[derive(clap::Args, Debug, Clone)]
pub struct DatabaseArg {
    /// The consolidated database: a SQLite file path (which must exist), a postgres://
    /// or a mysql:// URL. A URL without a password takes it from --db-password-file, else
    /// PGPASSWORD, PGPASSFILE or ~/.pgpass (PostgreSQL), ~/.my.cnf or MYSQL_PWD (MySQL,
    /// MariaDB).
    #[arg(long)]
    pub db: String,
    /// The password of the --db URL's user, read from this file (a trailing newline is
    /// not part of it), so it is in neither the command line nor the config file.
    #[arg(long, value_name = "FILE")]
    pub db_password_file: Option<PathBuf>,
}

impl DatabaseArg {
    /// The database `--db` names; a SQLite file must exist.
    pub fn database(&self) -> Result<Database> {
        Ok(self.resolve(true, &|name| std::env::var(name).ok())?)
    }

    /// The database `--db` names; a SQLite file that does not exist is made (`init
    /// --create`).
    pub fn database_or_new(&self) -> Result<Database> {
        Ok(self.resolve(false, &|name| std::env::var(name).ok())?)
    }

    /// The database, with its password from the file or `environment` when its URL
    /// has none.
    fn resolve(
        &self,
        must_exist: bool,
        environment: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Database, DbArgError> {
        let database = Database::parse(&self.db)?;
        let file_password = match &self.db_password_file {
            Some(path) => Some(read_password_file(path)?),
            None => None,
        };
        Ok(match database {
            Database::Sqlite(path) => {
                if file_password.is_some() {
                    return Err(DbArgError::PasswordForSqlite);
                }
                if must_exist && !path.exists() {
                    return Err(DbArgError::MissingSqliteFile(path));
                }
                Database::Sqlite(path)
            }
            Database::Postgres(url) => {
                let found = match file_password {
                    Some(password) => Some(Password::FromFile(password)),
                    None if has_password(&url) => None,
                    None => postgres_password(&url, environment).map(Password::FromEnvironment),
                };
                Database::Postgres(with_found_password(url, found)?)
            }
            Database::Mysql(url) => {
                let found = match file_password {
                    Some(password) => Some(Password::FromFile(password)),
                    None if has_password(&url) => None,
                    None => mysql_password(environment).map(Password::FromEnvironment),
                };
                Database::Mysql(with_found_password(url, found)?)
            }
        })
    }
}

/// A password for a URL that has none.
enum Password {
    /// From `--db-password-file`: the URL must have a user and no password of its own.
    FromFile(String),
    /// From the variables and files the database's tools read: taken where the URL has
    /// a user, else left to the driver's defaults.
    FromEnvironment(String),
}

fn with_found_password(url: String, found: Option<Password>) -> Result<String, DbArgError> {
    match found {
        None => Ok(url),
        Some(Password::FromFile(password)) => with_password(&url, &password),
        Some(Password::FromEnvironment(password)) => {
            Ok(with_password(&url, &password).unwrap_or(url))
        }
    }
}

fn read_password_file(path: &Path) -> Result<String, DbArgError> {
    let password = std::fs::read_to_string(path).map_err(|error| DbArgError::PasswordFile {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(password.trim_end_matches(['\r', '\n']).to_string())
}

/// `PGPASSWORD`, else the password file's line for the URL's host, port, database and
/// user (a file others can read is ignored, with a warning).
fn postgres_password(url: &str, environment: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(password) = environment("PGPASSWORD").filter(|p| !p.is_empty()) {
        return Some(password);
    }
    let home = environment("HOME").map(PathBuf::from);
    let file = pgpass::path(environment("PGPASSFILE").map(PathBuf::from), home)?;
    let without_query = url.split('?').next().unwrap_or(url);
    let config: tokio_postgres::Config = without_query.parse().ok()?;
    let user = config.get_user()?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        #[cfg(unix)]
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_string(),
    };
    let target = pgpass::Target {
        host: &host,
        port: config.get_ports().first().copied().unwrap_or(5432),
        database: config.get_dbname().unwrap_or(user),
        user,
    };
    match pgpass::lookup(&file, &target) {
        pgpass::Lookup::Password(password) => Some(password),
        pgpass::Lookup::Nothing => None,
        pgpass::Lookup::Ignored(warning) => {
            eprintln!("warning: {warning}");
            None
        }
    }
}

/// The password the mysql client would take: the `[client]` password of `~/.my.cnf`,
/// else `MYSQL_PWD` (option files win over the environment, as for the mysql client).
fn mysql_password(environment: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(home) = environment("HOME") {
        match mycnf::lookup(&Path::new(&home).join(".my.cnf")) {
            mycnf::Lookup::Password(password) => return Some(password),
            mycnf::Lookup::Nothing => {}
            mycnf::Lookup::Ignored(warning) => eprintln!("warning: {warning}"),
        }
    }
    environment("MYSQL_PWD").filter(|password| !password.is_empty())
}

/// The authority of `scheme://authority/...`: `(userinfo, host and port)`.
fn authority(url: &str) -> Option<(Option<&str>, &str)> {
    let (_, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    Some(match rest[..end].rsplit_once('@') {
        Some((userinfo, host)) => (Some(userinfo), host),
        None => (None, &rest[..end]),
    })
}

fn has_password(url: &str) -> bool {
    matches!(authority(url), Some((Some(userinfo), _)) if userinfo.contains(':'))
}

/// `url` with its password (if it has one) shown as `********`: what messages show.
pub fn without_password(url: &str) -> String {
    let (Some((Some(userinfo), _)), Some((scheme, rest))) = (authority(url), url.split_once("://"))
    else {
        return url.to_string();
    };
    let Some((user, _)) = userinfo.split_once(':') else {
        return url.to_string();
    };
    format!("{scheme}://{user}:********{}", &rest[userinfo.len()..])
}

/// The scheme of `scheme://...` (letters, digits, `+`, `-`, `.`, starting with a
/// letter, as RFC 3986 has it); `None` for anything else, a file path.
fn url_scheme(db: &str) -> Option<&str> {
    let (scheme, _) = db.split_once("://")?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    let valid = first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some(scheme)
}

/// What the user may have meant by `scheme`: the scheme rowsync reads closest to it (a
/// typo, a common other name: `postgress`, `pgsql`, `mysq`), or a SQLite file's path.
fn scheme_hint(scheme: &str) -> String {
    let scheme = scheme.to_ascii_lowercase();
    if ["sqlite", "sqlite3", "file"].contains(&scheme.as_str()) {
        return "; a SQLite database is named by its file path alone (--db central.db)".into();
    }
    if ["pg", "pgsql", "psql", "postgis", "pq", "libpq"].contains(&scheme.as_str()) {
        return "; did you mean postgres://?".into();
    }
    SCHEMES
        .iter()
        .map(|known| (strsim::levenshtein(&scheme, known), *known))
        .filter(|(distance, known)| *distance <= 2.max(known.len() / 3))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| format!("; did you mean {known}://?"))
        .unwrap_or_default()
}

/// `host:port` of a server URL, with the backend's default port: for messages.
fn server_address(url: &str, default_port: u16) -> String {
    let host_port = authority(url).map_or("", |(_, host)| host);
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, port.to_string()),
        _ => (host_port, default_port.to_string()),
    };
    let host = if host.is_empty() { "localhost" } else { host };
    format!("{host}:{port}")
}

/// `scheme://user@host/...` with `password` for the user, percent-encoded.
fn with_password(url: &str, password: &str) -> Result<String, DbArgError> {
    let (scheme, rest) = url.split_once("://").expect("a URL of a server backend");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some((user, host)) = rest[..authority_end].rsplit_once('@') else {
        return Err(DbArgError::NoUser);
    };
    if user.contains(':') {
        return Err(DbArgError::TwoPasswords);
    }
    let encoded: String = password
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect();
    Ok(format!(
        "{scheme}://{user}:{encoded}@{host}{}",
        &rest[authority_end..]
    ))
}

/// A consolidated database as `--db` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// An embedded SQLite file: any `--db` that is not a URL of another backend.
    Sqlite(PathBuf),
    /// A `postgres://` or `postgresql://` URL.
    Postgres(String),
    /// A `mysql://` URL (or `mariadb://`, stored as `mysql://`): MariaDB 10.6+ or MySQL 8.
    Mysql(String),
}

/// A command that runs on whichever backend `--db` names (see [`Database::run`]).
pub trait OnBackend {
    type Output;
    fn run<B: Consolidated>(self, backend: B) -> impl Future<Output = Result<Self::Output>>;
}

impl Database {
    /// What `--db` names: a URL of a scheme rowsync reads, or else a SQLite file path.
    /// `word://...` with any other scheme is refused, with the nearest scheme as a hint.
    pub fn parse(db: &str) -> Result<Database, DbArgError> {
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            Ok(Database::Postgres(db.to_string()))
        } else if let Some(rest) = db.strip_prefix("mariadb://") {
            // The driver knows the scheme as mysql://; the protocol is the same.
            Ok(Database::Mysql(format!("mysql://{rest}")))
        } else if db.starts_with("mysql://") {
            Ok(Database::Mysql(db.to_string()))
        } else if let Some(scheme) = url_scheme(db) {
            Err(DbArgError::UnknownScheme {
                shown: without_password(db),
                scheme: scheme.to_string(),
                hint: scheme_hint(scheme),
            })
        } else {
            Ok(Database::Sqlite(PathBuf::from(db)))
        }
    }

    /// The database software, for messages (a URL may hold a password: never shown).
    pub fn kind(&self) -> &'static str {
        match self {
            Database::Sqlite(_) => "SQLite",
            Database::Postgres(_) => "PostgreSQL",
            Database::Mysql(_) => "MySQL",
        }
    }

    /// Runs `command` on this database's backend.
    pub async fn run<C: OnBackend>(self, command: C) -> Result<C::Output> {
        self.run_with_apply_streams(command, ApplyStreamSettings::OFF)
            .await
    }

    /// Runs `command` on this database's backend, whose syncs apply large uploads over
    /// apply streams as `streams` says where the backend can (PostgreSQL; SQLite has one
    /// writer, the MySQL backend does not use XA transactions).
    pub async fn run_with_apply_streams<C: OnBackend>(
        self,
        command: C,
        streams: ApplyStreamSettings,
    ) -> Result<C::Output> {
        let server = self.server();
        let ran = match self {
            Database::Sqlite(path) => command.run(SqliteConsolidated::new(path)).await,
            Database::Postgres(url) => {
                let backend = PostgresConsolidated::with_apply_streams(url, streams);
                command.run(backend).await
            }
            Database::Mysql(url) => command.run(MysqlConsolidated::new(&url)?).await,
        };
        match (ran, server) {
            (Err(error), Some((address, server))) => match connection_trouble(&error) {
                Some(trouble) => Err(error.context(trouble.explained(&address, server))),
                None => Err(error),
            },
            (ran, _) => ran,
        }
    }

    /// The `host:port` this database's server is at, and its kind (`None` for SQLite,
    /// which connects to nothing).
    fn server(&self) -> Option<(String, &'static str)> {
        match self {
            Database::Sqlite(_) => None,
            Database::Postgres(url) => Some((server_address(url, 5432), "PostgreSQL")),
            Database::Mysql(url) => Some((server_address(url, 3306), "MySQL or MariaDB")),
        }
    }
}

/// Why a connection to the database's server could not be made, when the address is why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectionTrouble {
    Refused,
    UnknownHost,
}

impl ConnectionTrouble {
    /// What it means, naming the server's host and port.
    fn explained(self, address: &str, server: &str) -> String {
        match self {
            ConnectionTrouble::Refused => format!(
                "nothing accepts connections at {address}, the {server} server of --db: is it \
                 running, and listening on that host and port?"
            ),
            ConnectionTrouble::UnknownHost => format!(
                "the host of {address}, the {server} server of --db, is not known: check its \
                 spelling"
            ),
        }
    }
}

/// Whether a connection was refused, or its host not found, somewhere in `error`'s causes.
fn connection_trouble(error: &anyhow::Error) -> Option<ConnectionTrouble> {
    error.chain().find_map(|cause| {
        let refused = cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
        let text = cause.to_string();
        if refused || text.contains("Connection refused") {
            Some(ConnectionTrouble::Refused)
        } else if text.contains("failed to lookup address")
            || text.contains("Name or service not known")
        {
            Some(ConnectionTrouble::UnknownHost)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_from_a_file_goes_into_the_url_encoded() {
        assert_eq!(
            with_password("postgres://app@db:5432/app?sslmode=require", "p@ss:w/rd").unwrap(),
            "postgres://app:p%40ss%3Aw%2Frd@db:5432/app?sslmode=require"
        );
        assert!(with_password("postgres://app:x@db/app", "y").is_err());
        assert!(with_password("postgres://db/app", "y").is_err());
    }

    #[test]
    fn urls_name_their_backend_and_anything_else_is_a_sqlite_file() {
        let url = "postgres://me@127.0.0.1/scratch";
        assert_eq!(
            Database::parse(url).unwrap(),
            Database::Postgres(url.to_string())
        );
        let url = "postgresql://me@127.0.0.1/scratch";
        assert_eq!(
            Database::parse(url).unwrap(),
            Database::Postgres(url.to_string())
        );
        let url = "mysql://me@127.0.0.1:3306/scratch";
        assert_eq!(
            Database::parse(url).unwrap(),
            Database::Mysql(url.to_string())
        );
        assert_eq!(
            Database::parse("mariadb://me@127.0.0.1:3306/scratch").unwrap(),
            Database::Mysql(url.to_string())
        );
        assert_eq!(
            Database::parse("central.db").unwrap(),
            Database::Sqlite(PathBuf::from("central.db"))
        );
        assert_eq!(
            Database::parse("dir/postgres://x").unwrap(),
            Database::Sqlite(PathBuf::from("dir/postgres://x"))
        );
    }

    fn refusal(db: &str) -> String {
        Database::parse(db).unwrap_err().to_string()
    }

    #[test]
    fn an_unknown_scheme_is_refused_with_the_nearest_and_no_password() {
        assert_eq!(
            refusal("postgress://app:s3cret@db.example.com/app"),
            "--db postgress://app:********@db.example.com/app: rowsync does not read \
             postgress:// URLs; it reads postgres:// (or postgresql://), mysql:// (or \
             mariadb://) URLs and SQLite file paths; did you mean postgres://?"
        );
        assert!(refusal("mysq://root@h/db").ends_with("; did you mean mysql://?"));
        assert!(refusal("pgsql://h/db").ends_with("; did you mean postgres://?"));
        assert!(refusal("sqlite://central.db").ends_with("(--db central.db)"));
        assert!(refusal("redis://h").ends_with("SQLite file paths"));
    }

    #[test]
    fn passwords_are_masked_wherever_the_url_puts_them() {
        assert_eq!(
            without_password("postgres://app:p%40ss@db:5432/app?sslmode=require"),
            "postgres://app:********@db:5432/app?sslmode=require"
        );
        assert_eq!(
            without_password("postgres://app@db/app"),
            "postgres://app@db/app"
        );
        assert_eq!(without_password("x://u:p@h?a=b"), "x://u:********@h?a=b");
        assert_eq!(without_password("central.db"), "central.db");
    }

    #[test]
    fn a_refused_connection_names_the_host_and_port() {
        assert_eq!(
            server_address("postgres://app:x@db.example.com/app", 5432),
            "db.example.com:5432"
        );
        assert_eq!(
            server_address("mysql://root@127.0.0.1:3307/db", 3306),
            "127.0.0.1:3307"
        );
        assert_eq!(server_address("postgres://[::1]/db", 5432), "[::1]:5432");
        assert_eq!(server_address("postgres:///db", 5432), "localhost:5432");
    }

    #[test]
    fn a_refused_connection_or_an_unknown_host_is_explained() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "no");
        let refused = anyhow::Error::new(refused).context("postgres: connecting");
        assert_eq!(
            connection_trouble(&refused),
            Some(ConnectionTrouble::Refused)
        );
        let lookup =
            anyhow::anyhow!("failed to lookup address information: Name or service not known");
        assert_eq!(
            connection_trouble(&lookup),
            Some(ConnectionTrouble::UnknownHost)
        );
        assert_eq!(
            connection_trouble(&anyhow::anyhow!("password authentication failed")),
            None
        );
        assert_eq!(
            ConnectionTrouble::UnknownHost.explained("db.exmaple.com:5432", "PostgreSQL"),
            "the host of db.exmaple.com:5432, the PostgreSQL server of --db, is not known: check \
             its spelling"
        );
    }

    fn resolved(db: &str, environment: &[(&str, &str)]) -> String {
        let argument = DatabaseArg {
            db: db.to_string(),
            db_password_file: None,
        };
        let lookup = |name: &str| {
            environment
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        };
        match argument.resolve(false, &lookup).unwrap() {
            Database::Postgres(url) | Database::Mysql(url) => url,
            Database::Sqlite(path) => path.display().to_string(),
        }
    }

    #[test]
    fn a_url_without_a_password_takes_the_environments() {
        let url = "postgres://app@db/app";
        assert_eq!(
            resolved(url, &[("PGPASSWORD", "a:b")]),
            "postgres://app:a%3Ab@db/app"
        );
        assert_eq!(
            resolved("postgres://app:mine@db/app", &[("PGPASSWORD", "x")]),
            "postgres://app:mine@db/app"
        );
        assert_eq!(
            resolved("postgres://db/app", &[("PGPASSWORD", "x")]),
            "postgres://db/app"
        );
        assert_eq!(
            resolved("mysql://root@db/app", &[("MYSQL_PWD", "m")]),
            "mysql://root:m@db/app"
        );
        assert_eq!(
            resolved("mysql://root@db/app", &[("PGPASSWORD", "m")]),
            "mysql://root@db/app"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "db:5432:app:app:from-file\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let file = file.to_str().unwrap();
        assert_eq!(
            resolved(url, &[("PGPASSFILE", file)]),
            "postgres://app:from-file@db/app"
        );
        assert_eq!(
            resolved(url, &[("PGPASSFILE", file), ("PGPASSWORD", "env")]),
            "postgres://app:env@db/app"
        );
        std::fs::rename(file, dir.path().join(".pgpass")).unwrap();
        let home = dir.path().to_str().unwrap();
        assert_eq!(
            resolved(url, &[("HOME", home)]),
            "postgres://app:from-file@db/app"
        );
        assert_eq!(
            resolved("postgres://app@db:5433/app", &[("HOME", home)]),
            "postgres://app@db:5433/app"
        );
        let mysql = "mysql://root@db/app";
        std::fs::write(dir.path().join(".my.cnf"), "[client]\npassword=cnf\n").unwrap();
        let both = [("HOME", home), ("MYSQL_PWD", "env")];
        assert_eq!(resolved(mysql, &both), "mysql://root:cnf@db/app");
        assert_eq!(
            resolved(mysql, &[("MYSQL_PWD", "env")]),
            "mysql://root:env@db/app"
        );
    }

    #[test]
    fn a_missing_sqlite_file_is_refused_unless_it_may_be_made() {
        let argument = DatabaseArg {
            db: "no-such-dir/typo.db".to_string(),
            db_password_file: None,
        };
        let error = argument.resolve(true, &|_| None).unwrap_err().to_string();
        assert_eq!(
            error,
            "there is no SQLite database no-such-dir/typo.db (a typo?): give the path of an \
             existing file, or make the database: create its tables (sqlite3 \
             no-such-dir/typo.db \"CREATE TABLE ...\") and run `rowsync init --db \
             no-such-dir/typo.db --table TABLE --partition-column COLUMN`"
        );
        assert!(argument.resolve(false, &|_| None).is_ok());
    }
}
