//! `rowsync rules` and `rowsync schema` as a user runs them (docs/rules.md): a store
//! chain set up from a rule file, the client's tables made by `rowsync schema`, and
//! `rowsync sync` bringing each user their store's rows, with no hand-written script
//! and no hand-written CREATE TABLE.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

mod support;

use support::{
    add_user, rowsync, run_ok, serve, STORE_CHAIN as CENTRAL, STORE_CHAIN_RULES as RULES,
};

#[test]
fn a_store_chain_from_a_rule_file_and_rowsync_schema() {
    let dir = tempfile::tempdir().unwrap();
    let central = dir.path().join("central.db");
    rusqlite::Connection::open(&central)
        .unwrap()
        .execute_batch(CENTRAL)
        .unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(&rules, RULES).unwrap();
    let (db, file) = (central.to_str().unwrap(), rules.to_str().unwrap());

    let checked = run_ok(&["rules", "check", "--db", db, "--file", file], "");
    assert_eq!(
        checked,
        "customer: rows whose store_id is a group of store\n\
         film: every row; nobody uploads\n\
         rental: the rows of its customer rows\n\
         group store: read from staff at every sync (it needs no tracking)\n\
         warning: no index of rental starts with (customer_id), and its customer rows are found \
         by them: CREATE INDEX rental_customer_id ON rental (customer_id)\n"
    );
    rusqlite::Connection::open(&central)
        .unwrap()
        .execute_batch("CREATE INDEX rental_customer_id ON rental (customer_id)")
        .unwrap();
    let checked = run_ok(&["rules", "check", "--db", db, "--file", file], "");
    assert!(!checked.contains("warning"), "{checked}");
    let applied = run_ok(&["rules", "apply", "--db", db, "--file", file], "");
    assert!(
        applied.contains("table customer is synchronized by script version v1 (rule group)"),
        "{applied}"
    );
    let schema = run_ok(&["schema", "--db", db], "");
    assert_eq!(
        schema,
        "CREATE TABLE IF NOT EXISTS \"customer\" (\n    \"customer_id\" INTEGER PRIMARY KEY,\n    \
         \"store_id\" INTEGER,\n    \"name\" TEXT,\n    \"balance\" NUMERIC\n);\n\
         CREATE TABLE IF NOT EXISTS \"film\" (\n    \"film_id\" INTEGER PRIMARY KEY,\n    \
         \"title\" TEXT,\n    \"cover\" BLOB\n);\n\
         CREATE TABLE IF NOT EXISTS \"rental\" (\n    \"rental_id\" INTEGER PRIMARY KEY,\n    \
         \"customer_id\" INTEGER\n);\n"
    );
    add_user(&central, "mike", "mike-password");
    let server = serve(&central, &[]);
    let device = dir.path().join("mike.db");
    let device_path = device.to_str().unwrap();
    run_ok(&["schema", "--db", db, "--client-db", device_path], "");
    let synced = rowsync()
        .args(["sync", "--db", device_path, "--server", &server.address])
        .args([
            "--user",
            "mike",
            "--password-stdin",
            "--track",
            "customer",
            "--track",
            "film",
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"mike-password\n")?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        synced.status.success(),
        "{}",
        String::from_utf8_lossy(&synced.stderr)
    );
    let connection = rusqlite::Connection::open(&device).unwrap();
    let customers: Vec<(i64, String, Option<f64>)> = connection
        .prepare("SELECT customer_id, name, balance FROM customer ORDER BY 1")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // SQLite's DECIMAL column (NUMERIC affinity) holds 1.50 as the REAL 1.5, on the
    // central and, with the same affinity, on the client.
    assert_eq!(customers, [(1, "MARY".to_string(), Some(1.5))]);
    let film: (String, Vec<u8>) = connection
        .query_row("SELECT title, cover FROM film", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .unwrap();
    assert_eq!(film, ("ACADEMY DINOSAUR".to_string(), vec![0]));
    let rentals: Vec<(i64, i64)> = connection
        .prepare("SELECT rental_id, customer_id FROM rental ORDER BY 1")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rentals,
        [(1, 1)],
        "mike's store's rental, not the other store's"
    );
    let status = run_ok(&["status", "--db", db], "");
    assert!(
        status.starts_with("script version v1: 3 table(s), 1 client(s), last sync ")
            && status.contains("\n  customer: group\n  film: shared\n  rental: parent\nusers: mike\nheld transfers: 0 upload(s), 0 download(s)\n"),
        "{status}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run_ok(&["status", "--db", db, "--json"], "")).unwrap();
    assert_eq!(json["versions"][0]["tables"][0]["rule"], "group");
    assert_eq!(json["event_triggers"], serde_json::Value::Null);
}

#[test]
fn a_mistake_in_the_rule_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let central = dir.path().join("central.db");
    rusqlite::Connection::open(&central)
        .unwrap()
        .execute_batch(CENTRAL)
        .unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[tables.customer]\nrule = \"group\"\ncolumn = \"store_id\"\ngroup = \"stores\"\n",
    )
    .unwrap();
    let output = rowsync()
        .args([
            "rules",
            "apply",
            "--db",
            central.to_str().unwrap(),
            "--file",
        ])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("table \"customer\": group \"stores\" is not declared; add a [groups.stores] section (none is declared)"),
        "{stderr}"
    );
}
