//! Session tokens (protocol v8): after a password login the server hands the client a
//! token, and the client's next syncs log in with it instead of the password check,
//! until the user is removed, disabled or given a new password, on any server of the
//! database. Each test shows the token at work by syncing with a wrong password: only
//! a token that holds lets that sync in.

mod support;

use std::time::Duration;

use rowsync_client::{Client, ClientError, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_protocol::ErrorCode;
use rowsync_server::{auth, ServerConfig};
use support::*;

fn wrong_password(options: &SyncOptions) -> SyncOptions {
    SyncOptions {
        password: "not-the-password".into(),
        ..options.clone()
    }
}

fn kept_tokens(client: &Client) -> i64 {
    client
        .connection()
        .query_row("SELECT count(*) FROM rs_client_login", [], |row| row.get(0))
        .unwrap()
}

/// A test server, alice's options, and her phone after a first sync by password.
async fn logged_in_phone() -> (TestServer, SyncOptions, Client) {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut phone = server.client("phone");
    phone.sync(&options).await.unwrap();
    (server, options, phone)
}

/// Replaces the session token `client` keeps by `token` (a copy from another client).
fn keep_token(client: &Client, token: &str) {
    client
        .connection()
        .execute("UPDATE rs_client_login SET token = ?1", [token])
        .unwrap();
}

async fn refusal(client: &mut Client, options: &SyncOptions) -> ErrorCode {
    match client.sync(options).await {
        Err(ClientError::Server(error)) => error.error_code().unwrap(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_password_login_the_next_syncs_need_no_password() {
    let server = TestServer::start().await;
    let options = server.options("alice");
    let mut phone = server.client("phone");
    assert_eq!(
        refusal(&mut phone, &wrong_password(&options)).await,
        ErrorCode::AuthenticationFailed,
        "no token yet: the password decides"
    );
    phone.sync(&options).await.unwrap();
    assert_eq!(kept_tokens(&phone), 1);
    phone
        .connection()
        .execute(
            "INSERT INTO orders VALUES ('alice-9', 'alice', 'pen', 1)",
            [],
        )
        .unwrap();
    let report = phone.sync(&wrong_password(&options)).await.unwrap();
    assert_eq!(report.rows_uploaded, 1);
    assert_eq!(server.consolidated_orders(Some("alice")).len(), 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_password_or_a_disabled_user_ends_the_token() {
    let (server, options, mut phone) = logged_in_phone().await;
    let backend = SqliteConsolidated::new(&server.consolidated_path);
    let mut admin = backend.connect().await.unwrap();
    let new_hash = auth::hash_password("alice-new-password").unwrap();
    admin.set_user("alice", &new_hash).await.unwrap();
    assert_eq!(
        refusal(&mut phone, &options).await,
        ErrorCode::AuthenticationFailed,
        "the old password no longer logs in, token or not"
    );
    assert_eq!(kept_tokens(&phone), 0, "a refused login forgets the token");
    let renewed = SyncOptions {
        password: "alice-new-password".into(),
        ..options.clone()
    };
    phone.sync(&renewed).await.unwrap();
    assert_eq!(kept_tokens(&phone), 1);
    admin.set_user_disabled("alice", true).await.unwrap();
    assert_eq!(
        refusal(&mut phone, &renewed).await,
        ErrorCode::AuthenticationFailed,
        "a disabled user's token does not hold"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_copied_to_another_client_or_user_does_not_hold() {
    let (server, options, phone) = logged_in_phone().await;
    let token: String = phone
        .connection()
        .query_row("SELECT token FROM rs_client_login", [], |row| row.get(0))
        .unwrap();
    let mut laptop = server.client("laptop");
    laptop.sync(&options).await.unwrap();
    keep_token(&laptop, &token);
    assert_eq!(
        refusal(&mut laptop, &wrong_password(&options)).await,
        ErrorCode::AuthenticationFailed,
        "another client id"
    );
    let mut other_user = server.client("bobs");
    let bob = server.options("bob");
    other_user.sync(&bob).await.unwrap();
    keep_token(&other_user, &token);
    assert_eq!(
        refusal(&mut other_user, &wrong_password(&bob)).await,
        ErrorCode::AuthenticationFailed,
        "another user"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_session_tokens_off_hands_out_none_and_takes_none() {
    let (server, options, mut phone) = logged_in_phone().await;
    assert_eq!(kept_tokens(&phone), 1);
    let off = ServerConfig {
        session_token_lifetime: Duration::ZERO,
        ..ServerConfig::default()
    };
    let (there, stop) = token_moved_to_second_server(&server, off, &options, &phone).await;
    assert_eq!(
        refusal(&mut phone, &wrong_password(&there)).await,
        ErrorCode::AuthenticationFailed
    );
    phone.sync(&there).await.unwrap();
    assert_eq!(kept_tokens(&phone), 0, "no token handed out");
    let _ = stop.send(());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_server_of_the_database_takes_the_token() {
    let (server, options, mut phone) = logged_in_phone().await;
    let config = ServerConfig::default();
    let (there, stop) = token_moved_to_second_server(&server, config, &options, &phone).await;
    phone.sync(&wrong_password(&there)).await.unwrap();
    let _ = stop.send(());
    server.stop().await;
}

/// A second server on the test server's database, `options` for it, and `phone`'s kept
/// token moved to its address (behind a load balancer both servers have one address).
async fn token_moved_to_second_server(
    server: &TestServer,
    config: ServerConfig,
    options: &SyncOptions,
    phone: &Client,
) -> (SyncOptions, tokio::sync::oneshot::Sender<()>) {
    let (address, stop) = second_server(server, config).await;
    let there = SyncOptions {
        address: address.to_string(),
        ..options.clone()
    };
    phone
        .connection()
        .execute("UPDATE rs_client_login SET server = ?1", [&there.address])
        .unwrap();
    (there, stop)
}
