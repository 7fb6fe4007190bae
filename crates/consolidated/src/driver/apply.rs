//! Applying the operations of one table's upload on one connection: a kind at a time
//! (inserts, updates, deletes), with the set script, its fast form or the row script,
//! the rows that did not land returned as conflicts. What `upload` (one stream) and
//! `streams` (many) both call, beneath both.

use std::borrow::Cow;

use rowsync_protocol::{Row, TableUpload, Value};

use super::rows::run_row_script;
use crate::dialect::{Dialect, RowStatement, ScratchRows, TableApply};
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::shape::TableShape;
use crate::upload_rows::{uploaded_rows, ImageLayout, UploadedRow};
use crate::version_scripts::Scripts;
use crate::SyncError;

/// What every table of one sync's upload is applied with.
pub struct SyncContext<'a> {
    pub scripts: &'a Scripts,
    pub parameters: &'a Parameters<'a>,
    /// False for an upload applied before: no script runs, its operations are only
    /// compared with the tables so the client receives its conflicts' resolution again.
    pub apply: bool,
}

/// Every kind of operation, in the order one table applies them.
pub const ALL_KINDS: [&str; 3] = [UPLOAD_INSERT, UPLOAD_UPDATE, UPLOAD_DELETE];

/// One table's upload as the table takes it, checked against the table's shape.
pub struct TablePlan<'u> {
    /// The table's name as the upload spells it.
    pub upload_table: &'u str,
    pub upload: Cow<'u, TableUpload>,
    pub shape: TableShape,
    pub key_positions: Vec<usize>,
    pub partition_column: Option<String>,
    pub layout: ImageLayout,
}

impl TablePlan<'_> {
    pub fn context<'a>(&'a self, sync: &'a SyncContext<'_>) -> TableApply<'a> {
        TableApply {
            scripts: sync.scripts,
            shape: &self.shape,
            parameters: sync.parameters,
            partition_column: self.partition_column.as_deref(),
        }
    }
}

/// Applies `kinds` (upload events) of `upload` (the table's whole upload, or one
/// stream's share of it) kind by kind, or for an upload applied before only finds which
/// operations the table does not reflect; returns the keys that did not land.
pub async fn apply_kinds<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plan: &TablePlan<'_>,
    upload: &TableUpload,
    kinds: &[&'static str],
) -> Result<Vec<Row>, SyncError> {
    let context = plan.context(sync);
    let mut conflict_keys: Vec<Row> = Vec::new();
    for &event in kinds {
        let kind = UploadKind {
            upload,
            event,
            layout: &plan.layout,
        };
        conflict_keys.extend(apply_kind(transaction, &context, sync.apply, &kind).await?);
        crate::failpoint!("mid_apply");
    }
    Ok(conflict_keys)
}

/// One kind of operation of a table's upload.
pub struct UploadKind<'a> {
    pub upload: &'a TableUpload,
    /// `upload_insert`, `upload_update` or `upload_delete`.
    pub event: &'static str,
    pub layout: &'a ImageLayout,
}

impl UploadKind<'_> {
    pub fn count(&self) -> usize {
        match self.event {
            UPLOAD_INSERT => self.upload.inserts.len(),
            UPLOAD_UPDATE => self.upload.updates.len(),
            _ => self.upload.deletes.len(),
        }
    }

    fn name(&self) -> &'static str {
        match self.event {
            UPLOAD_INSERT => "insert",
            UPLOAD_UPDATE => "update",
            _ => "delete",
        }
    }

    /// The columns its scratch holds: the upload's, or the key for deletes.
    fn scratch_columns(&self) -> &[String] {
        match self.event {
            UPLOAD_DELETE => &self.upload.key_columns,
            _ => &self.upload.columns,
        }
    }

    /// Every operation as its scratch holds it: new values (inserts), new then old
    /// (updates), the key (deletes).
    fn scratch_rows(&self) -> Vec<Vec<&Value>> {
        match self.event {
            UPLOAD_INSERT => self
                .upload
                .inserts
                .iter()
                .map(|row| row.iter().collect())
                .collect(),
            UPLOAD_UPDATE => self
                .upload
                .updates
                .iter()
                .map(|update| update.new.iter().chain(&update.old).collect())
                .collect(),
            _ => self
                .upload
                .deletes
                .iter()
                .map(|row| row.iter().collect())
                .collect(),
        }
    }
}

/// Applies one kind of a table's operations and returns the keys that did not land.
async fn apply_kind<D: Dialect>(
    transaction: &mut D,
    context: &TableApply<'_>,
    apply: bool,
    kind: &UploadKind<'_>,
) -> Result<Vec<Row>, SyncError> {
    if kind.count() == 0 {
        return Ok(Vec::new());
    }
    let script = context.scripts.require(context.table(), kind.event)?;
    let row_script = apply && !is_set_script(script);
    let mut run_script = apply && !row_script;
    if run_script {
        match apply_fast(transaction, context, kind).await? {
            // Every scratch row inserted: none can be a conflict.
            Some(changed) if changed >= kind.count() as u64 => return Ok(Vec::new()),
            // Some not inserted (another partition's): compared with the table.
            Some(_) => run_script = false,
            None => {}
        }
    }
    let mut conflict_keys = Vec::new();
    let rows: Vec<UploadedRow>;
    let scratch = if row_script {
        let keys = &kind.layout.key_positions;
        rows = uploaded_rows(kind.upload, kind.event, keys);
        let statement = RowStatement {
            table: context.table(),
            event: kind.event,
            sql: script,
            columns: &kind.layout.columns,
            parameters: context.parameters,
        };
        let applied = run_row_script(transaction, context.scripts, &statement, keys, &rows).await?;
        // Skipped rows did not land: the client receives the server's row for them.
        conflict_keys.extend(applied.skipped.iter().map(|&index| rows[index].key(keys)));
        // Rows the statement changed nothing for are compared with the table.
        applied
            .unchanged
            .iter()
            .map(|&index| rows[index].scratch_image(kind.event, keys))
            .collect()
    } else {
        kind.scratch_rows()
    };
    if scratch.is_empty() {
        return Ok(conflict_keys);
    }
    let scratch = ScratchRows {
        event: kind.event,
        kind: kind.name(),
        columns: kind.scratch_columns(),
        rows: scratch,
        run_script,
        after_row_script: row_script,
    };
    conflict_keys.extend(transaction.apply_scratch(context, scratch).await?);
    Ok(conflict_keys)
}

/// The kind's fast form, tried first where the version has one and the backend runs
/// it (`upload_insert_fast`, see [`Dialect::apply_scratch_fast`]): the rows it
/// inserted, or `None` when it did not run or a unique violation rolled it back.
async fn apply_fast<D: Dialect>(
    transaction: &mut D,
    context: &TableApply<'_>,
    kind: &UploadKind<'_>,
) -> Result<Option<u64>, SyncError> {
    let fast_event = match kind.event {
        UPLOAD_INSERT => UPLOAD_INSERT_FAST,
        _ => return Ok(None),
    };
    let Some(script) = context.scripts.get(context.table(), fast_event) else {
        return Ok(None);
    };
    if !transaction.runs_fast_forms() {
        return Ok(None);
    }
    if !is_set_script(script) {
        return Err(SyncError::Schema(format!(
            "script {fast_event} of table {:?} must be a set script (read {UPLOAD_PLACEHOLDER})",
            context.table()
        )));
    }
    let scratch = ScratchRows {
        event: kind.event,
        kind: kind.name(),
        columns: kind.scratch_columns(),
        rows: kind.scratch_rows(),
        run_script: true,
        after_row_script: false,
    };
    transaction
        .apply_scratch_fast(context, scratch, fast_event)
        .await
}
