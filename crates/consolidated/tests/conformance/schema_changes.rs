//! Schema changes on a live consolidated database: `init` run again after `ALTER TABLE`
//! writes a new script version while the old one keeps its clients syncing.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use super::*;

/// The table's scripts' version when `init` derives it.
async fn init_derived<F: Factory>(f: &mut Fixture<F>, table: &str) -> Result<InitOutcome, DbError> {
    f.admin
        .init_table(&TableInit {
            table: table.into(),
            partition_column: "rep".into(),
            script_version: None,
            based_on: None,
        })
        .await
}

fn versioned(version: &str, mut request: SyncRequest) -> SyncRequest {
    request.script_version = version.into();
    request
}

const NOTED_COLUMNS: [&str; 6] = ["id", "rep", "item", "quantity", "amount", "note"];

fn noted_upload(inserts: Vec<Row>, updates: Vec<(Row, Row)>) -> TableUpload {
    upload("orders", &NOTED_COLUMNS, &["id"], inserts, updates, vec![])
}

fn noted(row: &Row, note: &str) -> Row {
    let mut row = row.clone();
    row.push(text(note));
    row
}

/// Old (v1) and new (v2) clients sync the same table after `ADD COLUMN ... DEFAULT`:
/// v1 uploads leave the column to its default and v1 downloads leave it out; v2 carries
/// it both ways; `init` refuses to rewrite v1, which a client uses.
pub async fn an_added_column_goes_into_a_new_version_and_old_clients_keep_syncing<F: Factory>() {
    let pen = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&pen)).await;
    let first = f.sync_ok(request("old", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("ALTER TABLE orders ADD COLUMN note VARCHAR(20) DEFAULT 'none'")
        .await;
    let refused = f.init("orders", "rep").await.unwrap_err().to_string();
    assert!(
        refused.contains("in use") && refused.contains("note") && refused.contains("v2"),
        "{refused}"
    );
    let outcome = init_derived(&mut f, "orders").await.expect("init again");
    assert_eq!(
        (outcome.script_version.as_str(), outcome.created),
        ("v2", true)
    );
    assert_eq!(outcome.based_on.as_deref(), Some("v1"));

    // An old client inserts and updates with the old columns.
    let ink = order(2, "alice", "ink", 2, None);
    let pen_two = with(&pen, 3, Value::Int(2));
    let old = f
        .sync_ok(request(
            "old",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(
                vec![ink.clone()],
                vec![(pen.clone(), pen_two.clone())],
                vec![],
            )],
        ))
        .await;
    assert_summary(&old, 2, 0, false);
    let noted_rows = "SELECT id, rep, item, quantity, amount, note FROM orders ORDER BY id";
    assert_eq!(
        f.sql.query_rows(noted_rows).await,
        vec![noted(&pen_two, "none"), noted(&ink, "none")]
    );

    // A new client reads and writes the column.
    let new = f
        .sync_ok(versioned("v2", request("new", "alice", 0, 1, vec![])))
        .await;
    assert_eq!(
        upserts_of(&new, "orders", &NOTED_COLUMNS, &["id"]),
        vec![noted(&pen_two, "none"), noted(&ink, "none")]
    );
    let urgent = noted(&ink, "urgent");
    let cup = noted(&order(3, "alice", "cup", 1, None), "fragile");
    f.sync_ok(versioned(
        "v2",
        request(
            "new",
            "alice",
            new.watermark,
            2,
            vec![noted_upload(
                vec![cup.clone()],
                vec![(noted(&ink, "none"), urgent.clone())],
            )],
        ),
    ))
    .await;
    assert_eq!(
        f.sql.query_rows(noted_rows).await,
        vec![noted(&pen_two, "none"), urgent, cup]
    );

    // The old client receives the new client's rows without the column.
    let old_download = f
        .sync_ok(request("old", "alice", old.watermark, 3, vec![]))
        .await;
    let orders = download(&old_download, "orders", &["id"]).expect("orders come down");
    assert_eq!(orders.columns, ORDER_COLUMNS);
    assert_eq!(
        order_upserts(&old_download),
        vec![ink, order(3, "alice", "cup", 1, None)]
    );
}

/// After `DROP COLUMN`, `init` writes the new version and rewrites the old version's
/// default scripts without the column: old clients still upload it (ignored) and no
/// longer download it; the new version refuses it like any unknown column.
pub async fn a_dropped_column_leaves_every_version_and_old_uploads_of_it_are_ignored<F: Factory>() {
    let pen = order(1, "alice", "pen", 1, Some("1.50"));
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&pen)).await;
    let first = f.sync_ok(request("old", "alice", 0, 1, vec![])).await;
    f.sql.execute("ALTER TABLE orders DROP COLUMN amount").await;
    let outcome = init_derived(&mut f, "orders").await.expect("init again");
    assert_eq!(outcome.script_version, "v2");
    assert_eq!(
        outcome.rewritten,
        vec![("v1".to_string(), vec!["amount".to_string()])]
    );
    assert!(outcome.left_alone.is_empty(), "{outcome:?}");

    let ink = order(2, "alice", "ink", 2, Some("9.99"));
    let pen_two = with(&pen, 3, Value::Int(2));
    let old = f
        .sync_ok(request(
            "old",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(
                vec![ink],
                vec![(pen, with(&pen_two, 4, text("0.10")))],
                vec![],
            )],
        ))
        .await;
    assert_summary(&old, 2, 0, false);
    let remaining = ["id", "rep", "item", "quantity"];
    assert_eq!(
        f.sql
            .query_rows("SELECT id, rep, item, quantity FROM orders ORDER BY id")
            .await,
        vec![
            vec![Value::Int(1), text("alice"), text("pen"), Value::Int(2)],
            vec![Value::Int(2), text("alice"), text("ink"), Value::Int(2)],
        ]
    );
    let again = f.sync_ok(request("old", "alice", 0, 3, vec![])).await;
    let orders = download(&again, "orders", &["id"]).expect("orders come down");
    assert_eq!(orders.columns, remaining);

    let new = f
        .sync_ok(versioned("v2", request("new", "alice", 0, 1, vec![])))
        .await;
    assert_eq!(upserts_of(&new, "orders", &remaining, &["id"]).len(), 2);
    let error = f
        .sync(versioned(
            "v2",
            request(
                "new",
                "alice",
                new.watermark,
                2,
                vec![orders_upload(
                    vec![order(3, "alice", "cup", 1, None)],
                    vec![],
                    vec![],
                )],
            ),
        ))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("amount"), "{error}");
}

/// A table initialized after clients use v1 goes into v2, which starts as a copy of v1:
/// v2 clients sync both tables, v1 clients keep syncing the first and never see the new.
pub async fn a_new_table_goes_into_a_new_version_holding_every_table<F: Factory>() {
    let pen = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&pen)).await;
    f.sync_ok(request("old", "alice", 0, 1, vec![])).await;
    f.sql.execute(LINES_DDL).await;
    let line_one = line(1, 1, "alice", 5);
    f.insert_rows(
        "order_lines",
        &LINE_COLUMNS,
        std::slice::from_ref(&line_one),
    )
    .await;
    let refused = f.init("order_lines", "rep").await.unwrap_err().to_string();
    assert!(
        refused.contains("order_lines") && refused.contains("in use"),
        "{refused}"
    );
    let outcome = init_derived(&mut f, "order_lines")
        .await
        .expect("init lines");
    assert_eq!(outcome.script_version, "v2");

    let new = f
        .sync_ok(versioned("v2", request("new", "alice", 0, 1, vec![])))
        .await;
    assert_eq!(order_upserts(&new), vec![pen.clone()]);
    assert_eq!(line_upserts(&new), vec![line_one]);
    let old = f.sync_ok(request("old", "alice", 0, 2, vec![])).await;
    assert_eq!(order_upserts(&old), vec![pen]);
    assert!(download(&old, "order_lines", &["order_id", "line"]).is_none());
    // Running init again with nothing changed keeps v2.
    let again = init_derived(&mut f, "order_lines")
        .await
        .expect("init again");
    assert_eq!(
        (again.script_version.as_str(), again.created),
        ("v2", false)
    );
}

/// A column and a key widened in place (`INTEGER` to `BIGINT`): `init` run again keeps
/// the version (its columns are the same), and values past the old range sync both ways,
/// deletes of wide keys included. Skipped where the database cannot change a type.
pub async fn a_widened_type_syncs_values_past_its_old_range<F: Factory>() {
    let Some(widen) = F::widen_to_bigint("orders", &["id", "quantity"]) else {
        return;
    };
    let mut f = Fixture::<F>::with_orders(&[order(1, "alice", "pen", 1, None)]).await;
    let first = f.sync_ok(request("old", "alice", 0, 1, vec![])).await;
    f.sql.execute(&widen).await;
    let outcome = init_derived(&mut f, "orders").await.expect("init again");
    assert_eq!(
        (outcome.script_version.as_str(), outcome.created),
        ("v1", false)
    );
    let big = 5_000_000_000_i64;
    let wide = order(big, "alice", "crate", big, None);
    f.sync_ok(request(
        "old",
        "alice",
        first.watermark,
        2,
        vec![orders_upload(vec![wide.clone()], vec![], vec![])],
    ))
    .await;
    assert_eq!(f.orders().await[1], wide);
    let other = f.sync_ok(request("other", "alice", 0, 1, vec![])).await;
    assert!(order_upserts(&other).contains(&wide));
    f.sql
        .execute(&format!("DELETE FROM orders WHERE id = {big}"))
        .await;
    let after = f
        .sync_ok(request("other", "alice", other.watermark, 2, vec![]))
        .await;
    assert_eq!(order_deletes(&after), vec![key(&[big])]);
}

/// A connection that keeps table shapes across syncs (PostgreSQL) reads a table's new
/// shape after `ALTER TABLE`, made with no `init` in between: a wide value that only
/// the new type takes syncs on the same connection. Skipped where the database cannot
/// change a type.
pub async fn a_connection_reused_across_alter_table_uses_the_new_shape<F: Factory>() {
    let Some(widen) = F::widen_to_bigint("orders", &["quantity"]) else {
        return;
    };
    let mut f = Fixture::<F>::with_orders(&[order(1, "alice", "pen", 1, None)]).await;
    let mut connection = f.backend.connect().await.expect("connect");
    let first = sync_on(&mut connection, request("old", "alice", 0, 1, vec![])).await;
    let ink = order(2, "alice", "ink", 2, None);
    let second = sync_on(
        &mut connection,
        request(
            "old",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(vec![ink], vec![], vec![])],
        ),
    )
    .await;
    f.sql.execute(&widen).await;
    let wide = order(3, "alice", "crate", 5_000_000_000, None);
    sync_on(
        &mut connection,
        request(
            "old",
            "alice",
            second.watermark,
            3,
            vec![orders_upload(vec![wide.clone()], vec![], vec![])],
        ),
    )
    .await;
    assert_eq!(f.orders().await[2], wide);
}

async fn sync_on<C: ConsolidatedConnection>(
    connection: &mut C,
    request: SyncRequest,
) -> CollectedSync {
    sync_and_collect(connection, Arc::new(request))
        .await
        .expect("sync on the reused connection")
}
