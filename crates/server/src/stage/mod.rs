//! The stages of one sync after the network stage, each a module: [`stream`] (read,
//! decompress, check, authenticate: a checked upload in a spool, no worker yet),
//! [`database`] (a worker: decode, the transaction, the download spooled) and
//! [`download`] (the spooled download sent after the worker is released, and the reply
//! to a download acknowledgement). `crate::sync` runs them in order.
//!
//! What two stages pass between them is here, beneath both: a stage imports an earlier
//! one's output type only from its parent, never from its sibling.

use std::sync::Arc;

use rowsync_consolidated::{Consolidated, SyncOutcome, SyncRequest};
use rowsync_protocol::PREAMBLE_BYTES;

use crate::session_token::IssuedToken;
use crate::shared::Shared;
use crate::spool::Spool;

pub(crate) mod database;
pub(crate) mod download;
pub(crate) mod stream;

/// What the database stage hands on: the committed sync and its whole download, spooled
/// (the end of the download not yet appended).
pub(crate) struct Synchronized {
    pub(crate) request: Arc<SyncRequest>,
    pub(crate) outcome: SyncOutcome,
    pub(crate) spool: Spool,
    /// The preamble that opens the reply, if the client sent one.
    pub(crate) preamble: Option<[u8; PREAMBLE_BYTES]>,
    /// Bytes of the upload received on the wire, for the sync's log line.
    pub(crate) wire_bytes_received: u64,
    /// A session token for the client (protocol v8), sent before the download's end.
    pub(crate) session_token: Option<IssuedToken>,
}

/// A download spool for `outbound`, within the server's download bounds and its spool
/// cache, and the preamble to send before it.
pub(crate) fn download_spool<B: Consolidated>(
    shared: &Shared<B>,
    mut outbound: rowsync_protocol::Outbound,
) -> (Option<[u8; PREAMBLE_BYTES]>, Spool) {
    let preamble = outbound.take_preamble();
    let spool = Spool::new(
        shared.config.download_spool_memory_bytes_max,
        shared.config.download_bytes_max,
        outbound,
        Arc::clone(&shared.cache),
    );
    (preamble, spool)
}
