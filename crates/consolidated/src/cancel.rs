//! Stopping what a connection's database runs for a sync whose client went away.

use std::sync::Arc;

use crate::DbError;

/// Cancels the statement a connection is running, from another task: PostgreSQL's
/// cancel request, SQLite's interrupt, MySQL's `KILL QUERY` on a connection of its own.
/// The connection is to be discarded afterwards (its transaction is still open).
pub struct Canceller(Kind);

enum Kind {
    Postgres(tokio_postgres::CancelToken),
    Sqlite(Arc<rusqlite::InterruptHandle>),
    Mysql {
        opts: mysql_async::Opts,
        connection_id: u32,
    },
}

impl Canceller {
    pub(crate) fn postgres(token: tokio_postgres::CancelToken) -> Canceller {
        Canceller(Kind::Postgres(token))
    }

    pub(crate) fn sqlite(handle: Arc<rusqlite::InterruptHandle>) -> Canceller {
        Canceller(Kind::Sqlite(handle))
    }

    pub(crate) fn mysql(opts: mysql_async::Opts, connection_id: u32) -> Canceller {
        Canceller(Kind::Mysql {
            opts,
            connection_id,
        })
    }

    /// Asks the database to stop the connection's statement; it answers that statement
    /// with an error.
    pub async fn cancel(&self) -> Result<(), DbError> {
        match &self.0 {
            Kind::Postgres(token) => Ok(token.cancel_query(tokio_postgres::NoTls).await?),
            Kind::Sqlite(handle) => {
                handle.interrupt();
                Ok(())
            }
            Kind::Mysql {
                opts,
                connection_id,
            } => {
                use mysql_async::prelude::Queryable;
                let db = crate::mysql::error::db;
                let mut killer = mysql_async::Conn::new(opts.clone()).await.map_err(db)?;
                killer
                    .query_drop(format!("KILL QUERY {connection_id}"))
                    .await
                    .map_err(db)?;
                killer.disconnect().await.map_err(db)
            }
        }
    }
}
