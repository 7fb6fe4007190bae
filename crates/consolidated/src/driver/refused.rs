//! Protocol v6: after an upload failed, which of its rows fail on their own. The upload
//! is applied again in a transaction that is rolled back after, in the same order,
//! part by part under a savepoint; a part that fails is tried row by row. A row whose
//! parent was refused fails too, and is named with it.

use rowsync_protocol::{RefusedRow, Row, TableUpload};

use super::apply::{apply_kinds, SyncContext, TablePlan, UploadKind};
use super::upload::{passes, plan_table, resolve_conflicts, upload_order};
use crate::dialect::{Dialect, Savepoint, SyncBackend};
use crate::parameters::Parameters;
use crate::scripts::*;
use crate::version_scripts::Scripts;
use crate::{SyncError, SyncRequest};

/// Rows tried together under one savepoint before they are tried one by one.
const PART_ROWS: usize = 256;

/// The longest reason sent for one refused row, in bytes.
const REASON_BYTES_MAX: usize = 1000;

/// Whether a failure may come from rows of the upload (a script, a constraint, a value,
/// a table the version does not synchronize), not from the database or the session.
pub fn may_name_rows(error: &SyncError) -> bool {
    matches!(error, SyncError::Script { .. } | SyncError::Schema(_))
}

/// The rows of `request` that fail alone, at most `rows_max + 1` of them (more than
/// `rows_max` means too many to name). Nothing is kept of the attempt.
pub async fn find_refused<B: SyncBackend>(
    backend: &mut B,
    scripts: &Scripts,
    request: &SyncRequest,
    rows_max: u64,
) -> Result<Vec<RefusedRow>, SyncError> {
    let mut transaction = backend.begin().await?;
    let found = probe(&mut transaction, scripts, request, rows_max).await;
    if let Err(rollback) = transaction.rollback().await {
        tracing::debug!(%rollback, "rolling back the search for refused rows");
    }
    found
}

async fn probe<D: Dialect>(
    transaction: &mut D,
    scripts: &Scripts,
    request: &SyncRequest,
    rows_max: u64,
) -> Result<Vec<RefusedRow>, SyncError> {
    let parameters = Parameters::for_request(request)?;
    let sync = SyncContext {
        scripts,
        parameters: &parameters,
        apply: true,
    };
    transaction
        .run_event(scripts, BEGIN_SYNCHRONIZATION, &parameters)
        .await?;
    transaction
        .run_event(scripts, BEGIN_UPLOAD, &parameters)
        .await?;
    let mut refused = Refused {
        rows: Vec::new(),
        rows_max,
    };
    let mut plans = Vec::with_capacity(request.tables.len());
    for upload in &request.tables {
        match plan_table(transaction, &sync, upload).await {
            Ok(plan) => plans.push(plan),
            Err(error) if may_name_rows(&error) => refused.table(upload, &error),
            Err(error) => return Err(error),
        }
    }
    let order = upload_order(transaction, &sync, &plans).await?;
    for (index, kinds) in passes(&order) {
        for &event in kinds {
            let trying = Trying {
                sync: &sync,
                plan: &plans[index],
                event,
            };
            let plan = trying.plan;
            let count = UploadKind {
                upload: &plan.upload,
                event,
                layout: &plan.layout,
            }
            .count();
            for start in (0..count).step_by(PART_ROWS) {
                let part = start..(start + PART_ROWS).min(count);
                if trying.part(transaction, part.clone()).await?.is_ok() {
                    continue;
                }
                for row in part {
                    if let Err(error) = trying.part(transaction, row..row + 1).await? {
                        refused.row(trying.plan, event, row, &error);
                    }
                }
                if refused.too_many() {
                    return Ok(refused.rows);
                }
            }
        }
    }
    Ok(refused.rows)
}

/// One kind of one table's upload, tried part by part.
struct Trying<'a, 'u> {
    sync: &'a SyncContext<'a>,
    plan: &'a TablePlan<'u>,
    event: &'static str,
}

impl Trying<'_, '_> {
    /// Applies rows `range` of the kind under a savepoint, kept when they apply (so
    /// the rows after them see them, as children see their parents) and undone when
    /// they fail with an error rows can cause (`Ok(Err(..))`).
    async fn part<D: Dialect>(
        &self,
        transaction: &mut D,
        range: std::ops::Range<usize>,
    ) -> Result<Result<(), SyncError>, SyncError> {
        let part = part_of(&self.plan.upload, self.event, range);
        transaction.savepoint(Savepoint::Set).await?;
        let applied =
            match apply_kinds(transaction, self.sync, self.plan, &part, &[self.event]).await {
                Ok(keys) => resolve_conflicts(transaction, self.sync, self.plan, &keys).await,
                Err(error) => Err(error),
            };
        match applied {
            Ok(()) => {
                transaction.savepoint(Savepoint::Release).await?;
                Ok(Ok(()))
            }
            Err(error) if may_name_rows(&error) => {
                transaction.savepoint(Savepoint::Undo).await?;
                Ok(Err(error))
            }
            Err(error) => Err(error),
        }
    }
}

/// The rows found so far, and how many may be named.
struct Refused {
    rows: Vec<RefusedRow>,
    rows_max: u64,
}

impl Refused {
    fn too_many(&self) -> bool {
        self.rows.len() as u64 > self.rows_max
    }

    /// Every change of a table refused at once (its shape, or a table the script
    /// version does not synchronize).
    fn table(&mut self, upload: &TableUpload, error: &SyncError) {
        self.rows.push(RefusedRow {
            table: upload.table.clone(),
            key_columns: Vec::new(),
            key: Row::new(),
            code: error.code() as u16,
            reason: reason(error),
        });
    }

    fn row(&mut self, plan: &TablePlan<'_>, event: &str, index: usize, error: &SyncError) {
        let upload = &plan.upload;
        let key = match event {
            UPLOAD_INSERT => key_of(&upload.inserts[index], &plan.key_positions),
            UPLOAD_UPDATE => key_of(&upload.updates[index].new, &plan.key_positions),
            _ => upload.deletes[index].clone(),
        };
        self.rows.push(RefusedRow {
            table: upload.table.clone(),
            key_columns: upload.key_columns.clone(),
            key,
            code: error.code() as u16,
            reason: reason(error),
        });
    }
}

fn key_of(row: &Row, key_positions: &[usize]) -> Row {
    key_positions.iter().map(|&at| row[at].clone()).collect()
}

fn reason(error: &SyncError) -> String {
    let mut reason = error.to_string();
    if reason.len() > REASON_BYTES_MAX {
        let mut end = REASON_BYTES_MAX;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}

/// Rows `range` of one kind of `upload`, as an upload of their own.
fn part_of(upload: &TableUpload, event: &str, range: std::ops::Range<usize>) -> TableUpload {
    let mut part = TableUpload {
        table: upload.table.clone(),
        columns: upload.columns.clone(),
        key_columns: upload.key_columns.clone(),
        ..TableUpload::default()
    };
    match event {
        UPLOAD_INSERT => part.inserts = upload.inserts[range].to_vec(),
        UPLOAD_UPDATE => part.updates = upload.updates[range].to_vec(),
        _ => part.deletes = upload.deletes[range].to_vec(),
    }
    part
}
