//! Authentication, in this order: a signed token when the hello carries one; else the
//! version's `authenticate_user` script when it has one; else built-in users (argon2id
//! password hashes in `rs_user`). The user scripts see is the one authenticated here.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use std::sync::{Arc, OnceLock};

use rowsync_consolidated::scripts::{AUTH_STATUS_VALID, AUTH_STATUS_VALID_EXPIRING};
use rowsync_consolidated::{
    AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, SyncError,
};
use rowsync_protocol::Hello;

use tokio::sync::Semaphore;

use crate::pool::WorkerPool;
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

/// The authenticated user of a hello.
pub async fn authenticate<B: Consolidated>(
    pool: &Arc<WorkerPool<B>>,
    password_checks: &Semaphore,
    tokens: &TokenConfig,
    hello: &Hello,
) -> Result<String, AuthFailure> {
    if !hello.token.is_empty() {
        return token_subject(tokens, hello).await;
    }
    let request = AuthRequest {
        client_id: hello.client_id.clone(),
        user: hello.user.clone(),
        password: hello.password.clone(),
        script_version: hello.script_version.clone(),
        auth_parameters: hello.auth_parameters.clone(),
    };
    // A short database step on a worker; the hash check runs after it is released.
    let mut worker = pool
        .acquire(&hello.script_version)
        .await
        .map_err(|error| AuthFailure::Sync(error.into()))?;
    let check = worker.connection().authenticate(&request).await;
    let check = match check {
        Ok(check) => {
            drop(worker);
            check
        }
        Err(SyncError::UnknownScriptVersion(_)) => {
            return login_to_unknown_version(worker, password_checks, hello).await;
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
            Ok(hello.user.clone())
        }
        AuthCheck::Script(status) => Err(AuthFailure::Refused(format!(
            "authenticate_user refused user {:?} (status {status})",
            hello.user
        ))),
        AuthCheck::BuiltIn(stored_hash) => {
            check_password(password_checks, stored_hash, hello).await
        }
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
