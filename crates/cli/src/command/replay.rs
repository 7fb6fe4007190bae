//! `rowsync replay`: play a recording (`rowsync serve --record DIR`) against a server,
//! or, with `--diff`, say where two runs differ. The work is in `rowsync_cli::replay`.

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_cli::replay::{diff_runs, replay, ReplayOptions};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The recording to play (the directory `rowsync serve --record` wrote).
    #[arg(required_unless_present = "diff")]
    recording: Option<PathBuf>,
    /// The server to play it against: tcp://host:port, tls://..., http://..., https://...
    #[arg(long, required_unless_present = "diff")]
    server: Option<String>,
    /// Syncs in flight at once (each client's syncs stay in their recorded order).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Keep the recorded pace, this many times faster (2 = twice as fast); without it,
    /// as fast as the server answers.
    #[arg(long)]
    speed: Option<f64>,
    /// Run every sync on this script version instead of the recorded one.
    #[arg(long)]
    version: Option<String>,
    /// Read the password every recorded user logs in with from the first line of
    /// standard input (passwords are never recorded).
    #[arg(long)]
    password_stdin: bool,
    /// Where the run's outcomes.jsonl goes (default: RECORDING/replay-<unix seconds>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Give up on one sync after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_seconds: u64,
    /// Compare two runs (recordings or replays) instead: exits 1 and names each sync
    /// whose rows applied, conflicts, errors or download differ.
    #[arg(long, num_args = 2, value_names = ["RUN_A", "RUN_B"], conflicts_with_all = ["recording", "server"])]
    diff: Option<Vec<PathBuf>>,
}

/// Runs the command; the exit status (0, or 1 when `--diff` found differences).
pub async fn run(args: ReplayArgs) -> Result<i32> {
    if let Some(runs) = &args.diff {
        let lines = diff_runs(&runs[0], &runs[1])?;
        for line in &lines {
            println!("{line}");
        }
        if lines.is_empty() {
            println!("the runs agree");
            return Ok(0);
        }
        println!("{} syncs differ", lines.len());
        return Ok(1);
    }
    let (Some(recording), Some(server)) = (args.recording.clone(), args.server.clone()) else {
        bail!("give a recording and --server, or --diff RUN_A RUN_B");
    };
    if !args.password_stdin {
        bail!("give --password-stdin: the recording holds no credentials");
    }
    let password = read_password()?;
    let out = args.out.clone().unwrap_or_else(|| {
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        recording.join(format!("replay-{seconds}"))
    });
    let options = ReplayOptions {
        recording,
        server,
        clients: args.clients,
        speed: args.speed,
        version: args.version.clone(),
        password,
        out: out.clone(),
        timeout: Duration::from_secs(args.timeout_seconds),
    };
    let summary = replay(&options).await?;
    println!(
        "replayed {} syncs ({} with errors, {} skipped: recorded without their whole upload); outcomes in {}",
        summary.syncs,
        summary.errors,
        summary.skipped,
        out.join("outcomes.jsonl").display()
    );
    Ok(0)
}

fn read_password() -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    let password = line.trim_end_matches(['\r', '\n']).to_string();
    if password.is_empty() {
        bail!("--password-stdin: standard input held no password");
    }
    Ok(password)
}
