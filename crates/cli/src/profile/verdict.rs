//! The verdict on one target, from what its copies waited on (never from its times),
//! with the SMP scalability paper's remedy.

use super::report::{Verdict, VerdictKind};
use super::sampler::{Observations, UNREAD_KEY};

/// Samples of running copies below which no convoy is called (too few to tell).
pub const CONVOY_SAMPLES_MIN: u64 = 20;

const HOT_ROW_REMEDY: &str = "every copy writes this row, so syncs run one after another on it \
    (the paper's hot row). Stop writing one shared row per sync: keep the value per client or per \
    user (one row each, summed when read), or gather it once in a larger, less frequent request; \
    a small table every sync reads should be cached (client side or in a temporary table) rather than updated";
const LOCK_REMEDY: &str = "a lock every copy takes serializes them: take it for a shorter time \
    (later in the sync, or in a transaction of its own), on something finer, or not at all";
const CONVOY_REMEDY: &str = "the copies queue on one shared structure (the paper's convoy): \
    an index so each reads fewer pages, fewer and larger requests, or a small hot table cached \
    rather than read by every sync";

pub fn verdict(observations: &Observations, error: Option<&str>) -> Verdict {
    if let Some(error) = error {
        return Verdict {
            kind: VerdictKind::Error,
            finding: format!("failed: {error}"),
            remedy: String::new(),
        };
    }
    // A row whose key was read names it best; one written again before it was read
    // still names its table.
    let hottest = observations
        .hot_rows
        .iter()
        .max_by_key(|((_, key), waits)| (key != UNREAD_KEY, **waits));
    if let Some(((relation, key), waits)) = hottest {
        return Verdict {
            kind: VerdictKind::HotRow,
            finding: format!("hot row {relation} ({key}): copies waited for it {waits} times"),
            remedy: HOT_ROW_REMEDY.into(),
        };
    }
    let count = |prefix: &str| -> u64 {
        observations
            .waits
            .iter()
            .filter(|(wait, _)| wait.starts_with(prefix))
            .map(|(_, samples)| samples)
            .sum()
    };
    let locks: Vec<&str> = observations
        .waits
        .keys()
        .filter_map(|wait| wait.strip_prefix("Lock:"))
        .collect();
    if !locks.is_empty() {
        return Verdict {
            kind: VerdictKind::LockWait,
            finding: format!("copies waited on locks: {}", locks.join(", ")),
            remedy: LOCK_REMEDY.into(),
        };
    }
    let total: u64 = observations.waits.values().sum();
    // WAL writes wait on lightweight locks too; they are the commit rate, not a convoy.
    let shared = count("LWLock:") + count("BufferPin:") - count("LWLock:WAL");
    if total >= CONVOY_SAMPLES_MIN && shared * 2 > total {
        return Verdict {
            kind: VerdictKind::Convoy,
            finding: format!(
                "{shared} of {total} samples waited on lightweight locks or buffer pins"
            ),
            remedy: CONVOY_REMEDY.into(),
        };
    }
    Verdict {
        kind: VerdictKind::Clean,
        finding: "clean: no copy waited for a row or a lock".into(),
        remedy: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_waited_for_outranks_everything_else() {
        let mut observations = Observations::default();
        observations.waits.insert("Lock:transactionid".into(), 3);
        observations.waits.insert("LWLock:BufferContent".into(), 50);
        observations
            .hot_rows
            .insert(("counter".into(), "id=1".into()), 3);
        let verdict = verdict(&observations, None);
        assert_eq!(verdict.kind, VerdictKind::HotRow);
        assert!(
            verdict.finding.contains("counter (id=1)"),
            "{}",
            verdict.finding
        );
    }

    #[test]
    fn few_samples_or_wal_waits_are_no_convoy() {
        let mut observations = Observations::default();
        observations.waits.insert("LWLock:BufferContent".into(), 5);
        assert_eq!(verdict(&observations, None).kind, VerdictKind::Clean);
        observations.waits.insert("LWLock:WALWrite".into(), 100);
        assert_eq!(verdict(&observations, None).kind, VerdictKind::Clean);
        observations
            .waits
            .insert("LWLock:BufferMapping".into(), 200);
        assert_eq!(verdict(&observations, None).kind, VerdictKind::Convoy);
    }
}
