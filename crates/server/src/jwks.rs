//! Token keys from a JWKS URL (RFC 7517), or from an OpenID Connect issuer's discovery
//! document (`{issuer}/.well-known/openid-configuration`, whose `jwks_uri` names it).
//!
//! The set is fetched at start and every `refresh` after, and kept in memory; a token is
//! checked with the key its header's `kid` names. A `kid` the set lacks (a key the issuer
//! has just rotated in) fetches the set again at once, at most once every `refresh_min`:
//! a login waits for at most that one fetch (bounded by `timeout` and `bytes_max`), and
//! logins with known keys never wait on the network. A key gone from a newer set (a
//! retired key) is refused from then on.
//!
//! Only signing keys of RS256 (RSA), ES256 (EC P-256) and EdDSA (OKP Ed25519) are
//! taken; symmetric (`oct`) keys and encryption keys in a set are left out, so a
//! published set can never turn into an HMAC secret.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite};

/// Where the key set comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// The key set's own URL (`jwks_url`).
    Url(String),
    /// An OpenID Connect issuer (`oidc_issuer`): its discovery document names the set.
    OidcIssuer(String),
}

/// How the key set is fetched and kept.
#[derive(Debug, Clone)]
pub struct JwksSettings {
    pub source: JwksSource,
    /// Fetch the set again this often (`jwks_refresh_seconds`).
    pub refresh: Duration,
    /// An unknown `kid` fetches the set again at most this often
    /// (`jwks_refresh_min_seconds`); also the retry interval while no set was had.
    pub refresh_min: Duration,
    /// A discovery document or key set larger than this is refused (`jwks_bytes_max`).
    pub bytes_max: usize,
    /// One fetch (connect, TLS, request, body) must end within this (`jwks_timeout_ms`).
    pub timeout: Duration,
    /// PEM of the CAs an https:// issuer's certificate must chain to (`jwks_ca_file`),
    /// for a provider on a private CA; none: the Mozilla roots (webpki-roots).
    pub ca_file: Option<PathBuf>,
}

impl JwksSettings {
    pub const REFRESH_DEFAULT: Duration = Duration::from_secs(900);
    pub const REFRESH_MIN_DEFAULT: Duration = Duration::from_secs(30);
    pub const BYTES_MAX_DEFAULT: usize = 256 * 1024;
    pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

    /// The defaults, for `source`.
    pub fn new(source: JwksSource) -> JwksSettings {
        JwksSettings {
            source,
            refresh: Self::REFRESH_DEFAULT,
            refresh_min: Self::REFRESH_MIN_DEFAULT,
            bytes_max: Self::BYTES_MAX_DEFAULT,
            timeout: Self::TIMEOUT_DEFAULT,
            ca_file: None,
        }
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum JwksError {
    #[error(
        "the key set URL {url:?} is not usable: {reason}; give an https:// URL \
         (http:// only to a loopback address)"
    )]
    Url { url: String, reason: String },
    #[error("fetching {url} failed: {reason}")]
    Fetch { url: String, reason: String },
    #[error("fetching {url} took longer than {ms} ms (raise jwks_timeout_ms if it is slow)")]
    Timeout { url: String, ms: u128 },
    #[error("{url} answered HTTP {status}; check the URL (jwks_url or oidc_issuer)")]
    Status { url: String, status: u16 },
    #[error("{url} sent more than {bytes_max} bytes (jwks_bytes_max)")]
    TooLarge { url: String, bytes_max: usize },
    #[error("{url} did not send a {what}: {reason}")]
    Document {
        url: String,
        what: &'static str,
        reason: String,
    },
    #[error(
        "the discovery document of {expected} names issuer {found:?}; set oidc_issuer to \
         exactly the issuer the document names"
    )]
    IssuerMismatch { expected: String, found: String },
    #[error("the key set at {url} holds no signing key rowsync can use (RS256, ES256 or EdDSA)")]
    NoKeys { url: String },
    #[error("jwks_ca_file: {0}")]
    CaFile(String),
}

/// Why no key was found for a token.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KeyError {
    #[error(
        "the token's key id {kid:?} is not in the issuer's key set (fetched {age_seconds} s \
         ago; an unknown key id fetches it again at most every {refresh_min_seconds} s): \
         a retired key, or a token from another issuer"
    )]
    UnknownKid {
        kid: String,
        age_seconds: u64,
        refresh_min_seconds: u64,
    },
    #[error("the token names no key id (kid) and the key set holds more than one {0:?} key")]
    NoKid(Algorithm),
    #[error("the token says {token:?} but its key {kid:?} is a {key:?} key")]
    AlgorithmMismatch {
        kid: String,
        token: Algorithm,
        key: Algorithm,
    },
    #[error("the issuer's key set could not be had: {0}")]
    Unavailable(JwksError),
}

/// One usable key of a set.
#[derive(Clone)]
pub struct SetKey {
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

#[derive(Default)]
struct KeySet {
    by_kid: HashMap<String, SetKey>,
    without_kid: Vec<SetKey>,
    fetched: Option<Instant>,
}

#[derive(Default)]
struct FetchState {
    last_attempt: Option<Instant>,
    last_error: Option<JwksError>,
    /// The set's URL, once discovery found it.
    jwks_url: Option<String>,
}

/// The cached key set of one issuer.
pub struct Jwks {
    settings: JwksSettings,
    tls: Arc<rustls::ClientConfig>,
    keys: RwLock<Arc<KeySet>>,
    /// Held while fetching: concurrent logins with unknown keys share one fetch.
    fetch: tokio::sync::Mutex<FetchState>,
    fetches: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Jwks")
            .field("source", &self.settings.source)
            .finish()
    }
}

impl Jwks {
    /// Checks the settings; fetches nothing yet.
    pub fn new(settings: JwksSettings) -> Result<Jwks, JwksError> {
        let url = match &settings.source {
            JwksSource::Url(url) | JwksSource::OidcIssuer(url) => url,
        };
        Target::parse(url)?;
        Ok(Jwks {
            tls: tls_config(settings.ca_file.as_deref())?,
            settings,
            keys: RwLock::new(Arc::new(KeySet::default())),
            fetch: tokio::sync::Mutex::new(FetchState::default()),
            fetches: Default::default(),
        })
    }

    /// A checked set, fetched once (its outcome returned, not fatal: the refresher
    /// keeps trying every `refresh_min`), and refreshed on schedule in a task that ends
    /// when the last holder of the set is gone.
    pub async fn start(
        settings: JwksSettings,
    ) -> Result<(Arc<Jwks>, Result<usize, JwksError>), JwksError> {
        let jwks = Arc::new(Jwks::new(settings)?);
        let first = jwks.refresh().await;
        tokio::spawn(refresh_on_schedule(Arc::downgrade(&jwks)));
        Ok((jwks, first))
    }

    /// Fetches the set now (after discovery, when the source is an issuer); the keys it
    /// holds replace the old ones. Returns how many keys it holds.
    pub async fn refresh(&self) -> Result<usize, JwksError> {
        let mut state = self.fetch.lock().await;
        self.refresh_locked(&mut state).await
    }

    /// Fetches the set while holding the fetch lock.
    async fn refresh_locked(&self, state: &mut FetchState) -> Result<usize, JwksError> {
        state.last_attempt = Some(Instant::now());
        self.fetches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fetched = self.fetch_set(state).await;
        state.last_error = fetched.as_ref().err().cloned();
        if fetched.is_err() {
            // The issuer may have moved its key set: discover it again next time.
            state.jwks_url = None;
        }
        let set = fetched?;
        let count = set.by_kid.len() + set.without_kid.len();
        *self
            .keys
            .write()
            .expect("the key set lock is never poisoned") = Arc::new(set);
        Ok(count)
    }

    async fn fetch_set(&self, state: &mut FetchState) -> Result<KeySet, JwksError> {
        let url = match (&self.settings.source, &state.jwks_url) {
            (JwksSource::Url(url), _) | (_, Some(url)) => url.clone(),
            (JwksSource::OidcIssuer(issuer), None) => {
                let url = self.discover(issuer).await?;
                state.jwks_url = Some(url.clone());
                url
            }
        };
        let body = self.fetch(&url).await?;
        parse_key_set(&url, &body)
    }

    /// The `jwks_uri` of an OpenID Connect issuer's discovery document.
    async fn discover(&self, issuer: &str) -> Result<String, JwksError> {
        #[derive(serde::Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let body = self.fetch(&url).await?;
        let document: Discovery =
            serde_json::from_slice(&body).map_err(|error| JwksError::Document {
                url: url.clone(),
                what: "discovery document with issuer and jwks_uri",
                reason: error.to_string(),
            })?;
        if document.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(JwksError::IssuerMismatch {
                expected: issuer.to_string(),
                found: document.issuer,
            });
        }
        Target::parse(&document.jwks_uri)?;
        Ok(document.jwks_uri)
    }

    /// GETs `url` (HTTP/1.1, no redirects), its body at most `bytes_max` bytes, all
    /// within `timeout`.
    async fn fetch(&self, url: &str) -> Result<Vec<u8>, JwksError> {
        let target = Target::parse(url)?;
        let fetching = fetch_target(url, &target, self.settings.bytes_max, &self.tls);
        match tokio::time::timeout(self.settings.timeout, fetching).await {
            Ok(fetched) => fetched,
            Err(_) => Err(JwksError::Timeout {
                url: url.to_string(),
                ms: self.settings.timeout.as_millis(),
            }),
        }
    }

    /// How many times the set (or the discovery document and the set) was fetched.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn current(&self) -> Arc<KeySet> {
        Arc::clone(
            &self
                .keys
                .read()
                .expect("the key set lock is never poisoned"),
        )
    }

    /// The key for a token's `kid` and algorithm: from the set in memory, or, for a
    /// `kid` it lacks, from a set fetched now unless one was fetched within `refresh_min`.
    pub async fn key(&self, kid: Option<&str>, algorithm: Algorithm) -> Result<SetKey, KeyError> {
        let Some(kid) = kid else {
            return lookup_without_kid(&self.current(), algorithm);
        };
        if let Some(found) = lookup(&self.current(), kid, algorithm)? {
            return Ok(found);
        }
        let mut state = self.fetch.lock().await;
        // Another login may have fetched the set while this one waited for the lock.
        if let Some(found) = lookup(&self.current(), kid, algorithm)? {
            return Ok(found);
        }
        let recent = state
            .last_attempt
            .is_some_and(|at| at.elapsed() < self.settings.refresh_min);
        if !recent {
            if let Err(error) = self.refresh_locked(&mut state).await {
                tracing::warn!(%error, "fetching the token key set for an unknown kid failed");
            }
        }
        let current = self.current();
        if let Some(found) = lookup(&current, kid, algorithm)? {
            return Ok(found);
        }
        match (&current.fetched, &state.last_error) {
            (None, Some(error)) => Err(KeyError::Unavailable(error.clone())),
            (fetched, _) => Err(KeyError::UnknownKid {
                kid: kid.to_string(),
                age_seconds: fetched.map_or(0, |at| at.elapsed().as_secs()),
                refresh_min_seconds: self.settings.refresh_min.as_secs(),
            }),
        }
    }
}

fn lookup(set: &KeySet, kid: &str, algorithm: Algorithm) -> Result<Option<SetKey>, KeyError> {
    match set.by_kid.get(kid) {
        Some(found) if found.algorithm == algorithm => Ok(Some(found.clone())),
        Some(found) => Err(KeyError::AlgorithmMismatch {
            kid: kid.to_string(),
            token: algorithm,
            key: found.algorithm,
        }),
        None => Ok(None),
    }
}

/// A token without `kid` is checked with the set's only key of its algorithm.
fn lookup_without_kid(set: &KeySet, algorithm: Algorithm) -> Result<SetKey, KeyError> {
    let mut candidates = set
        .by_kid
        .values()
        .chain(&set.without_kid)
        .filter(|key| key.algorithm == algorithm);
    match (candidates.next(), candidates.next()) {
        (Some(only), None) => Ok(only.clone()),
        (None, _) => Err(KeyError::UnknownKid {
            kid: String::new(),
            age_seconds: set.fetched.map_or(0, |at| at.elapsed().as_secs()),
            refresh_min_seconds: 0,
        }),
        (Some(_), Some(_)) => Err(KeyError::NoKid(algorithm)),
    }
}

/// Refreshes the set every `refresh` (every `refresh_min` while the last fetch failed)
/// until the set is dropped.
async fn refresh_on_schedule(jwks: Weak<Jwks>) {
    loop {
        let Some(held) = jwks.upgrade() else { return };
        let wait = held.until_due(&*held.fetch.lock().await);
        drop(held);
        tokio::time::sleep(wait.max(Duration::from_millis(100))).await;
        let Some(held) = jwks.upgrade() else { return };
        let mut state = held.fetch.lock().await;
        // An unknown kid may have fetched the set meanwhile.
        if held.until_due(&state).is_zero() {
            if let Err(error) = held.refresh_locked(&mut state).await {
                tracing::warn!(%error, "refreshing the token key set failed; the keys fetched before stay");
            }
        }
    }
}

impl Jwks {
    /// How long until the next scheduled fetch is due.
    fn until_due(&self, state: &FetchState) -> Duration {
        let interval = if state.last_error.is_some() {
            self.settings.refresh_min
        } else {
            self.settings.refresh
        };
        let since = state.last_attempt.map_or(interval, |at| at.elapsed());
        interval.saturating_sub(since)
    }
}

/// The usable signing keys of a JWKS document. Keys that do not parse, are not for
/// signing, or are of another type are left out; a set with none is refused.
fn parse_key_set(url: &str, body: &[u8]) -> Result<KeySet, JwksError> {
    #[derive(serde::Deserialize)]
    struct Document {
        keys: Vec<serde_json::Value>,
    }
    let document: Document = serde_json::from_slice(body).map_err(|error| JwksError::Document {
        url: url.to_string(),
        what: "key set (JSON with \"keys\")",
        reason: error.to_string(),
    })?;
    let mut set = KeySet {
        fetched: Some(Instant::now()),
        ..KeySet::default()
    };
    for value in document.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(value) else {
            continue;
        };
        let Some(key) = usable_key(&jwk) else {
            continue;
        };
        match jwk.common.key_id {
            Some(kid) => {
                set.by_kid.insert(kid, key);
            }
            None => set.without_kid.push(key),
        }
    }
    if set.by_kid.is_empty() && set.without_kid.is_empty() {
        return Err(JwksError::NoKeys {
            url: url.to_string(),
        });
    }
    Ok(set)
}

/// A JWK as a verification key, when it is an RS256, ES256 or EdDSA signing key.
fn usable_key(jwk: &Jwk) -> Option<SetKey> {
    if matches!(
        jwk.common.public_key_use,
        Some(PublicKeyUse::Encryption | PublicKeyUse::Other(_))
    ) {
        return None;
    }
    let algorithm = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    let declared = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => return None,
    };
    if declared.is_some_and(|declared| declared != algorithm) {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some(SetKey { algorithm, key })
}

/// A parsed http(s) URL: where to connect and what to ask.
struct Target {
    https: bool,
    host: String,
    port: u16,
    authority: String,
    path: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, JwksError> {
        let invalid = |reason: &str| JwksError::Url {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(invalid("the scheme is neither https nor http")),
        };
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let loopback = host == "localhost"
            || host
                .parse::<IpAddr>()
                .is_ok_and(|address| address.is_loopback());
        if !https && !loopback {
            return Err(invalid(
                "plain http beyond loopback would let anyone on the path swap the keys",
            ));
        }
        Ok(Target {
            https,
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
            host,
            authority: authority.as_str().to_string(),
            path: uri
                .path_and_query()
                .map_or("/".to_string(), |path| path.as_str().to_string()),
        })
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

async fn fetch_target(
    url: &str,
    target: &Target,
    bytes_max: usize,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<Vec<u8>, JwksError> {
    let failed = |reason: String| JwksError::Fetch {
        url: url.to_string(),
        reason,
    };
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|error| failed(error.to_string()))?;
    let stream: Box<dyn Stream> = if target.https {
        Box::new(tls_connect(tcp, &target.host, tls).await.map_err(failed)?)
    } else {
        Box::new(tcp)
    };
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| failed(error.to_string()))?;
    tokio::spawn(connection);
    let request = http::Request::get(target.path.as_str())
        .header(http::header::HOST, target.authority.as_str())
        .header(http::header::ACCEPT, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("rowsync/", env!("CARGO_PKG_VERSION")),
        )
        .body(Empty::<Bytes>::new())
        .map_err(|error| failed(error.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|error| failed(error.to_string()))?;
    if response.status() != http::StatusCode::OK {
        return Err(JwksError::Status {
            url: url.to_string(),
            status: response.status().as_u16(),
        });
    }
    let body = Limited::new(response.into_body(), bytes_max)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<http_body_util::LengthLimitError>() {
                JwksError::TooLarge {
                    url: url.to_string(),
                    bytes_max,
                }
            } else {
                failed(error.to_string())
            }
        })?;
    Ok(body.to_bytes().to_vec())
}

/// The TLS client of the fetches: the CAs of `ca_file`, else the Mozilla roots.
fn tls_config(ca_file: Option<&std::path::Path>) -> Result<Arc<rustls::ClientConfig>, JwksError> {
    let roots = match ca_file {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            let certificates = crate::tls::load_certificates(path)
                .map_err(|error| JwksError::CaFile(error.to_string()))?;
            for certificate in certificates {
                roots
                    .add(certificate)
                    .map_err(|error| JwksError::CaFile(format!("{}: {error}", path.display())))?;
            }
            roots
        }
        None => rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    };
    let config = rustls::ClientConfig::builder_with_provider(crate::tls::crypto_provider())
        .with_protocol_versions(crate::tls::PROTOCOL_VERSIONS)
        .map_err(|error| JwksError::CaFile(error.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// TLS to `host`, its certificate checked by `config`.
async fn tls_connect(
    tcp: tokio::net::TcpStream,
    host: &str,
    config: &Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let name = rustls_pki_types::ServerName::try_from(host.to_string())
        .map_err(|error| error.to_string())?;
    tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
        .map_err(|error| format!("TLS: {error} (jwks_ca_file names the CAs to trust)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_signing_keys_of_the_three_algorithms_are_taken() {
        let body = br#"{"keys":[
            {"kty":"oct","kid":"hmac","k":"c2VjcmV0"},
            {"kty":"OKP","crv":"Ed25519","kid":"enc","use":"enc","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"Ed25519","kid":"ed","use":"sig","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"OKP","crv":"Ed25519","kid":"claims-rs","alg":"RS256","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty":"XYZ","kid":"unknown"}
        ]}"#;
        let set = parse_key_set("http://127.0.0.1/jwks", body).unwrap();
        let kids: Vec<&String> = set.by_kid.keys().collect();
        assert_eq!(kids, vec!["ed"]);
        assert_eq!(set.by_kid["ed"].algorithm, Algorithm::EdDSA);
        let none = parse_key_set("u", br#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#).err();
        assert!(matches!(none, Some(JwksError::NoKeys { .. })), "{none:?}");
    }

    #[test]
    fn plain_http_is_refused_beyond_loopback() {
        assert!(Target::parse("http://127.0.0.1:8080/jwks").is_ok());
        assert!(Target::parse("http://[::1]:8080/jwks").is_ok());
        assert!(Target::parse("https://issuer.example/.well-known/jwks.json").is_ok());
        let refused = Target::parse("http://issuer.example/jwks").err().unwrap();
        assert!(refused.to_string().contains("https://"), "{refused}");
        assert!(Target::parse("ftp://x/jwks").is_err());
    }
}
