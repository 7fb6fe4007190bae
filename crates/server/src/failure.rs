//! Why a sync ended early, and what (if anything) the client is told: every stage
//! returns a [`Failure`], and the sync's handler sends its reply and logs it.

use rowsync_protocol::WireError;

/// Why a sync ended early, and what (if anything) the client is told.
pub(crate) struct Failure {
    pub(crate) reply: Option<WireError>,
    pub(crate) log: String,
}

impl Failure {
    pub(crate) fn tell(error: WireError) -> Failure {
        Failure {
            log: error.to_string(),
            reply: Some(error),
        }
    }

    pub(crate) fn silent(log: String) -> Failure {
        Failure { reply: None, log }
    }
}
