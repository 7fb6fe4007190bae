//! Session tokens: after a password login (protocol v8), the server hands the client a
//! short-lived token, signed (HS256) with a key kept in the consolidated database
//! (`rs_session_key`), so any server of a farm accepts it. The client sends it back in
//! its next hellos' `token`, with its password; a token that holds saves the argon2id
//! check (the slowest phase of a small sync), one that does not falls back to it.
//!
//! A token names its user, its client id and a fingerprint of the user's stored password
//! hash, so it stops holding when the user is removed, disabled, or given a new
//! password: it is checked against the hash the login step reads anyway. Deleting the
//! rows of `rs_session_key` revokes every token at once.

use std::sync::RwLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::Validation;
use jsonwebtoken::{decode, decode_header, encode, Algorithm, DecodingKey, EncodingKey, Header};
use rowsync_consolidated::SessionKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// What every session token starts with: a hello's token with it is a session token,
/// any other is a signed token of the server's issuer (JWT, `crate::token`).
pub const SESSION_TOKEN_PREFIX: &str = "rss1.";

/// The default of `session_token_seconds`: a client syncing at least this often pays
/// for one password check, not one per sync.
pub const SESSION_TOKEN_SECONDS_DEFAULT: u64 = 12 * 3600;

/// Why a session token does not hold (the login then checks the password).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SessionTokenError {
    #[error("this server issues no session tokens")]
    Off,
    #[error("the session token is malformed: {0}")]
    Malformed(String),
    #[error("the session token's key {0} is not among the database's session keys")]
    UnknownKey(i64),
    #[error("the session token has expired")]
    Expired,
    #[error("the session token was issued to another user or client")]
    OtherLogin,
    #[error("the user was removed, disabled or given a new password since")]
    PasswordChanged,
}

/// A session token issued for a login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedToken {
    pub token: String,
    pub expires_in_seconds: u32,
}

/// The login a token is for.
pub struct TokenLogin<'a> {
    pub user: &'a str,
    pub client_id: &'a str,
    /// The user's stored password hash, as the login step read it.
    pub stored_hash: &'a str,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    cid: String,
    /// Fingerprint of the stored password hash.
    pwh: String,
    exp: u64,
}

/// The session keys this server knows, and the lifetime of the tokens it issues.
pub struct SessionTokens {
    lifetime: Duration,
    keys: RwLock<Vec<SessionKey>>,
}

impl SessionTokens {
    /// Tokens that hold for `lifetime` (zero: none are issued, none accepted).
    pub fn new(lifetime: Duration) -> SessionTokens {
        SessionTokens {
            lifetime,
            keys: RwLock::new(Vec::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.lifetime.is_zero()
    }

    pub fn is_session_token(token: &str) -> bool {
        token.starts_with(SESSION_TOKEN_PREFIX)
    }

    /// Whether the keys must be read from the database first: none known yet, or
    /// `token` names a key newer than those known (another server made it).
    pub fn needs_keys(&self, token: &str) -> bool {
        let keys = self
            .keys
            .read()
            .expect("the session keys lock is never poisoned");
        let Some(newest) = keys.last() else {
            return true;
        };
        Self::is_session_token(token) && key_id(token).is_ok_and(|id| id > newest.id)
    }

    pub fn set_keys(&self, keys: Vec<SessionKey>) {
        *self
            .keys
            .write()
            .expect("the session keys lock is never poisoned") = keys;
    }

    /// A token for `login`, signed with the newest key; `None` without a key.
    pub fn issue(&self, login: &TokenLogin<'_>) -> Option<IssuedToken> {
        self.issue_at(login, unix_now())
    }

    fn issue_at(&self, login: &TokenLogin<'_>, now: u64) -> Option<IssuedToken> {
        if !self.enabled() {
            return None;
        }
        let keys = self
            .keys
            .read()
            .expect("the session keys lock is never poisoned");
        let key = keys.last()?;
        let claims = Claims {
            sub: login.user.to_string(),
            cid: login.client_id.to_string(),
            pwh: fingerprint(login.stored_hash),
            exp: now + self.lifetime.as_secs(),
        };
        let header = Header {
            kid: Some(key.id.to_string()),
            ..Header::new(Algorithm::HS256)
        };
        let jwt = encode(
            &header,
            &claims,
            &EncodingKey::from_secret(key.secret.as_bytes()),
        )
        .map_err(|error| tracing::error!("a session token could not be signed: {error}"))
        .ok()?;
        Some(IssuedToken {
            token: format!("{SESSION_TOKEN_PREFIX}{jwt}"),
            expires_in_seconds: u32::try_from(self.lifetime.as_secs()).unwrap_or(u32::MAX),
        })
    }

    /// Checks a session token for `login`; `Ok(true)` when it holds and is past half its
    /// life (the login should hand out a new one), `Ok(false)` when it holds.
    pub fn check(&self, token: &str, login: &TokenLogin<'_>) -> Result<bool, SessionTokenError> {
        self.check_at(token, login, unix_now())
    }

    fn check_at(
        &self,
        token: &str,
        login: &TokenLogin<'_>,
        now: u64,
    ) -> Result<bool, SessionTokenError> {
        if !self.enabled() {
            return Err(SessionTokenError::Off);
        }
        let id = key_id(token)?;
        let keys = self
            .keys
            .read()
            .expect("the session keys lock is never poisoned");
        let key = keys
            .iter()
            .find(|key| key.id == id)
            .ok_or(SessionTokenError::UnknownKey(id))?;
        let mut validation = Validation::new(Algorithm::HS256);
        // Expiry is checked below, against `now`, without leeway.
        validation.validate_exp = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        let jwt = &token[SESSION_TOKEN_PREFIX.len()..];
        let claims = decode::<Claims>(
            jwt,
            &DecodingKey::from_secret(key.secret.as_bytes()),
            &validation,
        )
        .map_err(|error| SessionTokenError::Malformed(error.to_string()))?
        .claims;
        if claims.exp <= now {
            return Err(SessionTokenError::Expired);
        }
        if claims.sub != login.user || claims.cid != login.client_id {
            return Err(SessionTokenError::OtherLogin);
        }
        if claims.pwh != fingerprint(login.stored_hash) {
            return Err(SessionTokenError::PasswordChanged);
        }
        Ok(2 * (claims.exp - now) < self.lifetime.as_secs())
    }
}

/// The key id a session token's header names.
fn key_id(token: &str) -> Result<i64, SessionTokenError> {
    let jwt = token
        .strip_prefix(SESSION_TOKEN_PREFIX)
        .ok_or_else(|| SessionTokenError::Malformed("no session token prefix".into()))?;
    let header =
        decode_header(jwt).map_err(|error| SessionTokenError::Malformed(error.to_string()))?;
    header
        .kid
        .and_then(|kid| kid.parse().ok())
        .ok_or_else(|| SessionTokenError::Malformed("no key id".into()))
}

/// A fingerprint of a stored password hash: changes with the password (a new salt each
/// time), and tells nothing of it.
fn fingerprint(stored_hash: &str) -> String {
    hex::encode(&Sha256::digest(stored_hash.as_bytes())[..8])
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(seconds: u64) -> SessionTokens {
        let tokens = SessionTokens::new(Duration::from_secs(seconds));
        tokens.set_keys(vec![SessionKey {
            id: 1,
            secret: "k1".into(),
        }]);
        tokens
    }

    fn alice(stored_hash: &str) -> TokenLogin<'_> {
        TokenLogin {
            user: "alice",
            client_id: "c1",
            stored_hash,
        }
    }

    #[test]
    fn a_token_holds_for_its_login_only() {
        let tokens = tokens(3600);
        let issued = tokens.issue(&alice("$argon2id$a")).unwrap();
        assert!(issued.token.starts_with(SESSION_TOKEN_PREFIX));
        assert_eq!(issued.expires_in_seconds, 3600);
        assert_eq!(
            tokens.check(&issued.token, &alice("$argon2id$a")),
            Ok(false)
        );
        assert_eq!(
            tokens.check(&issued.token, &alice("$argon2id$new")),
            Err(SessionTokenError::PasswordChanged)
        );
        let bob = TokenLogin {
            user: "bob",
            ..alice("$argon2id$a")
        };
        assert_eq!(
            tokens.check(&issued.token, &bob),
            Err(SessionTokenError::OtherLogin)
        );
        let other_client = TokenLogin {
            client_id: "c2",
            ..alice("$argon2id$a")
        };
        assert_eq!(
            tokens.check(&issued.token, &other_client),
            Err(SessionTokenError::OtherLogin)
        );
    }

    #[test]
    fn a_token_signed_with_another_key_or_tampered_does_not_hold() {
        let tokens = tokens(3600);
        let issued = tokens.issue(&alice("h")).unwrap();
        let elsewhere = SessionTokens::new(Duration::from_secs(3600));
        elsewhere.set_keys(vec![SessionKey {
            id: 1,
            secret: "another".into(),
        }]);
        assert!(matches!(
            elsewhere.check(&issued.token, &alice("h")),
            Err(SessionTokenError::Malformed(_))
        ));
        let mut tampered = issued.token.clone();
        tampered.pop();
        assert!(matches!(
            tokens.check(&tampered, &alice("h")),
            Err(SessionTokenError::Malformed(_))
        ));
        assert!(!tokens.needs_keys("rss1.x") && !tokens.needs_keys(&issued.token));
    }

    #[test]
    fn a_token_of_an_unknown_newer_key_asks_for_the_keys() {
        let farm = SessionTokens::new(Duration::from_secs(60));
        farm.set_keys(vec![SessionKey {
            id: 2,
            secret: "k2".into(),
        }]);
        let token = farm.issue(&alice("h")).unwrap().token;
        let here = tokens(60);
        assert!(here.needs_keys(&token));
        assert_eq!(
            here.check(&token, &alice("h")),
            Err(SessionTokenError::UnknownKey(2))
        );
    }

    #[test]
    fn a_token_past_half_its_life_is_renewed_and_an_expired_one_refused() {
        let tokens = tokens(100);
        let issued = tokens.issue_at(&alice("h"), 1_000).unwrap();
        assert_eq!(
            tokens.check_at(&issued.token, &alice("h"), 1_049),
            Ok(false)
        );
        assert_eq!(tokens.check_at(&issued.token, &alice("h"), 1_051), Ok(true));
        assert_eq!(
            tokens.check_at(&issued.token, &alice("h"), 1_100),
            Err(SessionTokenError::Expired)
        );
    }

    #[test]
    fn a_server_without_tokens_or_keys_issues_none() {
        let issued = tokens(60).issue(&alice("h")).unwrap();
        let off = SessionTokens::new(Duration::ZERO);
        assert_eq!(off.issue(&alice("h")), None);
        assert_eq!(
            off.check(&issued.token, &alice("h")),
            Err(SessionTokenError::Off)
        );
        let keyless = SessionTokens::new(Duration::from_secs(60));
        assert_eq!(keyless.issue(&alice("h")), None);
        assert!(keyless.needs_keys(&issued.token));
    }
}
