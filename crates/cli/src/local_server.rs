//! A rowsync server on a free loopback port, in this process, for the demo and the bench
//! (`rowsync-bench`).

use anyhow::{Context, Result};
use rowsync_consolidated::Consolidated;
use rowsync_server::{Endpoint, ServerConfig, Transport};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct LocalServer {
    /// `127.0.0.1:port`
    pub address: String,
    /// The HTTP endpoint's `127.0.0.1:port`, when started with one.
    pub http_address: Option<String>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), rowsync_server::ServerError>>,
}

impl LocalServer {
    pub async fn start<B: Consolidated>(backend: B, config: ServerConfig) -> Result<LocalServer> {
        LocalServer::start_on(backend, config, false).await
    }

    /// [`LocalServer::start`], also on an HTTP endpoint when `http`.
    pub async fn start_on<B: Consolidated>(
        backend: B,
        config: ServerConfig,
        http: bool,
    ) -> Result<LocalServer> {
        let mut endpoints = Vec::new();
        for transport in [Transport::Tcp, Transport::Http]
            .into_iter()
            .take(1 + http as usize)
        {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding a loopback port")?;
            endpoints.push(Endpoint {
                listener,
                transport,
            });
        }
        let address = endpoints[0].listener.local_addr()?.to_string();
        let http_address = match endpoints.get(1) {
            Some(endpoint) => Some(endpoint.listener.local_addr()?.to_string()),
            None => None,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(rowsync_server::serve_endpoints(
            endpoints,
            backend,
            config,
            async {
                let _ = stopped.await;
            },
        ));
        Ok(LocalServer {
            address,
            http_address,
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
