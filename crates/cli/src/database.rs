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
}

impl DatabaseArg {
    pub fn database(&self) -> Database {
        Database::parse(&self.db)
    }
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
