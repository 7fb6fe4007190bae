//! The log of `rowsync` and `rowsync-bench`: to stderr, filtered by `ROWSYNC_LOG`
//! (tracing's `EnvFilter` syntax; `warn` when unset).

pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ROWSYNC_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        // A closed log pipe must not matter: by default the subscriber reports its own
        // write errors with eprintln!, which panics on a broken pipe and would take
        // down the sync that was logging.
        .log_internal_errors(false)
        .init();
}
