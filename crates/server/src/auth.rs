//! Authentication, in this order: a signed token of the server's issuer when the hello
//! carries one; else the version's `authenticate_user` script when it has one; else
//! built-in users (argon2id password hashes in `rs_user`), by the session token this
//! server's database signed when the hello's holds (`crate::session_token`), else by
//! password. The user scripts see is the one authenticated here.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use std::sync::{Arc, OnceLock};

use rowsync_consolidated::scripts::{AUTH_STATUS_VALID, AUTH_STATUS_VALID_EXPIRING};
use rowsync_consolidated::{
    AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, SyncError,
};
use rowsync_protocol::{Hello, SESSION_TOKEN_SINCE_VERSION};

use tokio::sync::Semaphore;

use crate::pool::WorkerPool;
use crate::session_token::{IssuedToken, SessionTokens, TokenLogin};
use crate::token::TokenConfig;

/// Hashes a password as an argon2id PHC string (`$argon2id$v=19$...`).
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::generate(&mut OsRng);
    Ok(Argon2::default()
        .hash_password(password.as_bytes(), &salt)?
        .to_string())
}

/// Checks a password against a stored hash; `None` (no such user) still costs one
/// full verification so that timing does not tell unknown users from wrong passwords.
pub fn verify_password(stored_hash: Option<&str>, password: &str) -> bool {
    static DUMMY_HASH: OnceLock<String> = OnceLock::new();
    let dummy = DUMMY_HASH
        .get_or_init(|| hash_password("rowsync-dummy").expect("hashing a constant works"));
    let (hash, known) = match stored_hash {
        Some(hash) => (hash, true),
        None => (dummy.as_str(), false),
    };
    let Ok(parsed) = PasswordHash::new(hash) else {
        tracing::error!("a stored password hash is not a valid PHC string; refusing the login");
        return false;
    };
    let matches = Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok();
    known && matches
}

/// Why a login was refused, or could not be checked.
#[derive(Debug)]
pub enum AuthFailure {
    Refused(String),
    Sync(SyncError),
    /// The user logged in, but the hello's script version does not exist: what to do,
    /// told only once the password was right (a refused login learns nothing of which
    /// versions exist).
    UnknownScriptVersion(String),
}

/// A login: the authenticated user, and the session token to hand the client (protocol
/// v8: after a password login, or when the token it used is past half its life).
#[derive(Debug)]
pub struct Login {
    pub user: String,
    pub session_token: Option<IssuedToken>,
}

impl Login {
    fn without_token(user: String) -> Login {
        Login {
            user,
            session_token: None,
        }
    }
}

/// How a server checks logins.
pub struct LoginChecks<'a, B: Consolidated> {
    pub pool: &'a Arc<WorkerPool<B>>,
    /// Password hash checks (argon2id) running at once.
    pub password_checks: &'a Semaphore,
    pub tokens: &'a TokenConfig,
    pub session_tokens: &'a SessionTokens,
}

/// The authenticated user of a hello.
pub async fn authenticate<B: Consolidated>(
    checks: &LoginChecks<'_, B>,
    hello: &Hello,
) -> Result<Login, AuthFailure> {
    let session_token = SessionTokens::is_session_token(&hello.token);
    if !hello.token.is_empty() && !session_token {
        let subject = token_subject(checks.tokens, hello).await?;
        return refuse_disabled(checks, hello, subject)
            .await
            .map(Login::without_token);
    }
    let request = AuthRequest {
        client_id: hello.client_id.clone(),
        user: hello.user.clone(),
        password: hello.password.clone(),
        script_version: hello.script_version.clone(),
        auth_parameters: hello.auth_parameters.clone(),
    };
    // A short database step on a worker; the hash check runs after it is released.
    let mut worker = checks
        .pool
        .acquire(&hello.script_version)
        .await
        .map_err(|error| AuthFailure::Sync(error.into()))?;
    let check = worker.connection().authenticate(&request).await;
    let check = match check {
        Ok(check) => {
            if wants_session_keys(checks.session_tokens, hello, &check) {
                read_session_keys(&mut worker, checks.session_tokens).await;
            }
            drop(worker);
            check
        }
        Err(SyncError::UnknownScriptVersion(_)) => {
            return login_to_unknown_version(worker, checks.password_checks, hello)
                .await
                .map(Login::without_token);
        }
        Err(error) => {
            if matches!(error, SyncError::Database(_)) {
                worker.discard();
            }
            return Err(AuthFailure::Sync(error));
        }
    };
    match check {
        AuthCheck::Script(status)
            if status == AUTH_STATUS_VALID || status == AUTH_STATUS_VALID_EXPIRING =>
        {
            Ok(Login::without_token(hello.user.clone()))
        }
        AuthCheck::Script(status) => Err(AuthFailure::Refused(format!(
            "authenticate_user refused user {:?} (status {status})",
            hello.user
        ))),
        AuthCheck::BuiltIn(stored_hash) => built_in_login(checks, stored_hash, hello).await,
    }
}

/// A built-in user's login: by session token when the hello's holds, else by password;
/// a v8 client gets a new session token after a password login, or when its token is
/// past half its life.
async fn built_in_login<B: Consolidated>(
    checks: &LoginChecks<'_, B>,
    stored_hash: Option<String>,
    hello: &Hello,
) -> Result<Login, AuthFailure> {
    let sessions = checks.session_tokens;
    let issues = hello.protocol_version >= SESSION_TOKEN_SINCE_VERSION;
    if let Some(stored_hash) = stored_hash.as_deref() {
        let login = TokenLogin {
            user: &hello.user,
            client_id: &hello.client_id,
            stored_hash,
        };
        if SessionTokens::is_session_token(&hello.token) {
            match sessions.check(&hello.token, &login) {
                Ok(renew) => {
                    return Ok(Login {
                        user: hello.user.clone(),
                        session_token: (issues && renew).then(|| sessions.issue(&login)).flatten(),
                    })
                }
                Err(refusal) => tracing::debug!(
                    "client {:?}: {refusal}; checking the password instead",
                    hello.client_id
                ),
            }
        }
    }
    let user = check_password(checks.password_checks, stored_hash.clone(), hello).await?;
    let session_token = stored_hash.filter(|_| issues).and_then(|stored_hash| {
        sessions.issue(&TokenLogin {
            user: &user,
            client_id: &hello.client_id,
            stored_hash: &stored_hash,
        })
    });
    Ok(Login {
        user,
        session_token,
    })
}

/// Whether the login step should read the session keys while it holds its worker: a
/// built-in user who may get a token (protocol 8) or logs in with one, and a server
/// that has read no key yet or not the one the token names (another server made it).
fn wants_session_keys(sessions: &SessionTokens, hello: &Hello, check: &AuthCheck) -> bool {
    let may_use_token = hello.protocol_version >= SESSION_TOKEN_SINCE_VERSION
        || SessionTokens::is_session_token(&hello.token);
    sessions.enabled()
        && may_use_token
        && matches!(check, AuthCheck::BuiltIn(Some(_)))
        && sessions.needs_keys(&hello.token)
}

/// Reads the session keys (made, in a database without one: the system tables come
/// with one, so only after an operator deleted them all). A failure only costs
/// the session token: the login goes on by password.
async fn read_session_keys<B: Consolidated>(
    worker: &mut crate::pool::Worker<B>,
    sessions: &SessionTokens,
) {
    let secret = rowsync_consolidated::new_session_secret();
    match worker.connection().session_keys(&secret).await {
        Ok(keys) => sessions.set_keys(keys),
        Err(error) => tracing::warn!("the session keys could not be read: {error}"),
    }
}

/// A hello naming a script version that does not exist: the built-in user's password is
/// checked all the same (costing what any login costs), and a refused login is told only
/// that; a user who logged in is told what to do about the version.
async fn login_to_unknown_version<B: Consolidated>(
    mut worker: crate::pool::Worker<B>,
    password_checks: &Semaphore,
    hello: &Hello,
) -> Result<String, AuthFailure> {
    let looked_up = async {
        let hash = worker.connection().password_hash(&hello.user).await?;
        let versions = worker.connection().script_versions().await?;
        Ok::<_, rowsync_consolidated::DbError>((hash, versions))
    }
    .await;
    let (stored_hash, versions) = match looked_up {
        Ok(found) => {
            drop(worker);
            found
        }
        Err(error) => {
            worker.discard();
            return Err(AuthFailure::Sync(error.into()));
        }
    };
    check_password(password_checks, stored_hash, hello).await?;
    let versions: Vec<String> = versions.into_iter().map(|(name, _)| name).collect();
    Err(AuthFailure::UnknownScriptVersion(
        crate::session::unknown_version_message(&hello.script_version, &versions),
    ))
}

/// A token's subject, unless it is a built-in user who was disabled (a short database
/// step on a login connection).
async fn refuse_disabled<B: Consolidated>(
    checks: &LoginChecks<'_, B>,
    hello: &Hello,
    subject: String,
) -> Result<String, AuthFailure> {
    let mut worker = checks
        .pool
        .acquire(&hello.script_version)
        .await
        .map_err(|error| AuthFailure::Sync(error.into()))?;
    match worker.connection().user_disabled(&subject).await {
        Ok(false) => Ok(subject),
        Ok(true) => Err(AuthFailure::Refused(format!(
            "user {subject:?} is disabled (`rowsync user enable` lets it in again)"
        ))),
        Err(error) => {
            worker.discard();
            Err(AuthFailure::Sync(error.into()))
        }
    }
}

/// A token's subject, when the token is valid and the hello names no other user.
async fn token_subject(tokens: &TokenConfig, hello: &Hello) -> Result<String, AuthFailure> {
    let subject = tokens
        .check(&hello.token)
        .await
        .map_err(|error| AuthFailure::Refused(error.to_string()))?;
    if !hello.user.is_empty() && hello.user != subject {
        return Err(AuthFailure::Refused(format!(
            "the hello names user {:?} but the token was issued to {subject:?}",
            hello.user
        )));
    }
    Ok(subject)
}

/// The hello's user, when its password matches `stored_hash` (a built-in user).
async fn check_password(
    password_checks: &Semaphore,
    stored_hash: Option<String>,
    hello: &Hello,
) -> Result<String, AuthFailure> {
    // argon2id is CPU-bound by design: a burst of logins waits its turn here rather than
    // starving the runtime's blocking threads.
    let _check = password_checks
        .acquire()
        .await
        .expect("the password check semaphore is never closed");
    let password = hello.password.clone();
    let valid =
        tokio::task::spawn_blocking(move || verify_password(stored_hash.as_deref(), &password))
            .await
            .unwrap_or(false);
    if valid {
        Ok(hello.user.clone())
    } else {
        Err(AuthFailure::Refused(
            "unknown user or wrong password".to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifies_the_right_password_only() {
        let hash = hash_password("correct horse").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(Some(&hash), "correct horse"));
        assert!(!verify_password(Some(&hash), "correct horsE"));
        assert!(!verify_password(None, "correct horse"));
        assert!(!verify_password(Some("not a hash"), "correct horse"));
    }
}
