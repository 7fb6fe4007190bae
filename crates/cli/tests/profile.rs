//! `rowsync profile` on a real PostgreSQL: the profiler names the row every sync's
//! `end_synchronization` updates, the plan advisor names the full scan of a hand-written
//! cursor that filters an unindexed column (and proposes its index), and the default
//! scripts come out clean. Every verdict comes from what the sessions waited on and
//! what the plans did, never from times.

mod support;

use rowsync_cli::profile::report::{PlanReport, TargetReport, VerdictKind};
use rowsync_cli::profile::{self, ProfileOptions, ProfileReport};
use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, ScriptEntry, TableInit};

const USERS: [&str; 3] = ["ann", "bob", "cy"];
/// Rows per user: few enough that no plan estimate reaches the advisor's floor.
const ROWS_PER_USER: usize = 30;

/// A fresh database with `notes` partitioned by owner under version v1's default scripts.
async fn database(prefix: &str) -> (String, rowsync_consolidated::postgres::PostgresConnection) {
    let url = rowsync_testkit::fresh_database(prefix).await;
    let mut connection = PostgresConsolidated::new(url.clone())
        .connect()
        .await
        .unwrap();
    let mut rows = Vec::new();
    for user in USERS {
        for index in 0..ROWS_PER_USER {
            rows.push(format!("('{user}-{index}', '{user}', 'note {index}')"));
        }
    }
    connection
        .execute_sql(&format!(
            "CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT); \
             INSERT INTO notes VALUES {}",
            rows.join(", ")
        ))
        .await
        .unwrap();
    connection.install_system_tables().await.unwrap();
    connection
        .init_table(&TableInit::new("notes", "owner", "v1"))
        .await
        .unwrap();
    connection.execute_sql("ANALYZE notes").await.unwrap();
    (url, connection)
}

fn options(url: &str, syncs: bool, plans: bool) -> ProfileOptions {
    ProfileOptions {
        url: url.to_string(),
        script_version: "v1".into(),
        recording: None,
        copies: vec![1, 2],
        rounds: 1,
        upload_rows: 5,
        syncs,
        cores: 2,
        plans,
    }
}

fn target<'r>(report: &'r ProfileReport, name: &str) -> &'r TargetReport {
    report
        .targets
        .iter()
        .find(|target| target.name == name)
        .unwrap_or_else(|| panic!("no target {name}: {}", profile::report::render(report)))
}

fn plan<'r>(report: &'r ProfileReport, table: &str, event: &str) -> &'r PlanReport {
    report
        .plans
        .as_ref()
        .unwrap()
        .iter()
        .find(|plan| plan.table == table && plan.event == event)
        .unwrap_or_else(|| panic!("no plan of {table} {event}"))
}

#[tokio::test]
async fn a_counter_row_every_sync_updates_is_named_a_hot_row() {
    let (url, mut connection) = database("profile_hot").await;
    connection
        .execute_sql("CREATE TABLE sync_counter (id INTEGER PRIMARY KEY, syncs BIGINT NOT NULL); INSERT INTO sync_counter VALUES (1, 0)")
        .await
        .unwrap();
    connection
        .set_script(&ScriptEntry {
            script_version: "v1".into(),
            table: String::new(),
            event: "end_synchronization".into(),
            script: "UPDATE sync_counter SET syncs = syncs + 1 WHERE id = 1".into(),
        })
        .await
        .unwrap();
    let report = profile::run(&options(&url, true, false)).await.unwrap();
    let counter = target(&report, "end_synchronization");
    assert_eq!(
        counter.verdict.kind,
        VerdictKind::HotRow,
        "{}",
        profile::report::render(&report)
    );
    assert!(
        counter
            .hot_rows
            .iter()
            .any(|row| row.relation == "sync_counter" && row.key == "id=1"),
        "{:?}",
        counter.hot_rows
    );
    assert!(
        counter.verdict.remedy.contains("per client"),
        "{}",
        counter.verdict.remedy
    );
    // Rolled back: profiling the script alone changed nothing; whole syncs committed.
    let rows = connection
        .query_sql("SELECT count(*) FROM notes")
        .await
        .unwrap();
    assert_eq!(
        rows[0][0],
        rowsync_protocol::Value::Int((USERS.len() * ROWS_PER_USER) as i64)
    );
    let subscriptions = connection
        .query_sql("SELECT count(*) FROM rs_subscription")
        .await
        .unwrap();
    assert_eq!(
        subscriptions[0][0],
        rowsync_protocol::Value::Int(0),
        "the profile's clients are removed"
    );
}

#[tokio::test]
async fn a_hand_written_cursor_on_an_unindexed_column_is_a_full_scan_with_its_index() {
    let (url, mut connection) = database("profile_scan").await;
    connection
        .set_script(&ScriptEntry {
            script_version: "v1".into(),
            table: "notes".into(),
            event: "download_cursor".into(),
            script: "SELECT t.id, t.owner, t.body FROM notes AS t WHERE t.body = :user".into(),
        })
        .await
        .unwrap();
    let report = profile::run(&options(&url, false, true)).await.unwrap();
    let cursor = plan(&report, "notes", "download_cursor");
    let scan = cursor
        .findings
        .iter()
        .find(|finding| finding.kind == "full_scan")
        .unwrap_or_else(|| {
            panic!(
                "{}",
                profile::report::render_plans(report.plans.as_ref().unwrap())
            )
        });
    let proposal = scan.proposal.as_deref().unwrap();
    assert!(proposal.starts_with("CREATE INDEX ON"), "{proposal}");
    assert!(proposal.contains("body"), "{proposal}");
    // The proposal is valid SQL that then serves the cursor: the finding goes away.
    connection.execute_sql(proposal).await.unwrap();
    let report = profile::run(&options(&url, false, true)).await.unwrap();
    let cursor = plan(&report, "notes", "download_cursor");
    assert!(cursor.findings.is_empty(), "{:?}", cursor.findings);
}

#[tokio::test]
async fn the_default_scripts_come_out_clean() {
    let (url, _connection) = database("profile_clean").await;
    let report = profile::run(&options(&url, true, true)).await.unwrap();
    let text = profile::report::render(&report);
    for target in &report.targets {
        assert!(
            matches!(
                target.verdict.kind,
                VerdictKind::Clean | VerdictKind::Convoy
            ),
            "{}: {}\n{text}",
            target.name,
            target.verdict.finding
        );
        assert!(target.hot_rows.is_empty(), "{text}");
        assert!(target.runs.iter().all(|run| run.errors == 0), "{text}");
    }
    for name in [
        "notes download_cursor",
        "sync download",
        "sync upload_update",
        "sync upload_delete",
        "sync upload_insert",
    ] {
        target(&report, name);
    }
    for plan in report.plans.as_ref().unwrap() {
        assert!(plan.error.is_none() && plan.findings.is_empty(), "{text}");
    }
    assert!(report.plans.as_ref().unwrap().len() >= 6, "{text}");
}

#[tokio::test]
async fn on_sqlite_the_advisor_names_the_scan_of_a_hand_written_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("central.db");
    let backend = rowsync_consolidated::sqlite::SqliteConsolidated::new(path.clone());
    let mut connection = backend.connect().await.unwrap();
    connection
        .execute_sql("CREATE TABLE notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT); INSERT INTO notes VALUES ('a', 'ann', 'x')")
        .await
        .unwrap();
    connection.install_system_tables().await.unwrap();
    connection
        .init_table(&TableInit::new("notes", "owner", "v1"))
        .await
        .unwrap();
    let advise = |path: std::path::PathBuf| async move {
        tokio::task::spawn_blocking(move || profile::plans_sqlite::advise(&path, "v1"))
            .await
            .unwrap()
            .unwrap()
    };
    let plans = advise(path.clone()).await;
    assert!(
        plans
            .iter()
            .all(|plan| plan.findings.is_empty() && plan.error.is_none()),
        "{}",
        profile::report::render_plans(&plans)
    );
    connection
        .set_script(&ScriptEntry {
            script_version: "v1".into(),
            table: "notes".into(),
            event: "download_cursor".into(),
            script: "SELECT t.id, t.owner, t.body FROM notes AS t WHERE t.body = :user".into(),
        })
        .await
        .unwrap();
    let plans = advise(path).await;
    let text = profile::report::render_plans(&plans);
    let cursor = plans
        .iter()
        .find(|plan| plan.event == "download_cursor")
        .unwrap();
    let proposal = cursor.findings[0]
        .proposal
        .as_deref()
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        proposal.starts_with("CREATE INDEX") && proposal.contains("\"body\""),
        "{text}"
    );
}
