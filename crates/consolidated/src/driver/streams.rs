//! Apply streams: a large upload applied over several database connections at once, as
//! SQL Server's SubscriptionStreams applies a replication batch (seed 003). Rows are
//! hashed by primary key, so each key lives in one stream and no two streams touch the
//! same row; the sync's own transaction applies the first share, every other stream
//! applies its share on a connection of its own and prepares its transaction (two-phase
//! commit). The sync's transaction then goes on as with one stream (conflicts, the
//! download, the subscription) and, last, records the decision that the group is to be
//! committed: its commit is the commit point of the whole upload. Only then are the
//! prepared transactions committed; a crash in between leaves them to whichever server
//! starts next, which commits a group whose decision is recorded and rolls back any
//! other (`SyncBackend::resolve_group`, and each backend's start-up recovery).
//!
//! Any failure of a stream, or of the sync while streams were used, rolls back every
//! stream and the sync's transaction, and the upload is applied again on one stream
//! (`driver::sync_with_retries`): what fails there is the sync's real failure.
//!
//! Streams are used only when every table's upload is applied by set scripts (a row
//! script's `handle_error` decides row by row, in order), no update moves its key, and
//! no table of the upload references another by a foreign key (a row and the row it
//! references could land in two streams' transactions, neither seeing the other's: the
//! upload is then applied on one stream, parents first, see `upload::apply_in_order`).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::join_all;
use rowsync_protocol::{encode_key_identity, Row, RowUpdate, TableUpload, Value};

use super::apply::{apply_kinds, SyncContext, TablePlan, ALL_KINDS};
use crate::dialect::{Dialect, SyncBackend};
use crate::scripts::*;
use crate::SyncError;

/// The prefix of every prepared transaction's id rowsync makes: `rowsync-<group>-<n>`.
pub const GID_PREFIX: &str = "rowsync-";

/// The other connections of one sync's apply streams, and what became of them.
pub struct StreamSet<'a, B> {
    connections: &'a mut [B],
    /// The group id once streams were used in this attempt.
    group: Option<String>,
    /// Which connections hold a prepared transaction of the group.
    prepared: Vec<bool>,
}

impl<'a, B: SyncBackend> StreamSet<'a, B> {
    pub fn new(connections: &'a mut [B]) -> StreamSet<'a, B> {
        let prepared = vec![false; connections.len()];
        StreamSet {
            connections,
            group: None,
            prepared,
        }
    }

    /// Whether there are other connections to apply over.
    pub fn available(&self) -> bool {
        !self.connections.is_empty()
    }

    /// Whether this attempt applied over streams (a failure then falls back to one).
    pub fn used(&self) -> bool {
        self.group.is_some()
    }

    /// The group whose decision the sync's transaction must record, if any stream is
    /// prepared.
    pub fn prepared_group(&self) -> Option<&str> {
        self.group
            .as_deref()
            .filter(|_| self.prepared.iter().any(|&prepared| prepared))
    }

    fn gid(group: &str, stream: usize) -> String {
        format!("{group}-{stream}")
    }

    /// Commits (`commit`) or rolls back every prepared stream, each on its own
    /// connection, at once. A stream that cannot be finished is left to the recovery
    /// of the next server that starts (logged).
    pub async fn finish(&mut self, commit: bool) -> bool {
        let Some(group) = self.group.clone() else {
            return true;
        };
        let finishing = self
            .connections
            .iter_mut()
            .zip(&self.prepared)
            .enumerate()
            .filter(|(_, (_, &prepared))| prepared)
            .map(|(index, (connection, _))| {
                let gid = Self::gid(&group, index);
                async move {
                    let result = connection.finish_prepared(&gid, commit).await;
                    if let Err(error) = &result {
                        tracing::error!(%error, gid, commit, "finishing a prepared apply stream failed: \
                            the next server to start resolves it");
                    }
                    result.is_ok()
                }
            });
        let finished = join_all(finishing).await.into_iter().all(|ok| ok);
        self.prepared
            .iter_mut()
            .for_each(|prepared| *prepared = false);
        finished
    }

    /// After a commit of the sync's transaction whose outcome is unknown: the group is
    /// resolved from what the database recorded.
    pub async fn resolve_unknown(&mut self) {
        let Some(group) = self.prepared_group().map(str::to_string) else {
            return;
        };
        let Some(connection) = self.connections.first_mut() else {
            return;
        };
        if let Err(error) = connection.resolve_group(&group).await {
            tracing::error!(%error, group, "resolving apply streams after a failed commit failed: \
                the next server to start resolves them");
        }
        self.prepared
            .iter_mut()
            .for_each(|prepared| *prepared = false);
    }
}

/// Whether the upload may be applied over streams: every kind it carries of every table
/// has a set script, and no update changes its key (a key must live in one stream).
pub fn eligible(sync: &SyncContext<'_>, plans: &[TablePlan<'_>]) -> bool {
    plans.iter().all(|plan| {
        let upload = &*plan.upload;
        let kinds = [
            (UPLOAD_INSERT, upload.inserts.is_empty()),
            (UPLOAD_UPDATE, upload.updates.is_empty()),
            (UPLOAD_DELETE, upload.deletes.is_empty()),
        ];
        let set_scripts = kinds.iter().all(|&(event, empty)| {
            empty
                || sync
                    .scripts
                    .get(&plan.shape.name, event)
                    .is_some_and(is_set_script)
        });
        let keys = &plan.key_positions;
        let keys_stay = upload.updates.iter().all(|update| {
            keys.iter()
                .all(|&position| update.old.get(position) == update.new.get(position))
        });
        set_scripts && keys_stay
    })
}

/// Applies every table's upload over the streams: the first share in `transaction`,
/// the others each in a prepared transaction of another connection. Returns each
/// table's keys that did not land, all shares together.
pub async fn apply_in_streams<D: Dialect, B: SyncBackend>(
    transaction: &mut D,
    streams: &mut StreamSet<'_, B>,
    sync: &SyncContext<'_>,
    plans: &[TablePlan<'_>],
) -> Result<Vec<Vec<Row>>, SyncError> {
    let count = streams.connections.len() + 1;
    let shares: Vec<Vec<TableUpload>> = plans
        .iter()
        .map(|plan| split(&plan.upload, &plan.key_positions, count))
        .collect();
    let group = new_group();
    streams.group = Some(group.clone());
    let own = async {
        transaction.limit_lock_waits().await?;
        let mut keys = Vec::with_capacity(plans.len());
        for (plan, table_shares) in plans.iter().zip(&shares) {
            keys.push(apply_kinds(transaction, sync, plan, &table_shares[0], &ALL_KINDS).await?);
        }
        Ok::<_, SyncError>(keys)
    };
    let others = streams
        .connections
        .iter_mut()
        .enumerate()
        .map(|(index, connection)| {
            let gid = StreamSet::<B>::gid(&group, index);
            let shares = &shares;
            async move {
                let share = |plan: usize| &shares[plan][index + 1];
                apply_stream(connection, sync, plans, share, &gid).await
            }
        });
    let (own, others) = futures_util::join!(own, join_all(others));
    let mut keys = own;
    for (index, result) in others.into_iter().enumerate() {
        match result {
            Ok(stream_keys) => {
                streams.prepared[index] = true;
                if let Ok(keys) = &mut keys {
                    for (table_keys, more) in keys.iter_mut().zip(stream_keys) {
                        table_keys.extend(more);
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%error, stream = index + 1, "an apply stream failed");
                if keys.is_ok() {
                    keys = Err(error);
                }
            }
        }
    }
    keys
}

/// One stream: its share of every table in a transaction of its own connection,
/// prepared as `gid`. On failure the transaction is rolled back (dropped).
async fn apply_stream<'s, B: SyncBackend>(
    connection: &mut B,
    sync: &SyncContext<'_>,
    plans: &[TablePlan<'_>],
    share: impl Fn(usize) -> &'s TableUpload,
    gid: &str,
) -> Result<Vec<Vec<Row>>, SyncError> {
    let mut transaction = connection.begin().await?;
    let mut keys = Vec::with_capacity(plans.len());
    for (index, plan) in plans.iter().enumerate() {
        let upload = share(index);
        if upload.inserts.is_empty() && upload.updates.is_empty() && upload.deletes.is_empty() {
            keys.push(Vec::new());
            continue;
        }
        // The backend learns the table's column types as the sync's transaction did.
        transaction.table_shape(&plan.shape.name).await?;
        keys.push(apply_kinds(&mut transaction, sync, plan, upload, &ALL_KINDS).await?);
    }
    transaction.prepare(gid).await?;
    Ok(keys)
}

/// A group id no other sync, on this server or another, takes.
fn new_group() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let mut hasher = DefaultHasher::new();
    (
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed),
    )
        .hash(&mut hasher);
    format!(
        "{GID_PREFIX}{:016x}{:x}",
        hasher.finish(),
        nanos & 0xffff_ffff
    )
}

/// The stream a key lives in: a hash of its identity form (the form that makes equal
/// keys equal however they were sent).
fn stream_of(key: &[&Value], count: usize) -> usize {
    let owned: Vec<Value> = key.iter().map(|value| (*value).clone()).collect();
    let mut bytes = Vec::new();
    encode_key_identity(&owned, &mut bytes);
    // FNV-1a: stable across processes and releases, unlike the standard hasher.
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % count as u64) as usize
}

fn key_of<'r>(row: &'r Row, key_positions: &[usize]) -> Vec<&'r Value> {
    key_positions.iter().map(|&p| &row[p]).collect()
}

/// The table's upload in `count` shares by key.
fn split(upload: &TableUpload, key_positions: &[usize], count: usize) -> Vec<TableUpload> {
    let mut shares: Vec<TableUpload> = (0..count)
        .map(|_| TableUpload {
            table: upload.table.clone(),
            columns: upload.columns.clone(),
            key_columns: upload.key_columns.clone(),
            inserts: Vec::new(),
            updates: Vec::new(),
            deletes: Vec::new(),
        })
        .collect();
    for row in &upload.inserts {
        shares[stream_of(&key_of(row, key_positions), count)]
            .inserts
            .push(row.clone());
    }
    for update in &upload.updates {
        let stream = stream_of(&key_of(&update.new, key_positions), count);
        shares[stream].updates.push(RowUpdate {
            old: update.old.clone(),
            new: update.new.clone(),
        });
    }
    for key in &upload.deletes {
        let key: Vec<&Value> = key.iter().collect();
        let stream = stream_of(&key, count);
        shares[stream]
            .deletes
            .push(key.into_iter().cloned().collect());
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(keys: std::ops::Range<i64>) -> TableUpload {
        TableUpload {
            table: "t".into(),
            columns: vec!["id".into(), "body".into()],
            key_columns: vec!["id".into()],
            inserts: keys
                .clone()
                .map(|key| vec![Value::Int(key), Value::Text(format!("i{key}"))])
                .collect(),
            updates: keys
                .clone()
                .map(|key| RowUpdate {
                    old: vec![Value::Int(key + 1000), Value::Text("old".into())],
                    new: vec![Value::Int(key + 1000), Value::Text("new".into())],
                })
                .collect(),
            deletes: keys.map(|key| vec![Value::Int(key)]).collect(),
        }
    }

    #[test]
    fn every_operation_lands_in_exactly_one_share_and_a_key_in_one_stream() {
        let whole = upload(0..1000);
        let shares = split(&whole, &[0], 8);
        let count = |pick: fn(&TableUpload) -> usize| shares.iter().map(pick).sum::<usize>();
        assert_eq!(count(|share| share.inserts.len()), 1000);
        assert_eq!(count(|share| share.updates.len()), 1000);
        assert_eq!(count(|share| share.deletes.len()), 1000);
        for (index, share) in shares.iter().enumerate() {
            // A key inserted and deleted in one upload is in the same share both times.
            for row in &share.inserts {
                assert!(shares[index].deletes.contains(&vec![row[0].clone()]));
            }
            // Hashing spreads the keys: no share is empty or holds most of them.
            assert!(
                (50..250).contains(&share.inserts.len()),
                "{}",
                share.inserts.len()
            );
        }
    }

    #[test]
    fn a_key_always_goes_to_the_same_stream_and_group_ids_do_not_repeat() {
        let key = [Value::Text("north".into()), Value::Int(7)];
        let first = stream_of(&[&key[0], &key[1]], 16);
        let again = [key[0].clone(), key[1].clone()];
        assert_eq!(stream_of(&[&again[0], &again[1]], 16), first);
        let groups: std::collections::HashSet<String> = (0..100).map(|_| new_group()).collect();
        assert_eq!(groups.len(), 100);
        assert!(groups.iter().all(|group| group.starts_with(GID_PREFIX)));
    }
}
