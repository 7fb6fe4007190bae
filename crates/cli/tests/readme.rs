//! The README as a newcomer runs it (issue 36): its first `sh` block (a consolidated
//! database, a user, the server: in the background, as "another terminal", on a free
//! port) in an empty directory with the `rowsync` just built on `PATH`; then its Rust
//! block (this file's `readme_rust`, checked to be the README's text), its C program
//! compiled by its own `cc` line against the `librowsync.a` scripts/test built, and
//! its command-line sync block. Only the server's address differs from the page: the
//! README's `127.0.0.1:2439` is a free port here. The Python block is run by
//! bindings/python/tests/test_readme.py.

mod support;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use support::fenced_blocks as blocks;

const README_ADDRESS: &str = "127.0.0.1:2439";

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap()
}

/// The README's Rust block, as written but for the server's address.
#[rustfmt::skip]
async fn readme_rust(address: &str) -> Result<(), Box<dyn std::error::Error>> {
    // README begins
    let mut client = rowsync_client::Client::open("erin-phone.db")?;
    client.connection().execute_batch("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, owner TEXT NOT NULL, body TEXT)")?;
    client.track("notes")?;
    let report = client.sync(&rowsync_client::SyncOptions::new(address, "erin", "a-long-password")).await?;
    println!("{} up, {} down, {} conflicts", report.rows_uploaded, report.rows_downloaded, report.conflicts);
    // README ends
    assert_eq!(report.rows_downloaded, 1, "the office's note");
    Ok(())
}

/// The body of a function of this file between its `README begins` and `README ends`
/// markers (the `nth`, from 0), as the README shows it: `value` spelt as the README's
/// `literal`.
fn readme_source(nth: usize, value: &str, literal: &str) -> String {
    let source = include_str!("readme.rs");
    let begin = "    // README begins\n";
    let start = source.match_indices(begin).nth(nth).unwrap().0 + begin.len();
    let end = start + source[start..].find("    // README ends\n").unwrap();
    source[start..end]
        .lines()
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect::<String>()
        .replace(&format!("new({value},"), &format!("new(\"{literal}\","))
}

/// The README's transport block, as written but for the server's address.
#[rustfmt::skip]
fn readme_transport(address: &str) -> rowsync_client::SyncOptions {
    // README begins
    let mut options = rowsync_client::SyncOptions::new(address, "erin", "a-long-password");
    options.transport.compression = rowsync_client::Compression::Zstd;
    options.transport.tls.ca_file = Some("pki/ca.pem".into()); // default: the public web roots
    // options.transport.tls.server_name, .client_cert, .client_key; options.transport.http_version
    // README ends
    options
}

/// Runs `script` with bash in `dir`, the `rowsync` just built first on `PATH`.
fn shell(dir: &Path, script: &str) -> Command {
    let binary = Path::new(env!("CARGO_BIN_EXE_rowsync"));
    let path = format!(
        "{}:{}",
        binary.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = Command::new("bash");
    command
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("PATH", path);
    command
}

fn succeeded(output: Output, what: &str) -> String {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{what}:\n{stdout}\n{stderr}");
    stdout.into_owned()
}

/// The server block's `rowsync serve` line, in the background, in its own process group.
fn serve(dir: &Path, serve_line: &str, address: &str) -> Child {
    let child = shell(
        dir,
        &format!("exec {}", serve_line.replace(README_ADDRESS, address)),
    )
    .stderr(Stdio::null())
    .process_group(0)
    .spawn()
    .unwrap();
    for _ in 0..200 {
        if std::net::TcpStream::connect(address).is_ok() {
            return child;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut child = child;
    child.kill().unwrap();
    child.wait().unwrap();
    panic!("the README's server did not start on {address}");
}

/// The directory cargo puts librowsync.a in (scripts/test builds it).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The page's blocks, and the address the test's server takes instead of the README's.
struct Page {
    sh: Vec<String>,
    c: String,
    dir: tempfile::TempDir,
    address: String,
}

impl Page {
    fn block(&self, starting: &str) -> &str {
        self.sh
            .iter()
            .find(|block| block.starts_with(starting))
            .unwrap_or_else(|| panic!("no sh block starting with {starting:?}"))
    }

    fn run(&self, script: &str, what: &str) -> String {
        succeeded(shell(self.dir.path(), script).output().unwrap(), what)
    }
}

#[test]
fn readme_blocks_run_as_written() {
    let page = readme();
    let rust = blocks(&page, "rust");
    assert_eq!(
        rust[0],
        readme_source(0, "address", README_ADDRESS),
        "README changed"
    );
    let https = "https://sync.example.com:8443/sync";
    assert_eq!(
        rust[1],
        readme_source(1, "address", https),
        "README changed"
    );
    let page = Page {
        sh: blocks(&page, "sh"),
        c: blocks(&page, "c").remove(0),
        dir: tempfile::tempdir().unwrap(),
        address: format!("127.0.0.1:{}", support::free_port()),
    };
    let (setup, serve_line): (Vec<&str>, Vec<&str>) = page.sh[0]
        .lines()
        .partition(|line| !line.starts_with("rowsync serve"));
    page.run(&setup.join("\n"), "setup");
    let office =
        "sqlite3 central.db \"INSERT INTO notes VALUES ('n1', 'erin', 'from the office')\"";
    page.run(office, "a row");
    let mut server = serve(page.dir.path(), serve_line[0], &page.address);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    std::env::set_current_dir(page.dir.path()).unwrap();
    runtime.block_on(readme_rust(&page.address)).unwrap();
    c_block(&page);
    let cli = page
        .block("rowsync schema")
        .replace(README_ADDRESS, &page.address);
    page.run(&cli, "rowsync sync");
    let laptop = page.run(
        "sqlite3 erin-laptop.db 'SELECT id, body FROM notes'",
        "rows",
    );
    assert_eq!(laptop, "n1|from the office\n");
    server.kill().unwrap();
    server.wait().unwrap();
    transport_blocks(&page, &runtime);
}

/// The C program, compiled by the README's `cc` line against the library cargo built.
fn c_block(page: &Page) {
    let program = page.c.replace(README_ADDRESS, &page.address);
    std::fs::write(page.dir.path().join("app.c"), program).unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ffi/include");
    let library = library_dir().join("librowsync.a");
    let compile = page
        .block("cc app.c")
        .replace("crates/ffi/include", &include.display().to_string())
        .replace(
            "target/release/librowsync.a",
            &library.display().to_string(),
        );
    let printed = page.run(&compile, "the C program");
    assert!(printed.contains("\"rows_downloaded\":0"), "{printed}");
}

/// The transports block (every endpoint on a free port), then a sync over HTTPS with
/// the transport block's options.
fn transport_blocks(page: &Page, runtime: &tokio::runtime::Runtime) {
    let https_address = format!("127.0.0.1:{}", support::free_port());
    let mut block = page
        .block("rowsync cert")
        .replace(README_ADDRESS, &page.address);
    for endpoint in ["0.0.0.0:2440", "127.0.0.1:8080", "0.0.0.0:8443"] {
        let at = match endpoint {
            "0.0.0.0:8443" => https_address.clone(),
            _ => format!("127.0.0.1:{}", support::free_port()),
        };
        block = block.replace(endpoint, &at);
    }
    let (cert, serve_lines) = block.split_once("\nrowsync serve").unwrap();
    page.run(cert, "rowsync cert");
    let serve_line = format!("rowsync serve{}", serve_lines.replace("\\\n", " "));
    let mut server = serve(page.dir.path(), &serve_line, &https_address);
    let options = readme_transport(&format!("https://{https_address}/sync"));
    let mut client = rowsync_client::Client::open("erin-phone.db").unwrap();
    let report = runtime.block_on(client.sync(&options)).unwrap();
    assert_eq!(
        report.rows_downloaded, 0,
        "nothing new since the C program's sync"
    );
    server.kill().unwrap();
    server.wait().unwrap();
}
