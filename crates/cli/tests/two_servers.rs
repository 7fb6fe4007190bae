//! One client syncing through two `rowsync serve` processes on one PostgreSQL database
//! at once (issue 38): exactly one sync proceeds, the other is told that a sync of the
//! client is running (code 8) and applies nothing; its retry finds the upload applied
//! once.

mod support;

use std::path::Path;

use rowsync_client::Client;
use rowsync_protocol::ErrorCode;
use support::{postgres_notes, serve, NOTES_DDL as NOTES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_syncing_through_two_servers_at_once_is_applied_once() {
    let (url, admin) = postgres_notes("two_servers", "a-long-password").await;
    // Each sync holds the client's lock for a while: the second arrives meanwhile.
    admin
        .batch_execute(
            "INSERT INTO rs_script (script_version, table_name, event, script)
             VALUES ('v1', '', 'begin_synchronization', 'SELECT 1 FROM pg_sleep(1.5)')",
        )
        .await
        .unwrap();
    let (first, second) = (serve(Path::new(&url), &[]), serve(Path::new(&url), &[]));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("erin.db");
    let mut phone = Client::open(&path).unwrap();
    phone.connection().execute_batch(NOTES).unwrap();
    phone.track("notes").unwrap();
    phone
        .connection()
        .execute("INSERT INTO notes VALUES (7, 'erin', 'written once')", [])
        .unwrap();
    // The same client database, a second handle: as an app retrying on another server
    // while its first attempt still runs.
    let mut again = Client::open(&path).unwrap();
    let options =
        |address: &str| rowsync_client::SyncOptions::new(address, "erin", "a-long-password");
    let (through_first, through_second) = (options(&first.address), options(&second.address));
    let slow = tokio::spawn(async move { phone.sync(&through_first).await.map(|_| phone) });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    match again.sync(&through_second).await {
        Err(error) => assert_eq!(
            error.server_code(),
            Some(ErrorCode::AlreadySynchronizing),
            "{error}"
        ),
        Ok(report) => panic!("two syncs of one client ran at once: {report:?}"),
    }
    let phone = slow.await.unwrap().expect("the first sync proceeds");
    let retried = again.sync(&through_second).await.unwrap();
    assert_eq!(
        retried.rows_uploaded, 0,
        "acknowledged already: nothing to send"
    );
    let rows = admin
        .query("SELECT id, body FROM notes WHERE owner = 'erin'", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(1), "written once");
    drop((phone, first, second));
}
