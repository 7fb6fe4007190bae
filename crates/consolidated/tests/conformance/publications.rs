//! Syncs of some tables (publications, priorities; protocol v9): the client names the
//! tables a sync covers and the watermark each table was last downloaded to.

use rowsync_protocol::{SyncTables, TableWatermark};

use super::*;

/// `tables` with their watermarks, covering only those (`only_these`) or all.
fn tables(only_these: bool, named: &[(&str, i64)]) -> SyncTables {
    SyncTables {
        only_these,
        watermarks: named
            .iter()
            .map(|&(table, last_download)| TableWatermark {
                table: table.into(),
                last_download,
            })
            .collect(),
    }
}

fn covering(mut request: SyncRequest, sync_tables: SyncTables) -> SyncRequest {
    request.sync_tables = sync_tables;
    request
}

/// A sync of `orders` alone brings only its changes; a later sync of every table with
/// `orders` at its own watermark brings the rest, and a delete of a row changed on the
/// server that the first sync brought is no conflict: each table is judged by its own
/// watermark.
pub async fn a_sync_of_some_tables_moves_only_those_each_from_its_watermark<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&one)).await;
    f.create_and_init_lines(&[line(1, 1, "alice", 5)]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("UPDATE orders SET quantity = 2 WHERE id = 1")
        .await;
    f.sql
        .execute("UPDATE order_lines SET qty = 6 WHERE order_id = 1")
        .await;
    let server_one = order(1, "alice", "pen", 2, None);

    let some = f
        .sync_ok(covering(
            request("alice-1", "alice", first.watermark, 2, vec![]),
            tables(true, &[("orders", first.watermark)]),
        ))
        .await;
    assert_eq!(order_upserts(&some), vec![server_one.clone()]);
    assert!(
        download(&some, "order_lines", &["order_id", "line"]).is_none(),
        "a sync of orders alone sends nothing of order_lines"
    );

    // A delete lands only on a row the client has seen since it last changed.
    let all = f
        .sync_ok(covering(
            request(
                "alice-1",
                "alice",
                first.watermark,
                3,
                vec![orders_upload(vec![], vec![], vec![key(&[1])])],
            ),
            tables(false, &[("orders", some.watermark)]),
        ))
        .await;
    assert_summary(&all, 1, 0, false);
    assert_eq!(f.orders().await, Vec::<Row>::new());
    assert_eq!(line_upserts(&all), vec![line(1, 1, "alice", 6)]);
}

/// Judged by the sync's watermark instead, the same delete is a conflict the server
/// wins: what the table's own watermark prevents above.
pub async fn without_its_table_watermark_the_same_delete_is_a_conflict<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&one)).await;
    f.create_and_init_lines(&[]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("UPDATE orders SET quantity = 2 WHERE id = 1")
        .await;
    let server_one = order(1, "alice", "pen", 2, None);
    f.sync_ok(covering(
        request("alice-1", "alice", first.watermark, 2, vec![]),
        tables(true, &[("orders", first.watermark)]),
    ))
    .await;
    let all = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            3,
            vec![orders_upload(vec![], vec![], vec![key(&[1])])],
        ))
        .await;
    assert_summary(&all, 1, 1, false);
    assert_eq!(f.orders().await, vec![server_one]);
}

/// A sync naming a table its version does not have, or uploading a table outside the
/// tables it covers, is refused by name with nothing applied.
pub async fn a_sync_outside_its_tables_is_refused_by_name<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&one)).await;
    f.create_and_init_lines(&[]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;

    let unknown = f
        .sync(covering(
            request("alice-1", "alice", first.watermark, 2, vec![]),
            tables(true, &[("invoices", first.watermark)]),
        ))
        .await
        .expect_err("a sync of a table the version does not have");
    assert!(
        unknown.to_string().contains("\"invoices\""),
        "the refusal names the table: {unknown}"
    );

    let two = order(2, "alice", "ink", 1, None);
    let outside = f
        .sync(covering(
            request(
                "alice-1",
                "alice",
                first.watermark,
                2,
                vec![
                    orders_upload(vec![two], vec![], vec![]),
                    lines_upload(vec![line(2, 1, "alice", 1)], vec![], vec![]),
                ],
            ),
            tables(true, &[("orders", first.watermark)]),
        ))
        .await
        .expect_err("an upload outside the sync's tables");
    assert!(
        outside.to_string().contains("\"order_lines\""),
        "the refusal names the table: {outside}"
    );
    assert_eq!(f.orders().await, vec![one], "nothing of it applied");
    assert_eq!(f.lines().await, Vec::<Row>::new());
}
