//! The primitives a backend gives the sync driver ([`crate::driver`]): how each step of
//! a sync is done in its SQL dialect, over one open transaction. The driver owns the
//! algorithm (the events in MobiLink's order, conflict detection and resolution,
//! `handle_error`, the download loop, the echo filter, the subscription); a backend
//! never decides, it only runs statements.
//!
//! Each primitive says what it must guarantee; `docs/adding-a-backend.md` walks through
//! them and the conformance suite (`tests/conformance`) proves them on every backend.
//!
//! The traits use `async fn`: a backend whose futures are `Send` (PostgreSQL, MySQL)
//! gives a `Send` sync future, because auto traits of the concrete futures reach the
//! driver's; a backend whose connection is not `Sync` (SQLite) runs the driver on a
//! blocking thread.
#![allow(async_fn_in_trait)]

use std::sync::{Arc, Mutex};

use rowsync_protocol::{Row, TableUpload, Value};

use crate::echo::DownloadFilter;
use crate::foreign_keys::ForeignKey;
use crate::parameters::{Parameters, RowImages};
use crate::scripts::DOWNLOAD_DELETE_CURSOR;
use crate::shape::TableShape;
use crate::shared_download::Recording;
use crate::stored::KeysToCheck;
use crate::upload_rows::UploadedRow;
use crate::version_scripts::{ScriptRows, Scripts};
use crate::{DownloadSender, SyncError};

/// A connection that can run syncs: it opens their transactions and says which failed
/// attempts may run again.
pub trait SyncBackend {
    type Transaction<'t>: Dialect
    where
        Self: 't;

    /// Opens a transaction that sees every transaction committed before it (the
    /// consolidated database's default isolation is fine: the watermark argument of
    /// each backend says what its cursors need). Dropping it uncommitted rolls it back.
    async fn begin(&mut self) -> Result<Self::Transaction<'_>, SyncError>;

    /// Whether a sync that failed with `error` may run again from the start (a
    /// concurrent insert of the same key, a serialization failure, a deadlock, a
    /// prepared statement that no longer fits its table), after making that possible.
    fn may_retry(&mut self, error: &SyncError) -> bool;

    /// Called once after a sync failed for good (before `report_error` runs).
    fn after_failure(&mut self);

    /// How many apply streams (this connection's transaction included) an upload of
    /// `rows` operations should be applied with: 1 where the backend has no two-phase
    /// commit (see [`crate::driver`]'s `streams` and docs/adding-a-backend.md).
    fn apply_streams_for(&self, _rows: u64) -> usize {
        1
    }

    /// Up to `count` other connections for apply streams, each able to prepare its
    /// transaction ([`Dialect::prepare`]); fewer (none) when no more can be had.
    async fn take_streams(&mut self, _count: usize) -> Vec<Self>
    where
        Self: Sized,
    {
        Vec::new()
    }

    /// Gives back connections from [`SyncBackend::take_streams`]; `healthy` is false
    /// after a failure (the backend may then discard or reset them).
    fn return_streams(&mut self, _streams: Vec<Self>, _healthy: bool)
    where
        Self: Sized,
    {
    }

    /// Commits (`commit`) or rolls back the prepared transaction `gid`; one that no
    /// longer exists (a recovering server resolved it) is not an error.
    async fn finish_prepared(&mut self, gid: &str, _commit: bool) -> Result<(), SyncError> {
        Err(no_two_phase_commit(gid))
    }

    /// Resolves the prepared transactions of `group` after a commit whose outcome is
    /// unknown, from the decision recorded (none: rolled back, and recorded as such so
    /// the sync's own transaction can no longer decide otherwise).
    async fn resolve_group(&mut self, group: &str) -> Result<(), SyncError> {
        Err(no_two_phase_commit(group))
    }
}

fn no_two_phase_commit(name: &str) -> SyncError {
    SyncError::Schema(format!(
        "apply streams ({name}) need two-phase commit, which this backend does not use"
    ))
}

/// What the subscription table holds of one client id.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// The user the client id belongs to (the first that synced with it).
    pub user_name: String,
    /// The highest upload sequence applied.
    pub upload_sequence: i64,
    /// The watermark sent with the last download.
    pub download_watermark: i64,
    /// The transaction id of the client's last sync where the backend has one, else 0.
    pub last_sync_xid: i64,
    /// The transfer id of the upload applied last (`upload_sequence`), if it had one.
    pub upload_transfer_id: Option<String>,
}

/// What a sync records in the subscription before it commits.
pub struct SubscriptionUpdate<'a> {
    pub client_id: &'a str,
    pub user: &'a str,
    pub script_version: &'a str,
    /// Stored as the greater of this and what is stored.
    pub upload_sequence: i64,
    /// The upload's transfer id: stored only when `upload_sequence` is above the stored
    /// one (the upload was applied), so it always names the upload applied last.
    pub upload_transfer_id: Option<&'a str>,
    pub download_watermark: i64,
    /// The watermark the client came with: stored as the greater of this and what is stored.
    pub download_acknowledged: i64,
    /// Scripts run after the download cursors (`end_download`, `end_synchronization`):
    /// see [`Dialect::late_scripts_begin`].
    pub late_scripts: bool,
}

/// One step of a sync's end (`driver::end_events`), run in the order given.
pub enum EndStep<'a> {
    Subscription(SubscriptionUpdate<'a>),
    LateScriptsBegin,
    /// A connection event's script, if the version has one.
    Event(&'static str),
    /// [`Dialect::late_scripts_end`] for the client id.
    LateScriptsEnd(&'a str),
}

/// What every upload statement of one table runs with.
#[derive(Clone, Copy)]
pub struct TableApply<'a> {
    pub scripts: &'a Scripts,
    pub shape: &'a TableShape,
    pub parameters: &'a Parameters<'a>,
    /// The column whose value is the user name in the default scripts (`rs_table`).
    pub partition_column: Option<&'a str>,
}

impl TableApply<'_> {
    pub fn table(&self) -> &str {
        &self.shape.name
    }
}

/// One kind (insert, update or delete) of one table's upload, as scratch rows.
pub struct ScratchRows<'a, 'v> {
    /// `upload_insert`, `upload_update` or `upload_delete`.
    pub event: &'static str,
    /// `insert`, `update` or `delete`: names a scratch table where one is made.
    pub kind: &'static str,
    /// The scratch columns: the upload's (inserts, updates) or the key (deletes). An
    /// update's row holds its new values, then its old values under `rs_old_<column>`.
    pub columns: &'a [String],
    pub rows: Vec<Vec<&'v Value>>,
    /// Run the kind's set script over the rows. False when they only need comparing
    /// with the table: an upload applied before, or rows a row script changed nothing for.
    pub run_script: bool,
    /// The rows went through a row script (their script is not a set script).
    pub after_row_script: bool,
}

/// A row script and what it runs with.
pub struct RowStatement<'a> {
    pub table: &'a str,
    pub event: &'a str,
    pub sql: &'a str,
    /// The columns of the rows' images (`:new.<column>`, `:old.<column>`).
    pub columns: &'a [String],
    pub parameters: &'a Parameters<'a>,
}

/// A row statement failed: `offset` is the row, and nothing of the call stayed applied.
pub struct RowFailure {
    pub offset: usize,
    pub error: SyncError,
}

/// How many rows of one table a sync's upload wrote (its set scripts write exactly the
/// uploaded keys when nothing conflicted), for [`Dialect::echo_xids`] to compare with
/// what the transaction wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnWrites {
    /// Rows inserted or updated.
    pub upserts: u64,
    /// Rows deleted.
    pub deletes: u64,
}

/// `:echo_xid` of a table's download cursor and delete cursor (0: leave nothing out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EchoXids {
    pub upserts: i64,
    pub deletes: i64,
}

/// A query script that a cursor reads.
pub struct CursorScript<'a> {
    pub scripts: &'a Scripts,
    pub table: &'a str,
    /// `download_cursor` or `download_delete_cursor`.
    pub event: &'static str,
    pub parameters: &'a Parameters<'a>,
    /// Where the rows read are also kept for other syncs (`shared_download`).
    pub recording: Option<Arc<Mutex<Recording>>>,
}

/// Where a backend hands a cursor's batches: the driver filters echoes and conflicts out
/// and sends what is left to the download.
pub struct CursorSink<'a, 'f> {
    pub(crate) filter: &'a mut DownloadFilter<'f>,
    pub(crate) download: &'a DownloadSender,
    pub(crate) deletes: bool,
    recording: Option<Arc<Mutex<Recording>>>,
}

impl<'a, 'f> CursorSink<'a, 'f> {
    /// Where `cursor`'s rows go: deletes for `download_delete_cursor`, else upserts.
    pub fn for_cursor(
        cursor: &CursorScript<'_>,
        filter: &'a mut DownloadFilter<'f>,
        download: &'a DownloadSender,
    ) -> CursorSink<'a, 'f> {
        CursorSink {
            filter,
            download,
            deletes: cursor.event == DOWNLOAD_DELETE_CURSOR,
            recording: cursor.recording.clone(),
        }
    }

    /// Takes one batch of at most `DOWNLOAD_BATCH_ROWS` rows, named by `columns`.
    pub async fn take(&mut self, columns: &[String], rows: Vec<Row>) -> Result<(), SyncError> {
        if let Some(recording) = &self.recording {
            if let Ok(mut recording) = recording.lock() {
                recording.take(columns, &rows);
            }
        }
        let chunk = if self.deletes {
            self.filter.deletes(columns, rows)?
        } else {
            self.filter.upserts(columns, rows)?
        };
        self.download.send(chunk).await
    }
}

/// Reads the cursors one after the other, each with [`Dialect::read_cursor`]: what
/// [`Dialect::read_cursors`] does where a backend sends nothing ahead.
pub async fn read_cursors_in_turn<D: Dialect + ?Sized>(
    dialect: &mut D,
    cursors: &[CursorScript<'_>],
    filter: &mut DownloadFilter<'_>,
    download: &DownloadSender,
) -> Result<(), SyncError> {
    for cursor in cursors {
        let mut sink = CursorSink::for_cursor(cursor, filter, download);
        dialect.read_cursor(cursor, &mut sink).await?;
    }
    Ok(())
}

/// One sync's open transaction: the steps the driver composes.
/// A step of the savepoint the driver tries part of an upload under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Savepoint {
    Set,
    /// Rolls back to the savepoint and releases it.
    Undo,
    Release,
}

impl Savepoint {
    /// The statements of the step, the same on every backend.
    pub fn sql(self) -> &'static str {
        match self {
            Savepoint::Set => "SAVEPOINT rs_probe",
            Savepoint::Undo => "ROLLBACK TO SAVEPOINT rs_probe; RELEASE SAVEPOINT rs_probe",
            Savepoint::Release => "RELEASE SAVEPOINT rs_probe",
        }
    }
}

pub trait Dialect {
    /// Takes the locks a sync holds until it ends: against cleanup (shared, so syncs never
    /// wait for each other) and on the client id (exclusive). False when another sync of
    /// the client holds it; never waits for one.
    async fn lock_client(&mut self, client_id: &str) -> Result<bool, SyncError>;

    /// The client's subscription, if it has synced before.
    async fn subscription(&mut self, client_id: &str) -> Result<Option<Subscription>, SyncError>;

    /// How many client ids (subscriptions) the user has, counted up to `count_max` (the
    /// work is bounded by it, not by the user's subscriptions).
    async fn client_ids_of_user(&mut self, user: &str, count_max: u64) -> Result<u64, SyncError>;

    /// Inserts or updates the client's subscription (see [`SubscriptionUpdate`]); also
    /// records this transaction's id where the backend has one.
    async fn record_subscription(
        &mut self,
        update: &SubscriptionUpdate<'_>,
    ) -> Result<(), SyncError>;

    /// The scripts that run after the download cursors (`end_download`,
    /// `end_synchronization`) are about to run, after [`Dialect::record_subscription`].
    /// What they write misses this sync's download, so the client's next sync must not
    /// skip it as this sync's own (`:last_sync_xid`): a backend marks such writes apart
    /// here, or checks for them in [`Dialect::late_scripts_end`].
    async fn late_scripts_begin(&mut self) -> Result<(), SyncError> {
        Ok(())
    }

    /// The scripts after the download cursors ran (see [`Dialect::late_scripts_begin`]).
    async fn late_scripts_end(&mut self, _client_id: &str) -> Result<(), SyncError> {
        Ok(())
    }

    /// Runs `steps` in order. No step reads what an earlier one returned, so a backend
    /// may send them all at once (pipelined, one round trip): the database still runs
    /// them in order, and a failing step fails the transaction, as one at a time.
    async fn run_end_steps(
        &mut self,
        scripts: &Scripts,
        parameters: &Parameters<'_>,
        steps: &[EndStep<'_>],
    ) -> Result<(), SyncError> {
        for step in steps {
            match step {
                EndStep::Subscription(update) => self.record_subscription(update).await?,
                EndStep::LateScriptsBegin => self.late_scripts_begin().await?,
                EndStep::Event(event) => {
                    self.run_event(scripts, event, parameters).await?;
                }
                EndStep::LateScriptsEnd(client_id) => self.late_scripts_end(client_id).await?,
            }
        }
        Ok(())
    }

    /// Runs a connection event's script if the version has one; returns what it selected.
    async fn run_event(
        &mut self,
        scripts: &Scripts,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError>;

    /// Runs a table's query script (`key_range`) if the version has one; returns what
    /// it selected.
    async fn run_table_query(
        &mut self,
        scripts: &Scripts,
        table: &str,
        event: &str,
        parameters: &Parameters<'_>,
    ) -> Result<Option<ScriptRows>, SyncError>;

    /// A table's columns and primary key; `SyncError::Schema` when there is no such table.
    async fn table_shape(&mut self, table: &str) -> Result<TableShape, SyncError>;

    /// The table's partition column from `rs_table`, if it has one.
    async fn partition_column(&mut self, table: &str) -> Result<Option<String>, SyncError>;

    /// `None` when `user` is a value of `table`'s partition column `column` (the
    /// default scripts compare the user name with it, as the column's type); else the
    /// column's type, for the error naming them.
    async fn partition_value_misfit(
        &mut self,
        table: &str,
        column: &str,
        user: &str,
    ) -> Result<Option<String>, SyncError>;

    /// The foreign keys `table` declares, each with the table it references (asked when
    /// an upload carries more than one table: inserts and updates are applied parents
    /// first, deletes children first). A backend that keeps table shapes keeps these
    /// with them. `deferrable`: [`Dialect::defer_foreign_keys`] lets its check wait.
    async fn foreign_keys(&mut self, table: &str) -> Result<Vec<ForeignKey>, SyncError>;

    /// Makes `keys` (the foreign keys of a cycle among the upload's tables, which no
    /// order of the tables satisfies row by row), where deferrable, wait for this
    /// transaction's commit; nothing else (a deferred unique key would hide the
    /// conflicts the driver finds by them). A backend that cannot defer keys does
    /// nothing (the default) and refuses such cycles at `init`.
    async fn defer_foreign_keys(&mut self, _keys: &[ForeignKey]) -> Result<(), SyncError> {
        Ok(())
    }

    /// Sets, undoes or releases the savepoint the driver tries part of an upload under
    /// when it looks for the rows that fail alone (`driver::refused`).
    async fn savepoint(&mut self, step: Savepoint) -> Result<(), SyncError>;

    /// The columns of `table` that `version`'s scripts carried until the table dropped
    /// them (`rs_script_column`): uploads of that version may name them, and the driver
    /// leaves their values out. Asked only when an upload names a column the table lacks.
    async fn dropped_columns(
        &mut self,
        version: &str,
        table: &str,
    ) -> Result<Vec<String>, SyncError>;

    /// Puts the rows in scratch, runs the kind's set script over them (`{upload}` names the
    /// scratch) when `run_script`, and returns the keys of the scratch rows that did not
    /// land as sent: for inserts and updates, rows whose new image the table does not
    /// hold (in the user's partition when the table has one); for deletes, keys still in
    /// the table. A value its column cannot take is `SyncError::Schema` naming table
    /// and column.
    async fn apply_scratch(
        &mut self,
        table: &TableApply<'_>,
        scratch: ScratchRows<'_, '_>,
    ) -> Result<Vec<Row>, SyncError>;

    /// Whether [`Dialect::apply_scratch_fast`] runs a fast form in this transaction now:
    /// false where the backend has none (the default), or when it has run as many as
    /// it allows in one transaction.
    fn runs_fast_forms(&self) -> bool {
        false
    }

    /// Puts the rows in scratch and runs `fast_event`'s set script (`upload_insert_fast`, a plain
    /// insert that checks nothing) over them as one statement under a savepoint, and
    /// returns the rows it changed. `None` when it failed with a unique violation: the
    /// transaction is rolled back to the savepoint (nothing of it applied, the stamp of
    /// every later write still the transaction's own) and the driver applies the rows
    /// with the checked script. Any other failure is the script's, as in
    /// [`Dialect::apply_scratch`]. Asked only when [`Dialect::runs_fast_forms`].
    async fn apply_scratch_fast(
        &mut self,
        _table: &TableApply<'_>,
        _scratch: ScratchRows<'_, '_>,
        _fast_event: &'static str,
    ) -> Result<Option<u64>, SyncError> {
        Ok(None)
    }

    /// Runs a row script once per row, in order, and returns the rows each changed. On a
    /// script failure it returns `Ok(Err(RowFailure))` with nothing of this call applied
    /// (the driver asks `handle_error` and runs the rows before the failing one again).
    async fn run_row_statements(
        &mut self,
        statement: &RowStatement<'_>,
        rows: &[UploadedRow],
    ) -> Result<Result<Vec<u64>, RowFailure>, SyncError>;

    /// Runs the table's `resolve_conflict` set script once over `{conflicts}`: the
    /// operation (`rs_operation`), the new columns and the old ones (`rs_old_<column>`).
    async fn resolve_conflicts_set(
        &mut self,
        table: &TableApply<'_>,
        columns: &[String],
        conflicted: &[UploadedRow],
    ) -> Result<(), SyncError>;

    /// The row the table holds for `key` (values at `key_positions` of `columns`).
    async fn current_row(
        &mut self,
        table: &str,
        columns: &[String],
        key_positions: &[usize],
        key: &[Value],
    ) -> Result<Option<Row>, SyncError>;

    /// Runs `sql` once with `:new.*`, `:old.*` and `:current.*` naming `images`.
    async fn run_for_row(
        &mut self,
        statement: &RowStatement<'_>,
        images: &RowImages<'_>,
    ) -> Result<(), SyncError>;

    /// Which of an applied upload's inserted and updated rows (`key_positions`: its key
    /// columns in the upload's columns) the table may hold otherwise than they were
    /// sent: those are read back with `upload_fetch` and, where they differ, sent to
    /// the client in this sync's download (`stored`). `All` is always right; a backend
    /// that knows the table's triggers, defaults and column types narrows it, so an
    /// upload stored as sent costs no read (the echo saving).
    async fn keys_to_check(
        &mut self,
        _shape: &TableShape,
        _upload: &TableUpload,
        _key_positions: &[usize],
    ) -> Result<KeysToCheck, SyncError> {
        Ok(KeysToCheck::All)
    }

    /// Runs the table's `upload_fetch` over `{keys}` (the given keys, in scratch) and
    /// returns what it selected: the current rows of conflicting keys.
    async fn fetch_by_keys(
        &mut self,
        table: &TableApply<'_>,
        keys: &[Row],
    ) -> Result<ScriptRows, SyncError>;

    /// Makes the watermark this transaction takes next lie above every watermark taken
    /// before it (a client's groups changed, `driver::groups`). A backend whose
    /// watermarks already rise at every sync, or whose cursors compare them inclusively,
    /// does nothing.
    async fn advance_watermark(&mut self) -> Result<(), SyncError> {
        Ok(())
    }

    /// The download watermark: every change below it is committed and visible to the
    /// cursors this transaction runs from now on, and every change a transaction still
    /// running may commit later lands at or above it.
    async fn watermark(&mut self) -> Result<i64, SyncError>;

    /// The values of `:echo_xid` for the table's download cursor and delete cursor: the
    /// stamp this transaction gives its rows (and tombstones) when it has written
    /// exactly `written.upserts` rows of `table` (inserted or updated, counting every
    /// writer: scripts, triggers) and exactly `written.deletes` tombstones, which are then
    /// the upload's own; else 0 for that cursor. The default cursors leave rows with that
    /// stamp out (they are echoes the filter would drop). A backend that cannot count
    /// its own transaction's writes returns 0 for both, and the filter does the work.
    /// `user` is the sync's user, whose partition the upload's tombstones are in.
    async fn echo_xids(
        &mut self,
        _table: &str,
        _written: OwnWrites,
        _user: &str,
    ) -> Result<EchoXids, SyncError> {
        Ok(EchoXids::default())
    }

    /// Runs a cursor script and hands its rows to `sink` in batches of at most
    /// `DOWNLOAD_BATCH_ROWS`, never holding more than one batch.
    async fn read_cursor(
        &mut self,
        cursor: &CursorScript<'_>,
        sink: &mut CursorSink<'_, '_>,
    ) -> Result<(), SyncError>;

    /// Reads the cursors one after the other into one filter, each as `read_cursor`
    /// does. A backend that can send a cursor's statement before the previous cursor's
    /// rows are read does so: one round trip for all.
    async fn read_cursors(
        &mut self,
        cursors: &[CursorScript<'_>],
        filter: &mut DownloadFilter<'_>,
        download: &DownloadSender,
    ) -> Result<(), SyncError> {
        read_cursors_in_turn(self, cursors, filter, download).await
    }

    /// Waits for a lock at most the apply streams' lock timeout from now until the
    /// transaction ends: a sync whose apply streams are prepared must not wait for a lock
    /// one of them holds (they are released only when this transaction has committed).
    async fn limit_lock_waits(&mut self) -> Result<(), SyncError> {
        Ok(())
    }

    /// Prepares the transaction for two-phase commit as `gid` (an apply stream's part of
    /// an upload): it survives the connection and a crash of the server until
    /// [`SyncBackend::finish_prepared`] commits or rolls it back.
    async fn prepare(self, gid: &str) -> Result<(), SyncError>
    where
        Self: Sized,
    {
        Err(no_two_phase_commit(gid))
    }

    /// Records in this transaction that the prepared transactions of `group` are to be
    /// committed: they are committed exactly when this transaction commits. False when a
    /// recovering server already decided to roll the group back (this sync must fail).
    async fn record_decision(&mut self, group: &str) -> Result<bool, SyncError> {
        Err(no_two_phase_commit(group))
    }

    /// Commits the transaction.
    async fn commit(self) -> Result<(), SyncError>;

    /// Rolls the transaction back, its locks released when this returns.
    async fn rollback(self) -> Result<(), SyncError>;
}
