//! One sync of a client database, timed: how the client's peak memory and rows per second
//! are measured (run it under `/usr/bin/time -v`).
//!
//! `first_sync CLIENT_DB URL USER PASSWORD TABLE_DDL TABLE`: creates the table if the
//! database lacks it, tracks it, syncs once and prints what moved.

use std::process::ExitCode;

use rowsync_client::{Client, SyncOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let [path, url, user, password, ddl, table] = arguments.as_slice() else {
        eprintln!("usage: first_sync CLIENT_DB URL USER PASSWORD TABLE_DDL TABLE");
        return ExitCode::from(2);
    };
    let run = async {
        let mut client = Client::open(path)?;
        let exists: bool = client.connection().query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE name = ?1)",
            [table],
            |row| row.get(0),
        )?;
        if !exists {
            client.connection().execute_batch(ddl)?;
        }
        client.track(table)?;
        let options = SyncOptions::new(url.as_str(), user.as_str(), password.as_str());
        client.sync(&options).await
    };
    match run.await {
        Ok(report) => {
            let seconds = report.elapsed.as_secs_f64();
            println!(
                "rows_downloaded={} rows_uploaded={} seconds={seconds:.2} rows_per_second={:.0} bytes_received={}",
                report.rows_downloaded,
                report.rows_uploaded,
                report.rows_downloaded as f64 / seconds,
                report.wire.received
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("sync failed: {error}");
            ExitCode::FAILURE
        }
    }
}
