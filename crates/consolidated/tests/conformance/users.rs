//! The built-in users: listed, disabled (a disabled user's password login gets no
//! hash, so it is refused as a wrong password is), enabled again and removed.

use rowsync_consolidated::{
    AuthCheck, AuthRequest, Consolidated, ConsolidatedConnection, LoginFailures,
};

use super::{Factory, Fixture, RawSql};

fn login(user: &str) -> AuthRequest {
    AuthRequest {
        client_id: "c1".into(),
        user: user.into(),
        password: "secret".into(),
        script_version: "v1".into(),
        auth_parameters: Vec::new(),
    }
}

async fn built_in_hash<F: Factory>(f: &mut Fixture<F>, user: &str) -> Option<String> {
    f.admin.add_script_version("v1", "").await.unwrap();
    match f.admin.authenticate(&login(user)).await.unwrap() {
        AuthCheck::BuiltIn(hash) => hash,
        other => panic!("no authenticate_user script, yet {other:?}"),
    }
}

pub async fn users_are_listed_disabled_enabled_and_removed<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    f.admin.set_user("bob", "hash-b").await.unwrap();
    f.admin.set_user("alice", "hash-a").await.unwrap();
    let listed: Vec<(String, bool)> = f
        .admin
        .users()
        .await
        .unwrap()
        .into_iter()
        .map(|user| (user.name, user.disabled))
        .collect();
    assert_eq!(
        listed,
        [("alice".to_string(), false), ("bob".to_string(), false)]
    );

    assert!(f.admin.set_user_disabled("alice", true).await.unwrap());
    assert!(
        f.admin.set_user_disabled("alice", true).await.unwrap(),
        "again: still found"
    );
    assert_eq!(f.admin.password_hash("alice").await.unwrap(), None);
    assert_eq!(built_in_hash(&mut f, "alice").await, None);
    assert_eq!(
        built_in_hash(&mut f, "bob").await.as_deref(),
        Some("hash-b")
    );
    let alice = &f.admin.users().await.unwrap()[0];
    assert!(alice.disabled && !alice.created_at.is_empty(), "{alice:?}");

    assert!(f.admin.set_user_disabled("alice", false).await.unwrap());
    assert_eq!(
        built_in_hash(&mut f, "alice").await.as_deref(),
        Some("hash-a")
    );

    assert!(f.admin.remove_user("bob").await.unwrap());
    assert!(!f.admin.remove_user("bob").await.unwrap());
    assert!(!f.admin.set_user_disabled("bob", true).await.unwrap());
    assert_eq!(f.admin.password_hash("bob").await.unwrap(), None);
    let names: Vec<String> = f
        .admin
        .users()
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.name)
        .collect();
    assert_eq!(names, ["alice"]);
    f.admin.install_system_tables().await.unwrap();
    assert_eq!(
        f.admin.users().await.unwrap().len(),
        1,
        "installing again keeps users"
    );
}

/// The system tables come with one key; later calls (as another server would make
/// them) find it and store none of their own; with every key deleted, the next call
/// stores its secret.
pub async fn session_keys_are_made_once_and_kept<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let installed = f.admin.session_keys("secret-one").await.unwrap();
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].secret.len(), 64, "32 random bytes, hex");
    assert_ne!(installed[0].secret, "secret-one");
    let mut other = f.backend.connect().await.unwrap();
    assert_eq!(other.session_keys("secret-two").await.unwrap(), installed);
    f.admin.install_system_tables().await.unwrap();
    assert_eq!(
        f.admin.session_keys("x").await.unwrap(),
        installed,
        "installed again: kept"
    );
    f.sql.execute("DELETE FROM rs_session_key").await;
    let made = f.admin.session_keys("secret-three").await.unwrap();
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].secret, "secret-three");
}

fn counted(key: &str, failures: i64, since_unix_ms: i64) -> LoginFailures {
    LoginFailures {
        key: key.into(),
        failures,
        since_unix_ms,
    }
}

/// Each server stores its refused logins and reads the others': a key's count is
/// replaced, not added to, and rows counted before the window are dropped.
pub async fn refused_logins_are_shared_between_servers<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let mut other = f.backend.connect().await.unwrap();
    let from_b = f
        .admin
        .share_login_failures("server-a", &[counted("u|bob", 2, 1_000)], 500)
        .await
        .unwrap();
    assert_eq!(from_b, [], "nothing from other servers yet");
    let shared = vec![counted("u|bob", 3, 1_200), counted("a|10.0.0.9", 1, 900)];
    let from_a = other
        .share_login_failures("server-b", &shared, 500)
        .await
        .unwrap();
    assert_eq!(from_a, [counted("u|bob", 2, 1_000)]);
    f.admin
        .share_login_failures("server-a", &[counted("u|bob", 4, 1_000)], 500)
        .await
        .unwrap();
    let mut from_a = other
        .share_login_failures("server-b", &[], 950)
        .await
        .unwrap();
    from_a.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        from_a,
        [counted("u|bob", 4, 1_000)],
        "replaced; b's own not read"
    );
    let mut from_b = f
        .admin
        .share_login_failures("server-a", &[], 950)
        .await
        .unwrap();
    from_b.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        from_b,
        [counted("u|bob", 3, 1_200)],
        "the address counted at 900, before the window at 950, is gone"
    );
}

/// The servers alive are those heard of since the given time, each once.
pub async fn the_servers_of_a_farm_are_those_heard_of_lately<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    let mut other = f.backend.connect().await.unwrap();
    assert_eq!(f.admin.farm_servers("a", 1_000, 0).await.unwrap(), 1);
    assert_eq!(other.farm_servers("b", 1_100, 0).await.unwrap(), 2);
    assert_eq!(
        f.admin.farm_servers("a", 1_200, 0).await.unwrap(),
        2,
        "a once"
    );
    assert_eq!(
        f.admin.farm_servers("a", 5_000, 1_150).await.unwrap(),
        1,
        "b, last heard of at 1100, is gone"
    );
}

/// Whether a user is a disabled built-in one (a token's subject may be no built-in user).
pub async fn a_disabled_user_is_told_from_an_unknown_one<F: Factory>() {
    let mut f = Fixture::<F>::new().await;
    f.admin.set_user("alice", "hash-a").await.unwrap();
    assert!(!f.admin.user_disabled("alice").await.unwrap());
    assert!(f.admin.set_user_disabled("alice", true).await.unwrap());
    assert!(f.admin.user_disabled("alice").await.unwrap());
    assert!(
        !f.admin.user_disabled("nobody").await.unwrap(),
        "unknown: not disabled"
    );
}
