//! Changes written to a client database by connections other than the client's own
//! (Python's `sqlite3` module, the `sqlite3` shell), whatever their pragmas, reach the
//! consolidated database exactly: the client syncs them and the server's rows then equal
//! the client's, with no conflict.

mod support;

use std::process::Command;

use rowsync_protocol::Value;
use support::{orders, TestServer};

/// Rows `seed-0` .. `seed-9` exist on the server and, after a first sync, on the client.
const SEED_ROWS: usize = 10;

/// Which program writes the changes.
#[derive(Clone, Copy, Debug)]
enum Writer {
    /// Python's `sqlite3` module with its default pragmas (recursive triggers off).
    Python,
    /// Python's `sqlite3` module with `PRAGMA recursive_triggers = ON`.
    PythonRecursiveTriggers,
    /// The `sqlite3` command-line shell.
    Shell,
}

fn write_with(writer: Writer, path: &std::path::Path, script: &str) {
    let output = match writer {
        Writer::Python | Writer::PythonRecursiveTriggers => {
            let pragma = match writer {
                Writer::PythonRecursiveTriggers => "PRAGMA recursive_triggers = ON;",
                _ => "",
            };
            Command::new("python3")
                .arg("-c")
                .arg(
                    "import sqlite3, sys\n\
                     c = sqlite3.connect(sys.argv[1])\n\
                     c.executescript(sys.argv[2] + sys.argv[3])\n\
                     c.commit()\n\
                     c.close()\n",
                )
                .arg(path)
                .arg(pragma)
                .arg(script)
                .output()
        }
        Writer::Shell => Command::new("sqlite3").arg(path).arg(script).output(),
    }
    .unwrap_or_else(|error| panic!("running the {writer:?} writer (is it installed?): {error}"));
    assert!(
        output.status.success(),
        "{writer:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn text(value: &str) -> Value {
    Value::Text(value.into())
}

fn row(id: &str, item: &str, quantity: i64) -> Vec<Value> {
    vec![text(id), text("alice"), text(item), Value::Int(quantity)]
}

/// Syncs a fresh client, lets `writer` run `script` on its file with the client closed,
/// syncs again and checks that the server now holds exactly the client's rows.
/// `setup` runs on the client database before `orders` is tracked.
async fn written_by(writer: Writer, setup: &str, script: &str) -> Vec<Vec<Value>> {
    let server = TestServer::start(SEED_ROWS).await;
    let path = server.client_path("app");
    {
        let mut client = rowsync_client::Client::open(&path).unwrap();
        client
            .connection()
            .execute_batch(support::ORDERS_DDL)
            .unwrap();
        client.connection().execute_batch(setup).unwrap();
        client.track("orders").unwrap();
        let report = client.sync(&server.options()).await.unwrap();
        assert_eq!(report.rows_downloaded, SEED_ROWS as u64);
    }
    write_with(writer, &path, script);
    let mut client = rowsync_client::Client::open(&path).unwrap();
    let report = client.sync(&server.options()).await.unwrap();
    let local = orders(client.connection());
    let consolidated = server.consolidated_orders();
    assert_eq!(
        report.conflicts, 0,
        "{writer:?}: a local write was refused by the server"
    );
    assert_eq!(consolidated, local, "{writer:?}: server and client differ");
    assert!(!client.has_pending_changes().unwrap());
    server.stop().await;
    local
}

#[tokio::test]
async fn python_insert_or_replace_of_a_synced_row_reaches_the_server() {
    for writer in [
        Writer::Python,
        Writer::PythonRecursiveTriggers,
        Writer::Shell,
    ] {
        let rows = written_by(
            writer,
            "",
            "INSERT OR REPLACE INTO orders VALUES ('seed-0', 'alice', 'replaced', 100);",
        )
        .await;
        assert_eq!(rows[0], row("seed-0", "replaced", 100), "{writer:?}");
    }
}

/// Every way SQLite writes a row, including through the app's own triggers, and
/// `OR REPLACE` writes that displace rows by a secondary unique index.
const EVERY_WRITE: &str = "
INSERT OR REPLACE INTO orders VALUES ('seed-0', 'alice', 'replaced', 100);
REPLACE INTO orders VALUES ('seed-1', 'alice', 'replaced', 101);
INSERT INTO orders VALUES ('seed-2', 'alice', 'x', 0)
    ON CONFLICT (id) DO UPDATE SET item = 'upserted', quantity = 102;
INSERT INTO orders VALUES ('new-1', 'alice', 'upsert-new', 1)
    ON CONFLICT (id) DO UPDATE SET quantity = 0;
UPDATE orders SET id = 'rekeyed-3' WHERE id = 'seed-3';
DELETE FROM orders WHERE id = 'seed-4';
INSERT OR IGNORE INTO orders VALUES ('seed-5', 'alice', 'ignored', 0);
INSERT OR REPLACE INTO orders VALUES ('new-2', 'alice', 'a', 1);
INSERT OR REPLACE INTO orders VALUES ('new-2', 'alice', 'b', 2);
UPDATE OR REPLACE orders SET id = 'seed-6' WHERE id = 'seed-7';
INSERT OR REPLACE INTO orders VALUES ('new-3', 'alice', 'seed', 8);
CREATE TABLE notes (order_id TEXT PRIMARY KEY, body TEXT);
CREATE TRIGGER app_note AFTER INSERT ON notes BEGIN
    INSERT OR REPLACE INTO orders VALUES (NEW.order_id, 'alice', NEW.body, 7);
END;
INSERT INTO notes VALUES ('seed-9', 'noted-9');
INSERT INTO notes VALUES ('new-4', 'noted-4');
CREATE TRIGGER app_bump AFTER UPDATE OF item ON orders WHEN NEW.item = 'bump' BEGIN
    UPDATE orders SET quantity = quantity + 1000 WHERE id = NEW.id;
END;
UPDATE orders SET item = 'bump' WHERE id = 'rekeyed-3';
";

#[tokio::test]
async fn every_kind_of_write_by_any_connection_reaches_the_server() {
    let expected = vec![
        row("new-1", "upsert-new", 1),
        row("new-2", "b", 2),
        row("new-3", "seed", 8),
        row("new-4", "noted-4", 7),
        row("rekeyed-3", "bump", 1003),
        row("seed-0", "replaced", 100),
        row("seed-1", "replaced", 101),
        row("seed-2", "upserted", 102),
        row("seed-5", "seed", 5),
        row("seed-6", "seed", 7),
        row("seed-9", "noted-9", 7),
    ];
    for writer in [
        Writer::Python,
        Writer::PythonRecursiveTriggers,
        Writer::Shell,
    ] {
        // On the client only: (item, quantity) is unique, so the insert of new-3
        // displaces seed-8.
        let setup = "CREATE UNIQUE INDEX orders_item_quantity ON orders (item, quantity)";
        let rows = written_by(writer, setup, EVERY_WRITE).await;
        assert_eq!(rows, expected, "{writer:?}");
    }
}
