//! What a sync reports against a real server: the rows that conflicted with the server's
//! winning rows, and progress that ends where the report does.

mod support;

use rowsync_client::SyncProgress;
use rowsync_protocol::Value;
use support::TestServer;

fn text(value: &str) -> Value {
    Value::Text(value.into())
}

#[tokio::test]
async fn conflicts_are_reported_by_table_key_and_the_servers_winning_row() {
    let server = TestServer::start(4).await;
    let mut first = server.client("first");
    let mut second = server.client("second");
    first.sync(&server.options()).await.unwrap();
    second.sync(&server.options()).await.unwrap();
    first
        .connection()
        .execute_batch(
            "UPDATE orders SET quantity = 100 WHERE id = 'seed-0';
             DELETE FROM orders WHERE id = 'seed-1';",
        )
        .unwrap();
    let report = first.sync(&server.options()).await.unwrap();
    assert_eq!((report.conflicts, report.conflicted_rows.len()), (0, 0));
    // The second client changes both rows from images the server no longer has, and
    // one row nobody else touched.
    second
        .connection()
        .execute_batch(
            "UPDATE orders SET quantity = 200 WHERE id = 'seed-0';
             UPDATE orders SET item = 'mine' WHERE id = 'seed-1';
             UPDATE orders SET item = 'mine' WHERE id = 'seed-2';",
        )
        .unwrap();
    let report = second.sync(&server.options()).await.unwrap();
    assert_eq!(report.conflicts, 2, "{report:?}");
    let mut conflicted = report.conflicted_rows.clone();
    conflicted.sort_by(|a, b| format!("{:?}", a.key).cmp(&format!("{:?}", b.key)));
    assert_eq!(conflicted.len(), 2, "{conflicted:?}");
    assert_eq!(conflicted[0].table, "orders");
    assert_eq!(conflicted[0].key_columns, vec!["id".to_string()]);
    assert_eq!(conflicted[0].key, vec![text("seed-0")]);
    let winner = conflicted[0].server_row.clone().expect("the server's row");
    let quantity = conflicted[0]
        .columns
        .iter()
        .position(|c| c == "quantity")
        .unwrap();
    assert_eq!(
        winner[quantity],
        Value::Int(100),
        "the first client's row won"
    );
    assert_eq!(conflicted[1].key, vec![text("seed-1")]);
    assert_eq!(conflicted[1].server_row, None, "the server deleted it");
    server.stop().await;
}

#[tokio::test]
async fn progress_counts_up_to_what_the_report_says() {
    let server = TestServer::start(50_000).await;
    let mut client = server.client("app");
    {
        let transaction = client.connection().unchecked_transaction().unwrap();
        for n in 0..3000 {
            transaction
                .execute(
                    "INSERT INTO orders VALUES (?1, 'alice', 'local', ?2)",
                    rusqlite::params![format!("local-{n}"), n],
                )
                .unwrap();
        }
        transaction.commit().unwrap();
    }
    let mut seen: Vec<SyncProgress> = Vec::new();
    let report = client
        .sync_with_progress(&server.options(), &mut |progress| seen.push(*progress))
        .await
        .unwrap();
    assert_eq!(
        (report.rows_uploaded, report.rows_downloaded),
        (3000, 50_000)
    );
    assert!(seen.len() >= 3, "{seen:?}");
    for pair in seen.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(b.bytes_sent >= a.bytes_sent && b.bytes_received >= a.bytes_received);
        assert!(b.rows_downloaded >= a.rows_downloaded && b.rows_uploaded >= a.rows_uploaded);
    }
    let last = *seen.last().unwrap();
    assert_eq!(last.rows_to_upload, 3000);
    assert_eq!(last.rows_uploaded, 3000);
    assert_eq!(last.rows_downloaded, 50_000);
    assert_eq!(last.bytes_sent, report.wire.sent);
    assert!(last.bytes_received > 0 && last.bytes_received <= report.wire.received);
    assert!(
        seen.iter()
            .any(|p| p.rows_downloaded > 0 && p.rows_downloaded < 50_000),
        "the download is applied in steps, not at the end: {seen:?}"
    );
    // An upload with nothing to download still ends with its rows counted.
    client
        .connection()
        .execute("UPDATE orders SET quantity = -1 WHERE id = 'local-7'", [])
        .unwrap();
    let mut last = None;
    let report = client
        .sync_with_progress(&server.options(), &mut |progress| last = Some(*progress))
        .await
        .unwrap();
    assert_eq!((report.rows_uploaded, report.rows_downloaded), (1, 0));
    let last = last.unwrap();
    assert_eq!((last.rows_uploaded, last.rows_to_upload), (1, 1));
    assert_eq!(last.bytes_received, report.wire.received);
    server.stop().await;
}
