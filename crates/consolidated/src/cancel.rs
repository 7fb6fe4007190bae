//! Stopping what a connection's database runs for a sync whose client went away. Each
//! backend says how in its own module ([`CancelStatement`]); the server holds the
//! [`Canceller`] a connection hands out.

use std::future::Future;
use std::pin::Pin;

use crate::DbError;

/// A backend's way to stop the statement one of its connections is running, from
/// another task: PostgreSQL's cancel request, SQLite's interrupt, MySQL's `KILL QUERY`
/// on a connection of its own.
pub(crate) trait CancelStatement: Send + Sync + 'static {
    /// Asks the database to stop the statement; it answers that statement with an error.
    fn cancel(&self) -> Pin<Box<dyn Future<Output = Result<(), DbError>> + Send + '_>>;
}

/// Cancels the statement a connection is running, from another task. The connection is
/// to be discarded afterwards (its transaction is still open).
pub struct Canceller(Box<dyn CancelStatement>);

impl Canceller {
    pub(crate) fn new(how: impl CancelStatement) -> Canceller {
        Canceller(Box::new(how))
    }

    /// Asks the database to stop the connection's statement; it answers that statement
    /// with an error.
    pub async fn cancel(&self) -> Result<(), DbError> {
        self.0.cancel().await
    }
}
