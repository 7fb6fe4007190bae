//! Every column type round-trips from the consolidated database to a client and back
//! unchanged (issue 16). Each case writes rows of random values (NULLs and extremes
//! included) on the server, syncs them down to a new SQLite client, touches every row
//! there (an update of another column, so each value goes back up as the old and the new
//! image, and the old image must match exactly or the server reports a conflict), and
//! syncs up. The server must report no conflict and then hold exactly what it held.
//!
//! CI runs `TYPE_CASES_DEFAULT` cases per backend; more by hand:
//! `ROWSYNC_TYPE_CASES=200 cargo test -p rowsync-client --test types`.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod kinds;

use std::net::SocketAddr;

use proptest::test_runner::{Config, TestRunner};
use rowsync_client::{Client, SyncOptions};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;
use rowsync_server::{auth, ServerConfig};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use kinds::{same, Table};

const TYPE_CASES_DEFAULT: u32 = 6;
const USER: &str = "alice";
const PASSWORD: &str = "alice-password";

fn cases() -> u32 {
    std::env::var("ROWSYNC_TYPE_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(TYPE_CASES_DEFAULT)
}

/// Starts a server on `backend` with `table` initialized and alice's password set.
async fn serve<B: Consolidated>(backend: B, table: &str) -> SocketAddr {
    let mut connection = backend.connect().await.unwrap();
    connection.install_system_tables().await.unwrap();
    connection
        .init_table(&TableInit::new(table, "owner", "v1"))
        .await
        .unwrap();
    connection
        .set_user(USER, &auth::hash_password(PASSWORD).unwrap())
        .await
        .unwrap();
    drop(connection);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        rowsync_server::serve(
            listener,
            backend,
            ServerConfig::default(),
            std::future::pending(),
        )
        .await
        .unwrap();
    });
    address
}

/// The database under test: writes rows and reads them back as the server does.
trait Server {
    async fn insert(&self, table: &Table, rows: &[Vec<Value>]);
    async fn read(&self, table: &Table, ids: &[Value]) -> Vec<Vec<Value>>;
}

/// One case: `rows` written on the server, down to a client, touched, up again.
async fn round_trip(
    server: &impl Server,
    address: SocketAddr,
    table: &Table,
    rows: Vec<Vec<Value>>,
) {
    server.insert(table, &rows).await;
    let ids: Vec<Value> = rows.iter().map(|row| row[0].clone()).collect();
    let before = server.read(table, &ids).await;
    let dir = tempfile::tempdir().unwrap();
    let mut client = Client::open(dir.path().join("client.db")).unwrap();
    client
        .connection()
        .execute_batch(&table.client_ddl())
        .unwrap();
    client.track(&table.name).unwrap();
    let options = SyncOptions::new(format!("tcp://{address}"), USER, PASSWORD);
    let down = client.sync(&options).await.unwrap();
    assert!(down.rows_downloaded >= rows.len() as u64, "{down:?}");
    let touched = client
        .connection()
        .execute(
            &format!("UPDATE {} SET touched = touched + 1", table.name),
            [],
        )
        .unwrap();
    assert!(touched >= rows.len());
    let up = client.sync(&options).await.unwrap();
    assert_eq!(up.conflicts, 0, "{:?}", up.conflicted_rows);
    let after = server.read(table, &ids).await;
    for (before, after) in before.iter().zip(&after) {
        for ((column, old), new) in table.columns.iter().zip(before).zip(after) {
            if column.name != "touched" {
                assert!(
                    same(old, new),
                    "column {}: {old:?} came back as {new:?}",
                    column.name
                );
            }
        }
    }
}

fn run<S: Server>(runtime: &Runtime, server: &S, address: SocketAddr, table: &Table) {
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        // Shrinking would write the same keys again: report the case as it failed.
        max_shrink_iters: 0,
        ..Config::default()
    });
    runner
        .run(&table.rows_strategy(), |rows| {
            runtime.block_on(round_trip(server, address, table, rows));
            Ok(())
        })
        .unwrap();
}

struct Postgres(tokio_postgres::Client);

impl Server for Postgres {
    async fn insert(&self, table: &Table, rows: &[Vec<Value>]) {
        use rowsync_consolidated::postgres::value::Bind;
        let placeholders: Vec<String> =
            (1..=table.columns.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "INSERT INTO {} VALUES ({})",
            table.name,
            placeholders.join(", ")
        );
        for row in rows {
            let binds: Vec<Bind> = row.iter().map(Bind).collect();
            let parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = binds
                .iter()
                .map(|b| b as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            self.0
                .execute(&sql, &parameters)
                .await
                .unwrap_or_else(|e| panic!("{e:?}: {row:?}"));
        }
    }

    async fn read(&self, table: &Table, ids: &[Value]) -> Vec<Vec<Value>> {
        use rowsync_consolidated::postgres::value::{Bind, Read};
        let mut rows = Vec::new();
        for id in ids {
            let row = self
                .0
                .query_one(
                    &format!("SELECT * FROM {} WHERE id = $1", table.name),
                    &[&Bind(id)],
                )
                .await
                .unwrap();
            rows.push(
                (0..table.columns.len())
                    .map(|index| row.get::<_, Read>(index).0)
                    .collect(),
            );
        }
        rows
    }
}

#[test]
fn every_postgresql_type_round_trips_through_a_sqlite_client() {
    let runtime = Runtime::new().unwrap();
    let table = kinds::postgres();
    let (server, address) = runtime.block_on(async {
        let (url, client) =
            rowsync_testkit::fresh_database_with("types", &table.server_ddl()).await;
        let backend = rowsync_consolidated::postgres::PostgresConsolidated::new(&url);
        (Postgres(client), serve(backend, &table.name).await)
    });
    run(&runtime, &server, address, &table);
}

struct Mysql(tokio::sync::Mutex<mysql_async::Conn>);

impl Server for Mysql {
    async fn insert(&self, table: &Table, rows: &[Vec<Value>]) {
        use mysql_async::prelude::Queryable;
        let placeholders = vec!["?"; table.columns.len()].join(", ");
        let sql = format!("INSERT INTO {} VALUES ({placeholders})", table.name);
        let mut connection = self.0.lock().await;
        for row in rows {
            let row: Vec<Value> = row.iter().map(|value| value.to_v1().into_owned()).collect();
            connection
                .exec_drop(
                    sql.as_str(),
                    rowsync_consolidated::mysql::value::bind_all(&row),
                )
                .await
                .unwrap_or_else(|e| panic!("{e:?}: {row:?}"));
        }
    }

    async fn read(&self, table: &Table, ids: &[Value]) -> Vec<Vec<Value>> {
        use mysql_async::prelude::Queryable;
        let mut connection = self.0.lock().await;
        let mut rows = Vec::new();
        for id in ids {
            let id = id.to_v1().into_owned();
            let row: mysql_async::Row = connection
                .exec_first(
                    format!("SELECT * FROM {} WHERE id = ?", table.name),
                    rowsync_consolidated::mysql::value::bind_all([&id]),
                )
                .await
                .unwrap()
                .expect("the row");
            rows.push(rowsync_consolidated::mysql::value::read_row(row).unwrap());
        }
        rows
    }
}

#[test]
fn every_mariadb_type_round_trips_through_a_sqlite_client() {
    use mysql_async::prelude::Queryable;
    let runtime = Runtime::new().unwrap();
    let table = kinds::mysql();
    let (server, address) = runtime.block_on(async {
        let url = rowsync_testkit::fresh_mysql_database("types").await;
        let mut connection = mysql_async::Conn::from_url(&url).await.unwrap();
        connection
            .query_drop("SET SESSION sql_mode = 'ANSI_QUOTES,PIPES_AS_CONCAT,STRICT_TRANS_TABLES', time_zone = '+00:00'")
            .await
            .unwrap();
        connection.query_drop(table.server_ddl()).await.unwrap();
        let backend = rowsync_consolidated::mysql::MysqlConsolidated::new(&url).unwrap();
        (Mysql(tokio::sync::Mutex::new(connection)), serve(backend, &table.name).await)
    });
    run(&runtime, &server, address, &table);
}

struct Sqlite(std::path::PathBuf);

impl Server for Sqlite {
    async fn insert(&self, table: &Table, rows: &[Vec<Value>]) {
        let connection = rusqlite::Connection::open(&self.0).unwrap();
        let placeholders = vec!["?"; table.columns.len()].join(", ");
        let sql = format!("INSERT INTO {} VALUES ({placeholders})", table.name);
        for row in rows {
            connection
                .execute(&sql, rusqlite::params_from_iter(row))
                .unwrap();
        }
    }

    async fn read(&self, table: &Table, ids: &[Value]) -> Vec<Vec<Value>> {
        let connection = rusqlite::Connection::open(&self.0).unwrap();
        let sql = format!("SELECT * FROM {} WHERE id = ?1", table.name);
        ids.iter()
            .map(|id| {
                connection
                    .query_row(&sql, [id], |row| {
                        (0..table.columns.len())
                            .map(|i| row.get::<_, Value>(i))
                            .collect::<rusqlite::Result<Vec<Value>>>()
                    })
                    .unwrap()
            })
            .collect()
    }
}

#[test]
fn every_type_sqlite_holds_round_trips_through_a_sqlite_client() {
    let runtime = Runtime::new().unwrap();
    let table = kinds::sqlite();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("consolidated.db");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(&table.server_ddl())
        .unwrap();
    let address = runtime.block_on(serve(
        rowsync_consolidated::sqlite::SqliteConsolidated::new(&path),
        &table.name,
    ));
    run(&runtime, &Sqlite(path), address, &table);
}

/// The table of the version 1 test: every type whose v2 tag a version 1 session gets in
/// its v1 form, and two that are the same in both.
const V1_TABLE_DDL: &str = "
    CREATE TYPE mood AS ENUM ('sad', 'happy');
    CREATE TABLE v1types (id uuid PRIMARY KEY, owner text NOT NULL, flag boolean, day date,
        at time, span interval, big numeric, tags integer[], doc jsonb, feeling mood,
        stamp timestamptz);
    INSERT INTO v1types VALUES ('0e3f5f6a-2b8c-4e1d-9f3a-5c6d7e8f9a0b', 'alice', true,
        '2024-02-29', '13:05:09.00025', '1 year 2 mons -3 days 04:05:06.5',
        1234567890123456789012345678901234567890.5, '{1,NULL,3}', '{\"a\": [1, 2]}', 'happy',
        '2023-11-14 22:13:20.123456+00');";

/// One sync of a client that speaks protocol version 1, its hello and frames written
/// as such a client would (the reference client always speaks the newest version).
async fn sync_as_version_1(
    address: SocketAddr,
    watermark: i64,
    upload_sequence: u64,
    upload: Option<rowsync_protocol::TableUpload>,
) -> rowsync_client::CompletedSync {
    use rowsync_client::{transport, SessionEvent, TransportOptions};
    use rowsync_protocol::{encode_frame, Hello, Message, FRAME_BYTES_MAX_DEFAULT};
    let frames: Vec<Vec<u8>> = upload
        .into_iter()
        .map(|upload| encode_frame(&Message::Upload(upload)))
        .collect();
    let event = transport::exchange(transport::Exchange {
        address: &format!("tcp://{address}"),
        transport: &TransportOptions::default(),
        hello: Hello {
            protocol_version: 1,
            client_id: "an-old-client".into(),
            user: USER.into(),
            password: PASSWORD.into(),
            script_version: "v1".into(),
            last_download_watermark: watermark,
            token: String::new(),
            auth_parameters: Vec::new(),
            download_ack: false,
            tables: Default::default(),
        },
        upload_frames: &frames,
        upload_sequence,
        frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        timeout: std::time::Duration::from_secs(30),
        acknowledge: None,
        transfer: None,
        download_resume: None,
        key_ranges: &[],
    })
    .await
    .unwrap();
    let SessionEvent::Complete(completed) = event else {
        panic!("expected a completed sync, got {event:?}");
    };
    completed
}

/// Issue 16: a client of protocol version 1 syncing a table of the new types receives
/// what docs/types.md promises it (a boolean as 0 or 1, the others as their text forms,
/// an array as JSON; no tag above 0x06 and no conflicts message), and its upload of
/// those forms (an update whose old image is what it received, and an insert) lands in
/// the typed columns without a conflict.
#[test]
fn a_version_1_client_gets_text_forms_and_its_upload_of_them_is_applied() {
    use rowsync_protocol::{RowUpdate, TableUpload};
    let text = |text: &str| Value::Text(text.into());
    let runtime = Runtime::new().unwrap();
    runtime.block_on(async {
        let (url, database) = rowsync_testkit::fresh_database_with("types_v1", V1_TABLE_DDL).await;
        let backend = rowsync_consolidated::postgres::PostgresConsolidated::new(&url);
        let address = serve(backend, "v1types").await;

        let first = sync_as_version_1(address, 0, 1, None).await;
        assert!(first.conflicts.is_empty());
        let [download] = &first.downloads[..] else {
            panic!("one download message: {:?}", first.downloads)
        };
        let received: Vec<(&str, &Value)> = download
            .columns
            .iter()
            .map(String::as_str)
            .zip(&download.upserts[0])
            .collect();
        assert_eq!(
            received,
            vec![
                ("id", &text("0e3f5f6a-2b8c-4e1d-9f3a-5c6d7e8f9a0b")),
                ("owner", &text("alice")),
                ("flag", &Value::Int(1)),
                ("day", &text("2024-02-29")),
                ("at", &text("13:05:09.000250")),
                ("span", &text("P1Y2M-3DT4H5M6.5S")),
                ("big", &text("1234567890123456789012345678901234567890.5")),
                ("tags", &text("[1,null,3]")),
                ("doc", &text("{\"a\": [1, 2]}")),
                ("feeling", &text("happy")),
                ("stamp", &Value::Timestamp(1_700_000_000_123_456)),
            ]
        );

        // Up, in the same forms: an update from exactly what came down, and an insert.
        let old = download.upserts[0].clone();
        let mut new = old.clone();
        for (index, value) in [
            (2, Value::Int(0)),
            (3, text("2024-03-01")),
            (4, text("23:59:59.999999")),
            (5, text("P1D")),
            (6, text("-9999999999999999999999999999999999999999.25")),
            (7, text("[4,5]")),
            (8, text("{\"b\": null}")),
            (9, text("sad")),
        ] {
            new[index] = value;
        }
        let mut inserted = vec![Value::Null; old.len()];
        inserted[0] = text("AAAAAAAA-0000-4000-8000-000000000001");
        inserted[1] = text("alice");
        inserted[2] = Value::Int(1);
        inserted[7] = text("[[1,2],[3,4]]");
        let upload = TableUpload {
            table: "v1types".into(),
            columns: download.columns.clone(),
            key_columns: vec!["id".into()],
            inserts: vec![inserted],
            updates: vec![RowUpdate { old, new }],
            deletes: Vec::new(),
        };
        let second = sync_as_version_1(address, first.end.watermark, 2, Some(upload)).await;
        assert_eq!(second.end.summary.rows_uploaded, 2);
        assert_eq!(second.end.summary.conflicts, 0, "{second:?}");
        let rows: Vec<Vec<Option<String>>> = database
            .query(
                "SELECT id::text, flag::text, day::text, at::text, span::text, big::text,
                        tags::text, doc::text, feeling::text FROM v1types ORDER BY id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| (0..9).map(|index| row.get(index)).collect())
            .collect();
        let expected_new: Vec<Option<String>> = [
            "0e3f5f6a-2b8c-4e1d-9f3a-5c6d7e8f9a0b",
            "false",
            "2024-03-01",
            "23:59:59.999999",
            "1 day",
            "-9999999999999999999999999999999999999999.25",
            "{4,5}",
            "{\"b\": null}",
            "sad",
        ]
        .iter()
        .map(|value| Some(value.to_string()))
        .collect();
        let mut expected_inserted = vec![None; 9];
        expected_inserted[0] = Some("aaaaaaaa-0000-4000-8000-000000000001".to_string());
        expected_inserted[1] = Some("true".to_string());
        expected_inserted[6] = Some("{{1,2},{3,4}}".to_string());
        // uuids sort as their bytes: 0e3f... before aaaa...
        assert_eq!(rows, vec![expected_new, expected_inserted]);
    });
}
