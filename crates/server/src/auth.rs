//! Built-in users: argon2id password hashes in `rs_user`.

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use std::sync::OnceLock;

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
