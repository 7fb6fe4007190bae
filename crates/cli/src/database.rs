//! `--db`: which consolidated database a command works on, and the backend behind it.
//!
//! Every command that takes `--db` goes through here, so a new backend is added in this
//! file only: a variant of [`Database`], its URL scheme in [`Database::parse`], its
//! name in [`Database::kind`], its backend in [`Database::run`], and the help text of
//! [`DatabaseArg`].

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{ApplyStreamSettings, Consolidated};

// The `--db` argument of the commands that need a consolidated database (no doc comment:
// on a flattened struct clap would take it for the command's description).
#[derive(clap::Args, Debug, Clone)]
pub struct DatabaseArg {
    /// The consolidated database: a SQLite file path, a postgres:// or a mysql:// URL.
    #[arg(long)]
    pub db: String,
    /// The password of the --db URL's user, read from this file (a trailing newline is
    /// not part of it), so it is in neither the command line nor the config file.
    #[arg(long, value_name = "FILE")]
    pub db_password_file: Option<PathBuf>,
}

impl DatabaseArg {
    pub fn database(&self) -> Result<Database> {
        let database = Database::parse(&self.db);
        let Some(file) = &self.db_password_file else {
            return Ok(database);
        };
        let password = std::fs::read_to_string(file).map_err(|error| {
            anyhow::anyhow!("reading --db-password-file {}: {error}", file.display())
        })?;
        let password = password.trim_end_matches(['\r', '\n']);
        Ok(match database {
            Database::Sqlite(_) => {
                anyhow::bail!("a SQLite database takes no password (--db-password-file)")
            }
            Database::Postgres(url) => Database::Postgres(with_password(&url, password)?),
            Database::Mysql(url) => Database::Mysql(with_password(&url, password)?),
        })
    }
}

/// `scheme://user@host/...` with `password` for the user, percent-encoded.
fn with_password(url: &str, password: &str) -> Result<String> {
    let (scheme, rest) = url.split_once("://").expect("a URL of a server backend");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some((user, host)) = rest[..authority_end].rsplit_once('@') else {
        anyhow::bail!("--db-password-file needs a user in the --db URL (scheme://user@host/...)");
    };
    if user.contains(':') {
        anyhow::bail!(
            "the --db URL has a password, and --db-password-file names one too: keep one"
        );
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
    pub fn parse(db: &str) -> Database {
        if db.starts_with("postgres://") || db.starts_with("postgresql://") {
            Database::Postgres(db.to_string())
        } else if let Some(rest) = db.strip_prefix("mariadb://") {
            // The driver knows the scheme as mysql://; the protocol is the same.
            Database::Mysql(format!("mysql://{rest}"))
        } else if db.starts_with("mysql://") {
            Database::Mysql(db.to_string())
        } else {
            Database::Sqlite(PathBuf::from(db))
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
        match self {
            Database::Sqlite(path) => command.run(SqliteConsolidated::new(path)).await,
            Database::Postgres(url) => {
                let backend = PostgresConsolidated::with_apply_streams(url, streams);
                command.run(backend).await
            }
            Database::Mysql(url) => command.run(MysqlConsolidated::new(&url)?).await,
        }
    }
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
        assert_eq!(Database::parse(url), Database::Postgres(url.to_string()));
        let url = "postgresql://me@127.0.0.1/scratch";
        assert_eq!(Database::parse(url), Database::Postgres(url.to_string()));
        let url = "mysql://me@127.0.0.1:3306/scratch";
        assert_eq!(Database::parse(url), Database::Mysql(url.to_string()));
        assert_eq!(
            Database::parse("mariadb://me@127.0.0.1:3306/scratch"),
            Database::Mysql(url.to_string())
        );
        assert_eq!(
            Database::parse("central.db"),
            Database::Sqlite(PathBuf::from("central.db"))
        );
        assert_eq!(
            Database::parse("dir/postgres://x"),
            Database::Sqlite(PathBuf::from("dir/postgres://x"))
        );
    }
}
