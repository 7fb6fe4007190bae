//! Why a sync ended early, and what (if anything) the client is told: every stage
//! returns a [`Failure`], and the sync's handler sends its reply and logs it.

use rowsync_protocol::{Hello, Message, WireError};

/// What the client is told.
pub(crate) enum Reply {
    Error(WireError),
    /// No room for the connection: the client retries after the hint.
    Busy {
        retry_after_ms: u32,
    },
}

impl Reply {
    pub(crate) fn into_message(self) -> Message {
        match self {
            Reply::Error(error) => Message::Error(error),
            Reply::Busy { retry_after_ms } => Message::Busy { retry_after_ms },
        }
    }
}

/// Why a sync ended early, and what (if anything) the client is told.
pub(crate) struct Failure {
    /// `None` closes without an answer.
    pub(crate) reply: Option<Reply>,
    pub(crate) log: String,
    /// Who the sync was for, once its hello named it: `user="…" client_id="…"`.
    pub(crate) identity: Option<String>,
}

impl Failure {
    pub(crate) fn tell(error: WireError) -> Failure {
        Failure {
            log: error.to_string(),
            reply: Some(Reply::Error(error)),
            identity: None,
        }
    }

    /// The server had no room for the connection: the client hears `busy` and retries.
    pub(crate) fn busy(retry_after_ms: u32, log: String) -> Failure {
        Failure {
            reply: Some(Reply::Busy { retry_after_ms }),
            log,
            identity: None,
        }
    }

    pub(crate) fn silent(log: String) -> Failure {
        Failure {
            reply: None,
            log,
            identity: None,
        }
    }

    /// The error the client is told, if it is told one.
    pub(crate) fn error(&self) -> Option<&WireError> {
        match &self.reply {
            Some(Reply::Error(error)) => Some(error),
            _ => None,
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
