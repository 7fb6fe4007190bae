//! Signed tokens (JWT) as an alternative to passwords: HS256 with a shared secret,
//! RS256 with the issuer's public key, or RS256, ES256 and EdDSA with the keys of an
//! issuer's key set ([`crate::jwks`]), checked for expiry, `nbf` (both with the clock
//! skew `leeway_seconds`), audience and issuer. The
//! token's subject is the user; nothing the client says elsewhere can change it.

use std::sync::Arc;

use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Header, Validation};
use serde::Deserialize;
use thiserror::Error;

use crate::jwks::{Jwks, KeyError};

/// Tokens longer than this are refused before any decoding.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;

/// Which tokens the server accepts. With neither key set, token logins are refused.
#[derive(Clone, Default)]
pub struct TokenConfig {
    pub hs256_secret: Option<Vec<u8>>,
    /// PEM of the RSA public key RS256 tokens are signed for.
    pub rs256_public_key_pem: Option<Vec<u8>>,
    /// Required `aud` claim, if set.
    pub audience: Option<String>,
    /// Required `iss` claim, if set.
    pub issuer: Option<String>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway_seconds: u64,
    /// The issuer's key set, for tokens the static keys above do not cover.
    pub jwks: Option<Arc<Jwks>>,
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("TokenConfig")
            .field("hs256", &self.hs256_secret.is_some())
            .field("rs256", &self.rs256_public_key_pem.is_some())
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .field("jwks", &self.jwks)
            .finish()
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("this server does not accept tokens")]
    NotAccepted,
    #[error("the token is longer than {TOKEN_BYTES_MAX} bytes")]
    TooLong,
    #[error(
        "the token's header is not valid (alg \"none\" and unknown algorithms are refused): {0}"
    )]
    Header(String),
    #[error("tokens signed with {0} are not accepted here")]
    Algorithm(String),
    #[error("the server's {0} key is not usable: {1}")]
    ServerKey(&'static str, String),
    #[error("the token was refused: {0}")]
    Invalid(String),
    #[error("the token has an empty subject")]
    EmptySubject,
    #[error("{0}")]
    Key(#[from] KeyError),
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

impl TokenConfig {
    /// Checks a token's signature and claims with the static keys only (no key set)
    /// and returns its subject, the user.
    pub fn verify(&self, token: &str) -> Result<String, TokenError> {
        let header = self.header(token)?;
        match self.static_key(&header)? {
            Some(key) => self.claims(token, header.alg, &key),
            None => Err(TokenError::Algorithm(format!("{:?}", header.alg))),
        }
    }

    /// Checks a token's signature and claims and returns its subject, the user: with
    /// a static key when one is set for the token's algorithm (HS256, or RS256 without a
    /// `kid` when there is a key set), else with the key set's key its `kid` names
    /// (which may fetch the set once: [`Jwks::key`]).
    pub async fn check(&self, token: &str) -> Result<String, TokenError> {
        let header = self.header(token)?;
        // With a key set too, an RS256 token naming a key (`kid`) is the set's.
        let static_first = self.jwks.is_none() || header.kid.is_none();
        if let Some(key) = self.static_key(&header)? {
            if static_first || header.alg == Algorithm::HS256 {
                return self.claims(token, header.alg, &key);
            }
        }
        let Some(jwks) = &self.jwks else {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        };
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let found = jwks.key(header.kid.as_deref(), header.alg).await?;
        self.claims(token, found.algorithm, &found.key)
    }

    fn header(&self, token: &str) -> Result<Header, TokenError> {
        if self.hs256_secret.is_none() && self.rs256_public_key_pem.is_none() && self.jwks.is_none()
        {
            return Err(TokenError::NotAccepted);
        }
        if token.len() > TOKEN_BYTES_MAX {
            return Err(TokenError::TooLong);
        }
        decode_header(token).map_err(|error| TokenError::Header(error.to_string()))
    }

    /// The static key for the token's algorithm, when one is set.
    fn static_key(&self, header: &Header) -> Result<Option<DecodingKey>, TokenError> {
        Ok(
            match (header.alg, &self.hs256_secret, &self.rs256_public_key_pem) {
                (Algorithm::HS256, Some(secret), _) => Some(DecodingKey::from_secret(secret)),
                (Algorithm::RS256, _, Some(pem)) => Some(
                    DecodingKey::from_rsa_pem(pem)
                        .map_err(|error| TokenError::ServerKey("RS256", error.to_string()))?,
                ),
                _ => None,
            },
        )
    }

    /// The token's subject, when its signature (by `key`, of `algorithm`) and its
    /// claims are valid.
    fn claims(
        &self,
        token: &str,
        algorithm: Algorithm,
        key: &DecodingKey,
    ) -> Result<String, TokenError> {
        let mut validation = Validation::new(algorithm);
        validation.leeway = self.leeway_seconds;
        // A token valid only from `nbf` on (less the clock skew) is refused before then.
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        match &self.audience {
            Some(audience) => validation.set_audience(&[audience]),
            None => validation.validate_aud = false,
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        let data = decode::<Claims>(token, key, &validation)
            .map_err(|error| TokenError::Invalid(self.explained(&error)))?;
        if data.claims.sub.is_empty() {
            return Err(TokenError::EmptySubject);
        }
        Ok(data.claims.sub)
    }
}

impl TokenConfig {
    /// A refusal by jsonwebtoken, its kind kept (`ExpiredSignature`) and told with the
    /// setting or the remedy that goes with it.
    fn explained(&self, error: &jsonwebtoken::errors::Error) -> String {
        use jsonwebtoken::errors::ErrorKind;
        let leeway = self.leeway_seconds;
        let hint = match error.kind() {
            ErrorKind::ExpiredSignature => format!(
                "its exp is more than {leeway} s past (jwt_leeway_seconds); the app must get \
                 a new token"
            ),
            ErrorKind::ImmatureSignature => format!(
                "its nbf is more than {leeway} s ahead (jwt_leeway_seconds); check the clocks"
            ),
            ErrorKind::InvalidIssuer => format!(
                "its iss is not {:?} (jwt_issuer or oidc_issuer)",
                self.issuer.as_deref().unwrap_or_default()
            ),
            ErrorKind::InvalidAudience => format!(
                "its aud does not name {:?} (jwt_audience)",
                self.audience.as_deref().unwrap_or_default()
            ),
            ErrorKind::InvalidSignature => {
                "its signature does not verify with the server's key for it".to_string()
            }
            ErrorKind::MissingRequiredClaim(claim) => format!("it has no {claim} claim"),
            _ => return error.to_string(),
        };
        format!("{error}: {hint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn token_not_before(nbf: i64) -> String {
        let claims = serde_json::json!({ "sub": "alice", "exp": now() + 7200, "nbf": nbf });
        encode(
            &Header::default(),
            &claims,
            &EncodingKey::from_secret(b"secret"),
        )
        .unwrap()
    }

    /// Issue 32, item 6: a token valid from an hour on logged in at once.
    #[test]
    fn a_token_is_refused_before_its_nbf_but_within_the_clock_skew() {
        let config = TokenConfig {
            hs256_secret: Some(b"secret".to_vec()),
            leeway_seconds: 60,
            ..TokenConfig::default()
        };
        let refused = config.verify(&token_not_before(now() + 3600)).unwrap_err();
        assert!(
            matches!(&refused, TokenError::Invalid(reason) if reason.contains("ImmatureSignature")),
            "{refused}"
        );
        assert_eq!(
            config.verify(&token_not_before(now() + 30)).unwrap(),
            "alice"
        );
        assert_eq!(
            config.verify(&token_not_before(now() - 30)).unwrap(),
            "alice"
        );
    }
}
