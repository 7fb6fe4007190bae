//! Change tracking, in-flight uploads and download apply, checked on real SQLite files
//! by decoding the upload frames exactly as a server would receive them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rowsync_protocol::{
    decode_message, Download, Message, Row, TableUpload, Value, FRAME_HEADER_BYTES,
};
use rusqlite::Connection;
use tempfile::TempDir;

use super::*;

const ORDERS_DDL: &str = "CREATE TABLE orders (id INTEGER PRIMARY KEY, rep TEXT NOT NULL, item TEXT, quantity INTEGER, amount TEXT)";
const ORDER_COLUMNS: [&str; 5] = ["id", "rep", "item", "quantity", "amount"];

struct Db {
    connection: Connection,
    path: PathBuf,
    _directory: TempDir,
}

/// Opens a connection the way `Client::open_with_id` does.
fn open(path: &Path) -> Connection {
    let connection = Connection::open(path).unwrap();
    connection.busy_timeout(Duration::from_secs(30)).unwrap();
    connection
        .pragma_update(None, "journal_mode", "WAL")
        .unwrap();
    connection
}

/// A client database with `orders` tracked and `seed` present as rows already synced.
fn client_with_orders(seed: &[Row]) -> Db {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("client.db");
    let mut connection = open(&path);
    assert_eq!(install(&connection, Some("client-1")).unwrap(), "client-1");
    connection.execute_batch(ORDERS_DDL).unwrap();
    track(&mut connection, "orders", ExistingRows::Upload).unwrap();
    let mut db = Db {
        connection,
        path,
        _directory: directory,
    };
    if !seed.is_empty() {
        // As the first sync would: an empty upload, acknowledged with the download.
        let batch = next_batch(&mut db.connection).unwrap();
        assert!(batch.frames.is_empty());
        apply_download(
            &mut db.connection,
            batch.upload_sequence,
            &[orders_download(seed, &[])],
            1,
        )
        .unwrap();
        assert!(!has_pending_changes(&db.connection).unwrap());
    }
    db
}

fn text(value: &str) -> Value {
    Value::Text(value.into())
}

fn order(id: i64, rep: &str, item: &str, quantity: i64) -> Row {
    vec![
        Value::Int(id),
        text(rep),
        text(item),
        Value::Int(quantity),
        Value::Null,
    ]
}

fn key(id: i64) -> Row {
    vec![Value::Int(id)]
}

fn orders_download(upserts: &[Row], deletes: &[Row]) -> Download {
    Download {
        table: "orders".into(),
        columns: ORDER_COLUMNS.iter().map(|&c| c.into()).collect(),
        key_columns: vec!["id".into()],
        upserts: upserts.to_vec(),
        deletes: deletes.to_vec(),
    }
}

fn execute(connection: &Connection, sql: &str) {
    connection
        .execute_batch(sql)
        .unwrap_or_else(|error| panic!("{sql}: {error}"));
}

fn orders(connection: &Connection) -> Vec<Row> {
    let mut statement = connection
        .prepare("SELECT id, rep, item, quantity, amount FROM orders ORDER BY id")
        .unwrap();
    statement
        .query_map([], |row| (0..5).map(|i| row.get::<_, Value>(i)).collect())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The upload messages of a batch, decoded from its frames.
fn uploads(batch: &Batch) -> Vec<TableUpload> {
    batch
        .frames
        .iter()
        .map(|frame| {
            let length = u32::from_be_bytes(frame[..FRAME_HEADER_BYTES].try_into().unwrap());
            assert_eq!(length as usize, frame.len() - FRAME_HEADER_BYTES);
            match decode_message(&frame[FRAME_HEADER_BYTES..]).unwrap() {
                Message::Upload(upload) => upload,
                other => panic!("an upload frame holds {other:?}"),
            }
        })
        .collect()
}

/// The one upload message of a batch, for `orders`.
fn orders_upload(batch: &Batch) -> TableUpload {
    let mut uploads = uploads(batch);
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    let mut upload = uploads.remove(0);
    assert_eq!(upload.table, "orders");
    assert_eq!(upload.columns, ORDER_COLUMNS);
    assert_eq!(upload.key_columns, ["id"]);
    let operations = upload.inserts.len() + upload.updates.len() + upload.deletes.len();
    assert_eq!(batch.operations, operations as u64);
    upload.inserts.sort_by_key(|row| format!("{row:?}"));
    upload.deletes.sort_by_key(|row| format!("{row:?}"));
    upload
        .updates
        .sort_by_key(|update| format!("{:?}", update.new));
    upload
}

fn update(old: Row, new: Row) -> RowUpdate {
    RowUpdate { old, new }
}

#[test]
fn insert_then_update_uploads_one_insert_with_the_latest_values() {
    let mut db = client_with_orders(&[]);
    execute(
        &db.connection,
        "INSERT INTO orders (id, rep, item, quantity) VALUES (1, 'alice', 'pen', 1);
         UPDATE orders SET quantity = 5, item = 'pencil' WHERE id = 1;
         UPDATE orders SET amount = '2.50' WHERE id = 1;",
    );
    let batch = next_batch(&mut db.connection).unwrap();
    assert_eq!((batch.upload_sequence, batch.is_retry), (1, false));
    let upload = orders_upload(&batch);
    let mut expected = order(1, "alice", "pencil", 5);
    expected[4] = text("2.50");
    assert_eq!(upload.inserts, vec![expected]);
    assert!(upload.updates.is_empty() && upload.deletes.is_empty());
    assert!(
        !has_pending_changes(&db.connection).unwrap(),
        "the log moved into the batch"
    );
}

#[test]
fn update_then_update_keeps_the_first_old_image_and_the_latest_new_image() {
    let synced = order(1, "alice", "pen", 1);
    let mut db = client_with_orders(&[synced.clone(), order(2, "alice", "ink", 2)]);
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 2 WHERE id = 1;
         UPDATE orders SET quantity = 3, item = 'ink' WHERE id = 1;",
    );
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(
        upload.updates,
        vec![update(synced, order(1, "alice", "ink", 3))]
    );
    assert!(upload.inserts.is_empty() && upload.deletes.is_empty());
}

#[test]
fn insert_then_delete_uploads_nothing() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1)]);
    execute(
        &db.connection,
        "INSERT INTO orders (id, rep, item, quantity) VALUES (2, 'alice', 'ink', 2);
         UPDATE orders SET quantity = 3 WHERE id = 2;
         DELETE FROM orders WHERE id = 2;",
    );
    assert!(!has_pending_changes(&db.connection).unwrap());
    let batch = next_batch(&mut db.connection).unwrap();
    assert!(batch.frames.is_empty(), "{:?}", uploads(&batch));
    assert_eq!(batch.operations, 0);
    assert_eq!(batch.upload_sequence, 2, "the seeding sync used sequence 1");
}

#[test]
fn update_then_delete_uploads_a_delete_and_a_plain_delete_too() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1), order(2, "alice", "ink", 2)]);
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 10 WHERE id = 1;
         DELETE FROM orders WHERE id = 1;
         DELETE FROM orders WHERE id = 2;",
    );
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(upload.deletes, vec![key(1), key(2)]);
    assert!(upload.inserts.is_empty() && upload.updates.is_empty());
}

#[test]
fn delete_then_reinsert_uploads_an_update_from_the_deleted_row() {
    let synced = order(1, "alice", "pen", 1);
    let mut db = client_with_orders(std::slice::from_ref(&synced));
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 4 WHERE id = 1;
         DELETE FROM orders WHERE id = 1;
         INSERT INTO orders (id, rep, item, quantity) VALUES (1, 'alice', 'new pen', 9);",
    );
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(
        upload.updates,
        vec![update(synced, order(1, "alice", "new pen", 9))],
        "the old image is the row as last synced"
    );
    assert!(upload.inserts.is_empty() && upload.deletes.is_empty());
}

#[test]
fn a_key_change_uploads_a_delete_of_the_old_key_and_an_insert_of_the_new() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1)]);
    execute(
        &db.connection,
        "UPDATE orders SET id = 2, quantity = 7 WHERE id = 1;
         INSERT INTO orders (id, rep, item, quantity) VALUES (5, 'alice', 'ink', 5);
         UPDATE orders SET id = 6 WHERE id = 5;",
    );
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(upload.deletes, vec![key(1)]);
    assert_eq!(
        upload.inserts,
        vec![order(2, "alice", "pen", 7), order(6, "alice", "ink", 5)],
        "a row inserted and then re-keyed is just an insert of the new key"
    );
    assert!(upload.updates.is_empty());
}

#[test]
fn changes_made_while_a_sync_is_in_flight_survive_its_acknowledgement() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1), order(2, "alice", "ink", 2)]);
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 10 WHERE id = 1",
    );
    let batch = next_batch(&mut db.connection).unwrap();
    let in_flight = order(1, "alice", "pen", 10);
    assert_eq!(
        orders_upload(&batch).updates,
        vec![update(order(1, "alice", "pen", 1), in_flight.clone())]
    );

    // The application writes through its own connection while the sync is away.
    let other = open(&db.path);
    execute(
        &other,
        "UPDATE orders SET quantity = 11 WHERE id = 1;
         INSERT INTO orders (id, rep, item, quantity) VALUES (3, 'alice', 'cap', 3);
         DELETE FROM orders WHERE id = 2;",
    );
    drop(other);

    // The server sends row 1 as it applied it, and a new row 4.
    let applied = apply_download(
        &mut db.connection,
        batch.upload_sequence,
        &[orders_download(
            &[in_flight.clone(), order(4, "alice", "nib", 4)],
            &[],
        )],
        7,
    )
    .unwrap();
    assert_eq!(
        applied, 1,
        "only row 4 is applied; row 1 has a pending change"
    );
    assert_eq!(
        orders(&db.connection),
        vec![
            order(1, "alice", "pen", 11),
            order(3, "alice", "cap", 3),
            order(4, "alice", "nib", 4),
        ]
    );
    assert!(has_pending_changes(&db.connection).unwrap());
    let state = state(&db.connection).unwrap();
    assert_eq!(
        (state.upload_sequence_acknowledged, state.download_watermark),
        (batch.upload_sequence, 7)
    );

    let next = next_batch(&mut db.connection).unwrap();
    assert_eq!(
        (next.upload_sequence, next.is_retry),
        (batch.upload_sequence + 1, false)
    );
    let upload = orders_upload(&next);
    assert_eq!(
        upload.updates,
        vec![update(in_flight, order(1, "alice", "pen", 11))],
        "the old image is what the acknowledged upload carried"
    );
    assert_eq!(upload.inserts, vec![order(3, "alice", "cap", 3)]);
    assert_eq!(upload.deletes, vec![key(2)]);
}

#[test]
fn applying_a_download_records_nothing_skips_pending_rows_and_sets_the_watermark() {
    let mut db = client_with_orders(&[
        order(1, "alice", "pen", 1),
        order(2, "alice", "ink", 2),
        order(3, "alice", "pad", 3),
        order(4, "alice", "cap", 4),
        order(6, "alice", "nib", 6),
    ]);
    assert_eq!(orders(&db.connection).len(), 5, "the seed was applied");
    let batch = next_batch(&mut db.connection).unwrap();
    assert!(batch.frames.is_empty());
    // Local changes not yet uploaded: row 2 and row 6 updated, row 4 deleted.
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 20 WHERE id = 2;
         UPDATE orders SET quantity = 60 WHERE id = 6;
         DELETE FROM orders WHERE id = 4;",
    );

    let applied = apply_download(
        &mut db.connection,
        batch.upload_sequence,
        &[orders_download(
            &[
                order(1, "alice", "pen", 100),
                order(2, "alice", "ink", 200),
                // As the delete saw it: the pending delete stands (a row changed since
                // would make the delete stale: tests/edge.rs).
                order(4, "alice", "cap", 4),
                order(5, "alice", "new", 5),
            ],
            &[key(3), key(6)],
        )],
        42,
    )
    .unwrap();
    assert_eq!(applied, 3, "upserts of 1 and 5, delete of 3");
    assert_eq!(
        orders(&db.connection),
        vec![
            order(1, "alice", "pen", 100),
            order(2, "alice", "ink", 20),
            order(5, "alice", "new", 5),
            order(6, "alice", "nib", 60),
        ],
        "rows with pending changes keep their local state"
    );
    assert_eq!(state(&db.connection).unwrap().download_watermark, 42);

    // The log holds the local changes only, nothing of the download.
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(
        upload.updates,
        vec![
            update(order(2, "alice", "ink", 2), order(2, "alice", "ink", 20)),
            update(order(6, "alice", "nib", 6), order(6, "alice", "nib", 60)),
        ]
    );
    assert_eq!(upload.deletes, vec![key(4)]);
    assert!(upload.inserts.is_empty());
}

#[test]
fn a_download_alone_leaves_the_log_empty_and_later_local_changes_are_recorded() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1)]);
    let batch = next_batch(&mut db.connection).unwrap();
    apply_download(
        &mut db.connection,
        batch.upload_sequence,
        &[orders_download(
            &[order(1, "alice", "pen", 9), order(2, "alice", "ink", 2)],
            &[],
        )],
        5,
    )
    .unwrap();
    assert_eq!(
        orders(&db.connection),
        vec![order(1, "alice", "pen", 9), order(2, "alice", "ink", 2)]
    );
    assert!(!has_pending_changes(&db.connection).unwrap());
    assert!(next_batch(&mut db.connection).unwrap().frames.is_empty());

    execute(
        &db.connection,
        "UPDATE orders SET quantity = 3 WHERE id = 2",
    );
    assert!(
        has_pending_changes(&db.connection).unwrap(),
        "tracking resumes after a download"
    );
}

#[test]
fn an_unacknowledged_batch_is_returned_again_with_its_sequence() {
    let mut db = client_with_orders(&[]);
    execute(
        &db.connection,
        "INSERT INTO orders (id, rep, item, quantity) VALUES (1, 'alice', 'pen', 1)",
    );
    let first = next_batch(&mut db.connection).unwrap();
    assert_eq!((first.upload_sequence, first.is_retry), (1, false));

    execute(
        &db.connection,
        "INSERT INTO orders (id, rep, item, quantity) VALUES (2, 'alice', 'ink', 2)",
    );
    let retry = next_batch(&mut db.connection).unwrap();
    assert_eq!((retry.upload_sequence, retry.is_retry), (1, true));
    assert_eq!(retry.frames, first.frames, "resent byte for byte");
    assert_eq!(retry.operations, first.operations);
    assert_eq!(
        orders_upload(&retry).inserts,
        vec![order(1, "alice", "pen", 1)]
    );
    assert!(
        has_pending_changes(&db.connection).unwrap(),
        "the later change waits"
    );

    apply_download(&mut db.connection, retry.upload_sequence, &[], 3).unwrap();
    let next = next_batch(&mut db.connection).unwrap();
    assert_eq!((next.upload_sequence, next.is_retry), (2, false));
    assert_eq!(
        orders_upload(&next).inserts,
        vec![order(2, "alice", "ink", 2)]
    );

    // An empty batch is kept and resent like any other.
    apply_download(&mut db.connection, next.upload_sequence, &[], 4).unwrap();
    let empty = next_batch(&mut db.connection).unwrap();
    let empty_again = next_batch(&mut db.connection).unwrap();
    assert_eq!(
        (empty.upload_sequence, empty.is_retry, empty.frames.len()),
        (3, false, 0)
    );
    assert_eq!(
        (
            empty_again.upload_sequence,
            empty_again.is_retry,
            empty_again.frames.len()
        ),
        (3, true, 0)
    );
}

#[test]
fn the_upload_sequence_increases_by_one_per_acknowledged_batch() {
    let mut db = client_with_orders(&[]);
    for expected in 1..=4u64 {
        if expected % 2 == 0 {
            execute(
                &db.connection,
                &format!(
                    "INSERT INTO orders (id, rep, item, quantity) VALUES ({expected}, 'alice', 'x', 1)"
                ),
            );
        }
        assert_eq!(
            state(&db.connection).unwrap().upload_sequence_acknowledged,
            expected - 1
        );
        let batch = next_batch(&mut db.connection).unwrap();
        assert_eq!(batch.upload_sequence, expected);
        assert!(!batch.is_retry);
        apply_download(
            &mut db.connection,
            batch.upload_sequence,
            &[],
            expected as i64,
        )
        .unwrap();
        assert_eq!(
            state(&db.connection).unwrap().upload_sequence_acknowledged,
            expected
        );
    }
    // A late acknowledgement of an older sequence does not move it back.
    apply_download(&mut db.connection, 2, &[], 9).unwrap();
    assert_eq!(
        state(&db.connection).unwrap().upload_sequence_acknowledged,
        4
    );
    assert_eq!(next_batch(&mut db.connection).unwrap().upload_sequence, 5);
}

#[test]
fn composite_keys_and_without_rowid_tables_are_tracked() {
    let mut db = client_with_orders(&[]);
    execute(
        &db.connection,
        "CREATE TABLE lines (order_id INTEGER, line INTEGER, rep TEXT, qty INTEGER, PRIMARY KEY (order_id, line));
         CREATE TABLE tags (name TEXT PRIMARY KEY, rep TEXT) WITHOUT ROWID;",
    );
    track(&mut db.connection, "lines", ExistingRows::Upload).unwrap();
    track(&mut db.connection, "tags", ExistingRows::Upload).unwrap();
    execute(
        &db.connection,
        "INSERT INTO lines VALUES (1, 1, 'alice', 5), (1, 2, 'alice', 6);
         UPDATE lines SET qty = 50 WHERE order_id = 1 AND line = 1;
         INSERT INTO tags VALUES ('red', 'alice'), ('blue', 'alice');
         DELETE FROM tags WHERE name = 'blue';",
    );
    let batch = next_batch(&mut db.connection).unwrap();
    let mut uploads = uploads(&batch);
    uploads.sort_by(|a, b| a.table.cmp(&b.table));
    assert_eq!(uploads.len(), 2, "{uploads:?}");
    assert_eq!(uploads[0].table, "lines");
    assert_eq!(uploads[0].key_columns, ["order_id", "line"]);
    let mut lines = uploads[0].inserts.clone();
    lines.sort_by_key(|row| format!("{row:?}"));
    let line = |order: i64, line: i64, qty: i64| {
        vec![
            Value::Int(order),
            Value::Int(line),
            text("alice"),
            Value::Int(qty),
        ]
    };
    assert_eq!(lines, vec![line(1, 1, 50), line(1, 2, 6)]);
    assert_eq!(uploads[1].table, "tags");
    assert_eq!(uploads[1].inserts, vec![vec![text("red"), text("alice")]]);
    assert!(uploads[1].deletes.is_empty());

    // Downloads into them apply too, and record nothing.
    apply_download(
        &mut db.connection,
        batch.upload_sequence,
        &[Download {
            table: "tags".into(),
            columns: vec!["name".into(), "rep".into()],
            key_columns: vec!["name".into()],
            upserts: vec![vec![text("green"), text("alice")]],
            deletes: vec![vec![text("red")]],
        }],
        2,
    )
    .unwrap();
    assert!(!has_pending_changes(&db.connection).unwrap());
    let tags: Vec<String> = db
        .connection
        .prepare("SELECT name FROM tags ORDER BY name")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(tags, ["green"]);
}

/// The one upload message of a batch, any columns.
fn only_upload(batch: &Batch) -> TableUpload {
    let mut uploads = uploads(batch);
    assert_eq!(uploads.len(), 1, "{uploads:?}");
    uploads.remove(0)
}

#[test]
fn pending_changes_survive_an_added_column_and_upload_with_it() {
    let pen = order(1, "alice", "pen", 1);
    let ink = order(2, "alice", "ink", 2);
    let mut db = client_with_orders(&[pen.clone(), ink.clone()]);
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 5 WHERE id = 1;
         DELETE FROM orders WHERE id = 2;
         INSERT INTO orders (id, rep, item, quantity) VALUES (3, 'alice', 'cup', 1);",
    );
    execute(
        &db.connection,
        "ALTER TABLE orders ADD COLUMN note TEXT DEFAULT 'none'",
    );
    track(&mut db.connection, "orders", ExistingRows::Upload).unwrap();
    execute(
        &db.connection,
        "UPDATE orders SET note = 'urgent' WHERE id = 3",
    );
    let upload = only_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(
        upload.columns,
        ["id", "rep", "item", "quantity", "amount", "note"]
    );
    let noted = |row: &Row, note: &str| {
        let mut row = row.clone();
        row.push(text(note));
        row
    };
    // The old image of the new column is the row's value when tracking moved on.
    assert_eq!(
        upload.updates,
        vec![update(
            noted(&pen, "none"),
            noted(&order(1, "alice", "pen", 5), "none")
        )]
    );
    assert_eq!(upload.deletes, vec![key(2)]);
    assert_eq!(
        upload.inserts,
        vec![noted(&order(3, "alice", "cup", 1), "urgent")]
    );
    // Later changes are tracked with the new column.
    execute(
        &db.connection,
        "UPDATE orders SET note = 'done' WHERE id = 1",
    );
    let later = next_batch(&mut db.connection).unwrap();
    assert!(later.is_retry, "the first batch is still in flight");
}

#[test]
fn an_in_flight_upload_is_resent_unchanged_after_the_table_changed() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1)]);
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 2 WHERE id = 1",
    );
    let first = next_batch_for(&mut db.connection, Some("v1"), None).unwrap();
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 3 WHERE id = 1",
    );
    execute(&db.connection, "ALTER TABLE orders ADD COLUMN note TEXT");
    track(&mut db.connection, "orders", ExistingRows::Upload).unwrap();
    let resent = next_batch_for(&mut db.connection, Some("v2"), None).unwrap();
    assert!(resent.is_retry);
    assert_eq!(resent.frames, first.frames);
    assert_eq!(resent.script_version.as_deref(), Some("v1"));
    assert!(has_pending_changes(&db.connection).unwrap());
}

#[test]
fn a_dropped_column_leaves_the_log_and_a_changed_key_waits_for_pending_changes() {
    let pen = order(1, "alice", "pen", 1);
    let mut db = client_with_orders(std::slice::from_ref(&pen));
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 4 WHERE id = 1",
    );
    let refused = db
        .connection
        .execute_batch("ALTER TABLE orders DROP COLUMN amount");
    assert!(refused.is_err(), "SQLite refuses while triggers name it");
    alter_tracked(
        &mut db.connection,
        "orders",
        "ALTER TABLE orders DROP COLUMN amount",
    )
    .unwrap();
    let upload = only_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(upload.columns, ["id", "rep", "item", "quantity"]);
    assert_eq!(
        upload.updates,
        vec![update(
            pen[..4].to_vec(),
            order(1, "alice", "pen", 4)[..4].to_vec()
        )]
    );

    // A new primary key: refused while a change waits, then fine.
    execute(&db.connection, "DELETE FROM rs_client_inflight");
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 5 WHERE id = 1",
    );
    let rekey = "CREATE TABLE orders_new (id INTEGER, rep TEXT NOT NULL, item TEXT, quantity INTEGER, PRIMARY KEY (id, rep));
                 INSERT INTO orders_new SELECT id, rep, item, quantity FROM orders;
                 DROP TABLE orders; ALTER TABLE orders_new RENAME TO orders;";
    let error = alter_tracked(&mut db.connection, "orders", rekey).unwrap_err();
    assert!(error.to_string().contains("primary key"), "{error}");
    assert_eq!(orders_width(&db.connection), 4, "nothing of it applied");
    assert!(has_pending_changes(&db.connection).unwrap());
    next_batch(&mut db.connection).unwrap();
    alter_tracked(&mut db.connection, "orders", rekey).unwrap();
    execute(
        &db.connection,
        "UPDATE orders SET quantity = 6 WHERE id = 1",
    );
    execute(&db.connection, "DELETE FROM rs_client_inflight");
    let upload = only_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(upload.key_columns, ["id", "rep"]);
}

fn orders_width(connection: &Connection) -> i64 {
    connection
        .query_row(
            "SELECT count(*) FROM pragma_table_info('orders')",
            [],
            |row| row.get(0),
        )
        .unwrap()
}

/// The log's columns, in order.
fn log_columns(connection: &Connection) -> Vec<String> {
    connection
        .prepare("SELECT name FROM pragma_table_info('rs_log_orders') ORDER BY cid")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn the_old_image_leaves_out_the_key_and_an_older_log_migrates_with_its_entries() {
    let pen = order(1, "alice", "pen", 1);
    let ink = order(2, "alice", "ink", 2);
    let mut db = client_with_orders(&[pen.clone(), ink.clone()]);
    assert_eq!(
        log_columns(&db.connection),
        [
            "id",
            "rs_op",
            "rs_old_rep",
            "rs_old_item",
            "rs_old_quantity",
            "rs_old_amount"
        ],
        "the key's old value is the entry's key"
    );
    // A log as tracking made it before the old image left out the key, with one entry
    // of each kind, and that version's triggers writing it.
    execute(
        &db.connection,
        "DROP TABLE rs_log_orders;
         CREATE TABLE rs_log_orders (id, rs_op TEXT NOT NULL, rs_old_id, rs_old_rep, rs_old_item,
             rs_old_quantity, rs_old_amount, PRIMARY KEY (id)) WITHOUT ROWID;
         DROP TRIGGER rs_log_update_orders; DROP TRIGGER rs_log_delete_orders;
         DROP TRIGGER rs_log_insert_orders; DROP TRIGGER rs_log_rekey_orders;
         DROP TRIGGER rs_log_displace_insert_orders; DROP TRIGGER rs_log_displace_update_orders;
         UPDATE orders SET quantity = 5 WHERE id = 1;
         DELETE FROM orders WHERE id = 2;
         INSERT INTO orders (id, rep, item, quantity) VALUES (3, 'alice', 'cup', 1);
         INSERT INTO rs_log_orders VALUES (1, 'U', 1, 'alice', 'pen', 1, NULL),
             (2, 'D', 2, 'alice', 'ink', 2, NULL), (3, 'I', NULL, NULL, NULL, NULL, NULL);",
    );
    track(&mut db.connection, "orders", ExistingRows::Upload).unwrap();
    assert_eq!(log_columns(&db.connection).len(), 6, "rs_old_id is gone");
    execute(
        &db.connection,
        "UPDATE orders SET item = 'cap' WHERE id = 3",
    );
    let upload = only_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(
        upload.updates,
        vec![update(pen, order(1, "alice", "pen", 5))]
    );
    assert_eq!(upload.deletes, vec![key(2)]);
    assert_eq!(upload.inserts, vec![order(3, "alice", "cap", 1)]);
}

#[test]
fn a_key_changed_through_the_rowid_uploads_a_delete_and_an_insert() {
    let mut db = client_with_orders(&[order(1, "alice", "pen", 1), order(2, "alice", "ink", 2)]);
    execute(
        &db.connection,
        "UPDATE orders SET rowid = 3 WHERE id = 1;
         UPDATE orders SET _rowid_ = 4 WHERE id = 2;",
    );
    let upload = orders_upload(&next_batch(&mut db.connection).unwrap());
    assert_eq!(upload.deletes, vec![key(1), key(2)]);
    assert_eq!(
        upload.inserts,
        vec![order(3, "alice", "pen", 1), order(4, "alice", "ink", 2)]
    );
    assert!(upload.updates.is_empty());
}

#[test]
fn a_table_of_key_columns_only_is_tracked() {
    let directory = tempfile::tempdir().unwrap();
    let mut connection = open(&directory.path().join("client.db"));
    install(&connection, Some("client-1")).unwrap();
    execute(
        &connection,
        "CREATE TABLE tags (a TEXT, b INTEGER, PRIMARY KEY (a, b)) WITHOUT ROWID",
    );
    track(&mut connection, "tags", ExistingRows::Upload).unwrap();
    execute(
        &connection,
        "INSERT INTO tags VALUES ('x', 1), ('y', 2); UPDATE tags SET b = 3 WHERE a = 'y'",
    );
    let mut batch = uploads(&next_batch(&mut connection).unwrap());
    let upload = batch.remove(0);
    assert_eq!(
        upload.inserts,
        vec![
            vec![text("x"), Value::Int(1)],
            vec![text("y"), Value::Int(3)]
        ]
    );
    assert!(upload.updates.is_empty() && upload.deletes.is_empty());
}

#[test]
fn rows_a_table_holds_when_first_tracked_are_uploaded_as_inserts() {
    let directory = tempfile::tempdir().unwrap();
    let mut connection = open(&directory.path().join("client.db"));
    install(&connection, Some("client-1")).unwrap();
    execute(&connection, ORDERS_DDL);
    execute(
        &connection,
        "INSERT INTO orders (id, rep, item) VALUES (1, 'alice', 'p1'), (2, 'alice', 'p2')",
    );
    track(&mut connection, "orders", ExistingRows::Upload).unwrap();
    assert!(has_pending_changes(&connection).unwrap());
    // Tracked again (as after a schema change): nothing is logged twice.
    track(&mut connection, "orders", ExistingRows::Upload).unwrap();
    let upload = only_upload(&next_batch(&mut connection).unwrap());
    let ids: Vec<&Value> = upload.inserts.iter().map(|row| &row[0]).collect();
    assert_eq!(ids, [&Value::Int(1), &Value::Int(2)]);
    assert!(upload.updates.is_empty() && upload.deletes.is_empty());
    // Once that upload is made, tracking again logs nothing.
    track(&mut connection, "orders", ExistingRows::Upload).unwrap();
    assert!(!has_pending_changes(&connection).unwrap());
}

#[test]
fn rows_that_came_from_the_server_are_not_uploaded_but_their_changes_are() {
    let directory = tempfile::tempdir().unwrap();
    let mut connection = open(&directory.path().join("client.db"));
    install(&connection, Some("client-1")).unwrap();
    execute(&connection, ORDERS_DDL);
    execute(
        &connection,
        "INSERT INTO orders (id, rep, item) VALUES (1, 'alice', 'p1')",
    );
    track(&mut connection, "orders", ExistingRows::FromServer).unwrap();
    assert!(!has_pending_changes(&connection).unwrap());
    execute(
        &connection,
        "UPDATE orders SET item = 'changed' WHERE id = 1",
    );
    let upload = only_upload(&next_batch(&mut connection).unwrap());
    assert!(upload.inserts.is_empty());
    assert_eq!(upload.updates.len(), 1);
    assert_eq!(upload.updates[0].old[2], text("p1"));
    assert_eq!(upload.updates[0].new[2], text("changed"));
}

#[test]
fn existing_rows_are_named_upload_or_from_server() {
    assert_eq!(
        "upload".parse::<ExistingRows>().unwrap(),
        ExistingRows::Upload
    );
    assert_eq!(
        "from_server".parse::<ExistingRows>().unwrap(),
        ExistingRows::FromServer
    );
    let refused = "server".parse::<ExistingRows>().unwrap_err().to_string();
    assert!(refused.contains("from_server"), "{refused}");
}

/// Issue 31: `payment` sorts before `rental` and references it (spelled `Rental`: SQLite
/// names are case-blind); the upload carries `rental` first, unrelated tables by name.
#[test]
fn an_upload_carries_tables_parents_first_by_the_clients_foreign_keys() {
    let directory = tempfile::tempdir().unwrap();
    let mut connection = open(&directory.path().join("client.db"));
    install(&connection, Some("client-1")).unwrap();
    execute(
        &connection,
        "CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, item TEXT);
         CREATE TABLE payment (payment_id INTEGER PRIMARY KEY,
             rental_id INTEGER REFERENCES Rental (rental_id), amount INTEGER);
         CREATE TABLE actor (actor_id INTEGER PRIMARY KEY)",
    );
    for table in ["payment", "rental", "actor"] {
        track(&mut connection, table, ExistingRows::Upload).unwrap();
    }
    execute(
        &connection,
        "INSERT INTO rental VALUES (10, 'dvd'); INSERT INTO payment VALUES (1, 10, 5);
         INSERT INTO actor VALUES (7)",
    );
    let batch = next_batch(&mut connection).unwrap();
    let tables: Vec<String> = uploads(&batch).into_iter().map(|u| u.table).collect();
    assert_eq!(tables, ["actor", "rental", "payment"]);
}
