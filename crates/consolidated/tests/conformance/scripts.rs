//! The script model on every backend: events and their order, row and set scripts,
//! versions, errors, download acknowledgement, `authenticate_user`, bound parameters.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use super::*;
use rowsync_consolidated::{AuthCheck, AuthRequest, DownloadAckRequest, ScriptEntry};

const EVENT_LOG_DDL: &str = "CREATE TABLE event_log (n INTEGER, event TEXT, detail TEXT)";

/// A script that appends `event` (and `detail`, SQL over bound parameters) to event_log.
fn log_script(event: &str, detail: &str) -> String {
    format!(
        "INSERT INTO event_log (n, event, detail) SELECT count(*), '{event}', {detail} FROM event_log"
    )
}

impl<F: Factory> Fixture<F> {
    async fn set_script(&mut self, version: &str, table: &str, event: &str, script: &str) {
        self.admin
            .set_script(&ScriptEntry {
                script_version: version.into(),
                table: table.into(),
                event: event.into(),
                script: script.into(),
            })
            .await
            .unwrap_or_else(|error| panic!("set {event} of {version}: {error}"));
    }

    async fn event_log(&mut self) -> Vec<String> {
        self.sql
            .query_rows("SELECT event FROM event_log ORDER BY n")
            .await
            .into_iter()
            .map(|row| match &row[0] {
                Value::Text(event) => event.clone(),
                other => panic!("event {other:?}"),
            })
            .collect()
    }

    async fn event_details(&mut self, event: &str) -> Vec<Value> {
        self.sql
            .query_rows(&format!(
                "SELECT detail FROM event_log WHERE event = '{event}' ORDER BY n"
            ))
            .await
            .into_iter()
            .map(|mut row| row.remove(0))
            .collect()
    }

    /// Replaces the default upload set scripts of orders with row scripts.
    async fn use_row_scripts(&mut self, version: &str) {
        for (event, script) in [
            (
                "upload_insert",
                "INSERT INTO orders (id, rep, item, quantity, amount) VALUES (:new.id, :user, :new.item, :new.quantity, :new.amount)",
            ),
            (
                "upload_update",
                "UPDATE orders SET item = :new.item, quantity = :new.quantity, amount = :new.amount \
                 WHERE id = :old.id AND rep = :user AND quantity = :old.quantity",
            ),
            ("upload_delete", "DELETE FROM orders WHERE id = :old.id AND rep = :user"),
        ] {
            self.set_script(version, "orders", event, script).await;
        }
    }
}

fn versioned(mut request: SyncRequest, version: &str) -> SyncRequest {
    request.script_version = version.into();
    request
}

pub async fn connection_events_run_in_order_each_in_its_transaction<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql.execute(EVENT_LOG_DDL).await;
    for event in [
        "begin_connection",
        "begin_synchronization",
        "begin_upload",
        "end_upload",
        "modify_next_last_download",
        "begin_download",
        "end_download",
        "end_synchronization",
    ] {
        f.set_script("v1", "", event, &log_script(event, ":user"))
            .await;
    }
    let mut connection = f.backend.connect().await.expect("connect");
    let insert = orders_upload(vec![order(1, "alice", "pen", 1, None)], vec![], vec![]);
    sync_and_collect(
        &mut connection,
        Arc::new(request("c1", "alice", 0, 1, vec![insert])),
    )
    .await
    .expect("first sync");
    let expected = [
        "begin_connection",
        "begin_synchronization",
        "begin_upload",
        "end_upload",
        "modify_next_last_download",
        "begin_download",
        "end_download",
        "end_synchronization",
    ];
    assert_eq!(f.event_log().await, expected);
    // The same pooled connection does not run begin_connection again; a resent upload
    // (sequence 1 again) runs no upload events.
    sync_and_collect(
        &mut connection,
        Arc::new(request("c1", "alice", 0, 1, vec![])),
    )
    .await
    .expect("second sync");
    let log = f.event_log().await;
    assert_eq!(
        &log[expected.len()..],
        [
            "begin_synchronization",
            "modify_next_last_download",
            "begin_download",
            "end_download",
            "end_synchronization"
        ]
    );
    assert_eq!(f.event_details("begin_upload").await, vec![text("alice")]);

    // A failing event rolls back everything of its sync transaction; report_error
    // records the failure in its own transaction.
    f.set_script(
        "v1",
        "",
        "end_synchronization",
        "INSERT INTO no_such_table VALUES (1)",
    )
    .await;
    f.set_script(
        "v1",
        "",
        "report_error",
        &log_script(
            "report_error",
            ":error_event || '/' || :error_table || '/' || :client_id",
        ),
    )
    .await;
    let before = f.event_log().await.len();
    let insert = orders_upload(vec![order(2, "alice", "ink", 2, None)], vec![], vec![]);
    let error = sync_and_collect(
        &mut connection,
        Arc::new(request("c1", "alice", 0, 2, vec![insert])),
    )
    .await
    .expect_err("a failing end_synchronization fails the sync");
    match &error {
        SyncError::Script { event, .. } => assert_eq!(event, "end_synchronization"),
        other => panic!("expected a script error, got {other}"),
    }
    assert_eq!(error.code(), ErrorCode::Script);
    assert_eq!(f.orders().await, vec![order(1, "alice", "pen", 1, None)]);
    let log = f.event_log().await;
    assert_eq!(
        log[before..],
        ["report_error"],
        "only report_error's row stays"
    );
    assert_eq!(
        f.event_details("report_error").await,
        vec![text("end_synchronization//c1")]
    );
}

pub async fn modify_next_last_download_replaces_the_watermark<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.set_script(
        "v1",
        "",
        "modify_next_last_download",
        &format!(
            "SELECT {} * 0 + 424242",
            F::cast(":next_last_download", CastType::BigInt)
        ),
    )
    .await;
    let modified = f.sync_ok(request("c1", "alice", 0, 1, vec![])).await;
    assert_eq!(modified.watermark, 424242);
    assert_eq!(
        f.sql
            .query_rows("SELECT download_watermark FROM rs_subscription WHERE client_id = 'c1'")
            .await,
        vec![vec![Value::Int(424242)]]
    );
    assert!(f
        .admin
        .remove_script("v1", "", "modify_next_last_download")
        .await
        .expect("remove"));
    let unmodified = f.sync_ok(request("c2", "alice", 0, 1, vec![])).await;
    assert_ne!(unmodified.watermark, 424242);
}

pub async fn row_scripts_apply_each_row_and_find_conflicts<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let two = order(2, "alice", "ink", 2, None);
    let three = order(3, "alice", "cap", 3, None);
    let mut f = Fixture::<F>::with_orders(&[one.clone(), two.clone(), three.clone()]).await;
    f.use_row_scripts("v1").await;
    let first = f.sync_ok(request("c1", "alice", 0, 1, vec![])).await;
    f.sql
        .execute("UPDATE orders SET quantity = 30 WHERE id = 3")
        .await;
    let outcome = f
        .sync_ok(request(
            "c1",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(
                vec![order(4, "alice", "nib", 4, None)],
                vec![
                    (two.clone(), with(&two, 3, Value::Int(20))),
                    (three.clone(), with(&three, 3, Value::Int(33))),
                ],
                vec![key(&[1])],
            )],
        ))
        .await;
    let orders = f.orders().await;
    assert_eq!(
        orders,
        vec![
            with(&two, 3, Value::Int(20)),
            order(3, "alice", "cap", 30, None),
            order(4, "alice", "nib", 4, None),
        ]
    );
    assert_eq!(outcome.summary.conflicts, 1, "the stale update of 3");
    assert_eq!(
        order_upserts(&outcome),
        vec![order(3, "alice", "cap", 30, None)]
    );
}

pub async fn a_failing_row_script_rolls_back_or_is_skipped_by_handle_error<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql.execute(EVENT_LOG_DDL).await;
    f.set_script(
        "v1",
        "orders",
        "upload_insert",
        "INSERT INTO orders (id, rep, item, quantity, amount) VALUES (:new.id, CASE WHEN :new.item = 'bad' THEN NULL ELSE :user END, :new.item, :new.quantity, :new.amount)",
    )
    .await;
    let rows = vec![
        order(1, "alice", "pen", 1, None),
        order(2, "alice", "bad", 2, None),
        order(3, "alice", "ink", 3, None),
    ];
    let upload = || orders_upload(rows.clone(), vec![], vec![]);
    let error = f
        .sync(request("c1", "alice", 0, 1, vec![upload()]))
        .await
        .expect_err("a NOT NULL violation fails the sync");
    match &error {
        SyncError::Script {
            event,
            table,
            row_key,
            message,
            ..
        } => {
            assert_eq!(
                (event.as_str(), table.as_str()),
                ("upload_insert", "orders")
            );
            assert_eq!(row_key.as_deref(), Some("(2)"));
            assert!(message.to_lowercase().contains("null"), "{message}");
        }
        other => panic!("expected a script error, got {other}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("upload_insert") && text.contains("orders") && text.contains("(2)"),
        "{text}"
    );
    assert_eq!(
        f.orders().await,
        Vec::<Row>::new(),
        "nothing is half-applied"
    );

    // handle_error asking for a rollback changes nothing.
    f.set_script("v1", "", "handle_error", "SELECT 3000").await;
    f.sync(request("c1", "alice", 0, 1, vec![upload()]))
        .await
        .expect_err("rolled back");
    assert_eq!(f.orders().await, Vec::<Row>::new());

    // handle_error skipping the row: the others land, the skipped row is a conflict the
    // client is told to drop (the server has no such row).
    f.set_script(
        "v1",
        "",
        "handle_error",
        "SELECT CASE WHEN :error_event = 'upload_insert' AND :error_row_key = '(2)' THEN 1000 ELSE 3000 END",
    )
    .await;
    let outcome = f
        .sync_ok(request("c1", "alice", 0, 1, vec![upload()]))
        .await;
    assert_eq!(
        f.orders().await,
        vec![
            order(1, "alice", "pen", 1, None),
            order(3, "alice", "ink", 3, None)
        ]
    );
    assert_eq!(outcome.summary.conflicts, 1);
    assert_eq!(order_deletes(&outcome), vec![key(&[2])]);
}

pub async fn resolve_conflict_sees_old_new_and_current_rows_in_both_forms<F: Factory>() {
    let one = order(1, "alice", "pen", 10, None);
    let two = order(2, "alice", "ink", 10, None);
    let mut f = Fixture::<F>::with_orders(&[one.clone(), two.clone()]).await;
    let first = f.sync_ok(request("c1", "alice", 0, 1, vec![])).await;
    // Row form: the client added 3 to a quantity the server meanwhile raised to 15.
    f.set_script(
        "v1",
        "orders",
        "resolve_conflict",
        &format!(
            "UPDATE orders SET quantity = {} + {} - {} WHERE id = :new.id AND {} = 'update'",
            F::cast(":current.quantity", CastType::Integer),
            F::cast(":new.quantity", CastType::Integer),
            F::cast(":old.quantity", CastType::Integer),
            F::cast(":operation", CastType::Text)
        ),
    )
    .await;
    f.sql
        .execute("UPDATE orders SET quantity = 15 WHERE id = 1")
        .await;
    let outcome = f
        .sync_ok(request(
            "c1",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(
                vec![],
                vec![(one.clone(), with(&one, 3, Value::Int(13)))],
                vec![],
            )],
        ))
        .await;
    assert_eq!(outcome.summary.conflicts, 1);
    assert_eq!(order_upserts(&outcome), vec![with(&one, 3, Value::Int(18))]);
    // Set form over {conflicts}: the same merge for row 2.
    f.set_script(
        "v1",
        "orders",
        "resolve_conflict",
        "UPDATE orders SET quantity = quantity + (SELECT c.quantity - c.rs_old_quantity FROM {conflicts} AS c \
         WHERE c.id = orders.id AND c.rs_operation = 'update') WHERE id IN (SELECT id FROM {conflicts})",
    )
    .await;
    f.sql
        .execute("UPDATE orders SET quantity = 100 WHERE id = 2")
        .await;
    let outcome = f
        .sync_ok(request(
            "c1",
            "alice",
            outcome.watermark,
            3,
            vec![orders_upload(
                vec![],
                vec![(two.clone(), with(&two, 3, Value::Int(7)))],
                vec![],
            )],
        ))
        .await;
    assert_eq!(outcome.summary.conflicts, 1);
    assert_eq!(order_upserts(&outcome), vec![with(&two, 3, Value::Int(97))]);
    assert_eq!(
        f.orders().await,
        vec![with(&one, 3, Value::Int(18)), with(&two, 3, Value::Int(97))]
    );
}

pub async fn versions_coexist_and_a_changed_script_applies_from_the_next_sync<F: Factory>() {
    let rows = [
        order(1, "alice", "pen", 1, None),
        order(2, "alice", "ink", 9, None),
    ];
    let mut f = Fixture::<F>::with_orders(&rows).await;
    f.admin
        .add_script_version("v2", "big orders only")
        .await
        .expect("add v2");
    for entry in f.admin.scripts(Some("v1")).await.expect("list v1") {
        f.set_script("v2", &entry.table, &entry.event, &entry.script)
            .await;
    }
    let v1_cursor = f.current_script("orders", "download_cursor").await;
    f.set_script(
        "v2",
        "orders",
        "download_cursor",
        &format!("SELECT * FROM ({v1_cursor}) AS c WHERE c.quantity > 5"),
    )
    .await;
    f.use_row_scripts("v2").await;
    // Two clients at once, one per version.
    let (old, new) = tokio::join!(
        f.sync(request("c1", "alice", 0, 1, vec![])),
        f.sync(versioned(request("c2", "alice", 0, 1, vec![]), "v2")),
    );
    let (old, new) = (old.expect("v1 sync"), new.expect("v2 sync"));
    assert_eq!(order_upserts(&old), rows.to_vec());
    assert_eq!(order_upserts(&new), vec![rows[1].clone()]);
    // v2 applies uploads with its row scripts.
    let inserted = f
        .sync_ok(versioned(
            request(
                "c2",
                "alice",
                new.watermark,
                2,
                vec![orders_upload(
                    vec![order(3, "alice", "cap", 7, None)],
                    vec![],
                    vec![],
                )],
            ),
            "v2",
        ))
        .await;
    assert_eq!(inserted.summary.conflicts, 0);
    let versions: Vec<String> = f
        .admin
        .script_versions()
        .await
        .expect("versions")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(versions, ["v1", "v2"]);

    // A script changed between two syncs on one pooled connection is used by the second.
    let mut connection = f.backend.connect().await.expect("connect");
    let before = sync_and_collect(
        &mut connection,
        Arc::new(versioned(request("c3", "alice", 0, 1, vec![]), "v2")),
    )
    .await
    .expect("sync");
    assert_eq!(
        order_upserts(&before).len(),
        2,
        "ids 2 and 3: {:?}",
        order_upserts(&before)
    );
    f.set_script(
        "v2",
        "orders",
        "download_cursor",
        &format!("SELECT * FROM ({v1_cursor}) AS c WHERE c.quantity > 8"),
    )
    .await;
    let after = sync_and_collect(
        &mut connection,
        Arc::new(versioned(request("c4", "alice", 0, 1, vec![]), "v2")),
    )
    .await
    .expect("sync");
    assert_eq!(order_upserts(&after), vec![rows[1].clone()]);
}

pub async fn download_ack_records_the_watermark_and_runs_its_script<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[order(1, "alice", "pen", 1, None)]).await;
    f.sql.execute(EVENT_LOG_DDL).await;
    f.set_script(
        "v1",
        "",
        "download_ack",
        &log_script("download_ack", ":watermark"),
    )
    .await;
    let outcome = f.sync_ok(request("c1", "alice", 0, 1, vec![])).await;
    let acknowledged = "SELECT download_acknowledged FROM rs_subscription WHERE client_id = 'c1'";
    assert_eq!(
        f.sql.query_rows(acknowledged).await,
        vec![vec![Value::Int(0)]]
    );
    let ack = |watermark| DownloadAckRequest {
        client_id: "c1".into(),
        user: "alice".into(),
        script_version: "v1".into(),
        watermark,
        auth_parameters: Vec::new(),
    };
    let mut connection = f.backend.connect().await.expect("connect");
    assert!(
        !connection
            .acknowledge_download(&ack(outcome.watermark + 1))
            .await
            .expect("ack"),
        "a watermark never sent is not acknowledged"
    );
    assert_eq!(f.event_log().await, Vec::<String>::new());
    // Issue 15, finding 11: another user's client id was code 1 ("not the last
    // watermark"); it is code 10, as for a sync, and nothing is recorded.
    let mut foreign = ack(outcome.watermark);
    foreign.user = "bob".into();
    let error = connection
        .acknowledge_download(&foreign)
        .await
        .expect_err("another user's client id");
    assert_eq!(error.code(), ErrorCode::ClientIdTaken, "{error:?}");
    assert_eq!(f.event_log().await, Vec::<String>::new());
    assert!(connection
        .acknowledge_download(&ack(outcome.watermark))
        .await
        .expect("ack"));
    assert_eq!(
        f.sql.query_rows(acknowledged).await,
        vec![vec![Value::Int(outcome.watermark)]]
    );
    assert_eq!(f.event_details("download_ack").await.len(), 1);
}

pub async fn authenticate_user_script_decides_logins<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql.execute(EVENT_LOG_DDL).await;
    f.admin
        .set_user("alice", "$argon2id$stored")
        .await
        .expect("user");
    let login = |user: &str, password: &str, site: &str| AuthRequest {
        client_id: "c1".into(),
        user: user.into(),
        password: password.into(),
        script_version: "v1".into(),
        auth_parameters: vec![site.into()],
    };
    let mut connection = f.backend.connect().await.expect("connect");
    assert_eq!(
        connection
            .authenticate(&login("alice", "x", "s"))
            .await
            .expect("built-in"),
        AuthCheck::BuiltIn(Some("$argon2id$stored".into()))
    );
    assert_eq!(
        connection
            .authenticate(&login("nobody", "x", "s"))
            .await
            .expect("built-in"),
        AuthCheck::BuiltIn(None)
    );
    f.set_script(
        "v1",
        "",
        "authenticate_user",
        "SELECT CASE WHEN :password = 'open sesame' AND :auth_1 = 'site-9' THEN 1000 ELSE 3000 END",
    )
    .await;
    f.set_script(
        "v1",
        "",
        "begin_connection",
        &log_script("begin_connection", "NULL"),
    )
    .await;
    assert_eq!(
        connection
            .authenticate(&login("zed", "open sesame", "site-9"))
            .await
            .expect("script"),
        AuthCheck::Script(1000)
    );
    assert_eq!(
        connection
            .authenticate(&login("zed", "open sesame", "site-1"))
            .await
            .expect("script"),
        AuthCheck::Script(3000)
    );
    f.set_script("v1", "", "authenticate_user", "SELECT 1 WHERE 1 = 0")
        .await;
    let error = connection
        .authenticate(&login("zed", "open sesame", "site-9"))
        .await
        .expect_err("no status");
    assert!(error.to_string().contains("authenticate_user"), "{error}");
}

/// Hostile text in every value a client controls.
pub const PAYLOADS: [&str; 3] = [
    "x'); DROP TABLE orders; --",
    "' OR '1'='1",
    "\"; DELETE FROM orders WHERE 1=1; --",
];

pub async fn hostile_values_in_every_parameter_are_data_not_sql<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[order(1, "bob", "pen", 1, None)]).await;
    f.sql.execute(EVENT_LOG_DDL).await;
    for event in ["begin_synchronization", "end_upload", "end_synchronization"] {
        f.set_script(
            "v1",
            "",
            event,
            &log_script(
                event,
                ":user || '|' || :client_id || '|' || :auth_1 || '|' || :script_version",
            ),
        )
        .await;
    }
    f.admin
        .add_script_version(PAYLOADS[2], "hostile")
        .await
        .expect("version");
    for entry in f.admin.scripts(Some("v1")).await.expect("list") {
        f.set_script(PAYLOADS[2], &entry.table, &entry.event, &entry.script)
            .await;
    }
    f.use_row_scripts(PAYLOADS[2]).await;
    for (index, payload) in PAYLOADS.iter().enumerate() {
        let id = 10 + index as i64;
        for version in ["v1", PAYLOADS[2]] {
            let id = if version == "v1" { id } else { id + 100 };
            let mut sync = versioned(
                request(
                    &format!("{payload}{version}"),
                    payload,
                    0,
                    1,
                    vec![orders_upload(
                        vec![order(id, payload, payload, 1, Some(payload))],
                        vec![],
                        vec![],
                    )],
                ),
                version,
            );
            sync.auth_parameters = vec![payload.to_string()];
            let outcome = f.sync_ok(sync).await;
            assert_eq!(outcome.summary.conflicts, 0, "{payload} in {version}");
        }
    }
    // Every table is intact, and the payloads were stored as the values they are.
    let orders = f.orders().await;
    assert_eq!(orders.len(), 1 + 2 * PAYLOADS.len(), "{orders:?}");
    assert_eq!(orders[0], order(1, "bob", "pen", 1, None));
    for row in &orders[1..] {
        assert_eq!(row[1], row[2], "rep and item hold the same payload");
        assert!(
            PAYLOADS.iter().any(|payload| row[1] == text(payload)),
            "{row:?}"
        );
    }
    let logged = f.event_details("end_upload").await;
    assert_eq!(logged.len(), 2 * PAYLOADS.len());
    assert!(
        logged.contains(&text(&format!("{p}|{p}v1|{p}|v1", p = PAYLOADS[0]))),
        "{logged:?}"
    );
}

pub async fn a_row_script_hitting_an_existing_key_fails_by_row_and_can_be_skipped<F: Factory>() {
    let existing = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&existing)).await;
    f.use_row_scripts("v1").await;
    let upload = || {
        orders_upload(
            vec![
                order(1, "alice", "dup", 5, None),
                order(2, "alice", "ink", 2, None),
            ],
            vec![],
            vec![],
        )
    };
    let error = f
        .sync(request("c1", "alice", 0, 1, vec![upload()]))
        .await
        .expect_err("a duplicate key fails the row");
    match &error {
        SyncError::Script { event, row_key, .. } => {
            assert_eq!(event, "upload_insert");
            assert_eq!(row_key.as_deref(), Some("(1)"));
        }
        other => panic!("expected a script error, got {other}"),
    }
    assert_eq!(f.orders().await, vec![existing.clone()]);
    f.set_script("v1", "", "handle_error", "SELECT 1000").await;
    let outcome = f
        .sync_ok(request("c1", "alice", 0, 1, vec![upload()]))
        .await;
    assert_eq!(
        f.orders().await,
        vec![existing.clone(), order(2, "alice", "ink", 2, None)]
    );
    assert_eq!(outcome.summary.conflicts, 1);
    assert_eq!(order_upserts(&outcome), vec![existing]);
}

/// A connection keeps its statements prepared between syncs; a table an event script
/// reads with `SELECT *` gains a column between two syncs on that connection, and the
/// second sync still runs (PostgreSQL refuses the old prepared statement: "cached plan
/// must not change result type").
pub async fn a_table_changed_between_syncs_on_one_connection_is_read_as_it_now_is<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql
        .execute("CREATE TABLE side (n INTEGER); INSERT INTO side (n) VALUES (1)")
        .await;
    f.set_script("v1", "", "begin_synchronization", "SELECT * FROM side")
        .await;
    let mut connection = f.backend.connect().await.expect("connect");
    let pen = order(1, "alice", "pen", 1, None);
    let first = sync_and_collect(
        &mut connection,
        Arc::new(request(
            "c1",
            "alice",
            0,
            1,
            vec![orders_upload(vec![pen.clone()], vec![], vec![])],
        )),
    )
    .await
    .expect("first sync");
    f.sql
        .execute("ALTER TABLE side ADD COLUMN extra INTEGER")
        .await;
    let ink = order(2, "alice", "ink", 2, None);
    let second = sync_and_collect(
        &mut connection,
        Arc::new(request(
            "c1",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(vec![ink.clone()], vec![], vec![])],
        )),
    )
    .await
    .expect("the second sync on the same connection reads side as it now is");
    assert_summary(&second, 1, 0, false);
    assert_eq!(f.orders().await, vec![pen, ink]);
}

/// The default cursors leave out what the sync's own upload wrote (issue 17), but not
/// what else its transaction wrote: a row `end_upload` adds and one it deletes in the
/// client's partition come down in that very sync, the uploaded ones do not, and the
/// next sync has nothing new to send.
pub async fn rows_a_sync_writes_besides_its_upload_come_down_in_that_sync<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let three = order(3, "alice", "pad", 3, None);
    let mut f = Fixture::<F>::with_orders(&[one.clone(), three.clone()]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    assert_eq!(order_upserts(&first), vec![one, three]);
    f.set_script(
        "v1",
        "",
        "end_upload",
        "INSERT INTO orders (id, rep, item, quantity, amount) VALUES (102, :user, 'gift', 1, NULL)",
    )
    .await;
    f.set_script(
        "v1",
        "",
        "begin_download",
        "DELETE FROM orders WHERE id = 1 AND rep = :user",
    )
    .await;
    let four = order(4, "alice", "new", 4, None);
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(vec![four.clone()], vec![], vec![key(&[3])])],
        ))
        .await;
    assert_summary(&second, 2, 0, false);
    let gift = order(102, "alice", "gift", 1, None);
    assert_eq!(f.orders().await, vec![four, gift.clone()]);
    assert_eq!(
        order_upserts(&second),
        vec![gift],
        "the row end_upload wrote comes down, the uploaded one does not"
    );
    assert_eq!(
        order_deletes(&second),
        vec![key(&[1])],
        "the row begin_download deleted comes down as a delete, the uploaded delete does not"
    );
    for event in ["end_upload", "begin_download"] {
        f.set_script("v1", "", event, "SELECT 1").await;
    }
    // The next sync may repeat what the last one sent (SQLite stamps begin_download's
    // delete above that sync's watermark), but brings nothing else.
    let third = f
        .sync_ok(request("alice-1", "alice", second.watermark, 3, vec![]))
        .await;
    assert_eq!(order_upserts(&third), Vec::<Row>::new());
    assert!(
        order_deletes(&third)
            .iter()
            .all(|deleted| *deleted == key(&[1])),
        "{:?}",
        third.downloads
    );
}

/// Rows written after the download cursors ran (by `end_download` and
/// `end_synchronization`) in the client's own partition miss that sync's download; the
/// next sync brings them, although it may skip what the previous sync's upload wrote
/// (`:last_sync_xid`). A sync with such scripts that writes nothing of the client's
/// keeps the skip: its upload is not echoed back.
pub async fn rows_written_after_the_download_come_down_in_the_next_sync<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let three = order(3, "alice", "pad", 3, None);
    let mut f = Fixture::<F>::with_orders(&[one.clone(), three.clone()]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    assert_eq!(order_upserts(&first), vec![one, three.clone()]);
    f.set_script("v1", "", "end_download", "SELECT 1").await;
    f.set_script("v1", "", "end_synchronization", "SELECT 1")
        .await;
    let four = order(4, "alice", "new", 4, None);
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![orders_upload(vec![four.clone()], vec![], vec![])],
        ))
        .await;
    assert_eq!(order_upserts(&second), Vec::<Row>::new());
    let third = f
        .sync_ok(request("alice-1", "alice", second.watermark, 3, vec![]))
        .await;
    assert_eq!(
        order_upserts(&third),
        Vec::<Row>::new(),
        "scripts that write none of the client's rows keep the upload from echoing back"
    );

    f.set_script(
        "v1",
        "",
        "end_download",
        "INSERT INTO orders (id, rep, item, quantity, amount) VALUES (103, :user, 'late', 1, NULL)",
    )
    .await;
    f.set_script(
        "v1",
        "",
        "end_synchronization",
        "DELETE FROM orders WHERE id = 3 AND rep = :user",
    )
    .await;
    let five = order(5, "alice", "cap", 5, None);
    let fourth = f
        .sync_ok(request(
            "alice-1",
            "alice",
            third.watermark,
            4,
            vec![orders_upload(vec![five.clone()], vec![], vec![])],
        ))
        .await;
    let late = order(103, "alice", "late", 1, None);
    assert!(
        !order_upserts(&fourth).contains(&late),
        "{:?}",
        fourth.downloads
    );
    assert!(order_deletes(&fourth).is_empty(), "{:?}", fourth.downloads);
    assert_eq!(
        f.orders().await,
        vec![
            order(1, "alice", "pen", 1, None),
            four,
            five.clone(),
            late.clone()
        ]
    );
    for event in ["end_download", "end_synchronization"] {
        f.set_script("v1", "", event, "SELECT 1").await;
    }
    let fifth = f
        .sync_ok(request("alice-1", "alice", fourth.watermark, 5, vec![]))
        .await;
    let upserts = order_upserts(&fifth);
    assert!(
        upserts.contains(&late),
        "the row end_download wrote comes down in the next sync: {upserts:?}"
    );
    assert!(
        upserts.iter().all(|row| *row == late || *row == five),
        "nothing else but (at most) the echo of the upload: {upserts:?}"
    );
    assert_eq!(
        order_deletes(&fifth),
        vec![key(&[3])],
        "the row end_synchronization deleted comes down as a delete"
    );
}

/// PostgreSQL (issue 17): `:echo_xid` names exactly the rows (and tombstones) the sync's
/// own upload wrote when that is all its transaction wrote to the table, and nothing
/// when anything else wrote to it. Cursors that select the rows it names, their keys
/// moved by 1000 so the echo filter lets them through, show what the default cursors
/// leave out.
#[allow(dead_code)]
pub async fn echo_xid_names_exactly_the_uploads_own_writes<F: Factory>() {
    let two = order(2, "alice", "ink", 2, None);
    let three = order(3, "alice", "pad", 3, None);
    let mut f = Fixture::<F>::with_orders(&[two.clone(), three.clone()]).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.set_script(
        "v1",
        "orders",
        "download_cursor",
        "SELECT id + 1000 AS id, rep, item, quantity, amount FROM orders WHERE rep = :user AND rs_xid = :echo_xid",
    )
    .await;
    f.set_script(
        "v1",
        "orders",
        "download_delete_cursor",
        "SELECT id + 1000 AS id FROM rs_tombstone_orders WHERE rs_partition = :user AND xid = :echo_xid",
    )
    .await;
    let moved = |row: &Row| match row[0] {
        Value::Int(id) => with(row, 0, Value::Int(id + 1000)),
        ref other => panic!("id {other:?}"),
    };
    let four = order(4, "alice", "new", 4, None);
    let two_new = with(&two, 3, Value::Int(20));
    let upload = orders_upload(
        vec![four.clone()],
        vec![(two.clone(), two_new.clone())],
        vec![key(&[3])],
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
    assert_summary(&second, 3, 0, false);
    assert_eq!(order_upserts(&second), vec![moved(&two_new), moved(&four)]);
    assert_eq!(order_deletes(&second), vec![key(&[1003])]);

    // Anything else written to the table turns it off: the filter does the work then.
    f.set_script(
        "v1",
        "",
        "end_upload",
        "INSERT INTO orders (id, rep, item, quantity, amount) VALUES (102, :user, 'gift', 1, NULL)",
    )
    .await;
    let five = order(5, "alice", "cap", 5, None);
    let upload = orders_upload(vec![five], vec![], vec![key(&[4])]);
    let third = f
        .sync_ok(request(
            "alice-1",
            "alice",
            second.watermark,
            3,
            vec![upload],
        ))
        .await;
    assert_summary(&third, 2, 0, false);
    assert_eq!(order_upserts(&third), Vec::<Row>::new());
    assert_eq!(
        order_deletes(&third),
        vec![key(&[1004])],
        "the tombstones are still the upload's own"
    );

    // Syncs one after another on one connection (as a server worker runs them): each
    // counts only its own writes, not those of the sync before it on the connection.
    f.set_script("v1", "", "end_upload", "SELECT 1").await;
    let mut connection = f.backend.connect().await.expect("connect");
    let mut watermark = third.watermark;
    for (sequence, id) in [(4, 5), (5, 2), (6, 102)] {
        let upload = orders_upload(vec![], vec![], vec![key(&[id])]);
        let request = request("alice-1", "alice", watermark, sequence, vec![upload]);
        let outcome = sync_and_collect(&mut connection, Arc::new(request))
            .await
            .expect("sync");
        assert_eq!(order_deletes(&outcome), vec![key(&[id + 1000])]);
        watermark = outcome.watermark;
    }
}

/// What `expression` evaluates to inside a sync's transaction, as its
/// `begin_synchronization` script records it: the session a backend gives its syncs.
#[allow(dead_code)]
pub async fn what_a_sync_sees<F: Factory>(expression: &str) -> Vec<Row> {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql.execute("CREATE TABLE seen (value TEXT)").await;
    let script = format!("INSERT INTO seen (value) SELECT {expression}");
    f.set_script("v1", "", "begin_synchronization", &script)
        .await;
    f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql.query_rows("SELECT value FROM seen").await
}

/// PostgreSQL only (`tests/postgres.rs`): counts the INSERT statements run on orders,
/// failed ones included (a sequence is not rolled back), and tells for each row of
/// orders whether it was written by a subtransaction (its `xmin` is not the stamp's
/// transaction) and whether its stamp is the transaction id the client's sync recorded.
#[allow(dead_code)]
const INSERT_STATEMENTS_DDL: &str = "CREATE SEQUENCE insert_statements;
    CREATE FUNCTION count_insert_statement() RETURNS trigger LANGUAGE plpgsql AS
      $$ BEGIN PERFORM nextval('insert_statements'); RETURN NULL; END $$;
    CREATE TRIGGER count_insert_statements BEFORE INSERT ON orders
      FOR EACH STATEMENT EXECUTE FUNCTION count_insert_statement()";

#[allow(dead_code)]
impl<F: Factory> Fixture<F> {
    /// INSERT statements run on orders since [`INSERT_STATEMENTS_DDL`] (0 before any).
    async fn insert_statements(&mut self) -> i64 {
        let rows = self
            .sql
            .query_rows(
                "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM insert_statements",
            )
            .await;
        match rows[0][0] {
            Value::Int(count) => count,
            ref other => panic!("statement count {other:?}"),
        }
    }

    /// For each of `ids`: (written in a subtransaction, stamped with the id of the sync
    /// `client_id` recorded last).
    async fn how_written(&mut self, client_id: &str, ids: &str) -> Vec<Vec<Value>> {
        self.sql
            .query_rows(&format!(
                "SELECT o.id, o.xmin::text::bigint <> o.rs_xid % 4294967296, o.rs_xid = s.last_sync_xid \
                 FROM orders AS o, rs_subscription AS s WHERE s.client_id = '{client_id}' \
                 AND o.id IN ({ids}) ORDER BY o.id"
            ))
            .await
    }
}

#[allow(dead_code)]
fn written(id: i64, in_subtransaction: bool) -> Vec<Value> {
    vec![
        Value::Int(id),
        Value::Bool(in_subtransaction),
        Value::Bool(true),
    ]
}

/// Issue 17: an insert upload with no conflict runs the default `upload_insert_fast`
/// alone (one INSERT statement, in a subtransaction), its rows stamped with the sync's
/// own transaction id.
#[allow(dead_code)]
pub async fn an_insert_without_conflicts_runs_only_the_fast_form<F: Factory>() {
    let one = order(1, "alice", "pen", 1, None);
    let mut f = Fixture::<F>::with_orders(std::slice::from_ref(&one)).await;
    f.sql.execute(INSERT_STATEMENTS_DDL).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let (four, five) = (
        order(4, "alice", "new", 4, None),
        order(5, "alice", "cap", 5, None),
    );
    let upload = orders_upload(vec![four.clone(), five.clone()], vec![], vec![]);
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![upload],
        ))
        .await;
    assert_summary(&second, 2, 0, false);
    assert_eq!(f.orders().await, vec![one, four, five]);
    assert_eq!(f.insert_statements().await, 1, "one INSERT: the fast form");
    assert_eq!(
        f.how_written("alice-1", "4, 5").await,
        vec![written(4, true), written(5, true)],
        "inserted under the savepoint, stamped with the top-level transaction's id"
    );
    assert_eq!(order_upserts(&second), Vec::<Row>::new(), "no echo");
}

/// Issue 17: an insert upload mixing new keys, a key of the user's and a key of another
/// partition: the fast form fails on the existing keys, is rolled back, and the checked
/// `upload_insert` reports exactly those conflicts and applies the new rows once.
#[allow(dead_code)]
pub async fn an_insert_with_existing_keys_falls_back_to_the_checked_script<F: Factory>() {
    let three = order(3, "alice", "pad", 3, None);
    let bobs = order(10, "bob", "bob's", 10, None);
    let mut f = Fixture::<F>::with_orders(&[three.clone(), bobs.clone()]).await;
    f.sql.execute(INSERT_STATEMENTS_DDL).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let (four, five) = (
        order(4, "alice", "new", 4, None),
        order(5, "alice", "cap", 5, None),
    );
    let inserts = vec![
        four.clone(),
        order(3, "alice", "mine", 33, None),
        order(10, "alice", "stolen", 1, None),
        five.clone(),
    ];
    let upload = orders_upload(inserts, vec![], vec![]);
    let second = f
        .sync_ok(request(
            "alice-1",
            "alice",
            first.watermark,
            2,
            vec![upload],
        ))
        .await;
    assert_summary(&second, 4, 2, false);
    assert_eq!(
        f.orders().await,
        vec![three.clone(), four, five, bobs],
        "the new rows once, the existing ones untouched"
    );
    assert_eq!(
        order_upserts(&second),
        vec![three],
        "the server's row 3 wins"
    );
    assert_eq!(
        order_deletes(&second),
        vec![key(&[10])],
        "bob's key is a delete"
    );
    assert_eq!(
        f.insert_statements().await,
        2,
        "the fast form, rolled back, then upload_insert"
    );
    assert_eq!(
        f.how_written("alice-1", "4, 5").await,
        vec![written(4, false), written(5, false)],
        "inserted by upload_insert, after the savepoint was rolled back"
    );
}

/// Issue 17: a row of another partition in an insert upload with no existing key: the
/// fast form inserts the others, and the row is reported as before (the scratch rows
/// compared with the table, no second INSERT).
#[allow(dead_code)]
pub async fn a_fast_insert_reports_a_row_of_another_partition<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    f.sql.execute(INSERT_STATEMENTS_DDL).await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let four = order(4, "alice", "new", 4, None);
    let upload = orders_upload(
        vec![four.clone(), order(20, "bob", "planted", 1, None)],
        vec![],
        vec![],
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
    assert_summary(&second, 2, 1, false);
    assert_eq!(f.orders().await, vec![four]);
    assert_eq!(order_deletes(&second), vec![key(&[20])]);
    assert_eq!(f.insert_statements().await, 1, "only the fast form");
    assert_eq!(f.how_written("alice-1", "4").await, vec![written(4, true)]);
}

/// Issue 17: changing or removing `upload_insert`, by `set_script` or by SQL, removes the
/// table's `upload_insert_fast` of the same version (it would bypass the new script
/// whenever no key conflicts); copying a version keeps it, and setting the fast form
/// again after its `upload_insert` keeps it.
#[allow(dead_code)]
pub async fn setting_upload_insert_removes_its_fast_form<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[]).await;
    let fast_forms = "SELECT script FROM rs_script WHERE script_version = 'v1' \
                      AND table_name = 'orders' AND event = 'upload_insert_fast'";
    let defaults = f.sql.query_rows(fast_forms).await;
    assert_eq!(defaults.len(), 1, "a default");
    let Value::Text(default) = defaults[0][0].clone() else {
        panic!("{defaults:?}")
    };
    let checked = f.current_script("orders", "upload_insert").await;
    f.sql
        .execute(
            "INSERT INTO rs_script_version (name) VALUES ('v2'); \
             INSERT INTO rs_script (script_version, table_name, event, script) \
             SELECT 'v2', table_name, event, script FROM rs_script WHERE script_version = 'v1'",
        )
        .await;
    let copied =
        "SELECT 1 FROM rs_script WHERE script_version = 'v2' AND event = 'upload_insert_fast'";
    assert_eq!(f.sql.query_rows(copied).await.len(), 1, "a copy keeps it");
    f.replace_script("orders", "upload_insert", &checked).await;
    assert_eq!(
        f.sql.query_rows(fast_forms).await.len(),
        1,
        "unchanged: kept"
    );
    f.replace_script("orders", "upload_insert", &format!("{checked} "))
        .await;
    assert_eq!(
        f.sql.query_rows(fast_forms).await.len(),
        0,
        "changed by SQL"
    );
    f.set_script("v1", "orders", "upload_insert_fast", &default)
        .await;
    f.sql
        .execute("DELETE FROM rs_script WHERE script_version = 'v1' AND event = 'upload_insert'")
        .await;
    assert_eq!(f.sql.query_rows(fast_forms).await.len(), 0, "removed");
    f.set_script("v1", "orders", "upload_insert", &checked)
        .await;
    f.set_script("v1", "orders", "upload_insert_fast", &default)
        .await;
    assert_eq!(f.sql.query_rows(fast_forms).await.len(), 1, "set after it");
    let row_script = "INSERT INTO orders (id, rep, item, quantity, amount) \
                      VALUES (:new.id, :new.rep, 'by hand', :new.quantity, :new.amount)";
    f.set_script("v1", "orders", "upload_insert", row_script)
        .await;
    assert_eq!(f.sql.query_rows(fast_forms).await.len(), 0);
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let upload = orders_upload(vec![order(4, "alice", "new", 4, None)], vec![], vec![]);
    f.sync_ok(request(
        "alice-1",
        "alice",
        first.watermark,
        2,
        vec![upload],
    ))
    .await;
    assert_eq!(
        f.orders().await,
        vec![order(4, "alice", "by hand", 4, None)]
    );
    let fast = "INSERT INTO orders SELECT * FROM {upload}";
    f.set_script("v1", "orders", "upload_insert_fast", fast)
        .await;
    assert_eq!(f.sql.query_rows(fast_forms).await, vec![vec![text(fast)]]);
}

/// Issue 17 (PostgreSQL): a delete statement writes one tombstone batch per partition it
/// deleted from, not a row per key; the `rs_tombstone_orders` view still shows one row
/// per key, and each partition's clients receive exactly their deletes.
#[allow(dead_code)]
pub async fn deletes_write_one_tombstone_batch_per_statement_and_partition<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[
        order(1, "alice", "pen", 1, None),
        order(2, "alice", "ink", 2, None),
        order(3, "alice", "pad", 3, None),
        order(10, "bob", "cap", 10, None),
        order(11, "bob", "nib", 11, None),
    ])
    .await;
    let alice = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    let bob = f.sync_ok(request("bob-1", "bob", 0, 1, vec![])).await;
    f.sql
        .execute("DELETE FROM orders WHERE id IN (1, 2, 10)")
        .await;
    assert_eq!(
        f.sql
            .query_rows("SELECT count(*) FROM rs_deleted_orders")
            .await,
        vec![vec![Value::Int(2)]],
        "one batch for alice's two keys, one for bob's"
    );
    assert_eq!(
        f.sql
            .query_rows("SELECT id, rs_partition FROM rs_tombstone_orders ORDER BY id")
            .await,
        vec![
            vec![Value::Int(1), text("alice")],
            vec![Value::Int(2), text("alice")],
            vec![Value::Int(10), text("bob")],
        ]
    );
    let alice = f
        .sync_ok(request("alice-1", "alice", alice.watermark, 2, vec![]))
        .await;
    assert_eq!(order_deletes(&alice), vec![key(&[1]), key(&[2])]);
    let bob = f
        .sync_ok(request("bob-1", "bob", bob.watermark, 2, vec![]))
        .await;
    assert_eq!(order_deletes(&bob), vec![key(&[10])]);

    // alice's other client deletes 3 through a sync: alice-1 receives it, bob nothing.
    let other = f.sync_ok(request("alice-2", "alice", 0, 1, vec![])).await;
    let upload = orders_upload(vec![], vec![], vec![key(&[3])]);
    let deleted = f
        .sync_ok(request(
            "alice-2",
            "alice",
            other.watermark,
            2,
            vec![upload],
        ))
        .await;
    assert_summary(&deleted, 1, 0, false);
    assert_eq!(order_deletes(&deleted), Vec::<Row>::new(), "no echo");
    assert_eq!(
        f.sql
            .query_rows("SELECT count(*) FROM rs_deleted_orders")
            .await,
        vec![vec![Value::Int(3)]]
    );
    let alice = f
        .sync_ok(request("alice-1", "alice", alice.watermark, 3, vec![]))
        .await;
    assert_eq!(order_deletes(&alice), vec![key(&[3])]);
    let bob = f
        .sync_ok(request("bob-1", "bob", bob.watermark, 3, vec![]))
        .await;
    assert_eq!(order_deletes(&bob), Vec::<Row>::new());
}

/// Issue 17 (PostgreSQL): `init` run again over a tombstone table of a rowsync from
/// before batches turns its rows into batches of one key, every tombstone kept, and the
/// client that had not received the delete still does.
#[allow(dead_code)]
pub async fn init_turns_an_older_tombstone_table_into_batches<F: Factory>() {
    let mut f = Fixture::<F>::with_orders(&[
        order(1, "alice", "pen", 1, None),
        order(2, "alice", "ink", 2, None),
    ])
    .await;
    let first = f.sync_ok(request("alice-1", "alice", 0, 1, vec![])).await;
    f.sql.execute("DELETE FROM orders WHERE id = 1").await;
    // The tombstones as the earlier rowsync kept them: a table, one row per key.
    f.sql
        .execute(
            "CREATE TABLE rs_old_tombstones AS SELECT id, rs_partition, xid FROM rs_tombstone_orders;
             DROP VIEW rs_tombstone_orders; DROP TABLE rs_deleted_orders;
             ALTER TABLE rs_old_tombstones RENAME TO rs_tombstone_orders;",
        )
        .await;
    f.init_orders().await;
    assert_eq!(
        f.sql
            .query_rows("SELECT relkind::text FROM pg_class WHERE relname = 'rs_tombstone_orders'")
            .await,
        vec![vec![text("v")]],
        "the table became the view"
    );
    assert_eq!(
        f.sql
            .query_rows("SELECT count(*) FROM rs_deleted_orders")
            .await,
        vec![vec![Value::Int(1)]]
    );
    let got = f
        .sync_ok(request("alice-1", "alice", first.watermark, 2, vec![]))
        .await;
    assert_eq!(order_deletes(&got), vec![key(&[1])]);
    // Running init once more changes nothing, and new deletes are batched.
    f.init_orders().await;
    f.sql.execute("DELETE FROM orders WHERE id = 2").await;
    let got = f
        .sync_ok(request("alice-1", "alice", got.watermark, 3, vec![]))
        .await;
    assert_eq!(order_deletes(&got), vec![key(&[2])]);
}
