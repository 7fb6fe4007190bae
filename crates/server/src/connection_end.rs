//! The end of an HTTP connection, which the syncs it carries watch: over HTTP the
//! request body ends before the download, so only the connection's end tells that the
//! client is gone (`sync::ClientClose::Unseen`) and that no receipt will come on it
//! (`stage::download`). Beneath `http`, `sync` and the stages, which all pass it on.

/// Resolves once an HTTP connection has ended (its [`ConnectionOpen`] dropped), unless
/// the server closed it for idling (see [`ConnectionOpen::closed_idle`]); and counts the
/// connection's receipt requests.
#[derive(Clone)]
pub(crate) struct ConnectionEnd(
    tokio::sync::watch::Receiver<bool>,
    std::sync::Arc<crate::receipt::ReceiptRate>,
);

/// Held while an HTTP connection is served; dropping it ends its [`ConnectionEnd`]s.
pub(crate) struct ConnectionOpen {
    open: tokio::sync::watch::Sender<bool>,
}

impl ConnectionOpen {
    /// The server closed the connection because no next request began within its
    /// idle limit: the client may still be reading the last response out of the
    /// network's buffers, and send its receipt on a connection of its own.
    pub(crate) fn closed_idle(&self) {
        self.open.send_replace(true);
    }
}

impl ConnectionEnd {
    pub(crate) fn new() -> (ConnectionOpen, ConnectionEnd) {
        let (open, end) = tokio::sync::watch::channel(false);
        let receipts = std::sync::Arc::default();
        (ConnectionOpen { open }, ConnectionEnd(end, receipts))
    }

    /// The rate of receipt requests on this connection.
    pub(crate) fn receipt_rate(&self) -> &crate::receipt::ReceiptRate {
        &self.1
    }

    pub(crate) async fn ended(mut self) {
        // `changed` fails once the sender is gone.
        while self.0.changed().await.is_ok() {}
        if *self.0.borrow() {
            std::future::pending::<()>().await;
        }
    }
}
