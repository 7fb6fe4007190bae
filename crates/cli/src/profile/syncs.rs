//! Whole sync types as N copies at once, through the backend's `run_sync_transaction`: a full
//! download, an update of rows to their own values, and a delete of rows followed by
//! their insert (which puts them back). They commit, as syncs do; copies of the same
//! user take different rows, so the rows a sync type uploads are not what they fight
//! over (two clients writing one row always serialize), and whatever they do fight
//! over comes from the scripts.

use std::sync::atomic::{AtomicU64, Ordering};

use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, SyncRequest};
use rowsync_protocol::{Row, RowUpdate, TableUpload};
use tokio_postgres::Client;

use super::copies::sync_batch;
use super::report::TargetReport;
use super::workload::{partition_rows, Workload};
use super::{Measured, ProfileError, Profiler};

/// Client ids of the profile's syncs start with this; their subscriptions are removed
/// at the end.
pub const CLIENT_ID_PREFIX: &str = "rowsync-profile-";

static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// What each copy uploads: per table, its rows.
type CopyRows = Vec<Vec<(usize, Vec<Row>)>>;

pub(super) async fn profile_syncs(
    profiler: &Profiler<'_>,
    admin: &Client,
    url: &str,
) -> Result<Vec<TargetReport>, ProfileError> {
    let backend = PostgresConsolidated::new(url);
    let copies_max = *profiler.options.copies.iter().max().unwrap_or(&1);
    let mut connections = Vec::new();
    for _ in 0..copies_max {
        connections.push(backend.connect().await?);
    }
    let mut download = Measured::default();
    let mut update = Measured::default();
    let mut delete = Measured::default();
    let mut insert = Measured::default();
    let cores = profiler.options.cores;
    for &copies in &profiler.options.copies {
        for distinct in profiler.parameter_kinds(copies) {
            let rows = copy_rows(profiler, admin, copies, distinct).await?;
            let mut walls = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            let mut errors = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for _ in 0..profiler.options.rounds {
                let kinds: [(&mut Measured, Shape); 4] = [
                    (&mut download, Shape::Download),
                    (&mut update, Shape::Update),
                    (&mut delete, Shape::Delete),
                    (&mut insert, Shape::Insert),
                ];
                for (index, (measured, shape)) in kinds.into_iter().enumerate() {
                    let requests = requests(profiler.workload, &rows, copies, distinct, shape);
                    profiler.sampler.begin(None);
                    let (batch, results) = sync_batch(&mut connections, requests).await;
                    measured.observations.add(&profiler.sampler.take());
                    walls[index].push(batch.wall);
                    errors[index].extend(batch.errors);
                    if shape == Shape::Insert
                        && results.iter().flatten().any(|result| result.conflicts > 0)
                    {
                        errors[index]
                            .push("the insert that puts deleted rows back met conflicts".into());
                    }
                }
            }
            for (index, measured) in [&mut download, &mut update, &mut delete, &mut insert]
                .into_iter()
                .enumerate()
            {
                measured.record(copies, distinct, &mut walls[index], &errors[index], cores);
            }
        }
    }
    admin
        .execute(
            "DELETE FROM rs_subscription WHERE client_id LIKE $1",
            &[&format!("{CLIENT_ID_PREFIX}%")],
        )
        .await?;
    Ok(vec![
        download.report("sync download".into(), "sync"),
        update.report("sync upload_update".into(), "sync"),
        delete.report("sync upload_delete".into(), "sync"),
        insert.report("sync upload_insert".into(), "sync"),
    ])
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Download,
    Update,
    Delete,
    Insert,
}

/// Each copy's rows of each table: copies of the same user take successive slices.
async fn copy_rows(
    profiler: &Profiler<'_>,
    admin: &Client,
    copies: usize,
    distinct: bool,
) -> Result<CopyRows, ProfileError> {
    let count = profiler.options.upload_rows;
    let mut all = Vec::new();
    for index in 0..copies {
        let participant = profiler.workload.participant(index, distinct);
        let slot = (0..index)
            .filter(|earlier| {
                profiler.workload.participant(*earlier, distinct).user == participant.user
            })
            .count();
        let mut tables = Vec::new();
        for (position, table) in profiler.workload.tables.iter().enumerate() {
            let rows = partition_rows(admin, table, &participant.user, slot * count, count).await?;
            tables.push((position, rows));
        }
        all.push(tables);
    }
    Ok(all)
}

fn requests(
    workload: &Workload,
    rows: &CopyRows,
    copies: usize,
    distinct: bool,
    shape: Shape,
) -> Vec<SyncRequest> {
    (0..copies)
        .map(|index| {
            let participant = workload.participant(index, distinct);
            let tables = match shape {
                Shape::Download => Vec::new(),
                _ => rows[index]
                    .iter()
                    .filter(|(_, rows)| !rows.is_empty())
                    .map(|(position, rows)| upload(&workload.tables[*position], rows, shape))
                    .collect(),
            };
            SyncRequest {
                client_id: format!(
                    "{CLIENT_ID_PREFIX}{}",
                    NEXT_CLIENT.fetch_add(1, Ordering::Relaxed)
                ),
                user: participant.user.clone(),
                script_version: workload.script_version.clone(),
                // A delete lands only on rows its client has seen (docs/scripts.md): the
                // copies delete rows as one that downloaded everything would.
                last_download_watermark: match shape {
                    Shape::Delete => i64::MAX,
                    _ => 0,
                },
                upload_sequence: 1,
                tables,
                auth_parameters: Vec::new(),
                client_ids_per_user_max: None,
                transfer_id: None,
                check_identity: false,
                refused_rows_max: 0,
                key_ranges: None,
                sync_tables: Default::default(),
            }
        })
        .collect()
}

fn upload(table: &super::workload::SyncTable, rows: &[Row], shape: Shape) -> TableUpload {
    let key_positions: Vec<usize> = table
        .key_columns
        .iter()
        .filter_map(|key| table.columns.iter().position(|column| column == key))
        .collect();
    let mut upload = TableUpload {
        table: table.name.clone(),
        columns: table.columns.clone(),
        key_columns: table.key_columns.clone(),
        inserts: Vec::new(),
        updates: Vec::new(),
        deletes: Vec::new(),
    };
    match shape {
        Shape::Update => {
            upload.updates = rows
                .iter()
                .map(|row| RowUpdate {
                    old: row.clone(),
                    new: row.clone(),
                })
                .collect()
        }
        Shape::Delete => {
            upload.deletes = rows
                .iter()
                .map(|row| key_positions.iter().map(|at| row[*at].clone()).collect())
                .collect()
        }
        Shape::Insert => upload.inserts = rows.to_vec(),
        Shape::Download => {}
    }
    upload
}
