//! Foreign keys between synchronized tables (issue 31, item 3): an upload applies inserts
//! and updates parents first and deletes children first, whatever order its tables come
//! in; a cycle of keys is deferred for the sync where the database can, else refused at
//! `init`.

use super::*;

const RENTAL_DDL: &str =
    "CREATE TABLE rental (rental_id INTEGER PRIMARY KEY, rep TEXT NOT NULL, item TEXT)";
const RENTAL_COLUMNS: [&str; 3] = ["rental_id", "rep", "item"];
/// `payment` sorts before `rental` and references it: name order is child first.
pub const PAYMENT_DDL: &str = "CREATE TABLE payment (payment_id INTEGER PRIMARY KEY, \
     rep TEXT NOT NULL, rental_id INTEGER NOT NULL, amount INTEGER, \
     CONSTRAINT payment_rental_fkey FOREIGN KEY (rental_id) REFERENCES rental (rental_id))";
const PAYMENT_COLUMNS: [&str; 4] = ["payment_id", "rep", "rental_id", "amount"];

fn rental(id: i64, item: &str) -> Row {
    vec![Value::Int(id), text("alice"), text(item)]
}

fn payment(id: i64, rental_id: i64, amount: i64) -> Row {
    vec![
        Value::Int(id),
        text("alice"),
        Value::Int(rental_id),
        Value::Int(amount),
    ]
}

fn rentals(inserts: Vec<Row>, updates: Vec<(Row, Row)>, deletes: Vec<Row>) -> TableUpload {
    upload(
        "rental",
        &RENTAL_COLUMNS,
        &["rental_id"],
        inserts,
        updates,
        deletes,
    )
}

fn payments(inserts: Vec<Row>, updates: Vec<(Row, Row)>, deletes: Vec<Row>) -> TableUpload {
    let key = ["payment_id"];
    upload("payment", &PAYMENT_COLUMNS, &key, inserts, updates, deletes)
}

/// The rental store with `payment_ddl` (a table `payment` with [`PAYMENT_COLUMNS`]
/// referencing `rental`), both initialized.
async fn rental_store<F: Factory>(payment_ddl: &str) -> Fixture<F> {
    let mut f = Fixture::<F>::new().await;
    f.sql.execute(RENTAL_DDL).await;
    for statement in payment_ddl.split(';').filter(|s| !s.trim().is_empty()) {
        f.sql.execute(statement).await;
    }
    f.init("payment", "rep").await.expect("init payment");
    f.init("rental", "rep").await.expect("init rental");
    f
}

async fn store_rows<F: Factory>(f: &mut Fixture<F>) -> (Vec<Row>, Vec<Row>) {
    let rentals = f
        .sql
        .query_rows("SELECT rental_id, rep, item FROM rental ORDER BY rental_id")
        .await;
    let payments = f
        .sql
        .query_rows("SELECT payment_id, rep, rental_id, amount FROM payment ORDER BY payment_id")
        .await;
    (rentals, payments)
}

pub async fn uploads_apply_parents_first_and_delete_children_first<F: Factory>() {
    uploads_in_foreign_key_order::<F>(PAYMENT_DDL).await;
}

/// The device: a rental and its payment made offline go up in one sync, tables
/// in name order (as a client sends them), payment first. Then, in one sync, a new
/// rental, the payment moved to it and the old rental deleted; last, both deleted with
/// the parent's table first in the upload.
pub async fn uploads_in_foreign_key_order<F: Factory>(payment_ddl: &str) {
    let mut f = rental_store::<F>(payment_ddl).await;
    let first = f
        .sync_ok(request(
            "alice-1",
            "alice",
            0,
            1,
            vec![
                payments(vec![payment(1, 10, 5)], vec![], vec![]),
                rentals(vec![rental(10, "dvd")], vec![], vec![]),
            ],
        ))
        .await;
    assert_summary(&first, 2, 0, false);
    let (rentals_now, payments_now) = store_rows(&mut f).await;
    assert_eq!(rentals_now, vec![rental(10, "dvd")]);
    assert_eq!(payments_now, vec![payment(1, 10, 5)]);

    let moved = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![
                payments(vec![], vec![(payment(1, 10, 5), payment(1, 11, 6))], vec![]),
                rentals(vec![rental(11, "blu-ray")], vec![], vec![key(&[10])]),
            ],
        ))
        .await;
    assert_summary(&moved, 3, 0, false);
    let (rentals_now, payments_now) = store_rows(&mut f).await;
    assert_eq!(rentals_now, vec![rental(11, "blu-ray")]);
    assert_eq!(payments_now, vec![payment(1, 11, 6)]);

    let deleted = f
        .sync_ok(request(
            "alice-1",
            "alice",
            moved.watermark,
            3,
            vec![
                rentals(vec![], vec![], vec![key(&[11])]),
                payments(vec![], vec![], vec![key(&[1])]),
            ],
        ))
        .await;
    assert_summary(&deleted, 2, 0, false);
    assert_eq!(store_rows(&mut f).await, (vec![], vec![]));
    // Another device of the user receives nothing of what came and went.
    let other = f.sync_ok(request("alice-2", "alice", 0, 1, vec![])).await;
    assert!(
        other.downloads.iter().all(|d| d.upserts.is_empty()),
        "{:?}",
        other.downloads
    );
}

/// A rental and its payment the server already holds, deleted in one sync whose upload
/// names the parent's table first: the payment goes first.
pub async fn deletes_apply_children_first_whatever_order_the_tables_come_in<F: Factory>() {
    let mut f = rental_store::<F>(PAYMENT_DDL).await;
    f.insert_rows("rental", &RENTAL_COLUMNS, &[rental(10, "dvd")])
        .await;
    f.insert_rows("payment", &PAYMENT_COLUMNS, &[payment(1, 10, 5)])
        .await;
    // The client deletes rows it downloaded (a delete of a row changed since is a
    // conflict).
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let deleted = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![
                rentals(vec![], vec![], vec![key(&[10])]),
                payments(vec![], vec![], vec![key(&[1])]),
            ],
        ))
        .await;
    assert_summary(&deleted, 2, 0, false);
    assert_eq!(store_rows(&mut f).await, (vec![], vec![]));
}

/// A payment referencing a rental that exists nowhere still fails the sync (the order
/// helps only rows that exist), naming the database's refusal, and applies nothing.
pub async fn a_row_whose_parent_exists_nowhere_still_fails_the_sync<F: Factory>() {
    let mut f = rental_store::<F>(PAYMENT_DDL).await;
    let error = f
        .sync(request(
            "alice-1",
            "alice",
            0,
            1,
            vec![
                payments(vec![payment(1, 99, 5)], vec![], vec![]),
                rentals(vec![rental(10, "dvd")], vec![], vec![]),
            ],
        ))
        .await
        .unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("foreign key"),
        "{error}"
    );
    assert_eq!(store_rows(&mut f).await, (vec![], vec![]));
}

#[allow(dead_code)]
const STORE_COLUMNS: [&str; 3] = ["store_id", "rep", "manager_id"];
#[allow(dead_code)]
const STAFF_COLUMNS: [&str; 3] = ["staff_id", "rep", "store_id"];

/// `store` and `staff` made (by `ddl`) to reference each other: a store's manager and
/// a staff member's store.
#[allow(dead_code)]
async fn store_and_staff<F: Factory>(ddl: &[&str]) -> Fixture<F> {
    let mut f = Fixture::<F>::new().await;
    for statement in ddl {
        f.sql.execute(statement).await;
    }
    f.init("staff", "rep").await.expect("init staff");
    f
}

/// Where the database can defer the keys of a cycle (`ddl` makes one `init` accepts),
/// a store and its manager made offline together sync in one upload, and are deleted
/// together (SQLite, PostgreSQL).
#[allow(dead_code)]
pub async fn a_cycle_of_deferrable_keys_syncs_in_one_transaction<F: Factory>(ddl: &[&str]) {
    let mut f = store_and_staff::<F>(ddl).await;
    f.init("store", "rep").await.expect("init store");
    let store = vec![Value::Int(1), text("alice"), Value::Int(7)];
    let staff = vec![Value::Int(7), text("alice"), Value::Int(1)];
    let upload_of = |table: &str, columns: &[&str], key: &str, inserts, deletes| {
        upload(table, columns, &[key], inserts, vec![], deletes)
    };
    let created = f
        .sync_ok(request(
            "alice-1",
            "alice",
            0,
            1,
            vec![
                upload_of(
                    "store",
                    &STORE_COLUMNS,
                    "store_id",
                    vec![store.clone()],
                    vec![],
                ),
                upload_of(
                    "staff",
                    &STAFF_COLUMNS,
                    "staff_id",
                    vec![staff.clone()],
                    vec![],
                ),
            ],
        ))
        .await;
    assert_summary(&created, 2, 0, false);
    let stores = "SELECT store_id, rep, manager_id FROM store";
    assert_eq!(f.sql.query_rows(stores).await, vec![store]);
    let staff_rows = "SELECT staff_id, rep, store_id FROM staff";
    assert_eq!(f.sql.query_rows(staff_rows).await, vec![staff]);
    let deleted = f
        .sync_ok(request(
            "alice-1",
            "alice",
            created.watermark,
            2,
            vec![
                upload_of("staff", &STAFF_COLUMNS, "staff_id", vec![], vec![key(&[7])]),
                upload_of("store", &STORE_COLUMNS, "store_id", vec![], vec![key(&[1])]),
            ],
        ))
        .await;
    assert_summary(&deleted, 2, 0, false);
    assert!(f.sql.query_rows(stores).await.is_empty());
    assert!(f.sql.query_rows(staff_rows).await.is_empty());
}

/// Where the database cannot defer a key of the cycle `ddl` makes, `init` of the table
/// that closes it is refused with a message holding each of `expected`, and registers
/// nothing (PostgreSQL, MySQL).
#[allow(dead_code)]
pub async fn a_cycle_of_keys_that_cannot_wait_is_refused_at_init<F: Factory>(
    ddl: &[&str],
    expected: &[&str],
) {
    let mut f = store_and_staff::<F>(ddl).await;
    let error = f.init("store", "rep").await.unwrap_err().to_string();
    for part in expected {
        assert!(error.contains(part), "{part:?} missing from: {error}");
    }
    let registered = f
        .sql
        .query_rows("SELECT table_name FROM rs_table ORDER BY table_name")
        .await;
    assert_eq!(registered, vec![vec![text("staff")]]);
}
