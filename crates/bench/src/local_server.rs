//! A rowsync server on a free loopback port, in this process, for the demo and the bench.

use anyhow::{Context, Result};
use rowsync_consolidated::Consolidated;
use rowsync_server::ServerConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct LocalServer {
    /// `127.0.0.1:port`
    pub address: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), rowsync_server::ServerError>>,
}

impl LocalServer {
    pub async fn start<B: Consolidated>(backend: B, config: ServerConfig) -> Result<LocalServer> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a loopback port")?;
        let address = listener.local_addr()?.to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(rowsync_server::serve(listener, backend, config, async {
            let _ = stopped.await;
        }));
        Ok(LocalServer {
            address,
            stop,
            task,
        })
    }

    /// Stops accepting, lets syncs in progress end, and returns the server's own result.
    pub async fn stop(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task.await.context("server task")??;
        Ok(())
    }
}
