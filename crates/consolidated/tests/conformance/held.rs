//! Uploads held for resumption (`rs_held_upload`): what a cut connection left, found by
//! client and transfer, bounded in all, replaced, released and expired.

use rowsync_consolidated::{ConsolidatedConnection, HeldUpload, HELD_UPLOAD_PART_BYTES};

use super::{Factory, Fixture, RawSql};

fn held(client_id: &str, transfer_id: &str, bytes: &[u8], created_unix_ms: i64) -> HeldUpload {
    HeldUpload {
        client_id: client_id.to_string(),
        user: "o'brien".to_string(),
        transfer_id: transfer_id.to_string(),
        length: bytes.len() as u64,
        sha256: (0u8..32).collect(),
        created_unix_ms,
    }
}

/// Bytes of every value 0-255, more than two parts long.
fn stream(length: usize) -> Vec<u8> {
    (0..length).map(|n| (n * 7 % 256) as u8).collect()
}

pub async fn a_held_upload_is_found_whole_in_parts_and_by_its_transfer_only<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let bytes = stream(2 * HELD_UPLOAD_PART_BYTES + 1234);
    let first = held("c1", "t1", &bytes, 1_000);
    assert!(f.admin.hold_upload(&first, &bytes, u64::MAX).await.unwrap());
    assert_eq!(f.admin.held_upload("c1", "t1").await.unwrap(), Some(first));
    assert_eq!(f.admin.held_upload("c1", "other").await.unwrap(), None);
    assert_eq!(f.admin.held_upload("c2", "t1").await.unwrap(), None);
    let all = f
        .admin
        .held_upload_bytes("c1", "t1", u64::MAX)
        .await
        .unwrap();
    assert!(all == bytes, "every byte back, in order");
    let prefix = f
        .admin
        .held_upload_bytes("c1", "t1", HELD_UPLOAD_PART_BYTES as u64 + 5)
        .await
        .unwrap();
    assert!(
        prefix == bytes[..HELD_UPLOAD_PART_BYTES + 5],
        "a prefix across parts"
    );
    assert!(f
        .admin
        .held_upload_bytes("c1", "other", 10)
        .await
        .unwrap()
        .is_empty());

    // A client holds one transfer: another replaces it, parts and all.
    let again = stream(10);
    let second = held("c1", "t2", &again, 2_000);
    assert!(f
        .admin
        .hold_upload(&second, &again, u64::MAX)
        .await
        .unwrap());
    assert_eq!(f.admin.held_upload("c1", "t1").await.unwrap(), None);
    assert_eq!(
        f.admin.held_upload_bytes("c1", "t2", 100).await.unwrap(),
        again
    );
    let parts = f
        .sql
        .query_rows("SELECT count(*) FROM rs_held_upload_part")
        .await;
    assert_eq!(parts, vec![vec![rowsync_protocol::Value::Int(1)]]);

    assert!(f.admin.release_held_upload("c1", "t2").await.unwrap());
    assert!(!f.admin.release_held_upload("c1", "t2").await.unwrap());
    assert_eq!(f.admin.held_upload("c1", "t2").await.unwrap(), None);
}

pub async fn held_uploads_stay_within_their_bound_and_expire<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let bytes = stream(600);
    assert!(f
        .admin
        .hold_upload(&held("a", "ta", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    // 600 + 600 > 1000: nothing of b is held.
    assert!(!f
        .admin
        .hold_upload(&held("b", "tb", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    assert_eq!(f.admin.held_upload("b", "tb").await.unwrap(), None);
    // a replacing its own transfer counts without its old one.
    assert!(f
        .admin
        .hold_upload(&held("a", "ta2", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    let small = stream(300);
    assert!(f
        .admin
        .hold_upload(&held("b", "tb", &small, 5_000), &small, 1_000)
        .await
        .unwrap());

    assert_eq!(f.admin.expire_held_uploads(1_000).await.unwrap(), 0);
    assert_eq!(f.admin.expire_held_uploads(1_001).await.unwrap(), 1);
    assert_eq!(f.admin.held_upload("a", "ta2").await.unwrap(), None);
    assert!(f.admin.held_upload("b", "tb").await.unwrap().is_some());
    let parts = f
        .sql
        .query_rows("SELECT count(*) FROM rs_held_upload_part")
        .await;
    assert_eq!(parts, vec![vec![rowsync_protocol::Value::Int(1)]]);
}
