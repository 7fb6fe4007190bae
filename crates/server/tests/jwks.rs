//! Token logins against an issuer's key set served by a real HTTP server on loopback
//! (issue 35, item 5): the server finds the set by OpenID Connect discovery, checks
//! RS256, ES256 and EdDSA tokens made here with keys generated here, follows the issuer
//! rotating its keys while clients sync (a rotated-in key works at once, a retired one
//! is refused), fetches again for an unknown `kid` at most once per
//! `jwks_refresh_min_seconds`, and refuses a wrong issuer, a wrong audience and a token
//! expired beyond the clock skew.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use rowsync_client::{ClientError, SyncOptions};
use rowsync_protocol::ErrorCode;
use rowsync_server::jwks::{Jwks, JwksSettings, JwksSource};
use rowsync_server::{ServerConfig, TokenConfig};
use serde_json::{json, Value as Json};
use support::*;

const AUDIENCE: &str = "rowsync-jwks-test";
const LEEWAY_SECONDS: u64 = 5;

/// A signing key made here, with its public JWK.
struct TestKey {
    kid: String,
    /// PKCS#1 DER of an RSA key (empty for the others).
    der: Vec<u8>,
    algorithm: Algorithm,
    encoding: EncodingKey,
    jwk: Json,
}

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

fn rsa_key(kid: &str) -> TestKey {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::traits::PublicKeyParts;
    let private = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap();
    let der = private.to_pkcs1_der().unwrap();
    TestKey {
        kid: kid.into(),
        der: der.as_bytes().to_vec(),
        algorithm: Algorithm::RS256,
        encoding: EncodingKey::from_rsa_der(der.as_bytes()),
        jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
            "n": base64url(&private.n().to_bytes_be()), "e": base64url(&private.e().to_bytes_be())}),
    }
}

fn ec_key(kid: &str) -> TestKey {
    let algorithm = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let random = SystemRandom::new();
    let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(algorithm, &random).unwrap();
    let pair = signature::EcdsaKeyPair::from_pkcs8(algorithm, pkcs8.as_ref(), &random).unwrap();
    // The uncompressed point: 0x04, then x and y of 32 bytes each.
    let point = pair.public_key().as_ref();
    TestKey {
        kid: kid.into(),
        der: Vec::new(),
        algorithm: Algorithm::ES256,
        encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
        jwk: json!({"kty": "EC", "kid": kid, "crv": "P-256",
            "x": base64url(&point[1..33]), "y": base64url(&point[33..65])}),
    }
}

fn ed_key(kid: &str) -> TestKey {
    let pkcs8 = signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    TestKey {
        kid: kid.into(),
        der: Vec::new(),
        algorithm: Algorithm::EdDSA,
        encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
        jwk: json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "alg": "EdDSA",
            "x": base64url(pair.public_key().as_ref())}),
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The issuer: a discovery document and a key set the test replaces at will.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<Json>>,
    jwks_requests: Arc<AtomicUsize>,
}

impl Issuer {
    async fn start() -> Issuer {
        Issuer::start_with(None).await
    }

    /// An issuer on https:// with `tls`, else on http://.
    async fn start_with(tls: Option<Arc<rustls::ServerConfig>>) -> Issuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address: SocketAddr = listener.local_addr().unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{address}/tenant");
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let jwks = Arc::new(Mutex::new(json!({"keys": []})));
        let jwks_requests = Arc::new(AtomicUsize::new(0));
        let (served, requests, issuer) =
            (Arc::clone(&jwks), Arc::clone(&jwks_requests), url.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (served, requests, issuer) =
                    (Arc::clone(&served), Arc::clone(&requests), issuer.clone());
                let acceptor = acceptor.clone();
                let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let body = match request.uri().path() {
                        "/tenant/.well-known/openid-configuration" => json!({
                            "issuer": issuer,
                            "jwks_uri": format!("{issuer}/keys"),
                        }),
                        "/tenant/keys" => {
                            requests.fetch_add(1, Ordering::SeqCst);
                            served.lock().unwrap().clone()
                        }
                        _ => json!({"error": "not found"}),
                    };
                    let response = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(async move {
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = http.serve_connection(TokioIo::new(stream), service).await;
                            }
                        }
                        None => {
                            let _ = http.serve_connection(TokioIo::new(stream), service).await;
                        }
                    }
                });
            }
        });
        Issuer {
            url,
            jwks,
            jwks_requests,
        }
    }

    fn publish(&self, keys: &[&TestKey]) {
        let keys: Vec<Json> = keys.iter().map(|key| key.jwk.clone()).collect();
        *self.jwks.lock().unwrap() = json!({ "keys": keys });
    }

    fn requests(&self) -> usize {
        self.jwks_requests.load(Ordering::SeqCst)
    }

    fn token(&self, key: &TestKey, sub: &str, exp: i64) -> String {
        self.token_with(
            key,
            json!({"sub": sub, "exp": exp, "aud": AUDIENCE, "iss": self.url}),
        )
    }

    fn token_with(&self, key: &TestKey, claims: Json) -> String {
        let mut header = Header::new(key.algorithm);
        header.kid = Some(key.kid.clone());
        encode(&header, &claims, &key.encoding).unwrap()
    }
}

fn settings(issuer: &Issuer, refresh: Duration, refresh_min: Duration) -> JwksSettings {
    JwksSettings {
        refresh,
        refresh_min,
        ..JwksSettings::new(JwksSource::OidcIssuer(issuer.url.clone()))
    }
}

async fn server_for(issuer: &Issuer, jwks: Arc<Jwks>) -> TestServer {
    TestServer::start_with(ServerConfig {
        tokens: TokenConfig {
            audience: Some(AUDIENCE.into()),
            issuer: Some(issuer.url.clone()),
            leeway_seconds: LEEWAY_SECONDS,
            jwks: Some(jwks),
            ..TokenConfig::default()
        },
        ..ServerConfig::default()
    })
    .await
}

fn with_token(server: &TestServer, token: String) -> SyncOptions {
    let mut options = SyncOptions::new(server.address.to_string(), "", "");
    options.token = Some(token);
    options
}

async fn sync_with(server: &TestServer, client: &str, token: String) -> Result<(), String> {
    let mut client = server.client(client);
    match client.sync(&with_token(server, token)).await {
        Ok(_) => Ok(()),
        Err(ClientError::Server(error)) => {
            assert_eq!(
                error.error_code(),
                Some(ErrorCode::AuthenticationFailed),
                "{error}"
            );
            Err(error.message)
        }
        Err(other) => panic!("a sync failed other than by a refusal: {other:?}"),
    }
}

/// Syncs one client with `token` again and again for `period`, in a task; its count.
fn sync_for(
    server: &TestServer,
    client: &str,
    token: String,
    period: Duration,
) -> tokio::task::JoinHandle<usize> {
    let options = with_token(server, token);
    let mut client = server.client(client);
    tokio::spawn(async move {
        let mut syncs = 0;
        let until = tokio::time::Instant::now() + period;
        while tokio::time::Instant::now() < until {
            client
                .sync(&options)
                .await
                .expect("the steady key logs in throughout");
            syncs += 1;
        }
        syncs
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_rotate_while_clients_sync() {
    let issuer = Issuer::start().await;
    let (rsa, ec, ed) = (rsa_key("rsa-1"), ec_key("ec-1"), ed_key("ed-1"));
    issuer.publish(&[&rsa, &ec]);
    let (jwks, first) = Jwks::start(settings(
        &issuer,
        Duration::from_secs(3600),
        Duration::from_millis(500),
    ))
    .await
    .unwrap();
    assert_eq!(first, Ok(2), "discovery, then the set of two keys");
    let server = server_for(&issuer, jwks).await;
    let exp = now() + 600;
    sync_with(&server, "alice-rsa", issuer.token(&rsa, "alice", exp))
        .await
        .expect("an RS256 token of a published key logs in");

    // Clients keep syncing with the EC key, published all along, through the rotation.
    let steady = issuer.token(&ec, "bob", exp);
    let syncing = sync_for(&server, "bob-steady", steady, Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The rotation: the RSA key is retired, an Ed25519 key rotated in.
    issuer.publish(&[&ec, &ed]);
    let before = issuer.requests();
    sync_with(&server, "alice-ed", issuer.token(&ed, "alice", exp))
        .await
        .expect("a rotated-in key logs in at once: its unknown kid fetched the set");
    assert_eq!(issuer.requests(), before + 1, "one fetch for the new kid");
    let retired = sync_with(&server, "alice-rsa-2", issuer.token(&rsa, "alice", exp))
        .await
        .expect_err("the retired key is refused");
    assert!(
        retired.contains("\"rsa-1\" is not in the issuer's key set"),
        "{retired}"
    );
    let unknown = issuer.token(&ed_key("never-published"), "alice", exp);
    let refused = sync_with(&server, "alice-unknown", unknown.clone())
        .await
        .unwrap_err();
    assert!(refused.contains("not in the issuer's key set"), "{refused}");
    let syncs = syncing.await.unwrap();
    assert!(
        syncs >= 2,
        "{syncs} syncs with the steady key during the rotation"
    );
    // Within jwks_refresh_min_seconds of the last fetch, unknown kids fetch nothing.
    let before = issuer.requests();
    for n in 0..5 {
        let _ = sync_with(&server, &format!("unknown-{n}"), unknown.clone()).await;
    }
    assert!(
        issuer.requests() <= before + 1,
        "{} fetches for 5 unknown-kid logins",
        issuer.requests() - before
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_issuer_audience_and_expiry_beyond_the_skew_are_refused() {
    let issuer = Issuer::start().await;
    let ec = ec_key("ec-1");
    issuer.publish(&[&ec]);
    let (jwks, _) = Jwks::start(settings(
        &issuer,
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ))
    .await
    .unwrap();
    let server = server_for(&issuer, jwks).await;
    let exp = now() + 600;
    let wrong_issuer = issuer.token_with(
        &ec,
        json!({"sub": "alice", "exp": exp, "aud": AUDIENCE, "iss": "https://other.test"}),
    );
    let refused = sync_with(&server, "a", wrong_issuer).await.unwrap_err();
    assert!(refused.contains("InvalidIssuer"), "{refused}");
    let wrong_audience = issuer.token_with(
        &ec,
        json!({"sub": "alice", "exp": exp, "aud": "someone-else", "iss": issuer.url}),
    );
    let refused = sync_with(&server, "b", wrong_audience).await.unwrap_err();
    assert!(
        refused.contains("InvalidAudience") && refused.contains("(jwt_audience)"),
        "{refused}"
    );
    let expired = issuer.token(&ec, "alice", now() - 60);
    let refused = sync_with(&server, "c", expired).await.unwrap_err();
    assert!(
        refused.contains("ExpiredSignature: its exp is more than 5 s past (jwt_leeway_seconds)"),
        "{refused}"
    );
    let within_skew = issuer.token(&ec, "alice", now() - 2);
    sync_with(&server, "d", within_skew)
        .await
        .expect("a token expired within jwt_leeway_seconds still logs in");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_set_is_fetched_again_on_schedule() {
    let issuer = Issuer::start().await;
    let (ec, ed) = (ec_key("ec-1"), ed_key("ed-1"));
    issuer.publish(&[&ec]);
    let (jwks, _) = Jwks::start(settings(
        &issuer,
        Duration::from_millis(300),
        Duration::from_secs(3600),
    ))
    .await
    .unwrap();
    issuer.publish(&[&ed]);
    // The start's fetch, then one every 0.3 s (waited for up to 5 s on a loaded machine).
    let started = std::time::Instant::now();
    while issuer.requests() < 3 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(issuer.requests() >= 3, "{} fetches", issuer.requests());
    let tokens = TokenConfig {
        audience: Some(AUDIENCE.into()),
        issuer: Some(issuer.url.clone()),
        jwks: Some(Arc::clone(&jwks)),
        ..TokenConfig::default()
    };
    // refresh_min is an hour: no unknown kid fetched since the start, so the new key
    // came with a scheduled fetch.
    assert_eq!(
        tokens
            .check(&issuer.token(&ed, "alice", now() + 60))
            .await
            .unwrap(),
        "alice"
    );
    let retired = tokens
        .check(&issuer.token(&ec, "alice", now() + 60))
        .await
        .unwrap_err();
    assert!(
        retired.to_string().contains("\"ec-1\" is not in"),
        "{retired}"
    );
}

#[tokio::test]
async fn an_unreachable_or_oversized_set_is_refused_with_its_reason() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let jwks = Jwks::new(JwksSettings::new(JwksSource::Url(format!(
        "http://{closed}/keys"
    ))))
    .unwrap();
    let error = jwks.refresh().await.unwrap_err();
    assert!(error.to_string().contains("fetching http://"), "{error}");
    let tokens = TokenConfig {
        jwks: Some(Arc::new(jwks)),
        ..TokenConfig::default()
    };
    let refused = tokens
        .check(&Issuer::start().await.token(&ec_key("k"), "a", now() + 60))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("could not be had"),
        "{refused}"
    );

    let issuer = Issuer::start().await;
    let big: Vec<TestKey> = (0..40).map(padded_key).collect();
    *issuer.jwks.lock().unwrap() =
        json!({"keys": big.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
    let small = JwksSettings {
        bytes_max: 1024,
        ..JwksSettings::new(JwksSource::Url(format!("{}/keys", issuer.url)))
    };
    let error = Jwks::new(small).unwrap().refresh().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("more than 1024 bytes (jwks_bytes_max)"),
        "{error}"
    );
}

/// A key set entry of an RSA key's size without the cost of making an RSA key.
fn padded_key(n: usize) -> TestKey {
    let mut key = ec_key(&format!("padding-{n}"));
    key.jwk["padding"] = json!("x".repeat(64));
    key
}

#[tokio::test]
async fn a_static_rs256_key_and_a_key_set_serve_side_by_side() {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use rsa::pkcs8::{EncodePublicKey, LineEnding};
    let issuer = Issuer::start().await;
    let (in_set, static_key) = (rsa_key("rsa-set"), rsa_key("unused"));
    issuer.publish(&[&in_set]);
    let (jwks, _) = Jwks::start(settings(
        &issuer,
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ))
    .await
    .unwrap();
    let private = rsa::RsaPrivateKey::from_pkcs1_der(&static_key.der).unwrap();
    let pem = private
        .to_public_key()
        .to_public_key_pem(LineEnding::LF)
        .unwrap();
    let tokens = TokenConfig {
        rs256_public_key_pem: Some(pem.into_bytes()),
        audience: Some(AUDIENCE.into()),
        jwks: Some(jwks),
        ..TokenConfig::default()
    };
    let from_set = issuer.token(&in_set, "alice", now() + 60);
    assert_eq!(tokens.check(&from_set).await.unwrap(), "alice");
    let claims = json!({"sub": "bob", "exp": now() + 60, "aud": AUDIENCE});
    let without_kid = encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &static_key.encoding,
    )
    .unwrap();
    assert_eq!(tokens.check(&without_kid).await.unwrap(), "bob");
}

#[tokio::test]
async fn an_https_issuer_is_verified_against_jwks_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    let pki = rowsync_cli::cert::write_test_pki(
        dir.path(),
        &["127.0.0.1".into()],
        rowsync_cli::cert::KeyKind::EcdsaP256,
    )
    .unwrap();
    let files = rowsync_server::tls::TlsFiles {
        cert_chain: pki.server_cert.clone(),
        private_key: pki.server_key.clone(),
        client_ca: None,
    };
    let tls = rowsync_server::tls::server_config(&files, &[b"http/1.1"]).unwrap();
    let issuer = Issuer::start_with(Some(tls)).await;
    let ed = ed_key("ed-1");
    issuer.publish(&[&ed]);
    let trusted = JwksSettings {
        ca_file: Some(pki.ca_cert.clone()),
        ..settings(&issuer, Duration::from_secs(3600), Duration::from_secs(60))
    };
    let jwks = Jwks::new(trusted).unwrap();
    assert_eq!(
        jwks.refresh().await,
        Ok(1),
        "discovery and the set over https"
    );
    let untrusted = Jwks::new(settings(
        &issuer,
        Duration::from_secs(3600),
        Duration::from_secs(60),
    ))
    .unwrap();
    let refused = untrusted.refresh().await.unwrap_err().to_string();
    assert!(
        refused.contains("UnknownIssuer") && refused.contains("jwks_ca_file"),
        "the Mozilla roots do not know the test CA: {refused}"
    );
}
