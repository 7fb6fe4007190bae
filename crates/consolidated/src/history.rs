//! The monitor's history of ended syncs, kept in the consolidated database when the
//! server is told to (`rs_sync_history`), so that it outlives a restart.

/// One ended sync: when it ended, for whom, how, and the monitor's whole record of it
/// (JSON, as `/api/monitor/syncs` shows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRecord {
    pub ended_unix_ms: i64,
    pub user: Option<String>,
    pub outcome: String,
    pub record: String,
}

/// The id below which rows go, to keep the newest `rows_max` of those up to `newest`.
pub(crate) fn first_kept(newest: Option<i64>, rows_max: u64) -> Option<i64> {
    let newest = newest?;
    let kept = i64::try_from(rows_max).unwrap_or(i64::MAX);
    Some(newest.saturating_sub(kept).saturating_add(1))
}
