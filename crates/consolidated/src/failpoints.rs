//! Named failpoints for the fault matrix (`crates/cli/tests/faults.rs`), compiled only
//! with the `failpoints` feature: the release binary has none.
//!
//! A process started with `ROWSYNC_FAILPOINT=<name>` stops at the first time it reaches
//! that point: it prints `rowsync failpoint <name> reached` on stderr and the task that
//! reached it waits forever, holding whatever it holds (a transaction, a client lock, a
//! half-sent download), so a test can kill the process there with a real `kill -9`.
//! Every later pass, and every other point, goes on as if there were none.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The environment variable naming the point to stop at.
pub const FAILPOINT_VARIABLE: &str = "ROWSYNC_FAILPOINT";

/// Every point the code has, in the order a sync passes them (cleanup last).
pub const FAILPOINTS: &[&str] = &[
    "after_hello",
    "mid_upload",
    "before_apply",
    "mid_apply",
    "streams_prepared",
    "after_commit",
    "streams_decided",
    "mid_download",
    "before_ack",
    "after_ack",
    "mid_cleanup",
];

static CONFIGURED: OnceLock<Option<String>> = OnceLock::new();
static REACHED: AtomicBool = AtomicBool::new(false);

/// Tells the test, on stderr, that the process stopped at `name`.
fn announce(name: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "rowsync failpoint {name} reached");
    let _ = stderr.flush();
}

/// Stops here forever if `name` is the configured point and it was not reached before.
pub async fn hit(name: &'static str) {
    debug_assert!(FAILPOINTS.contains(&name), "unknown failpoint {name}");
    let configured = CONFIGURED.get_or_init(|| std::env::var(FAILPOINT_VARIABLE).ok());
    if configured.as_deref() != Some(name) || REACHED.swap(true, Ordering::AcqRel) {
        return;
    }
    announce(name);
    std::future::pending::<()>().await;
}

/// [`hit`] for code that runs on a blocking thread: parks it forever.
pub fn hit_blocking(name: &'static str) {
    debug_assert!(FAILPOINTS.contains(&name), "unknown failpoint {name}");
    let configured = CONFIGURED.get_or_init(|| std::env::var(FAILPOINT_VARIABLE).ok());
    if configured.as_deref() != Some(name) || REACHED.swap(true, Ordering::AcqRel) {
        return;
    }
    announce(name);
    loop {
        std::thread::park();
    }
}

/// `failpoint!("name")`: with the `failpoints` feature, [`hit`]; without it, nothing.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        $crate::failpoints::hit($name).await
    };
    (blocking $name:literal) => {
        $crate::failpoints::hit_blocking($name)
    };
}
