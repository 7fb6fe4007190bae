//! `rowsync cert`: a test certificate authority with server and client certificates.

use std::path::PathBuf;

use anyhow::{Context, Result};
use rowsync_cli::cert::{self, KeyKind};

#[derive(clap::Args)]
pub struct CertArgs {
    /// Directory to write ca.pem, server.pem, server-key.pem, client.pem and
    /// client-key.pem into (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Host names and IP addresses the server certificate is valid for.
    #[arg(long = "name", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    names: Vec<String>,
    /// RSA 2048 keys instead of ECDSA P-256.
    #[arg(long)]
    rsa: bool,
}

pub fn run(args: CertArgs) -> Result<()> {
    let CertArgs { dir, names, rsa } = args;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let kind = if rsa {
        KeyKind::Rsa2048
    } else {
        KeyKind::EcdsaP256
    };
    let files = cert::write_test_pki(&dir, &names, kind)?;
    println!(
        "CA certificate (clients trust it through TlsOptions::ca_file): {}",
        files.ca_cert.display()
    );
    println!(
        "server certificate for {}: {} (key {})",
        names.join(", "),
        files.server_cert.display(),
        files.server_key.display()
    );
    println!(
        "client certificate: {} (key {})",
        files.client_cert.display(),
        files.client_key.display()
    );
    Ok(())
}
