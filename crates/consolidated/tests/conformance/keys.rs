//! Key ranges for rows made offline (`rowsync keys`, protocol v7): the key space split
//! once, the `key_range` script handing out consecutive ranges only to clients that run
//! low, none past the clients' part, and keys that cannot have ranges refused by name.

use rowsync_consolidated::{
    key_range_script, ConsolidatedConnection, KeyRangeInit, KeySpace, SyncRequest,
};
use rowsync_protocol::{KeyRange, Value};

use super::{request, Factory, Fixture, RawSql};

fn init(table: &str, column: Option<&str>) -> KeyRangeInit {
    KeyRangeInit {
        table: table.into(),
        column: column.map(str::to_string),
        script_version: "v1".into(),
        range_keys: 1000,
    }
}

fn holding(client_id: &str, held: Vec<KeyRange>) -> SyncRequest {
    SyncRequest {
        key_ranges: Some(held),
        ..request(client_id, "alice", 0, 1, vec![])
    }
}

fn range(start: i64, end: i64, next: i64) -> KeyRange {
    KeyRange {
        table: "parts".into(),
        start,
        end,
        next,
    }
}

pub async fn key_ranges_are_handed_out_in_turn_from_a_split_made_once<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    f.sql
        .execute("CREATE TABLE parts (id BIGINT PRIMARY KEY, rep TEXT NOT NULL)")
        .await;
    f.sql
        .execute("INSERT INTO parts VALUES (7, 'alice'), (500, 'alice')")
        .await;
    f.init("parts", "rep").await.unwrap();
    let space = f.admin.init_key_ranges(&init("parts", None)).await.unwrap();
    assert_eq!(
        (
            space.key_column.as_str(),
            space.space_start,
            space.generator.is_none()
        ),
        ("id", 501, true),
        "{space:?}"
    );
    assert!(space.space_end > 1_000_000_000, "{space:?}");
    let again = f.admin.init_key_ranges(&init("parts", None)).await.unwrap();
    assert_eq!(
        again,
        KeySpace {
            existed: true,
            generator: None,
            ..space.clone()
        }
    );
    f.admin
        .set_script(&key_range_script(&init("parts", None)))
        .await
        .unwrap();

    let first = f.sync_ok(holding("a", vec![])).await.key_ranges;
    assert_eq!(first, [range(501, 1501, 501)]);
    let second = f.sync_ok(holding("b", vec![])).await.key_ranges;
    assert_eq!(second, [range(1501, 2501, 1501)]);
    let half_left = f.sync_ok(holding("a", vec![range(501, 1501, 1001)])).await;
    assert_eq!(half_left.key_ranges, [], "half a range left is enough");
    let running_low = f.sync_ok(holding("a", vec![range(501, 1501, 1002)])).await;
    assert_eq!(running_low.key_ranges, [range(2501, 3501, 2501)]);
    let older_client = f.sync_ok(request("c", "alice", 0, 1, vec![])).await;
    assert_eq!(
        older_client.key_ranges,
        [],
        "no ranges for protocol 6 and older"
    );
    let recorded = f
        .sql
        .query_rows("SELECT client_id, range_start FROM rs_key_range ORDER BY range_start")
        .await;
    let client = |id: &str, start: i64| vec![Value::Text(id.into()), Value::Int(start)];
    assert_eq!(
        recorded,
        [client("a", 501), client("b", 1501), client("a", 2501)]
    );

    // The clients' part used up: the script hands out nothing, and the sync goes on.
    f.sql
        .execute("UPDATE rs_key_space SET space_end = 3600 WHERE table_name = 'parts'")
        .await;
    let used_up = f.sync_ok(holding("d", vec![])).await;
    assert_eq!(used_up.key_ranges, []);
}

pub async fn keys_that_cannot_have_ranges_are_refused_by_name<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    f.sql
        .execute("CREATE TABLE labels (name VARCHAR(40) PRIMARY KEY, rep TEXT)")
        .await;
    f.sql
        .execute(
            "CREATE TABLE visits (site VARCHAR(40), n BIGINT, rep TEXT, PRIMARY KEY (site, n))",
        )
        .await;
    let text_key = f
        .admin
        .init_key_ranges(&init("labels", None))
        .await
        .unwrap_err();
    assert!(
        text_key.to_string().contains("\"labels\"") && text_key.to_string().contains("of type"),
        "{text_key}"
    );
    let two_columns = f
        .admin
        .init_key_ranges(&init("visits", None))
        .await
        .unwrap_err();
    assert!(
        two_columns.to_string().contains("site, n") && two_columns.to_string().contains("--column"),
        "{two_columns}"
    );
    let named = f
        .admin
        .init_key_ranges(&init("visits", Some("n")))
        .await
        .unwrap();
    assert_eq!((named.key_column.as_str(), named.space_start), ("n", 1));
    let spaces = f
        .sql
        .query_rows("SELECT table_name FROM rs_key_space")
        .await;
    assert_eq!(
        spaces,
        [vec![Value::Text("visits".into())]],
        "a refusal records nothing"
    );
}
