//! `--db`: which consolidated database a command works on, parsed in one place.

use std::path::PathBuf;

/// A consolidated database named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// `postgres://...` or `postgresql://...`
    Postgres(String),
    /// `mysql://...` or `mariadb://...` (MariaDB 10.6+ or MySQL 8).
    Mysql(String),
    /// Anything else: a SQLite file path.
    Sqlite(PathBuf),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_choose_the_backend_and_anything_else_is_a_file() {
        assert_eq!(
            Database::parse("postgres://u@h/db"),
            Database::Postgres("postgres://u@h/db".into())
        );
        assert_eq!(
            Database::parse("mariadb://u@h:3306/db"),
            Database::Mysql("mysql://u@h:3306/db".into())
        );
        assert_eq!(
            Database::parse("mysql://u@h/db"),
            Database::Mysql("mysql://u@h/db".into())
        );
        assert_eq!(
            Database::parse("data/c.db"),
            Database::Sqlite(PathBuf::from("data/c.db"))
        );
    }
}
