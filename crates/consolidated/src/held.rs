//! Transfers held for resumption, kept in the consolidated database so the client's next
//! attempt, on whichever server it reaches, goes on from where a cut left it. Uploads:
//! what a server received of an upload whose connection was cut (the decompressed
//! stream after the `upload_resume` frame; `rs_held_upload`, its bytes in parts in
//! `rs_held_upload_part`). Downloads: the whole decompressed stream of a download whose
//! sending was cut (`rs_held_download`, `rs_held_download_part`). Each direction holds one
//! transfer per client: holding another replaces it. Both directions are one
//! implementation over two pairs of tables of the same shape.

/// Which way a held transfer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: what the server received of a cut upload.
    Upload,
    /// Server to client: the whole stream of a download whose sending was cut.
    Download,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Upload, Direction::Download];

    /// The direction's table and its parts' table.
    pub fn tables(self) -> (&'static str, &'static str) {
        match self {
            Direction::Upload => ("rs_held_upload", "rs_held_upload_part"),
            Direction::Download => ("rs_held_download", "rs_held_download_part"),
        }
    }

    /// "upload" or "download", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// A held transfer, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTransfer {
    pub client_id: String,
    /// The authenticated user whose connection left it: only that user resumes it.
    pub user: String,
    pub transfer_id: String,
    /// Bytes held.
    pub length: u64,
    /// SHA-256 of the bytes held (32 bytes).
    pub sha256: Vec<u8>,
    pub created_unix_ms: i64,
}

/// Bytes of one part row of a held transfer (under every backend's packet limit).
pub const HELD_TRANSFER_PART_BYTES: usize = 1024 * 1024;

/// The bounds a held transfer must stay within, in bytes as the tables store them (the
/// decompressed stream, not what came over the wire): all held transfers of its
/// direction together, and those of its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldBounds {
    pub all_bytes_max: u64,
    pub user_bytes_max: u64,
}

/// A bound on all held transfers only.
impl From<u64> for HoldBounds {
    fn from(all_bytes_max: u64) -> HoldBounds {
        HoldBounds {
            all_bytes_max,
            user_bytes_max: u64::MAX,
        }
    }
}

/// Whether holding `length` more bytes keeps the held transfers of a direction within
/// `bounds`, given the bytes other clients hold: `held_by_others` in all, `held_by_user`
/// of them the user's.
pub(crate) fn fits(
    held_by_others: i64,
    held_by_user: i64,
    length: u64,
    bounds: HoldBounds,
) -> bool {
    let within = |held: i64, max: u64| (held.max(0) as u64).saturating_add(length) <= max;
    within(held_by_others, bounds.all_bytes_max) && within(held_by_user, bounds.user_bytes_max)
}

/// Whether a client's held transfer may be replaced by `user`'s: only by its own user
/// (`owner`, if the client holds one).
pub(crate) fn replaceable_by(owner: Option<&str>, user: &str) -> bool {
    owner.is_none_or(|owner| owner == user)
}

/// The length as the tables store it.
pub(crate) fn stored_length(length: u64) -> Result<i64, crate::DbError> {
    i64::try_from(length)
        .map_err(|_| crate::DbError::Invalid(format!("a held transfer of {length} bytes")))
}
