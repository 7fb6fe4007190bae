//! Why a sync ended early, and what (if anything) the client is told: every stage
//! returns a [`Failure`], and the sync's handler sends its reply and logs it.

use rowsync_protocol::{Hello, WireError};

/// Why a sync ended early, and what (if anything) the client is told.
pub(crate) struct Failure {
    pub(crate) reply: Option<WireError>,
    /// Answered `busy` with this retry hint instead (no room for the connection).
    pub(crate) busy_retry_after_ms: Option<u32>,
    pub(crate) log: String,
    /// Who the sync was for, once its hello named it: `user="…" client_id="…"`.
    pub(crate) identity: Option<String>,
}

impl Failure {
    pub(crate) fn tell(error: WireError) -> Failure {
        Failure {
            log: error.to_string(),
            reply: Some(error),
            busy_retry_after_ms: None,
            identity: None,
        }
    }

    /// The server had no room for the connection: the client hears `busy` and retries.
    pub(crate) fn busy(retry_after_ms: u32, log: String) -> Failure {
        Failure {
            reply: None,
            busy_retry_after_ms: Some(retry_after_ms),
            log,
            identity: None,
        }
    }

    pub(crate) fn silent(log: String) -> Failure {
        Failure {
            reply: None,
            busy_retry_after_ms: None,
            log,
            identity: None,
        }
    }

    /// The failure of the sync `hello` opened, for its log line.
    pub(crate) fn of(mut self, hello: &Hello) -> Failure {
        self.identity.get_or_insert_with(|| identity(hello));
        self
    }
}

/// A hello's user and client id as they appear in log lines (quoted: both come from
/// the network).
pub(crate) fn identity(hello: &Hello) -> String {
    format!("user={:?} client_id={:?}", hello.user, hello.client_id)
}
