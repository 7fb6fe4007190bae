//! The limit reference: the same row operations straight against PostgreSQL by its
//! fastest bulk path, over as many connections as the server has database workers:
//! insert = binary `COPY FROM`; delete = one `DELETE` joined to the key arrays; update
//! = one `UPDATE … FROM` the arrays with the old-value check; download =
//! `COPY (SELECT … WHERE emp_id = …) TO STDOUT` per client.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use futures_util::{pin_mut, StreamExt};
use rowsync_consolidated::postgres::value::Bind;
use rowsync_protocol::{Row, Value};
use tokio::sync::Mutex;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::cpu::{CpuUsage, Meter};
use super::workload::{self, RAW_TABLE};
use crate::apply::connect;

pub const COPY_TYPES: [Type; 6] = [
    Type::INT4,
    Type::INT4,
    Type::INT4,
    Type::NUMERIC,
    Type::TIMESTAMP,
    Type::VARCHAR,
];

/// Binary COPY of `rows` into `table` (the paper's columns).
pub async fn copy_in(client: &Client, table: &str, rows: impl Iterator<Item = Row>) -> Result<u64> {
    let sink = client
        .copy_in(&format!(
            "COPY {table} ({}) FROM STDIN (FORMAT binary)",
            workload::COLUMNS.join(", ")
        ))
        .await?;
    let writer = BinaryCopyInWriter::new(sink, &COPY_TYPES);
    pin_mut!(writer);
    for row in rows {
        let binds: Vec<Bind> = row.iter().map(Bind).collect();
        writer.as_mut().write_raw(binds.iter()).await?;
    }
    Ok(writer.finish().await?)
}

fn int(value: &Value) -> i32 {
    match value {
        Value::Int(n) => *n as i32,
        other => unreachable!("bench integers are integers, not {other:?}"),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Decimal(d) => d.to_string(),
        Value::Text(t) => t.clone(),
        other => unreachable!("a bench decimal or text, not {other:?}"),
    }
}

fn timestamp(value: &Value) -> std::time::SystemTime {
    match value {
        Value::Timestamp(micros) => {
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(*micros as u64)
        }
        other => unreachable!("a bench timestamp, not {other:?}"),
    }
}

/// One client's share of a set, its parameters built before the clock starts (as the
/// bench's clients prepare their uploads outside the timed section).
enum Job {
    Download {
        emp: i64,
        first: i64,
        last: i64,
    },
    Update {
        ints: [Vec<i32>; 3],
        old_costs: Vec<String>,
        times: Vec<std::time::SystemTime>,
        notes: Vec<String>,
        new_costs: Vec<String>,
    },
    Delete {
        emps: Vec<i32>,
        purchs: Vec<i32>,
    },
    Insert(Vec<Row>),
}

impl Job {
    fn new(sync_type: &str, client: usize, set: usize, rows: usize) -> Result<Job> {
        let indexes = workload::set_indexes(set, rows);
        Ok(match sync_type {
            "download" => Job::Download {
                emp: workload::emp_id(client),
                first: workload::purch_id(indexes.start),
                last: workload::purch_id(indexes.end),
            },
            "update" => {
                let old: Vec<Row> = indexes
                    .clone()
                    .map(|i| workload::row(client, i, 0))
                    .collect();
                let new: Vec<Row> = indexes.map(|i| workload::row(client, i, 1)).collect();
                let column = |c: usize| -> Vec<i32> { old.iter().map(|r| int(&r[c])).collect() };
                Job::Update {
                    ints: [column(0), column(1), column(2)],
                    old_costs: old.iter().map(|r| text(&r[3])).collect(),
                    times: old.iter().map(|r| timestamp(&r[4])).collect(),
                    notes: old.iter().map(|r| text(&r[5])).collect(),
                    new_costs: new.iter().map(|r| text(&r[3])).collect(),
                }
            }
            "delete" => Job::Delete {
                emps: indexes
                    .clone()
                    .map(|_| workload::emp_id(client) as i32)
                    .collect(),
                purchs: indexes.map(|i| workload::purch_id(i) as i32).collect(),
            },
            "insert" => Job::Insert(indexes.map(|i| workload::row(client, i, 0)).collect()),
            other => bail!("no limit for sync type {other}"),
        })
    }

    /// Runs the job straight against PostgreSQL; the rows it moved.
    async fn run(self, db: &Client) -> Result<u64> {
        Ok(match self {
            Job::Download { emp, first, last } => {
                let stream = db
                    .copy_out(&format!(
                        "COPY (SELECT emp_id, purch_id, cust_id, cost, order_date, notes FROM {RAW_TABLE} \
                         WHERE emp_id = {emp} AND purch_id >= {first} AND purch_id < {last}) TO STDOUT (FORMAT binary)"
                    ))
                    .await?;
                pin_mut!(stream);
                let mut bytes = Vec::new();
                while let Some(chunk) = stream.next().await {
                    bytes.extend_from_slice(&chunk?);
                }
                binary_copy_tuples(&bytes)?
            }
            Job::Update {
                ints,
                old_costs,
                times,
                notes,
                new_costs,
            } => {
                db.execute(
                    &format!(
                        "UPDATE {RAW_TABLE} AS t SET cust_id = u.cust_id, cost = u.new_cost, order_date = u.order_date, notes = u.notes \
                         FROM unnest($1::int4[], $2::int4[], $3::int4[], $4::text[]::numeric[], $5::timestamp[], $6::text[], $7::text[]::numeric[]) \
                           AS u(emp_id, purch_id, cust_id, old_cost, order_date, notes, new_cost) \
                         WHERE t.emp_id = u.emp_id AND t.purch_id = u.purch_id AND t.cust_id = u.cust_id \
                           AND t.cost = u.old_cost AND t.order_date = u.order_date AND t.notes IS NOT DISTINCT FROM u.notes"
                    ),
                    &[
                        &ints[0], &ints[1], &ints[2], &old_costs, &times, &notes, &new_costs,
                    ],
                )
                .await?
            }
            Job::Delete { emps, purchs } => {
                db.execute(
                    &format!(
                        "DELETE FROM {RAW_TABLE} AS t USING unnest($1::int4[], $2::int4[]) AS k(emp_id, purch_id) \
                         WHERE t.emp_id = k.emp_id AND t.purch_id = k.purch_id"
                    ),
                    &[&emps, &purchs],
                )
                .await?
            }
            Job::Insert(rows) => copy_in(db, RAW_TABLE, rows.into_iter()).await?,
        })
    }
}

/// What one limit run measured, per sync type (download, update, delete, insert).
#[derive(Debug, Clone)]
pub struct Measured {
    /// For each set, the wall time from the first job's start to the last job's end
    /// over `connections` connections, summed over sets, as the server's total time is.
    pub seconds: [f64; 4],
    /// Whose CPU those timed sections used (the bench's own process is the driver).
    pub cpu: [CpuUsage; 4],
}

impl Measured {
    /// Nothing measured yet: slower than any run.
    pub fn unmeasured() -> Measured {
        Measured {
            seconds: [f64::INFINITY; 4],
            cpu: [CpuUsage::default(); 4],
        }
    }

    /// Keeps, per sync type, `other`'s time and CPU where its time is the faster.
    pub fn keep_faster(&mut self, other: &Measured) {
        for i in 0..4 {
            if other.seconds[i] < self.seconds[i] {
                self.seconds[i] = other.seconds[i];
                self.cpu[i] = other.cpu[i];
            }
        }
    }
}

/// The limit at one shape, once: see [`Measured`].
pub async fn measure(
    url: &str,
    meter: &Meter,
    clients: usize,
    rows: usize,
    sets: usize,
    connections: usize,
) -> Result<Measured> {
    let admin = connect(url).await?;
    admin
        .batch_execute(&format!("TRUNCATE {RAW_TABLE}"))
        .await?;
    let mut pool = Vec::new();
    for _ in 0..connections.max(1) {
        pool.push(Arc::new(connect(url).await?));
    }
    let mut measured = Measured {
        seconds: [0.0; 4],
        cpu: [CpuUsage::zero(meter.measures_database()); 4],
    };
    for (i, sync_type) in super::results::SYNC_TYPES.into_iter().enumerate() {
        for set in 0..sets {
            if sync_type == "download" {
                // The rows to download, put in place outside the timed section.
                let all = (0..clients).flat_map(|c| {
                    workload::set_indexes(set, rows).map(move |i| workload::row(c, i, 0))
                });
                copy_in(&admin, RAW_TABLE, all).await?;
                admin.batch_execute(&format!("ANALYZE {RAW_TABLE}")).await?;
            }
            let jobs = (0..clients)
                .map(|client| Job::new(sync_type, client, set, rows))
                .collect::<Result<Vec<_>>>()?;
            let queue = Arc::new(Mutex::new(jobs.into_iter()));
            let cpu_before = meter.read(&[])?;
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for db in &pool {
                let (db, queue) = (Arc::clone(db), Arc::clone(&queue));
                tasks.spawn(async move {
                    let mut changed = 0u64;
                    loop {
                        let next = queue.lock().await.next();
                        let Some(job) = next else { break };
                        changed += job.run(&db).await?;
                    }
                    Ok::<u64, anyhow::Error>(changed)
                });
            }
            let mut changed = 0;
            while let Some(done) = tasks.join_next().await {
                changed += done??;
            }
            measured.seconds[i] += started.elapsed().as_secs_f64();
            measured.cpu[i].add(&meter.read(&[])?.since(&cpu_before));
            let expected = (clients * rows) as u64;
            if changed != expected {
                bail!("the limit's {sync_type} of set {set} moved {changed} rows, expected {expected}");
            }
        }
    }
    Ok(measured)
}

/// Counts the tuples of a binary COPY stream (header, tuples, trailer), walking every
/// field, so that a short or malformed stream is an error rather than a wrong count.
fn binary_copy_tuples(bytes: &[u8]) -> Result<u64> {
    const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
    let take = |at: usize, n: usize| -> Result<&[u8]> {
        bytes
            .get(at..at + n)
            .ok_or_else(|| anyhow::anyhow!("binary COPY stream cut at byte {at}"))
    };
    if take(0, SIGNATURE.len())? != SIGNATURE {
        bail!("not a binary COPY stream");
    }
    let extension = u32::from_be_bytes(take(15, 4)?.try_into()?) as usize;
    let mut at = 19 + extension;
    let mut tuples = 0;
    loop {
        let fields = i16::from_be_bytes(take(at, 2)?.try_into()?);
        at += 2;
        if fields == -1 {
            return Ok(tuples);
        }
        for _ in 0..fields {
            let length = i32::from_be_bytes(take(at, 4)?.try_into()?);
            at += 4 + length.max(0) as usize;
        }
        tuples += 1;
    }
}
