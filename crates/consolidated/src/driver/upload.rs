//! Applying an upload: each table's inserts, updates and deletes with its set or row
//! scripts, the conflicts found set-wise, `resolve_conflict` and `upload_fetch`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use rowsync_protocol::{Row, RowUpdate, TableUpload, Value};

use super::apply::{apply_kinds, SyncContext, TablePlan};
use super::streams::StreamSet;
use crate::conflicts::Resolution;
use crate::dialect::{Dialect, RowStatement, SyncBackend, TableApply};
use crate::foreign_keys::UploadOrder;
use crate::scripts::*;
use crate::shape::{key_positions_in, refuse_null_keys, validate_upload_shape, TableShape};
use crate::stored::{keys_of, rows_stored_otherwise, upserted_rows, KeysToCheck};
use crate::upload_rows::{conflicting_rows, describe_key, key_bytes, ImageLayout, UploadedRow};
use crate::{SyncError, SyncRequest};

/// What applying the upload means for the download.
pub struct Uploaded<'r> {
    pub resolutions: HashMap<&'r str, Resolution>,
    /// Conflicts of this upload (none when it was applied before: a resend only
    /// delivers their resolution again).
    pub conflicts: u64,
}

/// `begin_upload`, each table's upload, `end_upload`. Tables linked by foreign keys are
/// applied in their order (`apply_in_order`); a large upload whose every table has set
/// scripts and none references another is applied over the apply streams `streams`
/// holds (see `streams`).
pub async fn apply_upload<'r, D: Dialect, B: SyncBackend>(
    transaction: &mut D,
    streams: &mut StreamSet<'_, B>,
    sync: &SyncContext<'_>,
    request: &'r SyncRequest,
) -> Result<Uploaded<'r>, SyncError> {
    if sync.apply {
        transaction
            .run_event(sync.scripts, BEGIN_UPLOAD, sync.parameters)
            .await?;
    }
    let mut plans = Vec::with_capacity(request.tables.len());
    for upload in &request.tables {
        plans.push(plan_table(transaction, sync, upload).await?);
    }
    let order = upload_order(transaction, sync, &plans).await?;
    let in_streams = streams.available()
        && sync.apply
        && !order.linked
        && super::streams::eligible(sync, &plans);
    let conflict_keys = if in_streams {
        let keys = super::streams::apply_in_streams(transaction, streams, sync, &plans).await?;
        for (plan, keys) in plans.iter().zip(&keys) {
            resolve_conflicts(transaction, sync, plan, keys).await?;
        }
        keys
    } else {
        apply_in_order(transaction, sync, &plans, &order).await?
    };
    let mut uploaded = Uploaded {
        resolutions: HashMap::new(),
        conflicts: 0,
    };
    for (plan, keys) in plans.iter().zip(conflict_keys) {
        let resolution = server_rows(transaction, sync, plan, keys).await?;
        if sync.apply {
            uploaded.conflicts += resolution.conflict_count;
        }
        uploaded.resolutions.insert(plan.upload_table, resolution);
    }
    if sync.apply {
        transaction
            .run_event(sync.scripts, END_UPLOAD, sync.parameters)
            .await?;
    }
    Ok(uploaded)
}

const UPSERT_KINDS: [&str; 2] = [UPLOAD_INSERT, UPLOAD_UPDATE];
const DELETE_KINDS: [&str; 1] = [UPLOAD_DELETE];

/// The order the tables are applied in, from the foreign keys the consolidated database
/// declares between them: read only when two tables or more carry operations to apply.
pub async fn upload_order<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plans: &[TablePlan<'_>],
) -> Result<UploadOrder, SyncError> {
    let writing = plans.iter().filter(|plan| carries_operations(&plan.upload));
    if !sync.apply || writing.count() < 2 {
        return Ok(UploadOrder::as_given(plans.len()));
    }
    let mut tables = Vec::with_capacity(plans.len());
    for plan in plans {
        let keys = transaction.foreign_keys(&plan.shape.name).await?;
        tables.push((plan.shape.name.as_str(), keys));
    }
    Ok(UploadOrder::of(&tables))
}

fn carries_operations(upload: &TableUpload) -> bool {
    !(upload.inserts.is_empty() && upload.updates.is_empty() && upload.deletes.is_empty())
}

/// MobiLink's order: inserts and updates table by table parents first, each table's
/// conflicts resolved (`resolve_conflict`) right after them, then deletes children
/// first, likewise. Foreign keys in a cycle are deferred to the commit first. Returns
/// each table's keys that did not land, in the order of `plans`.
async fn apply_in_order<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plans: &[TablePlan<'_>],
    order: &UploadOrder,
) -> Result<Vec<Vec<Row>>, SyncError> {
    if !order.cycle_keys.is_empty() {
        transaction.defer_foreign_keys(&order.cycle_keys).await?;
    }
    let mut conflict_keys = vec![Vec::new(); plans.len()];
    for (index, kinds) in passes(order) {
        let plan = &plans[index];
        let keys = apply_kinds(transaction, sync, plan, &plan.upload, kinds).await?;
        resolve_conflicts(transaction, sync, plan, &keys).await?;
        conflict_keys[index].extend(keys);
    }
    Ok(conflict_keys)
}

/// Each table's index with the kinds it applies, in MobiLink's order: inserts and
/// updates parents first, then deletes children first.
pub fn passes(order: &UploadOrder) -> impl Iterator<Item = (usize, &'static [&'static str])> + '_ {
    let deletes_order = order.parent_first.iter().rev();
    order
        .parent_first
        .iter()
        .map(|&index| (index, &UPSERT_KINDS[..]))
        .chain(deletes_order.map(|&index| (index, &DELETE_KINDS[..])))
}

/// Reads the table's shape and partition column and checks the upload against them.
pub async fn plan_table<'u, D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    upload: &'u TableUpload,
) -> Result<TablePlan<'u>, SyncError> {
    let table = upload.table.as_str();
    sync.scripts.check_synchronizes(table)?;
    let shape = transaction.table_shape(table).await?;
    let upload = without_dropped_columns(transaction, sync, upload, &shape).await?;
    let key_positions = validate_upload_shape(&upload, &shape)?;
    refuse_null_keys(&upload, &key_positions)?;
    let partition_column = transaction.partition_column(table).await?;
    let user = sync.parameters.user;
    super::check_partition_value(transaction, table, partition_column.as_deref(), user).await?;
    let layout = ImageLayout::of(&upload, &key_positions);
    Ok(TablePlan {
        upload_table: table,
        upload,
        shape,
        key_positions,
        partition_column,
        layout,
    })
}

/// Runs the table's `resolve_conflict` (if the version has one) for `conflict_keys`,
/// keys of the table's upload that did not land.
pub async fn resolve_conflicts<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plan: &TablePlan<'_>,
    conflict_keys: &[Row],
) -> Result<(), SyncError> {
    let context = plan.context(sync);
    let resolves = sync.apply
        && sync
            .scripts
            .get(context.table(), RESOLVE_CONFLICT)
            .is_some();
    if conflict_keys.is_empty() || !resolves {
        return Ok(());
    }
    let key_positions = &plan.layout.key_positions;
    let conflicted = conflicting_rows(&plan.upload, key_positions, conflict_keys);
    resolve_conflict(transaction, &context, &plan.layout, &conflicted).await
}

/// Server wins: what the client receives for one table's upload, the server's rows of
/// the keys that did not land once every table is applied and resolved.
async fn server_rows<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plan: &TablePlan<'_>,
    conflict_keys: Vec<Row>,
) -> Result<Resolution, SyncError> {
    let mut resolution = Resolution::default();
    resolution.record_upload(&plan.upload, &plan.key_positions);
    if !conflict_keys.is_empty() {
        let context = plan.context(sync);
        let (columns, rows) = transaction.fetch_by_keys(&context, &conflict_keys).await?;
        resolution.resolve(&plan.shape, conflict_keys, columns, rows)?;
    }
    if sync.apply {
        add_stored_rows(transaction, sync, plan, &mut resolution).await?;
    }
    Ok(resolution)
}

/// The rows this upload wrote that the table stores otherwise than sent (a trigger, a
/// default, a canonical form: `stored`), read back with `upload_fetch` and added to the
/// download, so the client ends holding the server's row. Conflicting keys come down
/// already; a table the version does not download has nothing to send.
async fn add_stored_rows<D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    plan: &TablePlan<'_>,
    resolution: &mut Resolution,
) -> Result<(), SyncError> {
    let (upload, table) = (&plan.upload, plan.upload_table);
    let downloads = [UPLOAD_FETCH, DOWNLOAD_CURSOR]
        .iter()
        .all(|event| sync.scripts.get(table, event).is_some());
    if !downloads || (upload.inserts.is_empty() && upload.updates.is_empty()) {
        return Ok(());
    }
    let key_positions = &plan.key_positions;
    let mut keys = match transaction
        .keys_to_check(&plan.shape, upload, key_positions)
        .await?
    {
        KeysToCheck::None => return Ok(()),
        KeysToCheck::All => keys_of(upserted_rows(upload), key_positions),
        KeysToCheck::Only(keys) => keys,
    };
    let all: Vec<usize> = (0..plan.shape.key_columns.len()).collect();
    let conflicted: HashSet<Vec<u8>> = resolution
        .conflict_keys
        .iter()
        .map(|key| key_bytes(key, &all))
        .collect();
    keys.retain(|key| !conflicted.contains(&key_bytes(key, &all)));
    if keys.is_empty() {
        return Ok(());
    }
    let (columns, rows) = transaction
        .fetch_by_keys(&plan.context(sync), &keys)
        .await?;
    let fetched_keys = key_positions_in(&columns, &plan.shape.key_columns, table, UPLOAD_FETCH)?;
    let back = rows_stored_otherwise(upload, key_positions, &columns, &fetched_keys, rows);
    resolution.add_stored_rows(columns, back);
    Ok(())
}

/// The upload as the table can take it: a client older than a column's drop still
/// sends that column; its version's scripts no longer name it (`init` rewrote them), so
/// its values are left out.
async fn without_dropped_columns<'u, D: Dialect>(
    transaction: &mut D,
    sync: &SyncContext<'_>,
    upload: &'u TableUpload,
    shape: &TableShape,
) -> Result<Cow<'u, TableUpload>, SyncError> {
    if upload.columns.iter().all(|column| shape.has_column(column)) {
        return Ok(Cow::Borrowed(upload));
    }
    let dropped = transaction
        .dropped_columns(&sync.scripts.version, &shape.name)
        .await?;
    Ok(Cow::Owned(without_columns(upload, shape, &dropped)))
}

/// The upload without the columns in `dropped` that the table no longer has (any
/// other unknown column stays, for `validate_upload_shape` to refuse by name).
fn without_columns(upload: &TableUpload, shape: &TableShape, dropped: &[String]) -> TableUpload {
    let kept: Vec<usize> = (0..upload.columns.len())
        .filter(|&index| {
            let column = &upload.columns[index];
            shape.has_column(column) || !dropped.contains(column)
        })
        .collect();
    let project = |row: &Row| -> Row { kept.iter().filter_map(|&i| row.get(i).cloned()).collect() };
    TableUpload {
        table: upload.table.clone(),
        columns: kept.iter().map(|&i| upload.columns[i].clone()).collect(),
        key_columns: upload.key_columns.clone(),
        inserts: upload.inserts.iter().map(project).collect(),
        updates: upload
            .updates
            .iter()
            .map(|update| RowUpdate {
                old: project(&update.old),
                new: project(&update.new),
            })
            .collect(),
        deletes: upload.deletes.clone(),
    }
}

/// Runs `resolve_conflict` for conflicting rows: a set script once over `{conflicts}`,
/// a row script once per row with `:new.*`, `:old.*` and `:current.*` (the row the
/// server holds, NULL when gone).
async fn resolve_conflict<D: Dialect>(
    transaction: &mut D,
    context: &TableApply<'_>,
    layout: &ImageLayout,
    conflicted: &[UploadedRow],
) -> Result<(), SyncError> {
    let table = context.table();
    let script = context.scripts.require(table, RESOLVE_CONFLICT)?;
    if is_set_script(script) {
        return transaction
            .resolve_conflicts_set(context, &layout.columns, conflicted)
            .await;
    }
    for row in conflicted {
        let key = row.key(&layout.key_positions);
        let current = transaction
            .current_row(table, &layout.columns, &layout.key_positions, &key)
            .await?;
        let mut images = row.images(&layout.columns);
        images.current = current.as_deref();
        let parameters = context
            .parameters
            .with(vec![("operation", Value::Text(row.operation.into()))]);
        let statement = RowStatement {
            table,
            event: RESOLVE_CONFLICT,
            sql: script,
            columns: &layout.columns,
            parameters: &parameters,
        };
        transaction
            .run_for_row(&statement, &images)
            .await
            .map_err(|error| error.with_row_key(describe_key(&key)))?;
    }
    Ok(())
}
