//! Uploads held for resumption: what a server received of an upload whose connection
//! was cut (the decompressed stream after the `upload_resume` frame), kept in the
//! consolidated database so the client's next attempt, on whichever server it reaches,
//! goes on from where the cut left it (`rs_held_upload`, and its bytes in parts in
//! `rs_held_upload_part`). One transfer is held per client: holding another replaces it.

/// A held transfer, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldUpload {
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

/// Bytes of one part row of a held upload (under every backend's packet limit).
pub const HELD_UPLOAD_PART_BYTES: usize = 1024 * 1024;

/// Whether holding `length` more bytes keeps all held uploads within `all_bytes_max`,
/// given `held_by_others` bytes held by other clients.
pub(crate) fn fits(held_by_others: i64, length: u64, all_bytes_max: u64) -> bool {
    (held_by_others.max(0) as u64).saturating_add(length) <= all_bytes_max
}

/// The length as the tables store it.
pub(crate) fn stored_length(length: u64) -> Result<i64, crate::DbError> {
    i64::try_from(length)
        .map_err(|_| crate::DbError::Invalid(format!("a held upload of {length} bytes")))
}
