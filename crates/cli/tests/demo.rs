//! `rowsync demo` runs its whole scenario and its agreement check holds.

use rowsync_cli::demo::{run, DemoOptions};

#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_reaches_agreement_with_one_conflict() {
    check_demo(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_reaches_agreement_on_postgres() {
    check_demo(Some(rowsync_testkit::fresh_database("demo").await)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_reaches_agreement_on_mariadb() {
    check_demo(Some(rowsync_testkit::fresh_mysql_database("demo").await)).await;
}

async fn check_demo(db: Option<String>) {
    let captured = Captured::default();
    let report = run(DemoOptions {
        db,
        clients: 4,
        bulk_rows: 2_000,
        dir: None,
        out: Box::new(captured.clone()),
    })
    .await
    .unwrap();
    let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(report.agreement, "{output}");
    assert!(output.contains("agreement: OK"), "{output}");
    assert_eq!(
        report.conflicts, 1,
        "the office and client-0 update the same row\n{output}"
    );
    assert_eq!(report.clients.len(), 4);
    for client in &report.clients {
        assert_eq!(
            client.report.rows_uploaded, 5,
            "{}: 3 inserts, 1 update, 1 delete",
            client.name
        );
    }
    let bulk = report.bulk.expect("bulk measurement ran");
    assert_eq!(bulk.rows, 2_000);
    assert!(output.contains("rows/s"), "{output}");
}
