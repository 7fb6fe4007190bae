//! Resumable transfers on the server. Uploads (protocol v3): what a cut connection
//! received of its transfer is held in the consolidated database
//! (`ConsolidatedConnection::hold_transfer`, `Direction::Upload`), so that the client's
//! next attempt, on this server or another sharing the database, asks what is held
//! (`upload_held`) and goes on from there (`upload_resume`). The stream a transfer counts
//! in is the upload's decompressed frames after the `upload_resume` frame: what the
//! upload spool holds. Nothing is held for a connection that was not authenticated, nor
//! for an upload the server refused.
//!
//! Downloads (protocol v4): the whole decompressed stream of a download the client may
//! lack is held (`Direction::Download`, `hold_download`), and a `download_resume` is
//! answered from it (`held_download`).

use rowsync_consolidated::{
    Consolidated, ConsolidatedConnection, Direction, HeldTransfer, HoldBounds,
};
use rowsync_protocol::{DownloadHeld, ErrorCode, Hello, UploadHeld, WireError};
use sha2::{Digest, Sha256};

use crate::failure::Failure;
use crate::shared::Shared;
use crate::spool::Spool;

/// The transfer a v3 upload named, and where it went on.
#[derive(Debug, Clone)]
pub(crate) struct Transfer {
    pub(crate) transfer_id: String,
    pub(crate) offset: u64,
}

pub(crate) fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as i64)
}

fn database_failure(error: impl std::fmt::Display) -> Failure {
    Failure::tell(WireError::new(
        ErrorCode::Internal,
        format!("consolidated database error: {error}"),
    ))
}

/// The first `offset` bytes of the transfer's stream as held for this client and user,
/// or the refusal (code 14) that sends the client back to offset 0.
pub(crate) async fn held_prefix<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
    user: &str,
    transfer: &Transfer,
) -> Result<Vec<u8>, Failure> {
    let not_held = |what: String| {
        Failure::tell(WireError::new(
            ErrorCode::TransferNotHeld,
            format!(
                "transfer {:?} cannot resume at byte {}: {what}; send it again from offset 0",
                transfer.transfer_id, transfer.offset
            ),
        ))
    };
    let read = read_held(
        shared,
        Direction::Upload,
        hello,
        user,
        &transfer.transfer_id,
        transfer.offset,
        |_| transfer.offset,
    )
    .await?;
    let bytes = match read {
        Ok((_, bytes)) => bytes,
        Err(NotHeld::Nothing) => {
            return Err(not_held(
                "the server holds nothing of it for this client".into(),
            ))
        }
        Err(NotHeld::Shorter { length }) => {
            return Err(not_held(format!("the server holds {length} bytes")))
        }
        Err(NotHeld::Missing { found, .. }) => {
            return Err(not_held(format!("the server found {found} bytes of it")))
        }
    };
    shared.metrics.upload_resumed_bytes.inc_by(transfer.offset);
    Ok(bytes)
}

/// What the server holds of a transfer for this client and user, as `upload_held`
/// answers it (length 0 and no digest: nothing).
pub(crate) async fn held_answer<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
) -> Result<UploadHeld, Failure> {
    shared.holding.settled(&hello.client_id).await;
    let mut worker = shared
        .auth_pool
        .acquire("")
        .await
        .map_err(database_failure)?;
    let held = worker
        .connection()
        .held_transfer(Direction::Upload, &hello.client_id, transfer_id)
        .await
        .map_err(database_failure)?
        .filter(|held| held.user == user);
    Ok(match held {
        Some(held) => UploadHeld {
            transfer_id: transfer_id.to_string(),
            length: held.length,
            sha256: held.sha256,
        },
        None => UploadHeld {
            transfer_id: transfer_id.to_string(),
            length: 0,
            sha256: Vec::new(),
        },
    })
}

/// Holds what a cut connection received of its transfer (the spool's bytes), unless it
/// is empty or above `held_upload_bytes_max`. Failures are logged: the client then
/// starts again from offset 0, as without resumption.
pub(crate) async fn hold_cut<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
    user: &str,
    transfer: &Transfer,
    spool: Spool,
) {
    let config = &shared.config;
    let length = spool.bytes();
    if length == 0 || length > config.held_upload_bytes_max {
        return;
    }
    let mut bytes = Vec::with_capacity(length as usize);
    let drained = spool
        .drain(|piece| {
            bytes.extend_from_slice(piece);
            Ok(())
        })
        .await;
    if let Err(error) = drained {
        tracing::warn!(%error, "reading a cut upload's spool failed; nothing held");
        return;
    }
    let limits = HoldLimits {
        direction: Direction::Upload,
        bounds: HoldBounds {
            all_bytes_max: config.held_uploads_bytes_max,
            user_bytes_max: config.held_uploads_bytes_per_user_max,
        },
    };
    hold(shared, limits, hello, user, &transfer.transfer_id, &bytes).await;
}

/// Where a transfer is held, and the bounds on the held transfers of its direction (all,
/// and its user's).
pub(crate) struct HoldLimits {
    pub(crate) direction: Direction,
    pub(crate) bounds: HoldBounds,
}

/// Holds `bytes` of a client's transfer (one per client and direction), logged; a
/// failure is logged only: the client then starts again as without resumption.
pub(crate) async fn hold<B: Consolidated>(
    shared: &Shared<B>,
    limits: HoldLimits,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
    bytes: &[u8],
) {
    let HoldLimits { direction, bounds } = limits;
    let what = direction.name();
    let held = HeldTransfer {
        client_id: hello.client_id.clone(),
        user: user.to_string(),
        transfer_id: transfer_id.to_string(),
        length: bytes.len() as u64,
        sha256: Sha256::digest(bytes).to_vec(),
        created_unix_ms: unix_ms_now(),
    };
    let stored = match shared.auth_pool.acquire("").await {
        Ok(mut worker) => {
            worker
                .connection()
                .hold_transfer(direction, &held, bytes, bounds)
                .await
        }
        Err(error) => Err(error),
    };
    match stored {
        Ok(true) => {
            match direction {
                Direction::Upload => shared.metrics.uploads_held.inc(),
                Direction::Download => shared.metrics.downloads_held.inc(),
            };
            tracing::info!(
                client_id = ?held.client_id,
                transfer_id = ?held.transfer_id,
                bytes = held.length,
                "held a cut {what} for its client to resume"
            );
        }
        Ok(false) => tracing::warn!(
            client_id = ?held.client_id,
            user = ?held.user,
            bytes = held.length,
            "a cut {what} was not held: all held {what}s would exceed {} bytes \
             (held_{what}s_bytes_max), the user's {} bytes (held_{what}s_bytes_per_user_max), \
             or the client id holds another user's",
            bounds.all_bytes_max,
            bounds.user_bytes_max,
        ),
        Err(error) => tracing::warn!(%error, "holding a cut {what} failed"),
    }
}

/// Removes a held transfer that is no longer needed (an upload's start once it arrived
/// whole, a download once its client has all of it), if it is `user`'s.
pub(crate) async fn release<B: Consolidated>(
    shared: &Shared<B>,
    direction: Direction,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
) {
    let released = match shared.auth_pool.acquire("").await {
        Ok(mut worker) => {
            let connection = worker.connection();
            match connection
                .held_transfer(direction, &hello.client_id, transfer_id)
                .await
            {
                Ok(Some(held)) if held.user == user => {
                    connection
                        .release_held_transfer(direction, &hello.client_id, transfer_id)
                        .await
                }
                Ok(_) => Ok(false),
                Err(error) => Err(error),
            }
        }
        Err(error) => Err(error),
    };
    if let Err(error) = released {
        let what = direction.name();
        tracing::warn!(%error, "removing a held {what} failed; it expires");
    }
}

/// Removes held transfers of a direction older than `expiry`; returns how many.
pub(crate) async fn expire<C: ConsolidatedConnection>(
    connection: &mut C,
    direction: Direction,
    expiry: std::time::Duration,
) -> Result<u64, rowsync_consolidated::DbError> {
    let before = unix_ms_now().saturating_sub(expiry.as_millis() as i64);
    connection.expire_held_transfers(direction, before).await
}

/// Holds a download whose client may not have all of it (protocol v4): its whole
/// stream, decompressed from the spool that was sent, unless above
/// `held_download_bytes_max`.
pub(crate) async fn hold_download<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
    spool: Spool,
) {
    let config = &shared.config;
    let bytes = match spool.decompressed(config.held_download_bytes_max).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            tracing::info!(
                client_id = ?hello.client_id,
                "a cut download above held_download_bytes_max ({} bytes) was not held",
                config.held_download_bytes_max
            );
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "reading a cut download's spool failed; nothing held");
            return;
        }
    };
    let limits = HoldLimits {
        direction: Direction::Download,
        bounds: HoldBounds {
            all_bytes_max: config.held_downloads_bytes_max,
            user_bytes_max: config.held_downloads_bytes_per_user_max,
        },
    };
    hold(shared, limits, hello, user, transfer_id, &bytes).await;
}

/// The answer to a `download_resume` and the held download's stream from its offset, or
/// the refusal (code 14) that sends the client to a fresh sync.
pub(crate) async fn held_download<B: Consolidated>(
    shared: &Shared<B>,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
    offset: u64,
) -> Result<(DownloadHeld, Vec<u8>), Failure> {
    let not_held = |what: String| {
        Failure::tell(WireError::new(
            ErrorCode::TransferNotHeld,
            format!(
                "the download of transfer {transfer_id:?} cannot resume at byte {offset}: \
                 {what}; synchronize afresh"
            ),
        ))
    };
    shared.receipts.resuming(transfer_id);
    let read = read_held(
        shared,
        Direction::Download,
        hello,
        user,
        transfer_id,
        offset,
        |length| length,
    )
    .await?;
    let (held, mut bytes) = match read {
        Ok(read) => read,
        Err(NotHeld::Nothing) => {
            return Err(not_held(
                "the server holds no download of it for this client".into(),
            ))
        }
        Err(NotHeld::Shorter { length }) => {
            return Err(not_held(format!("the download is {length} bytes")))
        }
        Err(NotHeld::Missing { found, wanted }) => {
            return Err(not_held(format!(
                "the server found {found} of its {wanted} bytes"
            )))
        }
    };
    shared.metrics.download_resumed_bytes.inc_by(offset);
    let rest = bytes.split_off(offset as usize);
    let answer = DownloadHeld {
        transfer_id: transfer_id.to_string(),
        length: held.length,
        sha256: held.sha256,
    };
    Ok((answer, rest))
}

/// Why a held transfer cannot go on at an offset.
enum NotHeld {
    /// Nothing is held of it for this client and user.
    Nothing,
    /// Less than the offset is held.
    Shorter { length: u64 },
    /// The database gave back fewer bytes than were asked for.
    Missing { found: usize, wanted: u64 },
}

/// The client's held transfer (its user's only) and the first `wanted(length)` of its
/// bytes, once the client's other live connections have settled; or why it cannot go
/// on at `offset`.
async fn read_held<B: Consolidated>(
    shared: &Shared<B>,
    direction: Direction,
    hello: &Hello,
    user: &str,
    transfer_id: &str,
    offset: u64,
    wanted: impl FnOnce(u64) -> u64,
) -> Result<Result<(HeldTransfer, Vec<u8>), NotHeld>, Failure> {
    shared.holding.settled(&hello.client_id).await;
    let mut worker = shared
        .auth_pool
        .acquire("")
        .await
        .map_err(database_failure)?;
    let connection = worker.connection();
    let held = connection
        .held_transfer(direction, &hello.client_id, transfer_id)
        .await
        .map_err(database_failure)?;
    let Some(held) = held.filter(|held| held.user == user) else {
        return Ok(Err(NotHeld::Nothing));
    };
    if held.length < offset {
        return Ok(Err(NotHeld::Shorter {
            length: held.length,
        }));
    }
    let wanted = wanted(held.length);
    let bytes = connection
        .held_transfer_bytes(direction, &hello.client_id, transfer_id, wanted)
        .await
        .map_err(database_failure)?;
    if bytes.len() as u64 != wanted {
        return Ok(Err(NotHeld::Missing {
            found: bytes.len(),
            wanted,
        }));
    }
    Ok(Ok((held, bytes)))
}
