//! Stopping a connection's statement from another task, as the server does when the
//! client of a running sync goes away.

use std::time::Duration;

use rowsync_consolidated::{Consolidated, ConsolidatedConnection};

use super::{Factory, Fixture};

/// A hang guard for the cancellation awaited, not a timing assertion: the statement
/// would run for hours.
const GUARD: Duration = Duration::from_secs(60);

/// How often the cancel is repeated: one sent before the statement starts is lost.
const AGAIN: Duration = Duration::from_millis(50);

pub async fn a_cancelled_statement_stops_with_an_error<F: Factory>() {
    let fixture = Fixture::<F>::new().await;
    let mut connection = fixture.backend.connect().await.expect("connect");
    let canceller = connection.canceller();
    let running = tokio::spawn(async move { connection.query_sql(F::endless_query()).await });

    let stopped = tokio::time::timeout(GUARD, async {
        while !running.is_finished() {
            // A cancel racing the statement's end may find its connection gone: only
            // the statement's outcome below counts.
            let _ = canceller.cancel().await;
            tokio::time::sleep(AGAIN).await;
        }
    })
    .await;
    assert!(
        stopped.is_ok(),
        "the endless statement still ran after {GUARD:?} of cancels"
    );
    let outcome = running.await.expect("the statement's task ends");
    assert!(
        outcome.is_err(),
        "a cancelled statement answers with an error, got {outcome:?}"
    );
}
