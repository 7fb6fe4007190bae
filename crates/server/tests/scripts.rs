//! Through a real server: every way to log in (built-in users, `authenticate_user`,
//! HS256 and RS256 tokens) and their refusals, download acknowledgement, script versions
//! side by side, scripts changed while the server runs, and script errors as clients
//! see them.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, EncodingKey, Header};
use rowsync_client::{ClientError, SyncOptions};
use rowsync_consolidated::sqlite::SqliteConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::{encode_frame, EndUpload, ErrorCode, Hello, Message, Value};
use rowsync_server::{ServerConfig, TokenConfig};
use serde::Serialize;
use support::*;

const HS256_SECRET: &[u8] = b"a shared secret of at least thirty-two bytes";
const RS256_PRIVATE: &str = include_str!("fixtures/jwt-rs256-private.pem");
const RS256_PUBLIC: &str = include_str!("fixtures/jwt-rs256-public.pem");
const RS256_OTHER_PRIVATE: &str = include_str!("fixtures/jwt-rs256-other-private.pem");

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    exp: u64,
    aud: &'a str,
    iss: &'a str,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims(sub: &str) -> Claims<'_> {
    Claims {
        sub,
        exp: now() + 600,
        aud: "rowsync-test",
        iss: "https://issuer.test",
    }
}

fn hs256(claims: &Claims) -> String {
    encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(HS256_SECRET),
    )
    .unwrap()
}

fn rs256(claims: &Claims, private_pem: &str) -> String {
    encode(
        &Header::new(jsonwebtoken::Algorithm::RS256),
        claims,
        &EncodingKey::from_rsa_pem(private_pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn token_config(hs256: bool, rs256: bool) -> ServerConfig {
    ServerConfig {
        tokens: TokenConfig {
            hs256_secret: hs256.then(|| HS256_SECRET.to_vec()),
            rs256_public_key_pem: rs256.then(|| RS256_PUBLIC.as_bytes().to_vec()),
            audience: Some("rowsync-test".into()),
            issuer: Some("https://issuer.test".into()),
            leeway_seconds: 0,
            jwks: None,
        },
        ..ServerConfig::default()
    }
}

fn with_token(server: &TestServer, user: &str, token: String) -> SyncOptions {
    let mut options = SyncOptions::new(server.address.to_string(), user, "");
    options.token = Some(token);
    options
}

fn refusal(result: Result<rowsync_client::SyncReport, ClientError>) -> String {
    match result {
        Err(ClientError::Server(error)) => {
            assert_eq!(
                error.error_code(),
                Some(ErrorCode::AuthenticationFailed),
                "{error}"
            );
            error.message
        }
        other => panic!("expected an authentication refusal, got {other:?}"),
    }
}

/// base64url without padding, for hand-made tokens.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, &b| (n << 8) | u32::from(b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// A token names its user, but a built-in user of that name who was disabled (or a user
/// the issuer knows and this server does not) is still the server's to refuse: a
/// disabled user's tokens are refused as its passwords are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_users_tokens_are_refused() {
    let server = TestServer::start_with(token_config(true, false)).await;
    let backend = SqliteConsolidated::new(&server.consolidated_path);
    let mut admin = backend.connect().await.unwrap();
    assert!(admin.set_user_disabled("alice", true).await.unwrap());
    let mut client = server.client("alice-token");
    match client
        .sync(&with_token(&server, "", hs256(&claims("alice"))))
        .await
    {
        Err(ClientError::Server(error)) => {
            assert_eq!(error.error_code(), Some(ErrorCode::AuthenticationFailed));
            assert!(error.message.contains("disabled"), "{}", error.message);
        }
        other => panic!("a disabled user's token logged in: {other:?}"),
    }
    let mut carol = server.client("carol-token");
    carol
        .sync(&with_token(&server, "", hs256(&claims("carol"))))
        .await
        .expect("a user the issuer vouches for needs no built-in user");
    assert!(admin.set_user_disabled("alice", false).await.unwrap());
    client
        .sync(&with_token(&server, "", hs256(&claims("alice"))))
        .await
        .expect("enabled again");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_log_in_as_their_subject_and_bad_tokens_are_refused() {
    let server = TestServer::start_with(token_config(true, true)).await;
    let mut client = server.client("alice-token");
    let report = client
        .sync(&with_token(&server, "", hs256(&claims("alice"))))
        .await
        .expect("an HS256 token logs in");
    assert_eq!(report.rows_downloaded, 2, "alice's two seeded rows");
    let mut client = server.client("alice-rsa");
    client
        .sync(&with_token(
            &server,
            "alice",
            rs256(&claims("alice"), RS256_PRIVATE),
        ))
        .await
        .expect("an RS256 token logs in, naming the same user");

    let mut client = server.client("refused");
    let mut expired = claims("alice");
    expired.exp = now() - 120;
    let mut wrong_audience = claims("alice");
    wrong_audience.aud = "someone-else";
    let mut wrong_issuer = claims("alice");
    wrong_issuer.iss = "https://evil.test";
    let unsigned = format!(
        "{}.{}.",
        base64url(br#"{"alg":"none","typ":"JWT"}"#),
        base64url(
            format!(
                r#"{{"sub":"alice","exp":{},"aud":"rowsync-test","iss":"https://issuer.test"}}"#,
                now() + 600
            )
            .as_bytes()
        )
    );
    let mut tampered = hs256(&claims("bob"));
    let payload_start = tampered.find('.').unwrap() + 1;
    let payload_end = tampered.rfind('.').unwrap();
    let forged_payload = base64url(
        format!(
            r#"{{"sub":"alice","exp":{},"aud":"rowsync-test","iss":"https://issuer.test"}}"#,
            now() + 600
        )
        .as_bytes(),
    );
    tampered.replace_range(payload_start..payload_end, &forged_payload);
    let cases = [
        ("expired", hs256(&expired), "alice", "ExpiredSignature"),
        (
            "wrong audience",
            hs256(&wrong_audience),
            "alice",
            "InvalidAudience",
        ),
        (
            "wrong issuer",
            hs256(&wrong_issuer),
            "alice",
            "InvalidIssuer",
        ),
        ("alg none", unsigned, "alice", "header is not valid"),
        ("forged payload", tampered, "alice", "InvalidSignature"),
        (
            "unknown signer",
            rs256(&claims("alice"), RS256_OTHER_PRIVATE),
            "alice",
            "InvalidSignature",
        ),
        (
            "another user named",
            hs256(&claims("bob")),
            "alice",
            "token was issued to \"bob\"",
        ),
        (
            "not a token",
            "garbage".to_string(),
            "alice",
            "header is not valid",
        ),
    ];
    for (case, token, user, expected) in cases {
        let message = refusal(client.sync(&with_token(&server, user, token)).await);
        assert!(message.contains(expected), "{case}: {message}");
    }
    // A token's user is its subject: the refused client never synced as anyone.
    let subscriptions: i64 = server
        .consolidated()
        .query_row("SELECT count(*) FROM rs_subscription", [], |row| row.get(0))
        .unwrap();
    assert_eq!(subscriptions, 2);
    server.stop().await;

    // Algorithm confusion: an HS256 token keyed with the RSA public key is refused by a
    // server that accepts RS256 only.
    let server = TestServer::start_with(token_config(false, true)).await;
    let confused = encode(
        &Header::new(jsonwebtoken::Algorithm::HS256),
        &claims("alice"),
        &EncodingKey::from_secret(RS256_PUBLIC.as_bytes()),
    )
    .unwrap();
    let mut client = server.client("confused");
    let message = refusal(client.sync(&with_token(&server, "", confused)).await);
    assert!(message.contains("HS256 are not accepted"), "{message}");
    server.stop().await;

    // Without configured keys no token is accepted.
    let server = TestServer::start().await;
    let mut client = server.client("no-keys");
    let message = refusal(
        client
            .sync(&with_token(&server, "", hs256(&claims("alice"))))
            .await,
    );
    assert!(message.contains("does not accept tokens"), "{message}");
    server.stop().await;
}

fn set_script(server: &TestServer, version: &str, table: &str, event: &str, script: &str) {
    server
        .consolidated()
        .execute(
            "INSERT INTO rs_script (script_version, table_name, event, script) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (script_version, table_name, event) DO UPDATE SET script = excluded.script",
            rusqlite::params![version, table, event, script],
        )
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_user_script_replaces_built_in_users() {
    let server = TestServer::start().await;
    server
        .consolidated()
        .execute_batch(
            "CREATE TABLE device (user_name TEXT, site TEXT, pin TEXT);
             INSERT INTO device VALUES ('carol', 'site-9', '2468');",
        )
        .unwrap();
    set_script(
        &server,
        "v1",
        "",
        "authenticate_user",
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM device WHERE user_name = :user AND site = :auth_1 AND pin = :password) \
         THEN 1000 ELSE 3000 END",
    );
    let mut options = SyncOptions::new(server.address.to_string(), "carol", "2468");
    options.auth_parameters = vec!["site-9".into()];
    let mut client = server.client("carol");
    client
        .sync(&options)
        .await
        .expect("the script admits carol");
    options.auth_parameters = vec!["site-1".into()];
    let message = refusal(client.sync(&options).await);
    assert!(
        message.contains("authenticate_user refused user \"carol\" (status 3000)"),
        "{message}"
    );
    // Built-in users no longer decide: alice's right password is refused by the script.
    let mut alice = server.client("alice");
    refusal(alice.sync(&server.options("alice")).await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_acknowledgement_advances_the_acknowledged_watermark_at_once() {
    let server = TestServer::start().await;
    server
        .consolidated()
        .execute_batch("CREATE TABLE acks (client_id TEXT, watermark INTEGER)")
        .unwrap();
    set_script(
        &server,
        "v1",
        "",
        "download_ack",
        "INSERT INTO acks VALUES (:client_id, :watermark)",
    );
    let acknowledged = |client_id: &str| -> i64 {
        server
            .consolidated()
            .query_row(
                "SELECT download_acknowledged FROM rs_subscription WHERE client_id = ?1",
                [client_id],
                |row| row.get(0),
            )
            .unwrap()
    };
    let mut plain = server.client("plain");
    let report = plain.sync(&server.options("alice")).await.unwrap();
    assert!(report.watermark > 0);
    assert_eq!(
        acknowledged(plain.client_id()),
        0,
        "off by default: known at the next hello"
    );

    let mut acking = server.client("acking");
    let mut options = server.options("alice");
    options.download_ack = true;
    let report = acking.sync(&options).await.unwrap();
    assert_eq!(acknowledged(acking.client_id()), report.watermark);
    let logged: Vec<(String, i64)> = server
        .consolidated()
        .prepare("SELECT client_id, watermark FROM acks")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        logged,
        vec![(acking.client_id().to_string(), report.watermark)]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_versions_serve_two_clients_at_once_and_script_changes_apply_without_restart() {
    let server = TestServer::start().await;
    {
        let consolidated = server.consolidated();
        consolidated
            .execute_batch(
                "INSERT INTO rs_script_version (name, description) VALUES ('v2', 'seeds hidden');
                 INSERT INTO rs_script (script_version, table_name, event, script)
                     SELECT 'v2', table_name, event, script FROM rs_script WHERE script_version = 'v1';",
            )
            .unwrap();
    }
    set_script(
        &server,
        "v2",
        "orders",
        "download_cursor",
        "SELECT id, rep, item, quantity FROM orders WHERE rep = :user AND item <> 'seed'",
    );
    set_script(
        &server,
        "v2",
        "orders",
        "upload_insert",
        "INSERT INTO orders (id, rep, item, quantity) VALUES (:new.id, :user, upper(:new.item), :new.quantity)",
    );
    let mut v1_client = server.client("v1-client");
    let mut v2_client = server.client("v2-client");
    let mut v2_options = server.options("bob");
    v2_options.script_version = "v2".into();
    let v1_options = server.options("bob");
    let (v1_report, v2_report) =
        tokio::join!(v1_client.sync(&v1_options), v2_client.sync(&v2_options));
    assert_eq!(v1_report.unwrap().rows_downloaded, 2);
    assert_eq!(v2_report.unwrap().rows_downloaded, 0, "v2 hides seeds");
    v2_client
        .connection()
        .execute("INSERT INTO orders VALUES ('b1', 'bob', 'bolt', 3)", [])
        .unwrap();
    v2_client.sync(&v2_options).await.unwrap();
    let bolt = server
        .consolidated_orders(Some("bob"))
        .into_iter()
        .find(|row| row[0] == Value::Text("b1".into()))
        .expect("b1 uploaded");
    assert_eq!(bolt[2], Value::Text("BOLT".into()), "v2's row script ran");
    // Changed while the server runs: the next sync uses it.
    set_script(
        &server,
        "v2",
        "orders",
        "download_cursor",
        "SELECT id, rep, item, quantity FROM orders WHERE rep = :user",
    );
    let mut late = server.client("v2-late");
    assert_eq!(late.sync(&v2_options).await.unwrap().rows_downloaded, 3);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_error_reaches_the_client_with_script_table_key_and_message() {
    let server = TestServer::start().await;
    set_script(
        &server,
        "v1",
        "orders",
        "upload_insert",
        "INSERT INTO orders (id, rep, item, quantity) VALUES (:new.id, :user, :new.item, CASE WHEN :new.quantity < 0 THEN NULL ELSE :new.quantity END)",
    );
    let before = server.snapshot();
    let mut client = server.client("alice");
    client
        .connection()
        .execute_batch(
            "INSERT INTO orders VALUES ('a1', 'alice', 'ok', 1); INSERT INTO orders VALUES ('a2', 'alice', 'bad', -1);",
        )
        .unwrap();
    // A client that sets no refused row aside gets the error with each row named.
    let options = SyncOptions {
        rejected_rows_max: 0,
        ..server.options("alice")
    };
    let error = client.sync(&options).await.unwrap_err();
    let ClientError::Server(error) = error else {
        panic!("expected the server's error, got {error:?}");
    };
    assert_eq!(error.error_code(), Some(ErrorCode::RowsRefused));
    for part in ["upload_insert", "\"orders\"", "('a2')", "NOT NULL"] {
        assert!(error.message.contains(part), "{part} in {}", error.message);
    }
    let named: Vec<_> = error
        .refused
        .iter()
        .map(|row| (&row.table, &row.key, row.code))
        .collect();
    assert_eq!(
        named,
        [(
            &"orders".to_string(),
            &vec![Value::Text("a2".into())],
            ErrorCode::Script as u16
        )]
    );
    let after = server.snapshot();
    assert_eq!(before, after, "nothing was applied");
    server.stop().await;
}

/// A raw sync logging in with a token, uploading `chunks` with upload sequence
/// `sequence`, compressed.
fn token_sync(token: &str, sequence: u64, chunks: &[Message]) -> Vec<u8> {
    token_sync_in(token, "v1", sequence, chunks)
}

fn token_sync_in(token: &str, version: &str, sequence: u64, chunks: &[Message]) -> Vec<u8> {
    let mut frames = encode_frame(&Message::Hello(Hello {
        protocol_version: 2, // raw frames: a v2 client, its upload right after the hello
        client_id: "raw-token".into(),
        user: String::new(),
        password: String::new(),
        script_version: version.into(),
        last_download_watermark: 0,
        token: token.into(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    }));
    for chunk in chunks {
        frames.extend(encode_frame(chunk));
    }
    frames.extend(encode_frame(&Message::EndUpload(EndUpload {
        upload_sequence: sequence,
    })));
    zstd_stream(&frames)
}

fn ends_well(replies: &[Message]) {
    assert!(
        matches!(replies.last(), Some(Message::EndDownload(_))),
        "{replies:?}"
    );
}

/// Issue 15, finding 4, for token logins (which never touch the database before the
/// worker): a table the version does not synchronize is refused as it arrives; the
/// version's tables are loaded once and cached, and loaded again (once) before a table
/// is refused, so a table added while the server runs is accepted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_logins_have_unknown_tables_refused_as_they_arrive_from_a_cached_list() {
    let server = TestServer::start_with(token_config(true, false)).await;
    let token = hs256(&claims("alice"));
    let loads = || server.metrics.version_tables_loads.get();
    let orders = orders_chunk("orders", "alice", 2);
    ends_well(
        &exchange_raw_open(
            &server,
            &token_sync(&token, 1, std::slice::from_ref(&orders)),
        )
        .await,
    );
    assert_eq!(loads(), 1, "loaded for the first upload of a table");
    ends_well(
        &exchange_raw_open(
            &server,
            &token_sync(&token, 2, std::slice::from_ref(&orders)),
        )
        .await,
    );
    assert_eq!(loads(), 1, "then taken from the cache");

    // An unknown table, followed by 4 MiB of a known one: refused as it arrives.
    let mut chunks = vec![orders_chunk("nosuch", "alice", 2)];
    chunks.extend((0..64).map(|_| orders_chunk("orders", "alice", 64)));
    let inflated_before = server.metrics.upload_decompressed_bytes.get();
    let replies = exchange_raw(&server, &token_sync(&token, 3, &chunks)).await;
    let [Message::Error(error)] = replies.as_slice() else {
        panic!("expected one error, got {replies:?}");
    };
    assert_eq!(error.error_code(), Some(ErrorCode::Schema), "{error}");
    assert!(
        error.message.contains("\"nosuch\" is not synchronized"),
        "{error}"
    );
    let inflated = server.metrics.upload_decompressed_bytes.get() - inflated_before;
    assert!(
        inflated < 16 * 1024,
        "{inflated} bytes inflated before the refusal"
    );
    assert_eq!(loads(), 2, "looked up once more before refusing");

    // A table added to the version while the server runs: the stale cache lacks it.
    let mut connection = SqliteConsolidated::new(&server.consolidated_path)
        .connect()
        .await
        .unwrap();
    connection
        .execute_sql(&TABLE_DDL.replace("orders", "returns"))
        .await
        .unwrap();
    connection
        .init_table(&TableInit {
            based_on: Some("v1".into()),
            ..TableInit::new("returns", "rep", "v2")
        })
        .await
        .unwrap();
    let returns = orders_chunk("returns", "alice", 2);
    ends_well(
        &exchange_raw_open(&server, &token_sync_in(&token, "v2", 3, &[returns, orders])).await,
    );
    assert_eq!(loads(), 3);
    server.stop().await;
}
