//! The built-in users: listed, disabled (a disabled user's password login gets no
//! hash, so it is refused as a wrong password is), enabled again and removed.

use rowsync_consolidated::{AuthCheck, AuthRequest, ConsolidatedConnection};

use super::{Factory, Fixture};

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
