//! `rowsync replay`: plays a recording (`rowsync serve --record DIR`) against a server,
//! many clients at once but each client's syncs in their recorded order, and writes
//! each sync's outcome; `rowsync replay --diff` names where two runs differ.
//!
//! What it is for: run a new script version against yesterday's real traffic (on a copy
//! of the database) before switching clients to it, and read the differences.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rowsync_client::transport::{exchange_streaming, DownloadHandler, Exchange};
use rowsync_client::{ClientError, SessionEvent, TransportOptions, WireBytes};
use rowsync_protocol::{
    encode_frame, Download, FrameDecoder, Hello, Message, IDENTITY_SINCE_VERSION,
};
use rowsync_server::record::{
    error_text, read_outcomes, read_recording, read_upload, DownloadDigest, RecordedHello,
    RecordedSync, SyncOutcomeRecord,
};
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Busy answers a replayed sync waits out (after the server's hint) before it is
/// recorded as busy.
pub const REPLAY_BUSY_RETRIES_MAX: u32 = 20;

/// The largest frame read back from a recording (the recording server refused larger).
pub const RECORDED_FRAME_BYTES_MAX: usize = 1024 * 1024 * 1024;

/// What to replay, where, and how.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub recording: PathBuf,
    pub server: String,
    /// Syncs in flight at once.
    pub clients: usize,
    /// Keep the recorded pace, this many times faster; as fast as possible when `None`.
    pub speed: Option<f64>,
    /// Run every sync on this script version instead of the recorded one.
    pub version: Option<String>,
    /// The password every recorded user logs in with (passwords are never recorded).
    pub password: String,
    /// Where the run's `outcomes.jsonl` goes.
    pub out: PathBuf,
    pub timeout: Duration,
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    pub syncs: usize,
    pub errors: usize,
    /// Recorded without their whole upload (the recording's byte budget ran out).
    pub skipped: usize,
}

/// A recorded sync ready to send: its hello (credentials filled in) and upload frames.
struct Prepared {
    sync: RecordedSync,
    upload_frames: Vec<Vec<u8>>,
    upload_sequence: u64,
}

/// Replays the recording in `options`, writing `options.out/outcomes.jsonl`.
pub async fn replay(options: &ReplayOptions) -> Result<ReplaySummary> {
    if options.clients == 0 {
        bail!("--clients must be at least 1");
    }
    if options
        .speed
        .is_some_and(|speed| speed.is_nan() || speed <= 0.0)
    {
        bail!("--speed must be above 0");
    }
    let recorded = read_recording(&options.recording)?;
    let mut summary = ReplaySummary::default();
    let mut by_client: BTreeMap<String, Vec<Prepared>> = BTreeMap::new();
    for sync in recorded {
        if !sync.upload_complete {
            summary.skipped += 1;
            continue;
        }
        let prepared = prepare(&options.recording, sync)?;
        by_client
            .entry(prepared.sync.hello.client_id.clone())
            .or_default()
            .push(prepared);
    }
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("creating {}", options.out.display()))?;
    let slots = Arc::new(Semaphore::new(options.clients));
    let start = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for (_, syncs) in by_client {
        let options = options.clone();
        let slots = Arc::clone(&slots);
        clients.spawn(async move { replay_client(&options, syncs, &slots, start).await });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = clients.join_next().await {
        outcomes.extend(joined.context("a replay task failed")?);
    }
    outcomes.sort_by_key(|outcome: &SyncOutcomeRecord| outcome.sequence);
    summary.syncs = outcomes.len();
    summary.errors = outcomes
        .iter()
        .filter(|outcome| outcome.error.is_some())
        .count();
    write_outcomes(&options.out, &outcomes)?;
    Ok(summary)
}

/// Reads a recorded sync's upload back into frames to send: its `Upload` messages and
/// the sequence of its `EndUpload`.
fn prepare(recording: &Path, sync: RecordedSync) -> Result<Prepared> {
    let bytes = read_upload(recording, sync.sequence)?;
    let mut decoder = FrameDecoder::new(RECORDED_FRAME_BYTES_MAX);
    decoder.feed(&bytes);
    let mut upload_frames = Vec::new();
    let mut upload_sequence = None;
    while let Some(message) = decoder
        .next_message()
        .with_context(|| format!("recorded sync {}: its upload", sync.sequence))?
    {
        match message {
            message @ Message::Upload(_) => upload_frames.push(encode_frame(&message)),
            Message::EndUpload(end) => upload_sequence = Some(end.upload_sequence),
            _ => {}
        }
    }
    // A refused sync may have ended before its upload: it is sent with an empty one.
    Ok(Prepared {
        upload_sequence: upload_sequence.unwrap_or(0),
        sync,
        upload_frames,
    })
}

/// One client's syncs in order; each takes a slot while it runs. The watermark each
/// sync sends is the one the previous replayed sync received (the recorded one first).
async fn replay_client(
    options: &ReplayOptions,
    syncs: Vec<Prepared>,
    slots: &Semaphore,
    start: Instant,
) -> Vec<SyncOutcomeRecord> {
    let mut outcomes = Vec::with_capacity(syncs.len());
    let mut watermark = None;
    for prepared in syncs {
        if let Some(speed) = options.speed {
            let due = Duration::from_secs_f64(prepared.sync.offset_ms as f64 / 1000.0 / speed);
            tokio::time::sleep_until(start + due).await;
        }
        let Ok(_slot) = slots.acquire().await else {
            break;
        };
        let (outcome, received) = replay_one(options, &prepared, watermark).await;
        watermark = received.or(watermark);
        outcomes.push(outcome);
    }
    outcomes
}

/// Collects the digest of a download as it arrives.
#[derive(Default)]
struct Digesting {
    digest: DownloadDigest,
}

impl DownloadHandler for Digesting {
    fn download(&mut self, download: Download, _wire: WireBytes) -> Result<(), ClientError> {
        self.digest.add(&download);
        Ok(())
    }
}

/// Sends one recorded sync (waiting out busy answers); its outcome, and the watermark
/// it received.
async fn replay_one(
    options: &ReplayOptions,
    prepared: &Prepared,
    watermark: Option<i64>,
) -> (SyncOutcomeRecord, Option<i64>) {
    let recorded = &prepared.sync.hello;
    let script_version = options
        .version
        .clone()
        .unwrap_or_else(|| recorded.script_version.clone());
    let mut outcome = SyncOutcomeRecord {
        sequence: prepared.sync.sequence,
        client_id: recorded.client_id.clone(),
        user: recorded.user.clone(),
        script_version: script_version.clone(),
        rows_uploaded: 0,
        conflicts: 0,
        upload_already_applied: false,
        download_rows: 0,
        download_checksum: DownloadDigest::default().hex(),
        error: None,
    };
    let transport = TransportOptions::default();
    let mut busy_retries = 0;
    loop {
        let hello = replay_hello(options, recorded, &script_version, watermark);
        let mut digesting = Digesting::default();
        let exchanged = exchange_streaming(
            Exchange {
                address: &options.server,
                transport: &transport,
                hello,
                upload_frames: &prepared.upload_frames,
                upload_sequence: prepared.upload_sequence,
                frame_bytes_max: rowsync_protocol::FRAME_BYTES_MAX_DEFAULT,
                timeout: options.timeout,
                acknowledge: None,
                transfer: None,
                download_resume: None,
                key_ranges: &[],
            },
            &mut digesting,
        )
        .await;
        let error = match exchanged {
            Ok((SessionEvent::Complete(completed), _)) => {
                let summary = completed.end.summary;
                outcome.rows_uploaded = summary.rows_uploaded;
                outcome.conflicts = summary.conflicts;
                outcome.upload_already_applied = summary.upload_already_applied;
                outcome.download_rows = digesting.digest.rows;
                outcome.download_checksum = digesting.digest.hex();
                return (outcome, Some(completed.end.watermark));
            }
            Ok((SessionEvent::Busy { retry_after_ms }, _))
            | Err(ClientError::Busy { retry_after_ms })
                if busy_retries < REPLAY_BUSY_RETRIES_MAX =>
            {
                busy_retries += 1;
                tokio::time::sleep(Duration::from_millis(u64::from(retry_after_ms))).await;
                continue;
            }
            Ok((event, _)) => format!("unexpected answer: {event:?}"),
            Err(ClientError::Server(wire)) => error_text(&wire),
            Err(error) => format!("failed: {error}"),
        };
        outcome.error = Some(error);
        return (outcome, None);
    }
}

/// The hello of a replayed sync: the recorded one, with the replay's password, the
/// version it replays with, and the watermark the replay reached (if any).
fn replay_hello(
    options: &ReplayOptions,
    recorded: &RecordedHello,
    script_version: &str,
    watermark: Option<i64>,
) -> Hello {
    Hello {
        // A recording keeps no transfer id, so a replayed resend could not prove its
        // client's identity (protocol 5): it is replayed as version 4, as before.
        protocol_version: recorded.protocol_version.min(IDENTITY_SINCE_VERSION - 1),
        client_id: recorded.client_id.clone(),
        user: recorded.user.clone(),
        password: options.password.clone(),
        script_version: script_version.to_string(),
        last_download_watermark: watermark.unwrap_or(recorded.last_download_watermark),
        token: String::new(),
        auth_parameters: Vec::new(),
        download_ack: false,
        tables: Default::default(),
    }
}

fn write_outcomes(out: &Path, outcomes: &[SyncOutcomeRecord]) -> Result<()> {
    let mut text = String::new();
    for outcome in outcomes {
        text.push_str(&serde_json::to_string(outcome)?);
        text.push('\n');
    }
    let path = out.join("outcomes.jsonl");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Where two runs (a recording or a replay each) differ, one line per sync that
/// differs; empty when they agree.
pub fn diff_runs(run_a: &Path, run_b: &Path) -> Result<Vec<String>> {
    let index = |outcomes: Vec<SyncOutcomeRecord>| -> BTreeMap<u64, SyncOutcomeRecord> {
        outcomes
            .into_iter()
            .map(|outcome| (outcome.sequence, outcome))
            .collect()
    };
    let a = index(read_outcomes(run_a)?);
    let b = index(read_outcomes(run_b)?);
    let sequences: BTreeSet<u64> = a.keys().chain(b.keys()).copied().collect();
    let mut lines = Vec::new();
    for sequence in sequences {
        let line = match (a.get(&sequence), b.get(&sequence)) {
            (Some(a), Some(b)) => {
                let differences = differences(a, b);
                if differences.is_empty() {
                    continue;
                }
                format!("{}: {}", describe(a), differences.join("; "))
            }
            (Some(a), None) => format!("{}: only in {}", describe(a), run_a.display()),
            (None, Some(b)) => format!("{}: only in {}", describe(b), run_b.display()),
            (None, None) => continue,
        };
        lines.push(line);
    }
    Ok(lines)
}

fn describe(outcome: &SyncOutcomeRecord) -> String {
    format!(
        "sync {} (client {:?}, user {:?})",
        outcome.sequence, outcome.client_id, outcome.user
    )
}

/// What differs between two outcomes of the same recorded sync.
fn differences(a: &SyncOutcomeRecord, b: &SyncOutcomeRecord) -> Vec<String> {
    let mut found = Vec::new();
    let mut compare = |what: &str, left: String, right: String| {
        if left != right {
            found.push(format!("{what} {left} -> {right}"));
        }
    };
    compare(
        "rows applied",
        a.rows_applied().to_string(),
        b.rows_applied().to_string(),
    );
    compare(
        "conflicts",
        a.conflicts.to_string(),
        b.conflicts.to_string(),
    );
    compare(
        "upload already applied",
        a.upload_already_applied.to_string(),
        b.upload_already_applied.to_string(),
    );
    compare(
        "error",
        format!("{:?}", a.error.as_deref().unwrap_or("none")),
        format!("{:?}", b.error.as_deref().unwrap_or("none")),
    );
    if (a.download_rows, &a.download_checksum) != (b.download_rows, &b.download_checksum) {
        found.push(format!(
            "download differs ({} rows, checksum {} -> {} rows, checksum {})",
            a.download_rows, a.download_checksum, b.download_rows, b.download_checksum
        ));
    }
    found
}
