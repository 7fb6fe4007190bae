//! The monitor's history of ended syncs in the consolidated database.

use rowsync_consolidated::{ConsolidatedConnection, HistoryRecord};

use super::{Factory, Fixture, RawSql};

fn record(n: i64, user: Option<&str>) -> HistoryRecord {
    HistoryRecord {
        ended_unix_ms: 1_700_000_000_000 + n,
        user: user.map(str::to_string),
        outcome: if n % 2 == 0 { "ok" } else { "refused" }.to_string(),
        record: format!(r#"{{"id":{n},"error":"naïve 'quoted' \\ text"}}"#),
    }
}

pub async fn the_sync_history_keeps_its_newest_rows_in_order<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    assert_eq!(f.admin.sync_history(10).await.unwrap(), vec![]);
    let first = vec![
        record(1, Some("o'brien")),
        record(2, None),
        record(3, Some("alice")),
    ];
    f.admin.append_sync_history(&first, 4).await.unwrap();
    let second = vec![record(4, Some("bob")), record(5, Some("alice"))];
    f.admin.append_sync_history(&second, 4).await.unwrap();

    let kept: Vec<HistoryRecord> = first[1..].iter().chain(&second).cloned().collect();
    assert_eq!(
        f.admin.sync_history(10).await.unwrap(),
        kept,
        "the newest 4 of 5, oldest first, values as written"
    );
    assert_eq!(f.admin.sync_history(2).await.unwrap(), second);
    let stored = f
        .sql
        .query_rows("SELECT count(*) FROM rs_sync_history")
        .await;
    assert_eq!(stored, vec![vec![rowsync_protocol::Value::Int(4)]]);
}
