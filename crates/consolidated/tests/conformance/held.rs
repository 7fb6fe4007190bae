//! Transfers held for resumption, in both directions (`rs_held_upload`,
//! `rs_held_download`): what a cut connection left, found by client and transfer,
//! bounded in all, replaced, released and expired; each direction apart from the other.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use rowsync_consolidated::{
    ConsolidatedConnection, Direction, HeldTransfer, HoldBounds, HELD_TRANSFER_PART_BYTES,
};

use super::{Factory, Fixture, RawSql};

fn held(client_id: &str, transfer_id: &str, bytes: &[u8], created_unix_ms: i64) -> HeldTransfer {
    HeldTransfer {
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

pub async fn a_held_transfer_is_found_whole_in_parts_and_by_its_transfer_only<F: Factory>() {
    for direction in Direction::ALL {
        found_whole_in_parts::<F>(direction).await;
    }
}

async fn found_whole_in_parts<F: Factory>(direction: Direction) {
    let mut f = Fixture::<F>::new().await;
    let (_, part_table) = direction.tables();
    let bytes = stream(2 * HELD_TRANSFER_PART_BYTES + 1234);
    let first = held("c1", "t1", &bytes, 1_000);
    assert!(f
        .admin
        .hold_transfer(direction, &first, &bytes, u64::MAX)
        .await
        .unwrap());
    assert_eq!(
        f.admin.held_transfer(direction, "c1", "t1").await.unwrap(),
        Some(first)
    );
    assert_eq!(
        f.admin
            .held_transfer(direction, "c1", "other")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        f.admin.held_transfer(direction, "c2", "t1").await.unwrap(),
        None
    );
    // A receipt names only its transfer: the client holding it is found by it.
    assert_eq!(
        f.admin
            .held_transfer_client(direction, "t1")
            .await
            .unwrap()
            .as_deref(),
        Some("c1")
    );
    assert_eq!(
        f.admin
            .held_transfer_client(direction, "other")
            .await
            .unwrap(),
        None
    );
    let all = f
        .admin
        .held_transfer_bytes(direction, "c1", "t1", u64::MAX)
        .await
        .unwrap();
    assert!(all == bytes, "every byte back, in order");
    let prefix = f
        .admin
        .held_transfer_bytes(direction, "c1", "t1", HELD_TRANSFER_PART_BYTES as u64 + 5)
        .await
        .unwrap();
    assert!(
        prefix == bytes[..HELD_TRANSFER_PART_BYTES + 5],
        "a prefix across parts"
    );
    assert!(f
        .admin
        .held_transfer_bytes(direction, "c1", "other", 10)
        .await
        .unwrap()
        .is_empty());

    // A client holds one transfer: another replaces it, parts and all.
    let again = stream(10);
    let second = held("c1", "t2", &again, 2_000);
    assert!(f
        .admin
        .hold_transfer(direction, &second, &again, u64::MAX)
        .await
        .unwrap());
    assert_eq!(
        f.admin.held_transfer(direction, "c1", "t1").await.unwrap(),
        None
    );
    assert_eq!(
        f.admin
            .held_transfer_bytes(direction, "c1", "t2", 100)
            .await
            .unwrap(),
        again
    );
    let parts = f
        .sql
        .query_rows(&format!("SELECT count(*) FROM {part_table}"))
        .await;
    assert_eq!(parts, vec![vec![rowsync_protocol::Value::Int(1)]]);

    assert!(f
        .admin
        .release_held_transfer(direction, "c1", "t2")
        .await
        .unwrap());
    assert!(!f
        .admin
        .release_held_transfer(direction, "c1", "t2")
        .await
        .unwrap());
    assert_eq!(
        f.admin.held_transfer(direction, "c1", "t2").await.unwrap(),
        None
    );
}

pub async fn held_transfers_stay_within_their_bound_and_expire<F: Factory>() {
    for direction in Direction::ALL {
        within_bound_and_expire::<F>(direction).await;
    }
}

async fn within_bound_and_expire<F: Factory>(direction: Direction) {
    let mut f = Fixture::<F>::new().await;
    let (_, part_table) = direction.tables();
    let bytes = stream(600);
    assert!(f
        .admin
        .hold_transfer(direction, &held("a", "ta", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    // 600 + 600 > 1000: nothing of b is held.
    assert!(!f
        .admin
        .hold_transfer(direction, &held("b", "tb", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    assert_eq!(
        f.admin.held_transfer(direction, "b", "tb").await.unwrap(),
        None
    );
    // a replacing its own transfer counts without its old one.
    assert!(f
        .admin
        .hold_transfer(direction, &held("a", "ta2", &bytes, 1_000), &bytes, 1_000)
        .await
        .unwrap());
    let small = stream(300);
    assert!(f
        .admin
        .hold_transfer(direction, &held("b", "tb", &small, 5_000), &small, 1_000)
        .await
        .unwrap());

    assert_eq!(
        f.admin
            .expire_held_transfers(direction, 1_000)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        f.admin
            .expire_held_transfers(direction, 1_001)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        f.admin.held_transfer(direction, "a", "ta2").await.unwrap(),
        None
    );
    assert!(f
        .admin
        .held_transfer(direction, "b", "tb")
        .await
        .unwrap()
        .is_some());
    let parts = f
        .sql
        .query_rows(&format!("SELECT count(*) FROM {part_table}"))
        .await;
    assert_eq!(parts, vec![vec![rowsync_protocol::Value::Int(1)]]);
}

/// A client holds an upload and a download at once (a cut upload of its next sync while
/// the last sync's download waits): each direction counts, releases and expires apart.
pub async fn held_uploads_and_downloads_of_a_client_are_apart<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let up = stream(700);
    let down = stream(900);
    let upload = held("c1", "t1", &up, 1_000);
    let download = held("c1", "t1", &down, 2_000);
    let admin = &mut f.admin;
    assert!(admin
        .hold_transfer(Direction::Upload, &upload, &up, 1_000)
        .await
        .unwrap());
    // The download's bound counts only downloads: 900 fits beside the upload's 700.
    assert!(admin
        .hold_transfer(Direction::Download, &download, &down, 1_000)
        .await
        .unwrap());
    for (direction, bytes) in [(Direction::Upload, &up), (Direction::Download, &down)] {
        let held = admin
            .held_transfer_bytes(direction, "c1", "t1", u64::MAX)
            .await
            .unwrap();
        assert!(held == *bytes, "{direction:?}");
    }
    assert!(admin
        .release_held_transfer(Direction::Upload, "c1", "t1")
        .await
        .unwrap());
    let still = admin
        .held_transfer(Direction::Download, "c1", "t1")
        .await
        .unwrap();
    assert_eq!(still, Some(download));
    assert!(admin
        .hold_transfer(Direction::Upload, &upload, &up, 1_000)
        .await
        .unwrap());
    // Expiring downloads leaves the upload, created earlier, alone.
    let expired = admin
        .expire_held_transfers(Direction::Download, 3_000)
        .await
        .unwrap();
    assert_eq!(expired, 1);
    let upload_left = admin
        .held_transfer(Direction::Upload, "c1", "t1")
        .await
        .unwrap();
    assert!(upload_left.is_some());
}

/// Issue 32, items 4 and 5: a user who held a transfer under another user's client id
/// replaced that user's held transfer; and one user could fill the whole bound. A held
/// transfer is replaced only by its own user, and each user's held bytes (as stored)
/// stay within the user's share.
pub async fn a_held_transfer_is_replaced_only_by_its_user_within_the_users_share<F: Factory>() {
    for direction in Direction::ALL {
        replaced_only_by_its_user::<F>(direction).await;
    }
}

async fn replaced_only_by_its_user<F: Factory>(direction: Direction) {
    let mut f = Fixture::<F>::new().await;
    let bytes = stream(600);
    let victim = held("c1", "t1", &bytes, 1_000);
    assert!(f
        .admin
        .hold_transfer(direction, &victim, &bytes, u64::MAX)
        .await
        .unwrap());
    let mallory = |client_id: &str, transfer_id: &str| HeldTransfer {
        user: "mallory".into(),
        ..held(client_id, transfer_id, &bytes, 2_000)
    };
    assert!(!f
        .admin
        .hold_transfer(direction, &mallory("c1", "t2"), &bytes, u64::MAX)
        .await
        .unwrap());
    assert_eq!(
        f.admin.held_transfer(direction, "c1", "t1").await.unwrap(),
        Some(victim.clone()),
        "the victim's transfer stays"
    );
    let share = HoldBounds {
        all_bytes_max: u64::MAX,
        user_bytes_max: 1_000,
    };
    assert!(f
        .admin
        .hold_transfer(direction, &mallory("c2", "t3"), &bytes, share)
        .await
        .unwrap());
    // 600 + 600 > 1000 for mallory: her second client's transfer is not held...
    assert!(!f
        .admin
        .hold_transfer(direction, &mallory("c3", "t4"), &bytes, share)
        .await
        .unwrap());
    // ...while another user's fits beside hers, and she replaces her own.
    let small = stream(300);
    assert!(f
        .admin
        .hold_transfer(direction, &held("c4", "t5", &small, 3_000), &small, share)
        .await
        .unwrap());
    assert!(f
        .admin
        .hold_transfer(direction, &mallory("c2", "t6"), &bytes, share)
        .await
        .unwrap());
}
