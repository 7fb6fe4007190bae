//! Sync rules (docs/rules.md): a project's members see its tasks (many-to-many
//! membership), a member added gets every task at the next sync though none changed, a
//! member removed loses them, a download never applied is sent again, writes outside
//! the member's projects are not applied, an SQL group query and column subsets.

use rowsync_consolidated::rules::RuleSet;
use rowsync_consolidated::{ConsolidatedConnection, TableInit};
use rowsync_protocol::{Row, Value};

use super::{
    assert_summary, deletes_of, key, request, text, upload, upserts_of, Factory, Fixture, RawSql,
};

const PROJECTS: &str = "
CREATE TABLE member (user_name VARCHAR(64) NOT NULL, project_id INTEGER NOT NULL, PRIMARY KEY (user_name, project_id));
CREATE TABLE task (id INTEGER PRIMARY KEY, project_id INTEGER NOT NULL, title VARCHAR(64), secret VARCHAR(64));
INSERT INTO member VALUES ('alice', 1), ('bob', 1), ('bob', 2);
INSERT INTO task VALUES (10, 1, 'design', 's1'), (11, 1, 'build', 's2'), (20, 2, 'test', 's3'), (30, 3, 'ship', 's4');
";

const MEMBERSHIP: &str = r#"
[groups.project]
table = "member"
user_column = "user_name"
group_column = "project_id"

[tables.task]
rule = "group"
column = "project_id"
group = "project"
exclude_columns = ["secret"]
"#;

const TASK_COLUMNS: [&str; 3] = ["id", "project_id", "title"];

fn task(id: i64, project: i64, title: &str) -> Row {
    vec![Value::Int(id), Value::Int(project), text(title)]
}

async fn with_rules<F: Factory>(schema: &str, rules: &str) -> Fixture<F> {
    let mut f = Fixture::<F>::new().await;
    f.sql.execute(schema).await;
    let rules = RuleSet::parse(rules).unwrap();
    for table in rules.tables.keys() {
        f.admin
            .init_rule_table(&TableInit::new(table, "", "v1"), &rules)
            .await
            .unwrap_or_else(|error| panic!("rule of {table}: {error}"));
    }
    f
}

fn tasks(outcome: &rowsync_consolidated::CollectedSync) -> Vec<Row> {
    upserts_of(outcome, "task", &TASK_COLUMNS, &["id"])
}

fn task_deletes(outcome: &rowsync_consolidated::CollectedSync) -> Vec<Row> {
    deletes_of(outcome, "task", &["id"])
}

pub async fn a_member_added_gets_every_task_and_a_member_removed_loses_them<F: Factory>() {
    let mut f = with_rules::<F>(PROJECTS, MEMBERSHIP).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    assert_eq!(
        tasks(&first),
        [task(10, 1, "design"), task(11, 1, "build")],
        "the secret column stays on the server"
    );
    let quiet = f
        .sync_ok(request("alice-1", "alice", first.watermark, 2, vec![]))
        .await;
    assert_eq!(tasks(&quiet), Vec::<Row>::new());

    // Added to project 2, whose task did not change; removed from project 1.
    f.sql
        .execute("INSERT INTO member VALUES ('alice', 2); DELETE FROM member WHERE user_name = 'alice' AND project_id = 1")
        .await;
    let moved = f
        .sync_ok(request("alice-1", "alice", quiet.watermark, 3, vec![]))
        .await;
    assert_eq!(tasks(&moved), [task(20, 2, "test")]);
    assert_eq!(task_deletes(&moved), [key(&[10]), key(&[11])]);
    let after = f
        .sync_ok(request("alice-1", "alice", moved.watermark, 4, vec![]))
        .await;
    assert_eq!((tasks(&after), task_deletes(&after)), (vec![], vec![]));

    // Bob, in both projects all along, sees both and gets nothing twice.
    let bob = f.sync_ok(request("bob-1", "bob", 0, 1, vec![])).await;
    assert_eq!(tasks(&bob).len(), 3);
}

pub async fn a_membership_change_in_a_download_never_applied_is_sent_again<F: Factory>() {
    let mut f = with_rules::<F>(PROJECTS, MEMBERSHIP).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("INSERT INTO member VALUES ('alice', 2)")
        .await;
    let lost = f
        .sync_ok(request("alice-1", "alice", first.watermark, 2, vec![]))
        .await;
    assert_eq!(tasks(&lost), [task(20, 2, "test")]);
    // The client never applied that download: it comes back with its old watermark.
    let again = f
        .sync_ok(request("alice-1", "alice", first.watermark, 3, vec![]))
        .await;
    assert_eq!(tasks(&again), [task(20, 2, "test")]);

    f.sql
        .execute("DELETE FROM member WHERE user_name = 'alice' AND project_id = 2")
        .await;
    let removed = f
        .sync_ok(request("alice-1", "alice", again.watermark, 4, vec![]))
        .await;
    assert_eq!(task_deletes(&removed), [key(&[20])]);
    let removed_again = f
        .sync_ok(request("alice-1", "alice", again.watermark, 5, vec![]))
        .await;
    assert_eq!(task_deletes(&removed_again), [key(&[20])]);
    let done = f
        .sync_ok(request(
            "alice-1",
            "alice",
            removed_again.watermark,
            6,
            vec![],
        ))
        .await;
    assert_eq!(task_deletes(&done), Vec::<Row>::new());
}

pub async fn writes_outside_the_users_groups_are_not_applied<F: Factory>() {
    let mut f = with_rules::<F>(PROJECTS, MEMBERSHIP).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let upload = upload(
        "task",
        &TASK_COLUMNS,
        &["id"],
        vec![task(12, 1, "mine"), task(31, 3, "planted")],
        vec![
            (task(30, 3, "ship"), task(30, 3, "hijacked")),
            (task(11, 1, "build"), task(11, 3, "moved away")),
        ],
        vec![key(&[20])],
    );
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![upload],
        ))
        .await;
    assert_summary(&second, 5, 4, false);
    let on_server = f
        .sql
        .query_rows("SELECT id, project_id, title FROM task ORDER BY id")
        .await;
    assert_eq!(
        on_server,
        [
            task(10, 1, "design"),
            task(11, 1, "build"),
            task(12, 1, "mine"),
            task(20, 2, "test"),
            task(30, 3, "ship")
        ]
    );
    assert_eq!(
        tasks(&second),
        [task(11, 1, "build")],
        "the server's row wins"
    );
    assert_eq!(
        task_deletes(&second),
        [key(&[20]), key(&[30]), key(&[31])],
        "rows alice may not see leave her device"
    );
}

const MAPPED: &str = r#"
[groups.project]
sql = "SELECT project_id FROM member WHERE user_name = :user AND project_id <> 2"

[tables.task]
rule = "group"
column = "project_id"
group = "project"
columns = ["id", "project_id", "title"]
"#;

pub async fn an_sql_group_query_decides_the_groups<F: Factory>() {
    let f = with_rules::<F>(PROJECTS, MAPPED).await;
    let bob = f.sync_ok(request("bob-1", "bob", 0, 1, vec![])).await;
    assert_eq!(tasks(&bob), [task(10, 1, "design"), task(11, 1, "build")]);
}

pub async fn an_owner_rule_gives_each_user_the_rows_of_its_column<F: Factory>() {
    let f = with_rules::<F>(
        "CREATE TABLE note (id INTEGER PRIMARY KEY, owner VARCHAR(64) NOT NULL, body VARCHAR(64));
         INSERT INTO note VALUES (1, 'alice', 'a'), (2, 'bob', 'b')",
        "[tables.note]\nrule = \"owner\"\ncolumn = \"owner\"\n",
    )
    .await;
    let alice = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    assert_eq!(
        upserts_of(&alice, "note", &["id", "owner", "body"], &["id"]),
        [vec![Value::Int(1), text("alice"), text("a")]]
    );
}

const CATALOGUE: &str = "
CREATE TABLE film (id INTEGER PRIMARY KEY, title VARCHAR(64) NOT NULL);
INSERT INTO film VALUES (1, 'ACADEMY DINOSAUR'), (2, 'ACE GOLDFINGER');
";

/// Issue 34: the rows of a shared table are read from the database once and served to
/// the other clients from `SharedDownloads`, whose downloads then carry the watermark
/// of the sync that read them: a change made since comes at their next sync.
pub async fn shared_rows_are_read_once_and_served_alike<F: Factory>() {
    use rowsync_consolidated::shared_download::SharedDownloads;
    use rowsync_consolidated::Consolidated;
    use std::sync::atomic::Ordering;
    let mut f = with_rules::<F>(CATALOGUE, "[tables.film]\nrule = \"shared\"\n").await;
    let shared = SharedDownloads::new(1 << 20, std::time::Duration::from_secs(600));
    let sync = |client: &'static str, watermark: i64, sequence: u64| {
        let shared = std::sync::Arc::clone(&shared);
        let backend = f.backend.clone();
        async move {
            let mut connection = backend.connect().await.unwrap();
            let request = request(client, "alice", watermark, sequence, vec![]);
            rowsync_consolidated::sync_and_collect_shared(
                &mut connection,
                std::sync::Arc::new(request),
                Some(shared),
            )
            .await
            .unwrap()
        }
    };
    let film = |outcome: &rowsync_consolidated::CollectedSync| {
        upserts_of(outcome, "film", &["id", "title"], &["id"])
    };
    let first = sync("alice-1", 0, 1).await;
    assert_eq!(shared.hits.load(Ordering::Relaxed), 0);
    let second = sync("alice-2", 0, 1).await;
    assert_eq!(film(&second), film(&first));
    assert_eq!(film(&first).len(), 2);
    assert_eq!(
        shared.hits.load(Ordering::Relaxed),
        2,
        "both cursors of the second sync"
    );
    assert_eq!(
        second.watermark, first.watermark,
        "the watermark of the rows served"
    );

    f.sql
        .execute("UPDATE film SET title = 'ACADEMY DINOSAURS' WHERE id = 1")
        .await;
    let third = sync("alice-3", 0, 1).await;
    assert_eq!(
        film(&third),
        film(&first),
        "served as read, with their watermark"
    );
    assert_eq!(third.watermark, first.watermark);
    let next = sync("alice-3", third.watermark, 2).await;
    assert_eq!(
        film(&next),
        [vec![Value::Int(1), text("ACADEMY DINOSAURS")]],
        "the change comes at the next sync"
    );
}

/// A member removed from a project since its last sync may no longer write the
/// project's tasks at its next sync: writes are checked against the membership now, not
/// against the groups the client had.
pub async fn a_member_removed_cannot_write_at_the_next_sync<F: Factory>() {
    let mut f = with_rules::<F>(PROJECTS, MEMBERSHIP).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("DELETE FROM member WHERE user_name = 'alice' AND project_id = 1")
        .await;
    let upload = upload(
        "task",
        &TASK_COLUMNS,
        &["id"],
        vec![task(13, 1, "late insert")],
        vec![(task(10, 1, "design"), task(10, 1, "late edit"))],
        vec![key(&[11])],
    );
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![upload],
        ))
        .await;
    assert_summary(&second, 3, 3, false);
    let on_server = f
        .sql
        .query_rows("SELECT id, project_id, title FROM task WHERE project_id = 1 ORDER BY id")
        .await;
    assert_eq!(on_server, [task(10, 1, "design"), task(11, 1, "build")]);
    // Task 11 she deleted herself; 10 and 13 leave her device.
    assert_eq!(task_deletes(&second), [key(&[10]), key(&[13])]);
}
